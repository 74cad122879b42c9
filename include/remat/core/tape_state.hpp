#pragma once
/// @file
/// The tape's machinery: the flat node list, checkpoint segments, replay and the backward sweep.
/// Users see it through Tape, Var and checkpoint(); ops reach it through detail::record().
///
/// Note [levels]: a node *saves* (keeps what its backward needs) when the depth of its innermost
/// segment equals the tape's current level: 0 during the first forward pass (nodes outside any
/// checkpoint), d while a segment of depth d is replayed (its own nodes, not its children's). A
/// segment one level deeper *captures* its external inputs: the values of nodes recorded before
/// it that its nodes consume. Those are all its replay will need. Deeper segments capture nothing
/// yet; they capture when their parent is replayed. That is what makes nesting recursive.
///
/// Note [fingerprints]: a node inside a checkpoint that is consumed after its segment closed is
/// an output of that segment; its value is fingerprinted when first consumed, and the replay
/// checks it. In verify mode every node inside a segment is fingerprinted, so the first one
/// that differs names the op at fault.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "remat/core/hash.hpp"
#include "remat/core/node.hpp"
#include "remat/core/save_policy.hpp"
#include "remat/core/trace.hpp"

namespace remat {

/// What a tape's backward pass recomputed (Tape::replay_stats()).
struct ReplayStats {
  std::size_t replays = 0;         ///< segments replayed
  std::size_t replayed_nodes = 0;  ///< ops run again
  double replay_seconds = 0;       ///< wall time spent replaying
  double replay_flops = 0;         ///< the replayed ops' FLOPs, as Node::forward_flops() counts
};

/// How a tape records.
struct TapeOptions {
  /// Seed for random ops (dropout). Each op draws from (seed, its position on the tape), so a
  /// replay draws the same numbers. Unset: the next seed of this thread's sequence
  /// (see manual_seed()), so successive steps draw different masks.
  std::optional<std::uint64_t> seed;
  /// Fingerprint every op output inside checkpoints, so a replay that diverges names the first
  /// op at fault (costs one pass over each output). Off: only segment outputs are checked.
  bool verify_replay = false;
  /// Check every op output and gradient for NaN and infinity and name the first op producing one.
  bool detect_anomaly = false;
};

namespace detail {

struct ThreadSeeds {
  std::uint64_t base = 0;
  std::uint64_t count = 0;
};

inline ThreadSeeds& thread_seeds() noexcept {
  thread_local ThreadSeeds seeds;
  return seeds;
}

inline std::uint64_t next_thread_seed() noexcept {
  ThreadSeeds& s = thread_seeds();
  return mix64(s.base ^ mix64(++s.count));
}

/// A checkpoint segment: the node range [begin, end) whose interior is dropped after the forward
/// pass and replayed from its captured inputs during backward.
struct Segment {
  std::uint32_t begin = 0;
  std::uint32_t end = 0;
  std::uint32_t parent = kNone;
  std::uint32_t depth = 1;  // 1 for a segment outside any other
  std::uint32_t last_child = kNone;
  bool closed = false;
  bool materialized = false;  // replayed in this backward
  SavePolicy policy;          // which of its own nodes keep their outputs (Note [kept nodes])
  std::vector<std::uint32_t> captured;  // external nodes whose values this segment keeps
};

/// Note [one thread per tape]: a tape records and runs backward on the thread that created it,
/// and only there: its node list, segments and gradient slots are not synchronized, and another
/// thread's current tape is another tape. record() and Tape::backward() compare `owner` with the
/// calling thread and raise a UsageError naming both (docs/guide.md, "Threads").
class TapeState {
 public:
  explicit TapeState(const TapeOptions& options)
      : owner(std::this_thread::get_id()),
        seed(options.seed ? *options.seed : next_thread_seed()),
        verify_replay(options.verify_replay),
        detect_anomaly(options.detect_anomaly) {}

  ~TapeState() { clear(); }
  TapeState(const TapeState&) = delete;
  TapeState& operator=(const TapeState&) = delete;

  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(nodes_.size()); }
  NodeBase& node(std::uint32_t id) noexcept { return *nodes_[id]; }
  const NodeBase& node(std::uint32_t id) const noexcept { return *nodes_[id]; }
  NodeTable table() const noexcept { return nodes_.data(); }
  const std::vector<Segment>& segments() const noexcept { return segments_; }
  bool recording_segment() const noexcept { return !open_.empty(); }
  std::uint32_t open_segment_id() const noexcept { return open_.empty() ? kNone : open_.back(); }

