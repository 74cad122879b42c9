#pragma once
/// @file
/// Llama: the decoder of Llama 2/3, Qwen2/2.5, Qwen3 and Mistral models, Hugging Face's
/// architecture and parameter names. Token embedding, a stack of pre-norm decoder layers
///   h = x + o_proj(gqa(q_proj(n1), k_proj(n1), v_proj(n1))),  n1 = rms_norm(x)
///   y = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),      n2 = rms_norm(h)
/// with rotary embeddings inside the grouped-query attention (ops/attention.hpp), a final
/// RMSNorm and a head to the vocabulary, optionally tied to the embedding. Options by family:
/// biases on q/k/v, o and the MLP, Qwen3's per-head q/k RMSNorm, an explicit head_dim, scaled
/// rotary embeddings and sliding windows (LlamaConfig). No dropout (hub/llama_config.hpp refuses
/// a nonzero attention_dropout). The layers run under any checkpoint plan.
///
/// Packed rows (several examples end to end in a row, hub::batch_inputs) pass `starts` (B, T) to
/// hidden(), logits(), loss() and profile(): each position's example's first position. Every
/// layer's attention then stays within an example and counts RoPE positions from its start
/// (ops/attention.hpp), so the loss and gradients are those of the examples run one by one.
/// The starts travel by value in the layers' closures and the attention nodes, which checkpoint
/// replays run again: nothing is kept in the modules.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "remat/checkpoint/profile.hpp"
#include "remat/checkpoint/sequential.hpp"
#include "remat/nn/layers.hpp"
#include "remat/nn/lm_loss.hpp"
#include "remat/ops/arithmetic.hpp"
#include "remat/ops/attention.hpp"
#include "remat/ops/layout.hpp"
#include "remat/ops/loss.hpp"
#include "remat/ops/rms_norm.hpp"
#include "remat/ops/silu.hpp"

namespace remat::nn {

/// Hugging Face's LlamaConfig / Qwen2Config / Qwen3Config / MistralConfig fields, with their
/// names (hub/llama_config.hpp reads them from a config.json and says how each family's fields
/// map onto these).
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
  /// The attention op (AttentionKernel; not a Hugging Face field): flash keeps no (T x T)
  /// probabilities between forward and backward.
  AttentionKernel attention = AttentionKernel::fused;
  /// HF's model_type: "llama", "qwen2", "qwen3" or "mistral" (written back by
  /// llama_config_json; the maths is set by the fields below, not by this name).
  std::string model_type = "llama";
  /// HF's head_dim when given (Qwen3, Mistral Nemo): q_proj is hidden -> heads x head_dim and
  /// o_proj heads x head_dim -> hidden. 0: hidden_size / num_attention_heads.
  std::int64_t explicit_head_dim = 0;
  bool o_proj_bias = false;  ///< o_proj has a bias (Llama's and Qwen3's attention_bias; not Qwen2)
  bool mlp_bias = false;     ///< gate/up/down projections have biases (Llama's mlp_bias)
  /// Qwen3: q_norm and k_norm, an RMSNorm over each head's head_dim of the queries and the keys
  /// after their projection, before RoPE.
  bool qk_norm = false;
  RopeScaling rope_scaling{};  ///< rope_scaling / rope_parameters (none: the "default" rope)
  /// Each query sees the last sliding_window keys (itself included) on the layers that slide;
  /// 0: no window (Mistral's sliding_window; Qwen2/3's with use_sliding_window).
  std::int64_t sliding_window = 0;
  /// Which layers slide (HF's layer_types == "sliding_attention"); empty: all of them.
  std::vector<bool> sliding_layers{};
  /// HF's pad_token_id, which its models make the embedding's padding_idx: that row starts at
  /// zero and gets no gradient from the lookup (the head's, when tied, still reaches it). -1: none.
  std::int64_t pad_token_id = -1;

  std::int64_t head_dim() const noexcept {
    if (explicit_head_dim > 0) return explicit_head_dim;
    return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
  }

  /// The sliding window of decoder layer `layer` (0: none).
  std::int64_t window_of(std::int64_t layer) const {
    if (sliding_window == 0) return 0;
    if (sliding_layers.empty()) return sliding_window;
    return sliding_layers.at(static_cast<std::size_t>(layer)) ? sliding_window : 0;
  }

  /// The rotary embedding of every layer, from position `offset` on.
  RopeOptions rope(std::int64_t offset = 0) const {
    RopeOptions o{.theta = rope_theta, .offset = offset, .scaling = rope_scaling};
    o.scaling.max_position_embeddings = max_position_embeddings;
    return o;
  }

