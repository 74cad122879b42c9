#pragma once
/// @file
/// "Will it fit?": the memory a GPT or Llama training step needs, predicted from its configuration
/// and batch shape alone, before anything is allocated. Parameters, gradients and optimizer state
/// come from the layer sizes; the blocks' activations come from a plan::Chain written from what
/// each op keeps for backward (the same figures plan::profile measures on a real model), so every
/// checkpoint plan can be priced with plan::predict; the logits from the loss's shape. For
/// fine-tuning, StepShape adds the blocks' weight storage (f32, bf16, int8, nf4) and LoRA
/// adapters (rank, targets): see detail::price_finetune.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "remat/checkpoint/plan.hpp"
#include "remat/core/save_policy.hpp"
#include "remat/core/quantized.hpp"
#include "remat/nn/block_ops.hpp"
#include "remat/nn/gpt.hpp"
#include "remat/nn/llama.hpp"
#include "remat/ops/op_types.hpp"

namespace remat::nn {

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
  /// Packed rows: the step also holds their starts, (B, T) int32 like the ids (Llama::loss's
  /// `starts`), priced in `data`. The attention ops keep a handle to it, not a copy, and allocate
  /// nothing more for it: the chain is the same.
  bool packed = false;
  /// Micro-batches per optimizer step. Memory does not depend on it (backward adds into the
  /// gradient buffers in place); the step trains on batch x accumulation sequences.
  std::int64_t accumulation = 1;
  /// How the blocks' linear weights are stored (nn::Linear::quantize): f32 trains them unless
  /// adapters are added; bf16, int8 and nf4 freeze them. Embeddings, norms, biases and the head
  /// stay float.
  WeightStorage storage = WeightStorage::f32;
  bool double_quant = true;  ///< NF4's second-level scales (QuantizedWeight::quantize's default)
  /// Adapters: with a rank > 0 every base parameter is frozen (lora::apply) and only the
  /// adapters get gradients and optimizer state.
  LoraShape lora;
  /// Save policies to price each layer under, in a checkpoint segment of its own, as
  /// plan::ProfileOptions::policies does for a profiled chain: they land in
  /// MemoryEstimate::chain.policies, so plans with such segments can be priced
  /// (MemoryEstimate::total) and plan::budget() chooses among them. Any policy is priced
  /// (save_matmuls(), save_ops(), recompute_ops(), save_if() with the user's predicate), for
  /// every weight storage, with or without adapters: the estimator describes a block op by op and
  /// asks the policy about each op's OpInfo (Note [block ops] in nn/block_ops.hpp). Policies that
  /// keep nothing are skipped. A policy that keeps the inputs of a block's last residual add but
  /// not the add (only a predicate that tells the block's two adds apart can) would chain
  /// adjacent segments, which the model does not price: an ArgumentError naming it.
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
  double data = 0;        ///< token ids and targets (and packed rows' starts)
  double logits = 0;      ///< the (B T x V) logits of the plain loss (its gradient is as large)
  double loss_chunk = 0;  ///< the logits chunk the chunked loss holds instead
  /// The blocks as a chain for the planners: plan::budget(estimate.chain, bytes) and friends.
  plan::Chain chain;

  /// Bytes held between steps.
  double persistent() const noexcept {
    return parameters + adapters + gradients + optimizer_state + data;
  }
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
  return v * w + static_cast<double>(c.context) * w + static_cast<double>(c.layers) * block +
         2 * w + (c.tied ? 0 : v * w);
}

/// Bytes of the logits chunk linear_cross_entropy holds for `tokens` rows of a `vocab`-wide head.
template <class T>
double loss_chunk_bytes(std::int64_t vocab, double tokens) {
  return std::min(static_cast<double>(default_chunk_rows(vocab, sizeof(T))), tokens) *
         static_cast<double>(vocab) * sizeof(T);
}

/// The loss head's figures on n rows of width w, after a final norm that keeps `norm_kept`
/// elements. The plain loss keeps its input, the (N V) logits and one log-sum-exp a row; its
/// backward holds their gradient or, when the vocabulary is narrower than the model, the norm's
/// input gradient. The chunked loss (Note [fused loss head] in ops/loss.hpp) with a trained head
/// keeps its input and the log-sum-exps, holds a logits chunk in forward and the chunk's gradient
/// and its input's in backward. With a frozen head (LoRA) it keeps its input's unit gradient
/// instead; in forward it holds a chunk and the log-sum-exps beside its input (which dies with
/// the forward pass), in backward its input's gradient.
template <class T>
void set_loss_figures(plan::Chain& chain, std::int64_t vocab, double n, double w, double norm_kept,
                      bool chunked, bool head_trained) {
  const double e = sizeof(T), v = static_cast<double>(vocab);
  const double chunk = loss_chunk_bytes<T>(vocab, n);
  if (!chunked) {
    chain.loss_bytes = (n * w + norm_kept + n + n * v) * e;
    chain.loss_forward_transient_bytes = 0;
    chain.loss_backward_transient_bytes = std::max(n * v, n * w - n) * e;
  } else if (head_trained) {
    chain.loss_bytes = (n * w + norm_kept + n) * e;
    chain.loss_forward_transient_bytes = chunk;
    chain.loss_backward_transient_bytes = chunk + n * w * e;
  } else {
    chain.loss_bytes = (n * w + norm_kept) * e;
    chain.loss_forward_transient_bytes = chunk + (n * w + n) * e;
    chain.loss_backward_transient_bytes = n * w * e;
  }
}

