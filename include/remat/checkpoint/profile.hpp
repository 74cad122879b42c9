#pragma once
/// @file
/// plan::profile: measures a Chain (the input of every planner) by running one forward and one
/// backward pass of a sequence of layers on a tape of its own. The policies it may derive from
/// the layers are found by checkpoint/derive_policies.hpp; the ops it measures with are in
/// checkpoint/probes.hpp.

#include <algorithm>
#include <chrono>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/checkpoint/checkpoint.hpp"
#include "remat/checkpoint/derive_policies.hpp"
#include "remat/checkpoint/plan.hpp"
#include "remat/core/precision.hpp"
#include "remat/checkpoint/probes.hpp"
#include "remat/core/memory.hpp"
#include "remat/core/tape.hpp"

namespace remat::plan {
namespace detail {

/// What a profile pass sets before layer j (j = n: the loss) where layer j-1 keeps its output's
/// bfloat16 copy (Chain::saves_output_copy; Note [shared copies] in plan/simulator.hpp).
enum class InputCopy {
  as_run,       ///< nothing: the layers as they run
  own,          ///< x_j in a buffer of its own: no copy of it exists when layer j runs
  made_before,  ///< an op that saves x_j: its copy exists when layer j runs
};

/// x, its bfloat16 copy made (InputCopy::made_before).
template <class T>
Var<T> with_copy_made(const Var<T>& x) {
  return apply<T>(std::make_unique<CopySaver<T>>(), {x});
}

/// x, or what `how` sets before a layer whose input's copy the layer before keeps (`shared`).
/// `faithful` turns false when x_j's floats would outlive the buffer taking their place, so
/// that the pass would count them twice.
template <class T>
Var<T> before_layer(const Var<T>& x, InputCopy how, bool shared, bool& faithful) {
  if (!shared || how == InputCopy::as_run) return x;
  if (how == InputCopy::made_before) return with_copy_made(x);
  faithful = faithful && x.value().is_unique();
  return apply<T>(std::make_unique<CopyNode<T>>(), {x});
}

/// Whether layer j's input copy is kept by the layer before it (j = n: the loss's input).
inline bool copy_kept_before(const Chain& c, std::size_t j) noexcept {
  return j > 0 && c.keeps_output_copy(j - 1);
}

/// Whether a layer that read `in` and returned `out` keeps its output's bfloat16 copy for the
/// next layer: the copy outlives the layer's return. `faithful` turns false when the output is
/// a view of the input, whose copy may be a layer's before it.
template <class T>
bool output_copy_kept(const Var<T>& in, const Var<T>& out, bool& faithful) {
  if constexpr (std::is_same_v<T, float>) {
    if (!remat::detail::bf16_save_cache().holds(out.value())) return false;
    faithful = faithful && !out.value().shares_storage_with(in.value());
    return true;
  } else {
    return false;
  }
}

/// For a policy's second run (Note [shared copies]): at each layer j whose input's copy the
/// layer before keeps, plain (`plain`) or in the policy's first run (`run`), the other way
/// than that run had it: own where the run's layer j-1 kept the copy, made_before elsewhere.
inline std::vector<InputCopy> flipped(const std::vector<bool>& plain,
                                      const std::vector<bool>& run) {
  std::vector<InputCopy> at(plain.size() + 1, InputCopy::as_run);
  for (std::size_t j = 1; j < at.size(); ++j) {
    const bool kept = !run.empty() && run[j - 1];
    if (kept || (!plain.empty() && plain[j - 1]))
      at[j] = kept ? InputCopy::own : InputCopy::made_before;
  }
  at.back() = InputCopy::as_run;  // the loss runs after plain layers only
  return at;
}

/// Layer l's figures of `from` into `to`.
inline void copy_layer(const PolicyCosts& from, std::size_t l, PolicyCosts& to) {
  to.activation_bytes[l] = from.activation_bytes[l];
  to.forward_transient_bytes[l] = from.forward_transient_bytes[l];
  to.backward_transient_bytes[l] = from.backward_transient_bytes[l];
  to.saves_input[l] = from.saves_input[l];
  to.saves_output[l] = from.saves_output[l];
  to.replay_cost[l] = from.replay_cost[l];
  if (!from.saves_output_copy.empty()) {
    to.saves_output_copy.resize(from.saves_output_copy.size(), false);
    to.saves_output_copy[l] = from.saves_output_copy[l];
  }
  if (l + 1 == from.activation_bytes.size())
    to.last_unheld_backward_transient_bytes = from.last_unheld_backward_transient_bytes;
}

/// Layer l's figures from a run as it ran (`as_run`) and from one with `at` flipped: into `own`
/// (no copy of x_l made before it) and `with_copy` (one made), by which way each run had it.
inline void split_layer(const PolicyCosts& as_run, const PolicyCosts& flip,
                        const std::vector<InputCopy>& at, std::size_t l, PolicyCosts& own,
                        PolicyCosts& with_copy) {
  copy_layer(at[l] == InputCopy::own ? flip : as_run, l, own);
  copy_layer(at[l] == InputCopy::made_before ? flip : as_run, l, with_copy);
  // whether the layer keeps its own output's copy is the run's, not its input's
  if (!as_run.saves_output_copy.empty()) with_copy.saves_output_copy[l] = own.saves_output_copy[l];
}

/// How profile_replays() wraps each layer (Note [four ways a layer runs]).
enum class ReplayShape {
  own_segment,  ///< [start, layer, end] as one segment: first pass inside a segment, then a replay
                ///< keeping a_l
  own_segment_copied,  ///< [start, copy, layer, end]: a replay keeping a_l, x_l a copy freed after
                       ///< its last use
  inner_segment,  ///< [start, [layer], end]: the outer replay runs the layer keeping nothing, x_l
                  ///< held
  copied_input,   ///< [start, [copy, [layer]], end]: as above, x_l a copy freed after its last use
};

/// Runs `layers` once forward and backward with every layer wrapped as `shape` says, with
/// forward markers around it; starts[l] and ends[l] receive the markers' readings.
/// With `copies` (a Chain's saves_output_copy), a layer whose input copy the layer before keeps
/// runs with that copy made before it (InputCopy::made_before), in the first two shapes; in
/// own_segment_copied the readings then start after the copy of x_l and its bfloat16 copy were
/// made, so that they exclude both.
template <class Layers, class T, class Loss>
void profile_replays(Layers& layers, const Tensor<T>& input, Loss& loss, ReplayShape shape,
                     const Chain* copies, std::vector<std::vector<double>>& starts,
                     std::vector<std::vector<double>>& ends) {
  Tape tape;
  Var<T> x = tape.input(input);
  std::size_t l = 0;
  for (auto&& layer : layers) {
    const bool made = copies && copy_kept_before(*copies, l);
    if (made && shape != ReplayShape::own_segment_copied) x = with_copy_made(x);
    CheckpointScope outer(x);
    Var<T> in = x;
    if (made && shape == ReplayShape::own_segment_copied)
      in = with_copy_made(apply<T>(std::make_unique<CopyNode<T>>(), {x}));
    const Var<T> a = apply<T>(std::make_unique<ForwardMarker<T>>(&starts[l], true), {in});
    Var<T> y;
    if (shape == ReplayShape::own_segment) {
      y = layer(a);
    } else if (shape == ReplayShape::own_segment_copied) {
      y = layer(made ? a : apply<T>(std::make_unique<CopyNode<T>>(), {a}));
    } else if (shape == ReplayShape::inner_segment) {
      CheckpointScope inner(a);
      y = layer(a);
    } else {
      CheckpointScope middle(a);
      const Var<T> copy = apply<T>(std::make_unique<CopyNode<T>>(), {a});
      CheckpointScope inner(copy);
      y = layer(copy);
    }
    x = apply<T>(std::make_unique<ForwardMarker<T>>(&ends[l], false), {y});
    ++l;
  }
  const Var<T> value = loss(x);
  tape.backward(value, Tensor<T>::ones(value.shape()));
}

/// Whether each layer keeps its input: fed a copy that nothing else holds, does the copy
/// outlive the layer's return? (one forward pass; run(layer, x) calls the layer, in a segment or
/// not). last_input, when given, receives x_{n-1}.
template <class Layers, class T, class Run>
std::vector<bool> input_kept(Layers& layers, const Tensor<T>& input,
                             const std::vector<double>& boundary, Run&& run,
                             Tensor<T>* last_input = nullptr) {
  const std::size_t n = boundary.size() - 1;
  std::vector<bool> keeps(n, true);
  Tape tape;
  Var<T> x = tape.input(input);
  std::size_t l = 0;
  for (auto&& layer : layers) {
    Var<T> y;
    double with_copy = 0;
    {
      const Var<T> copy = apply<T>(std::make_unique<CopyNode<T>>(), {x});
      y = run(layer, copy);
      with_copy = static_cast<double>(memory::live_bytes());
    }
    keeps[l] = with_copy - static_cast<double>(memory::live_bytes()) < boundary[l];
    if (last_input && l + 1 == n) *last_input = x.value().clone();
    x = y;
    ++l;
  }
  return keeps;
}

/// The costs of every layer of `layers` run under `policy` in a segment of its own (Note [policy
/// layers] in plan/simulator.hpp), measured as profile() measures plain layers: `repeats` steps
/// (the last one measures memory; the replay time is the median), one forward pass (whether each
/// layer keeps its input), and the last layer's backward once more when it keeps its output.
/// `boundary` holds the chain's boundary sizes; at[l] says what stands before layer l (Note
/// [shared copies]; after its marker, so that a copy made there dies in layer l's backward
/// window), and `faithful` turns false when that cannot be measured.
template <class Layers, class T, class Loss>
PolicyCosts profile_policy(Layers& layers, const Tensor<T>& input, Loss& loss,
                           const SavePolicy& policy, int repeats,
                           const std::vector<double>& boundary, const std::vector<InputCopy>& at,
                           bool& faithful) {
  const std::size_t n = boundary.size() - 1;
  PolicyCosts q;
  q.policy = policy;
  q.activation_bytes.assign(n, 0);
  q.forward_transient_bytes.assign(n, 0);
  q.backward_transient_bytes.assign(n, 0);
  q.saves_output.assign(n, true);
  q.saves_input.assign(n, true);
  q.saves_output_copy.assign(n, false);
  std::vector<std::vector<double>> times(n);
  std::vector<double> live(n + 1, 0), peak(n + 1, 0), clock(n + 1, 0);
  const auto segment = [&](const Var<T>& on) {
    return remat::detail::ScopeAccess::make(remat::detail::VarAccess::tape_state(on), policy);
  };
  for (int run = 0; run < repeats; ++run) {
    Tape tape;
    Var<T> x = tape.input(input);
    std::size_t l = 0;
    for (auto&& layer : layers) {
      x = apply<T>(std::make_unique<MemoryMarker<T>>(&live[l], &peak[l], &tape, &clock[l]), {x});
      x = before_layer(x, at[l], true, faithful);
      const Var<T> held = x;  // keeps x_l alive while layer l is measured
      const double before = static_cast<double>(memory::live_bytes());
      memory::reset_peak();
      {
        const CheckpointScope scope = segment(x);
        x = layer(x);
      }
      const double after = static_cast<double>(memory::live_bytes());
      q.activation_bytes[l] =
          std::max(0.0, after - before - static_cast<double>(x.value().bytes()));
      q.forward_transient_bytes[l] =
          std::max(0.0, static_cast<double>(memory::peak_bytes()) - after);
      q.saves_output[l] = !x.value().is_unique();
      q.saves_output_copy[l] = output_copy_kept(held, x, faithful);
      ++l;
    }
    x = apply<T>(std::make_unique<MemoryMarker<T>>(&live[n], &peak[n], &tape, &clock[n]), {x});
    const Var<T> value = loss(x);
    tape.backward(value, Tensor<T>::ones(value.shape()));
    // the marker on the input never runs (no gradient): layer 0's readings are the last ones
    peak[0] = static_cast<double>(memory::peak_bytes());
    clock[0] = detail::replay_clock(tape);
    for (std::size_t i = 0; i < n; ++i) {
      q.backward_transient_bytes[i] = std::max(0.0, peak[i] - live[i + 1]);
      times[i].push_back(clock[i] - clock[i + 1]);
    }
  }
  q.replay_cost.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::sort(times[i].begin(), times[i].end());
    q.replay_cost[i] = times[i][times[i].size() / 2];
  }
  Tensor<T> last_input;
  q.saves_input = input_kept(
      layers, input, boundary,
      [&](auto& layer, const Var<T>& in) {
        const CheckpointScope scope = segment(in);
        return layer(in);
      },
      &last_input);
  if (q.saves_output[n - 1]) {
    // the last layer's backward when nothing else holds the output it keeps (as in profile())
    Tape last_tape;
    const Var<T> in = last_tape.input(last_input, n > 1);
    double marker_live = 0, marker_peak = 0;
    Var<T> value;
    {
      auto last = std::begin(layers);
      std::advance(last, static_cast<std::ptrdiff_t>(n - 1));
      Var<T> out;
      {
        // fed a fresh input, the layer makes its own copy: a copy made before stands for the
        // one the layer before it kept in this run (or for the one at[n - 1] makes)
        const bool made = at[n - 1] == InputCopy::made_before ||
                          (at[n - 1] == InputCopy::as_run && n > 1 && q.saves_output_copy[n - 2]);
        const Var<T> x = made ? with_copy_made(in) : in;
        const CheckpointScope scope = segment(x);
        out = (*last)(x);
      }
      value = loss(apply<T>(std::make_unique<MemoryMarker<T>>(&marker_live, &marker_peak), {out}));
    }
    last_tape.backward(value, Tensor<T>::ones(value.shape()));
    q.last_unheld_backward_transient_bytes =
        std::max(0.0, static_cast<double>(memory::peak_bytes()) - marker_live);
  }
  return q;
}

/// The time the backward pass spends replaying each layer run in a save_nothing segment of its
/// own: the tape's replay clock read between layers as the sweep passes them (as
/// profile_policy() reads a policy layer's replay), median of `repeats` steps.
template <class Layers, class T, class Loss>
std::vector<double> replay_times(Layers& layers, const Tensor<T>& input, Loss& loss, int repeats,
                                 std::size_t n) {
  std::vector<std::vector<double>> times(n);
  std::vector<double> live(n + 1, 0), peak(n + 1, 0), clock(n + 1, 0);
  for (int run = 0; run < repeats; ++run) {
    Tape tape;
    Var<T> x = tape.input(input);
    std::size_t l = 0;
    for (auto&& layer : layers) {
      x = apply<T>(std::make_unique<MemoryMarker<T>>(&live[l], &peak[l], &tape, &clock[l]), {x});
      const CheckpointScope scope(x);
      x = layer(x);
      ++l;
    }
    x = apply<T>(std::make_unique<MemoryMarker<T>>(&live[n], &peak[n], &tape, &clock[n]), {x});
    const Var<T> value = loss(x);
    tape.backward(value, Tensor<T>::ones(value.shape()));
    clock[0] = detail::replay_clock(tape);  // the marker on the input never runs
    for (std::size_t i = 0; i < n; ++i) times[i].push_back(clock[i] - clock[i + 1]);
  }
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::sort(times[i].begin(), times[i].end());
    out[i] = times[i][times[i].size() / 2];
  }
  return out;
}

