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
#include <optional>
#include <tuple>
#include <vector>
#include <type_traits>
#include <utility>

#include "remat/core/record.hpp"
#include "remat/core/save_policy.hpp"

namespace remat {
namespace detail {
struct ScopeAccess;
}

/// Records everything the current thread's tape records while the scope lives as one checkpoint
/// segment. Works around any code, shaped as a function or not:
///
///     { remat::CheckpointScope scope; h = block(h); }
///
/// A save policy keeps some ops' outputs from the first forward pass instead of replaying them
/// (core/save_policy.hpp): `remat::CheckpointScope scope(remat::save_matmuls());`.
///
/// Does nothing when no tape is recording (no tape, or under NoGradGuard).
class CheckpointScope {
 public:
  /// A segment on this thread's current tape.
  CheckpointScope() : CheckpointScope(detail::current_tape_slot()) {}

  /// A segment on this thread's current tape whose ops `policy` keeps are not replayed.
  explicit CheckpointScope(SavePolicy policy)
      : CheckpointScope(detail::current_tape_slot(), std::move(policy)) {}

  /// A segment on the tape `on` belongs to (or the current tape, if `on` is not on one).
  template <class T>
  explicit CheckpointScope(const Var<T>& on) : CheckpointScope(tape_or_current(on)) {}

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
    span_.reset();
  }

  /// Whether a segment is open (false when nothing records).
  bool active() const noexcept { return tape_ != nullptr; }

 private:
  friend struct detail::ScopeAccess;

  /// The tape `on` belongs to, else this thread's current one.
  template <class T>
  static std::shared_ptr<detail::TapeState> tape_or_current(const Var<T>& on) {
    const std::shared_ptr<detail::TapeState>& tape = detail::VarAccess::tape_state(on);
    return tape ? tape : detail::current_tape_slot();
  }

  /// A segment on `tape` (checkpoint() and checkpoint_sequential() name the tape of their inputs).
  explicit CheckpointScope(std::shared_ptr<detail::TapeState> tape, SavePolicy policy = {}) {
    if (!tape || tape->ended || !grad_enabled()) return;
    if (!tape->on_owner_thread()) {
      throw UsageError(
          "checkpoint: the segment's tape belongs to another thread (the one that created that "
          "Tape); "
          "a tape records on the thread that created it");
    }
    id_ = tape->open_segment(std::move(policy));
    tape_ = std::move(tape);
    span_.emplace(false, id_);
  }

  std::shared_ptr<detail::TapeState> tape_;
  std::optional<detail::TraceSpan> span_;  // the segment on the memory timeline (core/trace.hpp)
  std::uint32_t id_ = detail::kNone;
};

namespace detail {

/// How checkpoint() and checkpoint_sequential() open a scope on a given tape.
struct ScopeAccess {
  static CheckpointScope make(std::shared_ptr<TapeState> tape, SavePolicy policy = {}) {
    return CheckpointScope(std::move(tape), std::move(policy));
  }
  static std::unique_ptr<CheckpointScope> open(std::shared_ptr<TapeState> tape,
                                               SavePolicy policy = {}) {
    return std::unique_ptr<CheckpointScope>(
        new CheckpointScope(std::move(tape), std::move(policy)));
  }
};

template <class T>
const std::shared_ptr<TapeState>* tape_of(const Var<T>& v) {
  const auto& tape = detail::VarAccess::tape_state(v);
  return tape ? &tape : nullptr;
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

namespace detail {

template <class T>
void collect_node(const Var<T>& v, const std::shared_ptr<TapeState>& tape,
                  std::vector<std::uint32_t>& ids) {
  if (detail::VarAccess::tape_state(v) == tape) ids.push_back(detail::VarAccess::node_id(v));
}
template <class Other>
void collect_node(const Other&, const std::shared_ptr<TapeState>&, std::vector<std::uint32_t>&) {}
template <class... Vs>
void collect_node(const std::tuple<Vs...>& t, const std::shared_ptr<TapeState>& tape,
                  std::vector<std::uint32_t>& ids) {
  std::apply([&](const auto&... v) { (collect_node(v, tape, ids), ...); }, t);
}
template <class A, class B>
void collect_node(const std::pair<A, B>& p, const std::shared_ptr<TapeState>& tape,
                  std::vector<std::uint32_t>& ids) {
  collect_node(p.first, tape, ids);
  collect_node(p.second, tape, ids);
}

/// A checkpointed function that takes Vars but returns values that depend on none of them
/// almost always read a different Var than it was given: gradients would then silently miss
/// the inputs. Throws a UsageError saying so.
/// `sources`: the inputs' nodes, collected before fn ran (it may take them by value and move
/// from them).
template <class Result>
void check_depends_on_inputs(const std::shared_ptr<TapeState>& tape, std::uint32_t begin,
                             const Result& result, const std::vector<std::uint32_t>& sources) {
  std::vector<std::uint32_t> outputs;
  collect_node(result, tape, outputs);
  if (sources.empty() || outputs.empty()) return;
  for (std::uint32_t out : outputs) {
    if (tape->depends_on(out, sources, begin)) return;
  }
  throw UsageError(cat(
      "checkpoint: the function's result depends on none of the ", sources.size(),
      " Var(s) it was given (their gradients would silently be zero). Pass the Vars the function ",
      "reads as its inputs, or call it without checkpoint()"));
}

}  // namespace detail

/// Runs fn(inputs...) as one checkpoint segment and returns what it returns (a Var, a tuple of
/// Vars, anything). The inputs are usually Vars; values fn uses without taking them as inputs
/// (captured Vars of the same tape, parameters, constants) work as well: the segment keeps
/// whatever its replay needs. Throws a UsageError when fn takes Vars but its result depends on
/// none of them (it probably read a different Var).
template <class Fn, class... Args>
requires(!std::is_same_v<std::remove_cvref_t<std::tuple_element_t<0, std::tuple<Args..., void>>>,
                         SavePolicy>) auto checkpoint(Fn&& fn, Args&&... inputs) {
  return checkpoint(std::forward<Fn>(fn), SavePolicy(), std::forward<Args>(inputs)...);
}

/// checkpoint() whose segment keeps the outputs of the ops `policy` keeps (and what their backward
/// needs) from the forward pass and replays only the others: checkpoint(block, save_matmuls(), x).
/// Gradients are the same bits under every policy.
template <class Fn, class... Args>
auto checkpoint(Fn&& fn, SavePolicy policy, Args&&... inputs) {
  const std::shared_ptr<detail::TapeState> tape = detail::tape_of_arguments(inputs...);
  const std::uint32_t begin = tape ? tape->size() : 0;
  std::vector<std::uint32_t> sources;
  (detail::collect_node(inputs, tape, sources), ...);
  CheckpointScope scope = detail::ScopeAccess::make(tape, std::move(policy));
  auto result = std::invoke(std::forward<Fn>(fn), std::forward<Args>(inputs)...);
  if (scope.active()) detail::check_depends_on_inputs(tape, begin, result, sources);
  return result;
}

}  // namespace remat
