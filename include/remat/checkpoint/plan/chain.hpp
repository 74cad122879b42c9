#pragma once
/// @file
/// plan::Chain (what the planners know about a chain of layers), plan::Segment and plan::Plan
/// (what they return). See checkpoint/plan.hpp for the planners.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/save_policy.hpp"

namespace remat::plan {

/// How the layers of a chain run under one save policy, each in a checkpoint segment of its own
/// (Note [policy layers] in plan/simulator.hpp): measured by plan::profile, n values each. Such a
/// layer behaves, seen from the rest of the chain, like a plain layer that keeps less and whose
/// backward replays part of its forward first; these are that layer's figures.
struct PolicyCosts {
  SavePolicy policy;  ///< the policy (matched to plans by name)
  std::vector<double>
      activation_bytes;  ///< what layer l keeps from its first pass besides x_l, x_{l+1}
  std::vector<double>
      forward_transient_bytes;  ///< above x_l, a_l and x_{l+1} while it runs forward
  std::vector<double>
      backward_transient_bytes;  ///< above what is live when its backward starts, replay included
  std::optional<double> last_unheld_backward_transient_bytes;  ///< as Chain's, for the last layer
  std::vector<bool> saves_input;    ///< x_l stays alive until its backward (captured or saved)
  std::vector<bool> saves_output;   ///< x_{l+1} stays alive until its backward
  std::vector<double> replay_cost;  ///< its backward's replay, in the chain's cost unit
  /// n or empty (none): layer l keeps its output's bfloat16 copy (Chain::saves_output_copy)
  std::vector<bool> saves_output_copy;
  /// The same figures for a layer whose neighbour runs under the same policy in a segment of its
  /// own right next to it, so that the two segments chain (Note [chained policy layers] in
  /// plan/simulator.hpp): chained[0] with the layer after it, chained[1] with the layer before
  /// it, chained[2] with both (chained(k) names them by k = 1, 2, 3). Empty: not measured, and a
  /// plan running two adjacent layers under this policy cannot be predicted.
  std::vector<PolicyCosts> chained;

  /// This policy's figures for a layer chained with the layer after it (bit 0 of k) and with
  /// the layer before it (bit 1); k = 0: not chained.
  const PolicyCosts& variant(int k) const noexcept {
    return k == 0 ? *this : chained[static_cast<std::size_t>(k - 1)];
  }

  /// Throws a PlanError naming the policy and the first inconsistency.
  void validate(std::size_t n, const char* who) const {
    validate_figures(n, who);
    if (!chained.empty() && chained.size() != 3) {
      throw PlanError(remat::detail::cat(who, ": the chain's costs for policy '", policy.name(),
                                         "' have ", chained.size(),
                                         " sets of chained figures (3 or none)"));
    }
    for (const PolicyCosts& c : chained) {
      if (!(c.policy == policy) || !c.chained.empty()) {
        throw PlanError(remat::detail::cat(who, ": the chained figures of policy '", policy.name(),
                                           "' name policy '", c.policy.name(),
                                           "' or hold chained figures themselves"));
      }
      c.validate_figures(n, who);
    }
  }