/// Measures chained variants of `policy` (Note [chained policy layers] in plan/simulator.hpp)
/// into q.chained: every layer under the policy in a segment of its own, layer l chained with
/// layer l-1 when linked[l], separated by an identity op otherwise. Layer l's figures go to
/// variant k = [linked[l+1]] + 2 [linked[l]] when k > 0. The same readings as
/// profile_policy(): `repeats` steps (the last measures memory, the replay time is the median),
/// read when the backward sweep passes each layer's first op (Tape's on_swept); one forward
/// pass for whether each layer keeps its input; the last layer's backward once more when it is
/// chained and keeps its output. Returns false, having measured nothing, when no segment took
/// over a tail in the first step: the layers then run as if not chained. Where layer l is not
/// chained with the layer before, at[l] may set a copy op in place of the separator (Note
/// [shared copies]; before the layer's first op, so that a copy made there dies in its backward
/// window); kept_copy receives whether each layer kept its output's copy in this run.
template <class Layers, class T, class Loss>
bool profile_chained(Layers& layers, const Tensor<T>& input, Loss& loss, const SavePolicy& policy,
                     int repeats, const std::vector<double>& boundary,
                     const std::vector<bool>& linked, const std::vector<InputCopy>& at,
                     bool& faithful, std::vector<bool>& kept_copy, PolicyCosts& q) {
  kept_copy.assign(boundary.size() - 1, false);
  const std::size_t n = boundary.size() - 1;
  const auto variant = [&](std::size_t l) {
    return (l + 1 < n && linked[l + 1] ? 1 : 0) | (linked[l] ? 2 : 0);
  };
  const auto figures = [&](std::size_t l) -> PolicyCosts& {
    return q.chained[static_cast<std::size_t>(variant(l) - 1)];
  };
  const auto segment = [&](const Var<T>& on) {
    return remat::detail::ScopeAccess::make(remat::detail::VarAccess::tape_state(on), policy);
  };
  std::vector<std::vector<double>> times(n);
  std::vector<double> live(n + 1, 0), peak(n + 1, 0), clock(n + 1, 0);
  std::vector<std::uint32_t> first(n + 1, 0);
  for (int run = 0; run < repeats; ++run) {
    Tape tape;
    Var<T> x = tape.input(input);
    std::size_t l = 0;
    for (auto&& layer : layers) {
      const bool made = !linked[l] && at[l] == InputCopy::made_before;
      if (made) first[l] = static_cast<std::uint32_t>(tape.size());
      if (!linked[l]) {
        x = at[l] == InputCopy::as_run ? apply<T>(std::make_unique<Separator<T>>(), {x})
                                       : before_layer(x, at[l], true, faithful);
      }
      if (!made) first[l] = static_cast<std::uint32_t>(tape.size());
      const Var<T> held = x;  // keeps x_l alive while layer l is measured
      const double before = static_cast<double>(memory::live_bytes());
      memory::reset_peak();
      {
        const CheckpointScope scope = segment(x);
        x = layer(x);
      }
      const double after = static_cast<double>(memory::live_bytes());
      kept_copy[l] = output_copy_kept(held, x, faithful);
      if (variant(l) != 0) {
        PolicyCosts& f = figures(l);
        f.activation_bytes[l] =
            std::max(0.0, after - before - static_cast<double>(x.value().bytes()));
        f.forward_transient_bytes[l] =
            std::max(0.0, static_cast<double>(memory::peak_bytes()) - after);
        f.saves_output[l] = !x.value().is_unique();
        f.saves_output_copy[l] = kept_copy[l];
      }
      ++l;
    }
    remat::detail::TapeState& state = remat::detail::TapeAccess::state(tape);
    if (run == 0 && state.chained_tails() == 0) return false;
    x = apply<T>(std::make_unique<Separator<T>>(), {x});
    first[n] = state.size() - 1;
    std::size_t next = n;  // the boundary the sweep reaches next
    state.on_swept = [&](const remat::detail::NodeBase& node) {
      while (next != static_cast<std::size_t>(-1) && node.id == first[next]) {
        peak[next] = static_cast<double>(memory::peak_bytes());
        live[next] = static_cast<double>(memory::live_bytes());
        clock[next] = detail::replay_clock(tape);
        memory::reset_peak();
        --next;
      }
    };
    const Var<T> value = loss(x);
    tape.backward(value, Tensor<T>::ones(value.shape()));
    state.on_swept = nullptr;
    for (std::size_t i = 0; i < n; ++i) {
      if (variant(i) == 0) continue;
      figures(i).backward_transient_bytes[i] = std::max(0.0, peak[i] - live[i + 1]);
      times[i].push_back(clock[i] - clock[i + 1]);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (variant(i) == 0) continue;
    std::sort(times[i].begin(), times[i].end());
    figures(i).replay_cost[i] = times[i][times[i].size() / 2];
  }
  {
    // whether each layer keeps its input: a layer not chained with the one before is fed a copy
    // nothing else holds (as in profile_policy()); a chained one's input is the tail its segment
    // replays, so it keeps it if anything besides the caller holds it after the layer ran
    Tape tape;
    Var<T> x = tape.input(input);
    std::size_t l = 0;
    for (auto&& layer : layers) {
      Var<T> y;
      bool keeps = false;
      if (!linked[l]) {
        double with_copy = 0;
        {
          const Var<T> copy = apply<T>(std::make_unique<CopyNode<T>>(), {x});
          const CheckpointScope scope = segment(copy);
          y = layer(copy);
          with_copy = static_cast<double>(memory::live_bytes());
        }
        keeps = with_copy - static_cast<double>(memory::live_bytes()) < boundary[l];
      } else {
        {
          const CheckpointScope scope = segment(x);
          y = layer(x);
        }
        keeps = !x.value().is_unique();
      }
      if (variant(l) != 0) figures(l).saves_input[l] = keeps;
      x = y;
      ++l;
    }
  }
  if (n > 1 && linked[n - 1] && figures(n - 1).saves_output[n - 1]) {
    // the last layer's backward when nothing else holds the output it keeps, chained with the
    // layer before it: both run from x_{n-2}, read when the sweep passes the last layer's start
    Tensor<T> in_value;
    {
      NoGradGuard no_grad;
      Var<T> x(input);
      std::size_t l = 0;
      for (auto&& layer : layers) {
        if (l + 2 == n) break;
        x = layer(x);
        ++l;
      }
      in_value = x.value().clone();
    }
    Tape last_tape;
    const Var<T> in = last_tape.input(in_value, n > 2);
    double marker_live = 0, marker_peak = 0, last_peak = 0;
    std::uint32_t last_first = 0;
    Var<T> value;
    {
      auto it = std::begin(layers);
      std::advance(it, static_cast<std::ptrdiff_t>(n - 2));
      Var<T> out = in;
      for (int k = 0; k < 2; ++k, ++it) {
        if (k == 1) last_first = static_cast<std::uint32_t>(last_tape.size());
        const CheckpointScope scope = segment(out);
        out = (*it)(out);
      }
      value = loss(apply<T>(std::make_unique<MemoryMarker<T>>(&marker_live, &marker_peak), {out}));
    }
    remat::detail::TapeState& state = remat::detail::TapeAccess::state(last_tape);
    state.on_swept = [&](const remat::detail::NodeBase& node) {
      if (node.id == last_first) last_peak = static_cast<double>(memory::peak_bytes());
    };
    last_tape.backward(value, Tensor<T>::ones(value.shape()));
    state.on_swept = nullptr;
    figures(n - 1).last_unheld_backward_transient_bytes = std::max(0.0, last_peak - marker_live);
  }
  return true;
}

/// profile_policy()'s figures for chained layers (PolicyCosts::chained): three passes of
/// profile_chained(), with every layer chained, pairs from layer 0 and pairs from layer 1. When
/// no segment takes over a tail with every layer chained, none does in the pairs either (the
/// tape decides from the previous segment's own ops), and the layers run chained exactly as
/// they run alone: the chained figures are the plain ones, measured once. With `with_copy`
/// (the policy's figures with a layer's input copy made before it, Note [shared copies]), each
/// pass runs once more with the copy ops flipped (flipped()) where a layer is not chained with
/// the layer before it; a chained layer's copy is always as the pass had it.
template <class Layers, class T, class Loss>
void profile_policy_chains(Layers& layers, const Tensor<T>& input, Loss& loss, int repeats,
                           const std::vector<double>& boundary,
                           const std::vector<bool>& plain_copies, bool& faithful, PolicyCosts& q,
                           PolicyCosts* with_copy) {
  const std::size_t n = boundary.size() - 1;
  const auto unchained = [](PolicyCosts p) {
    p.chained.clear();
    return p;
  };
  const PolicyCosts plain = unchained(q);
  const PolicyCosts plain_with_copy = with_copy ? unchained(*with_copy) : PolicyCosts{};
  const auto as_plain = [&] {
    q.chained.assign(3, plain);
    if (with_copy) with_copy->chained.assign(3, plain_with_copy);
  };
  as_plain();
  if (n < 2) return;  // no neighbours to chain with
  std::vector<bool> all(n, true), even(n, false), odd(n, false);
  all[0] = false;
  for (std::size_t l = 1; l < n; ++l) {
    even[l] = l % 2 == 1;
    odd[l] = l % 2 == 0;
  }
  for (PolicyCosts& c : q.chained) c.last_unheld_backward_transient_bytes.reset();
  if (with_copy) {
    for (PolicyCosts& c : with_copy->chained) c.last_unheld_backward_transient_bytes.reset();
  }
  const std::vector<InputCopy> as_run(n + 1, InputCopy::as_run);
  for (const std::vector<bool>* linked : {&all, &even, &odd}) {
    PolicyCosts run = q, flip = q;  // this pass's figures, over what is measured so far
    std::vector<bool> kept;
    if (!profile_chained(layers, input, loss, q.policy, repeats, boundary, *linked, as_run,
                         faithful, kept, run)) {
      if (linked == &all) return as_plain();
      continue;  // (measured nothing)
    }
    std::vector<InputCopy> at = as_run;
    if (with_copy) {
      at = flipped(plain_copies, kept);
      for (std::size_t l = 0; l < n; ++l) {
        if ((*linked)[l]) at[l] = InputCopy::as_run;
      }
      std::vector<bool> flipped_kept;
      faithful = profile_chained(layers, input, loss, q.policy, repeats, boundary, *linked, at,
                                 faithful, flipped_kept, flip) &&
                 faithful;
    }
    for (std::size_t l = 0; l < n; ++l) {
      const int k = (l + 1 < n && (*linked)[l + 1] ? 1 : 0) | ((*linked)[l] ? 2 : 0);
      if (k == 0) continue;
      const auto v = static_cast<std::size_t>(k - 1);
      if (with_copy)
        split_layer(run.chained[v], flip.chained[v], at, l, q.chained[v], with_copy->chained[v]);
      else
        copy_layer(run.chained[v], l, q.chained[v]);
    }
  }
}

/// Measures `policy` on the layers (profile_policy(), profile_policy_chains()) into c.policies,
/// and into c_with_copy's policies when layers keep their output's copy (Note [shared copies]):
/// once as the layers run, once with the copy ops flipped (flipped()), each layer's figures
/// split by which way each run had them. A copy that cannot be measured marks c unpriced.
template <class Layers, class T, class Loss>
void measure_policy(Layers& layers, const Tensor<T>& input, Loss& loss, const SavePolicy& policy,
                    int repeats, Chain& c, Chain* c_with_copy) {
  const std::size_t n = c.layers();
  bool faithful = true;
  PolicyCosts q = profile_policy(layers, input, loss, policy, repeats, c.boundary_bytes,
                                 std::vector<InputCopy>(n + 1, InputCopy::as_run), faithful);
  std::optional<PolicyCosts> with_copy;
  if (c_with_copy) {
    const std::vector<InputCopy> at = flipped(c.saves_output_copy, q.saves_output_copy);
    const PolicyCosts flip =
        profile_policy(layers, input, loss, policy, repeats, c.boundary_bytes, at, faithful);
    PolicyCosts own = q;
    with_copy = q;
    for (std::size_t l = 0; l < n; ++l) split_layer(q, flip, at, l, own, *with_copy);
    q = std::move(own);
  }
  profile_policy_chains(layers, input, loss, repeats, c.boundary_bytes, c.saves_output_copy,
                        faithful, q, with_copy ? &*with_copy : nullptr);
  bool copies = Chain::any_true(q.saves_output_copy);
  for (const PolicyCosts& k : q.chained) copies = copies || Chain::any_true(k.saves_output_copy);
  if (copies && !with_copy) faithful = false;  // a copy the plain layers do not keep
  if (!faithful) c.unpriced_copies = true;
  // the flags are read from c's figures (Chain::figures())
  const auto drop_flags = [](PolicyCosts& p) {
    p.saves_output_copy.clear();
    for (PolicyCosts& k : p.chained) k.saves_output_copy.clear();
  };
  if (!with_copy) drop_flags(q);
  c.policies.push_back(std::move(q));
  if (with_copy) {
    drop_flags(*with_copy);
    c_with_copy->policies.push_back(std::move(*with_copy));
  }
}

}  // namespace detail

