#pragma once
/// @file
/// grouped_query_attention: the causal attention of Llama, Qwen2 and Mistral, one node. Query
/// heads share key/value heads in groups (H query heads, G key/value heads, H/G queries per
/// group: query head h reads key/value head h / (H/G), as Hugging Face's repeat_kv), and RoPE is
/// applied to queries and keys inside; optionally a sliding window (Mistral: query i sees keys
/// i - window < j <= i, ops/causal_softmax.hpp). Heads are read in place from the (B, T, heads x D)
/// projections with strided GEMMs. The node saves the rotated queries and keys, the values and
/// the attention probabilities (B, H, T, T).
///
/// Packed rows (several examples laid end to end in one row) pass `starts` (B, T): for each
/// position, the position its example starts at. Query i then sees keys starts[i] <= j <= i only,
/// and RoPE turns queries and keys by position rope.offset + i - starts[i]: each example is
/// attended as if it had a row of its own. (Under dynamic rope scaling the frequencies stay those
/// of the whole row's length, offset + T, as for a padded row: an example run alone would take
/// its own length's once past max_position_embeddings.) The node keeps the tensor (a shared
/// handle, not a copy), so replays read it too.

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/causal_softmax.hpp"
#include "remat/ops/gemm.hpp"
#include "remat/ops/rope.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

/// The extents of a grouped-query attention over (B, T, H D) queries and (B, T, G D) keys and
/// values, where each head sits in them, and its RoPE: what the fused and the flash node share.
class GqaLayout {
 protected:
  GqaLayout(std::int64_t batch, std::int64_t time, std::int64_t heads, std::int64_t kv_heads,
            std::int64_t dim, RopeOptions rope, std::int64_t window, Tensor<std::int32_t> starts)
      : b_(batch),
        t_(time),
        h_(heads),
        g_(kv_heads),
        d_(dim),
        rep_(heads / kv_heads),
        window_(window),
        rope_(rope),
        starts_(std::move(starts)) {}

  std::int64_t cq() const noexcept { return h_ * d_; }
  std::int64_t ckv() const noexcept { return g_ * d_; }
  /// Head h of batch b in a (B, T, H D) buffer, and the key/value head it reads in (B, T, G D).
  template <class P>
  P* q_at(P* base, std::int64_t b, std::int64_t h) const {
    return base + b * t_ * cq() + h * d_;
  }
  template <class P>
  P* kv_at(P* base, std::int64_t b, std::int64_t h) const {
    return base + b * t_ * ckv() + (h / rep_) * d_;
  }

  /// The starts of batch b's row by position (packed rows), or null (one example per row).
  const std::int32_t* starts_of(std::int64_t b) const {
    return starts_.defined() ? starts_.data() + b * t_ : nullptr;
  }

  /// Rotates queries q into qr and keys k into kr (inverse: rotates back; in place is allowed).
  template <class T>
  void rotate(const Tensor<T>& q, const Tensor<T>& k, Tensor<T>& qr, Tensor<T>& kr,
              bool inverse) const {
    if (shape_only()) return;
    const RopeTable<T> table(t_, d_, rope_);
    const std::int32_t* starts = starts_of(0);  // every row's, one after the other
    table.apply(q.data(), cq(), qr.data(), cq(), b_ * t_, t_, h_, inverse, starts);
    table.apply(k.data(), ckv(), kr.data(), ckv(), b_ * t_, t_, g_, inverse, starts);
  }

  std::int64_t b_, t_, h_, g_, d_, rep_;
  std::int64_t window_;  ///< 0: plain causal; else each query sees the last `window_` keys
  RopeOptions rope_;
  Tensor<std::int32_t> starts_;  ///< undefined: one example per row
};

inline void check_window(const char* op, std::int64_t window) {
  if (window < 0)
    throw ArgumentError(cat(op, ": the sliding window must be 0 (none) or positive, got ", window));
}

