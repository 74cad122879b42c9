#pragma once
/// @file
/// "Will it fit?": the memory a GPT or Llama training step needs, predicted from its configuration and
/// batch shape alone, before anything is allocated. Parameters, gradients and optimizer state
/// come from the layer sizes; the blocks' activations come from a plan::Chain written from what
/// each op keeps for backward (the same figures plan::profile measures on a real model), so every
/// checkpoint plan can be priced with plan::predict; the logits from the loss's shape.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "remat/checkpoint/plan.hpp"
#include "remat/nn/gpt.hpp"
#include "remat/nn/llama.hpp"

namespace remat::nn {

/// The optimizer whose state the step keeps: SGD none, SGD with momentum one tensor per
/// parameter, AdamW two.
enum class OptimizerKind { sgd, sgd_momentum, adamw };

/// One training step's shape: what estimate_memory() prices besides the model.
struct StepShape {
  std::int64_t batch = 8;                         ///< sequences per step
  std::int64_t time = 0;                          ///< tokens per sequence (0: the config's context)
  OptimizerKind optimizer = OptimizerKind::adamw;
  bool chunked_loss = true;                       ///< GPT::loss's default; false: the full logits
};

/// Bytes a training step needs, as the library's allocator counts them.
struct MemoryEstimate {
  std::int64_t parameter_count = 0;
  double parameters = 0;       ///< the weights
  double gradients = 0;        ///< one buffer per parameter, reused from step to step
  double optimizer_state = 0;  ///< SGD momentum's velocity, AdamW's two moments
  double data = 0;             ///< token ids and targets
  double logits = 0;           ///< the (B T x V) logits of the plain loss (its gradient is as large)
  double loss_chunk = 0;       ///< the logits chunk the chunked loss holds instead
  /// The blocks as a chain for the planners: plan::budget(estimate.chain, bytes) and friends.
  plan::Chain chain;

  /// Bytes held between steps.
  double persistent() const noexcept { return parameters + gradients + optimizer_state + data; }
  /// Peak bytes a step allocates on top of persistent() when its blocks run under `segments`
  /// (empty: no checkpointing); throws a PlanError if they do not fit the chain.
  double activations(const std::vector<plan::Segment>& segments = {}) const {
    return plan::predict(chain, segments).peak_bytes;
  }
  double activations(const plan::Plan& p) const {
    plan::detail::check_plan(p, chain.layers(), "MemoryEstimate");
    return activations(p.segments);
  }
  /// Peak bytes of a whole training step: persistent() + activations(p).
  double total(const plan::Plan& p) const { return persistent() + activations(p); }
  double total() const { return persistent() + activations(); }
};

}  // namespace remat::nn

