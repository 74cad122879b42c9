#pragma once
/// @file
/// plan::derive_policies: save policies found from a chain's own layers (Note [derived
/// policies]), by classing their ops and measuring what recomputing each class frees.

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "remat/checkpoint/checkpoint.hpp"
#include "remat/checkpoint/plan.hpp"
#include "remat/checkpoint/probes.hpp"
#include "remat/core/memory.hpp"
#include "remat/core/save_policy.hpp"
#include "remat/core/shape_only.hpp"
#include "remat/core/tape.hpp"

namespace remat::plan {
namespace detail {

/// Note [derived policies]: derive_policies() gives any chain op-level choices without naming
/// ops. It sorts the layers' ops into classes: an op name, split by output shape when ops of one
/// name make outputs of several shapes (a GPT block's Q, K, V projection, its MLP's first
/// projection and its two output projections are then three `linear` classes), and measures
/// each class's forward time in the layers' first pass (summed over the layers, median of
/// `repeats` passes; an op is timed from the previous op's return to its own, which the save
/// policy hears of). Then, greedily from keeping every op, it adds the class with the least
/// forward time per byte that recomputing it frees on top of the classes already chosen (the
/// bytes the layers' first pass keeps, each layer in a segment of its own under the policy:
/// one forward pass per class tried), and offers each prefix as a recompute policy. A class
/// that frees nothing given the chosen ones is not added (its bytes are still held by another
/// op that saved them); the prefix that recomputes every class is a save_nothing segment, which
/// the planners have already. The order decides only which policies are offered: plan::profile
/// measures each like any other, so plans with them are predicted exactly. It rests on
/// measured times, so two runs may offer different policies when two classes are close.

/// A class of the layers' ops (Note [derived policies]).
struct OpClass {
  const OpType* op;
  Shape shape;
  bool by_shape = false;  ///< ops of this name make several shapes: the class is one of them

  bool matches(const OpInfo& info) const {
    return info.op == *op && (!by_shape || info.shape == shape);
  }
  /// "gelu_tanh", or "linear[8x256x1024]" for a class split by shape.
  std::string label() const {
    if (!by_shape) return op->name();
    std::string s = std::string(op->name()) + "[";
    for (int i = 0; i < shape.rank(); ++i) {
      // appended in two steps: GCC 12 at -O3 mistakes `"x" + std::to_string(...)` for an
      // out-of-bounds memcpy (-Warray-bounds, -Wstringop-overflow)
      if (i) s += 'x';
      s += std::to_string(shape[i]);
    }
    return s + "]";
  }
};

/// A policy recomputing the ops of `classes` and keeping every other op's output, named
/// recompute_ops(...) after them (the name save_ops' recompute_ops() gives the same choice when
/// no class is split by shape).
inline SavePolicy recompute_classes(const std::vector<OpClass>& classes) {
  std::string names;
  for (const OpClass& c : classes) names += (names.empty() ? "" : ", ") + c.label();
  return SavePolicy("recompute_ops(" + names + ")", [classes](const OpInfo& info) {
    return std::none_of(classes.begin(), classes.end(),
                        [&](const OpClass& c) { return c.matches(info); });
  });
}

/// The bytes the layers keep after their first pass (the output included), each layer in a
/// segment of its own under `policy`, separated so that no two segments chain.
template <class Layers, class T>
double kept_after_forward(Layers& layers, const Tensor<T>& input, const SavePolicy& policy) {
  Tape tape;
  Var<T> x = tape.input(input);
  const double before = static_cast<double>(memory::live_bytes());
  for (auto&& layer : layers) {
    x = apply<T>(std::make_unique<Separator<T>>(), {x});
    const CheckpointScope scope =
        remat::detail::ScopeAccess::make(remat::detail::VarAccess::tape_state(x), policy);
    x = layer(x);
  }
  return static_cast<double>(memory::live_bytes()) - before;
}

/// The layers' op classes in order of first appearance, and each one's forward time over all
/// layers (median of `repeats` forward passes; FLOPs in a shape-only run).
template <class Layers, class T>
void survey_op_classes(Layers& layers, const Tensor<T>& input, int repeats,
                       std::vector<OpClass>& classes, std::vector<double>& seconds) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<std::pair<const OpType*, Shape>>> ops(static_cast<std::size_t>(repeats));
  std::vector<std::vector<double>> times(static_cast<std::size_t>(repeats));
  for (std::size_t run = 0; run < ops.size(); ++run) {
    Clock::time_point last = Clock::now();
    // keeps every op; called as each op's forward returns (Note [kept nodes])
    const SavePolicy listen("profile_survey", [&](const OpInfo& info) {
      const Clock::time_point now = Clock::now();
      ops[run].emplace_back(&info.op, info.shape);
      // shape-only, the op's FLOPs stand for its time (detail::replay_clock())
      times[run].push_back(is_shape_only() ? info.flops
                                           : std::chrono::duration<double>(now - last).count());
      last = now;
      return true;
    });
    Tape tape;
    Var<T> x = tape.input(input);
    for (auto&& layer : layers) {
      x = apply<T>(std::make_unique<Separator<T>>(), {x});
      const CheckpointScope scope =
          remat::detail::ScopeAccess::make(remat::detail::VarAccess::tape_state(x), listen);
      last = Clock::now();
      x = layer(x);
    }
  }
  classes.clear();
  for (const std::pair<const OpType*, Shape>& op : ops[0]) {
    const bool known = std::any_of(classes.begin(), classes.end(), [&](const OpClass& c) {
      return c.op == op.first && c.shape == op.second;
    });
    if (!known) classes.push_back(OpClass{op.first, op.second, false});
  }
  for (OpClass& c : classes) {
    c.by_shape = std::any_of(classes.begin(), classes.end(), [&](const OpClass& d) {
      return d.op == c.op && !(d.shape == c.shape);
    });
  }
  seconds.assign(classes.size(), 0);
  for (std::size_t i = 0; i < classes.size(); ++i) {
    std::vector<double> per_run;
    for (std::size_t run = 0; run < ops.size(); ++run) {
      double s = 0;
      for (std::size_t k = 0; k < ops[run].size(); ++k) {
        if (classes[i].matches(OpInfo{*ops[run][k].first, ops[run][k].second, 0.0}))
          s += times[run][k];
      }
      per_run.push_back(s);
    }
    std::sort(per_run.begin(), per_run.end());
    seconds[i] = per_run[per_run.size() / 2];
  }
}

}  // namespace detail

