#pragma once
/// @file
/// flash_causal_self_attention: the multi-head causal attention of causal_self_attention
/// (ops/attention.hpp), same input, output and dropout draws, without keeping the (B, H, T, T)
/// probabilities. The forward pass keeps only its input qkv and one log-sum-exp per query row
/// (B, H, T); the backward pass recomputes the probabilities block by block from them.
///
/// Note [attention by query blocks]: the FlashAttention idea (Dao et al. 2022) on the CPU. Queries
/// are taken `block_rows` at a time; a block of rows [i0, i1) sees keys [0, i1) only (causal), so
/// its scores are one (rows x i1) GEMM, its softmax is exact over whole rows (no running rescale
/// is needed, since a block holds whole rows), and its output one more GEMM. The only scratch is
/// one or two (block_rows x T) buffers: O(block_rows T) instead of O(T^2) per head, and nothing
/// kept between forward and backward but qkv and the log-sum-exps. The backward pass recomputes
/// P = exp(S - lse) per block with one GEMM more than the fused op's four, but every GEMM skips
/// the keys a block cannot see, about half of the (T x T) work the fused op does.

#include <algorithm>
#include <cmath>

#include "remat/core/record.hpp"
#include "remat/core/rng.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/causal_softmax.hpp"
#include "remat/ops/gemm.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {

/// Query rows per block of flash_causal_self_attention (Note [attention by query blocks]): a
/// (64 x T) float block is 64 KiB at T = 256, in L2 with the keys it is multiplied with.
inline constexpr std::int64_t kFlashBlockRows = 64;

namespace detail {

/// The first block of query rows a backward pass visits: the last, which sees every key.
inline std::int64_t flash_last_block(std::int64_t time, std::int64_t rows) noexcept {
  return (time - 1) / rows * rows;
}

template <class T>
class FlashAttentionNode final : public Node<T> {
 public:
  FlashAttentionNode(std::int64_t batch, std::int64_t time, std::int64_t channels,
                     std::int64_t heads, double dropout, std::uint64_t seed,
                     std::int64_t block_rows)
      : b_(batch),
        t_(time),
        c_(channels),
        h_(heads),
        d_(channels / heads),
        p_(dropout),
        seed_(seed),
        threshold_(static_cast<std::uint32_t>(std::min(dropout * 4294967296.0, 4294967295.0))),
        rows_(std::max<std::int64_t>(1, std::min(block_rows, time))) {}
  const OpType& op_type() const noexcept override { return op::flash_causal_self_attention; }
  bool runs_shape_only() const noexcept override { return true; }
  double forward_flops(typename Node<T>::Inputs, const Tensor<T>&) const override {
    return attention_flops(b_, h_, t_, d_, rows_);
  }

  // qkv: (B, T, 3C) -> y: (B, T, C); per (b, h) and block of query rows [i0, i1):
  // S = Q[i0:i1] K[0:i1]^T / sqrt(D), P = softmax(mask(S)), lse = log-sum-exp of each row,
  // y[i0:i1] = dropout(P) V[0:i1].
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& qkv = in[0];
    Tensor<T> y(Shape{b_, t_, c_});
    Tensor<T> lse(Shape{b_, h_, t_});
    Tensor<T> scores(Shape{rows_, t_});
    Tensor<T> dropped = dropout_scratch();
    this->save(0, qkv);
    this->save(1, lse);
    if (shape_only()) return y;
    const T scale = T(1) / std::sqrt(T(d_));
    for (std::int64_t b = 0; b < b_; ++b) {
      for (std::int64_t h = 0; h < h_; ++h) {
        for (std::int64_t i0 = 0; i0 < t_; i0 += rows_) {
          const std::int64_t i1 = std::min(i0 + rows_, t_), rows = i1 - i0;
          T* s = scores.data();
          gemm<T>(false, true, rows, i1, d_, scale, q(qkv, b, h) + i0 * 3 * c_, 3 * c_,
                  k(qkv, b, h), 3 * c_, T(0), s, t_);
          causal_softmax_rows(s, t_, lse.data() + (b * h_ + h) * t_, i0, i1);
          const T* weights = s;
          if (p_ > 0) {
            apply_dropout(s, dropped.data(), b, h, i0, i1);
            weights = dropped.data();
          }
          gemm<T>(false, false, rows, d_, i1, T(1), weights, t_, v(qkv, b, h), 3 * c_, T(0),
                  y.data() + (b * t_ + i0) * c_ + h * d_, c_);
        }
      }
    }
    return y;
  }