namespace remat::detail {

/// Parameters of a GPT: embeddings, per block two layer norms and four biased projections
/// (12 C^2 + 13 C), the final norm, and the head unless it is tied. In double: the sizes asked
/// about may be far beyond what fits.
inline double gpt_parameter_count(const nn::GPTConfig& c) {
  const auto w = static_cast<double>(c.width), v = static_cast<double>(c.vocab);
  const double block = 12 * w * w + 13 * w;
  return v * w + static_cast<double>(c.context) * w + static_cast<double>(c.layers) * block + 2 * w + (c.tied ? 0 : v * w);
}

/// Bytes of the logits chunk linear_cross_entropy holds for `tokens` rows of a `vocab`-wide head.
template <class T>
double loss_chunk_bytes(std::int64_t vocab, double tokens) {
  return std::min(static_cast<double>(default_chunk_rows(vocab, sizeof(T))), tokens) * static_cast<double>(vocab) * sizeof(T);
}

/// The blocks' chain, op by op (N = B T rows, C wide, H heads, e bytes an element):
/// - kept per block: ln1 and ln2 keep two numbers a row (4N), the qkv projection its input (NC),
///   attention the packed qkv (3NC) and its probabilities (B H T^2), the output projection its
///   input (NC), ln2 the residual sum (NC), fc its input (NC), GELU its input (4NC), the second
///   projection GELU's output (4NC): 15 NC + 4N + B H T^2;
/// - forward temporaries: a projection's output before dropout and the residual add (NC), or,
///   with dropout, attention's (T x T) dropped weights, less what the rest of the block has not
///   yet allocated when they exist (11 NC + 2N);
/// - backward temporaries: a (N, 4C) gradient inside the MLP (with dropout one (N, C) mask
///   product more), or attention's one or two (T x T) scratch blocks less what the sweep has freed
///   by then (7 NC + 2N);
/// - with Attention::flash, attention keeps one log-sum-exp per query row (B H T) instead of the
///   probabilities, and its scratch is (R x T) blocks, R = min(kFlashBlockRows, T) query rows:
///   the scores and, with dropout, the dropped weights in forward; the probabilities, their
///   gradient and, with dropout, the dropped weights in backward;
/// - the loss keeps ln_f's two numbers a row and output (NC + 2N) and the log-sum-exp of each row
///   (N), chunked; the plain loss keeps the logits (N V) instead of the chunk, and its backward
///   holds their gradient or, when the vocabulary is narrower than the model, ln_f's input
///   gradient.
/// tests/nn/estimate_test.cpp checks each figure against plan::profile on real models.
template <class T>
plan::Chain gpt_chain(const nn::GPTConfig& c, std::int64_t batch, std::int64_t time, bool chunked_loss) {
  const double e = sizeof(T), b = static_cast<double>(batch), t = static_cast<double>(time);
  const double n = b * t, w = static_cast<double>(c.width), v = static_cast<double>(c.vocab);
  const bool flash = c.attention == nn::Attention::flash;
  const double dropout = c.dropout > 0 ? 1 : 0;
  // what attention keeps, its scratch in forward and in backward, and the (query x key) pairs
  // its GEMMs multiply (the flash op skips the keys a block of queries cannot see)
  double kept = b * static_cast<double>(c.heads) * t * t, forward_scratch = dropout * t * t, backward_scratch = (1 + dropout) * t * t;
  double pairs = t * t;
  if (flash) {
    const std::int64_t rows = std::min(kFlashBlockRows, time);
    kept = b * static_cast<double>(c.heads) * t;
    forward_scratch = (1 + dropout) * static_cast<double>(rows) * t;
    backward_scratch = (2 + dropout) * static_cast<double>(rows) * t;
    pairs = 0;
    for (std::int64_t i0 = 0; i0 < time; i0 += rows) pairs += static_cast<double>(std::min(rows, time - i0) * std::min(i0 + rows, time));
  }
  const auto layers = static_cast<std::size_t>(c.layers);
  plan::Chain chain;
  chain.boundary_bytes.assign(layers + 1, n * w * e);
  chain.activation_bytes.assign(layers, (15 * n * w + 4 * n + kept) * e);
  chain.forward_transient_bytes.assign(layers, std::max(n * w, forward_scratch - 11 * n * w - 2 * n) * e);
  chain.backward_transient_bytes.assign(layers, std::max((4 + dropout) * n * w, backward_scratch - 7 * n * w - 2 * n) * e);
  // forward FLOPs: the four projections (24 N C^2) and attention's two (queries x keys) GEMMs per head
  chain.forward_cost.assign(layers, 24 * n * w * w + 4 * b * pairs * w);
  chain.saves_output.assign(layers, false);
  chain.input_made_in_step = true;
  chain.output_held = false;  // GPT::loss keeps no Var of the blocks' output; ln_f saves it
  chain.loss_output_bytes = 2 * e;
  if (chunked_loss) {
    chain.loss_bytes = (n * w + 3 * n) * e;
    chain.loss_forward_transient_bytes = loss_chunk_bytes<T>(c.vocab, n);
    chain.loss_backward_transient_bytes = chain.loss_forward_transient_bytes + n * w * e;
  } else {
    chain.loss_bytes = (n * w + 3 * n + n * v) * e;
    chain.loss_forward_transient_bytes = 0;
    chain.loss_backward_transient_bytes = std::max(n * v, n * w - n) * e;
  }
  return chain;
}

/// The parts of a MemoryEstimate every model shares: parameters, gradients, optimizer state,
/// token ids and targets, the logits (plain or chunked), given the parameter count and the chain.
template <class T>
nn::MemoryEstimate step_estimate(double count, std::int64_t vocab, const nn::StepShape& step, std::int64_t time, plan::Chain chain) {
  const double e = sizeof(T);
  nn::MemoryEstimate m;
  m.parameter_count = static_cast<std::int64_t>(count);
  m.parameters = count * e;
  m.gradients = m.parameters;
  switch (step.optimizer) {
    case nn::OptimizerKind::sgd: m.optimizer_state = 0; break;
    case nn::OptimizerKind::sgd_momentum: m.optimizer_state = m.parameters; break;
    case nn::OptimizerKind::adamw: m.optimizer_state = 2 * m.parameters; break;
    default: throw UsageError(cat("nn::estimate_memory: unknown optimizer kind ", static_cast<int>(step.optimizer)));
  }
  const double tokens = static_cast<double>(step.batch) * static_cast<double>(time);
  m.data = 2 * tokens * sizeof(std::int32_t);
  m.logits = tokens * static_cast<double>(vocab) * e;
  m.loss_chunk = loss_chunk_bytes<T>(vocab, tokens);
  m.chain = std::move(chain);
  return m;
}

}  // namespace remat::detail

