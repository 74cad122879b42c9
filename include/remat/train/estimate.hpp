#pragma once
/// @file
/// "Will it fit?": the memory a GPT or Llama training step needs, known before anything is
/// allocated. The model is made, stored (f32, bf16, int8, nf4), given its LoRA adapters and
/// trained for one step shape-only (core/shape_only.hpp, Note [shape-only execution]): every
/// figure is what the allocator counts when the same code runs for real. Its layers are then
/// profiled shape-only (plan::profile) into a plan::Chain, for the planners to choose plans with,
/// and a step under any plan is counted the same way (MemoryEstimate::total). A 70B Llama is
/// priced in well under a second.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "remat/checkpoint/plan.hpp"
#include "remat/checkpoint/profile.hpp"
#include "remat/core/precision.hpp"
#include "remat/core/quantized.hpp"
#include "remat/core/save_policy.hpp"
#include "remat/core/shape_only.hpp"
#include "remat/nn/gpt.hpp"
#include "remat/nn/llama.hpp"
#include "remat/nn/lora.hpp"
#include "remat/nn/quantize_blocks.hpp"
#include "remat/optim/adamw.hpp"
#include "remat/optim/sgd.hpp"

namespace remat::train {

/// The optimizer whose state the step keeps: SGD none, SGD with momentum one tensor per
/// parameter, AdamW two.
enum class OptimizerKind { sgd, sgd_momentum, adamw };

/// LoRA adapters as nn::lora::apply() adds them: rank and target names (the last component of
/// a module path: "q_proj", or "qkv", "proj", "fc" on a GPT). Rank 0: no adapters.
struct LoraShape {
  std::int64_t rank = 0;
  std::vector<std::string> targets;
  double dropout = 0;  ///< lora_dropout: each adapter's input goes through a dropout of its own
};

/// One training step's shape: what estimate_memory() prices besides the model.
struct StepShape {
  std::int64_t batch = 8;  ///< sequences per micro-batch (per backward pass)
  std::int64_t time = 0;   ///< tokens per sequence (0: the config's context)
  OptimizerKind optimizer = OptimizerKind::adamw;
  bool chunked_loss = true;  ///< GPT::loss's default; false: the full logits
  /// Rows of logits the chunked loss computes at a time (nn::LossOptions::chunk_rows; 0: its
  /// default, detail::default_chunk_rows). Only with `chunked_loss`.
  std::int64_t loss_chunk_rows = 0;
  /// Packed rows: the step also holds their starts, (B, T) int32 like the ids, priced in `data`,
  /// and a Llama's attention reads them (Llama::loss's `starts`; a GPT takes none).
  bool packed = false;
  /// Micro-batches per optimizer step; the step trains on batch x accumulation sequences. The
  /// activations and gradients do not depend on it (backward adds into the gradient buffers in
  /// place); the data does: a loop draws a step's micro-batches before training on the first
  /// (their targets weight their losses, as examples/finetune does), so `data` prices
  /// accumulation batches of ids and targets (and starts).
  std::int64_t accumulation = 1;
  /// How the blocks' linear weights are stored (nn::Linear::quantize): f32 trains them unless
  /// adapters are added; bf16, int8 and nf4 freeze them. Embeddings, norms, biases and the head
  /// stay float.
  WeightStorage storage = WeightStorage::f32;
  bool double_quant = true;  ///< NF4's second-level scales (QuantizedWeight::quantize's default)
  /// What the step computes in (core/precision.hpp): bf16 prices a step recorded under a
  /// PrecisionGuard(Precision::bf16), its saved activations in bfloat16 (float models only).
  Precision precision = Precision::f32;
  /// Adapters: with a rank > 0 every base parameter is frozen (lora::apply) and only the
  /// adapters get gradients and optimizer state.
  LoraShape lora;
  /// Save policies to price each layer under, in a checkpoint segment of its own: they are
  /// plan::ProfileOptions::policies for the shape-only profile and land in
  /// MemoryEstimate::chain.policies, so plans with such segments can be priced
  /// (MemoryEstimate::total) and plan::budget() chooses among them. Any policy is priced
  /// (save_matmuls(), save_ops(), recompute_ops(), save_if() with the user's predicate), for
  /// every weight storage, with or without adapters. Policies that keep nothing are skipped.
  std::vector<SavePolicy> policies;
};

/// Bytes a training step needs, as the library's allocator counts them.
struct MemoryEstimate {
  std::int64_t parameter_count = 0;  ///< the model's, adapters excluded
  std::int64_t trainable_count = 0;  ///< parameters that get a gradient (adapters included)
  std::int64_t adapter_count = 0;    ///< LoRA's A and B values
  double parameters = 0;             ///< the weights, as stored (quantized linears in their format)
  double adapters = 0;               ///< LoRA's A and B
  double gradients = 0;  ///< one buffer per trainable parameter, reused from step to step
  double optimizer_state =
      0;                  ///< SGD momentum's velocity, AdamW's two moments, of the trainable ones
  double data = 0;        ///< token ids and targets (and packed rows' starts), of every micro-batch
  double logits = 0;      ///< the (B T x V) logits of the plain loss (its gradient is as large)
  double loss_chunk = 0;  ///< the tile of logits the chunked loss holds instead
  /// The blocks as a chain for the planners: plan::budget(estimate.chain, bytes) and friends.
  plan::Chain chain;
  /// Counts, shape-only, the peak of a training step whose blocks run under a plan (set by
  /// estimate_memory: it makes the same model and step again, and runs two steps, the second
  /// under the plan, as a training loop's steps after its first do).
  std::function<double(const plan::Plan&)> count_step;