/// What an attention op keeps (elements), its scratch in forward and in backward, and the
/// (query x key) pairs its GEMMs multiply, for B sequences of T tokens and H heads: the fused op
/// keeps its (T x T) probabilities per head, its scratch is one or two (T x T) blocks (the
/// dropped weights with dropout); the flash op keeps one log-sum-exp per query row and works in
/// (R x T) blocks, R = min(kFlashBlockRows, T), skipping the keys a block of queries cannot see.
struct AttentionFigures {
  double kept, forward_scratch, backward_scratch, pairs;
};

inline AttentionFigures attention_figures(bool flash, bool dropout, std::int64_t batch,
                                          std::int64_t heads, std::int64_t time) {
  const double b = static_cast<double>(batch), h = static_cast<double>(heads),
               t = static_cast<double>(time), d = dropout ? 1 : 0;
  if (!flash) return {b * h * t * t, d * t * t, (1 + d) * t * t, t * t};
  const std::int64_t rows = std::min(kFlashBlockRows, time);
  double pairs = 0;
  for (std::int64_t i0 = 0; i0 < time; i0 += rows)
    pairs += static_cast<double>(std::min(rows, time - i0) * std::min(i0 + rows, time));
  const double r = static_cast<double>(rows);
  return {b * h * t, (1 + d) * r * t, (2 + d) * r * t, pairs};
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
/// - the loss head: ln_f keeps two numbers a row (2N); the loss's own figures are
///   set_loss_figures'.
/// tests/nn/estimate_test.cpp checks each figure against plan::profile on real models.
template <class T>
plan::Chain gpt_chain(const nn::GPTConfig& c, std::int64_t batch, std::int64_t time,
                      bool chunked_loss, bool head_trained) {
  const double e = sizeof(T), b = static_cast<double>(batch), t = static_cast<double>(time);
  const double n = b * t, w = static_cast<double>(c.width);
  const double dropout = c.dropout > 0 ? 1 : 0;
  const auto [kept, forward_scratch, backward_scratch, pairs] =
      attention_figures(c.attention == nn::Attention::flash, c.dropout > 0, batch, c.heads, time);
  const auto layers = static_cast<std::size_t>(c.layers);
  plan::Chain chain;
  chain.boundary_bytes.assign(layers + 1, n * w * e);
  chain.activation_bytes.assign(layers, (15 * n * w + 4 * n + kept) * e);
  chain.forward_transient_bytes.assign(layers,
                                       std::max(n * w, forward_scratch - 11 * n * w - 2 * n) * e);
  chain.backward_transient_bytes.assign(
      layers, std::max((4 + dropout) * n * w, backward_scratch - 7 * n * w - 2 * n) * e);
  // forward FLOPs: the four projections (24 N C^2) and attention's two (queries x keys) GEMMs per
  // head
  chain.forward_cost.assign(layers, 24 * n * w * w + 4 * b * pairs * w);
  chain.saves_output.assign(layers, false);
  chain.input_made_in_step = true;
  chain.output_held = false;  // GPT::loss keeps no Var of the blocks' output; ln_f saves it
  chain.loss_output_bytes = 2 * e;
  set_loss_figures<T>(chain, c.vocab, n, w, 2 * n, chunked_loss, head_trained);
  return chain;
}

/// One of a block's linear layers, for pricing its storage and its adapters: the last component
/// of its path (what LoRA targets match), its sizes, its bias, and the stage of the block whose
/// kept elements start with its input (see price_finetune).
struct BlockLinear {
  const char* name;
  double in, out;
  bool bias;
  std::size_t stage;
  /// Output width of a linear that reads the same input and may run first (gate_proj and
  /// up_proj: the order a compiler evaluates call arguments in is unspecified).
  double sibling = 0;
  /// Its output goes through dropout (GPT's two projections with dropout > 0): while its backward
  /// runs, the dropout's (N, out) input gradient is alive beside the one it makes.
  bool dropped = false;
};

/// The float scratch a quantized linear dequantizes its weight into: a panel of
/// quantized_panel_rows whole rows.
template <class T>
double quantized_panel_bytes(const BlockLinear& l) {
  const auto in = static_cast<std::int64_t>(l.in), out = static_cast<std::int64_t>(l.out);
  return static_cast<double>(quantized_panel_rows(in, out)) * l.in * sizeof(T);
}

/// Whether `name` is one of the adapters' targets.
inline bool lora_targeted(const nn::LoraShape& lora, const std::string& name) {
  return lora.rank > 0 &&
         std::find(lora.targets.begin(), lora.targets.end(), name) != lora.targets.end();
}

/// What a fine-tune changes in an estimate made for full training in T: the blocks' linear
/// weights in their storage, the adapters and what they keep, and which parameters train.
/// `stages` are the elements a block keeps for backward split where its linears start: with
/// adapters every base parameter is frozen, so the first block's ops before its first adapted
/// linear read nothing that needs a gradient and keep nothing (the tape records no node that
/// needs none).
/// Nor does the first block keep its input: GPT::hidden and Llama::hidden hand it over to the
/// blocks, and it dies once the first block has read it.
/// - Each adapter keeps A's output (N r) for B's backward (A's input is the base layer's, kept
///   already). When its hook adds in the first pass, the base output, B's output, its scaled copy
///   and the sum are alive (4 N out: the hook's expression holds its temporaries to its end), of
///   which the block keeps only what its later ops save: the forward temporaries are at least
///   4 N out less what the block keeps after the linear, less the block's output. A replay drops
///   B's output once scaled (3 N out): the replay's temporaries (Chain::replay_transient_bytes)
///   are at least 3 N out less the same. Without that figure the simulator would take the first
///   pass's for replays, and over-price nested plans by about one (N, C) tensor.
/// - A quantized linear dequantizes panels (quantized_panel_rows whole rows) into a float
///   scratch: in forward the panel sits beside the linear's output (N out), less what the block
///   keeps after the linear and its output; backward, beside the input gradient it makes (N in)
///   and its output's gradient through dropout (N out) when dropout follows it, less what the
///   block kept after the linear (freed by then).
/// (Figures checked against plan::profile and counted steps: tests/nn/finetune_estimate_test.cpp.)
template <class T>
void price_finetune(nn::MemoryEstimate& m, double count, std::int64_t layers,
                    const std::vector<BlockLinear>& linears, const std::vector<double>& stages,
                    double rows, const nn::StepShape& step) {
  const double e = sizeof(T), n_layers = static_cast<double>(layers);
  const nn::LoraShape& lora = step.lora;
  for (const std::string& t : lora.targets) {
    const bool known = std::any_of(linears.begin(), linears.end(),
                                   [&](const BlockLinear& l) { return t == l.name; });
    if (!known) {
      std::string names;
      for (const BlockLinear& l : linears) names += std::string(names.empty() ? "" : ", ") + l.name;
      throw ArgumentError(cat("nn::estimate_memory: LoRA target '", t,
                              "' names no linear layer of the model (", names, ")"));
    }
  }
  double linear_values = 0, stored = 0, adapter_values = 0, adapter_kept = 0, forward = 0,
         backward = 0, replay = 0;
  const double width = linears.back().out;  // the block's output
  std::size_t first_stage = stages.size();
  for (const BlockLinear& l : linears) {
    linear_values += l.in * l.out;
    stored += step.storage == WeightStorage::f32
                  ? l.in * l.out * e
                  : QuantizedWeight::bytes_for(static_cast<std::int64_t>(l.out),
                                               static_cast<std::int64_t>(l.in), step.storage,
                                               step.double_quant);
    // kept from the linear's output on: its stage less its input (and a sibling's output, which
    // may exist already), and the later stages; not yet made while it runs forward, freed already
    // when its backward runs
    double after = -rows * (l.in + l.sibling);
    for (std::size_t st = l.stage; st < stages.size(); ++st) after += stages[st];
    if (step.storage != WeightStorage::f32) {
      const double panel = quantized_panel_bytes<T>(l);
      forward = std::max(forward, (rows * l.out - after - rows * width) * e + panel);
      replay = std::max(replay, (rows * l.out - after - rows * width) * e + panel);
      backward =
          std::max(backward, (rows * l.in + (l.dropped ? rows * l.out : 0) - after) * e + panel);
    }
    if (lora_targeted(lora, l.name)) {
      const double r = static_cast<double>(lora.rank);
      adapter_values += r * (l.in + l.out);
      adapter_kept += rows * r * e;
      // lora_dropout: A saves its dropped input, a copy of its own (the mask is recomputed)
      if (lora.dropout > 0) adapter_kept += rows * l.in * e;
      forward = std::max(forward, (4 * rows * l.out - after - rows * width) * e);
      replay = std::max(replay, (3 * rows * l.out - after - rows * width) * e);
      first_stage = std::min(first_stage, l.stage);
    }
  }
  m.parameters = (count - n_layers * linear_values) * e + n_layers * stored;
  m.adapter_count = static_cast<std::int64_t>(n_layers * adapter_values);
  m.adapters = n_layers * adapter_values * e;
  double trainable = count;
  if (lora.rank > 0)
    trainable = n_layers * adapter_values;
  else if (step.storage != WeightStorage::f32)
    trainable = count - n_layers * linear_values;
  m.trainable_count = static_cast<std::int64_t>(trainable);
  m.gradients = trainable * e;
  m.optimizer_state = step.optimizer == nn::OptimizerKind::adamw          ? 2 * m.gradients
                      : step.optimizer == nn::OptimizerKind::sgd_momentum ? m.gradients
                                                                          : 0;
  plan::Chain& c = m.chain;
  if (lora.rank > 0) c.replay_transient_bytes = c.forward_transient_bytes;
  for (std::size_t l = 0; l < c.layers(); ++l) {
    if (lora.rank > 0) c.replay_transient_bytes[l] = std::max(c.replay_transient_bytes[l], replay);
    c.activation_bytes[l] += adapter_kept;
    c.forward_transient_bytes[l] = std::max(c.forward_transient_bytes[l], forward);
    c.backward_transient_bytes[l] = std::max(c.backward_transient_bytes[l], backward);
  }
  if (lora.rank > 0 && !c.activation_bytes.empty()) {
    // Its ops before the first adapter keep nothing but still make their values: bounded by
    // what the block would hold if it kept everything (what it does keep is a_0)
    const double whole = c.activation_bytes[0] + c.forward_transient_bytes[0];
    for (std::size_t s = 0; s < first_stage && s < stages.size(); ++s)
      c.activation_bytes[0] -= stages[s] * e;
    if (first_stage >= 2)
      c.forward_transient_bytes[0] =
          std::max(c.forward_transient_bytes[0], whole - c.activation_bytes[0]);
    // nor does it keep its input, the frozen embedding's output
    c.saves_input.assign(c.layers(), true);
    c.saves_input[0] = false;
  }
}

/// The parts of a MemoryEstimate every model shares: parameters, gradients, optimizer state,
/// token ids and targets, the logits (plain or chunked), given the parameter count and the
/// chain; then the fine-tune's storage and adapters (price_finetune).
template <class T>
nn::MemoryEstimate step_estimate(double count, std::int64_t vocab, const nn::StepShape& step,
                                 std::int64_t time, plan::Chain chain, std::int64_t layers,
                                 const std::vector<BlockLinear>& linears,
                                 const std::vector<double>& stages) {
  if (step.accumulation < 1 || step.lora.rank < 0) {
    throw ArgumentError(
        cat("nn::estimate_memory: need accumulation >= 1 and a LoRA rank >= 0; got accumulation ",
            step.accumulation, ", rank ", step.lora.rank));
  }
  if (step.lora.rank > 0 && step.lora.targets.empty())
    throw ArgumentError("nn::estimate_memory: LoRA rank > 0 but no target names");
  if (!(step.lora.dropout >= 0 && step.lora.dropout < 1))
    throw ArgumentError(
        cat("nn::estimate_memory: LoRA dropout must be in [0, 1), got ", step.lora.dropout));
  switch (step.optimizer) {
    case nn::OptimizerKind::sgd:
    case nn::OptimizerKind::sgd_momentum:
    case nn::OptimizerKind::adamw:
      break;
    default:
      throw ArgumentError(
          cat("nn::estimate_memory: unknown optimizer kind ", static_cast<int>(step.optimizer)));
  }
  const double e = sizeof(T);
  nn::MemoryEstimate m;
  m.parameter_count = static_cast<std::int64_t>(count);
  const double tokens = static_cast<double>(step.batch) * static_cast<double>(time);
  m.data = (step.packed ? 3 : 2) * tokens * sizeof(std::int32_t);
  m.logits = tokens * static_cast<double>(vocab) * e;
  m.loss_chunk = loss_chunk_bytes<T>(vocab, tokens);
  m.chain = std::move(chain);
  price_finetune<T>(m, count, layers, linears, stages, tokens, step);
  return m;
}

/// Builds a block's op list (Note [block ops] in nn/block_ops.hpp) for B sequences of T tokens:
/// linears in their storage, with LoRA's ops inside the targeted ones. `first`: the first block
/// of a model with adapters, whose input (the frozen embedding's output) needs no gradient, nor
/// do the ops before its first adapter: they save nothing.
template <class T>
class BlockOpsBuilder {
 public:
  BlockOpsBuilder(const nn::StepShape& step, std::int64_t batch, std::int64_t time, bool first)
      : step_(step), b_(batch), t_(time), n_(static_cast<double>(batch * time)), first_(first) {}

  /// Appends `op` (its shape's last axis `width`); its `grad` says whether it reads a parameter
  /// that trains. Returns its value.
  int add(BlockOp op, std::int64_t width) {
    op.shape = Shape{b_, t_, width};
    for (int v : op.inputs) op.grad = op.grad || graded(v);
    ops_.push_back(std::move(op));
    return static_cast<int>(ops_.size()) - 1;
  }
  /// An element-wise op (FLOPs: its output's elements, Node's default); `alias`: add's backward.
  int pointwise(const OpType& type, std::int64_t width, std::vector<int> inputs,
                std::vector<int> saves, double own = 0, bool trains = false) {
    return add({.type = &type,
                .flops = n_ * static_cast<double>(width),
                .inputs = std::move(inputs),
                .saves = std::move(saves),
                .own = own,
                .grad = trains,
                .alias_grad = type == op::add},
               width);
  }
  /// A linear layer (quantized in its storage; LoRA's A, B, scale and add when targeted).
  int linear(const BlockLinear& l, int input) {
    const bool quantized = step_.storage != WeightStorage::f32;
    const auto out = static_cast<std::int64_t>(l.out);
    const double flops = 2 * n_ * l.in * l.out, panel = quantized ? quantized_panel_bytes<T>(l) : 0;
    const int base = add({.type = quantized ? &op::quantized_linear : &op::linear,
                          .flops = flops,
                          .inputs = {input},
                          .saves = {input},
                          .scratch_bytes = panel,
                          .resaves = true,
                          .grad = step_.lora.rank == 0 && (!quantized || l.bias),
                          .cost = flops,
                          .backward_scratch_bytes = panel,
                          .grad_in_place = true},
                         out);
    if (!lora_targeted(step_.lora, l.name)) return base;
    const std::int64_t r = step_.lora.rank;
    const auto adapter = [&](int in, double in_width, std::int64_t out_width) {
      return add({.type = &op::linear,
                  .flops = 2 * n_ * in_width * static_cast<double>(out_width),
                  .inputs = {in},
                  .saves = {in},
                  .resaves = true,
                  .grad = true,
                  .grad_in_place = true},
                 out_width);
    };
    // lora_dropout: the adapter reads a dropped copy of the input (its mask is recomputed, not
    // kept), which A saves
    const int in = step_.lora.dropout > 0
                       ? pointwise(op::dropout, static_cast<std::int64_t>(l.in), {input}, {})
                       : input;
    const int a = adapter(in, l.in, r);
    const int bb = adapter(a, static_cast<double>(r), out);
    const int s = pointwise(op::scale, out, {bb}, {});
    const int sum = pointwise(op::add, out, {base, s}, {});
    // the hook's expression holds its temporaries, and the base output, to its end
    for (int v : {base, in == input ? -1 : in, a, bb, s}) hold(v, sum);
    return sum;
  }
  /// An attention op reading `inputs`, saving `saves` and `own` elements of its own, its scratch
  /// blocks beside its output; it writes its inputs' gradients in place (grouped-query
  /// attention: `temporaries`, made whole and adopted).
  int attention(const OpType& type, std::int64_t width, std::vector<int> inputs,
                std::vector<int> saves, double own, const AttentionFigures& att, bool temporaries) {
    return add({.type = &type,
                .flops = n_ * static_cast<double>(width),
                .inputs = std::move(inputs),
                .saves = std::move(saves),
                .own = own,
                .scratch_bytes = att.forward_scratch * sizeof(T),
                .grad = false,
                .cost = 4 * static_cast<double>(b_) * att.pairs * static_cast<double>(width),
                .backward_scratch_bytes = att.backward_scratch * sizeof(T),
                .grad_in_place = !temporaries},
               width);
  }
  /// The forward's Vars hold value v at least until op `until` has run.
  void hold(int v, int until) {
    if (v < 0) return;
    int& h = ops_[static_cast<std::size_t>(v)].held_until;
    h = std::max(h, until);
  }
  bool norms_train() const { return step_.lora.rank == 0; }
  /// Whether the block's input needs a gradient.
  bool input_grad() const { return !(first_ && step_.lora.rank > 0); }
  std::vector<BlockOp> take() {
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      for (int v : ops_[i].inputs) hold(v, static_cast<int>(i));
    }
    return std::move(ops_);
  }

 private:
  bool graded(int v) const { return v < 0 ? input_grad() : ops_[static_cast<std::size_t>(v)].grad; }

  const nn::StepShape& step_;
  std::int64_t b_, t_;
  double n_;
  bool first_;
  std::vector<BlockOp> ops_;
};

