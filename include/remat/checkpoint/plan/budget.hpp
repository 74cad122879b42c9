#pragma once
/// @file
/// plan::budget(): the plan with the least recompute whose predicted peak fits a byte budget.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "remat/checkpoint/plan/optimal.hpp"
#include "remat/checkpoint/plan/simulator.hpp"

namespace remat::plan {
namespace detail {

/// One-level plans (segments with no children, other layers plain) as blocks: the exact Pareto
/// dynamic program behind plan::budget(). A state at cut s is (recompute so far, bytes pinned by
/// the blocks before s, whether those pin x_s); a block's peak is that plus a local term that
/// only depends on the block and on that flag (the closed form of the Simulator for one level,
/// derived in docs/design.md).
///
/// A plain layer may also run under any policy of Chain::policies in a segment of its own
/// (Note [policy layers]): the same closed form over that policy's figures (Chain::under_policy),
/// its replay added to the recompute. The flag of the next cut then depends on the choice; the
/// states stay those of the plain DP, so it remains exact over this larger set of plans.
///
/// Adjacent layers under one policy chain (Note [chained policy layers]), and a policy layer's
/// figures depend on whether its neighbours run under the same policy. A policy layer therefore
/// chooses, with its policy, whether the next layer runs under that policy too, and the state
/// at a cut also says what the layer before it promised (a tag): nothing (0), that the next
/// layer does not run under policy p (1 + 2p), or that it does (2 + 2p). Each choice's figures
/// are then known when it is made, and the program stays exact.
///
/// A layer kept while the layer before it keeps its output's bfloat16 copy runs with other
/// figures (Note [shared copies]): the state at a cut also says whether the block before it
/// ends with such a layer, plain or under a policy (a segment's layers are not kept when the
/// next block runs, nor when it is swept); inside a segment's replay every layer but the first
/// runs after the layer before it was kept.
class OneLevelPlanner {
 public:
  explicit OneLevelPlanner(const Chain& c)
      : c_(c), n_(c.layers()), tags_(1 + 2 * c.policies.size()) {
    for (std::size_t p = 0; p < c.policies.size(); ++p) {
      const int variants = c.policies[p].chained.empty() ? 1 : 4;
      for (int k = 0; k < 4; ++k) variants_.push_back(c.under_policy(p, k < variants ? k : 0));
    }
  }

  /// Local peak of layer s run plainly, x_s pinned before it or not:
  ///   a_s + max([not pinned] b_s + b_{s+1} + tau_s, [not pinned, i_s] b_s + [o_s] b_{s+1} +
  ///   b_{s+1} + beta_s + L)
  /// (o_s: the layer keeps its output, unless that output is x_n and the caller holds it; i_s: it
  /// keeps its input; the second b_{s+1} is the incoming gradient; L = after_loss()).
  double plain_peak(std::size_t s, bool input_pinned) const {
    return plain_peak(c_, s, input_pinned);
  }
  double plain_peak(const Chain& c, std::size_t s, bool input_pinned) const {
    const double out = c.boundary(s + 1);
    // the last layer's saved output is the copy the caller holds (counted in after_loss())
    const double kept_out = c.keeps_output(s) && !(s + 1 == n_ && c.output_held) ? out : 0.0;
    const double in = input_pinned ? 0.0 : c.boundary(s);
    const double in_kept = input_pinned || !c.keeps_input(s) ? 0.0 : c.boundary(s);
    return c.activation(s) +
           std::max(in + out + c.tau(s),
                    in_kept + kept_out + out + c.beta(s, !c.output_held) + after_loss());
  }

  /// What a plain layer s adds to the bytes pinned for the blocks after it.
  double plain_pins(std::size_t s, bool input_pinned) const {
    return plain_pins(c_, s, input_pinned);
  }
  static double plain_pins(const Chain& c, std::size_t s, bool input_pinned) {
    return c.activation(s) + (!input_pinned && c.keeps_input(s) ? c.boundary(s) : 0.0) +
           (c.keeps_output(s) ? c.boundary(s + 1) : 0.0);
  }

  /// What stays alive from the loss to the end of the backward pass: the loss value and its
  /// seed, and x_n when the caller holds it.
  double after_loss() const noexcept {
    return c_.loss_output_bytes + (c_.output_held ? c_.boundary(n_) : 0.0);
  }