  void validate() const {
    const bool sizes = vocab_size >= 1 && hidden_size >= 1 && intermediate_size >= 1 &&
                       num_hidden_layers >= 1 && num_attention_heads >= 1 &&
                       num_key_value_heads >= 1 && max_position_embeddings >= 1 &&
                       explicit_head_dim >= 0 && pad_token_id >= -1 && pad_token_id < vocab_size;
    const bool heads = sizes && (explicit_head_dim > 0 || hidden_size % num_attention_heads == 0) &&
                       head_dim() >= 2 && head_dim() % 2 == 0 &&
                       num_attention_heads % num_key_value_heads == 0;
    const bool numbers = rope_theta > 0 && std::isfinite(rope_theta) && rms_norm_eps > 0 &&
                         std::isfinite(rms_norm_eps) && initializer_range > 0 &&
                         std::isfinite(initializer_range);
    const bool window = sliding_window >= 0 &&
                        (sliding_layers.empty() ||
                         static_cast<std::int64_t>(sliding_layers.size()) == num_hidden_layers);
    if (!heads || !numbers || !window) {
      throw ArgumentError(detail::cat(
          "LlamaConfig: need positive sizes, hidden_size divisible by num_attention_heads into an "
          "even head size (or an even explicit head_dim), "
          "num_key_value_heads dividing num_attention_heads, positive finite rope_theta, "
          "rms_norm_eps and initializer_range, a sliding_window >= 0, one sliding flag per "
          "layer (or none) and a pad_token_id in [0, vocab_size) or -1; got "
          "vocab_size ",
          vocab_size, ", hidden_size ", hidden_size, ", intermediate_size ", intermediate_size,
          ", num_hidden_layers ", num_hidden_layers, ", num_attention_heads ", num_attention_heads,
          ", num_key_value_heads ", num_key_value_heads, ", head_dim ", explicit_head_dim,
          ", max_position_embeddings ", max_position_embeddings, ", rope_theta ", rope_theta,
          ", rms_norm_eps ", rms_norm_eps, ", initializer_range ", initializer_range,
          ", sliding_window ", sliding_window, " on ", sliding_layers.size(),
          " layer flags, pad_token_id ", pad_token_id, " (-1: none)"));
    }
    try {
      detail::check_rope_options("LlamaConfig", rope());
    } catch (const ArgumentError& e) {
      throw ArgumentError(detail::cat(e.what(), " (rope_scaling)"));
    }
  }
};

/// How a model's parameters start: drawn as HF's _init_weights draws them, or left empty (of the
/// right shape, uninitialized memory) for a loader that fills every one of them.
enum class ParameterInit { random, empty };

/// Makes projection `name` (Hugging Face's module name, e.g. "model.layers.3.self_attn.q_proj",
/// `in` -> `out`, with a bias or not) while a model is built: a loader's hook to read its weight
/// straight into frozen storage (hub/llama_load.hpp).
template <class T>
using LinearMaker =
    std::function<Linear<T>(const std::string& name, std::int64_t in, std::int64_t out, bool bias)>;

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

}  // namespace remat::nn

namespace remat::detail {
/// A (rows, in) -> (rows, out) projection's parameters: random (nn::Linear's normal init), or
/// left for a loader.
template <class T>
nn::Linear<T> llama_linear(std::int64_t in, std::int64_t out, bool bias, const nn::LlamaConfig& c,
                           Rng& rng, nn::ParameterInit init,
                           const nn::LinearMaker<T>* make = nullptr, const std::string& name = "") {
  if (make) return (*make)(name, in, out, bias);
  if (init == nn::ParameterInit::random)
    return nn::Linear<T>(in, out, rng, bias, c.initializer_range);
  return nn::Linear<T>::uninitialized(in, out, bias);
}
}  // namespace remat::detail

