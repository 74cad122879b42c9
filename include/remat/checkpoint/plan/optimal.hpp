#pragma once
/// @file
/// plan::optimal(): binomial (Revolve-style) nested plans, the fewest recomputed layer forwards
/// for a number of checkpoint slots.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "remat/checkpoint/plan/simulator.hpp"

namespace remat::plan {
namespace detail {

/// Nested plans in Revolve's regime: one layer holds activations at a time, and at most
/// `slots` segment inputs (checkpoints) are captured at once. Costs, for a region [s, e) whose
/// input is captured and with k more checkpoints allowed:
///   T(s, e, k) = min( F(s, e) + T(s, e-1, k),                          last layer direct
///                     min_m F(s, m) + T(m, e, k-1) + T(s, m, k) )       children [s,m), [m,e)
/// with T(s, s+1, k) = f_s and F(s, m) the forward cost of layers [s, m); the replay skips the
/// trailing child (Note [trailing child]), so it costs F(s, m). The root is run by the first
/// pass for free, so its top-level children cost only their own processing:
///   H(s, e, k) = min( T(s, e, k), min_m H(m, e, k-1) + T(s, m, k) ),
/// and the plan is the cheaper of H(0, n, k) and H(0, n-1, k) with the last layer run plainly.
/// Exact over per-layer costs up to kExactLayers layers; beyond, layers are weighted equally
/// and the minimum over m is found by bisection on its discrete slope (the cost is convex in
/// m, which the tests check against a full scan).
class NestedPlanner {
 public:
  static constexpr std::size_t kExactLayers = 96;

  NestedPlanner(const Chain& c, std::size_t slots)
      : n_(c.layers()),
        k_(std::min<std::size_t>(slots, n_)),
        exact_(n_ <= kExactLayers),
        prefix_(n_ + 1, 0) {
    for (std::size_t l = 0; l < n_; ++l) prefix_[l + 1] = prefix_[l] + (exact_ ? c.cost(l) : 1.0);
    const std::size_t ranges = exact_ ? (n_ + 1) * (n_ + 1) : n_ + 1;
    for (Table* table : {&t_, &h_}) {
      table->cost.assign(ranges * (k_ + 1), kUnset);
      table->split.assign(ranges * (k_ + 1), 0);
    }
    if (!exact_) fill_uniform();
  }

  /// The cheaper of the two root shapes with `slots` checkpoints, as segments. One planner
  /// answers every slot count up to the one it was made for: T and H with fewer checkpoints are
  /// entries of the same tables (plan::budget's and plan::frontier's searches over slot counts
  /// fill them once).
  std::vector<Segment> plan(std::size_t slots) {
    const std::size_t k = std::min(slots, n_);
    REMAT_ASSERT(k <= k_, "NestedPlanner::plan: more slots than the planner was made for");
    std::vector<Segment> out;
    if (n_ == 1) return out;
    const std::size_t end = h(0, n_ - 1, k) <= h(0, n_, k) ? n_ - 1 : n_;
    build_h(0, end, k, out);
    return out;
  }

  /// T and H as the recursion defines them (exposed for tests).
  double t(std::size_t s, std::size_t e, std::size_t k) { return get(false, s, e, k).cost; }
  double h(std::size_t s, std::size_t e, std::size_t k) { return get(true, s, e, k).cost; }

  /// The cost at every split of T or H over [s, e) (for the convexity tests).
  std::vector<double> split_costs(bool root, std::size_t s, std::size_t e, std::size_t k) {
    std::vector<double> out;
    for (std::size_t m = s + 1; m < e; ++m) out.push_back(split_cost(root, s, e, k, m));
    return out;
  }

 private:
  static constexpr double kUnset = -1;

  struct Table {
    std::vector<double> cost;
    std::vector<std::size_t> split;  // 0: the other option (T: last layer direct; H: one child)
  };
  struct Best {
    double cost;
    std::size_t split;
  };

  double forward(std::size_t s, std::size_t e) const noexcept { return prefix_[e] - prefix_[s]; }

  std::size_t index(std::size_t s, std::size_t e, std::size_t k) const noexcept {
    return (exact_ ? s * (n_ + 1) + e : e - s) * (k_ + 1) + k;
  }

  Best get(bool root, std::size_t s, std::size_t e, std::size_t k) {
    Table& table = root ? h_ : t_;
    const std::size_t at = index(s, e, k);
    if (table.cost[at] == kUnset) {  // only in exact mode: the uniform tables are full
      const Best b = solve(root, s, e, k);
      table.cost[at] = b.cost;
      table.split[at] = b.split;
    }
    return Best{table.cost[at], table.split[at]};
  }