  /// Local peaks of every segment [s, e), e = s+1 .. n, in one pass over e, without its input
  /// x_s (the caller adds b_s unless the block before pins it); `shared`: the block before keeps
  /// x_s's copy (Note [shared copies]).
  std::vector<double> segment_peaks(std::size_t s, bool shared) const {
    std::vector<double> peak(n_ + 1, 0);
    double first_pass = 0;  // max over l of [l > s] b_l + b_{l+1} + tau_segment_l
    double replay_without_grad =
        0;                // max over l of K_{l-1} + the replay's peak (x_l, a_l, x_{l+1} included)
    double backward = 0;  // max over l of K_l + [o_l] b_{l+1} + b_{l+1} + beta_l
    double kept = 0;      // K_l: what layers s..l pin, x_s aside (a_j, and x_j if i_j or o_{j-1})
    for (std::size_t l = s; l < n_; ++l) {
      const double in = l > s ? c_.boundary(l) : 0.0;
      const double out = c_.boundary(l + 1);
      const Chain& f = replayed_figures(s, l, shared);
      // Note [four ways a layer runs]: x_l is held during its replay if the segment captured it
      // (l = s) or layer l-1 pinned it as its output
      const bool held = l == s || c_.keeps_output(l - 1);
      first_pass = std::max(first_pass, in + out + c_.tau_segment(l));
      // (x_s is counted by the caller: the peak's share of it comes off)
      replay_without_grad = std::max(replay_without_grad, kept + f.replay_peak(l, true, held) -
                                                              (l == s ? c_.boundary(l) : 0.0));
      kept += f.activation(l) + (l > s && (c_.keeps_input(l) || c_.keeps_output(l - 1)) ? in : 0.0);
      backward = std::max(backward, kept + (c_.keeps_output(l) ? out : 0.0) + out +
                                        f.beta(l, true));  // a replay's copy
      const std::size_t e = l + 1;
      peak[e] = std::max(first_pass,
                         std::max(replay_without_grad + c_.boundary(e), backward) + after_loss());
    }
    return peak;
  }

  /// The figures layer l runs with in the replay of a segment from s (Note [shared copies]):
  /// its first layer after a block that keeps x_s's copy (`shared`), the others after a plain
  /// layer of the same replay.
  const Chain& replayed_figures(std::size_t s, std::size_t l, bool shared) const noexcept {
    return l > s ? c_.figures(l, true) : c_.figures(shared);
  }

  struct Choice {
    double recompute = std::numeric_limits<double>::infinity();
    double peak = std::numeric_limits<double>::infinity();
    std::vector<Segment> segments;
  };

