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
/// sorted by peak (falling) and so by recompute (rising): none(), then for every peak some
/// planner reaches (every(), sqrt(), optimal() at each slot count), the budget() plan for that
/// peak. Each point is a plan a step can run (checkpoint_sequential), not an interpolation.
inline std::vector<Plan> frontier(const Chain& chain) {
  chain.validate("plan::frontier");
  std::vector<double> peaks{none(chain).peak_bytes, every(chain).peak_bytes, sqrt(chain).peak_bytes};
  for (std::size_t k = 0; k < chain.layers(); ++k) {
    const double p = optimal(chain, k).peak_bytes;
    if (!peaks.empty() && p == peaks.back()) break;  // more slots than the chain uses
    peaks.push_back(p);
  }
  std::sort(peaks.begin(), peaks.end());
  peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
  std::vector<Plan> candidates;
  for (double peak : peaks) candidates.push_back(budget(chain, peak));
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
