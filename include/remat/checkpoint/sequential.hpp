#pragma once
/// @file
/// checkpoint_sequential: runs a sequence of layers under a plan.

#include <iterator>
#include <vector>

#include "remat/checkpoint/checkpoint.hpp"
#include "remat/checkpoint/plan.hpp"

namespace remat {
namespace detail {

/// For each layer, the segments that open before it (outermost first) and how many close after it.
struct SegmentEvents {
  std::vector<std::vector<const plan::Segment*>> opening;
  std::vector<int> closing;

  explicit SegmentEvents(const plan::Plan& p) : opening(p.layers), closing(p.layers, 0) {
    add(p.segments);
  }

  void add(const std::vector<plan::Segment>& segments) {
    for (const plan::Segment& s : segments) {
      opening[s.begin].push_back(&s);
      ++closing[s.end - 1];
      add(s.children);
    }
  }
};

}  // namespace detail

/// Runs x through `layers` (any sequence of callables taking and returning a Var) with the
/// segments of `plan`, on x's tape (or the current one). Without a recording tape the layers just
/// run. Throws a PlanError when the plan was made for a different number of layers.
template <class Layers, class T>
Var<T> checkpoint_sequential(Layers&& layers, const plan::Plan& plan, Var<T> x) {
  const auto n = static_cast<std::size_t>(std::distance(std::begin(layers), std::end(layers)));
  plan::detail::check_plan(plan, n, "checkpoint_sequential");
  const detail::SegmentEvents events(plan);
  std::vector<std::unique_ptr<CheckpointScope>> open;  // innermost last
  std::size_t l = 0;
  for (auto&& layer : layers) {
    for (std::size_t i = 0; i < events.opening[l].size(); ++i) {
      open.push_back(
          detail::ScopeAccess::open(detail::tape_of_arguments(x), events.opening[l][i]->policy));
    }
    x = layer(x);
    for (int i = 0; i < events.closing[l]; ++i) open.pop_back();  // closes the innermost first
    ++l;
  }
  return x;
}

}  // namespace remat