struct ProfileOptions {
  /// Forward passes timed; each layer's cost is the median (memory is measured once).
  int repeats = 3;
  /// Also measure how each layer runs inside segments and in replays (four more steps; Note
  /// [four ways a layer runs] in plan/simulator.hpp). Off: predictions of plans with segments
  /// become upper bounds (the plain first pass's figures), not exact.
  bool replays = true;
  /// Save policies to measure every layer under, each in a segment of its own (Chain::policies,
  /// Note [policy layers] in plan/simulator.hpp): the choices plan::budget() and plan::frontier()
  /// then have per layer besides plain layers and save_nothing segments. Policies that keep
  /// nothing are skipped. Each costs `repeats` + 2 more steps.
  std::vector<SavePolicy> policies = {save_matmuls()};
  /// Price each layer (Chain::forward_cost) at its measured replay, as the backward pass runs it
  /// in a save_nothing segment (the tape's replay clock, median of `repeats` steps), the way a
  /// policy layer's replay is priced (PolicyCosts::replay_cost), so that the planners compare
  /// replayed blocks and policy layers on one clock. Off: the first pass's forward time. Costs
  /// `repeats` more steps.
  bool price_replays = true;
  /// Also offer up to this many policies derived from the layers themselves
  /// (derive_policies(), Note [derived policies]): recompute policies over the layers' cheapest
  /// op classes per byte freed, measured like `policies`. 0: none. Costs `repeats` + 1 forward
  /// passes and one per class tried, then what each policy costs.
  std::size_t derived_policies = 0;
};

