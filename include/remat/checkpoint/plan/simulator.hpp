#pragma once
/// @file
/// plan::predict(): the simulation every planner optimizes (Note [memory model]), and the plans
/// that need nothing more: custom(), none(), every(), sqrt().
///
/// Note [memory model]: a plan's predicted peak comes from plan::predict(), a simulation of what
/// the tape does, at the granularity of layers. Layer l reads boundary x_l and writes x_{l+1}.
/// - A layer run at the level being materialized keeps its activations (a_l), and pins x_l if it
///   saves its input and x_{l+1} if it saves its output (like tanh), until the backward sweep
///   passes it; a layer run inside a deeper segment keeps nothing, its output lives only until
///   the next layer used it.
/// - A segment one level deeper than the level being run captures its input boundary.
/// - While layer l runs forward, its temporaries exist on top, as Note [four ways a layer runs]
///   says; while its backward runs, the incoming gradient (the size of x_{l+1}) and its backward
///   temporaries (beta_l) do.
/// - The backward sweep replays a segment the first time it needs one of its layers (not the
///   trailing child segment, see Note [trailing child] in tape_state.hpp), and releases the
///   segment's captured input once the sweep has passed it.
/// - The caller holds the output x_n to the end of the step (Chain::output_held), so a replay
///   that recomputes x_n makes a second copy of it; when that copy is what the last layer keeps,
///   nothing else holds it and the layer's backward frees it early
///   (Chain::last_unheld_backward_transient_bytes).
/// The chain's input x_0 exists before the step and is not counted (unless input_made_in_step,
/// as for a GPT's blocks, whose input the embeddings make); the loss pins x_n and keeps
/// loss_bytes until the backward pass starts, and its value (loss_output_bytes) to the end; its
/// forward and backward temporaries (a chunked loss's tile of logits) sit on top of that while it
/// runs. Every planner optimizes this same model, so predictions and plans agree.
///
/// Note [four ways a layer runs]: what a layer adds to memory while it runs forward depends on
/// who holds its values, and differs by more than its temporaries:
/// - first pass, kept (outside any segment): the caller's Var holds x_l throughout, every op
///   saves, the values no op saves die when the layer returns: a_l + x_{l+1} + tau_l on top;
/// - first pass inside a segment: the same, but no op saves (segment_transient_bytes);
/// - replay at the layer's own level (it keeps a_l): the replay drops each value right after
///   its last use, so interiors die sooner (replay_transient_bytes); and when nothing pins x_l
///   (the layer is not its segment's first, and the layer before did not keep its output) the
///   replay drops x_l midway too (replay_free_peak_bytes, a whole peak: it may be less than
///   x_l + a_l + x_{l+1});
/// - replay inside a deeper segment: keeps nothing, x_l held or not (dropped_transient_bytes,
///   dropped_free_peak_bytes).
/// plan::profile measures all four (checkpoint/profile.hpp); a Chain without them falls back to
/// the first pass's figures, an upper bound for the others.
///
/// Note [policy layers]: a segment whose save policy keeps some ops (core/save_policy.hpp) is
/// predicted when it spans one layer at the top level. Seen from the rest of the chain, that
/// layer is a plain layer with other figures: it keeps what its kept ops saved (and the kept
/// values its replay reads), pins x_l when its segment captures x_l or a kept op saved it, and its
/// backward first replays the ops not kept, inside the layer's own backward. plan::profile
/// measures those figures per policy (Chain::policies, PolicyCosts) by running every layer under
/// the policy in a segment of its own, exactly as it measures plain layers; predict() then runs
/// the same simulation on the chain with those layers' figures swapped in (Chain::under_policy)
/// and adds their replay cost. A policy segment over several layers or inside another segment is
/// not modelled: predict() raises a PlanError for it rather than guess.
///
/// Note [chained policy layers]: two adjacent layers under the same policy chain (Note [chained
/// segments] in core/tape_state.hpp): the second segment takes over the first's tail, the ops
/// after its last kept op, and replays it from the kept values, so the boundary between them is
/// not kept. A layer's figures then depend on whether it is chained with the layer before it
/// (its segment replays that layer's tail, and it does not keep its input) and with the layer
/// after it (its tail is replayed by the next layer's backward), and on nothing else: the tape
/// chains only tails that read the layer's own kept values and leaves. plan::profile measures
/// the three chained variants of every layer (PolicyCosts::chained) as it measures the plain
/// one, and predict() gives each policy layer the variant its neighbours make: a layer-level
/// simulation still, exact as before.
///
/// Note [shared copies]: under Precision::bf16 an op saves a bfloat16 copy of what it saves,
/// one copy per buffer for every op that saves it while it lives (Note [BF16 saves] in
/// core/precision.hpp). When layer l-1 ends by saving its output (a tanh) and layer l saves its
/// input, the two share the copy of x_l exactly when both are kept at the same time: a layer kept
/// at level L reads the x_l that layer l-1's kept run made (in the first pass, in the same replay,
/// or captured by its segment from that run), and a replay of layer l-1 only comes after layer
/// l's backward has released what it kept. So the copy is layer l-1's, and layer l runs with
/// other figures when layer l-1 is kept as it runs: a_l without the copy, and transients and
/// peaks measured with the copy made before it (Chain::with_input_copy, chosen by
/// Chain::figures()); likewise the loss after a last layer kept with its output's copy.
/// plan::profile measures those figures with an op before the layer that saves its input
/// (detail::CopySaver), and the plain figures with a copy of x_l in a buffer of its own, so that
/// no copy exists before the layer (detail::CopyNode). A layer-level simulation still: which
/// figures a kept layer has follows from which layers are kept, which the simulation knows.
/// A policy layer has both sets too (Chain::with_input_copy's policies), and keeps its output's
/// copy or not as its own figures say (PolicyCosts::saves_output_copy, per chained variant).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "remat/checkpoint/plan/chain.hpp"