/// Adds the costs of step.policies to m.chain (StepShape::policies), each from the block's ops
/// (Note [block ops] in nn/block_ops.hpp): `first` for layer 0, `rest` for the others. A layer
/// under the policy keeps what the model says, pins its input when a replayed op captures it or
/// a kept op saves it, and not its output; its backward first replays the ops not kept, and then
/// peaks at the plain block's backward (beta_l) above what the replay restored.
template <class T>
void price_policies(nn::MemoryEstimate& m, const nn::StepShape& step,
                    const std::vector<BlockOp>& first, bool first_input_grad,
                    const std::vector<BlockOp>& rest) {
  const double e = sizeof(T);
  // A save_nothing segment's first pass, from the same op model: without it the planners take
  // the plain block's a_l + tau_l, an upper bound that frozen (LoRA) blocks sit far below.
  const double seg0 = price_block_policy(first, save_nothing(), e, first_input_grad).forward,
               seg = price_block_policy(rest, save_nothing(), e, true).forward;
  m.chain.segment_transient_bytes.assign(m.chain.layers(), seg);
  if (!m.chain.segment_transient_bytes.empty()) m.chain.segment_transient_bytes[0] = seg0;
  for (const SavePolicy& policy : step.policies) {
    if (!policy.keeps_anything() || m.chain.policy_index(policy) >= 0) continue;
    plan::Chain& c = m.chain;
    const std::size_t n = c.layers();
    plan::PolicyCosts q;
    q.policy = policy;
    q.activation_bytes.resize(n);
    q.forward_transient_bytes.resize(n);
    q.backward_transient_bytes.resize(n);
    q.saves_input.resize(n);
    q.saves_output.assign(n, false);
    q.replay_cost.resize(n);
    const BlockPolicyFigures f0 = price_block_policy(first, policy, e, first_input_grad),
                             f = price_block_policy(rest, policy, e, true);
    if (f0.tail_chains || f.tail_chains) {
      // the blocks end in a residual add whose inputs a name, size or FLOPs predicate keeps or
      // drops together with it; a policy that keeps them but not the add chains segments
      throw ArgumentError(cat("nn::estimate_memory: cannot price the save policy '", policy.name(),
                              "': it keeps the inputs of the block's last op but not the op, so "
                              "adjacent layers would chain (plan::profile measures it on a real "
                              "model: ProfileOptions::policies)"));
    }
    for (std::size_t l = 0; l < n; ++l) {
      const BlockPolicyFigures& g = l == 0 ? f0 : f;
      q.activation_bytes[l] = g.kept;
      q.forward_transient_bytes[l] = g.forward;
      q.backward_transient_bytes[l] = g.backward;
      q.saves_input[l] = g.saves_input;
      q.replay_cost[l] = g.replay_cost;
    }
    // A block ends in a residual add reading a value kept or replayed with it (tail_chains is
    // false), so adjacent segments under one policy take over no tail (Note [chained segments] in
    // core/tape_state.hpp): chained, a layer runs as alone.
    const plan::PolicyCosts alone = q;
    q.chained.assign(3, alone);
    c.policies.push_back(std::move(q));
  }
}
}  // namespace remat::detail

