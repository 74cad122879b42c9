#pragma once
/// @file
/// A block's ops as the tape records them, for pricing a block under any save policy without
/// running it (nn::estimate_memory's StepShape::policies). Each op has its name, output shape and
/// FLOPs (the OpInfo a SavePolicy sees), the values its backward saves, and how long the
/// forward's Vars hold its output; detail::price_block_policy() evaluates the policy's own
/// predicate on every op and replays, buffer by buffer, what the tape does (Note [block ops]).
///
/// Note [block ops]: under a policy segment over one layer (Note [kept nodes] in
/// core/save_policy.hpp, Note [policy layers] in checkpoint/plan/simulator.hpp) the tape
/// - in the first pass keeps what the kept ops save, the kept outputs a replayed op reads (their
///   value slots), and the output of a *resaved* op (a kept linear reading a value the replay
///   recomputes); the other values live as long as the forward's Vars hold them;
/// - in backward, when the sweep first reaches an op not kept (the ops after it ran their
///   backward already), replays every op not kept, in order, each saving what its backward needs
///   and dropping each recomputed value after its last use in the block unless saved; the kept
///   values' slots are dropped once the replay is done;
/// - runs each op's backward in turn: its input gradients are made (Grads: an empty slot adopts
///   them, a shared one is copied first), `add` hands its output's gradient to both inputs, and
///   once done the op releases what it saved and its output's gradient.
/// The model follows values and gradients as buffers with reference counts (a value saved by two
/// ops counts once), so what a policy keeps, its first pass's peak and its backward's peak come
/// out of the op list alone. Op internals the list does not describe (a norm's or an attention's
/// backward temporaries beyond the scratch given) are taken from the plain block: the estimator
/// adds what the same sweep with every op kept misses of the chain's beta_l. Ops whose inputs need
/// no gradient (a LoRA model's first block before its first adapter) are on the tape all the
/// same, asked about and replayed, but save nothing.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "remat/core/op_type.hpp"
#include "remat/core/save_policy.hpp"
#include "remat/core/shape.hpp"

namespace remat::detail {

/// One op of a block (Note [block ops]). Values are numbered -1 for the block's input x_l and i
/// for op i's output.
struct BlockOp {
  const OpType* type = nullptr;  ///< Node::op_type(), as the tape records it
  Shape shape;                   ///< its output's shape
  double flops = 0;              ///< Node::forward_flops()
  std::vector<int> inputs;       ///< the values it reads (parameters left out)
  std::vector<int> saves;        ///< the values its backward holds
  double own = 0;                ///< elements it saves of its own (norm statistics, probabilities)
  double scratch_bytes = 0;      ///< forward scratch beside its inputs and output
  int held_until = -1;           ///< the last op during which the forward's Vars hold its output
  bool resaves = false;          ///< Node::can_resave(): linear, quantized_linear
  bool grad = true;              ///< its output needs a gradient: without, it saves nothing
  double cost = 0;               ///< its share of the chain's forward cost (GEMMs, attention)
  double backward_scratch_bytes = 0;  ///< scratch while its backward runs
  bool grad_in_place = false;  ///< writes its input gradients into their slots (Grads::add_with)
  bool alias_grad = false;     ///< hands its output's gradient to its inputs as it is (add)