namespace remat::plan {

/// The memory and recompute a set of segments is predicted to cost (Note [memory model]).
struct Prediction {
  double peak_bytes = 0;
  double recompute = 0;
  std::size_t max_checkpoints = 0;   ///< segment inputs captured at once (x_0 not counted)
  std::size_t max_materialized = 0;  ///< layers holding activations at once
};

namespace detail {

/// Throws a PlanError unless the segments are sorted, disjoint, non-empty, nested strictly
/// inside their parents and inside [0, n).
inline void check_segments(const std::vector<Segment>& segs, std::size_t begin, std::size_t end,
                           std::size_t n, const char* who) {
  std::size_t at = begin;
  for (const Segment& s : segs) {
    if (s.begin < at || s.end <= s.begin || s.end > end) {
      throw PlanError(remat::detail::cat(
          who, ": segment [", s.begin, ", ", s.end, ") is empty, overlaps another, or leaves ",
          end == n && begin == 0 ? "the chain" : "its parent", " [", begin, ", ", end,
          "); segments must be sorted, disjoint and nested"));
    }
    if (s.children.size() == 1 && s.children[0].begin == s.begin && s.children[0].end == s.end) {
      throw PlanError(remat::detail::cat(who, ": segment [", s.begin, ", ", s.end,
                                         ") holds a child over the same layers"));
    }
    check_segments(s.children, s.begin, s.end, n, who);
    at = s.end;
  }
}

/// Throws a PlanError unless `plan` was made for n layers and its segments fit them.
inline void check_plan(const Plan& plan, std::size_t n, const char* who) {
  if (plan.layers != n) {
    throw PlanError(remat::detail::cat(who, ": the plan (", to_string(plan.kind), ") is for ",
                                       plan.layers, " layers but ", n, " were given"));
  }
  check_segments(plan.segments, 0, n, n, who);
}

/// Runs the layer-level simulation of Note [memory model].
class Simulator {
 public:
  Simulator(const Chain& chain, const std::vector<Segment>& top)
      : c_(chain),
        n_(chain.layers()),
        pins_(n_ + 2, 0),
        captures_(n_ + 1, 0),
        kept_(n_, 0),
        shared_input_(n_, 0),
        out_slot_(n_, 0),
        innermost_(n_, -1),
        starting_(n_) {
    flatten(top, -1, 1);
  }

  Prediction run() {
    forward(0, n_, 0);
    pin(n_);                                            // the loss holds the output
    const Chain& loss = c_.figures(n_, kept_[n_ - 1]);  // Note [shared copies]
    live_ += loss.loss_bytes + loss.loss_output_bytes;
    touch(std::max(loss.loss_forward_transient_bytes, loss.loss_backward_transient_bytes));
    grad_ = c_.boundary(n_);
    touch(0);
    if (!c_.output_held) unpin(n_);
    live_ -= loss.loss_bytes;
    for (std::size_t l = n_; l-- > 0;) {
      materialize(l);
      // the last layer's kept output is held by nothing else if it is a replay's copy, or if the
      // caller let x_n go
      touch(kept_figures(l).beta(
          l, l + 1 == n_ && kept_[l] && (out_slot_[l] == n_ + 1 || !c_.output_held)));
      if (kept_[l]) release_layer(l);
      grad_ = c_.boundary(l);
      for (int s : starting_[l]) {
        if (segs_[s].captured) uncapture(s);
      }
    }
    return result_;
  }