/// Packed rows' starts: (B, T), and each example a run of positions, so that position i starts
/// an example (starts[i] == i) or continues the one before it (starts[i] == starts[i - 1]); that
/// also gives 0 <= starts[i] <= i, which the kernels index by. Undefined: nothing to check.
inline void check_starts(const char* op, const Tensor<std::int32_t>& starts, std::int64_t batch,
                         std::int64_t time) {
  if (!starts.defined()) return;
  if (!(starts.shape() == Shape{batch, time})) {
    throw ShapeError(cat(op, ": starts must have the shape (B, T) = ", Shape{batch, time},
                         " of the queries' batch and time, got ", starts.shape()));
  }
  if (shape_only()) return;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int32_t* s = starts.data() + b * time;
    for (std::int64_t i = 0; i < time; ++i) {
      if (s[i] == i || (i > 0 && s[i] == s[i - 1])) continue;
      throw ArgumentError(
          cat(op, ": starts[", b, ", ", i, "] = ", s[i], ": row ", b, " position ", i,
              " must start an example (", i, ")",
              i > 0 ? cat(" or continue the previous position's (", s[i - 1], ")") : std::string(),
              "; starts hold, for each position, the first position of its example"));
    }
  }
}

template <class T>
class GroupedQueryAttentionNode final : public Node<T>, private GqaLayout {
 public:
  GroupedQueryAttentionNode(std::int64_t batch, std::int64_t time, std::int64_t heads,
                            std::int64_t kv_heads, std::int64_t dim, RopeOptions rope,
                            std::int64_t window, Tensor<std::int32_t> starts)
      : GqaLayout(batch, time, heads, kv_heads, dim, rope, window, std::move(starts)) {}
  const OpType& op_type() const noexcept override { return op::grouped_query_attention; }
  bool runs_shape_only() const noexcept override { return true; }
  double forward_flops(typename Node<T>::Inputs, const Tensor<T>&) const override {
    return attention_flops(b_, h_, t_, d_, t_);
  }

  // q: (B, T, H D), k, v: (B, T, G D) -> y: (B, T, H D). Per (b, h), with g = h / (H/G):
  // S = rope(Q) rope(K_g)^T / sqrt(D), P = softmax(causal(S)), y = P V_g. Packed rows: the
  // causal mask also stops at each example's start (the whole product is still computed).
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& v = in[2];
    Tensor<T> qr(in[0].shape()), kr(in[1].shape());
    rotate(in[0], in[1], qr, kr, false);
    Tensor<T> y(in[0].shape());
    Tensor<T> probs(Shape{b_, h_, t_, t_});
    this->save(0, qr);
    this->save(1, kr);
    this->save(2, v);
    this->save(3, probs);
    if (shape_only()) return y;
    const T scale = T(1) / std::sqrt(T(d_));
    for (std::int64_t b = 0; b < b_; ++b) {
      for (std::int64_t h = 0; h < h_; ++h) {
        T* p = probs.data() + (b * h_ + h) * t_ * t_;
        gemm<T>(false, true, t_, t_, d_, scale, q_at(qr.data(), b, h), cq(), kv_at(kr.data(), b, h),
                ckv(), T(0), p, t_);
        causal_softmax_rows<T>(p, t_, nullptr, 0, t_, window_, starts_of(b));
        gemm<T>(false, false, t_, d_, t_, T(1), p, t_, kv_at(v.data(), b, h), ckv(), T(0),
                q_at(y.data(), b, h), cq());
      }
    }
    return y;
  }

  // dV_g = sum over the group of P^T dY; dP = dY V_g^T; dS = P (dP - rowsum(dP P)) / sqrt(D);
  // dQr = dS Kr_g; dKr_g = sum over the group of dS^T Qr; dQ, dK = inverse rotations of dQr, dKr.
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& qr = this->saved(0);
    const Tensor<T>& kr = this->saved(1);
    const Tensor<T>& v = this->saved(2);
    const Tensor<T>& probs = this->saved(3);
    const T scale = T(1) / std::sqrt(T(d_));
    const bool need_qk = grads.needs(0) || grads.needs(1);
    Tensor<T> dq, dk, dp;
    if (need_qk) {
      dq = Tensor<T>(qr.shape());
      dk = Tensor<T>(kr.shape());
    }
    const typename Grads<T>::Target dv = grads.target(2, v.shape());
    if (need_qk || dv.dst) dp = Tensor<T>(Shape{t_, t_});
    // shape-only run: the scratch is allocated as in a real one, nothing computed
    const std::int64_t batches = shape_only() ? 0 : b_;
    for (std::int64_t b = 0; b < batches; ++b) {
      for (std::int64_t h = 0; h < h_; ++h) {
        const T* p = probs.data() + (b * h_ + h) * t_ * t_;
        const T* dy = q_at(gy.data(), b, h);
        const bool first_of_group = h % rep_ == 0;
        if (dv.dst) {
          const T beta = dv.overwrite && first_of_group ? T(0) : T(1);
          gemm<T>(true, false, t_, d_, t_, T(1), p, t_, dy, cq(), beta, kv_at(dv.dst->data(), b, h),
                  ckv());
        }
        if (!need_qk) continue;
        gemm<T>(false, true, t_, t_, d_, T(1), dy, cq(), kv_at(v.data(), b, h), ckv(), T(0),
                dp.data(), t_);
        causal_softmax_backward_rows(p, dp.data(), t_, scale, 0, t_, window_, starts_of(b));
        gemm<T>(false, false, t_, d_, t_, T(1), dp.data(), t_, kv_at(kr.data(), b, h), ckv(), T(0),
                q_at(dq.data(), b, h), cq());
        gemm<T>(true, false, t_, d_, t_, T(1), dp.data(), t_, q_at(qr.data(), b, h), cq(),
                first_of_group ? T(0) : T(1), kv_at(dk.data(), b, h), ckv());
      }
    }
    if (!need_qk) return;
    dp.reset();
    rotate(dq, dk, dq, dk, true);
    grads.add(0, std::move(dq));
    grads.add(1, std::move(dk));
  }

 private:
};

}  // namespace detail