  /// Takes ownership of a node and appends it; returns its id.
  std::uint32_t push(std::unique_ptr<NodeBase> n) {
    if (nodes_.size() >= kNone - 1) throw UsageError("tape: more than 4 billion nodes recorded");
    n->id = size();
    if (n->segment == kNone) n->segment = open_segment_id();
    nodes_.push_back(std::move(n));
    return nodes_.back()->id;
  }

  // ---- first forward pass -------------------------------------------------------------------

  /// Prepares a node about to run its first forward: whether it saves, what its enclosing
  /// segment must capture, which segment outputs to fingerprint. `values` are its input values.
  /// A node in a segment whose policy may keep it saves tentatively; after_forward() decides.
  template <class T>
  void before_forward(Node<T>& n, std::span<const Tensor<T>> values) {
    n.segment = open_segment_id();
    n.saving = n.requires_grad && (depth(n.segment) == level_ || policy_may_keep(n.segment));
    if (!policy_may_keep(n.segment)) capture(n, values);
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      NodeBase& in = *nodes_[n.inputs[k]];
      if (!in.has_hash && in.segment != kNone && segments_[in.segment].closed) {
        in.hash = hash_tensor(values[k]);
        in.has_hash = true;
      }
    }
  }

  template <class T>
  void after_forward(Node<T>& n, std::span<const Tensor<T>> values, const Tensor<T>& out) {
    const double flops = n.forward_flops(values, out);
    recorded_flops_ += flops;
    if (policy_may_keep(n.segment)) {
      // Note [kept nodes]: decided from the output, so the save was tentative
      n.note_saved(values);
      n.kept = segments_[n.segment].policy.keeps(OpInfo{n.op_type(), out.shape(), flops});
      if (n.kept && n.can_resave() && reads_recomputed(n)) {
        // replayed like its neighbours, but re-saving from the kept output instead of computing
        n.kept = false;
        n.resaved = true;
        n.replay_reads = true;
        n.value_slot() = out;
      }
      if (!n.kept) {
        n.release_saved();
        n.saving = false;
        capture(n, values);
      }
    }
    if (n.segment != kNone && !n.kept) keep_replay_reads(n, values);
    if (verify_replay && n.segment != kNone) {
      n.hash = hash_tensor(out);
      n.has_hash = true;
    }
    if (detect_anomaly && !all_finite(out)) {
      throw NumericError(cat("anomaly: node ", n.id, " '", n.op_name(),
                             "' produced NaN or infinity in its output of shape ", out.shape(),
                             " during the forward pass"));
    }
  }

  // ---- checkpoint segments ------------------------------------------------------------------

  std::uint32_t open_segment(SavePolicy policy = {}) {
    if (sweeping_ || swept_)
      throw UsageError("checkpoint: cannot open a segment on a tape whose backward pass has run");
    Segment s;
    s.policy = std::move(policy);
    s.begin = size();
    s.parent = open_segment_id();
    s.depth = depth(s.parent) + 1;
    segments_.push_back(std::move(s));
    const auto id = static_cast<std::uint32_t>(segments_.size() - 1);
    if (segments_[id].parent != kNone) segments_[segments_[id].parent].last_child = id;
    open_.push_back(id);
    adopt_tail(id);
    return id;
  }

