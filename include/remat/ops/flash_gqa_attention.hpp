#pragma once
/// @file
/// flash_grouped_query_attention: the causal grouped-query attention with RoPE of
/// grouped_query_attention (ops/gqa_attention.hpp), same inputs and output to rounding, without
/// keeping the (B, H, T, T) probabilities: the node saves the rotated queries and keys, the
/// values and one log-sum-exp per query row (B, H, T), and its backward pass recomputes the
/// probabilities by blocks of query rows (Note [attention by query blocks] in
/// ops/flash_attention.hpp). With packed rows (`starts`), a block of query rows skips the keys
/// before the first example any of its rows sees.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "remat/core/record.hpp"
#include "remat/ops/flash_attention.hpp"
#include "remat/ops/gemm.hpp"
#include "remat/ops/gqa_attention.hpp"
#include "remat/ops/rope.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class FlashGroupedQueryAttentionNode final : public Node<T>, private GqaLayout {
 public:
  FlashGroupedQueryAttentionNode(std::int64_t batch, std::int64_t time, std::int64_t heads,
                                 std::int64_t kv_heads, std::int64_t dim, RopeOptions rope,
                                 std::int64_t block_rows, std::int64_t window,
                                 Tensor<std::int32_t> starts)
      : GqaLayout(batch, time, heads, kv_heads, dim, rope, window, std::move(starts)),
        rows_(std::max<std::int64_t>(1, std::min(block_rows, time))) {}
  const OpType& op_type() const noexcept override { return op::flash_grouped_query_attention; }
  bool runs_shape_only() const noexcept override { return true; }
  double forward_flops(typename Node<T>::Inputs, const Tensor<T>&) const override {
    return attention_flops(b_, h_, t_, d_, rows_);
  }

  // q: (B, T, H D), k, v: (B, T, G D) -> y: (B, T, H D). Per (b, h), with g = h / (H/G), and
  // block of query rows [i0, i1), seeing keys [k0, i1) (k0 = 0 but with packed rows):
  // S = rope(Q)[i0:i1] rope(K_g)[k0:i1]^T / sqrt(D), P = softmax(causal(S)), lse = log-sum-exp
  // of each row, y[i0:i1] = P V_g[k0:i1]. Columns [0, k0) of S are only set to zero.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& v = in[2];
    Tensor<T> qr(in[0].shape()), kr(in[1].shape());
    rotate(in[0], in[1], qr, kr, false);
    Tensor<T> y(in[0].shape());
    Tensor<T> lse(Shape{b_, h_, t_});
    Tensor<T> scores(Shape{rows_, t_});
    this->save(0, qr);
    this->save(1, kr);
    this->save(2, v);
    this->save(3, lse);
    if (shape_only()) return y;
    const T scale = T(1) / std::sqrt(T(d_));
    for (std::int64_t b = 0; b < b_; ++b) {
      for (std::int64_t h = 0; h < h_; ++h) {
        for (std::int64_t i0 = 0; i0 < t_; i0 += rows_) {
          const std::int64_t i1 = std::min(i0 + rows_, t_), rows = i1 - i0;
          const std::int64_t k0 = first_block_key(b, i0), keys = i1 - k0;
          gemm<T>(false, true, rows, keys, d_, scale, q_at(qr.data(), b, h) + i0 * cq(), cq(),
                  kv_at(kr.data(), b, h) + k0 * ckv(), ckv(), T(0), scores.data() + k0, t_);
          causal_softmax_rows(scores.data(), t_, lse.data() + (b * h_ + h) * t_, i0, i1, window_,
                              starts_of(b));
          gemm<T>(false, false, rows, d_, keys, T(1), scores.data() + k0, t_,
                  kv_at(v.data(), b, h) + k0 * ckv(), ckv(), T(0), q_at(y.data(), b, h) + i0 * cq(),
                  cq());
        }
      }
    }
    return y;
  }

  // Per block, P = exp(S - lse) recomputed; dV_g[k0:i1] += P^T dY[i0:i1]; dP = dY V_g^T;
  // dS = P (dP - rowsum(dP P)) / sqrt(D); dQr[i0:i1] = dS Kr_g[k0:i1]; dKr_g[k0:i1] += dS^T
  // Qr[i0:i1]; dQ, dK = inverse rotations of dQr, dKr. Blocks run last first: the last block of the
  // first head of a group sees every key from its k0 on, so it writes all of the group's dK and
  // dV (the rows before its k0 set to zero: earlier blocks, whose k0 is smaller, add into them).
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& qr = this->saved(0);
    const Tensor<T>& kr = this->saved(1);
    const Tensor<T>& v = this->saved(2);
    const Tensor<T>& lse = this->saved(3);
    const T scale = T(1) / std::sqrt(T(d_));
    const bool need_qk = grads.needs(0) || grads.needs(1);
    Tensor<T> dq, dk, probs, dp;
    if (need_qk) {
      dq = Tensor<T>(qr.shape());
      dk = Tensor<T>(kr.shape());
    }
    const typename Grads<T>::Target dv = grads.target(2, v.shape());
    if (need_qk || dv.dst) probs = Tensor<T>(Shape{rows_, t_});
    if (need_qk) dp = Tensor<T>(Shape{rows_, t_});
    const std::int64_t last = flash_last_block(t_, rows_);
    // shape-only run: the scratch is allocated as in a real one, nothing computed
    const std::int64_t batches = shape_only() ? 0 : b_;
    for (std::int64_t b = 0; b < batches; ++b) {
      for (std::int64_t h = 0; h < h_; ++h) {
        const T* dy = q_at(gy.data(), b, h);
        const bool first_of_group = h % rep_ == 0;
        if (!need_qk && !dv.dst) continue;
        for (std::int64_t i0 = last; i0 >= 0; i0 -= rows_) {
          const std::int64_t i1 = std::min(i0 + rows_, t_), rows = i1 - i0;
          const std::int64_t k0 = first_block_key(b, i0), keys = i1 - k0;
          const bool first_write = first_of_group && i0 == last;
          T* p = probs.data();
          gemm<T>(false, true, rows, keys, d_, scale, q_at(qr.data(), b, h) + i0 * cq(), cq(),
                  kv_at(kr.data(), b, h) + k0 * ckv(), ckv(), T(0), p + k0, t_);
          causal_softmax_recompute_rows(p, t_, lse.data() + (b * h_ + h) * t_, i0, i1, window_,
                                        starts_of(b));
          if (dv.dst) {
            const bool overwrite = dv.overwrite && first_write;
            if (overwrite) zero_kv_rows(kv_at(dv.dst->data(), b, h), k0);
            gemm<T>(true, false, keys, d_, rows, T(1), p + k0, t_, dy + i0 * cq(), cq(),
                    overwrite ? T(0) : T(1), kv_at(dv.dst->data(), b, h) + k0 * ckv(), ckv());
          }
          if (!need_qk) continue;
          gemm<T>(false, true, rows, keys, d_, T(1), dy + i0 * cq(), cq(),
                  kv_at(v.data(), b, h) + k0 * ckv(), ckv(), T(0), dp.data() + k0, t_);
          causal_softmax_backward_rows(p, dp.data(), t_, scale, i0, i1, window_, starts_of(b));
          gemm<T>(false, false, rows, d_, keys, T(1), dp.data() + k0, t_,
                  kv_at(kr.data(), b, h) + k0 * ckv(), ckv(), T(0),
                  q_at(dq.data(), b, h) + i0 * cq(), cq());
          if (first_write) zero_kv_rows(kv_at(dk.data(), b, h), k0);
          gemm<T>(true, false, keys, d_, rows, T(1), dp.data() + k0, t_,
                  q_at(qr.data(), b, h) + i0 * cq(), cq(), first_write ? T(0) : T(1),
                  kv_at(dk.data(), b, h) + k0 * ckv(), ckv());
        }
      }
    }
    if (!need_qk) return;
    probs.reset();
    dp.reset();
    rotate(dq, dk, dq, dk, true);
    grads.add(0, std::move(dq));
    grads.add(1, std::move(dk));
  }

 private:
  /// The first key any row of the block from query row i0 of batch b sees: with packed rows its
  /// first row's (the starts and the window's first keys only grow down a row), which the block
  /// need not multiply by; 0 otherwise, where the products keep their whole-prefix shape.
  std::int64_t first_block_key(std::int64_t b, std::int64_t i0) const {
    const std::int32_t* starts = starts_of(b);
    return starts ? first_key(i0, window_, starts) : 0;
  }

  /// Sets rows [0, n) of one key/value head of a (B, T, G D) gradient to zero.
  template <class P>
  void zero_kv_rows(P* head, std::int64_t n) const {
    for (std::int64_t j = 0; j < n; ++j) ArrayView<P>(head + j * ckv(), d_).setZero();
  }

  std::int64_t rows_;
};

}  // namespace detail

