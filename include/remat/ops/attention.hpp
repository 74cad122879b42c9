#pragma once
/// @file
/// causal_self_attention: multi-head causal attention straight from the packed (B, T, 3C)
/// projection, one node. Each head's Q, K and V are read in place with strided GEMMs (no head
/// transposes); the node saves its input and the attention probabilities (B, H, T, T), and draws
/// its dropout mask again in backward instead of storing it.

#include <cmath>

#include "remat/core/record.hpp"
#include "remat/core/rng.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/causal_softmax.hpp"
#include "remat/ops/gemm.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class CausalAttentionNode final : public Node<T> {
 public:
  CausalAttentionNode(std::int64_t batch, std::int64_t time, std::int64_t channels,
                      std::int64_t heads, double dropout, std::uint64_t seed)
      : b_(batch),
        t_(time),
        c_(channels),
        h_(heads),
        d_(channels / heads),
        p_(dropout),
        seed_(seed),
        threshold_(static_cast<std::uint32_t>(std::min(dropout * 4294967296.0, 4294967295.0))) {}
  const OpType& op_type() const noexcept override { return op::causal_self_attention; }
  bool runs_shape_only() const noexcept override { return true; }
  double forward_flops(typename Node<T>::Inputs, const Tensor<T>&) const override {
    return attention_flops(b_, h_, t_, d_, t_);
  }

  // qkv: (B, T, 3C) -> y: (B, T, C); per (b, h): S = Q K^T / sqrt(D), P = softmax(mask(S)),
  // y = dropout(P) V.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& qkv = in[0];
    Tensor<T> y(Shape{b_, t_, c_});
    Tensor<T> probs(Shape{b_, h_, t_, t_});
    Tensor<T> dropped = dropout_scratch();
    this->save(0, qkv);
    this->save(1, probs);
    if (shape_only()) return y;
    const T scale = T(1) / std::sqrt(T(d_));
    for (std::int64_t b = 0; b < b_; ++b) {
      for (std::int64_t h = 0; h < h_; ++h) {
        T* p = probs.data() + (b * h_ + h) * t_ * t_;
        gemm<T>(false, true, t_, t_, d_, scale, q(qkv, b, h), 3 * c_, k(qkv, b, h), 3 * c_, T(0), p,
                t_);
        causal_softmax_rows<T>(p, t_, nullptr, 0, t_);
        const T* weights = p;
        if (p_ > 0) {
          apply_dropout(p, dropped.data(), b, h);
          weights = dropped.data();
        }
        gemm<T>(false, false, t_, d_, t_, T(1), weights, t_, v(qkv, b, h), 3 * c_, T(0),
                y.data() + b * t_ * c_ + h * d_, c_);
      }
    }
    return y;
  }

  // dV = dropout(P)^T dY; dP = dropout'(dY V^T); dS = P (dP - rowsum(dP P)) / sqrt(D);
  // dQ = dS K; dK = dS^T Q.
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& qkv = this->saved(0);
    const Tensor<T>& probs = this->saved(1);
    const typename Grads<T>::Target g = grads.target(0, qkv.shape());
    if (!g.dst) return;
    Tensor<T> dp(Shape{t_, t_});
    Tensor<T> dropped = dropout_scratch();
    if (shape_only()) return;
    const T scale = T(1) / std::sqrt(T(d_));
    const T beta = g.overwrite ? T(0) : T(1);
    for (std::int64_t b = 0; b < b_; ++b) {
      for (std::int64_t h = 0; h < h_; ++h) {
        const T* p = probs.data() + (b * h_ + h) * t_ * t_;
        const T* dy = gy.data() + b * t_ * c_ + h * d_;
        T* gq = g.dst->data() + b * t_ * 3 * c_ + h * d_;
        const T* weights = p;
        if (p_ > 0) {
          apply_dropout(p, dropped.data(), b, h);
          weights = dropped.data();
        }
        gemm<T>(true, false, t_, d_, t_, T(1), weights, t_, dy, c_, beta, gq + 2 * c_, 3 * c_);
        gemm<T>(false, true, t_, t_, d_, T(1), dy, c_, v(qkv, b, h), 3 * c_, T(0), dp.data(), t_);
        if (p_ > 0) apply_dropout(dp.data(), dp.data(), b, h);
        causal_softmax_backward_rows(p, dp.data(), t_, scale, 0, t_);
        gemm<T>(false, false, t_, d_, t_, T(1), dp.data(), t_, k(qkv, b, h), 3 * c_, beta, gq,
                3 * c_);
        gemm<T>(true, false, t_, d_, t_, T(1), dp.data(), t_, q(qkv, b, h), 3 * c_, beta, gq + c_,
                3 * c_);
      }
    }
  }

 private:
  /// A (T, T) block for one head's dropped-out weights; none without dropout.
  Tensor<T> dropout_scratch() const { return p_ > 0 ? Tensor<T>(Shape{t_, t_}) : Tensor<T>(); }

  const T* q(const Tensor<T>& qkv, std::int64_t b, std::int64_t h) const {
    return qkv.data() + b * t_ * 3 * c_ + h * d_;
  }
  const T* k(const Tensor<T>& qkv, std::int64_t b, std::int64_t h) const {
    return q(qkv, b, h) + c_;
  }
  const T* v(const Tensor<T>& qkv, std::int64_t b, std::int64_t h) const {
    return q(qkv, b, h) + 2 * c_;
  }

  /// dst = src with the (b, h) block's dropout mask applied (dst may be src). Element (i, j) of
  /// head (b, h) draws at counter ((b H + h) T + i) T + j of the node's stream.
  void apply_dropout(const T* src, T* dst, std::int64_t b, std::int64_t h) const {
    const CounterRng rng = CounterRng::at(seed_, this->id);
    const T keep_scale = static_cast<T>(1.0 / (1.0 - p_));
    const auto base = static_cast<std::uint32_t>((b * h_ + h) * t_ * t_);
    const std::uint32_t threshold = threshold_;
    for_chunks(t_ * t_, [&](std::int64_t s, std::int64_t e) {
      for (std::int64_t i = s; i < e; ++i) {
        dst[i] = rng.bits(base + static_cast<std::uint32_t>(i)) >= threshold ? src[i] * keep_scale
                                                                             : T(0);
      }
    });
  }

  std::int64_t b_, t_, c_, h_, d_;
  double p_;
  std::uint64_t seed_;
  std::uint32_t threshold_;
};

}  // namespace detail

/// Multi-head causal self-attention from the packed projection qkv (B, T, 3C) (Q, K, V side by
/// side, each C = heads x D wide): returns (B, T, C), the heads' outputs side by side. Query i
/// attends to keys 0..i; attention weights are dropped out with probability `dropout`.
template <class T>
Var<T> causal_self_attention(const Var<T>& qkv, std::int64_t heads, double dropout = 0.0) {
  const Shape& s = qkv.shape();
  if (s.rank() != 3 || s[2] % 3 != 0 || heads < 1 || (s[2] / 3) % heads != 0) {
    throw ShapeError(detail::cat(
        "causal_self_attention: needs qkv of shape (B, T, 3C) with C divisible by heads = ", heads,
        ", got ", s));
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw ArgumentError(
        detail::cat("causal_self_attention: dropout must be in [0, 1), got ", dropout));
  }
  return detail::record_op<detail::CausalAttentionNode<T>>({&qkv}, s[0], s[1], s[2] / 3, heads,
                                                           dropout, detail::rng_seed_for(qkv));
}

}  // namespace remat