 private:
  void validate_figures(std::size_t n, const char* who) const {
    const auto fail = [&](const std::string& what) {
      throw PlanError(
          remat::detail::cat(who, ": the chain's costs for policy '", policy.name(), "' ", what));
    };
    if (!policy.keeps_anything())
      fail("keep nothing: a layer under save_nothing is a segment of the chain itself");
    for (const auto* v :
         {&activation_bytes, &forward_transient_bytes, &backward_transient_bytes, &replay_cost}) {
      if (v->size() != n)
        fail(remat::detail::cat("have ", v->size(), " values where the chain has ", n, " layers"));
      for (std::size_t i = 0; i < n; ++i) {
        if (!((*v)[i] >= 0) || !std::isfinite((*v)[i]))
          fail(remat::detail::cat("have the value ", (*v)[i], " for layer ", i,
                                  "; values must be finite and >= 0"));
      }
    }
    if (saves_input.size() != n || saves_output.size() != n ||
        (!saves_output_copy.empty() && saves_output_copy.size() != n)) {
      fail(remat::detail::cat("have ", saves_input.size(), " saves_input, ", saves_output.size(),
                              " saves_output and ", saves_output_copy.size(),
                              " saves_output_copy flags for ", n, " layers"));
    }
    const double last = last_unheld_backward_transient_bytes.value_or(0);
    if (!(last >= 0) || !std::isfinite(last))
      fail(remat::detail::cat("have a last-layer backward size of ", last));
  }
};

/// A save policy plan::derive_policies() offers: it recomputes some op classes of the layers and
/// keeps every other op's output (Note [derived policies] in checkpoint/derive_policies.hpp).
struct DerivedPolicy {
  SavePolicy policy;                 ///< recompute_ops(<classes>)
  std::vector<std::string> classes;  ///< the classes it recomputes, in the order chosen
  double freed_bytes = 0;  ///< what the layers' first pass keeps less than with every op kept
  double seconds = 0;      ///< the first-pass forward time of the ops it recomputes, all layers
};

/// What the planners know about a chain of n layers. Bytes are per step; costs are in any unit
/// (seconds, FLOPs, or 1 per layer).
struct Chain {
  std::vector<double> boundary_bytes;  ///< n + 1: x_0 (the input) ... x_n (the output)
  std::vector<double>
      activation_bytes;  ///< n: what layer l keeps for backward besides x_l, x_{l+1}
  std::vector<double>
      forward_transient_bytes;  ///< n (or empty: 0): temporaries while l runs forward
  /// The other ways a layer runs (Note [four ways a layer runs] in plan/simulator.hpp), n each
  /// or empty; empty means the upper bound from the plain first pass (a_l + tau_l for a run
  /// that keeps nothing, tau_l for a replay that keeps a_l). "Held": x_l stays alive through the
  /// layer; "free": a replay drops x_l after its last use, so those are whole peaks, above what
  /// else was live, x_l, a_l and x_{l+1} included.
  std::vector<double>
      segment_transient_bytes;  ///< first pass inside a segment: above x_l and x_{l+1}
  std::vector<double>
      replay_transient_bytes;  ///< replay keeping a_l, x_l held: above x_l, a_l and x_{l+1}
  std::vector<double> replay_free_peak_bytes;  ///< replay keeping a_l, x_l free: the whole peak
  std::vector<double>
      dropped_transient_bytes;  ///< replay keeping nothing, x_l held: above x_l and x_{l+1}
  std::vector<double>
      dropped_free_peak_bytes;  ///< replay keeping nothing, x_l free: the whole peak
  std::vector<double>
      backward_transient_bytes;  ///< n (or empty: 0): temporaries while l runs backward
  /// The last layer's backward temporaries when the output it keeps (tanh's, relu's) is held by
  /// nothing else, so its backward frees it early: a replayed copy, or x_n when the caller does
  /// not hold it (unset: backward_transient_bytes[n-1]).
  std::optional<double> last_unheld_backward_transient_bytes;
  /// n (or empty: 1 each): cost of layer l's forward, which is what replaying it costs
  /// (plan::profile measures the replay itself unless ProfileOptions::price_replays is off)
  std::vector<double> forward_cost;
  std::vector<bool>
      saves_output;  ///< n (or empty: all true): layer l keeps x_{l+1} for its backward
  std::vector<bool> saves_input;  ///< n (or empty: all true): layer l keeps x_l for its backward
  double loss_bytes = 0;          ///< what the loss keeps from its forward to its backward
  double loss_output_bytes = 0;   ///< the loss value and its seed gradient, alive to the end
  double loss_forward_transient_bytes =
      0;  ///< temporaries while the loss runs forward (a tile of logits)
  double loss_backward_transient_bytes =
      0;  ///< temporaries while the loss runs backward, x_n's gradient included
  bool input_made_in_step = false;  ///< x_0 is computed during the step (it then counts)
  /// The caller holds the output x_n until the backward pass ends, as `auto y = model(x);
  /// tape.backward(loss(y));` does and plan::profile measures. false: x_n lives until the
  /// loss's backward pass is done, as when the loss saves its input and the caller keeps no Var
  /// of it (GPT::loss: ln_f saves it); an upper bound when the loss does not save it.
  bool output_held = true;
  /// Per layer (n, or empty: none): layer l keeps a bfloat16 copy of its output x_{l+1}, which
  /// the next layer's saves (or the loss's) share while it lives (Note [shared copies] in
  /// plan/simulator.hpp). Set by plan::profile under Precision::bf16.
  std::vector<bool> saves_output_copy;
  /// The figures of a layer (and of the loss) that runs while the layer before it is kept with
  /// its output's copy (saves_output_copy, or a policy's): measured with that copy made before
  /// the layer ran, so a_l, tau_l, beta_l and the replay peaks exclude it, and its policies'
  /// figures likewise (matched to `policies` by policy). Set when a layer keeps its output's copy;
  /// only its per-layer, loss and policy figures are read (Note [shared copies]).
  std::shared_ptr<const Chain> with_input_copy;
  /// Profiled under Precision::bf16, layers share a bfloat16 copy in a way plan::profile could
  /// not price (Note [shared copies]: a layer whose output is a view of its input, or whose
  /// output float outlives its copy's owner). No plan of this chain is predicted
  /// (Plan::predicted is false) and the planners that need predictions refuse it
  /// (require_predictable). train::estimate_memory and step_peak count such a step exactly.
  bool unpriced_copies = false;
  /// Throws a PlanError when `who` would plan from predictions this chain cannot make.
  void require_predictable(const char* who) const {
    if (!unpriced_copies) return;
    throw PlanError(std::string(who) +
                    ": the chain was profiled under Precision::bf16 and its layers share a "
                    "bfloat16 copy in a way the profile cannot price (a layer whose output is a "
                    "view of its input, or that keeps its output both as a copy and as floats); "
                    "plan it from a float32 profile, or choose none, every or sqrt; "
                    "train::estimate_memory and step_peak price the step exactly");
  }
  /// This chain with no loss after its layers (the layers' own peak, or a backward pass seeded on
  /// x_n by the caller): the loss's figures zeroed, in with_input_copy's figures too, which the
  /// loss runs with after a last layer kept with its output's copy.
  Chain without_loss() const {
    Chain c = *this;
    c.loss_bytes = c.loss_output_bytes = c.loss_forward_transient_bytes =
        c.loss_backward_transient_bytes = 0;
    if (with_input_copy)
      c.with_input_copy = std::make_shared<const Chain>(with_input_copy->without_loss());
    return c;
  }
  /// Whether any of the flags (saves_output_copy, a policy's) is set.
  static bool any_true(const std::vector<bool>& flags) {
    return std::find(flags.begin(), flags.end(), true) != flags.end();
  }
  /// Whether layer l keeps its output's bfloat16 copy, which the next layer shares.
  bool keeps_output_copy(std::size_t l) const noexcept {
    return !saves_output_copy.empty() && saves_output_copy[l];
  }
  /// The figures layer l (l = n: the loss) runs with: with_input_copy's when the layer before it
  /// is kept at that time and keeps its output's copy.
  const Chain& figures(std::size_t l, bool previous_kept) const noexcept {
    return figures(l > 0 && previous_kept && keeps_output_copy(l - 1));
  }
  /// with_input_copy's figures when a copy of the layer's input exists as it runs.
  const Chain& figures(bool input_copy) const noexcept {
    return input_copy && with_input_copy ? *with_input_copy : *this;
  }
  /// Each layer under each of these save policies in a segment of its own (plan::profile
  /// measures them); empty: the planners choose among plain layers and save_nothing segments.
  std::vector<PolicyCosts> policies;
  /// The policies plan::profile derived from the layers (ProfileOptions::derived_policies), in
  /// the order offered, with what each frees and replays; their costs are in `policies`. For
  /// the reader: the planners do not look at it.
  std::vector<DerivedPolicy> derived;