namespace detail {

/// One step of the chain without segments (Note [memory model]), `how` saying what stands before
/// a layer whose input's copy the layer before keeps (c.saves_output_copy, from as_run steps):
/// layer l's first-pass time goes to times[l] when given; with measure_memory, the sizes go to c
/// (boundaries, a_l, tau_l, beta_l, which layers keep their output, the loss's figures, and in
/// an as_run step the output copies) and x_{n-1} to last_input. Returns whether the step was
/// faithful (before_layer()).
template <class Layers, class T, class Loss>
bool plain_step(Layers& layers, const Tensor<T>& input, Loss& loss, InputCopy how,
                bool measure_memory, Chain& c, std::vector<std::vector<double>>* times,
                Tensor<T>& last_input) {
  const std::size_t n = c.layers();
  std::vector<double> live(n + 1, 0), peak(n + 1, 0);
  bool faithful = true;
  Tape tape;
  Var<T> x = tape.input(input);
  std::size_t l = 0;
  for (auto&& layer : layers) {
    x = before_layer(x, how, copy_kept_before(c, l), faithful);
    if (measure_memory) x = apply<T>(std::make_unique<MemoryMarker<T>>(&live[l], &peak[l]), {x});
    const Var<T> held = x;  // keeps x_l alive while layer l is measured
    const double before = static_cast<double>(memory::live_bytes());
    memory::reset_peak();
    const double t0 = first_pass_clock(tape);
    x = layer(x);
    if (times) (*times)[l].push_back(first_pass_clock(tape) - t0);
    if (measure_memory) {
      const double after = static_cast<double>(memory::live_bytes());
      c.boundary_bytes[l] = static_cast<double>(held.value().bytes());
      c.activation_bytes[l] =
          std::max(0.0, after - before - static_cast<double>(x.value().bytes()));
      c.forward_transient_bytes[l] =
          std::max(0.0, static_cast<double>(memory::peak_bytes()) - after);
      c.saves_output[l] = !x.value().is_unique();  // someone besides x holds it: the layer saved it
      // a copy the next layer (or the loss) would share
      if (how == InputCopy::as_run) c.saves_output_copy[l] = output_copy_kept(held, x, faithful);
      if (l + 1 == n) last_input = held.value().clone();  // (a constant offset from here on)
    }
    ++l;
  }
  if (!measure_memory) return faithful;
  c.boundary_bytes[n] = static_cast<double>(x.value().bytes());
  x = before_layer(x, how, copy_kept_before(c, n), faithful);
  x = apply<T>(std::make_unique<MemoryMarker<T>>(&live[n], &peak[n]), {x});
  const double before_loss = static_cast<double>(memory::live_bytes());
  memory::reset_peak();
  const Var<T> value = loss(x);
  const double after_loss = static_cast<double>(memory::live_bytes());
  // what the loss keeps; then its value and the gradient of ones backward() seeds it with
  c.loss_output_bytes = 2.0 * static_cast<double>(value.value().bytes());
  c.loss_bytes = after_loss - before_loss - c.loss_output_bytes / 2;
  c.loss_forward_transient_bytes =
      std::max(0.0, static_cast<double>(memory::peak_bytes()) - after_loss);
  const Tensor<T> seed = Tensor<T>::ones(value.shape());
  const double before_backward = static_cast<double>(memory::live_bytes());
  memory::reset_peak();
  tape.backward(value, seed);
  c.loss_backward_transient_bytes = std::max(0.0, peak[n] - before_backward);
  // The marker before layer 0 sits on the input, which needs no gradient, so it never runs:
  // layer 0's backward peak is the peak since the marker before layer 1.
  peak[0] = static_cast<double>(memory::peak_bytes());
  for (std::size_t i = 0; i < n; ++i)
    c.backward_transient_bytes[i] = std::max(0.0, peak[i] - live[i + 1]);
  return faithful;
}

/// The last layer's backward when nothing else holds the output it keeps: as a replay's copy
/// is, or x_n when the caller lets it go (Chain::last_unheld_backward_transient_bytes). Its
/// input is last_input, with its copy made before it when `copy_made` (Note [shared copies]).
template <class Layers, class T, class Loss>
double last_unheld_backward(Layers& layers, const Tensor<T>& last_input, Loss& loss, std::size_t n,
                            bool copy_made) {
  Tape tape;
  const Var<T> in = tape.input(last_input, n > 1);  // x_0 needs no gradient, later inputs do
  double marker_live = 0, marker_peak = 0;
  Var<T> value;
  {
    auto last = std::begin(layers);
    std::advance(last, static_cast<std::ptrdiff_t>(n - 1));
    value = loss(apply<T>(std::make_unique<MemoryMarker<T>>(&marker_live, &marker_peak),
                          {(*last)(copy_made ? with_copy_made(in) : in)}));
  }
  tape.backward(value, Tensor<T>::ones(value.shape()));
  return std::max(0.0, static_cast<double>(memory::peak_bytes()) - marker_live);
}

/// Note [four ways a layer runs]: c's replay figures, from the readings relative to the live
/// bytes (x_l included) just before each layer; with `copies` (Note [shared copies]), those of a
/// layer whose input's copy the layer before keeps, with that copy made before it, and only the
/// two ways that keep a_l.
template <class Layers, class T, class Loss>
void replay_figures(Layers& layers, const Tensor<T>& input, Loss& loss, const Chain* copies,
                    Chain& c) {
  const std::size_t n = c.layers();
  std::vector<std::vector<double>> starts(n), ends(n);
  const auto measure = [&](ReplayShape shape) {
    for (auto& r : starts) r.clear();
    for (auto& r : ends) r.clear();
    profile_replays(layers, input, loss, shape, copies, starts, ends);
  };
  const auto reading = [&](std::size_t i, bool last) {
    REMAT_ASSERT(!starts[i].empty() && !ends[i].empty(),
                 "plan::profile's replay markers did not run for layer ", i);
    return last ? ends[i].back() - starts[i].back() : ends[i].front() - starts[i].front();
  };
  c.segment_transient_bytes.assign(n, 0);
  c.replay_transient_bytes.assign(n, 0);
  c.replay_free_peak_bytes.assign(n, 0);
  measure(ReplayShape::own_segment);
  for (std::size_t i = 0; i < n; ++i) {
    c.segment_transient_bytes[i] = std::max(0.0, reading(i, false) - c.boundary_bytes[i + 1]);
    c.replay_transient_bytes[i] =
        std::max(0.0, reading(i, true) - c.activation_bytes[i] - c.boundary_bytes[i + 1]);
  }
  measure(ReplayShape::own_segment_copied);
  for (std::size_t i = 0; i < n; ++i) {
    // the copy plays x_l; made before the start marker, as with the input's copy, it is added back
    const bool made = copies && copy_kept_before(*copies, i);
    c.replay_free_peak_bytes[i] = reading(i, true) + (made ? c.boundary_bytes[i] : 0.0);
  }
  if (copies) return;
  c.dropped_transient_bytes.assign(n, 0);
  c.dropped_free_peak_bytes.assign(n, 0);
  measure(ReplayShape::inner_segment);
  for (std::size_t i = 0; i < n; ++i)
    c.dropped_transient_bytes[i] = std::max(0.0, reading(i, true) - c.boundary_bytes[i + 1]);
  measure(ReplayShape::copied_input);
  for (std::size_t i = 0; i < n; ++i) c.dropped_free_peak_bytes[i] = reading(i, true);
}

/// Returns `c`'s figures as they ran (as_run), those of a layer whose input's copy the layer
/// before keeps, as a chain of their own, and replaces c's by those measured with no such copy
/// (Note [shared copies]); a step that could not be measured faithfully marks c unpriced.
template <class Layers, class T, class Loss>
std::shared_ptr<Chain> split_copy_figures(Layers& layers, const Tensor<T>& input, Loss& loss,
                                          Chain& c) {
  auto with_copy = std::make_shared<Chain>(c);
  with_copy->saves_output_copy.clear();
  Chain own = c;
  Tensor<T> unused;
  if (!plain_step(layers, input, loss, InputCopy::own, true, own, nullptr, unused))
    c.unpriced_copies = true;
  // only those layers' own figures: the others ran alike, but the copy op before a layer sits in
  // the backward window of the layer before it
  const std::size_t n = c.layers();
  for (std::size_t l = 0; l < n; ++l) {
    if (!copy_kept_before(c, l)) continue;
    c.activation_bytes[l] = own.activation_bytes[l];
    c.forward_transient_bytes[l] = own.forward_transient_bytes[l];
    c.backward_transient_bytes[l] = own.backward_transient_bytes[l];
  }
  if (copy_kept_before(c, n)) {
    c.loss_bytes = own.loss_bytes;
    c.loss_forward_transient_bytes = own.loss_forward_transient_bytes;
    c.loss_backward_transient_bytes = own.loss_backward_transient_bytes;
  }
  return with_copy;
}

}  // namespace detail