  /// Bytes held between steps.
  double persistent() const noexcept {
    return parameters + adapters + gradients + optimizer_state + data;
  }
  /// Peak bytes a step allocates on top of persistent() when its blocks run under `segments`
  /// (empty: no checkpointing), any segments and policies; throws a PlanError if they do not fit
  /// the chain.
  double activations(const std::vector<plan::Segment>& segments = {}) const {
    return activations(plan::Plan{.layers = chain.layers(), .segments = segments});
  }
  double activations(const plan::Plan& p) const { return total(p) - persistent(); }
  /// Peak bytes of a whole training step under `p`, as the allocator counts them: counted
  /// shape-only (count_step), not modelled, so exact for every plan.
  double total(const plan::Plan& p) const {
    plan::detail::check_plan(p, chain.layers(), "MemoryEstimate");
    if (!count_step)
      throw UsageError("MemoryEstimate: made without estimate_memory(): no step to count");
    return count_step(p);
  }
  double total() const { return total(plan::Plan{.layers = chain.layers()}); }
};

}  // namespace remat::train

namespace remat::detail {

/// Bytes of the tile of logits linear_cross_entropy holds for `tokens` rows of a (vocab, width)
/// head in chunks of `chunk_rows` (0: default_chunk_rows): a chunk against a vocabulary block
/// (Note [online loss head] in ops/loss.hpp).
template <class T>
double loss_chunk_bytes(std::int64_t vocab, std::int64_t width, double tokens,
                        std::int64_t chunk_rows) {
  const std::int64_t rows =
      chunk_rows > 0 ? chunk_rows : default_chunk_rows(vocab, width, sizeof(T));
  return std::min(static_cast<double>(rows), tokens) *
         static_cast<double>(loss_vocab_block(vocab, width)) * sizeof(T);
}

/// Refuses a step shape no model can run: a batch or length out of range, tensors beyond what
/// can be counted (2^53 elements: no machine holds them), a bad optimizer or LoRA shape.
inline void check_step_shape(const char* op, const train::StepShape& step, std::int64_t time,
                             std::int64_t context, const char* context_name, double largest_row,
                             double largest_weight, std::int64_t layers) {
  if (step.batch < 1 || time < 1 || time > context) {
    throw ArgumentError(cat(op, ": need batch >= 1 and 1 <= time <= ", context_name, " = ", context,
                            "; got batch ", step.batch, ", time ", time));
  }
  const double tokens = static_cast<double>(step.batch) * static_cast<double>(time);
  constexpr double kMostElements = 9007199254740992.0;
  if (!(tokens * largest_row < kMostElements) || !(largest_weight < kMostElements) ||
      layers > (std::int64_t{1} << 20)) {
    throw ArgumentError(cat(op, ": a model of ", layers, " layers with weights of up to ",
                            largest_weight, " values, rows of up to ", largest_row, ", and batch ",
                            step.batch, " x ", time,
                            " tokens is beyond what can be counted (over 2^53 elements, or 2^20 "
                            "layers)"));
  }
  if (step.accumulation < 1 || step.lora.rank < 0) {
    throw ArgumentError(cat(op, ": need accumulation >= 1 and a LoRA rank >= 0; got accumulation ",
                            step.accumulation, ", rank ", step.lora.rank));
  }
  if (step.loss_chunk_rows < 0 || (step.loss_chunk_rows > 0 && !step.chunked_loss)) {
    throw ArgumentError(
        cat(op, ": loss_chunk_rows ", step.loss_chunk_rows,
            step.loss_chunk_rows < 0 ? " is negative" : " is set but the loss is not chunked"));
  }
  if (step.lora.rank > 0 && step.lora.targets.empty())
    throw ArgumentError(cat(op, ": LoRA rank > 0 but no target names"));
  if (!(step.lora.dropout >= 0 && step.lora.dropout < 1))
    throw ArgumentError(cat(op, ": LoRA dropout must be in [0, 1), got ", step.lora.dropout));
  switch (step.optimizer) {
    case train::OptimizerKind::sgd:
    case train::OptimizerKind::sgd_momentum:
    case train::OptimizerKind::adamw:
      return;
  }
  throw ArgumentError(cat(op, ": unknown optimizer kind ", static_cast<int>(step.optimizer)));
}

/// Refuses BF16 for a model of anything but float (Precision::bf16 applies to float ops).
template <class T>
void check_step_precision(const char* op, const train::StepShape& step) {
  if (step.precision == Precision::bf16 && !std::is_same_v<T, float>) {
    throw ArgumentError(cat(op, ": precision bf16 applies to float models; this one computes on ",
                            sizeof(T), "-byte values"));
  }
}

/// The validated sequence length of a step of GPT<T>(config) on `step` (0: the context).
template <class T>
std::int64_t checked_step_time(const char* op, const nn::GPTConfig& config,
                               const train::StepShape& step) {
  static_assert(std::is_floating_point_v<T>,
                "train::estimate_memory and train::step_peak price float or double models");
  config.validate();
  check_step_precision<T>(op, step);
  const std::int64_t time = step.time == 0 ? config.context : step.time;
  check_step_shape(
      op, step, time, config.context, "context",
      static_cast<double>(std::max({config.vocab, 4 * config.width, config.heads * time})),
      static_cast<double>(std::max(config.vocab, 4 * config.width)) *
          static_cast<double>(config.width),
      config.layers);
  return time;
}

/// The validated sequence length of a step of Llama<T>(config) on `step` (0:
/// max_position_embeddings).
template <class T>
std::int64_t checked_step_time(const char* op, const nn::LlamaConfig& config,
                               const train::StepShape& step) {
  static_assert(std::is_floating_point_v<T>,
                "train::estimate_memory and train::step_peak price float or double models");
  config.validate();
  check_step_precision<T>(op, step);
  const std::int64_t time = step.time == 0 ? config.max_position_embeddings : step.time;
  check_step_shape(
      op, step, time, config.max_position_embeddings, "max_position_embeddings",
      static_cast<double>(std::max({config.vocab_size, config.hidden_size, config.intermediate_size,
                                    config.num_attention_heads * time})),
      static_cast<double>(std::max({config.vocab_size, config.intermediate_size,
                                    config.num_attention_heads * config.head_dim()})) *
          static_cast<double>(config.hidden_size),
      config.num_hidden_layers);
  return time;
}

/// The optimizer `kind` over `params`.
template <class T>
std::unique_ptr<optim::Optimizer<T>> make_optimizer(train::OptimizerKind kind,
                                                    std::vector<Parameter<T>> params) {
  if (kind == train::OptimizerKind::adamw)
    return std::make_unique<optim::AdamW<T>>(std::move(params));
  return std::make_unique<optim::SGD<T>>(
      std::move(params),
      optim::SGDOptions{.momentum = kind == train::OptimizerKind::sgd_momentum ? 0.9 : 0.0});
}

/// A model set up for a training step as estimate_memory prices it: its linears stored as the
/// step says, its adapters, an optimizer over what trains, the step's ids, targets and starts.
template <class T, class Model>
struct PricedStep {
  Model model;
  std::optional<nn::lora::Adapters<T>> adapters;
  std::vector<Parameter<T>> trainable;
  std::unique_ptr<optim::Optimizer<T>> optimizer;
  Tensor<std::int32_t> ids, targets, starts;
  std::vector<Tensor<std::int32_t>> waiting;  ///< the other micro-batches' ids, targets, starts
  nn::LossOptions loss;

