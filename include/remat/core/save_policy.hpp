#pragma once
/// @file
/// Save policies: which ops inside a checkpoint segment keep their output (and what their
/// backward needs) from the first forward pass instead of being recomputed by the replay.
///
///     x = remat::checkpoint(block, remat::save_matmuls(), x);
///     { remat::CheckpointScope scope(remat::save_ops({"linear", "layer_norm"})); h = block(h); }
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
/// Op names are checked against a registry (op_names()) the op headers fill next to each op's
/// op_name(); a custom op registers its name with register_op_name(). An unknown name in
/// save_ops() or recompute_ops() raises a PlanError listing the known names.

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/shape.hpp"

namespace remat {

/// What a policy sees of an op when deciding whether to keep its output.
struct OpInfo {
  std::string_view op;  ///< op_name(): "linear", "matmul", "gelu", ...
  const Shape& shape;   ///< the output's shape
  double flops = 0;     ///< estimated forward FLOPs (Node::forward_flops())
};

namespace detail {

struct OpNameRegistry {
  std::mutex mutex;
  std::set<std::string, std::less<>> names;
};

inline OpNameRegistry& op_name_registry() {
  static OpNameRegistry registry;
  return registry;
}

}  // namespace detail

/// Adds `name` to the op names policies accept (built-in ops register theirs; call it for a
/// custom op before naming it in save_ops() or recompute_ops()). Returns true, so that a header
/// can register at static initialization: `inline const bool r = register_op_name("my_op");`.
inline bool register_op_name(std::string_view name) {
  detail::OpNameRegistry& r = detail::op_name_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.names.emplace(name);
  return true;
}

/// Registers several names (see register_op_name()).
inline bool register_op_names(std::initializer_list<std::string_view> names) {
  for (std::string_view n : names) register_op_name(n);
  return true;
}

/// Every registered op name, sorted.
inline std::vector<std::string> op_names() {
  detail::OpNameRegistry& r = detail::op_name_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return std::vector<std::string>(r.names.begin(), r.names.end());
}

/// Whether `name` is a registered op name.
inline bool is_op_name(std::string_view name) {
  detail::OpNameRegistry& r = detail::op_name_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.names.find(name) != r.names.end();
}

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

inline void check_op_names(const char* policy, const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    if (is_op_name(n)) continue;
    std::ostringstream known;
    for (const std::string& k : op_names()) known << (known.tellp() > 0 ? ", " : "") << k;
    throw PlanError(cat(policy, ": unknown op name '", n, "' (known: ", known.str(),
                        "; a custom op registers its name with remat::register_op_name)"));
  }
}

inline std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace detail

/// Keeps nothing: every op of the segment is recomputed (a plain checkpoint).
inline SavePolicy save_nothing() { return SavePolicy(); }

/// Keeps the outputs of the ops named (and what their backward needs); recomputes the rest.
/// Throws a PlanError for a name no op registered.
inline SavePolicy save_ops(std::vector<std::string> names) {
  detail::check_op_names("save_ops", names);
  std::string label = "save_ops(" + detail::joined(names) + ")";
  return SavePolicy(std::move(label), [names = std::move(names)](const OpInfo& op) {
    return std::find(names.begin(), names.end(), op.op) != names.end();
  });
}

/// Keeps the outputs of matmuls and linear layers (float or quantized weights); recomputes
/// element-wise ops, norms and the rest. Its names are not checked against the registry: a
/// program that never includes ops/matmul.hpp may still ask for it.
inline SavePolicy save_matmuls() {
  return SavePolicy("save_matmuls", [](const OpInfo& op) {
    return op.op == "matmul" || op.op == "linear" || op.op == "quantized_linear";
  });
}

/// Recomputes only the ops named; keeps every other op's output. Throws a PlanError for a name
/// no op registered.
inline SavePolicy recompute_ops(std::vector<std::string> names) {
  detail::check_op_names("recompute_ops", names);
  std::string label = "recompute_ops(" + detail::joined(names) + ")";
  return SavePolicy(std::move(label), [names = std::move(names)](const OpInfo& op) {
    return std::find(names.begin(), names.end(), op.op) == names.end();
  });
}

/// Keeps the ops for which `keep(OpInfo)` returns true (op name, output shape, estimated FLOPs):
/// save_if("big GEMMs", [](const OpInfo& op) { return op.flops > 1e6; }).
inline SavePolicy save_if(std::string name, SavePolicy::Predicate keep) {
  if (!keep) throw PlanError("save_if: the predicate is empty");
  return SavePolicy(std::move(name), std::move(keep));
}

}  // namespace remat