/// Measures each layer's boundary, kept activation and transient bytes, whether it keeps its
/// input and its output, and its forward time, by running `layers` on `input` and then `loss`
/// on the result, on tapes of its own: `repeats` steps (the last measures memory), one forward
/// pass (which layers keep their input), four steps with the layers in segments
/// (options.replays), and the last layer's backward once more when it keeps its output (so that
/// predictions are exact: Note [four ways a layer runs]). Under Precision::bf16, when a layer
/// keeps its output's copy for the next one to share (Note [shared copies]), one more step, two
/// more with segments and one more last backward measure the figures with and without that copy,
/// and each policy is measured twice. Parameters used by the layers receive gradients: call
/// zero_grad() afterwards. Profile after one training step: the first backward pass also
/// allocates the parameters' gradient buffers, which later steps reuse, and would count them as
/// transients.
template <class Layers, class T, class Loss>
Chain profile(Layers&& layers, const Tensor<T>& input, Loss&& loss, ProfileOptions options = {}) {
  const auto n = static_cast<std::size_t>(std::distance(std::begin(layers), std::end(layers)));
  if (n == 0) throw PlanError("plan::profile: no layers to profile");
  if (options.repeats < 1)
    throw PlanError(
        remat::detail::cat("plan::profile: repeats must be >= 1, got ", options.repeats));
  Chain c;
  c.boundary_bytes.assign(n + 1, 0);
  c.activation_bytes.assign(n, 0);
  c.forward_transient_bytes.assign(n, 0);
  c.backward_transient_bytes.assign(n, 0);
  c.saves_output.assign(n, true);
  c.saves_output_copy.assign(n, false);
  std::vector<std::vector<double>> times(n);
  Tensor<T> last_input;
  for (int run = 0; run < options.repeats; ++run) {
    if (!detail::plain_step(layers, input, loss, detail::InputCopy::as_run,
                            run == options.repeats - 1, c, &times, last_input))
      c.unpriced_copies = true;
  }
  c.saves_input = detail::input_kept(layers, input, c.boundary_bytes,
                                     [](auto& layer, const Var<T>& in) { return layer(in); });
  const bool copies = Chain::any_true(c.saves_output_copy);
  const std::shared_ptr<Chain> with_copy =
      copies ? detail::split_copy_figures(layers, input, loss, c) : nullptr;
  if (!copies) c.saves_output_copy.clear();
  if (c.saves_output[n - 1]) {
    c.last_unheld_backward_transient_bytes =
        detail::last_unheld_backward(layers, last_input, loss, n, false);
  }
  if (options.replays) detail::replay_figures(layers, input, loss, nullptr, c);
  if (copies) {
    if (c.saves_output[n - 1]) {
      with_copy->last_unheld_backward_transient_bytes = detail::last_unheld_backward(
          layers, last_input, loss, n, detail::copy_kept_before(c, n - 1));
    }
    if (options.replays) {
      with_copy->dropped_transient_bytes = c.dropped_transient_bytes;
      with_copy->dropped_free_peak_bytes = c.dropped_free_peak_bytes;
      detail::replay_figures(layers, input, loss, &c, *with_copy);
    }
  }
  c.forward_cost.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::sort(times[i].begin(), times[i].end());
    c.forward_cost[i] = times[i][times[i].size() / 2];
  }
  if (options.price_replays)
    c.forward_cost = detail::replay_times(layers, input, loss, options.repeats, n);
  if (options.derived_policies > 0) {
    c.derived = derive_policies(layers, input, options.derived_policies, options.repeats);
    for (const DerivedPolicy& d : c.derived) options.policies.push_back(d.policy);
  }
  for (const SavePolicy& policy : options.policies) {
    if (!policy.keeps_anything() || c.policy_index(policy) >= 0) continue;
    detail::measure_policy(layers, input, loss, policy, options.repeats, c, with_copy.get());
  }
  c.with_input_copy = with_copy;
  return c;
}

/// profile() with no loss: the backward pass starts from a gradient of ones on the output.
template <class Layers, class T>
Chain profile(Layers&& layers, const Tensor<T>& input, ProfileOptions options = {}) {
  const Chain c = profile(
      std::forward<Layers>(layers), input, [](const Var<T>& y) { return y; }, options);
  return c.without_loss();  // the "loss" was the output itself, its seed x_n's gradient
}

}  // namespace remat::plan