/// grouped_query_attention() (same arguments, same output to rounding), keeping the rotated
/// queries and keys, the values and a log-sum-exp per query row for backward instead of the
/// (B, H, T, T) probabilities, which backward recomputes `block_rows` query rows at a time. The
/// sliding `window` and the packed rows' `starts` are grouped_query_attention's.
template <class T>
Var<T> flash_grouped_query_attention(const Var<T>& q, const std::type_identity_t<Var<T>>& k,
                                     const std::type_identity_t<Var<T>>& v, std::int64_t heads,
                                     std::int64_t kv_heads, RopeOptions rope = {},
                                     std::int64_t block_rows = kFlashBlockRows,
                                     std::int64_t window = 0,
                                     const Tensor<std::int32_t>& starts = {}) {
  const Shape& sq = q.shape();
  const bool heads_ok = heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0;
  const bool ok = heads_ok && sq.rank() == 3 && sq[2] % heads == 0 && (sq[2] / heads) % 2 == 0 &&
                  sq[1] >= 1 && k.shape() == sq.with_last(sq[2] / heads * kv_heads) &&
                  v.shape() == k.shape();
  if (!ok) {
    throw ShapeError(detail::cat(
        "flash_grouped_query_attention: needs q (B, T, heads x D) with D even and T >= 1, k and v ",
        "(B, T, kv_heads x D), kv_heads dividing heads; got q ", sq, ", k ", k.shape(), ", v ",
        v.shape(), ", heads ", heads, ", kv_heads ", kv_heads));
  }
  if (block_rows < 1) {
    throw ArgumentError(
        detail::cat("flash_grouped_query_attention: block_rows must be at least 1, got ",
                    block_rows, " (q ", sq, ")"));
  }
  detail::check_rope_options("flash_grouped_query_attention", rope);
  detail::check_window("flash_grouped_query_attention", window);
  detail::check_starts("flash_grouped_query_attention", starts, sq[0], sq[1]);
  return detail::record_op<detail::FlashGroupedQueryAttentionNode<T>>(
      {&q, &k, &v}, sq[0], sq[1], heads, kv_heads, sq[2] / heads, rope, block_rows, window, starts);
}

}  // namespace remat