  std::size_t layers() const noexcept { return activation_bytes.size(); }

  /// n identical layers: boundaries of `boundary` bytes, `activation` bytes kept per layer.
  static Chain uniform(std::size_t n, double boundary = 1, double activation = 0, double cost = 1) {
    Chain c;
    c.boundary_bytes.assign(n + 1, boundary);
    c.activation_bytes.assign(n, activation);
    c.forward_cost.assign(n, cost);
    return c;
  }

  double boundary(std::size_t j) const noexcept {
    return j == 0 && !input_made_in_step ? 0.0 : boundary_bytes[j];
  }
  double activation(std::size_t l) const noexcept { return activation_bytes[l]; }
  double tau(std::size_t l) const noexcept {
    return forward_transient_bytes.empty() ? 0.0 : forward_transient_bytes[l];
  }
  double tau_segment(std::size_t l) const noexcept {
    return segment_transient_bytes.empty() ? activation(l) + tau(l) : segment_transient_bytes[l];
  }
  double tau_replay(std::size_t l) const noexcept {
    return replay_transient_bytes.empty() ? tau(l) : replay_transient_bytes[l];
  }
  double tau_dropped(std::size_t l) const noexcept {
    return dropped_transient_bytes.empty() ? activation(l) + tau(l) : dropped_transient_bytes[l];
  }
  /// The peak of replaying layer l above what else is live, its input x_l included: held (x_l
  /// alive throughout) or free (dropped after its last use), keeping a_l or not.
  double replay_peak(std::size_t l, bool keeps, bool input_held) const noexcept {
    const double held =
        boundary(l) + boundary(l + 1) + (keeps ? activation(l) + tau_replay(l) : tau_dropped(l));
    const std::vector<double>& free = keeps ? replay_free_peak_bytes : dropped_free_peak_bytes;
    return input_held || free.empty() ? held : free[l];
  }
  /// beta_l, for the last layer whether its kept output is held by anything else or not.
  double beta(std::size_t l, bool output_unheld) const noexcept {
    return output_unheld && l + 1 == layers() && last_unheld_backward_transient_bytes
               ? *last_unheld_backward_transient_bytes
               : beta(l);
  }
  double beta(std::size_t l) const noexcept {
    return backward_transient_bytes.empty() ? 0.0 : backward_transient_bytes[l];
  }
  double cost(std::size_t l) const noexcept { return forward_cost.empty() ? 1.0 : forward_cost[l]; }
  bool keeps_output(std::size_t l) const noexcept {
    return saves_output.empty() || saves_output[l];
  }
  bool keeps_input(std::size_t l) const noexcept { return saves_input.empty() || saves_input[l]; }
  double total_cost() const noexcept {
    double s = 0;
    for (std::size_t l = 0; l < layers(); ++l) s += cost(l);
    return s;
  }

