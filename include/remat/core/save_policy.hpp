#pragma once
/// @file
/// Save policies: which ops inside a checkpoint segment keep their output (and what their
/// backward needs) from the first forward pass instead of being recomputed by the replay.
///
///     x = remat::checkpoint(block, remat::save_matmuls(), x);
///     { remat::CheckpointScope scope(remat::save_ops({remat::op::linear, remat::op::layer_norm}));
///     h = block(h); }
///
/// Note [kept nodes]: skipping a node's forward during a replay also skips its save() of what its
/// backward needs. Two answers, chosen per node when its first forward returns (the policy sees
/// the output's shape, so every node of a policy's segment saves tentatively and drops it at once
/// when not kept):
///  - *kept* (the default): the node is, for saving, outside its segment. It keeps what it saved
///    in the first forward pass, the replay skips it, its inputs are not captured, and the sweep
///    runs its backward without replaying its segment. Its output goes into its value slot only
///    when a replayed op of the same top-level segment reads it (keep_replay_reads()), and is
///    dropped once that segment's replay is done. Keeping every op this way costs exactly what no
///    checkpoint costs (tested).
///  - *resaved*: a kept op whose backward needs only its inputs and output (can_resave(): matmul,
///    linear) and that reads a value the replay recomputes anyway. It keeps only its output; the
///    replay calls resave() instead of forward(), which save()s the recomputed inputs. Without
///    this a kept GEMM would hold its first-pass input while the replay recomputed a second copy.
/// Either way the kept output is the first pass's bits, so gradients are those of the plain run.
///
/// Policies name ops by identity (core/op_type.hpp): `save_ops({op::linear})` keeps the op whose
/// node returns op::linear, so renaming an op cannot make a policy stop matching it.

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "remat/core/error.hpp"
#include "remat/core/op_type.hpp"
#include "remat/core/shape.hpp"

namespace remat {

/// What a policy sees of an op when deciding whether to keep its output.
struct OpInfo {
  const OpType& op;    ///< the op's identity: `info.op == op::linear`, `info.op.name()`
  const Shape& shape;  ///< the output's shape
  double flops = 0;    ///< estimated forward FLOPs (Node::forward_flops())
};

/// Which ops of a segment keep their output from the first forward pass (Note [kept nodes]).
/// Copyable; an empty policy (save_nothing()) keeps nothing, as a plain checkpoint does.
class SavePolicy {
 public:
  using Predicate = std::function<bool(const OpInfo&)>;

  /// save_nothing().
  SavePolicy() = default;
  /// A policy named `name` keeping the ops for which `keep` returns true.
  SavePolicy(std::string name, Predicate keep) : name_(std::move(name)), keep_(std::move(keep)) {}

  /// Whether the op described by `info` keeps its output.
  bool keeps(const OpInfo& info) const { return keep_ && keep_(info); }
  /// False for save_nothing(): the segment replays every op.
  bool keeps_anything() const noexcept { return static_cast<bool>(keep_); }
  /// "save_nothing", "save_matmuls", "save_ops(linear, gelu)", ...
  const std::string& name() const noexcept { return name_; }
  /// Policies compare by name (two predicates cannot be compared).
  friend bool operator==(const SavePolicy& a, const SavePolicy& b) noexcept {
    return a.name_ == b.name_;
  }

 private:
  std::string name_ = "save_nothing";
  Predicate keep_;
};

namespace detail {

inline std::string joined(const OpTypes& ops) {
  std::string s;
  for (const OpType& op : ops) s += (s.empty() ? "" : ", ") + std::string(op.name());
  return s;
}

inline bool listed(const OpTypes& ops, const OpType& op) {
  return std::any_of(ops.begin(), ops.end(), [&](const OpType& o) { return o == op; });
}

}  // namespace detail

/// Keeps nothing: every op of the segment is recomputed (a plain checkpoint).
inline SavePolicy save_nothing() { return SavePolicy(); }

/// Keeps the outputs of the ops listed (and what their backward needs); recomputes the rest.
inline SavePolicy save_ops(OpTypes ops) {
  std::string label = "save_ops(" + detail::joined(ops) + ")";
  return SavePolicy(std::move(label), [ops = std::move(ops)](const OpInfo& info) {
    return detail::listed(ops, info.op);
  });
}

/// Keeps the outputs of matrix products (OpType::is_gemm(): matmul, linear, quantized_linear);
/// recomputes element-wise ops, norms and the rest.
inline SavePolicy save_matmuls() {
  return SavePolicy("save_matmuls", [](const OpInfo& info) { return info.op.is_gemm(); });
}

/// Recomputes only the ops listed; keeps every other op's output.
inline SavePolicy recompute_ops(OpTypes ops) {
  std::string label = "recompute_ops(" + detail::joined(ops) + ")";
  return SavePolicy(std::move(label), [ops = std::move(ops)](const OpInfo& info) {
    return !detail::listed(ops, info.op);
  });
}

/// Keeps the ops for which `keep(OpInfo)` returns true (op identity, output shape, estimated
/// FLOPs): save_if("big GEMMs", [](const OpInfo& op) { return op.flops > 1e6; }).
inline SavePolicy save_if(std::string name, SavePolicy::Predicate keep) {
  if (!keep) throw PlanError("save_if: the predicate is empty");
  return SavePolicy(std::move(name), std::move(keep));
}

}  // namespace remat