  double split_cost(bool root, std::size_t s, std::size_t e, std::size_t k, std::size_t m) {
    return root ? get(true, m, e, k - 1).cost + get(false, s, m, k).cost
                : forward(s, m) + get(false, m, e, k - 1).cost + get(false, s, m, k).cost;
  }

  Best solve(bool root, std::size_t s, std::size_t e, std::size_t k) {
    Best best{0, 0};
    if (root) {
      best.cost = get(false, s, e, k).cost;  // one child over the whole range
    } else {
      best.cost =
          forward(s, e) + (e - s > 1 ? get(false, s, e - 1, k).cost : 0.0);  // last layer direct
    }
    // T's split at m = e - 1 costs what the direct last layer costs and spends a checkpoint.
    const std::size_t last = root ? e - 1 : e - 2;
    if (k == 0 || e - s < 2 || last < s + 1) return best;
    const auto cost = [&](std::size_t m) { return split_cost(root, s, e, k, m); };
    std::size_t m = s + 1;
    if (exact_) {
      for (std::size_t i = s + 2; i <= last; ++i) {
        if (cost(i) < cost(m)) m = i;
      }
    } else {  // convex in m: the first point where the slope turns non-negative
      std::size_t lo = s + 1, hi = last;
      while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (cost(mid + 1) - cost(mid) >= 0)
          hi = mid;
        else
          lo = mid + 1;
      }
      m = lo;
    }
    if (cost(m) < best.cost) best = Best{cost(m), m};
    return best;
  }

  /// Equal weights: T and H depend on the length only; fill both tables bottom-up.
  void fill_uniform() {
    for (std::size_t k = 0; k <= k_; ++k) {
      for (std::size_t len = 1; len <= n_; ++len) {
        for (bool root : {false, true}) {
          const Best b = solve(root, 0, len, k);
          Table& table = root ? h_ : t_;
          table.cost[index(0, len, k)] = b.cost;
          table.split[index(0, len, k)] = b.split;
        }
      }
    }
  }

  /// The split of [s, e) as chosen, shifted back to absolute positions in uniform mode.
  std::size_t chosen(bool root, std::size_t s, std::size_t e, std::size_t k) {
    const std::size_t m = exact_ ? get(root, s, e, k).split : get(root, 0, e - s, k).split;
    return m == 0 ? 0 : (exact_ ? m : s + m);
  }

  void build_t(std::size_t s, std::size_t e, std::size_t k, std::vector<Segment>& children) {
    if (e - s == 1) return;
    const std::size_t m = chosen(false, s, e, k);
    if (m == 0) {  // last layer direct; the rest is one child
      Segment a{s, e - 1, {}};
      build_t(s, e - 1, k, a.children);
      children.push_back(std::move(a));
      return;
    }
    Segment a{s, m, {}}, b{m, e, {}};
    build_t(s, m, k, a.children);
    build_t(m, e, k - 1, b.children);
    children.push_back(std::move(a));
    children.push_back(std::move(b));
  }

  void build_h(std::size_t s, std::size_t e, std::size_t k, std::vector<Segment>& top) {
    const std::size_t m = chosen(true, s, e, k);
    Segment first{s, m == 0 ? e : m, {}};
    build_t(first.begin, first.end, k, first.children);
    top.push_back(std::move(first));
    if (m != 0) build_h(m, e, k - 1, top);
  }

  std::size_t n_, k_;
  bool exact_;
  std::vector<double> prefix_;
  Table t_, h_;
};
/// optimal()'s plan with `slots` checkpoints from `planner`, made for `chain` and at least as
/// many slots.
inline Plan optimal_plan(const Chain& chain, NestedPlanner& planner, std::size_t slots) {
  Plan p = custom(chain, planner.plan(slots), Kind::optimal);
  p.slots = static_cast<int>(slots);
  return p;
}
}  // namespace detail

/// Binomial (Revolve-style) nested plan: the fewest recomputed layer forwards such that at most
/// `slots` segment inputs are captured at once and one layer holds activations at a time. With
/// more slots it recomputes less and holds more; with 0 it replays from the chain's input for
/// every layer (the least memory any plan needs, quadratic recompute).
inline Plan optimal(const Chain& chain, std::size_t slots) {
  chain.validate("plan::optimal");
  chain.require_predictable("plan::optimal");
  detail::NestedPlanner planner(chain, slots);
  return detail::optimal_plan(chain, planner, slots);
}
/// optimal() from a layer count alone (layers of equal cost, no memory prediction).
inline Plan optimal(std::size_t n, std::size_t slots) {
  return detail::unmeasured(optimal(Chain::uniform(n), slots));
}

}  // namespace remat::plan