  /// Note [chained segments]: a segment opened right where its previous sibling closed, under
  /// the same save policy, takes over that sibling's *tail*: the ops after the sibling's last
  /// kept op, provided they read only each other, parameters and the sibling's kept values, and
  /// save nothing that is not already held (a kept value, a parameter). The
  /// boundary between the two segments then sits at the kept values (a GEMM's output under
  /// save_matmuls), not at the tail's output: the tail is replayed from the kept values by the
  /// next segment, so its output (the next segment's input) is not kept through the step. One
  /// segment per layer of `gelu(linear(h))` under save_matmuls then keeps each layer's linear
  /// output alone, not that and h. The sibling's kept values that only the tail read are dropped
  /// when this segment is done with them. The tail must not read the sibling's captured inputs:
  /// whether those are held depends on how the sibling itself was chained, and a layer's
  /// figures must depend on its neighbours only (Note [chained policy layers] in
  /// checkpoint/plan/simulator.hpp).
  void adopt_tail(std::uint32_t s) {
    Segment& seg = segments_[s];
    if (s == 0 || !seg.policy.keeps_anything()) return;
    const std::uint32_t p = s - 1;  // the previous sibling, if it is one and has no children
    Segment& prev = segments_[p];
    if (prev.parent != seg.parent || !prev.closed || prev.end != seg.begin ||
        prev.last_child != kNone || !(prev.policy == seg.policy))
      return;
    std::uint32_t t = prev.end;  // the tail: [t, prev.end)
    while (t > prev.begin && !nodes_[t - 1]->kept && !nodes_[t - 1]->resaved) --t;
    if (t == prev.begin || t == prev.end) return;  // the sibling keeps nothing, or ends kept
    for (std::uint32_t i = t; i < prev.end; ++i) {
      const NodeBase& n = *nodes_[i];
      // what the tail's replay saves must already be held (kept values, leaves), so that none
      // of it outlives the next layer's backward unaccounted
      if (n.saved_fresh) return;
      for (std::uint32_t j : n.inputs) {
        const NodeBase& in = *nodes_[j];
        const bool kept_here =
            j >= prev.begin && in.segment == p && (in.kept || in.resaved) && in.has_value();
        // a parameter, not the step's input: whether the tail reads that would depend on
        // where the layer sits
        const bool parameter = in.is_leaf() && in.parameter_identity() != nullptr;
        if (j < t && !parameter && !kept_here) return;
        if (j >= t && !in.is_leaf() && n.saved_any) return;  // it may save a recomputed value
      }
    }
    ++chained_tails_;
    const std::uint32_t end = prev.end;
    prev.end = t;
    seg.begin = t;
    for (std::uint32_t i = t; i < end; ++i) nodes_[i]->segment = s;
    for (std::uint32_t i = t; i < end; ++i)
      capture_inputs(*nodes_[i], [&](std::size_t k) {
        REMAT_ASSERT(false, "a chained segment's tail (node ", i, ") reads input ", k,
                     ", a value nobody holds");
      });
    // the sibling's kept values that only its tail read need not wait for its replay any more
    for (std::uint32_t i = prev.begin; i < t; ++i) {
      NodeBase& n = *nodes_[i];
      if ((n.kept || n.resaved) && n.segment == p) n.replay_reads = false;
    }
    for (std::uint32_t i = prev.begin; i < t; ++i) {
      const NodeBase& n = *nodes_[i];
      if (n.is_leaf() || n.kept || n.segment != p) continue;  // a replayed op (resaved too)
      for (std::uint32_t j : n.inputs) {
        NodeBase& in = *nodes_[j];
        if (j >= prev.begin && in.segment == p && (in.kept || in.resaved)) in.replay_reads = true;
      }
    }
  }

  void close_segment(std::uint32_t id) {
    if (open_.empty() || open_.back() != id) {
      throw UsageError(
          cat("checkpoint: segment ", id, " closed out of order; segments must nest like scopes"));
    }
    segments_[id].end = size();
    segments_[id].closed = true;
    open_.pop_back();
  }

  /// Whether node `out` depends on any of `sources` through nodes recorded since `begin` (one
  /// forward pass over that range).
  bool depends_on(std::uint32_t out, std::span<const std::uint32_t> sources,
                  std::uint32_t begin) const {
    if (out < begin) return std::find(sources.begin(), sources.end(), out) != sources.end();
    std::vector<char> reached(size() - begin, 0);
    const auto is_reached = [&](std::uint32_t id) {
      return id >= begin ? reached[id - begin] != 0
                         : std::find(sources.begin(), sources.end(), id) != sources.end();
    };
    for (std::uint32_t i = begin; i <= out; ++i) {
      for (std::uint32_t j : nodes_[i]->inputs) {
        if (is_reached(j)) {
          reached[i - begin] = 1;
          break;
        }
      }
    }
    return reached[out - begin] != 0;
  }

  // ---- backward -----------------------------------------------------------------------------

  const ReplayStats& stats() const noexcept { return stats_; }
  /// The FLOPs of the ops recorded so far (Node::forward_flops()): what a shape-only profile
  /// prices layers with, having no time to measure (Note [shape-only execution]).
  double recorded_flops() const noexcept { return recorded_flops_; }
  /// How many segments took over their previous sibling's tail (Note [chained segments]).
  std::size_t chained_tails() const noexcept { return chained_tails_; }

