#pragma once
/// @file
/// nn::Attention: which attention op a model's blocks run (GPTConfig::attention,
/// LlamaConfig::attention). Both choices compute the same function, to rounding.

namespace remat::nn {

/// Which attention op a model runs:
/// - fused: causal_self_attention (ops/attention.hpp) or grouped_query_attention
///   (ops/gqa_attention.hpp), keeping the (B, H, T, T) probabilities for backward;
/// - flash: flash_causal_self_attention (ops/flash_attention.hpp) or
///   flash_grouped_query_attention (ops/flash_gqa_attention.hpp), keeping one log-sum-exp per
///   query row and recomputing the probabilities by blocks of query rows in backward.
enum class Attention { fused, flash };

/// "fused" or "flash".
inline const char* to_string(Attention a) noexcept {
  return a == Attention::flash ? "flash" : "fused";
}

}  // namespace remat::nn