/// Causal grouped-query attention with rotary embeddings: q (B, T, heads x D), k and v
/// (B, T, kv_heads x D), kv_heads dividing heads, D even; returns (B, T, heads x D), the heads'
/// outputs side by side (Hugging Face's layout before o_proj). Query i attends to keys 0..i;
/// queries and keys are rotated by positions rope.offset + t. With kv_heads == heads this is
/// ordinary multi-head attention. A `window` > 0 restricts query i to keys i - window < j <= i
/// (Hugging Face's sliding_window); 0 is no window. Packed rows pass `starts` (B, T) int32: the
/// first position of each position's example, so that query i of row b sees keys
/// starts[b, i] <= j <= i (and its window) and is rotated, as its keys are, by position
/// rope.offset + i - starts[b, i] (see the file comment; a ShapeError or ArgumentError names the
/// row and position of a bad start). Undefined (the default): one example per row.
template <class T>
Var<T> grouped_query_attention(const Var<T>& q, const std::type_identity_t<Var<T>>& k,
                               const std::type_identity_t<Var<T>>& v, std::int64_t heads,
                               std::int64_t kv_heads, RopeOptions rope = {},
                               std::int64_t window = 0, const Tensor<std::int32_t>& starts = {}) {
  const Shape& sq = q.shape();
  const bool heads_ok = heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0;
  const bool ok = heads_ok && sq.rank() == 3 && sq[2] % heads == 0 && (sq[2] / heads) % 2 == 0 &&
                  sq[1] >= 1 && k.shape() == sq.with_last(sq[2] / heads * kv_heads) &&
                  v.shape() == k.shape();
  if (!ok) {
    throw ShapeError(detail::cat(
        "grouped_query_attention: needs q (B, T, heads x D) with D even and T >= 1, k and v (B, T, "
        "kv_heads x D), "
        "kv_heads dividing heads; got q ",
        sq, ", k ", k.shape(), ", v ", v.shape(), ", heads ", heads, ", kv_heads ", kv_heads));
  }
  detail::check_rope_options("grouped_query_attention", rope);
  detail::check_window("grouped_query_attention", window);
  detail::check_starts("grouped_query_attention", starts, sq[0], sq[1]);
  return detail::record_op<detail::GroupedQueryAttentionNode<T>>(
      {&q, &k, &v}, sq[0], sq[1], heads, kv_heads, sq[2] / heads, rope, window, starts);
}

}  // namespace remat