namespace remat::nn {

/// Predicts the memory of one training step of GPT<T>(config) on `step`: persistent state, and
/// a chain to price any checkpoint plan with. Throws an ArgumentError for an invalid configuration
/// or a batch or sequence length out of range.
template <class T = float>
MemoryEstimate estimate_memory(const GPTConfig& config, const StepShape& step = {}) {
  static_assert(std::is_floating_point_v<T>, "nn::estimate_memory prices float or double models");
  config.validate();
  const std::int64_t time = step.time == 0 ? config.context : step.time;
  if (step.batch < 1 || time < 1 || time > config.context) {
    throw ArgumentError(remat::detail::cat(
        "nn::estimate_memory: need batch >= 1 and 1 <= time <= context = ", config.context,
        "; got batch ", step.batch, ", time ", time));
  }
  // Beyond 2^53 elements the doubles below stop being exact counts, and no machine holds that.
  constexpr double kMostElements = 9007199254740992.0;
  const double count = remat::detail::gpt_parameter_count(config);
  const double largest = std::max(
      {count, static_cast<double>(step.batch) * static_cast<double>(time) *
                  std::max({static_cast<double>(config.vocab), static_cast<double>(config.width),
                            static_cast<double>(config.heads) * static_cast<double>(time)})});
  if (!(largest < kMostElements) || config.layers > (std::int64_t{1} << 20)) {
    throw ArgumentError(remat::detail::cat(
        "nn::estimate_memory: a model of ", config.layers, " layers, width ", config.width,
        ", vocabulary ", config.vocab, " with batch ", step.batch, " x ", time,
        " tokens is beyond what can be counted (over 2^53 elements, or 2^20 layers)"));
  }
  const double n = static_cast<double>(step.batch) * static_cast<double>(time),
               w = static_cast<double>(config.width);
  const auto att = remat::detail::attention_figures(
      config.attention == Attention::flash, config.dropout > 0, step.batch, config.heads, time);
  // gpt_chain's kept elements by stage: ln1 | qkv's input, attention (its probabilities, or the
  // flash op's log-sum-exps) | proj's input, the residual, ln2 | fc's input, GELU's input |
  // GELU's output (the MLP's proj)
  const std::vector<double> stages{2 * n, 4 * n * w + att.kept, 2 * n * w + 2 * n, 5 * n * w,
                                   4 * n * w};
  const bool dropped = config.dropout > 0;
  const std::vector<remat::detail::BlockLinear> linears{{"qkv", w, 3 * w, true, 1},
                                                        {"proj", w, w, true, 2, 0, dropped},
                                                        {"fc", w, 4 * w, true, 3},
                                                        {"proj", 4 * w, w, true, 4, 0, dropped}};
  MemoryEstimate m = remat::detail::step_estimate<T>(
      count, config.vocab, step, time,
      remat::detail::gpt_chain<T>(config, step.batch, time, step.chunked_loss, step.lora.rank == 0),
      config.layers, linears, stages);
  // The block's ops for its save policies (Note [block ops] in nn/block_ops.hpp):
  // h = x + drop(proj(attention(qkv(ln1(x))))); y = h + drop(proj(gelu(fc(ln2(h))))).
  const auto ops = [&](bool first) {
    remat::detail::BlockOpsBuilder<T> o(step, step.batch, time, first);
    const std::int64_t c = config.width;
    const bool p = config.dropout > 0;
    const auto drop = [&](int v) { return p ? o.pointwise(op::dropout, c, {v}, {}) : v; };
    const int ln1 = o.pointwise(op::layer_norm, c, {-1}, {-1}, 2 * n, o.norms_train());
    const int qkv = o.linear(linears[0], ln1);
    const int attn =
        o.attention(config.attention == Attention::flash ? op::flash_causal_self_attention
                                                         : op::causal_self_attention,
                    c, {qkv}, {qkv}, att.kept, att, false);
    const int proj = o.linear(linears[1], attn);
    const int d1 = drop(proj);
    const int h = o.pointwise(op::add, c, {-1, d1}, {});
    const int ln2 = o.pointwise(op::layer_norm, c, {h}, {h}, 2 * n, o.norms_train());
    const int fc = o.linear(linears[2], ln2);
    const int g = o.pointwise(op::gelu_tanh, 4 * c, {fc}, {fc});
    const int mproj = o.linear(linears[3], g);
    const int d2 = drop(mproj);
    const int y = o.pointwise(op::add, c, {h, d2}, {});
    // the Vars of attn(), mlp() and the block's two statements hold their temporaries to the
    // statement's end
    for (int v : {ln1, qkv, attn, proj, d1}) o.hold(v, (v == ln1 || v == d1) ? h : d1);
    for (int v : {fc, g, mproj}) o.hold(v, d2);
    for (int v : {h, ln2, d2}) o.hold(v, y);
    return o;
  };
  auto first = ops(true);
  const bool first_input_grad = first.input_grad();
  remat::detail::price_policies<T>(m, step, first.take(), first_input_grad, ops(false).take());
  return m;
}

}  // namespace remat::nn