  /// Throws a PlanError naming the first inconsistency (sizes, negative or non-finite values).
  void validate(const char* who) const {
    const std::size_t n = layers();
    const auto fail = [&](const std::string& what) {
      throw PlanError(std::string(who) + ": chain " + what);
    };
    if (n == 0) fail("has no layers");
    if (boundary_bytes.size() != n + 1) {
      fail(detail::cat("has ", n, " layers but ", boundary_bytes.size(), " boundary sizes (needs ",
                       n + 1, ")"));
    }
    const auto check = [&](const std::vector<double>& v, const char* name, bool optional) {
      if (optional && v.empty()) return;
      if (v.size() != n && v != boundary_bytes)
        fail(detail::cat("has ", n, " layers but ", v.size(), " ", name));
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!(v[i] >= 0) || !std::isfinite(v[i]))
          fail(detail::cat("has ", name, "[", i, "] = ", v[i], "; values must be finite and >= 0"));
      }
    };
    check(boundary_bytes, "boundary_bytes", false);
    check(activation_bytes, "activation_bytes", false);
    check(forward_transient_bytes, "forward_transient_bytes", true);
    check(segment_transient_bytes, "segment_transient_bytes", true);
    check(replay_transient_bytes, "replay_transient_bytes", true);
    check(replay_free_peak_bytes, "replay_free_peak_bytes", true);
    check(dropped_transient_bytes, "dropped_transient_bytes", true);
    check(dropped_free_peak_bytes, "dropped_free_peak_bytes", true);
    check(backward_transient_bytes, "backward_transient_bytes", true);
    check(forward_cost, "forward_cost", true);
    if (!saves_output.empty() && saves_output.size() != n)
      fail(remat::detail::cat("has ", n, " layers but ", saves_output.size(),
                              " saves_output flags"));
    if (!saves_input.empty() && saves_input.size() != n)
      fail(remat::detail::cat("has ", n, " layers but ", saves_input.size(), " saves_input flags"));
    if (!saves_output_copy.empty() && saves_output_copy.size() != n) {
      fail(remat::detail::cat("has ", n, " layers but ", saves_output_copy.size(),
                              " saves_output_copy flags"));
    }
    bool copies = any_true(saves_output_copy);
    for (const PolicyCosts& q : policies) {
      copies = copies || any_true(q.saves_output_copy);
      for (const PolicyCosts& k : q.chained) copies = copies || any_true(k.saves_output_copy);
    }
    if (copies && !with_input_copy)
      fail("has layers that keep their output's copy but no with_input_copy figures");
    if (with_input_copy) {
      const Chain& w = *with_input_copy;
      if (w.layers() != n || w.boundary_bytes != boundary_bytes || w.with_input_copy)
        fail("has with_input_copy figures for another chain (layers, boundaries) or nested");
      for (const PolicyCosts& q : policies) {
        const int i = w.policy_index(q.policy);
        if (i < 0 || w.policies[static_cast<std::size_t>(i)].chained.size() != q.chained.size())
          fail(remat::detail::cat("has no with_input_copy figures for policy '", q.policy.name(),
                                  "' (or not for its chained layers)"));
      }
      w.validate(who);
    }
    for (double v :
         {loss_bytes, loss_output_bytes, loss_forward_transient_bytes,
          loss_backward_transient_bytes, last_unheld_backward_transient_bytes.value_or(0)}) {
      if (!(v >= 0) || !std::isfinite(v))
        fail(remat::detail::cat("has a loss size of ", v, "; it must be finite and >= 0"));
    }
    for (std::size_t i = 0; i < policies.size(); ++i) {
      policies[i].validate(n, who);
      for (std::size_t j = 0; j < i; ++j) {
        if (policies[j].policy == policies[i].policy)
          fail(remat::detail::cat("has two entries for policy '", policies[i].policy.name(), "'"));
      }
    }
  }

  /// The index in `policies` of the costs measured for `policy`, or -1.
  int policy_index(const SavePolicy& policy) const noexcept {
    for (std::size_t i = 0; i < policies.size(); ++i) {
      if (policies[i].policy == policy) return static_cast<int>(i);
    }
    return -1;
  }

  /// This chain with every layer as it runs under policies[p] in a segment of its own: a plain
  /// layer that keeps and replays what the policy says (Note [policy layers]); chained with its
  /// neighbours as `k` says (PolicyCosts::variant()).
  Chain under_policy(std::size_t p, int k = 0) const {
    const PolicyCosts& q = policies[p].variant(k);
    Chain c = *this;
    c.policies.clear();
    c.activation_bytes = q.activation_bytes;
    c.forward_transient_bytes = q.forward_transient_bytes;
    c.backward_transient_bytes = q.backward_transient_bytes;
    c.last_unheld_backward_transient_bytes = q.last_unheld_backward_transient_bytes;
    c.saves_input = q.saves_input;
    c.saves_output = q.saves_output;
    c.saves_output_copy = q.saves_output_copy;
    if (with_input_copy) {
      c.with_input_copy = std::make_shared<const Chain>(with_input_copy->under_policy(
          static_cast<std::size_t>(with_input_copy->policy_index(policies[p].policy)), k));
    }
    return c;
  }
};