  double elements() const { return static_cast<double>(shape.numel()); }
};

/// What a block under a policy costs (plan::PolicyCosts' figures for one layer), in bytes.
struct BlockPolicyFigures {
  double kept = 0;           ///< held from the first pass besides x_l and x_{l+1}
  double forward = 0;        ///< the first pass's peak above x_l, kept and x_{l+1}
  double backward = 0;       ///< its backward's peak (replay included) above what is live then
  double replay_cost = 0;    ///< the replayed ops' share of the chain's cost
  bool saves_input = false;  ///< x_l is captured by a replayed op or saved by a kept one
  bool tail_chains = false;  ///< adjacent segments under the policy would chain (Note
                             ///< [chained segments] in core/tape_state.hpp)
};

/// Prices `ops` (in order; the last one's output is the block's) under `policy`, `e` bytes an
/// element, following Note [block ops]. `input_grad`: the block's input needs a gradient.
inline BlockPolicyFigures price_block_policy(const std::vector<BlockOp>& ops,
                                             const SavePolicy& policy, double e, bool input_grad) {
  const int n = static_cast<int>(ops.size());
  const auto at = [](int i) { return static_cast<std::size_t>(i); };
  BlockPolicyFigures f;
  std::vector<bool> kept(at(n), false), resaved(at(n), false);
  for (int i = 0; i < n; ++i) {
    const BlockOp& op = ops[at(i)];
    kept[at(i)] = policy.keeps(OpInfo{*op.type, op.shape, op.flops});  // in order, as the tape asks
  }
  // a kept linear that reads a value the replay recomputes keeps only its output (resaved);
  // decided in order, so a linear reading a resaved one is resaved too
  const auto recomputed = [&](int v) { return v >= 0 && !kept[at(v)]; };
  for (int i = 0; i < n; ++i) {
    const BlockOp& op = ops[at(i)];
    if (kept[at(i)] && op.resaves && std::any_of(op.inputs.begin(), op.inputs.end(), recomputed)) {
      kept[at(i)] = false;
      resaved[at(i)] = true;
    }
  }
  const auto bytes = [&](int v) { return ops[at(v)].elements() * e; };
  const auto scratch = [&](int t) { return ops[at(t)].scratch_bytes; };
  const auto has = [](const std::vector<int>& vs, int v) {
    return std::find(vs.begin(), vs.end(), v) != vs.end();
  };
  // what a kept op holds from the first pass: what it saved (nothing without a gradient)
  const auto holds = [&](int i, int v) {
    return kept[at(i)] && ops[at(i)].grad && has(ops[at(i)].saves, v);
  };
  // value slots: a resaved op's output, and a kept output a replayed op reads
  std::vector<bool> slot(at(n), false);
  for (int i = 0; i < n; ++i) {
    if (resaved[at(i)]) slot[at(i)] = true;
    if (kept[at(i)]) continue;
    for (int v : ops[at(i)].inputs) {
      if (v >= 0 && (kept[at(v)] || resaved[at(v)])) slot[at(v)] = true;
    }
  }
  std::vector<bool> persistent = slot;
  double own_kept = 0;
  for (int i = 0; i < n; ++i) {
    if (!kept[at(i)] || !ops[at(i)].grad) continue;
    for (int v : ops[at(i)].saves) {
      if (v >= 0) persistent[at(v)] = true;
    }
    own_kept += ops[at(i)].own * e;
  }
  // x_l: captured when a replayed op reads it, saved when a kept op does
  for (int i = 0; i < n; ++i) {
    if ((!kept[at(i)] && has(ops[at(i)].inputs, -1)) || holds(i, -1)) f.saves_input = true;
  }
  // the first pass, op by op: values held by the forward's Vars or by what kept them so far;
  // every op makes its own saved tensors (its probabilities, say) and drops them if not kept
  double peak = 0, own_so_far = 0;
  std::vector<bool> held(at(n), false);
  for (int t = 0; t < n; ++t) {
    const BlockOp& op = ops[at(t)];
    for (int v = 0; v <= t; ++v) {
      if (holds(t, v) || slot[at(v)]) held[at(v)] = true;
    }
    double live = own_so_far + op.own * e + scratch(t);
    for (int v = 0; v <= t; ++v) {
      if (t <= std::max(v, ops[at(v)].held_until) || held[at(v)]) live += bytes(v);
    }
    peak = std::max(peak, live);
    if (kept[at(t)] && op.grad) own_so_far += op.own * e;
  }
  f.kept = own_kept;
  for (int v = 0; v + 1 < n; ++v) {
    if (persistent[at(v)]) f.kept += bytes(v);
  }
  f.forward = std::max(0.0, peak - f.kept - bytes(n - 1));
  // The backward sweep, op by op from the last, over buffers with reference counts: the values
  // the block kept (each held by the ops that saved it and by its slot), the replay's copies,
  // the ops' own saved tensors, and the gradients (Grads: an empty slot adopts a new gradient,
  // `add` hands its output's gradient to both inputs, a shared slot is copied before it is
  // added to). Measured above what is live when the block's backward starts, as
  // PolicyCosts::backward_transient_bytes is.
  struct Buffer {
    double amount;  // bytes
    int refs;
  };
  std::vector<Buffer> buffers;
  double extra = 0, backward_peak = 0;
  const auto make = [&](double b, bool counted) {
    buffers.push_back({b, 1});
    if (counted) extra += b;
    return static_cast<int>(buffers.size()) - 1;
  };
  const auto unref = [&](int id) {
    if (id >= 0 && --buffers[at(id)].refs == 0) extra -= buffers[at(id)].amount;
  };
  const auto ref = [&](int id) { ++buffers[at(id)].refs; };
  // the first pass's values: one reference per kept op that saved it and one for its slot
  std::vector<int> first_copy(at(n), -1), fresh_copy(at(n), -1), own_buffer(at(n), -1);
  std::vector<std::vector<int>> saved_by(at(n));
  for (int v = 0; v + 1 < n; ++v) {
    if (!persistent[at(v)]) continue;
    first_copy[at(v)] = make(bytes(v), false);
    buffers[at(first_copy[at(v)])].refs = slot[at(v)] ? 1 : 0;
  }
  for (int i = 0; i < n; ++i) {
    if (!kept[at(i)] || !ops[at(i)].grad) continue;
    for (int v : ops[at(i)].saves) {
      if (v < 0 || v + 1 == n) continue;
      ref(first_copy[at(v)]);
      saved_by[at(i)].push_back(first_copy[at(v)]);
    }
    if (ops[at(i)].own > 0) own_buffer[at(i)] = make(ops[at(i)].own * e, false);
  }
  // the replay, run when the sweep first needs an op that was not kept
  std::vector<int> last_use(at(n), -1);
  for (int i = 0; i < n; ++i) {
    for (int v : ops[at(i)].inputs) {
      if (v >= 0) last_use[at(v)] = std::max(last_use[at(v)], i);
    }
  }
  bool replayed = false;
  const auto replay = [&] {
    replayed = true;
    std::vector<bool> in_flight(at(n), false);
    for (int i = 0; i < n; ++i) {
      const BlockOp& op = ops[at(i)];
      if (!kept[at(i)]) {
        if (!resaved[at(i)]) {
          fresh_copy[at(i)] = make(bytes(i), true);
          in_flight[at(i)] = true;
          f.replay_cost += op.cost;
        }
        // a resaved op only saves its inputs again: no scratch, no output
        const double work = resaved[at(i)] ? 0.0 : scratch(i);
        backward_peak = std::max(backward_peak, extra + work + (op.grad ? 0.0 : op.own * e));
        if (op.grad) {
          if (op.own > 0) own_buffer[at(i)] = make(op.own * e, true);
          for (int v : op.saves) {
            if (v < 0) continue;
            const int copy = fresh_copy[at(v)] >= 0 ? fresh_copy[at(v)] : first_copy[at(v)];
            if (copy < 0) continue;
            ref(copy);
            saved_by[at(i)].push_back(copy);
          }
        }
        backward_peak = std::max(backward_peak, extra + work);
      }
      const auto drop = [&](int v) {
        if (in_flight[at(v)]) {
          in_flight[at(v)] = false;
          unref(fresh_copy[at(v)]);
        }
      };
      for (int v : op.inputs) {
        if (v >= 0 && last_use[at(v)] == i) drop(v);
      }
      if (last_use[at(i)] < 0) drop(i);
    }
    for (int v = 0; v < n; ++v) {
      if (slot[at(v)]) unref(first_copy[at(v)]);  // no replay reads it any more
    }
  };
  // gradient slots, x_l's last; the block output's gradient exists already (not counted here)
  std::vector<int> grad(at(n) + 1, -1);
  const auto grad_of = [&](int v) -> int& { return grad[v < 0 ? at(n) : at(v)]; };
  grad_of(n - 1) = make(bytes(n - 1), false);
  const double input_bytes = bytes(n - 1);  // x_l is as wide as the block's output
  for (int i = n - 1; i >= 0; --i) {
    const BlockOp& op = ops[at(i)];
    if (!op.grad || grad_of(i) < 0) continue;
    if (!kept[at(i)] && !replayed) replay();
    double temporary = 0;
    for (int u : op.inputs) {
      const bool needs = u < 0 ? input_grad : ops[at(u)].grad;
      if (!needs) continue;
      int& slot_u = grad_of(u);
      const double size = u < 0 ? input_bytes : bytes(u);
      if (op.alias_grad) {
        if (slot_u < 0) {
          slot_u = grad_of(i);
          ref(slot_u);
        } else if (buffers[at(slot_u)].refs > 1) {
          unref(slot_u);
          slot_u = make(size, true);
        }
        continue;
      }
      if (!op.grad_in_place) temporary += size;  // made whole, then adopted or added
      if (slot_u < 0) {
        slot_u = make(size, true);
        if (!op.grad_in_place) temporary -= size;  // adopted
      } else if (buffers[at(slot_u)].refs > 1) {
        unref(slot_u);
        slot_u = make(size, true);
      }
    }
    backward_peak = std::max(backward_peak, extra + temporary + op.backward_scratch_bytes);
    for (int id : saved_by[at(i)]) unref(id);
    unref(own_buffer[at(i)]);
    unref(grad_of(i));
    grad_of(i) = -1;
  }
  f.backward = backward_peak;
  // Note [chained segments]: the ops after the last kept one chain into the next segment when
  // they read only the segment's kept values and save nothing new
  int last = n - 1;
  while (last >= 0 && !kept[at(last)] && !resaved[at(last)]) --last;
  if (last >= 0 && last < n - 1) {
    bool chains = true;
    for (int i = last + 1; i < n; ++i) {
      const BlockOp& op = ops[at(i)];
      if (op.own > 0 && op.grad) chains = false;  // it would save a tensor nothing holds yet
      for (int v : op.inputs) {
        if (v > last && op.grad && !op.saves.empty()) chains = false;
        if (v <= last && (v < 0 || !slot[at(v)])) chains = false;
      }
    }
    f.tail_chains = chains;
  }
  return f;
}

}  // namespace remat::detail
