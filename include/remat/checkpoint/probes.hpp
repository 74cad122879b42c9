#pragma once
/// @file
/// The profiler's own ops (plan::profile, plan::derive_policies): identity ops that read the
/// allocator or the tape's replay clock as a pass reaches them, a copy of a layer's input, an op
/// that saves a layer's input, and a separator that keeps neighbouring segments from chaining.

#include <chrono>
#include <memory>
#include <vector>

#include "remat/core/grads.hpp"
#include "remat/core/memory.hpp"
#include "remat/core/node.hpp"
#include "remat/core/shape_only.hpp"
#include "remat/core/tape.hpp"

namespace remat::plan::detail {

/// The profiler's clocks. Wall seconds, except in a shape-only run (Note [shape-only execution]
/// in core/shape_only.hpp), where nothing is computed and no time passes: there they count the
/// FLOPs of the ops run (Node::forward_flops()), which the planners compare the same way.
/// replay_clock: the tape's replays so far; first_pass_clock: a first forward pass on the tape.
inline double replay_clock(const Tape& tape) noexcept {
  const ReplayStats& stats = tape.replay_stats();
  return is_shape_only() ? stats.replay_flops : stats.replay_seconds;
}
inline double first_pass_clock(const Tape& tape) noexcept {
  if (is_shape_only()) return remat::detail::TapeAccess::state(tape).recorded_flops();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// the profiler's own ops: markers read the allocator as a sweep passes them; a copy stands for
// a layer input held in a buffer of its own; a saver keeps a layer input's bfloat16 copy
inline constexpr OpType kMarker{"profile_marker"};
inline constexpr OpType kCopy{"profile_copy"};
inline constexpr OpType kCopySaver{"profile_copy_saver"};

/// Identity op that reads the allocator when the backward sweep passes it: live bytes, and the
/// peak since the previous marker, which it then resets; given a tape and `replay`, also the
/// tape's replay clock (replay_clock()).
template <class T>
class MemoryMarker final : public Node<T> {
 public:
  MemoryMarker(double* live, double* peak, const Tape* tape = nullptr, double* replay = nullptr)
      : live_(live), peak_(peak), tape_(tape), replay_(replay) {}
  const OpType& op_type() const noexcept override { return kMarker; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override { return in[0]; }
  void backward(const Tensor<T>& gy, remat::Grads<T>& grads) override {
    *peak_ = static_cast<double>(memory::peak_bytes());
    *live_ = static_cast<double>(memory::live_bytes());
    if (tape_) *replay_ = replay_clock(*tape_);
    memory::reset_peak();
    grads.add(0, gy);
  }

 private:
  double* live_;
  double* peak_;
  const Tape* tape_;
  double* replay_;
};

/// Identity op that reads the allocator each time it runs forward, in the first pass and in any
/// replay: a `start` marker records the live bytes and resets the peak, an end marker records the
/// peak since. The last reading is the replay's (a segment replays once per backward pass).
template <class T>
class ForwardMarker final : public Node<T> {
 public:
  ForwardMarker(std::vector<double>* readings, bool start) : readings_(readings), start_(start) {}
  const OpType& op_type() const noexcept override { return kMarker; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    readings_->push_back(static_cast<double>(start_ ? memory::live_bytes() : memory::peak_bytes()));
    if (start_) memory::reset_peak();
    return in[0];
  }
  void backward(const Tensor<T>& gy, remat::Grads<T>& grads) override { grads.add(0, gy); }

 private:
  std::vector<double>* readings_;
  bool start_;
};

/// A copy of its input, in a buffer of its own.
template <class T>
class CopyNode final : public Node<T> {
 public:
  const OpType& op_type() const noexcept override { return kCopy; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override { return in[0].clone(); }
  void backward(const Tensor<T>& gy, remat::Grads<T>& grads) override { grads.add(0, gy); }
};

/// Identity op that saves its input, as a layer that keeps its output's bfloat16 copy does: the
/// next layer's saves of that tensor share the copy (Note [shared copies] in plan/simulator.hpp).
template <class T>
class CopySaver final : public Node<T> {
 public:
  const OpType& op_type() const noexcept override { return kCopySaver; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    this->save(0, in[0]);
    return in[0];
  }
  void backward(const Tensor<T>& gy, remat::Grads<T>& grads) override { grads.add(0, gy); }
};

/// An identity op outside any segment: it keeps the segments on either side of it from
/// chaining (Note [chained segments] in core/tape_state.hpp).
template <class T>
class Separator final : public Node<T> {
 public:
  const OpType& op_type() const noexcept override { return kMarker; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override { return in[0]; }
  void backward(const Tensor<T>& gy, remat::Grads<T>& grads) override { grads.add(0, gy); }
};

}  // namespace remat::plan::detail
