#pragma once
/// @file
/// How a language model's loss() runs (LossOptions), and the head's loss both models share.
///
///     auto loss = model.loss(ids, targets, {.plan = &p, .chunk_rows = 256});

#include <cstdint>

#include "remat/checkpoint/plan.hpp"
#include "remat/core/error.hpp"
#include "remat/core/tensor.hpp"
#include "remat/ops/linear.hpp"
#include "remat/ops/loss.hpp"

namespace remat::nn {

/// The options of GPT::loss() and Llama::loss(); the defaults are a plain step.
struct LossOptions {
  /// The checkpoint plan over the blocks; null: no checkpoint.
  const plan::Plan* plan = nullptr;
  /// The fused, chunked head (linear_cross_entropy): the (rows x vocab) logits and their
  /// gradient are never held whole. False: the logits, then cross_entropy.
  bool chunked = true;
  /// Rows the chunked head computes at a time; 0: default_chunk_rows() (a chunk holds this
  /// many rows x loss_vocab_block() values, Note [online loss head]). Only with `chunked`.
  std::int64_t chunk_rows = 0;
  /// Packed rows: where each token's sequence starts (B, T), as Llama::hidden() takes them.
  /// Empty: one sequence a row. GPT does not pack.
  Tensor<std::int32_t> starts;
};

}  // namespace remat::nn

namespace remat::detail {

/// The mean cross-entropy of the head `weight` on rows of final hidden states (N, C) against
/// `targets` (N), as `o` asks; `model` names the caller in errors.
template <class T>
Var<T> lm_head_loss(const Var<T>& rows, const std::type_identity_t<Var<T>>& weight,
                    const Tensor<std::int32_t>& targets, const nn::LossOptions& o,
                    const char* model) {
  if (o.chunk_rows < 0 || (o.chunk_rows > 0 && !o.chunked)) {
    throw ArgumentError(
        cat(model, "::loss: chunk_rows ", o.chunk_rows,
            o.chunk_rows < 0 ? " is negative" : " is set but the loss is not chunked"));
  }
  return o.chunked ? linear_cross_entropy(rows, weight, targets, o.chunk_rows)
                   : cross_entropy(linear(rows, weight), targets);
}

}  // namespace remat::detail
