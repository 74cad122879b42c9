#pragma once
/// @file
/// The transformer pieces: an MLP block, multi-head causal self-attention, and a pre-LN block
/// x + attn(ln1(x)), then + mlp(ln2(x)).

#include "remat/nn/layers.hpp"
#include "remat/ops/arithmetic.hpp"
#include "remat/ops/attention.hpp"
#include "remat/ops/unary.hpp"

namespace remat::nn {

/// Linear(d, hidden) -> GELU (tanh approximation, GPT-2's) -> Linear(hidden, d) -> dropout.
template <class T = float>
class MLP : public Module<T> {
 public:
  MLP(std::int64_t d, std::int64_t hidden, double dropout, Rng& rng, double init_std = 0,
      double out_std = 0)
      : fc(d, hidden, rng, true, init_std), proj(hidden, d, rng, true, out_std), drop(dropout) {
    this->add_module("fc", fc);
    this->add_module("proj", proj);
    this->add_module("drop", drop);
  }

  // A statement per op that keeps a copy (Note [BF16 saves]): a temporary lives to the end of its
  // statement, so fc's float output would stay beside the bfloat16 copy gelu saved of it while
  // proj runs (8 MiB of a BF16 GPT step's 184 at its peak, in remat_bench's gpt).
  Var<T> operator()(const Var<T>& x) const {
    const Var<T> hidden = gelu_tanh(fc(x));
    return drop(proj(hidden));
  }

  Linear<T> fc, proj;
  Dropout<T> drop;
};

/// Multi-head causal self-attention: one projection to Q, K, V side by side, attention per head
/// (ops/attention.hpp), an output projection, dropout on the attention weights and the output.
template <class T = float>
class CausalSelfAttention : public Module<T> {
 public:
  CausalSelfAttention(std::int64_t d, std::int64_t heads, double dropout, Rng& rng,
                      double init_std = 0, double out_std = 0,
                      AttentionKernel kind = AttentionKernel::fused)
      : qkv(d, 3 * d, rng, true, init_std),
        proj(d, d, rng, true, out_std),
        drop(dropout),
        heads_(heads),
        p_(dropout),
        kind_(kind) {
    if (heads < 1 || d % heads != 0) {
      throw ShapeError(detail::cat("nn::CausalSelfAttention: width ", d, " is not divisible by ",
                                   heads, " heads"));
    }
    this->add_module("qkv", qkv);
    this->add_module("proj", proj);
    this->add_module("drop", drop);
  }

  /// x: (B, T, C) -> (B, T, C)
  Var<T> operator()(const Var<T>& x) const {
    const double p = this->training() ? p_ : 0.0;
    // qkv's output dies with this statement, not after proj (see MLP::operator())
    const Var<T> y = attention(qkv(x), {.heads = heads_, .dropout = p, .kernel = kind_});
    return drop(proj(y));
  }

  /// Which attention op runs.
  AttentionKernel kind() const noexcept { return kind_; }
  /// Attention heads (the cached forward of nn/generate.hpp reads it).
  std::int64_t heads() const noexcept { return heads_; }

  Linear<T> qkv, proj;
  Dropout<T> drop;

 private:
  std::int64_t heads_;
  double p_;
  AttentionKernel kind_;
};

/// Pre-LN transformer block: h = x + attn(ln1(x)); h + mlp(ln2(h)).
template <class T = float>
class TransformerBlock : public Module<T> {
 public:
  /// init_std and out_std: normal initialization of the projections (0: PyTorch's default);
  /// GPT-2 scales the two residual projections' out_std by 1/sqrt(2 layers).
  TransformerBlock(std::int64_t d, std::int64_t heads, double dropout, Rng& rng,
                   double init_std = 0, double out_std = 0,
                   AttentionKernel attention = AttentionKernel::fused)
      : ln1(d),
        attn(d, heads, dropout, rng, init_std, out_std, attention),
        ln2(d),
        mlp(d, 4 * d, dropout, rng, init_std, out_std) {
    this->add_module("ln1", ln1);
    this->add_module("attn", attn);
    this->add_module("ln2", ln2);
    this->add_module("mlp", mlp);
  }

  Var<T> operator()(const Var<T>& x) const {
    const Var<T> h = x + attn(ln1(x));
    return h + mlp(ln2(h));
  }

  LayerNorm<T> ln1;
  CausalSelfAttention<T> attn;
  LayerNorm<T> ln2;
  MLP<T> mlp;
};

}  // namespace remat::nn
