#pragma once
/// @file
/// Checkpoint planners: pure functions from a description of a chain of layers (a Chain) to a
/// Plan (which layers to put in which, possibly nested, checkpoint segments), each plan carrying
/// its predicted peak memory and recompute cost. No tape is needed: a Chain can be written by
/// hand, or measured by plan::profile() (checkpoint/profile.hpp).
///
/// Note [memory model]: a plan's predicted peak comes from plan::predict(), a simulation of what
/// the tape does, at the granularity of layers. Layer l reads boundary x_l and writes x_{l+1}.
/// - A layer run at the level being materialized keeps its activations (a_l) and pins x_l (and
///   x_{l+1} if it saves its output, like tanh) until the backward sweep passes it; a layer run
///   inside a deeper segment keeps nothing, its output lives only until the next layer used it.
/// - A segment one level deeper than the level being run captures its input boundary.
/// - While layer l runs forward, its temporaries (tau_l) exist on top; while its backward runs,
///   the incoming gradient (the size of x_{l+1}) and its backward temporaries (beta_l) do.
/// - The backward sweep replays a segment the first time it needs one of its layers (not the
///   trailing child segment, see Note [trailing child] in tape_state.hpp), and releases the
///   segment's captured input once the sweep has passed it.
/// The chain's input x_0 exists before the step and is not counted (unless input_made_in_step,
/// as for a GPT's blocks, whose input the embeddings make); the loss pins x_n and keeps
/// loss_bytes until the backward pass starts, and its value (loss_output_bytes) to the end; its
/// forward and backward temporaries (a chunked loss's logits chunk) sit on top of that while it
/// runs. Every planner optimizes this same model, so predictions and plans agree.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "remat/core/error.hpp"

namespace remat::plan {

/// What the planners know about a chain of n layers. Bytes are per step; costs are in any unit
/// (seconds, FLOPs, or 1 per layer).
struct Chain {
  std::vector<double> boundary_bytes;            ///< n + 1: x_0 (the input) ... x_n (the output)
  std::vector<double> activation_bytes;          ///< n: what layer l keeps for backward besides x_l, x_{l+1}
  std::vector<double> forward_transient_bytes;   ///< n (or empty: 0): temporaries while l runs forward
  std::vector<double> backward_transient_bytes;  ///< n (or empty: 0): temporaries while l runs backward
  std::vector<double> forward_cost;              ///< n (or empty: 1 each): cost of layer l's forward
  std::vector<bool> saves_output;                ///< n (or empty: all true): layer l keeps x_{l+1} for its backward
  double loss_bytes = 0;                         ///< what the loss keeps from its forward to its backward
  double loss_output_bytes = 0;                  ///< the loss value and its seed gradient, alive to the end
  double loss_forward_transient_bytes = 0;       ///< temporaries while the loss runs forward (a logits chunk)
  double loss_backward_transient_bytes = 0;      ///< temporaries while the loss runs backward, x_n's gradient included
  bool input_made_in_step = false;               ///< x_0 is computed during the step (it then counts)

  std::size_t layers() const noexcept { return activation_bytes.size(); }

  /// n identical layers: boundaries of `boundary` bytes, `activation` bytes kept per layer.
  static Chain uniform(std::size_t n, double boundary = 1, double activation = 0, double cost = 1) {
    Chain c;
    c.boundary_bytes.assign(n + 1, boundary);
    c.activation_bytes.assign(n, activation);
    c.forward_cost.assign(n, cost);
    return c;
  }

  double boundary(std::size_t j) const noexcept { return j == 0 && !input_made_in_step ? 0.0 : boundary_bytes[j]; }
  double activation(std::size_t l) const noexcept { return activation_bytes[l]; }
  double tau(std::size_t l) const noexcept { return forward_transient_bytes.empty() ? 0.0 : forward_transient_bytes[l]; }
  double beta(std::size_t l) const noexcept { return backward_transient_bytes.empty() ? 0.0 : backward_transient_bytes[l]; }
  double cost(std::size_t l) const noexcept { return forward_cost.empty() ? 1.0 : forward_cost[l]; }
  bool keeps_output(std::size_t l) const noexcept { return saves_output.empty() || saves_output[l]; }
  double total_cost() const noexcept {
    double s = 0;
    for (std::size_t l = 0; l < layers(); ++l) s += cost(l);
    return s;
  }