  /// The one-level plan with the least recompute whose peak fits `budget` (ties: lower peak).
  Choice best(double budget) const {
    // frontier[key(s, f, tag, shared)]: the states at cut s whose blocks pin x_s (f = 1) or not
    // (f = 0), after a layer that promised `tag`, and that keeps x_s's copy or not (see the
    // class comment)
    const std::size_t keys = 4 * tags_;
    const auto key = [&](std::size_t at, bool pinned, std::size_t tag, bool shared) {
      return keys * at + 4 * tag + (shared ? 2 : 0) + (pinned ? 1 : 0);
    };
    std::vector<std::vector<State>> frontier(keys * (n_ + 1));
    std::vector<std::size_t> pruned_size(frontier.size(), 0);
    frontier[0].push_back(State{0, 0, 0, 0, 0, false, -1});
    const auto push = [&](std::size_t k, const State& st) {
      frontier[k].push_back(st);
      if (frontier[k].size() > 2 * pruned_size[k] + 256) {  // keep pending states bounded
        prune(frontier[k]);
        pruned_size[k] = frontier[k].size();
      }
    };
    for (std::size_t s = 0; s < n_; ++s) {
      const std::vector<double> plain_seg_peaks = segment_peaks(s, false);
      // without copy figures, `shared` changes nothing (Chain::figures)
      const std::vector<double> shared_seg_peaks =
          c_.with_input_copy ? segment_peaks(s, true) : std::vector<double>{};
      for (std::size_t tag = 0; tag < tags_; ++tag) {
        // tag 2 + 2p: this layer must run under policy p; tag 1 + 2p: it must not
        const int must = tag > 0 && tag % 2 == 0 ? static_cast<int>(tag / 2 - 1) : -1;
        const int must_not = tag % 2 == 1 ? static_cast<int>(tag / 2) : -1;
        for (int fs = 0; fs < 4; ++fs) {
          const bool pinned = (fs & 1) != 0, shared = (fs & 2) != 0;
          const std::vector<double>& seg =
              shared && c_.with_input_copy ? shared_seg_peaks : plain_seg_peaks;
          const std::size_t k = key(s, pinned, tag, shared);
          prune(frontier[k]);
          const std::vector<State>& from = frontier[k];
          if (from.empty()) continue;
          // plain (v = -1), or under policy p chained with the next layer or not (v = 2 p + out)
          for (int v = -1; v < static_cast<int>(2 * c_.policies.size()); ++v) {
            const int p = v < 0 ? -1 : v / 2;
            const bool out = v >= 0 && v % 2 == 1;
            if (must >= 0 ? p != must : (p >= 0 && p == must_not)) continue;
            if (out && (s + 1 == n_ || c_.policies[static_cast<std::size_t>(p)].chained.empty()))
              continue;
            const int variant = (out ? 1 : 0) | (must >= 0 ? 2 : 0);
            const Chain& kind = p < 0 ? c_ : variants_[static_cast<std::size_t>(4 * p + variant)];
            // the state says whether the block before kept x_s's copy, whatever ran there
            const Chain& c = kind.figures(shared);
            const double plain = plain_peak(c, s, pinned), pins = plain_pins(c, s, pinned);
            const double replay = p < 0 ? 0.0 : policy_replay(p, variant, s);
            const std::size_t next =
                p < 0 ? 0 : static_cast<std::size_t>(out ? 2 + 2 * p : 1 + 2 * p);
            for (std::size_t i = 0; i < from.size(); ++i) {
              if (from[i].pre + plain <= budget) {
                push(key(s + 1, c.keeps_output(s), next, kind.keeps_output_copy(s)),
                     State{from[i].cost + replay, from[i].pre + pins,
                           std::max(from[i].peak, from[i].pre + plain), k, i, false, p});
              }
            }
          }
          if (must >= 0) continue;  // a save_nothing segment is not the policy promised
          const double in = pinned ? 0.0 : c_.boundary(s);  // a segment captures its input
          const double least_pre =
              from.back().pre;  // the frontier is sorted by pinned bytes, falling
          double seg_cost = 0, kept = in;
          for (std::size_t e = s + 1; e <= n_; ++e) {
            // A segment's replay keeps at least its input and its layers' activations; that
            // only grows with e, so once it cannot fit, no longer segment can.
            kept += replayed_figures(s, e - 1, shared).activation(e - 1);
            if (least_pre + kept > budget) break;
            seg_cost += c_.cost(e - 1);
            // from is sorted by recompute up, pinned bytes down: the states that fit are a
            // suffix
            for (std::size_t i = from.size(); i-- > 0 && from[i].pre + in + seg[e] <= budget;) {
              push(key(e, false, 0, false),
                   State{from[i].cost + seg_cost, from[i].pre + in,
                         std::max(from[i].peak, from[i].pre + in + seg[e]), k, i, true, -1});
            }
          }
        }
      }
    }
    Choice best;
    const double out = c_.boundary(n_);
    std::size_t pick = 0, pick_k = 0;
    for (std::size_t tag = 0; tag < tags_; ++tag) {
      if (tag > 0 && tag % 2 == 0) continue;  // a promise no layer is left to keep
      for (int fs = 0; fs < 4; ++fs) {
        const bool pinned = (fs & 1) != 0, shared = (fs & 2) != 0;
        const std::size_t k = key(n_, pinned, tag, shared);
        prune(frontier[k]);
        const Chain& loss = c_.figures(shared);
        for (std::size_t i = 0; i < frontier[k].size(); ++i) {
          const State& st = frontier[k][i];
          // the loss runs while it holds x_n (pinned already), then x_n's gradient exists
          const double loss_extra = std::max(
              {out, loss.loss_forward_transient_bytes, loss.loss_backward_transient_bytes});
          const double peak = std::max(st.peak, st.pre + (pinned ? 0.0 : out) + loss.loss_bytes +
                                                    loss.loss_output_bytes + loss_extra);
          if (peak > budget) continue;
          if (st.cost < best.recompute || (st.cost == best.recompute && peak < best.peak)) {
            best.recompute = st.cost;
            best.peak = peak;
            pick = i;
            pick_k = k;
          }
        }
      }
    }
    if (!std::isfinite(best.recompute)) return best;
    for (std::size_t k = pick_k, i = pick; k / keys > 0;) {
      const State& st = frontier[k][i];
      if (st.segment) best.segments.push_back(Segment{st.from / keys, k / keys, {}});
      if (st.variant >= 0)
        best.segments.push_back(Segment{st.from / keys,
                                        k / keys,
                                        {},
                                        c_.policies[static_cast<std::size_t>(st.variant)].policy});
      i = st.index;
      k = st.from;
    }
    std::reverse(best.segments.begin(), best.segments.end());
    return best;
  }

