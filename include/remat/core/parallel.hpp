#pragma once
/// @file
/// Thread count for remat's kernels: OpenMP for element-wise loops, OpenBLAS for GEMMs. Every
/// parallel loop splits its range statically, so results never depend on scheduling.

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "remat/core/config.hpp"
#include "remat/core/error.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

#if REMAT_USE_BLAS
#include <cblas.h>  // OpenBLAS's: declares openblas_set_num_threads
#endif

namespace remat {
namespace detail {

inline std::atomic<int>& thread_count_setting() noexcept {
  static std::atomic<int> count{0};  // 0: not set, use the OpenMP default
  return count;
}

}  // namespace detail

/// Threads remat's kernels use (element-wise loops and GEMMs).
inline int num_threads() noexcept {
  const int set = detail::thread_count_setting().load(std::memory_order_relaxed);
  if (set > 0) return set;
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// Sets the threads remat's kernels use, including OpenBLAS's. Results of a given computation
/// are bitwise the same for a given thread count.
inline void set_num_threads(int count) {
  if (count < 1) throw UsageError(detail::cat("set_num_threads: count must be >= 1, got ", count));
  detail::thread_count_setting().store(count, std::memory_order_relaxed);
#if REMAT_USE_BLAS
  openblas_set_num_threads(count);
#endif
}

namespace detail {

/// Runs fn(begin, end) over [0, n) in static chunks of at least `grain` items, in parallel when
/// that is worth it. fn must only touch its own chunk.
template <class Fn>
void parallel_for(std::int64_t n, std::int64_t grain, Fn&& fn) {
#ifdef _OPENMP
  const std::int64_t threads = num_threads();
  const std::int64_t chunks = std::min<std::int64_t>(threads, n / std::max<std::int64_t>(grain, 1));
  if (chunks > 1 && !omp_in_parallel()) {
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static, 1)
    for (std::int64_t c = 0; c < chunks; ++c) fn(n * c / chunks, n * (c + 1) / chunks);
    return;
  }
#else
  (void)grain;
#endif
  if (n > 0) fn(std::int64_t{0}, n);
}

/// Grain for element-wise loops: below this many elements, threads cost more than they save.
inline constexpr std::int64_t kElementwiseGrain = 32768;

}  // namespace detail
}  // namespace remat