namespace remat::nn {

/// Causal grouped-query self-attention with RoPE: q_proj, k_proj, v_proj (biased when
/// attention_bias), o_proj (biased when o_proj_bias), and Qwen3's q_norm and k_norm. One layer's
/// sliding window (0: none).
///
/// Its steps are public, so that a second forward path (generation with a KV cache) runs the same
/// arithmetic: project() gives the queries, keys and values before RoPE (q/k norms applied),
/// rope_options() and window() what the attention op takes, and o_proj the output projection.
template <class T = float>
class LlamaAttention : public Module<T> {
 public:
  /// Layer `layer`'s attention (its sliding window; the names `make` is given).
  LlamaAttention(const LlamaConfig& c, std::int64_t layer, Rng& rng,
                 ParameterInit init = ParameterInit::random, const LinearMaker<T>* make = nullptr)
      : q_proj(detail::llama_linear<T>(c.hidden_size, c.num_attention_heads * c.head_dim(),
                                       c.attention_bias, c, rng, init, make,
                                       name(layer, "q_proj"))),
        k_proj(detail::llama_linear<T>(c.hidden_size, c.num_key_value_heads * c.head_dim(),
                                       c.attention_bias, c, rng, init, make,
                                       name(layer, "k_proj"))),
        v_proj(detail::llama_linear<T>(c.hidden_size, c.num_key_value_heads * c.head_dim(),
                                       c.attention_bias, c, rng, init, make,
                                       name(layer, "v_proj"))),
        o_proj(detail::llama_linear<T>(c.num_attention_heads * c.head_dim(), c.hidden_size,
                                       c.o_proj_bias, c, rng, init, make, name(layer, "o_proj"))),
        heads_(c.num_attention_heads),
        kv_heads_(c.num_key_value_heads),
        head_dim_(c.head_dim()),
        window_(c.window_of(layer)),
        rope_(c.rope()),
        kind_(c.attention) {
    this->add_module("q_proj", q_proj);
    this->add_module("k_proj", k_proj);
    this->add_module("v_proj", v_proj);
    this->add_module("o_proj", o_proj);
    if (c.qk_norm) {
      q_norm.emplace(c.head_dim(), c.rms_norm_eps);
      k_norm.emplace(c.head_dim(), c.rms_norm_eps);
      this->add_module("q_norm", *q_norm);
      this->add_module("k_norm", *k_norm);
    }
  }

  /// x: (B, T, C) -> (B, T, C); `starts` (B, T): packed rows' (undefined: one example a row).
  Var<T> operator()(const Var<T>& x, const Tensor<std::int32_t>& starts = {}) const {
    // the projections die with this statement, not after o_proj: under BF16 the attention keeps
    // bfloat16 copies of them, and their float values would stay beside while o_proj runs
    const Var<T> y = attend(project(x), starts);
    return o_proj(y);
  }

  /// Queries (B, T, H D), keys and values (B, T, G D), before RoPE.
  struct Projected {
    Var<T> q, k, v;
  };
  /// The projections of x (B, T, C), with q_norm/k_norm applied to each head when present.
  Projected project(const Var<T>& x) const {
    return {head_norm(q_proj(x), q_norm), head_norm(k_proj(x), k_norm), v_proj(x)};
  }
  /// Attention over the projections: (B, T, H D).
  Var<T> attend(const Projected& p, const Tensor<std::int32_t>& starts) const {
    return attention(p.q, p.k, p.v,
                     {.heads = heads_,
                      .kv_heads = kv_heads_,
                      .rope = rope_,
                      .window = window_,
                      .starts = starts,
                      .kernel = kind_});
  }

  std::int64_t heads() const noexcept { return heads_; }
  std::int64_t kv_heads() const noexcept { return kv_heads_; }
  std::int64_t head_dim() const noexcept { return head_dim_; }
  /// This layer's sliding window (0: none): query i sees keys i - window < j <= i.
  std::int64_t window() const noexcept { return window_; }
  /// The rotary embedding of positions from `offset` on.
  RopeOptions rope_options(std::int64_t offset = 0) const {
    RopeOptions o = rope_;
    o.offset = offset;
    return o;
  }

  Linear<T> q_proj, k_proj, v_proj, o_proj;
  std::optional<RMSNorm<T>> q_norm, k_norm;

 private:
  static std::string name(std::int64_t layer, const char* proj) {
    return detail::cat("model.layers.", layer, ".self_attn.", proj);
  }

  /// RMSNorm over each head of y (B, T, heads x D), when `norm` is present.
  Var<T> head_norm(const Var<T>& y, const std::optional<RMSNorm<T>>& norm) const {
    if (!norm) return y;
    const Shape& s = y.shape();
    return reshape((*norm)(reshape(y, Shape{s[0], s[1], s[2] / head_dim_, head_dim_})), s);
  }