namespace remat::nn {

/// Predicts the memory of one training step of GPT<T>(config) on `step`: persistent state, and
/// a chain to price any checkpoint plan with. Throws a UsageError for an invalid configuration
/// or a batch or sequence length out of range.
template <class T = float>
MemoryEstimate estimate_memory(const GPTConfig& config, const StepShape& step = {}) {
  static_assert(std::is_floating_point_v<T>, "nn::estimate_memory prices float or double models");
  config.validate();
  const std::int64_t time = step.time == 0 ? config.context : step.time;
  if (step.batch < 1 || time < 1 || time > config.context) {
    throw UsageError(remat::detail::cat("nn::estimate_memory: need batch >= 1 and 1 <= time <= context = ", config.context,
                                        "; got batch ", step.batch, ", time ", time));
  }
  // Beyond 2^53 elements the doubles below stop being exact counts, and no machine holds that.
  constexpr double kMostElements = 9007199254740992.0;
  const double count = remat::detail::gpt_parameter_count(config);
  const double largest = std::max({count, static_cast<double>(step.batch) * static_cast<double>(time) *
                                              std::max({static_cast<double>(config.vocab), static_cast<double>(config.width),
                                                       static_cast<double>(config.heads) * static_cast<double>(time)})});
  if (!(largest < kMostElements) || config.layers > (std::int64_t{1} << 20)) {
    throw UsageError(remat::detail::cat("nn::estimate_memory: a model of ", config.layers, " layers, width ", config.width,
                                        ", vocabulary ", config.vocab, " with batch ", step.batch, " x ", time,
                                        " tokens is beyond what can be counted (over 2^53 elements, or 2^20 layers)"));
  }
  return remat::detail::step_estimate<T>(count, config.vocab, step, time,
                                         remat::detail::gpt_chain<T>(config, step.batch, time, step.chunked_loss));
}

}  // namespace remat::nn

namespace remat::detail {

/// Parameters of a Llama (C wide, K = kv heads x head size, F the MLP's width): the embedding,
/// per layer q and o (2 C^2), k and v (2 C K), the MLP (3 C F), two norms (2 C) and the q/k/v
/// biases (C + 2 K) when present, the final norm, and the head unless it is tied.
inline double llama_parameter_count(const nn::LlamaConfig& c) {
  const auto w = static_cast<double>(c.hidden_size), v = static_cast<double>(c.vocab_size);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim()), f = static_cast<double>(c.intermediate_size);
  const double layer = 2 * w * w + 2 * w * kv + 3 * w * f + 2 * w + (c.attention_bias ? w + 2 * kv : 0);
  return v * w + static_cast<double>(c.num_hidden_layers) * layer + w + (c.tie_word_embeddings ? 0 : v * w);
}

