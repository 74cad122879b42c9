#pragma once
/// @file
/// How an op gets onto a tape. An op validates its arguments, builds its node and calls
/// record(); record() finds the tape, resolves parameters and constants into leaves, lets the
/// tape prepare the node (Note [levels] in tape_state.hpp), runs forward and appends the node.
/// With no tape, or under NoGradGuard, the op only computes its value.

#include <initializer_list>
#include <memory>
#include <span>
#include <sstream>
#include <thread>
#include <type_traits>
#include <vector>

#include "remat/core/grad_mode.hpp"
#include "remat/core/precision.hpp"
#include "remat/core/save_policy.hpp"
#include "remat/core/shape_only.hpp"
#include "remat/core/trace.hpp"
#include "remat/core/var.hpp"

namespace remat {
namespace detail {

enum class LeafKind { constant, input, parameter };

// leaves are not ops a policy is asked about; their identities name them in messages
inline constexpr OpType kConstantLeaf{"constant"};
inline constexpr OpType kInputLeaf{"input"};
inline constexpr OpType kParameterLeaf{"parameter"};

/// A leaf: a constant, a user input (with a gradient if asked), or a use of a Parameter. Leaves
/// hold their value for the tape's whole life, so a replay can always read them. A leaf of a
/// parameter that needs a gradient holds its thread's claim on it while it lives (Note [one
/// trainer per parameter] in param_state.hpp).
template <class T>
class Leaf final : public Node<T> {
 public:
  Leaf(LeafKind kind, Tensor<T> value, std::shared_ptr<ParamState<T>> param = nullptr)
      : kind_(kind), param_(std::move(param)) {
    this->value_slot() = std::move(value);
    this->shape = replay_value().shape();
  }
  ~Leaf() override {
    if (claimed_) param_->trainers.release();
  }
  Leaf(const Leaf&) = delete;
  Leaf& operator=(const Leaf&) = delete;

  const OpType& op_type() const noexcept override {
    return kind_ == LeafKind::parameter ? kParameterLeaf
           : kind_ == LeafKind::input   ? kInputLeaf
                                        : kConstantLeaf;
  }
  bool is_leaf() const noexcept override { return true; }
  bool runs_shape_only() const noexcept override { return true; }
  const void* parameter_identity() const noexcept override { return param_.get(); }

  /// Claims the parameter for this thread's tapes; false when another thread's live tape holds it.
  bool claim() {
    claimed_ = param_->trainers.acquire();
    return claimed_;
  }

  Tensor<T> forward(typename Node<T>::Inputs) override { return this->replay_value(); }
  void backward(const Tensor<T>&, Grads<T>&) override {}
  double replay(NodeTable) override { return 0; }

  Tensor<T>& grad_slot() noexcept override { return param_ ? param_->grad : Node<T>::grad_slot(); }
  bool grad_stale() const noexcept override { return param_ && !param_->grad_valid; }
  void mark_grad_written() noexcept override {
    if (param_) param_->grad_valid = true;
  }
  const Tensor<T>& replay_value() const noexcept override {
    return param_ ? param_->value : Node<T>::replay_value();
  }