  /// Throws a PlanError naming the first inconsistency (sizes, negative or non-finite values).
  void validate(const char* who) const {
    const std::size_t n = layers();
    const auto fail = [&](const std::string& what) { throw PlanError(std::string(who) + ": chain " + what); };
    if (n == 0) fail("has no layers");
    if (boundary_bytes.size() != n + 1) {
      fail(detail::cat("has ", n, " layers but ", boundary_bytes.size(), " boundary sizes (needs ", n + 1, ")"));
    }
    const auto check = [&](const std::vector<double>& v, const char* name, bool optional) {
      if (optional && v.empty()) return;
      if (v.size() != n && v != boundary_bytes) fail(detail::cat("has ", n, " layers but ", v.size(), " ", name));
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!(v[i] >= 0) || !std::isfinite(v[i])) fail(detail::cat("has ", name, "[", i, "] = ", v[i], "; values must be finite and >= 0"));
      }
    };
    check(boundary_bytes, "boundary_bytes", false);
    check(activation_bytes, "activation_bytes", false);
    check(forward_transient_bytes, "forward_transient_bytes", true);
    check(backward_transient_bytes, "backward_transient_bytes", true);
    check(forward_cost, "forward_cost", true);
    if (!saves_output.empty() && saves_output.size() != n) fail(remat::detail::cat("has ", n, " layers but ", saves_output.size(), " saves_output flags"));
    for (double v : {loss_bytes, loss_output_bytes, loss_forward_transient_bytes, loss_backward_transient_bytes}) {
      if (!(v >= 0) || !std::isfinite(v)) fail(remat::detail::cat("has a loss size of ", v, "; it must be finite and >= 0"));
    }
  }
};

/// A checkpoint segment over layers [begin, end), possibly holding nested segments.
struct Segment {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::vector<Segment> children;

  friend bool operator==(const Segment&, const Segment&) = default;
};

/// A plan: which layers run inside which segments, and what that is predicted to cost.
struct Plan {
  std::string kind;               ///< "none", "every", "sqrt", "budget", "optimal" or "custom"
  std::size_t layers = 0;
  std::vector<Segment> segments;  ///< top level, in order, disjoint; other layers run plainly
  double peak_bytes = 0;          ///< predicted peak above what was live before the step
  double recompute = 0;           ///< predicted extra forward cost, in the chain's cost unit
  double recompute_fraction = 0;  ///< recompute / the cost of one forward pass
  int slots = -1;                 ///< for binomial plans: checkpoints alive at once; -1 otherwise
  bool predicted = true;          ///< false for plans made from a layer count, not measured sizes

  /// Depth of the deepest segment (0 when there is none).
  int depth() const noexcept { return depth_of(segments); }
  /// Number of segments at all depths.
  std::size_t segment_count() const noexcept { return count(segments); }

