#pragma once
/// @file
/// The row kernels of the causal attention ops (ops/attention.hpp, ops/gqa_attention.hpp and
/// their flash forms): the softmax of a block of score rows over the keys each row may see, its
/// recomputation from saved log-sum-exps, and its backward. One set for all four ops, so that the
/// fused and flash ops round a row the same way.
///
/// A block holds rows [i0, i1) of one head's (T x T) scores, row i0 first, `ld` apart, over keys
/// [0, i1): the fused ops pass the whole (T x T) block (i0 = 0, i1 = T), the flash ops a block of
/// query rows (Note [attention by query blocks] in ops/flash_attention.hpp). Row i sees keys 0..i;
/// its entries after i, up to i1, are set to zero. With a sliding window w > 0 (Mistral's
/// sliding_window) row i sees keys i - w < j <= i only, w keys counting itself, as Hugging Face's
/// mask (kv_idx > q_idx - sliding_window); the keys before the window are set to zero too.
/// With packed rows (several examples in one row) `starts` holds, by position, the first position
/// of that position's example: row i sees keys starts[i] <= j <= i only (and its window), a
/// block-diagonal causal mask; null is one example per row.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "remat/core/elementwise.hpp"

namespace remat::detail {

/// The FLOPs of an attention's two GEMMs (scores, then probabilities times values) over B
/// sequences of T positions and H heads of D values: 4 D for each (query, key) pair a GEMM
/// multiplies. The fused ops multiply all T x T; the flash ops, per block of `rows` queries, the
/// keys up to the block's last (rows = T: the fused figure). What Node::forward_flops() reports,
/// for save policies and for a shape-only profile's costs.
inline double attention_flops(std::int64_t batch, std::int64_t heads, std::int64_t time,
                              std::int64_t dim, std::int64_t rows) noexcept {
  double pairs = 0;
  for (std::int64_t i0 = 0; i0 < time; i0 += rows)
    pairs += static_cast<double>(std::min(rows, time - i0) * std::min(i0 + rows, time));
  return 4 * static_cast<double>(batch * heads * dim) * pairs;
}

/// The first key row i sees: 0, or i - window + 1 under a sliding window (window > 0).
inline std::int64_t window_start(std::int64_t i, std::int64_t window) noexcept {
  return window > 0 && i >= window ? i - window + 1 : 0;
}

/// The first key row i sees: its window's first, or its example's first (`starts`, when not
/// null), whichever is later.
inline std::int64_t first_key(std::int64_t i, std::int64_t window,
                              const std::int32_t* starts) noexcept {
  const std::int64_t j0 = window_start(i, window);
  return starts && starts[i] > j0 ? starts[i] : j0;
}

/// Row i of the block becomes the softmax of its scores over the keys it sees (0..i, within its
/// window and its example), zero elsewhere; lse[i] its log-sum-exp when lse is not null.
template <class T>
void causal_softmax_rows(T* s, std::int64_t ld, T* lse, std::int64_t i0, std::int64_t i1,
                         std::int64_t window = 0, const std::int32_t* starts = nullptr) {
  for_rows(i1 - i0, i1, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r, j0 = first_key(i, window, starts);
      ArrayView<T>(s + r * ld, j0).setZero();
      ArrayView<T> seen(s + r * ld + j0, i + 1 - j0);
      const T m = seen.maxCoeff();
      seen = (seen - m).exp();
      const T sum = seen.sum();
      seen *= T(1) / sum;
      if (lse) lse[i] = m + std::log(sum);
      ArrayView<T>(s + r * ld + i + 1, i1 - i - 1).setZero();
    }
  });
}

/// The block's scores become the probabilities again: exp(S - lse) over the keys row i sees, zero
/// elsewhere.
template <class T>
void causal_softmax_recompute_rows(T* s, std::int64_t ld, const T* lse, std::int64_t i0,
                                   std::int64_t i1, std::int64_t window = 0,
                                   const std::int32_t* starts = nullptr) {
  for_rows(i1 - i0, i1, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r, j0 = first_key(i, window, starts);
      ArrayView<T>(s + r * ld, j0).setZero();
      ArrayView<T> seen(s + r * ld + j0, i + 1 - j0);
      seen = (seen - lse[i]).exp();
      ArrayView<T>(s + r * ld + i + 1, i1 - i - 1).setZero();
    }
  });
}

/// dP := P (dP - rowsum(dP P)) * scale over the keys each row sees, zero elsewhere.
template <class T>
void causal_softmax_backward_rows(const T* p, T* dp, std::int64_t ld, T scale, std::int64_t i0,
                                  std::int64_t i1, std::int64_t window = 0,
                                  const std::int32_t* starts = nullptr) {
  for_rows(i1 - i0, i1, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r, j0 = first_key(i, window, starts);
      ArrayView<T>(dp + r * ld, j0).setZero();
      const ConstArrayView<T> pr(p + r * ld + j0, i + 1 - j0);
      ArrayView<T> dr(dp + r * ld + j0, i + 1 - j0);
      const T dot = (pr * dr).sum();
      dr = pr * (dr - dot) * scale;
      ArrayView<T>(dp + r * ld + i + 1, i1 - i - 1).setZero();
    }
  });
}

}  // namespace remat::detail
