#pragma once
/// @file
/// Llama: the decoder of Llama, Qwen2 and Mistral-style models, Hugging Face's architecture and
/// parameter names. Token embedding, a stack of pre-norm decoder layers
///   h = x + o_proj(gqa(q_proj(n1), k_proj(n1), v_proj(n1))),  n1 = rms_norm(x)
///   y = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),      n2 = rms_norm(h)
/// with rotary embeddings inside the grouped-query attention (ops/gqa_attention.hpp), a final
/// RMSNorm and a head to the vocabulary, optionally tied to the embedding. No dropout (HF's
/// attention_dropout is 0 for these models). The layers run under any checkpoint plan.

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "remat/checkpoint/profile.hpp"
#include "remat/checkpoint/sequential.hpp"
#include "remat/nn/attention.hpp"
#include "remat/nn/layers.hpp"
#include "remat/ops/arithmetic.hpp"
#include "remat/ops/flash_gqa_attention.hpp"
#include "remat/ops/gqa_attention.hpp"
#include "remat/ops/layout.hpp"
#include "remat/ops/loss.hpp"
#include "remat/ops/rms_norm.hpp"
#include "remat/ops/silu.hpp"

namespace remat::nn {

/// Hugging Face's LlamaConfig / Qwen2Config fields, with their names (nn/llama_config.hpp
/// reads them from a config.json).
struct LlamaConfig {
  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads =
      32;  ///< fewer than num_attention_heads: grouped-query attention
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;  ///< lm_head reuses model.embed_tokens.weight
  bool attention_bias = false;       ///< q/k/v projections have biases (Qwen2: true)
  std::int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;  ///< normal(0, this) initialization of every matrix
  std::uint64_t seed = 1;           ///< initialization (not a Hugging Face field)
  /// The attention op (nn::Attention; not a Hugging Face field): flash keeps no (T x T)
  /// probabilities between forward and backward.
  Attention attention = Attention::fused;

  std::int64_t head_dim() const noexcept {
    return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
  }

  void validate() const {
    const bool sizes = vocab_size >= 1 && hidden_size >= 1 && intermediate_size >= 1 &&
                       num_hidden_layers >= 1 && num_attention_heads >= 1 &&
                       num_key_value_heads >= 1 && max_position_embeddings >= 1;
    const bool heads = sizes && hidden_size % num_attention_heads == 0 && head_dim() % 2 == 0 &&
                       num_attention_heads % num_key_value_heads == 0;
    const bool numbers = rope_theta > 0 && std::isfinite(rope_theta) && rms_norm_eps > 0 &&
                         std::isfinite(rms_norm_eps) && initializer_range > 0 &&
                         std::isfinite(initializer_range);
    if (!heads || !numbers) {
      throw UsageError(detail::cat(
          "LlamaConfig: need positive sizes, hidden_size divisible by num_attention_heads into an "
          "even head size, "
          "num_key_value_heads dividing num_attention_heads, positive finite rope_theta, "
          "rms_norm_eps and initializer_range; got "
          "vocab_size ",
          vocab_size, ", hidden_size ", hidden_size, ", intermediate_size ", intermediate_size,
          ", num_hidden_layers ", num_hidden_layers, ", num_attention_heads ", num_attention_heads,
          ", num_key_value_heads ", num_key_value_heads, ", max_position_embeddings ",
          max_position_embeddings, ", rope_theta ", rope_theta, ", rms_norm_eps ", rms_norm_eps,
          ", initializer_range ", initializer_range));
    }
  }
};

/// RMSNorm over the last axis with a learned scale (ones).
template <class T = float>
class RMSNorm : public Module<T> {
 public:
  explicit RMSNorm(std::int64_t dim, double eps = 1e-6) : eps_(eps) {
    if (dim < 1) throw ShapeError(detail::cat("nn::RMSNorm: size must be positive, got ", dim));
    weight = this->add_parameter("weight", Tensor<T>::ones({dim}));
  }
  Var<T> operator()(const Var<T>& x) const { return rms_norm(x, weight, T(eps_)); }

  Parameter<T> weight;

