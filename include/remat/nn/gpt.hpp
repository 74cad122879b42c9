#pragma once
/// @file
/// GPT: token and position embeddings, a stack of pre-LN transformer blocks, a final layer
/// norm and a head to the vocabulary (optionally tied to the token embedding), GPT-2's
/// architecture and initialization. The blocks run under any checkpoint plan.

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "remat/checkpoint/profile.hpp"
#include "remat/checkpoint/sequential.hpp"
#include "remat/nn/lm_loss.hpp"
#include "remat/nn/transformer.hpp"
#include "remat/ops/layout.hpp"
#include "remat/ops/loss.hpp"

namespace remat::nn {

struct GPTConfig {
  std::int64_t vocab = 256;    ///< tokens in the vocabulary
  std::int64_t context = 256;  ///< longest sequence (positions)
  std::int64_t layers = 8;     ///< transformer blocks
  std::int64_t heads = 4;      ///< attention heads per block
  std::int64_t width = 256;    ///< model width (d_model), divisible by heads
  double dropout = 0.0;        ///< on embeddings, attention weights and residual branches
  bool tied = false;           ///< the head reuses the token embedding's weight
  std::uint64_t seed = 1;      ///< initialization
  /// The blocks' attention op (AttentionKernel): the same function either way; flash keeps no
  /// (T x T) probabilities between forward and backward (a fifth less activation memory at
  /// context 256, half at 1024). Fused stays the default: at context 256 flash measured 1 to 4 %
  /// slower a step (docs/benchmarks.md, "Op-level rematerialization").
  AttentionKernel attention = AttentionKernel::fused;

  void validate() const {
    const bool ok = vocab >= 1 && context >= 1 && layers >= 1 && heads >= 1 && width >= 1 &&
                    width % heads == 0 && dropout >= 0 && dropout < 1;
    if (!ok) {
      throw ArgumentError(
          detail::cat("GPTConfig: need positive sizes, width divisible by heads and dropout in [0, "
                      "1); got vocab ",
                      vocab, ", context ", context, ", layers ", layers, ", heads ", heads,
                      ", width ", width, ", dropout ", dropout));
    }
  }
};

template <class T = float>
class GPT : public Module<T> {
  GPTConfig config_;  // first: the layers below are built from it

 public:
  using Layer = std::function<Var<T>(const Var<T>&)>;

  explicit GPT(const GPTConfig& config) : GPT(config, Rng(config.seed)) {}

  const GPTConfig& config() const noexcept { return config_; }

  /// Final hidden states (B, T, C) for token ids (B, T), the blocks run under `plan` (plainly
  /// without one).
  Var<T> hidden(const Tensor<std::int32_t>& ids, const plan::Plan* plan = nullptr) const {
    Var<T> x = embed(ids);
    if (plan) {
      // handed over, not copied: x_0 then dies once the first block has read it, as without a
      // plan (a copy here kept it alive through the whole forward pass)
      x = checkpoint_sequential(block_layers(), *plan, std::move(x));
    } else {
      for (const TransformerBlock<T>& block : blocks) x = block(x);
    }
    return ln_f(x);
  }

  /// Logits (B, T, V).
  Var<T> logits(const Tensor<std::int32_t>& ids, const plan::Plan* plan = nullptr) const {
    return linear(hidden(ids, plan), head_weight());
  }

  /// Mean cross-entropy of predicting `targets` (B, T) from `ids` (B, T), over the targets
  /// that are not kIgnoreTarget (a loss mask: prompt tokens, padding). Chunked by default: the
  /// (B T x V) logits and their gradient are never held whole (ops/loss.hpp). `o`: the plan,
  /// the head's chunking (nn/lm_loss.hpp); GPT does not pack rows (no starts).
  Var<T> loss(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets,
              const LossOptions& o = {}) const {
    check_loss_inputs(ids, targets, o);
    return head_loss(hidden(ids, o.plan), targets, o);
  }

  /// Measures the blocks as a chain for the planners (plan::profile), on a batch: their input
  /// is the embeddings' output, made during the step; the loss is the head and the loss() of
  /// that name, run as `loss` says (which has no plan: profiling measures the blocks without
  /// one). Parameters receive gradients: zero_grad() afterwards.
  plan::Chain profile(const Tensor<std::int32_t>& ids, const Tensor<std::int32_t>& targets,
                      const LossOptions& loss = {}, plan::ProfileOptions options = {}) const {
    check_loss_inputs(ids, targets, loss);
    if (loss.plan)
      throw ArgumentError(
          "GPT::profile: the loss options carry a plan; profile() measures the "
          "blocks without one (leave LossOptions::plan null)");
    Tensor<T> embedded;
    {
      NoGradGuard no_grad;
      embedded = embed(ids).value();
    }
    plan::Chain c = plan::profile(
        block_layers(), embedded,
        [&](const Var<T>& out) { return head_loss(ln_f(out), targets, loss); }, options);
    c.input_made_in_step = true;
    c.output_held = false;  // loss() keeps no Var of the blocks' output (ln_f saves it)
    return c;
  }

