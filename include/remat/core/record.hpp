#pragma once
/// @file
/// How an op gets onto a tape. An op validates its arguments, builds its node and calls
/// record(); record() finds the tape, resolves parameters and constants into leaves, lets the
/// tape prepare the node (Note [levels] in tape_state.hpp), runs forward and appends the node.
/// With no tape, or under NoGradGuard, the op only computes its value.

#include <memory>
#include <span>
#include <vector>

#include "remat/core/grad_mode.hpp"
#include "remat/core/trace.hpp"
#include "remat/core/var.hpp"

namespace remat {
namespace detail {

/// The tape this thread records onto when no input names one.
inline std::shared_ptr<TapeState>& current_tape_slot() noexcept {
  thread_local std::shared_ptr<TapeState> tape;
  return tape;
}

/// The tape an op with these inputs records onto, or null to compute without recording.
template <class T>
std::shared_ptr<TapeState> recording_tape(const char* op, std::span<const Var<T>* const> inputs) {
  std::shared_ptr<TapeState> tape;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Var<T>& v = *inputs[k];
    if (!v.defined()) throw UsageError(cat(op, ": input ", k, " is an undefined Var"));
    const std::shared_ptr<TapeState>& t = v.tape_state();
    if (!t) continue;
    if (t->ended) {
      throw UsageError(cat(op, ": input ", k, " (shape ", v.shape(),
                           ") belongs to a tape that has ended. A Var lives as long as its Tape: "
                           "record the whole step on one tape, or pass Var(x.value()) as a constant"));
    }
    if (tape && tape != t) {
      throw UsageError(cat(op, ": input ", k, " (shape ", v.shape(),
                           ") belongs to a different tape than the inputs before it; "
                           "ops can only combine Vars of one tape"));
    }
    tape = t;
  }
  if (!grad_enabled()) return nullptr;
  if (!tape) {
    tape = current_tape_slot();
    if (tape && tape->ended) tape = nullptr;
  }
  if (tape && (tape->sweeping() || tape->swept())) {
    throw UsageError(cat(op, ": the tape's backward pass has already run; record the next step "
                             "on a new Tape (or compute under NoGradGuard)"));
  }
  return tape;
}

/// The node id of an input on `tape`, recording a leaf for a parameter or a constant.
template <class T>
std::uint32_t resolve(TapeState& tape, const Var<T>& v) {
  if (v.tape_state()) return v.node_id();
  std::unique_ptr<Leaf<T>> leaf;
  if (v.param_state()) {
    leaf = std::make_unique<Leaf<T>>(LeafKind::parameter, Tensor<T>(), v.param_state());
    leaf->requires_grad = v.param_state()->requires_grad;
  } else {
    leaf = std::make_unique<Leaf<T>>(LeafKind::constant, v.value());
  }
  return tape.push(std::move(leaf));
}

template <class T>
Var<T> record(std::unique_ptr<Node<T>> node, std::span<const Var<T>* const> inputs) {
  std::shared_ptr<TapeState> tape = recording_tape(node->op_name(), inputs);
  std::vector<Tensor<T>> values;
  values.reserve(inputs.size());
  for (const Var<T>* v : inputs) values.push_back(v->value());
  if (!tape) {
    node->saving = false;
    return Var<T>(node->forward(values));
  }
  node->inputs.resize(inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    node->inputs[k] = resolve(*tape, *inputs[k]);
    node->requires_grad = node->requires_grad || tape->node(node->inputs[k]).requires_grad;
  }
  node->id = tape->size();
  tape->before_forward(*node, std::span<const Tensor<T>>(values));
  Tensor<T> out;
  {
    TraceSpan span(TracePhase::forward, node->op_name(), node->id);
    out = node->forward(values);
  }
  tape->after_forward(*node, out);
  const std::uint32_t id = tape->push(std::move(node));
  return Var<T>(std::move(tape), id, std::move(out));
}

/// record() for an op of type NodeT built from `args`: record_op<TanhNode<T>>({&x}).
template <class NodeT, class T, std::size_t N, class... Args>
Var<T> record_op(const Var<T>* const (&inputs)[N], Args&&... args) {
  return record<T>(std::make_unique<NodeT>(std::forward<Args>(args)...),
                   std::span<const Var<T>* const>(inputs, N));
}

/// The seed random ops on x's tape draw from (a fresh one when x records nowhere).
template <class T>
std::uint64_t rng_seed_for(const Var<T>& x) {
  if (x.tape_state()) return x.tape_state()->seed;
  const std::shared_ptr<TapeState>& current = current_tape_slot();
  return current && !current->ended ? current->seed : next_thread_seed();
}

}  // namespace detail

/// Records a user-defined op (a class deriving from Node<T>) applied to `inputs`.
template <class T>
Var<T> apply(std::unique_ptr<Node<T>> node, std::initializer_list<Var<T>> inputs) {
  std::vector<const Var<T>*> pointers;
  for (const Var<T>& v : inputs) pointers.push_back(&v);
  return detail::record<T>(std::move(node), pointers);
}

}  // namespace remat
