#pragma once
/// @file
/// What a Parameter is underneath: its value, its accumulated gradient, and which thread's tapes
/// may write that gradient. Shared by every handle of the parameter (Parameter, and the leaves
/// tapes record for it).
///
/// Note [one trainer per parameter]: two threads whose live tapes both use a parameter that
/// needs a gradient would accumulate into its gradient buffer at the same time, a data race that
/// corrupts the sum silently. So a tape that records a use of such a parameter *claims* it for
/// its thread until the tape ends; a tape of another thread that tries to record a use while
/// the claim holds gets a UsageError. Tapes of one thread (nested tapes, plan::profile inside a
/// step) share the claim: they run one after the other. Frozen parameters and computations
/// under NoGradGuard claim nothing: reading values from several threads is safe.

#include <cstddef>
#include <mutex>
#include <thread>

#include "remat/core/tensor.hpp"

namespace remat::detail {

/// Which thread's live tapes use a parameter for its gradient (Note [one trainer per parameter]).
class ThreadClaim {
 public:
  /// Adds a claim for the calling thread; false (and nothing added) when live tapes of another
  /// thread hold claims.
  bool acquire() {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::thread::id me = std::this_thread::get_id();
    if (count_ > 0 && owner_ != me) return false;
    owner_ = me;
    ++count_;
    return true;
  }

  void release() noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (count_ > 0) --count_;
  }

 private:
  std::mutex mutex_;
  std::thread::id owner_;
  std::size_t count_ = 0;
};

/// A persistent value and its accumulated gradient, shared by every handle of a Parameter.
/// zero_grad() only marks the gradient stale: the next backward overwrites the buffer instead of
/// allocating a new one, so a training loop's steady-state steps allocate no parameter gradients.
template <class T>
struct ParamState {
  ParamState(Tensor<T> initial, bool needs_grad)
      : value(std::move(initial)), requires_grad(needs_grad) {}

  Tensor<T> value;
  Tensor<T> grad;
  bool requires_grad = true;
  bool grad_valid = false;  // grad holds a gradient (not just a reusable buffer)
  ThreadClaim trainers;     // Note [one trainer per parameter]
};

}  // namespace remat::detail