 private:
  struct Flat {
    std::size_t begin, end;
    int parent, depth, last_child = -1;
    bool materialized = false, captured = false;
  };

  void flatten(const std::vector<Segment>& list, int parent, int depth) {
    for (const Segment& s : list) {
      const int id = static_cast<int>(segs_.size());
      segs_.push_back(Flat{s.begin, s.end, parent, depth});
      if (parent >= 0) segs_[parent].last_child = id;
      starting_[s.begin].push_back(id);
      for (std::size_t l = s.begin; l < s.end; ++l) innermost_[l] = id;
      flatten(s.children, id, depth + 1);
    }
  }

  int depth_of_layer(std::size_t l) const noexcept {
    return innermost_[l] < 0 ? 0 : segs_[innermost_[l]].depth;
  }

  /// Bytes of boundary slot j; slot n + 1 is x_n recomputed by a replay (Note [memory model]).
  double bytes(std::size_t j) const noexcept { return c_.boundary(std::min(j, n_)); }
  void pin(std::size_t j) {
    if (pins_[j]++ == 0) live_ += bytes(j);
  }
  void unpin(std::size_t j) {
    if (--pins_[j] == 0) live_ -= bytes(j);
  }
  void touch(double extra) {
    result_.peak_bytes = std::max(result_.peak_bytes, live_ + grad_ + extra);
    result_.max_checkpoints = std::max(result_.max_checkpoints, checkpoints_);
    result_.max_materialized = std::max(result_.max_materialized, materialized_);
  }
  /// The figures layer l was kept with (Note [shared copies]).
  const Chain& kept_figures(std::size_t l) const noexcept {
    return c_.figures(l, l > 0 && shared_input_[l]);
  }
  void release_layer(std::size_t l) {
    live_ -= kept_figures(l).activation(l);
    kept_[l] = 0;
    --materialized_;
    if (c_.keeps_input(l)) unpin(l);
    if (c_.keeps_output(l)) unpin(out_slot_[l]);
  }
  void capture(int s) {
    segs_[s].captured = true;
    const std::size_t j = segs_[s].begin;
    if (c_.boundary(j) > 0 && captures_[j]++ == 0)
      ++checkpoints_;  // nested segments may share an input
    pin(j);
  }
  void uncapture(int s) {
    segs_[s].captured = false;
    const std::size_t j = segs_[s].begin;
    if (c_.boundary(j) > 0 && --captures_[j] == 0) --checkpoints_;
    unpin(j);
  }

  /// Runs layers [from, to) forward while `level` is being materialized.
  void forward(std::size_t from, std::size_t to, int level) {
    for (std::size_t l = from; l < to; ++l) {
      for (int s : starting_[l]) {
        if (segs_[s].depth == level + 1 && !segs_[s].captured) capture(s);
      }
      const double current = pins_[l] ? 0.0 : c_.boundary(l);
      const bool keeps = depth_of_layer(l) == level;
      // Note [shared copies]: a kept layer shares the copy of x_l the layer before it keeps
      shared_input_[l] = keeps && l > 0 && kept_[l - 1];
      const Chain& f = c_.figures(l, shared_input_[l]);
      // Note [four ways a layer runs]
      if (level == 0) {  // the caller's Var holds x_l while the layer runs
        touch(current + c_.boundary(l + 1) +
              (keeps ? f.activation(l) + f.tau(l) : c_.tau_segment(l)));
      } else {  // a replay drops x_l after its last use unless something pins it
        touch(f.replay_peak(l, keeps, pins_[l] > 0) - (pins_[l] > 0 ? c_.boundary(l) : 0.0));
      }
      if (keeps) {
        kept_[l] = 1;
        ++materialized_;
        live_ += f.activation(l);
        if (c_.keeps_input(l)) pin(l);
        // a replay computes its outputs anew; only x_n's first copy may still be alive then
        out_slot_[l] = level > 0 && l + 1 == n_ ? n_ + 1 : l + 1;
        if (c_.keeps_output(l)) pin(out_slot_[l]);
      }
    }
  }