namespace remat::detail {

/// Parameters of a Llama (C wide, Q = heads x head size, K = kv heads x head size, F the MLP's
/// width): the embedding, per layer q and o (2 C Q), k and v (2 C K), the MLP (3 C F), two norms
/// (2 C), the q/k/v biases (Q + 2 K), o's (C) and the MLP's (2 F + C) when present, Qwen3's q/k
/// norms (2 D), the final norm, and the head unless it is tied.
inline double llama_parameter_count(const nn::LlamaConfig& c) {
  const auto w = static_cast<double>(c.hidden_size), v = static_cast<double>(c.vocab_size);
  const auto d = static_cast<double>(c.head_dim());
  const double q = static_cast<double>(c.num_attention_heads) * d,
               kv = static_cast<double>(c.num_key_value_heads) * d,
               f = static_cast<double>(c.intermediate_size);
  const double layer = 2 * w * q + 2 * w * kv + 3 * w * f + 2 * w +
                       (c.attention_bias ? q + 2 * kv : 0) + (c.o_proj_bias ? w : 0) +
                       (c.mlp_bias ? 2 * f + w : 0) + (c.qk_norm ? 2 * d : 0);
  return v * w + static_cast<double>(c.num_hidden_layers) * layer + w +
         (c.tie_word_embeddings ? 0 : v * w);
}

/// The decoder layers' chain, op by op (N = B T rows, C wide, Q = query heads x head size, K =
/// kv heads x head size, F the MLP's width, H query heads, e bytes an element):
/// - kept per layer: the two RMSNorms one number a row each (2N), the q/k/v projections their
///   shared input (NC), attention the rotated queries (NQ), rotated keys and the values (2NK)
///   and its probabilities (B H T^2), o_proj its input (NQ), the second norm the residual sum
///   (NC), gate/up their shared input (NC), swiglu gate and up (2NF), down_proj swiglu's output
///   (NF): 3 NC + 2 NQ + 2 NK + 3 NF + 2N + B H T^2 (biases keep nothing more; a sliding window
///   changes no byte and no FLOP: the window is a mask over the same (T x T) scores);
/// - forward temporaries: down_proj's output before the residual add (NC);
/// - backward temporaries, the largest of: swiglu's two input gradients beside down_proj's
///   input gradient (2 NF, net of what is freed), the norm's input gradient once the MLP's
///   activations are gone (NC - NF), and attention's (T x T) scratch beside its q/k/v
///   gradients, less what the sweep has freed by then (T^2 + 2 NK - NC - 3 NF - N);
/// - with Attention::flash, attention keeps one log-sum-exp per query row (B H T) instead of the
///   probabilities; its scratch is (R x T) blocks, R = min(kFlashBlockRows, T): the scores in
///   forward, beside the q and k projections (NC + NK, freed once attention has rotated them),
///   less what the rest of the layer keeps after it (3 NC + 3 NF + N); and the probabilities and
///   their gradient in backward, in place of the (T x T) scratch;
/// - the loss head: the final norm keeps one number a row (N); the loss's own figures are
///   set_loss_figures'.
/// tests/nn/estimate_test.cpp checks each figure against plan::profile on real models.
template <class T>
plan::Chain llama_chain(const nn::LlamaConfig& c, std::int64_t batch, std::int64_t time,
                        bool chunked_loss, bool head_trained) {
  const double e = sizeof(T), b = static_cast<double>(batch), t = static_cast<double>(time);
  const double n = b * t, w = static_cast<double>(c.hidden_size);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim()),
               q = static_cast<double>(c.num_attention_heads * c.head_dim()),
               f = static_cast<double>(c.intermediate_size);
  const auto [kept, forward_scratch, backward_scratch, pairs] = attention_figures(
      c.attention == nn::Attention::flash, false, batch, c.num_attention_heads, time);
  const auto layers = static_cast<std::size_t>(c.num_hidden_layers);
  plan::Chain chain;
  chain.boundary_bytes.assign(layers + 1, n * w * e);
  // Qwen3's q_norm and k_norm keep their inputs, the q and k projections (NQ + NK), and one
  // number per head vector (N (H + G)); their outputs replace the projections as attention's
  // inputs, so the temporaries are the same
  const double qk_norms =
      c.qk_norm
          ? n * q + n * kv + n * static_cast<double>(c.num_attention_heads + c.num_key_value_heads)
          : 0;
  chain.activation_bytes.assign(
      layers, (3 * n * w + 2 * n * q + 2 * n * kv + 3 * n * f + 2 * n + kept + qk_norms) * e);
  chain.forward_transient_bytes.assign(
      layers, std::max(n * w, forward_scratch - 2 * n * w - 3 * n * f - n + n * kv) * e);
  chain.backward_transient_bytes.assign(
      layers,
      std::max({2 * n * f, n * w - n * f, backward_scratch + 2 * n * kv - n * w - 3 * n * f - n}) *
          e);
  // forward FLOPs: the seven projections and attention's two (queries x keys) GEMMs per head
  chain.forward_cost.assign(layers, 2 * n * w * (2 * q + 2 * kv + 3 * f) + 4 * b * pairs * q);
  chain.saves_output.assign(layers, false);
  chain.input_made_in_step = true;
  chain.output_held =
      false;  // Llama::loss keeps no Var of the layers' output; the final norm saves it
  chain.loss_output_bytes = 2 * e;
  set_loss_figures<T>(chain, c.vocab_size, n, w, n, chunked_loss, head_trained);
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
    throw ArgumentError(remat::detail::cat(
        "nn::estimate_memory: need batch >= 1 and 1 <= time <= max_position_embeddings = ",
        config.max_position_embeddings, "; got batch ", step.batch, ", time ", time));
  }
  constexpr double kMostElements =
      9007199254740992.0;  // 2^53: beyond it doubles stop counting exactly
  const double count = remat::detail::llama_parameter_count(config);
  const double tokens = static_cast<double>(step.batch) * static_cast<double>(time);
  const double largest = std::max(
      count,
      tokens *
          std::max({static_cast<double>(config.vocab_size), static_cast<double>(config.hidden_size),
                    static_cast<double>(config.intermediate_size),
                    static_cast<double>(config.num_attention_heads) * static_cast<double>(time)}));
  if (!(largest < kMostElements) || config.num_hidden_layers > (std::int64_t{1} << 20)) {
    throw ArgumentError(remat::detail::cat(
        "nn::estimate_memory: a Llama of ", config.num_hidden_layers, " layers, hidden size ",
        config.hidden_size, ", vocabulary ", config.vocab_size, " with batch ", step.batch, " x ",
        time, " tokens is beyond what can be counted (over 2^53 elements, or 2^20 layers)"));
  }
  const double w = static_cast<double>(config.hidden_size),
               f = static_cast<double>(config.intermediate_size);
  const double kv = static_cast<double>(config.num_key_value_heads * config.head_dim()),
               qw = static_cast<double>(config.num_attention_heads * config.head_dim());
  const auto att = remat::detail::attention_figures(config.attention == Attention::flash, false,
                                                    step.batch, config.num_attention_heads, time);
  // llama_chain's kept elements by stage: the first norm | q/k/v's input, attention (its
  // probabilities, or the flash op's log-sum-exps) | o_proj's input, the residual, the second
  // norm | gate/up's input, swiglu's | down_proj's input
  const double heads = static_cast<double>(config.num_attention_heads),
               kv_heads = static_cast<double>(config.num_key_value_heads);
  const double qk_norms =
      config.qk_norm ? tokens * qw + tokens * kv + tokens * (heads + kv_heads) : 0;
  const std::vector<double> stages{
      tokens, tokens * w + tokens * qw + 2 * tokens * kv + att.kept + qk_norms,
      tokens * qw + tokens * w + tokens, tokens * w + 2 * tokens * f, tokens * f};
  const bool b = config.attention_bias, mb = config.mlp_bias;
  const std::vector<remat::detail::BlockLinear> linears{
      {"q_proj", w, qw, b, 1},       {"k_proj", w, kv, b, 1},
      {"v_proj", w, kv, b, 1},       {"o_proj", qw, w, config.o_proj_bias, 2},
      {"gate_proj", w, f, mb, 3, f}, {"up_proj", w, f, mb, 3, f},
      {"down_proj", f, w, mb, 4}};
  MemoryEstimate m = remat::detail::step_estimate<T>(
      count, config.vocab_size, step, time,
      remat::detail::llama_chain<T>(config, step.batch, time, step.chunked_loss,
                                    step.lora.rank == 0),
      config.num_hidden_layers, linears, stages);
  // The layer's ops for its save policies (Note [block ops] in nn/block_ops.hpp):
  // h = x + o_proj(attention(q_proj(n1), k_proj(n1), v_proj(n1))), n1 = rms_norm(x);
  // y = h + down_proj(swiglu(gate_proj(n2), up_proj(n2))), n2 = rms_norm(h).
  const double n = tokens;
  const auto ops = [&](bool first) {
    remat::detail::BlockOpsBuilder<T> o(step, step.batch, time, first);
    const std::int64_t c = config.hidden_size, mlp = config.intermediate_size;
    const int n1 = o.pointwise(op::rms_norm, c, {-1}, {-1}, n, o.norms_train());
    // Qwen3's q_norm/k_norm: an rms_norm over each head, saving its input and a number per head
    // vector (the reshapes around it are views: no bytes, left out)
    const auto head_norm = [&](int x, double width, double rows) {
      return config.qk_norm ? o.pointwise(op::rms_norm, static_cast<std::int64_t>(width), {x}, {x},
                                          rows, o.norms_train())
                            : x;
    };
    const int q_lin = o.linear(linears[0], n1);
    const int q = head_norm(q_lin, qw, n * heads);
    const int k_lin = o.linear(linears[1], n1);
    const int kp = head_norm(k_lin, kv, n * kv_heads);
    const int v = o.linear(linears[2], n1);
    if (config.qk_norm) {
      for (int x : {q_lin, k_lin}) o.hold(x, v);  // project()'s temporaries
    }
    // it saves the rotated queries and keys (its own), the values, and its probabilities or
    // log-sum-exps
    const int attn =
        o.attention(config.attention == Attention::flash ? op::flash_grouped_query_attention
                                                         : op::grouped_query_attention,
                    config.num_attention_heads * config.head_dim(), {q, kp, v}, {v},
                    n * qw + n * kv + att.kept, att, true);
    const int op = o.linear(linears[3], attn);
    const int h = o.pointwise(op::add, c, {-1, op}, {});
    const int n2 = o.pointwise(op::rms_norm, c, {h}, {h}, n, o.norms_train());
    // GCC evaluates swiglu's arguments right to left; the two are the same size either way
    const int up = o.linear(linears[5], n2), gate = o.linear(linears[4], n2);
    const int sw = o.pointwise(op::swiglu, mlp, {gate, up}, {gate, up});
    const int down = o.linear(linears[6], sw);
    const int y = o.pointwise(op::add, c, {h, down}, {});
    // the attention's q, k, v Vars live to its end; each statement holds its temporaries
    for (int x : {q, kp, v, attn}) o.hold(x, op);
    for (int x : {n1, op}) o.hold(x, h);
    for (int x : {gate, up, sw}) o.hold(x, down);
    for (int x : {h, n2, down}) o.hold(x, y);
    return o;
  };
  auto first = ops(true);
  const bool first_input_grad = first.input_grad();
  remat::detail::price_policies<T>(m, step, first.take(), first_input_grad, ops(false).take());
  return m;
}

}  // namespace remat::nn