  std::int64_t heads_, kv_heads_, head_dim_, window_;
  RopeOptions rope_;
  AttentionKernel kind_;
};

/// The SwiGLU MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), biased when mlp_bias.
template <class T = float>
class LlamaMLP : public Module<T> {
 public:
  /// Layer `layer`'s MLP (the names `make` is given).
  LlamaMLP(const LlamaConfig& c, Rng& rng, ParameterInit init = ParameterInit::random,
           std::int64_t layer = 0, const LinearMaker<T>* make = nullptr)
      : gate_proj(detail::llama_linear<T>(c.hidden_size, c.intermediate_size, c.mlp_bias, c, rng,
                                          init, make, name(layer, "gate_proj"))),
        up_proj(detail::llama_linear<T>(c.hidden_size, c.intermediate_size, c.mlp_bias, c, rng,
                                        init, make, name(layer, "up_proj"))),
        down_proj(detail::llama_linear<T>(c.intermediate_size, c.hidden_size, c.mlp_bias, c, rng,
                                          init, make, name(layer, "down_proj"))) {
    this->add_module("gate_proj", gate_proj);
    this->add_module("up_proj", up_proj);
    this->add_module("down_proj", down_proj);
  }

  // gate's and up's outputs die with the first statement, not after down_proj: under BF16
  // swiglu keeps bfloat16 copies of them, and their float values would stay beside while
  // down_proj runs (LlamaAttention::operator() does the same for its projections)
  Var<T> operator()(const Var<T>& x) const {
    const Var<T> hidden = swiglu(gate_proj(x), up_proj(x));
    return down_proj(hidden);
  }

  Linear<T> gate_proj, up_proj, down_proj;

 private:
  static std::string name(std::int64_t layer, const char* proj) {
    return detail::cat("model.layers.", layer, ".mlp.", proj);
  }
};

/// One decoder layer: x + attn(norm(x)), then + mlp(norm(.)). Parameters in Hugging Face's
/// order: self_attn, mlp, input_layernorm, post_attention_layernorm.
template <class T = float>
class LlamaDecoderLayer : public Module<T> {
 public:
  LlamaDecoderLayer(const LlamaConfig& c, std::int64_t layer, Rng& rng,
                    ParameterInit init = ParameterInit::random,
                    const LinearMaker<T>* make = nullptr)
      : self_attn(c, layer, rng, init, make),
        mlp(c, rng, init, layer, make),
        input_layernorm(c.hidden_size, c.rms_norm_eps),
        post_attention_layernorm(c.hidden_size, c.rms_norm_eps) {
    this->add_module("self_attn", self_attn);
    this->add_module("mlp", mlp);
    this->add_module("input_layernorm", input_layernorm);
    this->add_module("post_attention_layernorm", post_attention_layernorm);
  }