 private:
  double eps_;
};

/// Causal grouped-query self-attention with RoPE: q_proj, k_proj, v_proj (biased when
/// attention_bias), o_proj.
template <class T = float>
class LlamaAttention : public Module<T> {
 public:
  LlamaAttention(const LlamaConfig& c, Rng& rng)
      : q_proj(c.hidden_size, c.hidden_size, rng, c.attention_bias, c.initializer_range),
        k_proj(c.hidden_size, c.num_key_value_heads * c.head_dim(), rng, c.attention_bias,
               c.initializer_range),
        v_proj(c.hidden_size, c.num_key_value_heads * c.head_dim(), rng, c.attention_bias,
               c.initializer_range),
        o_proj(c.hidden_size, c.hidden_size, rng, false, c.initializer_range),
        heads_(c.num_attention_heads),
        kv_heads_(c.num_key_value_heads),
        rope_{.theta = c.rope_theta},
        kind_(c.attention) {
    this->add_module("q_proj", q_proj);
    this->add_module("k_proj", k_proj);
    this->add_module("v_proj", v_proj);
    this->add_module("o_proj", o_proj);
  }

  /// x: (B, T, C) -> (B, T, C)
  Var<T> operator()(const Var<T>& x) const {
    const Var<T> q = q_proj(x), k = k_proj(x), v = v_proj(x);
    return o_proj(kind_ == Attention::flash
                      ? flash_grouped_query_attention(q, k, v, heads_, kv_heads_, rope_)
                      : grouped_query_attention(q, k, v, heads_, kv_heads_, rope_));
  }

  /// What the cached forward (nn/generate.hpp) needs to run this attention over a KV cache.
  std::int64_t heads() const noexcept { return heads_; }
  std::int64_t kv_heads() const noexcept { return kv_heads_; }
  const RopeOptions& rope() const noexcept { return rope_; }

  Linear<T> q_proj, k_proj, v_proj, o_proj;

 private:
  std::int64_t heads_, kv_heads_;
  RopeOptions rope_;
  Attention kind_;
};

/// The SwiGLU MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
template <class T = float>
class LlamaMLP : public Module<T> {
 public:
  LlamaMLP(const LlamaConfig& c, Rng& rng)
      : gate_proj(c.hidden_size, c.intermediate_size, rng, false, c.initializer_range),
        up_proj(c.hidden_size, c.intermediate_size, rng, false, c.initializer_range),
        down_proj(c.intermediate_size, c.hidden_size, rng, false, c.initializer_range) {
    this->add_module("gate_proj", gate_proj);
    this->add_module("up_proj", up_proj);
    this->add_module("down_proj", down_proj);
  }

  Var<T> operator()(const Var<T>& x) const { return down_proj(swiglu(gate_proj(x), up_proj(x))); }

  Linear<T> gate_proj, up_proj, down_proj;
};

/// One decoder layer: x + attn(norm(x)), then + mlp(norm(.)). Parameters in Hugging Face's
/// order: self_attn, mlp, input_layernorm, post_attention_layernorm.
template <class T = float>
class LlamaDecoderLayer : public Module<T> {
 public:
  LlamaDecoderLayer(const LlamaConfig& c, Rng& rng)
      : self_attn(c, rng),
        mlp(c, rng),
        input_layernorm(c.hidden_size, c.rms_norm_eps),
        post_attention_layernorm(c.hidden_size, c.rms_norm_eps) {
    this->add_module("self_attn", self_attn);
    this->add_module("mlp", mlp);
    this->add_module("input_layernorm", input_layernorm);
    this->add_module("post_attention_layernorm", post_attention_layernorm);
  }

  Var<T> operator()(const Var<T>& x) const {
    const Var<T> h = x + self_attn(input_layernorm(x));
    return h + mlp(post_attention_layernorm(h));
  }

  LlamaAttention<T> self_attn;
  LlamaMLP<T> mlp;
  RMSNorm<T> input_layernorm, post_attention_layernorm;
};

template <class T = float>
class Llama : public Module<T> {
  LlamaConfig config_;  // first: the layers below are built from it

 public:
  using Layer = std::function<Var<T>(const Var<T>&)>;

  explicit Llama(const LlamaConfig& config) : Llama(config, Rng(config.seed)) {}

  const LlamaConfig& config() const noexcept { return config_; }

  /// Final hidden states (B, T, C) for token ids (B, T), the layers run under `plan` (plainly
  /// without one).
  Var<T> hidden(const Tensor<std::int32_t>& ids, const plan::Plan* plan = nullptr) const {
    Var<T> x = embed(ids);
    if (plan) {
      // handed over, not copied: x_0 then dies once the first block has read it, as without a
      // plan (a copy here kept it alive through the whole forward pass)
      x = checkpoint_sequential(block_layers(), *plan, std::move(x));
    } else {
      for (const LlamaDecoderLayer<T>& layer : layers) x = layer(x);
    }
    return norm(x);
  }