  /// One step: forward and backward under `p` (null: no plan), the optimizer's step.
  void train(const plan::Plan* p) {
    {
      Tape tape;
      nn::LossOptions o = loss;
      o.plan = p;
      tape.backward(model.loss(ids, targets, o));
    }
    optimizer->step();
    optimizer->zero_grad();
  }
};

/// Sets up `s.model` for `step`. With `measured`, also sets what each stage adds to the live
/// bytes: the weights as stored, the adapters, the data. `starts_reach_model`: whether the loss
/// takes packed rows' starts (a Llama's does).
template <class T, class Model>
void set_up_step(PricedStep<T, Model>& s, std::int64_t time, const train::StepShape& step,
                 bool starts_reach_model, train::MemoryEstimate* measured) {
  double before = 0;
  const auto stage = [&](double train::MemoryEstimate::*figure) {
    const auto live = static_cast<double>(memory::live_bytes());
    if (measured) measured->*figure = live - before;
    before = live;
  };
  if (step.storage != WeightStorage::f32)
    nn::quantize_blocks(s.model, step.storage, step.double_quant);
  stage(&train::MemoryEstimate::parameters);
  if (step.lora.rank > 0) {
    s.adapters.emplace(nn::lora::apply(
        s.model,
        {.rank = step.lora.rank, .dropout = step.lora.dropout, .targets = step.lora.targets}));
  }
  stage(&train::MemoryEstimate::adapters);
  for (const Parameter<T>& p : s.model.parameters()) {
    if (!p.frozen()) s.trainable.push_back(p);
  }
  s.ids = Tensor<std::int32_t>({step.batch, time});
  s.targets = Tensor<std::int32_t>({step.batch, time});
  if (step.packed) s.starts = Tensor<std::int32_t>({step.batch, time});
  for (std::int64_t k = 1; k < step.accumulation; ++k) {
    for (int part = 0; part < (step.packed ? 3 : 2); ++part)
      s.waiting.emplace_back(Shape{step.batch, time});
  }
  stage(&train::MemoryEstimate::data);
  s.loss = {.chunked = step.chunked_loss,
            .chunk_rows = step.loss_chunk_rows,
            .starts = starts_reach_model ? s.starts : Tensor<std::int32_t>()};
  s.optimizer = make_optimizer<T>(step.optimizer, s.trainable);
}

/// Counts, shape-only, the peak bytes of a training step of `make()`'s model on `step` with its
/// blocks under `p`: a first step makes the gradients and the optimizer's state, as a training
/// loop's first step does, and the second is counted.
template <class T, class Make>
double count_step(const Make& make, std::int64_t time, const train::StepShape& step,
                  bool starts_reach_model, const plan::Plan& p) {
  using Model = decltype(make());
  const ShapeOnly run;
  const PrecisionGuard precision(step.precision);
  PricedStep<T, Model> s{make()};
  set_up_step(s, time, step, starts_reach_model, nullptr);
  s.train(nullptr);
  memory::reset_peak();
  s.train(&p);
  return static_cast<double>(run.peak_bytes());
}

/// Measures the step `make()`'s model takes on `step`, shape-only: each persistent figure is the
/// live bytes its stage adds (weights as stored, adapters, data; the gradients the first
/// backward pass leaves, the optimizer's state its first step makes), then the layers' chain,
/// profiled. The estimate counts a step under any plan with `make` again (count_step).
template <class T, class Make>
train::MemoryEstimate measure_step(Make make, std::int64_t vocab, std::int64_t width,
                                   std::int64_t time, const train::StepShape& step,
                                   bool starts_reach_model) {
  using Model = decltype(make());
  train::MemoryEstimate m;
  {
    const ShapeOnly run;
    const PrecisionGuard precision(step.precision);
    PricedStep<T, Model> s{make()};
    for (const Parameter<T>& p : s.model.parameters()) m.parameter_count += p.numel();
    set_up_step(s, time, step, starts_reach_model, &m);
    for (const Parameter<T>& p : s.trainable) m.trainable_count += p.numel();
    if (s.adapters) m.adapter_count = s.adapters->parameter_count();
    {
      Tape tape;
      tape.backward(s.model.loss(s.ids, s.targets, s.loss));
    }
    m.gradients = static_cast<double>(run.live_bytes()) - m.persistent();
    s.optimizer->step();
    m.optimizer_state = static_cast<double>(run.live_bytes()) - m.persistent();
    s.optimizer->zero_grad();
    m.chain = s.model.profile(s.ids, s.targets, s.loss, {.repeats = 1, .policies = step.policies});
  }
  m.count_step = [make, time, step, starts_reach_model](const plan::Plan& p) {
    return count_step<T>(make, time, step, starts_reach_model, p);
  };
  const double tokens = static_cast<double>(step.batch) * static_cast<double>(time);
  m.logits = tokens * static_cast<double>(vocab) * sizeof(T);
  m.loss_chunk = loss_chunk_bytes<T>(vocab, width, tokens, step.loss_chunk_rows);
  return m;
}

}  // namespace remat::detail

