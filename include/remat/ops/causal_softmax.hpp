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
/// its entries after i, up to i1, are set to zero.

#include <cmath>
#include <cstdint>

#include "remat/core/elementwise.hpp"

namespace remat::detail {

/// Row i of the block becomes the softmax of its scores over keys 0..i, zero after; lse[i] its
/// log-sum-exp when lse is not null.
template <class T>
void causal_softmax_rows(T* s, std::int64_t ld, T* lse, std::int64_t i0, std::int64_t i1) {
  for_rows(i1 - i0, i1, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r;
      ArrayView<T> seen(s + r * ld, i + 1);
      const T m = seen.maxCoeff();
      seen = (seen - m).exp();
      const T sum = seen.sum();
      seen *= T(1) / sum;
      if (lse) lse[i] = m + std::log(sum);
      ArrayView<T>(s + r * ld + i + 1, i1 - i - 1).setZero();
    }
  });
}

/// The block's scores become the probabilities again: exp(S - lse) over keys 0..i, zero after.
template <class T>
void causal_softmax_recompute_rows(T* s, std::int64_t ld, const T* lse, std::int64_t i0,
                                   std::int64_t i1) {
  for_rows(i1 - i0, i1, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r;
      ArrayView<T> seen(s + r * ld, i + 1);
      seen = (seen - lse[i]).exp();
      ArrayView<T>(s + r * ld + i + 1, i1 - i - 1).setZero();
    }
  });
}

/// dP := P (dP - rowsum(dP P)) * scale over the causal part of the block's rows, zero after.
template <class T>
void causal_softmax_backward_rows(const T* p, T* dp, std::int64_t ld, T scale, std::int64_t i0,
                                  std::int64_t i1) {
  for_rows(i1 - i0, i1, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r;
      const ConstArrayView<T> pr(p + r * ld, i + 1);
      ArrayView<T> dr(dp + r * ld, i + 1);
      const T dot = (pr * dr).sum();
      dr = pr * (dr - dot) * scale;
      ArrayView<T>(dp + r * ld + i + 1, i1 - i - 1).setZero();
    }
  });
}

}  // namespace remat::detail