  void materialize(std::size_t l) {
    chain_.clear();
    for (int s = innermost_[l]; s >= 0 && !segs_[s].materialized; s = segs_[s].parent)
      chain_.push_back(s);
    for (std::size_t i = chain_.size(); i-- > 0;) replay(chain_[i]);
  }

  void replay(int s) {
    Flat& seg = segs_[s];
    const int trailing =
        seg.last_child >= 0 && segs_[seg.last_child].end == seg.end ? seg.last_child : -1;
    const std::size_t stop = trailing >= 0 ? segs_[trailing].begin : seg.end;
    for (std::size_t l = seg.begin; l < stop; ++l) result_.recompute += c_.cost(l);
    forward(seg.begin, stop, seg.depth);
    if (trailing >= 0 && !segs_[trailing].captured) capture(trailing);
    seg.materialized = true;
    touch(0);
  }

  const Chain& c_;
  std::size_t n_;
  std::vector<int> pins_;
  std::vector<int> captures_;
  std::vector<char> kept_;
  std::vector<char> shared_input_;     // a kept layer ran while the layer before it was kept
  std::vector<std::size_t> out_slot_;  // the boundary slot a kept layer pins as its output
  std::vector<int> innermost_;
  std::vector<std::vector<int>> starting_;
  std::vector<Flat> segs_;
  std::vector<int> chain_;
  double live_ = 0, grad_ = 0;
  std::size_t checkpoints_ = 0, materialized_ = 0;
  Prediction result_;
};

}  // namespace detail

namespace detail {

/// The layers of `segments` that run under a policy keeping something (Note [policy layers]):
/// per layer, the index into chain.policies, or -1. Throws a PlanError for a policy segment the
/// simulator does not model or whose policy the chain has no costs for.
inline std::vector<int> policy_layers(const Chain& chain, const std::vector<Segment>& segments,
                                      const char* who) {
  std::vector<int> out(chain.layers(), -1);
  struct Walk {
    const Chain& chain;
    std::vector<int>& out;
    const char* who;
    void operator()(const std::vector<Segment>& list, bool top) const {
      for (const Segment& s : list) {
        if (s.policy.keeps_anything()) {
          if (!top || s.end != s.begin + 1 || !s.children.empty()) {
            throw PlanError(remat::detail::cat(
                who, ": segment [", s.begin, ", ", s.end, ")", top ? "" : " (nested)",
                " carries the policy '", s.policy.name(),
                "'; predictions model a policy segment over one layer at the top level "
                "(Note [policy layers]): split it, or use plan::with_policy() for an unpredicted "
                "plan"));
          }
          const int p = chain.policy_index(s.policy);
          if (p < 0) {
            std::string known;
            for (const PolicyCosts& q : chain.policies)
              known += (known.empty() ? "" : ", ") + q.policy.name();
            throw PlanError(remat::detail::cat(
                who, ": segment [", s.begin, ", ", s.end, ") carries the policy '", s.policy.name(),
                "', which the chain has no costs for (it has: ", known.empty() ? "none" : known,
                "); profile the chain with that policy (ProfileOptions::policies)"));
          }
          out[s.begin] = p;
        }
        (*this)(s.children, false);
      }
    }
  };
  Walk{chain, out, who}(segments, true);
  return out;
}

/// `segments` without the policy segments, over `chain` with those layers' figures swapped in,
/// and their replay cost (Note [policy layers]).
struct Resolved {
  Chain chain;
  std::vector<Segment> segments;
  double replay_cost = 0;
};

/// Which variant of its policy's figures layer l runs with (PolicyCosts::variant()): chained
/// with the layer after it (1), before it (2), or both (3), by Note [chained policy layers].
inline int chained_variant(const std::vector<int>& layer_policy, std::size_t l) noexcept {
  const int p = layer_policy[l];
  if (p < 0) return 0;
  const bool after = l + 1 < layer_policy.size() && layer_policy[l + 1] == p;
  const bool before = l > 0 && layer_policy[l - 1] == p;
  return (after ? 1 : 0) | (before ? 2 : 0);
}

/// Layer l of `c` as it runs under q's figures.
inline void swap_in_policy(Chain& c, const PolicyCosts& q, std::size_t l) {
  const std::size_t n = c.layers();
  c.activation_bytes[l] = q.activation_bytes[l];
  if (c.forward_transient_bytes.empty()) c.forward_transient_bytes.assign(n, 0);
  c.forward_transient_bytes[l] = q.forward_transient_bytes[l];
  if (c.backward_transient_bytes.empty()) c.backward_transient_bytes.assign(n, 0);
  c.backward_transient_bytes[l] = q.backward_transient_bytes[l];
  if (c.saves_input.empty()) c.saves_input.assign(n, true);
  c.saves_input[l] = q.saves_input[l];
  if (c.saves_output.empty()) c.saves_output.assign(n, true);
  c.saves_output[l] = q.saves_output[l];
  if (!c.saves_output_copy.empty() || !q.saves_output_copy.empty()) {
    c.saves_output_copy.resize(n, false);
    c.saves_output_copy[l] = !q.saves_output_copy.empty() && q.saves_output_copy[l];
  }
  if (l + 1 == n) c.last_unheld_backward_transient_bytes = q.last_unheld_backward_transient_bytes;
}

inline Resolved resolve_policies(const Chain& chain, const std::vector<Segment>& segments,
                                 const std::vector<int>& layer_policy, const char* who) {
  Resolved r{chain, {}, 0};
  r.chain.policies.clear();
  // Note [shared copies]: the figures with the input's copy made before, swapped in alike
  std::shared_ptr<Chain> with_copy;
  if (chain.with_input_copy) {
    with_copy = std::make_shared<Chain>(*chain.with_input_copy);
    with_copy->policies.clear();
  }
  for (const Segment& s : segments) {
    if (!s.policy.keeps_anything()) r.segments.push_back(s);
  }
  for (std::size_t l = 0; l < layer_policy.size(); ++l) {
    if (layer_policy[l] < 0) continue;
    const auto p = static_cast<std::size_t>(layer_policy[l]);
    const PolicyCosts& base = chain.policies[p];
    const int k = chained_variant(layer_policy, l);
    if (k != 0 && base.chained.empty()) {
      throw PlanError(remat::detail::cat(
          who, ": layers ", l - ((k & 2) ? 1 : 0), " and ", l + ((k & 2) ? 0 : 1),
          " run under the policy '", base.policy.name(),
          "' in adjacent segments, which chain (Note [chained policy layers]); the chain has no "
          "figures for chained layers of that policy: profile it with plan::profile"));
    }
    swap_in_policy(r.chain, base.variant(k), l);
    if (with_copy) {
      const int w = chain.with_input_copy->policy_index(base.policy);
      swap_in_policy(*with_copy,
                     chain.with_input_copy->policies[static_cast<std::size_t>(w)].variant(k), l);
    }
    r.replay_cost += base.variant(k).replay_cost[l];
  }
  r.chain.with_input_copy = std::move(with_copy);
  return r;
}

}  // namespace detail

/// Predicted peak bytes and recompute of running `chain` with `segments` (Note [memory model];
/// segments with save policies: Note [policy layers]).
inline Prediction predict(const Chain& chain, const std::vector<Segment>& segments) {
  chain.validate("plan::predict");
  detail::check_segments(segments, 0, chain.layers(), chain.layers(), "plan::predict");
  const std::vector<int> layer_policy = detail::policy_layers(chain, segments, "plan::predict");
  if (std::all_of(layer_policy.begin(), layer_policy.end(), [](int p) { return p < 0; }))
    return detail::Simulator(chain, segments).run();
  const detail::Resolved r =
      detail::resolve_policies(chain, segments, layer_policy, "plan::predict");
  Prediction p = detail::Simulator(r.chain, r.segments).run();
  p.recompute += r.replay_cost;
  return p;
}

namespace detail {

/// Plan::layer_notes: per layer, how it runs under `segments` and what it keeps and replays.
inline std::vector<std::string> layer_notes(const Chain& chain,
                                            const std::vector<Segment>& segments) {
  const std::size_t n = chain.layers();
  std::vector<const Segment*> innermost(n, nullptr);
  std::vector<int> depth(n, 0);
  struct Walk {
    std::vector<const Segment*>& innermost;
    std::vector<int>& depth;
    void operator()(const std::vector<Segment>& list, int d) const {
      for (const Segment& s : list) {
        for (std::size_t l = s.begin; l < s.end; ++l) {
          innermost[l] = &s;
          depth[l] = d;
        }
        (*this)(s.children, d + 1);
      }
    }
  };
  Walk{innermost, depth}(segments, 1);
  std::vector<int> layer_policy(n, -1);
  for (std::size_t l = 0; l < n; ++l) {
    if (innermost[l] && innermost[l]->policy.keeps_anything())
      layer_policy[l] = chain.policy_index(innermost[l]->policy);
  }
  const auto percent = [](double part, double whole) {
    return whole > 0
               ? remat::detail::cat(std::llround(100 * part / whole), " % of its forward time")
               : std::string("no forward time");
  };
  std::vector<std::string> notes;
  for (std::size_t l = 0; l < n; ++l) {
    const Segment* s = innermost[l];
    std::string note = remat::detail::cat("layer ", l, ": ");
    if (!s) {
      note += "kept, " + format_bytes(chain.activation(l));
    } else if (s->policy.keeps_anything()) {
      const int p = chain.policy_index(s->policy);
      if (p < 0) {
        note += s->policy.name() + " (no costs measured for it)";
      } else {
        const PolicyCosts& base = chain.policies[static_cast<std::size_t>(p)];
        const int k = chained_variant(layer_policy, l);
        const PolicyCosts& q = k != 0 && base.chained.empty() ? base : base.variant(k);
        note += remat::detail::cat(
            s->policy.name(), k != 0 ? " (chained)" : "", ", keeps ",
            format_bytes(q.activation_bytes[l]), ", replays the rest (",
            format_bytes(std::max(0.0, chain.activation(l) - q.activation_bytes[l])), ", ",
            percent(q.replay_cost[l], chain.cost(l)), ")");
      }
    } else {
      note += remat::detail::cat("replayed in segment [", s->begin, ", ", s->end, ") at depth ",
                                 depth[l], ", recomputes ", format_bytes(chain.activation(l)));
      if (l == s->begin)
        note += ", the segment keeps its input (" + format_bytes(chain.boundary(l)) + ")";
    }
    notes.push_back(std::move(note));
  }
  return notes;
}

}  // namespace detail

/// A plan from explicit segments, with its predictions filled in.
inline Plan custom(const Chain& chain, std::vector<Segment> segments, Kind kind = Kind::custom) {
  const Prediction p = predict(chain, segments);
  Plan plan;
  plan.layer_notes = detail::layer_notes(chain, segments);
  plan.kind = kind;
  plan.layers = chain.layers();
  plan.segments = std::move(segments);
  plan.peak_bytes = p.peak_bytes;
  plan.recompute = p.recompute;
  plan.recompute_fraction = p.recompute / chain.total_cost();
  plan.predicted = !chain.unpriced_copies;
  return plan;
}

/// No checkpointing: every activation is kept until backward reaches it.
inline Plan none(const Chain& chain) { return custom(chain, {}, Kind::none); }

/// One segment per layer, except the last layer, which runs plainly: its replay would start as
/// soon as the forward pass ends, so keeping it costs no peak (the same convention as PyTorch's
/// checkpoint_sequential). Every other layer's interior is dropped and replayed once.
inline Plan every(const Chain& chain) {
  chain.validate("plan::every");
  std::vector<Segment> s;
  for (std::size_t l = 0; l + 1 < chain.layers(); ++l) s.push_back(Segment{l, l + 1, {}});
  return custom(chain, std::move(s), Kind::every);
}

/// Chen et al. (2016): ceil(sqrt(n)) runs of near-equal length, each a segment replayed once,
/// but the last, which runs plainly (see every()).
inline Plan sqrt(const Chain& chain) {
  chain.validate("plan::sqrt");
  const std::size_t n = chain.layers();
  const auto k = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  std::vector<Segment> s;
  for (std::size_t i = 0; i + 1 < k; ++i) {
    const std::size_t b = n * i / k, e = n * (i + 1) / k;
    if (e > b) s.push_back(Segment{b, e, {}});
  }
  return custom(chain, std::move(s), Kind::sqrt);
}

namespace detail {
inline Plan unmeasured(Plan p) {
  p.predicted = false;  // sizes of a uniform unit chain: peak_bytes means nothing
  return p;
}
}  // namespace detail

/// Plans from a layer count alone, for layers of equal cost; they carry no memory prediction
/// (profile the chain for one). recompute counts layer forwards.
inline Plan every(std::size_t n) { return detail::unmeasured(every(Chain::uniform(n))); }
inline Plan sqrt(std::size_t n) { return detail::unmeasured(sqrt(Chain::uniform(n))); }
inline Plan none(std::size_t n) { return detail::unmeasured(none(Chain::uniform(n))); }

}  // namespace remat::plan