  bool swept() const noexcept { return swept_; }
  bool sweeping() const noexcept { return sweeping_; }

  /// The backward sweep: one reverse loop from `root`, whose gradient must already be seeded.
  /// Replays each checkpoint segment the first time the sweep needs one of its nodes, and frees
  /// every node's saved tensors and gradient as soon as the sweep has passed it.
  void sweep(std::uint32_t root) {
    sweeping_ = true;
    struct Done {
      TapeState* t;
      ~Done() {
        t->sweeping_ = false;
        t->swept_ = true;
        t->level_ = 0;
      }
    } done{this};
    for (std::uint32_t i = size(); i-- > root + 1;) release_after_sweep(*nodes_[i]);
    std::size_t unfinished = segments_.size();
    for (std::uint32_t i = root + 1; i-- > 0;) {
      NodeBase& n = *nodes_[i];
      if (n.requires_grad && !n.is_leaf() && n.has_grad()) {
        if (!n.kept) {
          swept_down_to_ = i;
          materialize(n);  // a kept node's backward has what it saved (Note [kept nodes])
        }
        TraceSpan span(TracePhase::backward, n.op_name(), n.id);
        n.run_backward(table());
        if (detect_anomaly) check_input_grads(n);
      }
      release_after_sweep(n);
      while (unfinished > 0 && segments_[unfinished - 1].begin >= i)
        finish(segments_[--unfinished]);
      if (on_swept) on_swept(n);
    }
  }

  /// Frees every node; the tape can record no more.
  void clear() noexcept {
    // Nodes own no other nodes (they name their inputs by id), so destroying the list one
    // element after another is the whole teardown: no recursion however long the chain.
    nodes_.clear();
    segments_.clear();
    open_.clear();
  }

  /// Whether the calling thread is the one that created this tape (Note [one thread per tape]).
  bool on_owner_thread() const noexcept { return std::this_thread::get_id() == owner; }

  const std::thread::id owner;  ///< the thread that created the tape
  const std::uint64_t seed;
  const bool verify_replay;
  const bool detect_anomaly;
  bool ended = false;
  /// Called with each node the backward sweep has passed, replays included: no node left to run
  /// writes into it. A parameter's gradient is final once its first leaf is passed, which is how
  /// dist::DataParallel reduces gradients while the sweep still runs.
  std::function<void(const NodeBase&)> on_swept;

 private:
  std::uint32_t depth(std::uint32_t segment) const noexcept {
    return segment == kNone ? 0 : segments_[segment].depth;
  }

  bool policy_may_keep(std::uint32_t segment) const noexcept {
    return segment != kNone && segments_[segment].policy.keeps_anything();
  }

  /// capture_inputs() in the first forward pass, from the input values the op was given.
  template <class T>
  void capture(Node<T>& n, std::span<const Tensor<T>> values) {
    capture_inputs(n, [&](std::size_t k) {
      node_cast<T>(nodes_[n.inputs[k]].get()).value_slot() = values[k];
    });
  }

  /// The segment at `d` that contains `segment` (which must be at least that deep).
  std::uint32_t ancestor_at(std::uint32_t segment, std::uint32_t d) const noexcept {
    while (segments_[segment].depth > d) segment = segments_[segment].parent;
    return segment;
  }