/// Up to `count` recompute policies for `layers`, each recomputing one more op class than the
/// one before, the classes taken in order of forward time per byte freed (Note [derived
/// policies]). Runs `repeats` + 1 forward passes, and one more per class tried. Empty when no
/// class frees anything or the layers have a single class.
template <class Layers, class T>
std::vector<DerivedPolicy> derive_policies(Layers&& layers, const Tensor<T>& input,
                                           std::size_t count, int repeats = 3) {
  if (repeats < 1)
    throw PlanError(
        remat::detail::cat("plan::derive_policies: repeats must be >= 1, got ", repeats));
  std::vector<detail::OpClass> classes;
  std::vector<double> seconds;
  detail::survey_op_classes(layers, input, repeats, classes, seconds);
  std::vector<DerivedPolicy> out;
  std::vector<detail::OpClass> chosen;
  std::vector<bool> used(classes.size(), false);
  const double all_kept = detail::kept_after_forward(layers, input, detail::recompute_classes({}));
  double kept = all_kept, total_seconds = 0;
  while (out.size() < count && chosen.size() + 1 < classes.size()) {
    std::size_t best = classes.size();
    double best_ratio = std::numeric_limits<double>::infinity(), best_kept = kept;
    for (std::size_t i = 0; i < classes.size(); ++i) {
      if (used[i]) continue;
      chosen.push_back(classes[i]);
      const double k = detail::kept_after_forward(layers, input, detail::recompute_classes(chosen));
      chosen.pop_back();
      if (!(k < kept)) continue;  // frees nothing given the classes chosen
      const double ratio = seconds[i] / (kept - k);
      if (ratio < best_ratio) {
        best = i;
        best_ratio = ratio;
        best_kept = k;
      }
    }
    if (best == classes.size()) break;
    used[best] = true;
    chosen.push_back(classes[best]);
    kept = best_kept;
    total_seconds += seconds[best];
    DerivedPolicy d;
    d.policy = detail::recompute_classes(chosen);
    for (const detail::OpClass& c : chosen) d.classes.push_back(c.label());
    d.freed_bytes = all_kept - kept;
    d.seconds = total_seconds;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace remat::plan