/// A checkpoint segment over layers [begin, end), possibly holding nested segments.
struct Segment {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::vector<Segment> children;
  /// Which ops of this segment (not of its children) keep their outputs instead of being
  /// replayed (core/save_policy.hpp). Planners leave it save_nothing(); see with_policy().
  SavePolicy policy;

  friend bool operator==(const Segment&, const Segment&) = default;
};

/// Which planner made a Plan.
enum class Kind { none, every, sqrt, budget, optimal, custom };

/// The planner's name: "none", "every", "sqrt", "budget", "optimal" or "custom".
inline const char* to_string(Kind k) noexcept {
  switch (k) {
    case Kind::none:
      return "none";
    case Kind::every:
      return "every";
    case Kind::sqrt:
      return "sqrt";
    case Kind::budget:
      return "budget";
    case Kind::optimal:
      return "optimal";
    case Kind::custom:
      break;
  }
  return "custom";
}

/// Bytes as a person reads them: "812 B", "3.25 KiB", "1.50 MiB", "2.00 GiB".
inline std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::abs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::ostringstream out;
  if (u == 0)
    out << std::llround(v) << " B";
  else
    out << std::fixed << std::setprecision(2) << v << " " << units[u];
  return out.str();
}

/// A plan: which layers run inside which segments, and what that is predicted to cost.
struct Plan {
  Kind kind = Kind::custom;  ///< which planner made it
  std::size_t layers = 0;
  std::vector<Segment> segments;  ///< top level, in order, disjoint; other layers run plainly
  double peak_bytes = 0;          ///< predicted peak above what was live before the step
  double recompute = 0;           ///< predicted extra forward cost, in the chain's cost unit
  double recompute_fraction = 0;  ///< recompute / the cost of one forward pass
  int slots = -1;                 ///< for binomial plans: checkpoints alive at once; -1 otherwise
  bool predicted = true;          ///< false for plans made from a layer count, not measured sizes
  /// Per layer, how it runs and what it keeps and replays, from the chain it was planned on
  /// (empty for plans made from a layer count): "layer 2: save_matmuls, keeps 1.00 MiB, replays
  /// 512.00 KiB (31 % of its forward time)".
  std::vector<std::string> layer_notes;