 private:
  struct State {
    double cost;        // recompute so far
    double pre;         // bytes pinned by the blocks before this cut
    double peak;        // highest peak so far
    std::size_t from;   // the previous cut's frontier (its key)
    std::size_t index;  // the previous state, in frontier[from]
    bool segment;       // whether [from, here) is a segment (else one plain layer)
    int variant;        // a plain layer's policy (index into Chain::policies), or -1
  };

  /// Keeps the states no other state beats on both recompute and pinned bytes, sorted by
  /// recompute (pinned bytes then fall). Of states equal on both, the one with the lowest peak.
  static void prune(std::vector<State>& states) {
    std::sort(states.begin(), states.end(), [](const State& a, const State& b) {
      if (a.cost != b.cost) return a.cost < b.cost;
      if (a.pre != b.pre) return a.pre < b.pre;
      return a.peak < b.peak;
    });
    std::vector<State> kept;
    double best_pre = std::numeric_limits<double>::infinity();
    for (const State& st : states) {
      if (st.pre < best_pre) {
        kept.push_back(st);
        best_pre = st.pre;
      }
    }
    states = std::move(kept);
  }

  /// The replay cost of layer s under policy p, chained as `variant` says.
  double policy_replay(int p, int variant, std::size_t s) const {
    return c_.policies[static_cast<std::size_t>(p)].variant(variant).replay_cost[s];
  }

  const Chain& c_;
  std::size_t n_;
  std::size_t tags_;             // 1 + 2 per policy (see the class comment)
  std::vector<Chain> variants_;  // c_ under policy p, chained as k says: variants_[4 p + k]
};

/// budget()'s plan, its nested candidates from `planner` (made for `chain` and its layer
/// count of slots), so that a search calling it for many budgets fills the tables once.
inline Plan budget_plan(const Chain& chain, double budget_bytes, NestedPlanner& planner) {
  if (!(budget_bytes > 0) || !std::isfinite(budget_bytes)) {
    throw PlanError(remat::detail::cat(
        "plan::budget: the budget must be a positive number of bytes, got ", budget_bytes));
  }
  const auto one_level = OneLevelPlanner(chain).best(budget_bytes);
  Plan best;
  if (!one_level.segments.empty() || one_level.recompute == 0) {
    best = custom(chain, one_level.segments, Kind::budget);
  }
  const bool found = std::isfinite(one_level.recompute);
  // Nested plans: more slots, more memory and less recompute; find the most slots that fit. A
  // plan cannot hold more checkpoints than the budget has room for boundaries.
  double smallest = std::numeric_limits<double>::infinity();
  for (std::size_t j = 1; j < chain.layers(); ++j) smallest = std::min(smallest, chain.boundary(j));
  std::size_t lo = 0, hi = chain.layers();
  // compared as doubles first: a huge budget's quotient may not fit a size_t
  if (smallest > 0 && budget_bytes / smallest < static_cast<double>(hi))
    hi = static_cast<std::size_t>(budget_bytes / smallest);
  Plan nested;
  bool nested_found = false;
  while (lo <= hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    Plan p = optimal_plan(chain, planner, mid);
    if (p.peak_bytes <= budget_bytes) {
      nested = std::move(p);
      nested_found = true;
      lo = mid + 1;
    } else {
      if (mid == 0) break;
      hi = mid - 1;
    }
  }
  if (nested_found && (!found || nested.recompute < best.recompute)) {
    nested.kind = Kind::budget;
    return nested;
  }
  if (found) return best;
  throw PlanError(
      remat::detail::cat("plan::budget: no plan fits in ", budget_bytes,
                         " bytes; the smallest feasible budget for this chain is ",
                         optimal_plan(chain, planner, 0).peak_bytes,
                         " bytes (predicted peak of the binomial plan with no checkpoints)"));
}
}  // namespace detail

/// The plan with the least recompute whose predicted peak fits `budget_bytes`: the exact
/// optimum over one-level plans (segments without children, any other layer plain), found by
/// dynamic programming; when a binomial nested plan (optimal()) that fits recomputes less, or
/// no one-level plan fits, the nested plan with the most slots that fits. Throws a PlanError
/// stating the smallest feasible budget when nothing fits.
inline Plan budget(const Chain& chain, double budget_bytes) {
  chain.validate("plan::budget");
  chain.require_predictable("plan::budget");
  detail::NestedPlanner planner(chain, chain.layers());
  return detail::budget_plan(chain, budget_bytes, planner);
}
}  // namespace remat::plan
