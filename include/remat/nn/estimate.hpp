#pragma once
/// @file
/// "Will it fit?": the memory a GPT training step needs, predicted from its configuration and
/// batch shape alone, before anything is allocated. Parameters, gradients and optimizer state
/// come from the layer sizes; the blocks' activations come from a plan::Chain written from what
/// each op keeps for backward (the same figures plan::profile measures on a real model), so every
/// checkpoint plan can be priced with plan::predict; the logits from the loss's shape.

#include <cstdint>

#include "remat/checkpoint/plan.hpp"
#include "remat/nn/gpt.hpp"

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
  double activations(const plan::Plan& p) const { return activations(p.segments); }
  /// Peak bytes of a whole training step: persistent() + activations(p).
  double total(const plan::Plan& p) const { return persistent() + activations(p); }
  double total() const { return persistent() + activations(); }
};

}  // namespace remat::nn

namespace remat::detail {

/// Parameters of a GPT: embeddings, per block two layer norms and four biased projections
/// (12 C^2 + 13 C), the final norm, and the head unless it is tied.
inline std::int64_t gpt_parameter_count(const nn::GPTConfig& c) {
  const std::int64_t w = c.width;
  const std::int64_t block = 12 * w * w + 13 * w;
  return c.vocab * w + c.context * w + c.layers * block + 2 * w + (c.tied ? 0 : c.vocab * w);
}

/// The blocks' chain, op by op (N = B T rows, C wide, H heads, e bytes an element):
/// - kept per block: ln1 and ln2 keep two numbers a row (4N), the qkv projection its input (NC),
///   attention the packed qkv (3NC) and its probabilities (B H T^2), the output projection its
///   input (NC), ln2 the residual sum (NC), fc its input (NC), GELU its input (4NC), the second
///   projection GELU's output (4NC): 15 NC + 4N + B H T^2;
/// - forward temporaries: a projection's output before dropout and the residual add (NC);
/// - backward temporaries: a (N, 4C) gradient inside the MLP, and with dropout one (N, C) mask
///   product more;
/// - the loss keeps ln_f's two numbers a row and output (NC + 2N) and the log-sum-exp of each row
///   (N), chunked; the plain loss keeps the logits (N V) instead of the chunk.
/// tests/nn/estimate_test.cpp checks each figure against plan::profile on real models.
template <class T>
plan::Chain gpt_chain(const nn::GPTConfig& c, std::int64_t batch, std::int64_t time, bool chunked_loss) {
  const double e = sizeof(T);
  const double n = static_cast<double>(batch * time), w = static_cast<double>(c.width), v = static_cast<double>(c.vocab);
  const double rows_chunk = static_cast<double>(std::min(default_chunk_rows(c.vocab, sizeof(T)), batch * time));
  const double probs = static_cast<double>(batch * c.heads) * static_cast<double>(time * time);
  const auto layers = static_cast<std::size_t>(c.layers);
  plan::Chain chain;
  chain.boundary_bytes.assign(layers + 1, n * w * e);
  chain.activation_bytes.assign(layers, (15 * n * w + 4 * n + probs) * e);
  chain.forward_transient_bytes.assign(layers, n * w * e);
  chain.backward_transient_bytes.assign(layers, (c.dropout > 0 ? 5 : 4) * n * w * e);
  // forward multiply-adds: the four projections (12 N C^2) and attention's two (T x T) GEMMs per head
  chain.forward_cost.assign(layers, 24 * n * w * w + 4 * static_cast<double>(batch) * static_cast<double>(time * time) * w);
  chain.saves_output.assign(layers, false);
  chain.input_made_in_step = true;
  chain.loss_output_bytes = 2 * e;
  if (chunked_loss) {
    chain.loss_bytes = (n * w + 3 * n) * e;
    chain.loss_forward_transient_bytes = rows_chunk * v * e;
    chain.loss_backward_transient_bytes = (rows_chunk * v + n * w) * e;
  } else {
    chain.loss_bytes = (n * w + 3 * n + n * v) * e;
    chain.loss_forward_transient_bytes = 0;
    chain.loss_backward_transient_bytes = n * v * e;
  }
  return chain;
}

}  // namespace remat::detail

namespace remat::nn {

/// Predicts the memory of one training step of GPT<T>(config) on `step`: persistent state, and
/// a chain to price any checkpoint plan with. Throws a UsageError for an invalid configuration
/// or a batch or sequence length out of range.
template <class T = float>
MemoryEstimate estimate_memory(const GPTConfig& config, const StepShape& step = {}) {
  config.validate();
  const std::int64_t time = step.time == 0 ? config.context : step.time;
  if (step.batch < 1 || time < 1 || time > config.context) {
    throw UsageError(remat::detail::cat("nn::estimate_memory: need batch >= 1 and 1 <= time <= context = ", config.context,
                                        "; got batch ", step.batch, ", time ", step.time));
  }
  const double e = sizeof(T);
  MemoryEstimate m;
  m.parameter_count = remat::detail::gpt_parameter_count(config);
  m.parameters = static_cast<double>(m.parameter_count) * e;
  m.gradients = m.parameters;
  m.optimizer_state = m.parameters * (step.optimizer == OptimizerKind::adamw          ? 2
                                      : step.optimizer == OptimizerKind::sgd_momentum ? 1
                                                                                      : 0);
  const double tokens = static_cast<double>(step.batch * time);
  m.data = 2 * tokens * sizeof(std::int32_t);
  m.logits = tokens * static_cast<double>(config.vocab) * e;
  m.loss_chunk = static_cast<double>(std::min(remat::detail::default_chunk_rows(config.vocab, sizeof(T)), step.batch * time)) *
                 static_cast<double>(config.vocab) * e;
  m.chain = remat::detail::gpt_chain<T>(config, step.batch, time, step.chunked_loss);
  return m;
}

}  // namespace remat::nn
