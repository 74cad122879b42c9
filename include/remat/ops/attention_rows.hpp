#pragma once
/// @file
/// The row kernels of the attention op (ops/attention.hpp) and of the KV cache's attention
/// (nn/kv_cache.hpp): the softmax of a block of score rows over the keys each row sees, its
/// recomputation from saved log-sum-exps, and its backward. One set for every kernel, so that the
/// fused and flash kernels and a cached generation round a row the same way.
///
/// A block holds rows [i0, i1) of one head's (T x T) scores, row i0 first, `ld` apart: the fused
/// kernel passes the whole (T x T) block (i0 = 0, i1 = T), the flash kernel a block of query rows
/// (Note [attention by query blocks] in ops/attention.hpp). Which keys row i sees is a KeyRange:
/// causal, keys 0..i; else all T of them. With a sliding window w > 0 (Mistral's
/// sliding_window) row i sees keys i - w < j <= i only, w keys counting itself, as Hugging Face's
/// mask (kv_idx > q_idx - sliding_window). With packed rows (several examples in one row)
/// `starts` holds, by position, the first position of that position's example: row i sees keys
/// starts[i] <= j <= i only (and its window), a block-diagonal causal mask. A row's entries for
/// the keys it does not see, up to the block's last key, are set to zero. An additive bias (a
/// constant (T x T) matrix per head: Hugging Face's 4-D float masks, ALiBi) is added to the scores
/// of the keys a row sees before its softmax; a bias of -inf hides a key, and a row whose every
/// key it hides gets zero weights (and log-sum-exp -inf) rather than 0 / 0.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "remat/core/elementwise.hpp"
#include "remat/core/error.hpp"

namespace remat::detail {

/// Which keys each query row of one head sees (a mask given by rule, never stored), and the bias
/// added to their scores.
struct KeyRange {
  bool causal = true;                    ///< row i sees keys j <= i; else all `keys` keys
  std::int64_t keys = 0;                 ///< the number of keys (T): a non-causal row's end
  std::int64_t window = 0;               ///< > 0: only keys j > i - window (causal only)
  const std::int32_t* starts = nullptr;  ///< packed rows: only keys j >= starts[i] (causal only)
  const float* bias = nullptr;           ///< (keys x keys), row i's at bias + i keys; null: none

  /// The first key row i sees: its window's first, or its example's first, whichever is later.
  std::int64_t first(std::int64_t i) const noexcept {
    const std::int64_t j0 = window > 0 && i >= window ? i - window + 1 : 0;
    return starts && starts[i] > j0 ? starts[i] : j0;
  }
  /// One past the last key row i sees.
  std::int64_t end(std::int64_t i) const noexcept { return causal ? i + 1 : keys; }
  /// One past the last key any row of a block ending at row i1 sees.
  std::int64_t block_end(std::int64_t i1) const noexcept { return causal ? i1 : keys; }

  /// Adds row i's bias to `seen`, its scores of keys [j0, j0 + seen.size()) (nothing without one).
  /// Float, whatever T: a double op adds the same values exactly.
  template <class T>
  void add_bias(ArrayView<T> seen, std::int64_t i, std::int64_t j0) const {
    if (bias) seen += ConstArrayView<float>(bias + i * keys + j0, seen.size()).template cast<T>();
  }
  /// Whether a row's largest biased score m says that the bias hides every key it sees. Only a
  /// bias can: without one, -inf scores come from infinite inputs, and their NaN stays visible.
  template <class T>
  bool hides_all(T m) const noexcept {
    return bias && m == -std::numeric_limits<T>::infinity();
  }
};

inline void check_window(const char* op, std::int64_t window) {
  if (window < 0)
    throw ArgumentError(cat(op, ": the sliding window must be 0 (none) or positive, got ", window));
}

/// The FLOPs of an attention's two GEMMs (scores, then probabilities times values) over B
/// sequences of T positions and H heads of D values: 4 D for each (query, key) pair a GEMM
/// multiplies. The fused kernel multiplies all T x T; the causal flash kernel, per block of
/// `rows` queries, the keys up to the block's last (rows = T: the fused figure). What
/// Node::forward_flops() reports, for save policies and for a shape-only profile's costs.
inline double attention_flops(std::int64_t batch, std::int64_t heads, std::int64_t time,
                              std::int64_t dim, std::int64_t rows, bool causal) noexcept {
  double pairs = 0;
  for (std::int64_t i0 = 0; i0 < time; i0 += rows)
    pairs += static_cast<double>(std::min(rows, time - i0) *
                                 (causal ? std::min(i0 + rows, time) : time));
  return 4 * static_cast<double>(batch * heads * dim) * pairs;
}

/// Row i of the block becomes the softmax of its scores over the keys it sees, zero elsewhere;
/// lse[i] its log-sum-exp when lse is not null.
template <class T>
void softmax_rows(T* s, std::int64_t ld, T* lse, std::int64_t i0, std::int64_t i1,
                  const KeyRange& keys) {
  const std::int64_t width = keys.block_end(i1);
  for_rows(i1 - i0, width, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r, j0 = keys.first(i), j1 = keys.end(i);
      ArrayView<T>(s + r * ld, j0).setZero();
      ArrayView<T> seen(s + r * ld + j0, j1 - j0);
      keys.add_bias(seen, i, j0);
      const T m = seen.maxCoeff();
      if (keys.hides_all(m)) {
        seen.setZero();
        if (lse) lse[i] = m;
      } else {
        exp_shifted_row(seen.data(), seen.data(), j1 - j0, m, T(1));
        const T sum = seen.sum();
        seen *= T(1) / sum;
        if (lse) lse[i] = m + std::log(sum);
      }
      ArrayView<T>(s + r * ld + j1, width - j1).setZero();
    }
  });
}

/// The block's scores become the probabilities again: exp(S - lse) over the keys row i sees, zero
/// elsewhere.
template <class T>
void softmax_recompute_rows(T* s, std::int64_t ld, const T* lse, std::int64_t i0, std::int64_t i1,
                            const KeyRange& keys) {
  const std::int64_t width = keys.block_end(i1);
  for_rows(i1 - i0, width, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r, j0 = keys.first(i), j1 = keys.end(i);
      ArrayView<T>(s + r * ld, j0).setZero();
      ArrayView<T> seen(s + r * ld + j0, j1 - j0);
      keys.add_bias(seen, i, j0);
      if (keys.hides_all(lse[i])) {
        seen.setZero();
      } else {
        exp_shifted_row(seen.data(), seen.data(), j1 - j0, lse[i], T(1));
      }
      ArrayView<T>(s + r * ld + j1, width - j1).setZero();
    }
  });
}

/// dP := P (dP - rowsum(dP P)) * scale over the keys each row sees, zero elsewhere.
template <class T>
void softmax_backward_rows(const T* p, T* dp, std::int64_t ld, T scale, std::int64_t i0,
                           std::int64_t i1, const KeyRange& keys) {
  const std::int64_t width = keys.block_end(i1);
  for_rows(i1 - i0, width, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t i = i0 + r, j0 = keys.first(i), j1 = keys.end(i);
      ArrayView<T>(dp + r * ld, j0).setZero();
      const ConstArrayView<T> pr(p + r * ld + j0, j1 - j0);
      ArrayView<T> dr(dp + r * ld + j0, j1 - j0);
      const T dot = (pr * dr).sum();
      dr = pr * (dr - dot) * scale;
      ArrayView<T>(dp + r * ld + j1, width - j1).setZero();
    }
  });
}

}  // namespace remat::detail