  /// See Note [levels]. `fill(k)` stores input k's value in its node when the node holds none.
  template <class Fill>
  void capture_inputs(NodeBase& n, Fill&& fill) {
    if (n.kept || depth(n.segment) <= level_) return;  // a kept node is never replayed
    const std::uint32_t c = ancestor_at(n.segment, level_ + 1);
    Segment& seg = segments_[c];
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      NodeBase& in = *nodes_[n.inputs[k]];
      if (n.inputs[k] >= seg.begin || in.is_leaf() || in.last_capture == c) continue;
      in.last_capture = c;
      ++in.keep_count;
      seg.captured.push_back(n.inputs[k]);
      if (!in.has_value()) fill(k);
    }
  }

  void materialize(const NodeBase& n) {
    chain_.clear();  // the unmaterialized segments around n, innermost first
    for (std::uint32_t s = n.segment; s != kNone && !segments_[s].materialized;
         s = segments_[s].parent)
      chain_.push_back(s);
    for (std::size_t i = chain_.size(); i-- > 0;) replay(chain_[i]);
  }

  /// Runs the segment's recorded recipes again from its captured inputs (Note [levels]), checks
  /// the fingerprints (Note [fingerprints]), and drops each recomputed value after its last use
  /// inside the segment unless a node saved it or a child segment captured it.
  ///
  /// Note [trailing child]: when the segment ends with a child segment, the replay stops where
  /// that child begins and only captures the child's inputs: nothing after the child needs its
  /// values, and the child replays itself when the sweep reaches it. Without this, every level
  /// of a nested plan would recompute its last child twice; with it, a right-nested plan costs
  /// what a binomial (Revolve) schedule counts.
  void replay(std::uint32_t s) {
    TraceSpan span(true, s);
    const auto started = std::chrono::steady_clock::now();
    const std::uint32_t begin = segments_[s].begin;
    const std::uint32_t end = segments_[s].end;
    const std::uint32_t trailing = trailing_child(s);
    const std::uint32_t stop = trailing == kNone ? end : segments_[trailing].begin;
    const std::uint32_t outer_level = level_;
    level_ = segments_[s].depth;
    std::vector<std::uint32_t> last_use(end - begin, kNone);
    for (std::uint32_t i = begin; i < end; ++i) {
      for (std::uint32_t j : nodes_[i]->inputs) {
        if (j >= begin) last_use[j - begin] = i;
      }
    }
    const auto missing = [&](const NodeBase& n, std::size_t k) {
      REMAT_ASSERT(false, "replay of segment ", s, " lacks the value of node ", n.inputs[k]);
    };
    for (std::uint32_t i = begin; i < stop; ++i) {
      NodeBase& n = *nodes_[i];
      if (!n.is_leaf() && !n.kept) {  // a kept node's value is there (Note [kept nodes])
        // A node the sweep has already passed (it got no gradient: its value is dead, or feeds
        // only nodes without gradients) runs for its value alone: what it saved would never be
        // released, since the sweep releases a node's saved tensors once, as it passes it.
        const bool passed = sweeping_ && i > swept_down_to_;
        n.saving = n.requires_grad && depth(n.segment) == level_ && !passed;
        capture_inputs(n, [&](std::size_t k) { missing(n, k); });
        {
          TraceSpan op(TracePhase::replay, n.op_name(), n.id);
          stats_.replay_flops += n.replay(table());
        }
        ++stats_.replayed_nodes;
        if (!n.resaved) check_replayed(s, n);  // a resaved node recomputed nothing
      }
      for (std::uint32_t j : n.inputs) {
        if (j >= begin && last_use[j - begin] == i) drop_transient(*nodes_[j]);
      }
      if (last_use[i - begin] == kNone) drop_transient(n);
    }
    for (std::uint32_t i = stop; i < end; ++i)
      capture_inputs(*nodes_[i], [&](std::size_t k) { missing(*nodes_[i], k); });
    for (std::uint32_t i = begin; i < stop; ++i) {
      if (last_use[i - begin] != kNone && last_use[i - begin] >= stop) drop_transient(*nodes_[i]);
    }
    level_ = outer_level;
    segments_[s].materialized = true;
    for (std::uint32_t i = begin; i < end; ++i) {
      if ((nodes_[i]->kept || nodes_[i]->resaved) && nodes_[i]->segment == s)
        drop_transient(*nodes_[i]);  // no replay reads it any more
    }
    ++stats_.replays;
    stats_.replay_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }

  /// The last child of segment s if it ends where s ends (Note [trailing child]), else kNone.
  std::uint32_t trailing_child(std::uint32_t s) const noexcept {
    const std::uint32_t c = segments_[s].last_child;
    return c != kNone && segments_[c].end == segments_[s].end ? c : kNone;
  }

  void check_replayed(std::uint32_t s, const NodeBase& n) const {
    if (n.has_hash && n.value_hash() != n.hash) {
      const Segment& seg = segments_[s];
      throw ReplayError(cat("checkpoint replay diverged: segment ", s, " (nodes ", seg.begin, "..",
                            seg.end - 1, ", depth ", seg.depth, "): node ", n.id, " '", n.op_name(),
                            "' recomputed a value that differs from its forward pass",
                            verify_replay ? " (the first op that diverged)"
                                          : " (a segment output; set TapeOptions::verify_replay to "
                                            "name the first op that diverged)",
                            ". Ops inside a checkpoint must be deterministic, and their inputs "
                            "(parameters too) must not "
                            "change between the forward and the backward pass"));
    }
    if (detect_anomaly && !n.value_is_finite()) {
      throw NumericError(cat("anomaly: node ", n.id, " '", n.op_name(),
                             "' produced NaN or infinity during the replay of segment ", s));
    }
  }

  void check_input_grads(const NodeBase& n) const {
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const NodeBase& in = *nodes_[n.inputs[k]];
      if (in.requires_grad && !in.grad_is_finite()) {
        std::ostringstream shape;
        in.print_value_shape(shape);
        throw NumericError(cat("anomaly: backward of node ", n.id, " '", n.op_name(),
                               "' produced NaN or infinity in the gradient of its input ", k,
                               " (node ", in.id, " '", in.op_name(), "', shape ", shape.str(),
                               ")"));
      }
    }
  }

  /// Releases n's value slot when nothing reads it any more. A kept node's value stays while a
  /// replay still to come reads it: until its own segment has been replayed (Note [kept nodes]).
  void drop_transient(NodeBase& n) noexcept {
    if (n.is_leaf() || n.keep_count != 0) return;
    if ((n.kept || n.resaved) && n.replay_reads && !segments_[n.segment].materialized) return;
    n.release_value();
  }

  /// Whether one of n's inputs will be recomputed by a replay of n's top-level segment: then a
  /// kept n re-saves that recomputed value rather than holding its first-pass one as well.
  bool reads_recomputed(const NodeBase& n) const noexcept {
    const std::uint32_t top = ancestor_at(n.segment, 1);
    for (std::uint32_t j : n.inputs) {
      const NodeBase& in = *nodes_[j];
      if (!in.is_leaf() && !in.kept && in.segment != kNone && ancestor_at(in.segment, 1) == top)
        return true;
    }
    return false;
  }

  /// n will be replayed: its kept inputs in n's top-level segment keep their values for that
  /// replay (the others are captured like any input from outside). A kept value nothing
  /// replayed reads is held only by what saved it, as without a checkpoint.
  template <class T>
  void keep_replay_reads(const Node<T>& n, std::span<const Tensor<T>> values) {
    const std::uint32_t top = ancestor_at(n.segment, 1);
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      Node<T>& in = node_cast<T>(nodes_[n.inputs[k]].get());
      if (!in.kept || ancestor_at(in.segment, 1) != top) continue;
      in.replay_reads = true;
      if (!in.has_value()) in.value_slot() = values[k];
    }
  }

  void release_after_sweep(NodeBase& n) noexcept {
    n.release_saved();
    if (n.is_leaf()) return;  // leaves keep their value; an input's gradient is for the user
    n.release_grad();
    drop_transient(
        n);  // a kept value a replay still reads stays (a node without a gradient is passed early)
  }

  void finish(Segment& seg) noexcept {
    for (std::uint32_t j : seg.captured) {
      NodeBase& in = *nodes_[j];
      if (--in.keep_count == 0) drop_transient(in);
    }
    seg.captured.clear();
    // The sweep has passed the segment: no replay reads its kept values any more, even when none
    // ran (its replayed ops needed no gradient). Without this they would live to the step's end.
    if (!seg.materialized && seg.policy.keeps_anything()) {
      seg.materialized = true;
      const auto id = static_cast<std::uint32_t>(&seg - segments_.data());
      for (std::uint32_t i = seg.begin; i < seg.end; ++i) {
        if ((nodes_[i]->kept || nodes_[i]->resaved) && nodes_[i]->segment == id)
          drop_transient(*nodes_[i]);
      }
    }
  }

  std::vector<std::unique_ptr<NodeBase>> nodes_;
  std::vector<Segment> segments_;
  std::vector<std::uint32_t> open_;
  std::vector<std::uint32_t> chain_;  // scratch for materialize()
  std::uint32_t level_ = 0;           // Note [levels]
  std::uint32_t swept_down_to_ = 0;   // the node whose gradient asked for the running replay
  ReplayStats stats_;
  double recorded_flops_ = 0;
  std::size_t chained_tails_ = 0;
  bool sweeping_ = false;
  bool swept_ = false;
};

}  // namespace detail

/// Restarts this thread's sequence of tape seeds, for reproducible dropout across runs.
inline void manual_seed(std::uint64_t seed) noexcept {
  detail::thread_seeds() = detail::ThreadSeeds{seed, 0};
}

}  // namespace remat