 private:
  LeafKind kind_;
  std::shared_ptr<ParamState<T>> param_;
  bool claimed_ = false;
};

/// The tape this thread records onto when no input names one.
inline std::shared_ptr<TapeState>& current_tape_slot() noexcept {
  thread_local std::shared_ptr<TapeState> tape;
  return tape;
}

/// What this thread records onto, for messages about another thread's tape.
inline const char* current_tape_role(const TapeState& other) noexcept {
  const std::shared_ptr<TapeState>& mine = current_tape_slot();
  if (!mine || mine->ended) return "this thread has no current tape";
  return mine.get() == &other ? "this thread's current tape is that same tape"
                              : "this thread's current tape is a different tape, its own";
}

/// Raises the UsageError for a Var of another thread's tape (Note [one thread per tape]).
[[noreturn]] inline void throw_foreign_tape(const char* op, std::size_t k, const Shape& shape,
                                            const TapeState& t) {
  std::ostringstream ids;
  ids << "the tape that recorded it belongs to thread " << t.owner
      << " (the thread that created that Tape), and "
      << "this op runs on thread " << std::this_thread::get_id();
  throw UsageError(cat(
      op, ": input ", k, " (shape ", shape, ") was recorded on another thread's tape: ", ids.str(),
      "; ", current_tape_role(t),
      ". A Tape and its Vars belong to the thread that created the Tape: give each thread its own "
      "Tape, and pass values between threads as tensors (Var(v.value()) is a constant)"));
}

/// The tape an op with these inputs records onto, or null to compute without recording.
template <class T>
std::shared_ptr<TapeState> recording_tape(const char* op, std::span<const Var<T>* const> inputs) {
  std::shared_ptr<TapeState> tape;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Var<T>& v = *inputs[k];
    if (!v.defined()) throw ArgumentError(cat(op, ": input ", k, " is an undefined Var"));
    const std::shared_ptr<TapeState>& t = VarAccess::tape_state(v);
    if (!t) continue;
    if (!t->on_owner_thread()) throw_foreign_tape(op, k, v.shape(), *t);
    if (t->ended) {
      throw UsageError(
          cat(op, ": input ", k, " (shape ", v.shape(),
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
    throw UsageError(cat(op,
                         ": the tape's backward pass has already run; record the next step "
                         "on a new Tape (or compute under NoGradGuard)"));
  }
  return tape;
}

/// The node id of input k on `tape`, recording a leaf for a parameter or a constant.
template <class T>
std::uint32_t resolve(TapeState& tape, const Var<T>& v, const char* op, std::size_t k) {
  if (VarAccess::tape_state(v)) return VarAccess::node_id(v);
  std::unique_ptr<Leaf<T>> leaf;
  if (VarAccess::param_state(v)) {
    leaf = std::make_unique<Leaf<T>>(LeafKind::parameter, Tensor<T>(), VarAccess::param_state(v));
    leaf->requires_grad = VarAccess::param_state(v)->requires_grad;
    if (leaf->requires_grad && !leaf->claim()) {
      throw UsageError(cat(
          op, ": input ", k, " is a parameter (shape ", v.shape(),
          ") that a live tape of another thread is training. Two threads cannot train the same "
          "parameters at once: their gradients would race. Give each thread its own copy of the "
          "model (and combine the gradients), take turns (a thread's claim ends with its Tape), "
          "or freeze the parameter or compute under NoGradGuard to only read it"));
    }
  } else {
    leaf = std::make_unique<Leaf<T>>(LeafKind::constant, v.value());
  }
  return tape.push(std::move(leaf));
}

/// Refuses, in a shape-only run, an op that would read the null buffers of its inputs.
template <class T>
void check_runs_shape_only(const Node<T>& node) {
  if (!shape_only() || node.runs_shape_only()) return;
  throw UsageError(
      cat(node.op_name(),
          ": this op cannot run shape-only (Note [shape-only execution] in "
          "core/shape_only.hpp): its inputs have no data. A custom op joins shape-only runs by "
          "allocating what it allocates and skipping its arithmetic when remat::is_shape_only(), "
          "and overriding Node::runs_shape_only() to return true"));
}

/// Marks `node` to compute in the thread's precision (core/precision.hpp), refusing BF16 for an
/// op on anything but float.
template <class T>
void set_precision(Node<T>& node) {
  if (current_precision() != Precision::bf16) return;
  if constexpr (!std::is_same_v<T, float>) {
    throw UsageError(cat(node.op_name(),
                         ": Precision::bf16 (a PrecisionGuard) applies to float ops; this op "
                         "computes on ",
                         sizeof(T), "-byte values. End the guard before ops on double"));
  }
  node.bf16 = true;
}

template <class T>
Var<T> record(std::unique_ptr<Node<T>> node, std::span<const Var<T>* const> inputs) {
  check_runs_shape_only(*node);
  set_precision(*node);
  std::shared_ptr<TapeState> tape = recording_tape(node->op_name(), inputs);
  std::vector<Tensor<T>> values;
  values.reserve(inputs.size());
  for (const Var<T>* v : inputs) values.push_back(v->value());
  if (!tape) {
    node->saving = false;
    return Var<T>(node->run_forward(values));
  }
  node->inputs.resize(inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    node->inputs[k] = resolve(*tape, *inputs[k], node->op_name(), k);
    const NodeBase& input = tape->node(node->inputs[k]);
    node->requires_grad = node->requires_grad || input.requires_grad;
    if (k < 64 && !input.holds_parameter()) node->parameter_inputs &= ~(std::uint64_t{1} << k);
  }
  node->id = tape->size();
  tape->before_forward(*node, std::span<const Tensor<T>>(values));
  Tensor<T> out;
  {
    TraceSpan span(TracePhase::forward, node->op_name(), node->id);
    out = node->run_forward(values);
  }
  node->shape = out.shape();
  node->parameter_view = node->parameter_held(values, out);
  tape->after_forward(*node, std::span<const Tensor<T>>(values), out);
  const std::uint32_t id = tape->push(std::move(node));
  return VarAccess::on_tape(std::move(tape), id, std::move(out));
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
  if (VarAccess::tape_state(x)) return VarAccess::tape_state(x)->seed;
  const std::shared_ptr<TapeState>& current = current_tape_slot();
  return current && !current->ended ? current->seed : next_thread_seed();
}

}  // namespace detail

/// Records a custom op (a class deriving from Node<T>, see docs/guide.md) applied to `inputs`,
/// and returns its output. Input k of the op's forward() and backward() is inputs[k]. Parameters
/// and constants may be inputs; with no tape recording (or under NoGradGuard) the op only runs
/// forward().
template <class T>
Var<T> apply(std::unique_ptr<Node<T>> node, std::initializer_list<Var<T>> inputs) {
  if (!node) throw ArgumentError("apply: the op is null");
  std::vector<const Var<T>*> pointers;
  for (const Var<T>& v : inputs) pointers.push_back(&v);
  return detail::record<T>(std::move(node), pointers);
}

/// apply() for an op of type Op built from `args`: apply<Square<double>>({x}) or
/// apply<Scale<float>>({x}, 2.0f). Parameters convert to the inputs' Var type.
template <class Op, class... Args>
Var<typename Op::Scalar> apply(std::initializer_list<Var<typename Op::Scalar>> inputs,
                               Args&&... args) {
  static_assert(std::is_base_of_v<Node<typename Op::Scalar>, Op>,
                "remat::apply<Op>: Op must derive from remat::Node<T>");
  return apply<typename Op::Scalar>(std::make_unique<Op>(std::forward<Args>(args)...), inputs);
}

}  // namespace remat