  std::string describe() const {
    std::ostringstream out;
    out << kind << ": " << segment_count() << " segments over " << layers << " layers, depth " << depth();
    if (predicted) out << ", predicted peak " << peak_bytes << " bytes";
    out << ", recompute " << recompute_fraction * 100 << " % of a forward";
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
inline void check_segments(const std::vector<Segment>& segs, std::size_t begin, std::size_t end, std::size_t n,
                           const char* who) {
  std::size_t at = begin;
  for (const Segment& s : segs) {
    if (s.begin < at || s.end <= s.begin || s.end > end) {
      throw PlanError(remat::detail::cat(who, ": segment [", s.begin, ", ", s.end, ") is empty, overlaps another, or leaves ",
                                         end == n && begin == 0 ? "the chain" : "its parent", " [", begin, ", ", end,
                                         "); segments must be sorted, disjoint and nested"));
    }
    if (s.children.size() == 1 && s.children[0].begin == s.begin && s.children[0].end == s.end) {
      throw PlanError(remat::detail::cat(who, ": segment [", s.begin, ", ", s.end, ") holds a child over the same layers"));
    }
    check_segments(s.children, s.begin, s.end, n, who);
    at = s.end;
  }
}

/// Throws a PlanError unless `plan` was made for n layers and its segments fit them.
inline void check_plan(const Plan& plan, std::size_t n, const char* who) {
  if (plan.layers != n) {
    throw PlanError(remat::detail::cat(who, ": the plan (", plan.kind, ") is for ", plan.layers, " layers but ", n, " were given"));
  }
  check_segments(plan.segments, 0, n, n, who);
}

/// Runs the layer-level simulation of Note [memory model].
class Simulator {
 public:
  Simulator(const Chain& chain, const std::vector<Segment>& top)
      : c_(chain), n_(chain.layers()), pins_(n_ + 1, 0), captures_(n_ + 1, 0), kept_(n_, 0), innermost_(n_, -1), starting_(n_) {
    flatten(top, -1, 1);
  }

  Prediction run() {
    forward(0, n_, 0);
    pin(n_);  // the loss holds the output
    live_ += c_.loss_bytes + c_.loss_output_bytes;
    touch(std::max(c_.loss_forward_transient_bytes, c_.loss_backward_transient_bytes));
    grad_ = c_.boundary(n_);
    touch(0);
    unpin(n_);
    live_ -= c_.loss_bytes;
    for (std::size_t l = n_; l-- > 0;) {
      materialize(l);
      touch(c_.beta(l));
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

  int depth_of_layer(std::size_t l) const noexcept { return innermost_[l] < 0 ? 0 : segs_[innermost_[l]].depth; }

  void pin(std::size_t j) {
    if (pins_[j]++ == 0) live_ += c_.boundary(j);
  }
  void unpin(std::size_t j) {
    if (--pins_[j] == 0) live_ -= c_.boundary(j);
  }
  void touch(double extra) {
    result_.peak_bytes = std::max(result_.peak_bytes, live_ + grad_ + extra);
    result_.max_checkpoints = std::max(result_.max_checkpoints, checkpoints_);
    result_.max_materialized = std::max(result_.max_materialized, materialized_);
  }
  void release_layer(std::size_t l) {
    kept_[l] = 0;
    --materialized_;
    live_ -= c_.activation(l);
    unpin(l);
    if (c_.keeps_output(l)) unpin(l + 1);
  }
  void capture(int s) {
    segs_[s].captured = true;
    const std::size_t j = segs_[s].begin;
    if (c_.boundary(j) > 0 && captures_[j]++ == 0) ++checkpoints_;  // nested segments may share an input
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
      touch(current + c_.activation(l) + c_.boundary(l + 1) + c_.tau(l));
      if (depth_of_layer(l) == level) {
        kept_[l] = 1;
        ++materialized_;
        live_ += c_.activation(l);
        pin(l);
        if (c_.keeps_output(l)) pin(l + 1);
      }
    }
  }

  void materialize(std::size_t l) {
    chain_.clear();
    for (int s = innermost_[l]; s >= 0 && !segs_[s].materialized; s = segs_[s].parent) chain_.push_back(s);
    for (std::size_t i = chain_.size(); i-- > 0;) replay(chain_[i]);
  }

  void replay(int s) {
    Flat& seg = segs_[s];
    const int trailing = seg.last_child >= 0 && segs_[seg.last_child].end == seg.end ? seg.last_child : -1;
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
  std::vector<int> innermost_;
  std::vector<std::vector<int>> starting_;
  std::vector<Flat> segs_;
  std::vector<int> chain_;
  double live_ = 0, grad_ = 0;
  std::size_t checkpoints_ = 0, materialized_ = 0;
  Prediction result_;
};

}  // namespace detail

/// Predicted peak bytes and recompute of running `chain` with `segments` (Note [memory model]).
inline Prediction predict(const Chain& chain, const std::vector<Segment>& segments) {
  chain.validate("plan::predict");
  detail::check_segments(segments, 0, chain.layers(), chain.layers(), "plan::predict");
  return detail::Simulator(chain, segments).run();
}

/// A plan from explicit segments, with its predictions filled in.
inline Plan custom(const Chain& chain, std::vector<Segment> segments, std::string kind = "custom") {
  const Prediction p = predict(chain, segments);
  Plan plan;
  plan.kind = std::move(kind);
  plan.layers = chain.layers();
  plan.segments = std::move(segments);
  plan.peak_bytes = p.peak_bytes;
  plan.recompute = p.recompute;
  plan.recompute_fraction = p.recompute / chain.total_cost();
  return plan;
}

/// No checkpointing: every activation is kept until backward reaches it.
inline Plan none(const Chain& chain) { return custom(chain, {}, "none"); }

/// One segment per layer, except the last layer, which runs plainly: its replay would start as
/// soon as the forward pass ends, so keeping it costs no peak (the same convention as PyTorch's
/// checkpoint_sequential). Every other layer's interior is dropped and replayed once.
inline Plan every(const Chain& chain) {
  chain.validate("plan::every");
  std::vector<Segment> s;
  for (std::size_t l = 0; l + 1 < chain.layers(); ++l) s.push_back(Segment{l, l + 1, {}});
  return custom(chain, std::move(s), "every");
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
  return custom(chain, std::move(s), "sqrt");
}

namespace detail {

/// One-level plans (segments with no children, other layers plain) as blocks: the exact Pareto
/// dynamic program behind plan::budget(). A state at cut s is (recompute so far, bytes pinned by
/// the blocks before s); a block's peak is that plus a local term that only depends on the
/// block (the closed form of the Simulator for one level, derived in docs/design.md).
class OneLevelPlanner {
 public:
  explicit OneLevelPlanner(const Chain& c) : c_(c), n_(c.layers()) {}

  /// Local peak of layer s run plainly: b_s + a_s + max(b_{s+1} + tau_s, [o_s] b_{s+1} + b_{s+1} + beta_s + L)
  /// (o_s: the layer keeps its output; the second b_{s+1} is the incoming gradient; L the loss
  /// value, alive during the backward pass).
  double plain_peak(std::size_t s) const {
    const double out = c_.boundary(s + 1);
    const double kept_out = c_.keeps_output(s) ? out : 0.0;
    return c_.boundary(s) + c_.activation(s) +
           std::max(out + c_.tau(s), kept_out + out + c_.beta(s) + c_.loss_output_bytes);
  }

  /// Local peaks of every segment [s, e), e = s+1 .. n, in one pass over e.
  std::vector<double> segment_peaks(std::size_t s) const {
    std::vector<double> peak(n_ + 1, 0);
    double first_pass = 0;            // max over l of [l > s] b_l + a_l + b_{l+1} + tau_l
    double replay_without_grad = 0;   // max over l of K_l + b_{l+1} + tau_l
    double backward = 0;              // max over l of K_l + [o_l] b_{l+1} + b_{l+1} + beta_l
    double kept = 0;                  // K_l = sum a_{s..l} + sum b_{s+1..l}: what layers s..l pin
    for (std::size_t l = s; l < n_; ++l) {
      const double out = c_.boundary(l + 1);
      kept += c_.activation(l) + (l > s ? c_.boundary(l) : 0.0);
      first_pass = std::max(first_pass, (l > s ? c_.boundary(l) : 0.0) + c_.activation(l) + out + c_.tau(l));
      replay_without_grad = std::max(replay_without_grad, kept + out + c_.tau(l));
      backward = std::max(backward, kept + (c_.keeps_output(l) ? out : 0.0) + out + c_.beta(l));
      const std::size_t e = l + 1;
      peak[e] = c_.boundary(s) + std::max(first_pass, std::max(replay_without_grad + c_.boundary(e), backward) + c_.loss_output_bytes);
    }
    return peak;
  }

  struct Choice {
    double recompute = std::numeric_limits<double>::infinity();
    double peak = std::numeric_limits<double>::infinity();
    std::vector<Segment> segments;
  };

  /// The one-level plan with the least recompute whose peak fits `budget` (ties: lower peak).
  Choice best(double budget) const {
    std::vector<std::vector<State>> frontier(n_ + 1);
    std::vector<std::size_t> pruned_size(n_ + 1, 0);
    frontier[0].push_back(State{0, 0, 0, 0, 0, false});
    const auto push = [&](std::size_t at, const State& st) {
      frontier[at].push_back(st);
      if (frontier[at].size() > 2 * pruned_size[at] + 256) {  // keep pending states bounded
        prune(frontier[at]);
        pruned_size[at] = frontier[at].size();
      }
    };
    for (std::size_t s = 0; s < n_; ++s) {
      prune(frontier[s]);
      const std::vector<State>& from = frontier[s];
      if (from.empty()) continue;
      const double plain = plain_peak(s);
      for (std::size_t i = 0; i < from.size(); ++i) {
        if (from[i].pre + plain <= budget) {
          push(s + 1, State{from[i].cost, from[i].pre + c_.boundary(s) + c_.activation(s),
                            std::max(from[i].peak, from[i].pre + plain), s, i, false});
        }
      }
      const std::vector<double> seg = segment_peaks(s);
      const double least_pre = from.back().pre;  // the frontier is sorted by pinned bytes, falling
      double seg_cost = 0, kept = c_.boundary(s);
      for (std::size_t e = s + 1; e <= n_; ++e) {
        // A segment's replay keeps at least its input, its layers' activations and inner
        // boundaries; that only grows with e, so once it cannot fit, no longer segment can.
        kept += c_.activation(e - 1) + (e - 1 > s ? c_.boundary(e - 1) : 0.0);
        if (least_pre + kept > budget) break;
        seg_cost += c_.cost(e - 1);
        // from is sorted by recompute up, pinned bytes down: the states that fit are a suffix
        for (std::size_t i = from.size(); i-- > 0 && from[i].pre + seg[e] <= budget;) {
          push(e, State{from[i].cost + seg_cost, from[i].pre + c_.boundary(s), std::max(from[i].peak, from[i].pre + seg[e]),
                        s, i, true});
        }
      }
    }
    prune(frontier[n_]);
    Choice best;
    const double out = c_.boundary(n_);
    std::size_t pick = frontier[n_].size();
    for (std::size_t i = 0; i < frontier[n_].size(); ++i) {
      const State& st = frontier[n_][i];
      // the loss runs while it holds x_n, then x_n's gradient exists
      const double loss_extra = std::max({out, c_.loss_forward_transient_bytes, c_.loss_backward_transient_bytes});
      const double peak = std::max(st.peak, st.pre + out + c_.loss_bytes + c_.loss_output_bytes + loss_extra);
      if (peak > budget) continue;
      if (st.cost < best.recompute || (st.cost == best.recompute && peak < best.peak)) {
        best.recompute = st.cost;
        best.peak = peak;
        pick = i;
      }
    }
    if (pick == frontier[n_].size()) return best;
    for (std::size_t at = n_, i = pick; at > 0;) {
      const State& st = frontier[at][i];
      if (st.segment) best.segments.push_back(Segment{st.from, at, {}});
      i = st.index;
      at = st.from;
    }
    std::reverse(best.segments.begin(), best.segments.end());
    return best;
  }

 private:
  struct State {
    double cost;       // recompute so far
    double pre;        // bytes pinned by the blocks before this cut
    double peak;       // highest peak so far
    std::size_t from;   // previous cut
    std::size_t index;  // the previous state, in frontier[from]
    bool segment;       // whether [from, here) is a segment (else one plain layer)
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

  const Chain& c_;
  std::size_t n_;
};

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
      : c_(c), n_(c.layers()), k_(std::min<std::size_t>(slots, n_)), exact_(n_ <= kExactLayers), prefix_(n_ + 1, 0) {
    for (std::size_t l = 0; l < n_; ++l) prefix_[l + 1] = prefix_[l] + (exact_ ? c.cost(l) : 1.0);
    const std::size_t ranges = exact_ ? (n_ + 1) * (n_ + 1) : n_ + 1;
    for (Table* table : {&t_, &h_}) {
      table->cost.assign(ranges * (k_ + 1), kUnset);
      table->split.assign(ranges * (k_ + 1), 0);
    }
    if (!exact_) fill_uniform();
  }

  /// The cheaper of the two root shapes, as segments.
  std::vector<Segment> plan() {
    std::vector<Segment> out;
    if (n_ == 1) return out;
    const std::size_t end = h(0, n_ - 1, k_) <= h(0, n_, k_) ? n_ - 1 : n_;
    build_h(0, end, k_, out);
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
      best.cost = forward(s, e) + (e - s > 1 ? get(false, s, e - 1, k).cost : 0.0);  // last layer direct
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
        if (cost(mid + 1) - cost(mid) >= 0) hi = mid;
        else lo = mid + 1;
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

  const Chain& c_;
  std::size_t n_, k_;
  bool exact_;
  std::vector<double> prefix_;
  Table t_, h_;
};

}  // namespace detail
/// Binomial (Revolve-style) nested plan: the fewest recomputed layer forwards such that at most
/// `slots` segment inputs are captured at once and one layer holds activations at a time. With
/// more slots it recomputes less and holds more; with 0 it replays from the chain's input for
/// every layer (the least memory any plan needs, quadratic recompute).
inline Plan optimal(const Chain& chain, std::size_t slots) {
  chain.validate("plan::optimal");
  Plan p = custom(chain, detail::NestedPlanner(chain, slots).plan(), "optimal");
  p.slots = static_cast<int>(slots);
  return p;
}

/// The plan with the least recompute whose predicted peak fits `budget_bytes`: the exact
/// optimum over one-level plans (segments without children, any other layer plain), found by
/// dynamic programming; when a binomial nested plan (optimal()) that fits recomputes less, or
/// no one-level plan fits, the nested plan with the most slots that fits. Throws a PlanError
/// stating the smallest feasible budget when nothing fits.
inline Plan budget(const Chain& chain, double budget_bytes) {
  chain.validate("plan::budget");
  if (!(budget_bytes > 0) || !std::isfinite(budget_bytes)) {
    throw PlanError(remat::detail::cat("plan::budget: the budget must be a positive number of bytes, got ", budget_bytes));
  }
  const auto one_level = detail::OneLevelPlanner(chain).best(budget_bytes);
  Plan best;
  if (!one_level.segments.empty() || one_level.recompute == 0) {
    best = custom(chain, one_level.segments, "budget");
  }
  const bool found = std::isfinite(one_level.recompute);
  // Nested plans: more slots, more memory and less recompute; find the most slots that fit. A
  // plan cannot hold more checkpoints than the budget has room for boundaries.
  double smallest = std::numeric_limits<double>::infinity();
  for (std::size_t j = 1; j < chain.layers(); ++j) smallest = std::min(smallest, chain.boundary(j));
  std::size_t lo = 0, hi = chain.layers();
  // compared as doubles first: a huge budget's quotient may not fit a size_t
  if (smallest > 0 && budget_bytes / smallest < static_cast<double>(hi)) hi = static_cast<std::size_t>(budget_bytes / smallest);
  Plan nested;
  bool nested_found = false;
  while (lo <= hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    Plan p = optimal(chain, mid);
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
    nested.kind = "budget";
    return nested;
  }
  if (found) return best;
  throw PlanError(remat::detail::cat("plan::budget: no plan fits in ", budget_bytes, " bytes; the smallest feasible budget for this chain is ",
                                     optimal(chain, 0).peak_bytes, " bytes (predicted peak of the binomial plan with no checkpoints)"));
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
inline Plan optimal(std::size_t n, std::size_t slots) { return detail::unmeasured(optimal(Chain::uniform(n), slots)); }
inline Plan none(std::size_t n) { return detail::unmeasured(none(Chain::uniform(n))); }

}  // namespace remat::plan
