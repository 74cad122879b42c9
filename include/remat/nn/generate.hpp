#pragma once
/// @file
/// Text generation with a KV cache (nn/kv_cache.hpp) for nn::Llama and nn::GPT, base or with
/// LoRA adapters (nn/lora.hpp), with float or quantized frozen weights (nn/quantize_blocks.hpp).
///
/// forward_cached() runs the model on the positions after those in the cache, layer by layer
/// through the model's own modules (norms, projections with their biases, LoRA hooks and weight
/// storage, MLPs, head): only the attention core is the cache's (KvCache::attend), so a feature
/// of a projection or a norm reaches generation with no second copy of its maths. Everything
/// runs under NoGradGuard: no tape records, no activation is saved, and the only memory that
/// outlives a step is the cache.
///
/// generate() feeds the prompt once (the prefill), then one token per step: the cost of a step
/// is the model on one position plus the attention over the cache, whatever the prompt's length.
/// It stops after max_new_tokens, at an end-of-sequence id, or at a stop string, as
/// transformers' StopStringCriteria: the text of the prompt and the new tokens (special tokens
/// kept) contains it, ending inside the last token's text, that is, beyond the text of the
/// sequence without that token; a stop string may so begin in the prompt, never end there. The
/// tokens that made it are kept, as StopStringCriteria keeps them. A repetition penalty
/// (transformers' RepetitionPenaltyLogitsProcessor) rewrites each step's logits before the choice.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <functional>
#include <string>
#include <vector>

#include "remat/core/grad_mode.hpp"
#include "remat/nn/gpt.hpp"
#include "remat/nn/kv_cache.hpp"
#include "remat/nn/llama.hpp"
#include "remat/nn/sampling.hpp"

namespace remat::detail {

/// Throws unless ids are (cache.batch(), n >= 1) and n more positions fit the cache.
template <class T>
void check_cached_ids(const char* op, const Tensor<std::int32_t>& ids,
                      const nn::KvCache<T>& cache) {
  if (!ids.defined() || ids.rank() != 2 || ids.dim(0) != cache.batch() || ids.dim(1) < 1) {
    throw ShapeError(detail::cat(op, ": token ids must be (", cache.batch(),
                                 ", n) with n >= 1 (the cache's batch), got shape ",
                                 ids.defined() ? ids.shape() : Shape{}));
  }
  cache.check_room(op, ids.dim(1));
}

/// The last position of x (B, n, C) as (B, 1, C).
template <class T>
Var<T> last_position(const Var<T>& x) {
  const std::int64_t b = x.dim(0), n = x.dim(1), c = x.dim(2);
  if (n == 1) return x;
  Tensor<T> out(Shape{b, 1, c});
  for (std::int64_t i = 0; i < b; ++i)
    std::memcpy(out.data() + i * c, x.value().data() + (i * n + n - 1) * c, sizeof(T) * c);
  return Var<T>(std::move(out));
}

/// Columns [c0, c0 + width) of x (B, n, W) as a (B, n, width) tensor.
template <class T>
Tensor<T> columns(const Tensor<T>& x, std::int64_t c0, std::int64_t width) {
  const std::int64_t rows = x.numel() / x.dim(-1), w = x.dim(-1);
  Tensor<T> out(x.shape().with_last(width));
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data() + r * width, x.data() + r * w + c0, sizeof(T) * width);
  return out;
}

/// Logits of the positions of x (B, n, C) after the final norm: all of them (B, n, V), or the
/// last one's (B, V).
template <class T, class Norm>
Tensor<T> head_logits(const Var<T>& x, const Norm& norm, const Parameter<T>& head,
                      bool all_positions) {
  if (all_positions) return linear(norm(x), head).value();
  const Tensor<T> last = linear(norm(last_position(x)), head).value();
  return last.reshape(Shape{x.dim(0), last.dim(-1)});
}

/// Whether a stop string ends beyond byte `before` of `text` (StopStringCriteria's rule: it must
/// end inside the last token's text). Such a match starts at or after before + 1 - its length.
inline bool ends_after(const std::string& text, std::size_t before,
                       const std::vector<std::string>& stop) {
  return std::any_of(stop.begin(), stop.end(), [&](const std::string& s) {
    if (s.empty()) return false;
    const std::size_t from = before + 1 > s.size() ? before + 1 - s.size() : 0;
    return text.find(s, from) != std::string::npos;
  });
}

}  // namespace remat::detail