namespace remat::train {

/// Predicts the memory of one training step of GPT<T>(config) on `step` (time 0: the config's
/// context): persistent state, and a chain to price any checkpoint plan with. Throws an
/// ArgumentError for an invalid configuration, a batch or sequence length out of range, or LoRA
/// targets the model does not have.
template <class T = float>
MemoryEstimate estimate_memory(const nn::GPTConfig& config, const StepShape& step = {}) {
  const std::int64_t time =
      remat::detail::checked_step_time<T>("train::estimate_memory", config, step);
  return remat::detail::measure_step<T>([config] { return nn::GPT<T>(config); }, config.vocab,
                                        config.width, time, step, false);
}

/// Predicts the memory of one training step of Llama<T>(config) on `step` (time 0: the config's
/// max_position_embeddings), as the GPT one does.
template <class T = float>
MemoryEstimate estimate_memory(const nn::LlamaConfig& config, const StepShape& step = {}) {
  const std::int64_t time =
      remat::detail::checked_step_time<T>("train::estimate_memory", config, step);
  return remat::detail::measure_step<T>([config] { return nn::Llama<T>::uninitialized(config); },
                                        config.vocab_size, config.hidden_size, time, step, true);
}

/// The peak bytes of one training step of GPT<T>(config) on `step` with its blocks under `p`:
/// estimate_memory(config, step).total(p), without the profile of the layers estimate_memory
/// also runs for the planners (most of its time: docs/benchmarks.md). What a search over batch
/// sizes asks once a probe. Throws as estimate_memory does, and a PlanError for a plan that does
/// not fit the model's layers.
template <class T = float>
double step_peak(const nn::GPTConfig& config, const StepShape& step, const plan::Plan& p) {
  const std::int64_t time = remat::detail::checked_step_time<T>("train::step_peak", config, step);
  plan::detail::check_plan(p, static_cast<std::size_t>(config.layers), "train::step_peak");
  return remat::detail::count_step<T>([config] { return nn::GPT<T>(config); }, time, step, false,
                                      p);
}

/// step_peak() for Llama<T>(config).
template <class T = float>
double step_peak(const nn::LlamaConfig& config, const StepShape& step, const plan::Plan& p) {
  const std::int64_t time = remat::detail::checked_step_time<T>("train::step_peak", config, step);
  plan::detail::check_plan(p, static_cast<std::size_t>(config.num_hidden_layers),
                           "train::step_peak");
  return remat::detail::count_step<T>([config] { return nn::Llama<T>::uninitialized(config); },
                                      time, step, true, p);
}

}  // namespace remat::train
