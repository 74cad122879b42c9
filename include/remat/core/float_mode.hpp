#pragma once
/// @file
/// The floating-point mode remat computes in: subnormal numbers flushed to zero by default.
///
/// Note [flushing denormals]: gradients through a deep tanh chain and AdamW's second moments
/// drift into the subnormal range (below 1.2e-38 in float), and many x86 cores run arithmetic on
/// subnormals tens of times slower (the issue measured `deep` at 1.46 s a step on an Intel Xeon
/// against 0.51 s flushed). TensorFlow flushes them in its compute threads, PyTorch offers
/// torch.set_flush_denormal. remat sets the MXCSR's flush-to-zero (FTZ: subnormal results become
/// 0) and denormals-are-zero (DAZ: subnormal inputs read as 0) bits while its kernels run, on the
/// calling thread and on its pool's workers, and restores the caller's mode when the kernel
/// returns: a FloatModeGuard sits in parallel_for (every element-wise loop, reduction, softmax,
/// optimizer update) and in gemm (OpenBLAS's own worker threads keep their mode; OpenBLAS offers
/// no way to set it). Off (set_flush_denormals(false)), remat clears both bits instead, so a
/// kernel computes the same on every thread whatever mode the caller runs in: results stay
/// bitwise independent of which thread ran which chunk, in both modes.

#include <atomic>

#if defined(__SSE__) || defined(__x86_64__)
#define REMAT_HAS_MXCSR 1
#include <xmmintrin.h>
#else
#define REMAT_HAS_MXCSR 0
#endif

namespace remat {
namespace detail {

inline std::atomic<bool>& flush_denormals_setting() noexcept {
  static std::atomic<bool> on{true};
  return on;
}

}  // namespace detail

/// Whether remat's kernels flush subnormal numbers to zero (on by default).
inline bool flush_denormals() noexcept {
  return detail::flush_denormals_setting().load(std::memory_order_relaxed);
}

/// Turns flushing of subnormal numbers in remat's kernels on or off (Note [flushing denormals]).
/// Applies to kernels started after the call; the caller's own floating-point mode is never
/// changed by remat either way.
inline void set_flush_denormals(bool on) noexcept {
  detail::flush_denormals_setting().store(on, std::memory_order_relaxed);
}

namespace detail {

/// While alive, this thread computes in remat's floating-point mode; the thread's previous mode
/// comes back when it ends. Costs two reads of the MXCSR when the mode is already right.
class FloatModeGuard {
 public:
  FloatModeGuard() noexcept {
#if REMAT_HAS_MXCSR
    saved_ = _mm_getcsr();
    const unsigned want = flush_denormals() ? (saved_ | kFlushBits) : (saved_ & ~kFlushBits);
    if (want != saved_) {
      _mm_setcsr(want);
      changed_ = true;
    }
#endif
  }
  ~FloatModeGuard() {
#if REMAT_HAS_MXCSR
    // the caller's control bits back; the sticky exception flags raised meanwhile stay raised
    if (changed_) _mm_setcsr((saved_ & ~kStatusBits) | (_mm_getcsr() & kStatusBits));
#endif
  }
  FloatModeGuard(const FloatModeGuard&) = delete;
  FloatModeGuard& operator=(const FloatModeGuard&) = delete;

  /// MXCSR bits: flush-to-zero (bit 15) and denormals-are-zero (bit 6).
  static constexpr unsigned kFlushBits = 0x8040;
  /// MXCSR bits 0-5: the sticky exception flags (invalid, denormal, divide by zero, overflow,
  /// underflow, precision), status rather than mode.
  static constexpr unsigned kStatusBits = 0x3f;

 private:
  unsigned saved_ = 0;
  bool changed_ = false;
};

}  // namespace detail
}  // namespace remat