  /// The blocks as a sequence of layers, for checkpoint_sequential() and plan::profile().
  std::vector<Layer> block_layers() const {
    std::vector<Layer> out;
    for (const TransformerBlock<T>& block : blocks)
      out.push_back([&block](const Var<T>& x) { return block(x); });
    return out;
  }

  /// The head's weight (V, C): the token embedding's when tied.
  Parameter<T> head_weight() const { return head ? head->weight : wte.weight; }

  GPT(const GPT&) = delete;  // block_layers() hands out references to the blocks
  GPT& operator=(const GPT&) = delete;
  GPT(GPT&&) noexcept = default;
  GPT& operator=(GPT&&) noexcept = default;

  Embedding<T> wte, wpe;
  Dropout<T> drop;
  std::vector<TransformerBlock<T>> blocks;
  LayerNorm<T> ln_f;
  std::optional<Linear<T>> head;

 private:
  static constexpr double kInitStd = 0.02;  // GPT-2

  /// Targets shaped as the ids, and no packed rows (GPT's attention has no starts).
  static void check_loss_inputs(const Tensor<std::int32_t>& ids,
                                const Tensor<std::int32_t>& targets, const LossOptions& o) {
    if (!(targets.shape() == ids.shape())) {
      throw ShapeError(detail::cat("GPT::loss: targets ", targets.shape(),
                                   " must have the shape of the ids ", ids.shape()));
    }
    if (o.starts.defined()) {
      throw ArgumentError(detail::cat("GPT::loss: starts ", o.starts.shape(),
                                      " given, but GPT does not pack rows (Llama does)"));
    }
  }

  /// The mean cross-entropy of the head on final hidden states h (B, T, C).
  Var<T> head_loss(const Var<T>& h, const Tensor<std::int32_t>& targets,
                   const LossOptions& o) const {
    return detail::lm_head_loss(reshape(h, {-1, config_.width}), head_weight(),
                                targets.reshape(Shape{targets.numel()}), o, "GPT");
  }

  GPT(const GPTConfig& c, Rng rng)
      : config_((c.validate(), c)),
        wte(c.vocab, c.width, rng, kInitStd),
        wpe(c.context, c.width, rng, kInitStd),
        drop(c.dropout),
        ln_f(c.width) {
    this->add_module("wte", wte);
    this->add_module("wpe", wpe);
    this->add_module("drop", drop);
    // GPT-2 scales the residual projections by 1/sqrt(2 layers): each block adds two of them.
    const double out_std = kInitStd / std::sqrt(2.0 * double(c.layers));
    blocks.reserve(static_cast<std::size_t>(c.layers));
    for (std::int64_t i = 0; i < c.layers; ++i) {
      blocks.emplace_back(c.width, c.heads, c.dropout, rng, kInitStd, out_std, c.attention);
      this->add_module(detail::cat("blocks.", i), blocks.back());
    }
    this->add_module("ln_f", ln_f);
    if (!c.tied) {
      head.emplace(c.width, c.vocab, rng, false, kInitStd);
      head->weight_read_directly_by("GPT's loss and logits (head)");
      this->add_module("head", *head);
    }
  }

  /// Token plus position embeddings, dropped out: the blocks' input (B, T, C).
  Var<T> embed(const Tensor<std::int32_t>& ids) const {
    check_ids(ids);
    const std::int64_t time = ids.dim(1);
    Tensor<std::int32_t> positions(Shape{time});
    for (std::int64_t t = 0; t < time && positions.has_data(); ++t)  // none shape-only
      positions[t] = static_cast<std::int32_t>(t);
    return drop(wte(ids) + wpe(positions));
  }

  void check_ids(const Tensor<std::int32_t>& ids) const {
    if (!ids.defined() || ids.rank() != 2 || ids.dim(1) < 1 || ids.dim(1) > config_.context) {
      throw ShapeError(
          detail::cat("GPT: token ids must be (B, T) with 1 <= T <= context = ", config_.context,
                      ", got shape ", ids.defined() ? ids.shape() : Shape{}));
    }
  }
};

}  // namespace remat::nn
