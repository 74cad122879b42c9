#pragma once
// Small helpers shared by remat's benchmarks: timing, medians, GEMM peak (flags: CLI11,
// examples/flags.hpp).
#include <remat/remat.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Median seconds of `repeat` runs of fn, after one warm-up run.
inline double time_median(int repeat, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    const double s = now_seconds();
    fn();
    t.push_back(now_seconds() - s);
  }
  return median(t);
}

/// This machine's single-precision GEMM rate (GFLOP/s) for n x n x n through remat's GEMM path:
/// the median of several runs, the reference remat_bench divides a step's rate by.
inline double gemm_gflops(std::int64_t n, int repeat = 7, bool bf16 = false) {
  remat::Rng rng(1);
  const auto a = rng.normal_tensor<float>({n, n});
  const auto b = rng.normal_tensor<float>({n, n});
  remat::Tensor<float> c({n, n});
  const double s = time_median(repeat, [&] {
    if (bf16)
      remat::gemm_bf16(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    else
      remat::detail::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                                 c.data(), n);
  });
  return 2.0 * double(n) * double(n) * double(n) / s / 1e9;
}

}  // namespace bench
