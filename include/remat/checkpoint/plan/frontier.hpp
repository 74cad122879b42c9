#pragma once
/// @file
/// plan::frontier(): the trade-off between predicted peak memory and predicted recompute that
/// the planners reach on a chain, as a list of Pareto points.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "remat/checkpoint/plan/budget.hpp"
#include "remat/checkpoint/plan/optimal.hpp"
#include "remat/checkpoint/plan/simulator.hpp"

namespace remat::plan {

/// The plans no other plan found here beats on both predicted peak and predicted recompute,
/// sorted by peak (falling) and so by recompute (rising). The candidates: none(), every(),
/// sqrt(), optimal() with up to kFrontierSlots slots, and the budget() plan at each of their
/// peaks and at kFrontierBudgets budgets spaced evenly between the least of those peaks and
/// none()'s. budget() chooses among the chain's save policies too (Chain::policies), so the
/// points include plans that keep some ops of a layer and replay the others. Each point is a
/// plan a step can run (checkpoint_sequential), not an interpolation.
inline constexpr std::size_t kFrontierSlots = 32;
inline constexpr std::size_t kFrontierBudgets = 32;

inline std::vector<Plan> frontier(const Chain& chain) {
  chain.validate("plan::frontier");
  chain.require_predictable("plan::frontier");
  std::vector<Plan> candidates{none(chain), every(chain), sqrt(chain)};
  // one planner for every slot count asked here, budget()'s searches included
  detail::NestedPlanner planner(chain, chain.layers());
  for (std::size_t k = 0; k < std::min(chain.layers(), kFrontierSlots + 1); ++k)
    candidates.push_back(detail::optimal_plan(chain, planner, k));
  std::vector<double> peaks;
  for (const Plan& p : candidates) peaks.push_back(p.peak_bytes);
  std::sort(peaks.begin(), peaks.end());
  if (!chain.policies.empty() && peaks.size() > 1) {
    // policy layers reach peaks between the layer-level plans'
    const double low = peaks.front(), high = peaks.back();
    for (std::size_t i = 1; i < kFrontierBudgets; ++i)
      peaks.push_back(low + (high - low) * static_cast<double>(i) / kFrontierBudgets);
    std::sort(peaks.begin(), peaks.end());
  }
  peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
  for (double peak : peaks) {
    // a peak only a nested plan reaches may be missed by budget()'s search over slot counts,
    // which assumes more slots never need less memory; that plan is a candidate already
    try {
      candidates.push_back(detail::budget_plan(chain, peak, planner));
    } catch (const PlanError&) {
    }
  }
  // least peak first; keep a plan only if it recomputes less than every plan with less peak
  std::sort(candidates.begin(), candidates.end(), [](const Plan& a, const Plan& b) {
    return a.peak_bytes != b.peak_bytes ? a.peak_bytes < b.peak_bytes : a.recompute < b.recompute;
  });
  std::vector<Plan> out;
  for (Plan& p : candidates) {
    if (out.empty() || p.recompute < out.back().recompute) out.push_back(std::move(p));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace remat::plan
