#pragma once
/// @file
/// The float32 sum and mean of a contiguous array in the order PyTorch's CPU kernel adds them,
/// so that a value bitsandbytes derives from `tensor.mean()` (the offset of NF4 double
/// quantization) comes out bit for bit here.
///
/// Note [torch's float sum]: ATen's `cascade_sum` (aten/src/ATen/native/cpu/SumKernel.cpp) reads
/// the array as 8-float vectors (its AVX2 and default kernels; the remainder is added last, one
/// float at a time), keeps 4 interleaved vector accumulators, and adds them in a cascade of 4
/// levels whose step is 2^max(4, ceil(log2(rows)) / 4) rows, so that rounding error grows like a
/// pairwise sum; the vector's lanes are then added in order, after the remainder. An array
/// shorter than a vector goes through the same cascade one float at a time. `mean()` on the CPU
/// is that sum divided by the count, in float.
///
/// This is torch's result whenever it reduces on one thread: fewer than 32,768 values (its
/// grain size), or `torch.set_num_threads(1)`. Past that, torch splits the array among its
/// threads and adds their partial sums, so its own last bit depends on the thread count (and on
/// a machine where torch dispatches 16-float AVX-512 kernels, on the vector width): no single
/// value is torch's there. Checked against torch 1.13
/// (tests/reference/make_quantized_reference.py).

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace remat::detail {

inline constexpr std::int64_t kTorchLanes = 8;
using TorchVector = std::array<float, kTorchLanes>;

inline void torch_add(float& acc, float x) noexcept { acc += x; }
inline void torch_add(TorchVector& acc, const TorchVector& x) noexcept {
  for (std::int64_t k = 0; k < kTorchLanes; ++k) acc[k] += x[k];
}

/// ATen's `row_sum`: the sum of `size` elements `load(i)` (floats or vectors) in 4 interleaved
/// accumulators, cascaded (`multi_row_sum`), then the leftover elements, then the accumulators.
template <class V, class Load>
V torch_row_sum(std::int64_t size, Load load) {
  constexpr std::int64_t kInterleave = 4, kLevels = 4;
  const std::int64_t rows = size / kInterleave;
  const std::int64_t ceil_log2 =
      rows <= 2 ? 1 : std::bit_width(static_cast<std::uint64_t>(rows - 1));
  const std::int64_t power = std::max<std::int64_t>(4, ceil_log2 / kLevels);
  const std::int64_t step = std::int64_t{1} << power, mask = step - 1;
  std::array<std::array<V, kInterleave>, kLevels> acc{};
  const auto add_row = [&](std::int64_t row) {
    for (std::int64_t k = 0; k < kInterleave; ++k)
      torch_add(acc[0][k], load(row * kInterleave + k));
  };
  std::int64_t row = 0;
  while (row + step <= rows) {
    for (std::int64_t j = 0; j < step; ++j) add_row(row++);
    // carry level j-1 into level j, and go one level up only when `row` is a multiple of the
    // level's span (the cascade)
    for (std::int64_t level = 1; level < kLevels; ++level) {
      for (std::int64_t k = 0; k < kInterleave; ++k) {
        torch_add(acc[level][k], acc[level - 1][k]);
        acc[level - 1][k] = V{};
      }
      if ((row & (mask << (level * power))) != 0) break;
    }
  }
  for (; row < rows; ++row) add_row(row);
  for (std::int64_t level = 1; level < kLevels; ++level)
    for (std::int64_t k = 0; k < kInterleave; ++k) torch_add(acc[0][k], acc[level][k]);
  std::array<V, kInterleave> partial = acc[0];
  for (std::int64_t i = rows * kInterleave; i < size; ++i) torch_add(partial[0], load(i));
  for (std::int64_t k = 1; k < kInterleave; ++k) torch_add(partial[0], partial[k]);
  return partial[0];
}

/// The float32 sum of x[0, n) in torch's one-thread CPU order (Note [torch's float sum]).
inline float torch_cpu_sum(const float* x, std::int64_t n) {
  if (n < kTorchLanes) return torch_row_sum<float>(n, [x](std::int64_t i) { return x[i]; });
  const std::int64_t vectors = n / kTorchLanes;
  const TorchVector lanes = torch_row_sum<TorchVector>(vectors, [x](std::int64_t i) {
    TorchVector v;
    std::copy_n(x + i * kTorchLanes, kTorchLanes, v.begin());
    return v;
  });
  float total = 0;
  for (std::int64_t i = vectors * kTorchLanes; i < n; ++i) total += x[i];
  for (const float lane : lanes) total += lane;
  return total;
}

/// torch's `x.mean()` of a float32 array on the CPU, one thread (Note [torch's float sum]).
inline float torch_cpu_mean(const float* x, std::int64_t n) {
  return torch_cpu_sum(x, n) / static_cast<float>(n);
}

}  // namespace remat::detail