/// The decoder layers' chain, op by op (N = B T rows, C wide, K = kv heads x head size, F the
/// MLP's width, H query heads, e bytes an element):
/// - kept per layer: the two RMSNorms one number a row each (2N), the q/k/v projections their
///   shared input (NC), attention the rotated queries (NC), rotated keys and the values (2NK)
///   and its probabilities (B H T^2), o_proj its input (NC), the second norm the residual sum
///   (NC), gate/up their shared input (NC), swiglu gate and up (2NF), down_proj swiglu's output
///   (NF): 5 NC + 2 NK + 3 NF + 2N + B H T^2;
/// - forward temporaries: down_proj's output before the residual add (NC);
/// - backward temporaries, the largest of: swiglu's two input gradients beside down_proj's
///   input gradient (2 NF, net of what is freed), the norm's input gradient once the MLP's
///   activations are gone (NC - NF), and attention's (T x T) scratch beside its q/k/v
///   gradients, less what the sweep has freed by then (T^2 + 2 NK - NC - 3 NF - N);
/// - with Attention::flash, attention keeps one log-sum-exp per query row (B H T) instead of the
///   probabilities; its scratch is (R x T) blocks, R = min(kFlashBlockRows, T): the scores in
///   forward, beside the q and k projections (NC + NK, freed once attention has rotated them),
///   less what the rest of the layer keeps after it (3 NC + 3 NF + N); and the probabilities and
///   their gradient in backward, in place of the (T x T) scratch.
/// tests/nn/estimate_test.cpp checks each figure against plan::profile on real models.
template <class T>
plan::Chain llama_chain(const nn::LlamaConfig& c, std::int64_t batch, std::int64_t time, bool chunked_loss) {
  const double e = sizeof(T), b = static_cast<double>(batch), t = static_cast<double>(time);
  const double n = b * t, w = static_cast<double>(c.hidden_size), v = static_cast<double>(c.vocab_size);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim()), f = static_cast<double>(c.intermediate_size);
  // what attention keeps, its scratch in forward and in backward, and the (query x key) pairs its
  // GEMMs multiply, as for GPT (gpt_chain)
  double kept = b * static_cast<double>(c.num_attention_heads) * t * t, forward_scratch = 0, backward_scratch = t * t;
  double pairs = t * t;
  if (c.attention == nn::Attention::flash) {
    const std::int64_t rows = std::min(kFlashBlockRows, time);
    kept = b * static_cast<double>(c.num_attention_heads) * t;
    forward_scratch = static_cast<double>(rows) * t;
    backward_scratch = 2 * static_cast<double>(rows) * t;
    pairs = 0;
    for (std::int64_t i0 = 0; i0 < time; i0 += rows) pairs += static_cast<double>(std::min(rows, time - i0) * std::min(i0 + rows, time));
  }
  const auto layers = static_cast<std::size_t>(c.num_hidden_layers);
  plan::Chain chain;
  chain.boundary_bytes.assign(layers + 1, n * w * e);
  chain.activation_bytes.assign(layers, (5 * n * w + 2 * n * kv + 3 * n * f + 2 * n + kept) * e);
  chain.forward_transient_bytes.assign(layers, std::max(n * w, forward_scratch - 2 * n * w - 3 * n * f - n + n * kv) * e);
  chain.backward_transient_bytes.assign(layers, std::max({2 * n * f, n * w - n * f, backward_scratch + 2 * n * kv - n * w - 3 * n * f - n}) * e);
  // forward FLOPs: the seven projections and attention's two (queries x keys) GEMMs per head
  chain.forward_cost.assign(layers, 2 * n * w * (2 * w + 2 * kv + 3 * f) + 4 * b * pairs * w);
  chain.saves_output.assign(layers, false);
  chain.input_made_in_step = true;
  chain.output_held = false;  // Llama::loss keeps no Var of the layers' output; the final norm saves it
  chain.loss_output_bytes = 2 * e;
  // the loss keeps the final norm's output and one number a row, and the log-sum-exp of each row
  if (chunked_loss) {
    chain.loss_bytes = (n * w + 2 * n) * e;
    chain.loss_forward_transient_bytes = loss_chunk_bytes<T>(c.vocab_size, n);
    chain.loss_backward_transient_bytes = chain.loss_forward_transient_bytes + n * w * e;
  } else {
    chain.loss_bytes = (n * w + 2 * n + n * v) * e;
    chain.loss_forward_transient_bytes = 0;
    chain.loss_backward_transient_bytes = std::max(n * v, n * w - n) * e;
  }
  return chain;
}

}  // namespace remat::detail

namespace remat::nn {

/// Predicts the memory of one training step of Llama<T>(config) on `step` (time 0: the config's
/// max_position_embeddings): persistent state, and a chain to price any checkpoint plan with.
template <class T = float>
MemoryEstimate estimate_memory(const LlamaConfig& config, const StepShape& step = {}) {
  static_assert(std::is_floating_point_v<T>, "nn::estimate_memory prices float or double models");
  config.validate();
  const std::int64_t time = step.time == 0 ? config.max_position_embeddings : step.time;
  if (step.batch < 1 || time < 1 || time > config.max_position_embeddings) {
    throw UsageError(remat::detail::cat("nn::estimate_memory: need batch >= 1 and 1 <= time <= max_position_embeddings = ",
                                        config.max_position_embeddings, "; got batch ", step.batch, ", time ", time));
  }
  constexpr double kMostElements = 9007199254740992.0;  // 2^53: beyond it doubles stop counting exactly
  const double count = remat::detail::llama_parameter_count(config);
  const double tokens = static_cast<double>(step.batch) * static_cast<double>(time);
  const double largest = std::max(count, tokens * std::max({static_cast<double>(config.vocab_size), static_cast<double>(config.hidden_size),
                                                            static_cast<double>(config.intermediate_size),
                                                            static_cast<double>(config.num_attention_heads) * static_cast<double>(time)}));
  if (!(largest < kMostElements) || config.num_hidden_layers > (std::int64_t{1} << 20)) {
    throw UsageError(remat::detail::cat("nn::estimate_memory: a Llama of ", config.num_hidden_layers, " layers, hidden size ",
                                        config.hidden_size, ", vocabulary ", config.vocab_size, " with batch ", step.batch, " x ",
                                        time, " tokens is beyond what can be counted (over 2^53 elements, or 2^20 layers)"));
  }
  return remat::detail::step_estimate<T>(count, config.vocab_size, step, time,
                                         remat::detail::llama_chain<T>(config, step.batch, time, step.chunked_loss));
}

}  // namespace remat::nn
