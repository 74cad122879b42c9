#pragma once
/// @file
/// Shape-only execution: run a model's step with tensors that have a shape and no data, so the
/// allocator counts exactly what a real step would hold, without the memory or the arithmetic.
///
/// Note [shape-only execution]: while a ShapeOnly scope lives on a thread, every tensor that
/// thread makes is counted by the allocator (in the scope's own counters, which memory::
/// live_bytes(), peak_bytes() and memory::Probe read on that thread) and gets no buffer. Ops run
/// through the same code as in a real step: record() prepares the node, the tape's save and free
/// rules, checkpoint segments, replays, save policies and the optimizer's state all work as
/// always; only an op's arithmetic is skipped. Each op allocates its output, what it saves and
/// its scratch exactly as it does in a real run, then returns before computing (its forward and
/// backward test remat::is_shape_only()). The counted peak is therefore the real step's, to the
/// byte, as long as no allocation depends on the values, and none in remat does: sizes come from
/// shapes. What a shape-only run cannot do is read values: Tensor::item() and anything that
/// branches on data refuse (a loss is not known, so a loop that stops on it cannot run).
///
/// A custom op joins by overriding Node::runs_shape_only() (after making its forward() and
/// backward() allocate and return when is_shape_only()); a shape-only run refuses any other
/// custom op by name rather than reading null buffers.

#include <cstddef>
#include <memory>

#include "remat/core/error.hpp"
#include "remat/core/memory.hpp"

namespace remat {

/// True while this thread runs shape-only (inside a ShapeOnly scope).
inline bool is_shape_only() noexcept { return detail::shape_only(); }

/// Runs this thread shape-only while it lives (Note [shape-only execution]):
///
///     remat::ShapeOnly run;
///     auto model = remat::nn::Llama<float>::uninitialized(config);  // no weights allocated
///     remat::Tape tape;
///     ... forward, backward, optimizer step, as in training ...
///     run.peak_bytes();  // what the real step's allocator would have counted at its peak
///
/// Tensors made in the scope may outlive it (their bytes leave the scope's count when they die);
/// they have no data (Tensor::has_data()). Scopes do not nest.
class ShapeOnly {
 public:
  ShapeOnly() {
    if (detail::shape_only()) {
      throw UsageError("ShapeOnly: this thread already runs shape-only; scopes do not nest");
    }
    detail::shape_only_counters() = counters_;
  }
  ~ShapeOnly() { detail::shape_only_counters().reset(); }
  ShapeOnly(const ShapeOnly&) = delete;
  ShapeOnly& operator=(const ShapeOnly&) = delete;

  /// Bytes the run's live tensors would hold.
  std::size_t live_bytes() const noexcept {
    return counters_->live.load(std::memory_order_relaxed);
  }
  /// The most bytes that would have been live at once since the scope began (or the last
  /// memory::reset_peak() inside it).
  std::size_t peak_bytes() const noexcept {
    return counters_->peak.load(std::memory_order_relaxed);
  }
  /// Tensors allocated in the run.
  std::size_t allocation_count() const noexcept {
    return counters_->allocations.load(std::memory_order_relaxed);
  }

 private:
  std::shared_ptr<detail::MemoryCounters> counters_ = std::make_shared<detail::MemoryCounters>();
};

}  // namespace remat
