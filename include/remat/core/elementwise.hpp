#pragma once
/// @file
/// Helpers for element-wise kernels: Eigen array views of a chunk of a tensor, and a parallel
/// loop over chunks. Ops write their math once, as Eigen array expressions, and these helpers
/// run it over the whole tensor.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "remat/core/parallel.hpp"
#include "remat/core/tensor.hpp"
#include "remat/core/vector_kernels.hpp"

namespace remat::detail {

template <class T>
using ArrayView = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayView = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

/// Elements [b, e) of t as an Eigen array.
template <class T>
ArrayView<T> view(Tensor<T>& t, std::int64_t b, std::int64_t e) noexcept {
  return ArrayView<T>(t.data() + b, e - b);
}
template <class T>
ConstArrayView<T> view(const Tensor<T>& t, std::int64_t b, std::int64_t e) noexcept {
  return ConstArrayView<T>(t.data() + b, e - b);
}

/// Runs fn(b, e) over the elements of a tensor of n elements, in parallel chunks when large.
template <class Fn>
void for_chunks(std::int64_t n, Fn&& fn) {
  parallel_for(n, kElementwiseGrain, std::forward<Fn>(fn));
}

/// Runs fn(r0, r1) over `rows` rows of `cols` elements each, in parallel when large.
template <class Fn>
void for_rows(std::int64_t rows, std::int64_t cols, Fn&& fn) {
  const std::int64_t grain = cols > 0 ? (kElementwiseGrain + cols - 1) / cols : rows;
  parallel_for(rows, grain, std::forward<Fn>(fn));
}

/// Copies the vector b (cols) into every row of the row-major matrix y (rows x cols, rows ld
/// apart): a bias a GEMM then accumulates onto (beta = 1).
template <class T>
void fill_rows(std::int64_t rows, std::int64_t cols, const T* b, T* y, std::int64_t ld) {
  for_rows(rows, cols, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) std::copy(b, b + cols, y + r * ld);
  });
}

/// out[c] = sum over rows r of m[r * cols + c] for a row-major (rows x cols) buffer, summing
/// rows in order (deterministic for any thread count); columns are split between threads.
template <class T, class RowExpr>
void sum_rows_into(T* out, std::int64_t rows, std::int64_t cols, bool overwrite, RowExpr&& row) {
  parallel_for(cols, kElementwiseGrain / 8, [&](std::int64_t c0, std::int64_t c1) {
    ArrayView<T> acc(out + c0, c1 - c0);
    if (overwrite) acc.setZero();
    for (std::int64_t r = 0; r < rows; ++r) acc += row(r, c0, c1);
  });
}

/// out = exp(x - shift) * scale over a row of n values (out == x allowed). A float row's
/// exponentials run on the dispatched kernels (Note [ISA dispatch] in core/vector_kernels.hpp):
/// Eigen's are SSE2-wide under a user's usual flags, and a vocabulary's rows made them a tenth of
/// a loss head, an attention's probabilities most of its softmax; a double row's by Eigen.
template <class T>
void exp_shifted_row(const T* x, T* out, std::int64_t n, T shift, T scale) {
  if constexpr (std::is_same_v<T, float>)
    vec::exp_shifted(x, out, n, shift, scale);
  else
    ArrayView<T>(out, n) = (ConstArrayView<T>(x, n) - shift).exp() * scale;
}

}  // namespace remat::detail
