#pragma once
/// @file
/// checkpoint(fn, inputs...) and CheckpointScope: mark part of the forward pass as a segment
/// whose interior activations are dropped after the forward pass and replayed from its inputs
/// when the backward pass reaches them.
///
/// The replay runs the recorded ops again, not the user's code (see docs/design.md): code inside
/// a segment runs once per step, so its side effects (counters, running statistics, logging)
/// happen once; random ops draw the same numbers; parameters inside receive gradients whether or
/// not the segment's inputs need them. Segments nest to any depth.

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "remat/core/record.hpp"

namespace remat {

/// Records everything the current thread's tape records while the scope lives as one checkpoint
/// segment. Works around any code, shaped as a function or not:
///
///     { remat::CheckpointScope scope; h = block(h); }
///
/// Does nothing when no tape is recording (no tape, or under NoGradGuard).
class CheckpointScope {
 public:
  /// A segment on this thread's current tape.
  CheckpointScope() : CheckpointScope(detail::current_tape_slot()) {}

  /// A segment on the tape `on` belongs to (or the current tape, if `on` is not on one).
  template <class T>
  explicit CheckpointScope(const Var<T>& on)
      : CheckpointScope(on.tape_state() ? on.tape_state() : detail::current_tape_slot()) {}

  ~CheckpointScope() { close(); }
  CheckpointScope(const CheckpointScope&) = delete;
  CheckpointScope& operator=(const CheckpointScope&) = delete;

  /// Ends the segment before the scope does. Segments must close in the reverse order they
  /// opened; one closed out of order (possible only with scopes on the heap) stays open and the
  /// tape's backward() reports it.
  void close() noexcept {
    if (!tape_) return;
    if (!tape_->ended && tape_->open_segment_id() == id_) tape_->close_segment(id_);
    tape_.reset();
  }

  /// Whether a segment is open (false when nothing records).
  bool active() const noexcept { return tape_ != nullptr; }

  /// Tag for a scope on a given tape state (internal).
  struct OnTape {
    std::shared_ptr<detail::TapeState> tape;
  };
  static OnTape on_tape(std::shared_ptr<detail::TapeState> tape) { return OnTape{std::move(tape)}; }
  explicit CheckpointScope(OnTape t) : CheckpointScope(std::move(t.tape)) {}

 private:
  explicit CheckpointScope(std::shared_ptr<detail::TapeState> tape) {
    if (!tape || tape->ended || !grad_enabled()) return;
    id_ = tape->open_segment();
    tape_ = std::move(tape);
  }

  std::shared_ptr<detail::TapeState> tape_;
  std::uint32_t id_ = detail::kNone;
};

namespace detail {

template <class T>
const std::shared_ptr<TapeState>* tape_of(const Var<T>& v) {
  return v.tape_state() ? &v.tape_state() : nullptr;
}
inline const std::shared_ptr<TapeState>* tape_of(...) { return nullptr; }

/// The tape of the first argument that is a Var on a tape, else the current tape.
template <class... Args>
std::shared_ptr<TapeState> tape_of_arguments(const Args&... args) {
  const std::shared_ptr<TapeState>* found = nullptr;
  ((found = found ? found : tape_of(args)), ...);
  return found ? *found : current_tape_slot();
}

}  // namespace detail

/// Runs fn(inputs...) as one checkpoint segment and returns what it returns (a Var, a tuple of
/// Vars, anything). The inputs are usually Vars; values fn uses without taking them as inputs
/// (captured Vars of the same tape, parameters, constants) work as well: the segment keeps
/// whatever its replay needs.
template <class Fn, class... Args>
auto checkpoint(Fn&& fn, Args&&... inputs) {
  CheckpointScope scope(CheckpointScope::on_tape(detail::tape_of_arguments(inputs...)));
  return std::invoke(std::forward<Fn>(fn), std::forward<Args>(inputs)...);
}

}  // namespace remat
