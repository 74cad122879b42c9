#pragma once
/// @file
/// Grad mode: whether ops record onto a tape. NoGradGuard turns recording off for a scope on
/// this thread (evaluation, metrics, parameter updates).

namespace remat {
namespace detail {

inline bool& grad_mode_flag() noexcept {
  thread_local bool enabled = true;
  return enabled;
}

}  // namespace detail

/// True when ops on this thread record onto the current tape.
inline bool grad_enabled() noexcept { return detail::grad_mode_flag(); }

/// Turns recording off on this thread until the guard ends; ops then only compute values.
class NoGradGuard {
 public:
  NoGradGuard() noexcept : previous_(detail::grad_mode_flag()) { detail::grad_mode_flag() = false; }
  ~NoGradGuard() { detail::grad_mode_flag() = previous_; }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace remat