namespace remat::nn {

/// A cache for `model`'s layers, `batch` sequences of up to `capacity` positions (at most
/// max_position_embeddings, the full forward's limit too).
template <class T>
KvCache<T> make_kv_cache(const Llama<T>& model, std::int64_t batch, std::int64_t capacity) {
  const LlamaConfig& c = model.config();
  if (capacity > c.max_position_embeddings) {
    throw ArgumentError(
        detail::cat("nn::make_kv_cache: capacity ", capacity,
                    " exceeds the model's max_position_embeddings = ", c.max_position_embeddings));
  }
  const LlamaAttention<T>& a = model.layers.front().self_attn;
  return KvCache<T>(c.num_hidden_layers, batch, capacity, a.k_proj.out_features());
}

/// A cache for a GPT: at most config().context positions (its position table's size).
template <class T>
KvCache<T> make_kv_cache(const GPT<T>& model, std::int64_t batch, std::int64_t capacity) {
  const GPTConfig& c = model.config();
  if (capacity > c.context) {
    throw ArgumentError(detail::cat("nn::make_kv_cache: capacity ", capacity,
                                    " exceeds the GPT's context = ", c.context));
  }
  return KvCache<T>(c.layers, batch, capacity, c.width);
}

/// One Llama attention over the cache: the layer's own projections (biases, LoRA, storage,
/// Qwen3's q/k norms: LlamaAttention::project), the cache's attention with the layer's RoPE
/// (scaling included) and sliding window, the layer's o_proj. x: (B, n, C) normed.
template <class T>
Var<T> attention_cached(const LlamaAttention<T>& a, const Var<T>& x, KvCache<T>& cache,
                        std::int64_t layer) {
  const typename LlamaAttention<T>::Projected p = a.project(x);
  const RopeOptions rope = a.rope_options();
  return a.o_proj(Var<T>(
      cache.attend(layer, p.q.value(), p.k.value(), p.v.value(), a.heads(), &rope, a.window())));
}

/// One Llama decoder layer over the cache, the residual structure of its operator().
template <class T>
Var<T> layer_cached(const LlamaDecoderLayer<T>& d, const Var<T>& x, KvCache<T>& cache,
                    std::int64_t layer) {
  const Var<T> h = x + attention_cached(d.self_attn, d.input_layernorm(x), cache, layer);
  return h + d.mlp(d.post_attention_layernorm(h));
}

/// Logits for ids (B, n) at the positions following the cache's, whose keys and values join the
/// cache: the last position's (B, V), or every position's (B, n, V). No tape records.
template <class T>
Tensor<T> forward_cached(const Llama<T>& model, const Tensor<std::int32_t>& ids, KvCache<T>& cache,
                         bool all_positions = false) {
  detail::check_cached_ids("nn::forward_cached", ids, cache);
  if (cache.layers() != static_cast<std::int64_t>(model.layers.size())) {
    throw ArgumentError(detail::cat("nn::forward_cached: the cache has ", cache.layers(),
                                    " layers, the model ", model.layers.size()));
  }
  const NoGradGuard no_grad;
  Var<T> x = model.embed_tokens(ids);
  for (std::size_t l = 0; l < model.layers.size(); ++l)
    x = layer_cached(model.layers[l], x, cache, static_cast<std::int64_t>(l));
  cache.advance(ids.dim(1));
  return detail::head_logits(x, model.norm, model.head_weight(), all_positions);
}

/// GPT's forward over the cache (no RoPE: positions enter through the position table).
template <class T>
Tensor<T> forward_cached(const GPT<T>& model, const Tensor<std::int32_t>& ids, KvCache<T>& cache,
                         bool all_positions = false) {
  detail::check_cached_ids("nn::forward_cached", ids, cache);
  if (cache.layers() != static_cast<std::int64_t>(model.blocks.size())) {
    throw ArgumentError(detail::cat("nn::forward_cached: the cache has ", cache.layers(),
                                    " layers, the model ", model.blocks.size()));
  }
  const NoGradGuard no_grad;
  const std::int64_t n = ids.dim(1), width = model.config().width;
  Tensor<std::int32_t> positions(Shape{n});
  for (std::int64_t t = 0; t < n; ++t) positions[t] = static_cast<std::int32_t>(cache.length() + t);
  Var<T> x = model.drop(model.wte(ids) + model.wpe(positions));
  for (std::size_t l = 0; l < model.blocks.size(); ++l) {
    const TransformerBlock<T>& b = model.blocks[l];
    const Tensor<T> packed = b.attn.qkv(b.ln1(x)).value();  // (B, n, 3C): Q, K, V side by side
    const Tensor<T> y =
        cache.attend(static_cast<std::int64_t>(l), detail::columns(packed, 0, width),
                     detail::columns(packed, width, width),
                     detail::columns(packed, 2 * width, width), b.attn.heads(), nullptr);
    const Var<T> h = x + b.attn.drop(b.attn.proj(Var<T>(y)));
    x = h + b.mlp(b.ln2(h));
  }
  cache.advance(n);
  return detail::head_logits(x, model.ln_f, model.head_weight(), all_positions);
}

/// What generate() does besides choosing tokens.
struct GenerateOptions {
  std::int64_t max_new_tokens = 64;   ///< at most this many new tokens
  SamplingOptions sampling;           ///< greedy by default
  std::vector<std::int32_t> eos_ids;  ///< stop after choosing one of these (it is kept)
  std::vector<std::string> stop;      ///< stop once one ends inside a new token's text
  /// HF's repetition_penalty: the logits of the prompt's and generated ids, divided by it
  /// (multiplied when negative) before each choice; 1: none.
  double repetition_penalty = 1.0;
  /// Text of token ids, special tokens kept (a tokenizer's decode with skip_special_tokens
  /// false): called on the prompt and the new ids, needed for stop strings.
  std::function<std::string(const std::vector<std::int32_t>&)> decode;
  /// Called with each new token as it is chosen (streaming output).
  std::function<void(std::int32_t)> on_token;
};

/// Why generate() stopped.
enum class StopReason { max_new_tokens, eos, stop_string };

inline const char* to_string(StopReason r) noexcept {
  return r == StopReason::eos ? "eos" : r == StopReason::stop_string ? "stop_string" : "length";
}

/// generate()'s result: the new ids (not the prompt) and what the run cost.
struct Generated {
  std::vector<std::int32_t> ids;
  StopReason reason = StopReason::max_new_tokens;
  double prefill_seconds = 0;  ///< the prompt's forward pass, which gives the first token
  double decode_seconds = 0;   ///< the steps after it, one forward of one position each
  std::size_t cache_bytes = 0;
  /// Seconds per token of the steps after the first (the prefill's when there was only one).
  double seconds_per_token() const noexcept {
    return ids.size() > 1 ? decode_seconds / double(ids.size() - 1) : prefill_seconds;
  }
};

/// Throws unless generate()'s options and prompt can run: a prompt, max_new_tokens >= 1 whose
/// sum with the prompt's length fits an int64 (the cache's capacity), a decode for stop strings.
inline void check_generate_options(std::int64_t prompt_len, const GenerateOptions& o) {
  o.sampling.validate();
  if (prompt_len == 0) throw ArgumentError("nn::generate: the prompt is empty");
  if (o.max_new_tokens < 1) {
    throw ArgumentError(
        detail::cat("nn::generate: max_new_tokens must be >= 1, got ", o.max_new_tokens));
  }
  if (o.max_new_tokens > std::numeric_limits<std::int64_t>::max() - prompt_len) {
    throw ArgumentError(detail::cat("nn::generate: max_new_tokens ", o.max_new_tokens,
                                    " and the prompt's ", prompt_len,
                                    " tokens add up to more positions than an int64 counts"));
  }
  if (!(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0)) {
    throw ArgumentError(detail::cat("nn::generate: repetition_penalty must be finite and > 0, got ",
                                    o.repetition_penalty));
  }
  if (!o.stop.empty() && !o.decode) {
    throw ArgumentError(
        "nn::generate: stop strings need a decode function (GenerateOptions::decode)");
  }
}

/// Continues `prompt` (token ids) with `model` (a Llama or a GPT in evaluation mode: dropout
/// would draw). The cache holds prompt + max_new_tokens positions, allocated once.
template <class Model>
Generated generate(const Model& model, const std::vector<std::int32_t>& prompt,
                   const GenerateOptions& options) {
  using T = typename decltype(model.head_weight())::Scalar;
  const auto prompt_len = static_cast<std::int64_t>(prompt.size());
  check_generate_options(prompt_len, options);
  if (model.training()) {
    throw UsageError(
        "nn::generate: the model is in training mode (dropout would draw); call eval() first");
  }
  KvCache<T> cache = make_kv_cache(model, 1, prompt_len + options.max_new_tokens);
  Generated out;
  out.cache_bytes = cache.bytes();
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const Clock::time_point start = Clock::now();
  Tensor<std::int32_t> ids(Shape{1, prompt_len});
  std::copy(prompt.begin(), prompt.end(), ids.data());
  Tensor<T> logits = forward_cached(model, ids, cache);
  out.prefill_seconds = seconds(start, Clock::now());
  const Clock::time_point decode_start = Clock::now();
  std::vector<std::int32_t> seq = prompt;  // the prompt and the new ids: penalty and stop strings
  // the text of the sequence before the last token: a stop string must end beyond it
  std::string text_before = options.stop.empty() ? std::string() : options.decode(seq);
  for (std::int64_t step = 0;; ++step) {
    apply_repetition_penalty(logits.data(), logits.dim(-1), seq, options.repetition_penalty);
    const std::int32_t token = sample_token(logits.data(), logits.dim(-1), options.sampling,
                                            static_cast<std::uint64_t>(step));
    out.ids.push_back(token);
    seq.push_back(token);
    if (options.on_token) options.on_token(token);
    if (std::find(options.eos_ids.begin(), options.eos_ids.end(), token) != options.eos_ids.end()) {
      out.reason = StopReason::eos;
      break;
    }
    if (!options.stop.empty()) {
      std::string text = options.decode(seq);
      if (detail::ends_after(text, text_before.size(), options.stop)) {
        out.reason = StopReason::stop_string;
        break;
      }
      text_before = std::move(text);
    }
    if (step + 1 >= options.max_new_tokens) break;
    Tensor<std::int32_t> next(Shape{1, 1});
    next[0] = token;
    logits = forward_cached(model, next, cache);
  }
  out.decode_seconds = seconds(decode_start, Clock::now());
  return out;
}

}  // namespace remat::nn