  /// x: (B, T, C) -> (B, T, C); `starts`: packed rows' (LlamaAttention).
  Var<T> operator()(const Var<T>& x, const Tensor<std::int32_t>& starts = {}) const {
    const Var<T> h = x + self_attn(input_layernorm(x), starts);
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

  /// A model whose parameters have their shapes but no values yet, for a loader that fills
  /// every one (hub/llama_load.hpp): no time spent drawing numbers the files overwrite.
  static Llama uninitialized(const LlamaConfig& config) {
    return Llama(config, Rng(config.seed), ParameterInit::empty);
  }

  /// A model whose decoder layers' seven projections come from `make` (a loader reading them
  /// into frozen storage), the rest left empty as uninitialized()'s.
  static Llama with_projections(const LlamaConfig& config, const LinearMaker<T>& make) {
    return Llama(config, Rng(config.seed), ParameterInit::empty, &make);
  }

  const LlamaConfig& config() const noexcept { return config_; }

  /// Final hidden states (B, T, C) for token ids (B, T), the layers run under `plan` (plainly
  /// without one); `starts` (B, T) for packed rows (the file comment; undefined: one example a
  /// row).
  Var<T> hidden(const Tensor<std::int32_t>& ids, const plan::Plan* plan = nullptr,
                const Tensor<std::int32_t>& starts = {}) const {
    Var<T> x = embed(ids);
    check_starts_shape(ids, starts);
    if (plan) {
      // handed over, not copied: x_0 then dies once the first block has read it, as without a
      // plan (a copy here kept it alive through the whole forward pass)
      x = checkpoint_sequential(block_layers(starts), *plan, std::move(x));
    } else {
      for (const LlamaDecoderLayer<T>& layer : layers) x = layer(x, starts);
    }
    return norm(x);
  }

  /// Logits (B, T, V).
  Var<T> logits(const Tensor<std::int32_t>& ids, const plan::Plan* plan = nullptr,
                const Tensor<std::int32_t>& starts = {}) const {
    return linear(hidden(ids, plan, starts), head_weight());
  }

  /// Mean cross-entropy of predicting `targets` (B, T) from `ids` (B, T), over the targets
  /// that are not kIgnoreTarget (a loss mask: prompt tokens, padding). Chunked by default: the
  /// (B T x V) logits and their gradient are never held whole (ops/loss.hpp). `o`: the plan,
  /// the head's chunking and packed rows' starts (nn/lm_loss.hpp, hidden()); with packed rows
  /// the mean is still over the batch's counted targets.
  Var<T> loss(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets,
              const LossOptions& o = {}) const {
    if (!(targets.shape() == ids.shape())) {
      throw ShapeError(detail::cat("Llama::loss: targets ", targets.shape(),
                                   " must have the shape of the ids ", ids.shape()));
    }
    return head_loss(hidden(ids, o.plan, o.starts), targets, o);
  }

  /// Measures the layers as a chain for the planners (plan::profile), on a batch: their input
  /// is the embedding's output, made during the step; the loss is the head and the loss() of
  /// that name, run as `loss` says (chunking, packed rows' starts; no plan: profiling measures
  /// the layers without one). Parameters receive gradients: zero_grad() afterwards.
  plan::Chain profile(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets,
                      const LossOptions& loss = {}, plan::ProfileOptions options = {}) const {
    if (loss.plan)
      throw ArgumentError(
          "Llama::profile: the loss options carry a plan; profile() measures the "
          "layers without one (leave LossOptions::plan null)");
    const Tensor<std::int32_t>& starts = loss.starts;
    Tensor<T> embedded;
    {
      NoGradGuard no_grad;
      embedded = embed(ids).value();
    }
    check_starts_shape(ids, starts);
    plan::Chain c = plan::profile(
        block_layers(starts), embedded,
        [&](const Var<T>& out) { return head_loss(norm(out), targets, loss); }, options);
    c.input_made_in_step = true;
    c.output_held = false;  // loss() keeps no Var of the layers' output (the final norm saves it)
    return c;
  }

  /// The decoder layers as a sequence, for checkpoint_sequential() and plan::profile(), over
  /// packed rows' `starts` when defined. Each closure holds the starts by value (a shared
  /// handle): a later forward with other starts cannot change what these layers attend to.
  std::vector<Layer> block_layers(const Tensor<std::int32_t>& starts = {}) const {
    std::vector<Layer> out;
    for (const LlamaDecoderLayer<T>& layer : layers)
      out.push_back([&layer, starts](const Var<T>& x) { return layer(x, starts); });
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
  Llama(const LlamaConfig& c, Rng rng, ParameterInit init = ParameterInit::random,
        const LinearMaker<T>* make = nullptr)
      : config_((c.validate(), c)),
        embed_tokens(
            init == ParameterInit::random
                ? Embedding<T>(c.vocab_size, c.hidden_size, rng, c.initializer_range,
                               c.pad_token_id)
                : Embedding<T>::uninitialized(c.vocab_size, c.hidden_size, c.pad_token_id)),
        norm(c.hidden_size, c.rms_norm_eps) {
    this->add_module("model.embed_tokens", embed_tokens);
    layers.reserve(static_cast<std::size_t>(c.num_hidden_layers));
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
      layers.emplace_back(c, i, rng, init, make);
      this->add_module(detail::cat("model.layers.", i), layers.back());
    }
    this->add_module("model.norm", norm);
    if (!c.tie_word_embeddings) {
      lm_head.emplace(detail::llama_linear<T>(c.hidden_size, c.vocab_size, false, c, rng, init));
      lm_head->weight_read_directly_by("Llama's loss and logits (lm_head)");
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

  /// Packed rows' starts, when given, are (B, T) as the ids (the attention ops check the rest).
  static void check_starts_shape(const Tensor<std::int32_t>& ids,
                                 const Tensor<std::int32_t>& starts) {
    if (starts.defined() && !(starts.shape() == ids.shape())) {
      throw ShapeError(detail::cat("Llama: starts ", starts.shape(),
                                   " must have the shape of the token ids ", ids.shape()));
    }
  }

  /// The mean cross-entropy of the head on final hidden states h (B, T, C).
  Var<T> head_loss(const Var<T>& h, const Tensor<std::int32_t>& targets,
                   const LossOptions& o) const {
    return detail::lm_head_loss(reshape(h, {-1, config_.hidden_size}), head_weight(),
                                targets.reshape(Shape{targets.numel()}), o, "Llama");
  }
};

}  // namespace remat::nn