  /// Depth of the deepest segment (0 when there is none).
  int depth() const noexcept { return depth_of(segments); }
  /// Number of segments at all depths.
  std::size_t segment_count() const noexcept { return count(segments); }

  /// One line: planner, segments, depth, predicted peak (in B, KiB or MiB) and recompute, e.g.
  /// "budget: 3 segments over 12 layers, depth 1, predicted peak 1.50 MiB, recompute 25.0 % of a
  /// forward", then one indented line per layer (layer_notes) when the plan was made from measured
  /// sizes.
  std::string describe() const {
    std::string out = summary();
    if (predicted) {
      for (const std::string& note : layer_notes) out += "\n  " + note;
    }
    return out;
  }

  /// The first line of describe().
  std::string summary() const {
    std::ostringstream out;
    out << to_string(kind) << ": " << segment_count() << " segments over " << layers
        << " layers, depth " << depth();
    if (predicted) out << ", predicted peak " << format_bytes(peak_bytes);
    out << ", recompute "
        << remat::detail::cat(std::fixed, std::setprecision(1), recompute_fraction * 100)
        << " % of a forward";
    if (slots >= 0) out << ", " << slots << " slots";
    return out.str();
  }

 private:
  static int depth_of(const std::vector<Segment>& s) noexcept {
    int d = 0;
    for (const Segment& x : s) d = std::max(d, 1 + depth_of(x.children));
    return d;
  }
  static std::size_t count(const std::vector<Segment>& s) noexcept {
    std::size_t c = s.size();
    for (const Segment& x : s) c += count(x.children);
    return c;
  }
};

/// `p` with `policy` on every segment, nested ones included. The plan's peak and recompute
/// were predicted for save_nothing(), so the result is marked not predicted unless the policy is
/// save_nothing(). (Predicted plans with policies: one-layer segments from plan::budget() or
/// plan::custom() over a chain profiled with the policy, Note [policy layers].)
inline Plan with_policy(Plan p, const SavePolicy& policy) {
  struct Set {
    const SavePolicy& policy;
    void operator()(std::vector<Segment>& segments) const {
      for (Segment& s : segments) {
        s.policy = policy;
        (*this)(s.children);
      }
    }
  };
  Set{policy}(p.segments);
  if (policy.keeps_anything()) {
    p.predicted = false;
    p.kind = Kind::custom;
    p.layer_notes.clear();
  }
  return p;
}

}  // namespace remat::plan