  /// Logits (B, T, V).
  Var<T> logits(const Tensor<std::int32_t>& ids, const plan::Plan* plan = nullptr) const {
    return linear(hidden(ids, plan), head_weight());
  }

  /// Mean cross-entropy of predicting `targets` (B, T) from `ids` (B, T). Chunked by default:
  /// the (B T x V) logits and their gradient are never held whole (ops/loss.hpp).
  Var<T> loss(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets,
              const plan::Plan* plan = nullptr, bool chunked = true) const {
    if (!(targets.shape() == ids.shape())) {
      throw ShapeError(detail::cat("Llama::loss: targets ", targets.shape(),
                                   " must have the shape of the ids ", ids.shape()));
    }
    return head_loss(hidden(ids, plan), targets, chunked);
  }

  /// Measures the layers as a chain for the planners (plan::profile), on a batch: their input
  /// is the embedding's output, made during the step; the loss is the head and the loss() of
  /// that name (chunked or not). Parameters receive gradients: zero_grad() afterwards.
  plan::Chain profile(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets,
                      bool chunked = true, plan::ProfileOptions options = {}) const {
    Tensor<T> embedded;
    {
      NoGradGuard no_grad;
      embedded = embed(ids).value();
    }
    plan::Chain c = plan::profile(
        block_layers(), embedded,
        [&](const Var<T>& out) { return head_loss(norm(out), targets, chunked); }, options);
    c.input_made_in_step = true;
    c.output_held = false;  // loss() keeps no Var of the layers' output (the final norm saves it)
    return c;
  }

  /// The decoder layers as a sequence, for checkpoint_sequential() and plan::profile().
  std::vector<Layer> block_layers() const {
    std::vector<Layer> out;
    for (const LlamaDecoderLayer<T>& layer : layers)
      out.push_back([&layer](const Var<T>& x) { return layer(x); });
    return out;
  }

  /// The head's weight (V, C): the token embedding's when tied.
  Parameter<T> head_weight() const { return lm_head ? lm_head->weight : embed_tokens.weight; }

  Llama(const Llama&) = delete;  // block_layers() hands out references to the layers
  Llama& operator=(const Llama&) = delete;
  Llama(Llama&&) noexcept = default;
  Llama& operator=(Llama&&) noexcept = default;

  Embedding<T> embed_tokens;
  std::vector<LlamaDecoderLayer<T>> layers;
  RMSNorm<T> norm;
  std::optional<Linear<T>> lm_head;

 private:
  Llama(const LlamaConfig& c, Rng rng)
      : config_((c.validate(), c)),
        embed_tokens(c.vocab_size, c.hidden_size, rng, c.initializer_range),
        norm(c.hidden_size, c.rms_norm_eps) {
    this->add_module("model.embed_tokens", embed_tokens);
    layers.reserve(static_cast<std::size_t>(c.num_hidden_layers));
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
      layers.emplace_back(c, rng);
      this->add_module(detail::cat("model.layers.", i), layers.back());
    }
    this->add_module("model.norm", norm);
    if (!c.tie_word_embeddings) {
      lm_head.emplace(c.hidden_size, c.vocab_size, rng, false, c.initializer_range);
      this->add_module("lm_head", *lm_head);
    }
  }

  Var<T> embed(const Tensor<std::int32_t>& ids) const {
    if (!ids.defined() || ids.rank() != 2 || ids.dim(1) < 1 ||
        ids.dim(1) > config_.max_position_embeddings) {
      throw ShapeError(detail::cat(
          "Llama: token ids must be (B, T) with 1 <= T <= max_position_embeddings = ",
          config_.max_position_embeddings, ", got shape ", ids.defined() ? ids.shape() : Shape{}));
    }
    return embed_tokens(ids);
  }

  /// The mean cross-entropy of the head on final hidden states h (B, T, C).
  Var<T> head_loss(const Var<T>& h, const Tensor<std::int32_t>& targets, bool chunked) const {
    const Var<T> rows = reshape(h, {-1, config_.hidden_size});
    const Tensor<std::int32_t> flat = targets.reshape(Shape{targets.numel()});
    return chunked ? linear_cross_entropy(rows, head_weight(), flat)
                   : cross_entropy(linear(rows, head_weight()), flat);
  }
};

}  // namespace remat::nn