  // Per block, P = exp(S - lse) recomputed; dV[0:i1] += dropout(P)^T dY; dP = dropout'(dY V^T);
  // dS = P (dP - rowsum(dP P)) / sqrt(D); dQ[i0:i1] = dS K[0:i1]; dK[0:i1] += dS^T Q[i0:i1].
  // Blocks run last first: the last block sees every key, so it writes (or adds to) all of dK
  // and dV, and the blocks before it add to them.
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& qkv = this->saved(0);
    const Tensor<T>& lse = this->saved(1);
    const typename Grads<T>::Target g = grads.target(0, qkv.shape());
    if (!g.dst) return;
    Tensor<T> probs(Shape{rows_, t_});
    Tensor<T> dp(Shape{rows_, t_});
    Tensor<T> dropped = dropout_scratch();
    if (shape_only()) return;
    const T scale = T(1) / std::sqrt(T(d_));
    const std::int64_t last = flash_last_block(t_, rows_);
    for (std::int64_t b = 0; b < b_; ++b) {
      for (std::int64_t h = 0; h < h_; ++h) {
        T* gq = g.dst->data() + b * t_ * 3 * c_ + h * d_;
        T* gk = gq + c_;
        T* gv = gq + 2 * c_;
        const T* dy = gy.data() + b * t_ * c_ + h * d_;
        for (std::int64_t i0 = last; i0 >= 0; i0 -= rows_) {
          const std::int64_t i1 = std::min(i0 + rows_, t_), rows = i1 - i0;
          const T beta_q = g.overwrite ? T(0) : T(1);
          const T beta_kv = g.overwrite && i0 == last ? T(0) : T(1);
          T* p = probs.data();
          gemm<T>(false, true, rows, i1, d_, scale, q(qkv, b, h) + i0 * 3 * c_, 3 * c_,
                  k(qkv, b, h), 3 * c_, T(0), p, t_);
          causal_softmax_recompute_rows(p, t_, lse.data() + (b * h_ + h) * t_, i0, i1);
          const T* weights = p;
          if (p_ > 0) {
            apply_dropout(p, dropped.data(), b, h, i0, i1);
            weights = dropped.data();
          }
          gemm<T>(true, false, i1, d_, rows, T(1), weights, t_, dy + i0 * c_, c_, beta_kv, gv,
                  3 * c_);
          gemm<T>(false, true, rows, i1, d_, T(1), dy + i0 * c_, c_, v(qkv, b, h), 3 * c_, T(0),
                  dp.data(), t_);
          if (p_ > 0) apply_dropout(dp.data(), dp.data(), b, h, i0, i1);
          causal_softmax_backward_rows(p, dp.data(), t_, scale, i0, i1);
          gemm<T>(false, false, rows, d_, i1, T(1), dp.data(), t_, k(qkv, b, h), 3 * c_, beta_q,
                  gq + i0 * 3 * c_, 3 * c_);
          gemm<T>(true, false, i1, d_, rows, T(1), dp.data(), t_, q(qkv, b, h) + i0 * 3 * c_,
                  3 * c_, beta_kv, gk, 3 * c_);
        }
      }
    }
  }

 private:
  /// A (block_rows, T) buffer for one block's dropped-out weights; none without dropout.
  Tensor<T> dropout_scratch() const { return p_ > 0 ? Tensor<T>(Shape{rows_, t_}) : Tensor<T>(); }

  const T* q(const Tensor<T>& qkv, std::int64_t b, std::int64_t h) const {
    return qkv.data() + b * t_ * 3 * c_ + h * d_;
  }
  const T* k(const Tensor<T>& qkv, std::int64_t b, std::int64_t h) const {
    return q(qkv, b, h) + c_;
  }
  const T* v(const Tensor<T>& qkv, std::int64_t b, std::int64_t h) const {
    return q(qkv, b, h) + 2 * c_;
  }

  /// dst = src with the dropout mask of rows [i0, i1) (keys [0, i1)) of head (b, h) applied (dst
  /// may be src). Element (i, j) draws at counter ((b H + h) T + i) T + j, as in
  /// causal_self_attention, so both ops drop the same weights.
  void apply_dropout(const T* src, T* dst, std::int64_t b, std::int64_t h, std::int64_t i0,
                     std::int64_t i1) const {
    const CounterRng rng = CounterRng::at(seed_, this->id);
    const T keep_scale = static_cast<T>(1.0 / (1.0 - p_));
    const std::uint32_t threshold = threshold_;
    for_rows(i1 - i0, i1, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto base = static_cast<std::uint32_t>(((b * h_ + h) * t_ + i0 + r) * t_);
        const T* sr = src + r * t_;
        T* dr = dst + r * t_;
        for (std::int64_t j = 0; j < i1; ++j) {
          dr[j] = rng.bits(base + static_cast<std::uint32_t>(j)) >= threshold ? sr[j] * keep_scale
                                                                              : T(0);
        }
      }
    });
  }

  std::int64_t b_, t_, c_, h_, d_;
  double p_;
  std::uint64_t seed_;
  std::uint32_t threshold_;
  std::int64_t rows_;
};

}  // namespace detail

/// Multi-head causal self-attention from the packed projection qkv (B, T, 3C), as
/// causal_self_attention() computes it (same output to rounding, same dropout draws), keeping
/// only qkv and a log-sum-exp per query row for backward instead of the (B, H, T, T)
/// probabilities, which backward recomputes `block_rows` query rows at a time (Note [attention by
/// query blocks]).
template <class T>
Var<T> flash_causal_self_attention(const Var<T>& qkv, std::int64_t heads, double dropout = 0.0,
                                   std::int64_t block_rows = kFlashBlockRows) {
  const Shape& s = qkv.shape();
  if (s.rank() != 3 || s[2] % 3 != 0 || heads < 1 || (s[2] / 3) % heads != 0) {
    throw ShapeError(detail::cat(
        "flash_causal_self_attention: needs qkv of shape (B, T, 3C) with C divisible by heads = ",
        heads, ", got ", s));
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw ArgumentError(
        detail::cat("flash_causal_self_attention: dropout must be in [0, 1), got ", dropout));
  }
  if (block_rows < 1) {
    throw ArgumentError(
        detail::cat("flash_causal_self_attention: block_rows must be at least 1, got ", block_rows,
                    " (qkv ", s, ")"));
  }
  return detail::record_op<detail::FlashAttentionNode<T>>(
      {&qkv}, s[0], s[1], s[2] / 3, heads, dropout, detail::rng_seed_for(qkv), block_rows);
}

}  // namespace remat
