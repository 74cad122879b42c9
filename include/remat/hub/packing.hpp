#pragma once
/// @file
/// The batch layout of tokenized examples: padded (one example per row) or packed (several
/// examples per row, in order). Each example of n tokens gives n - 1 positions: input ids[t],
/// target ids[t + 1], counted in the loss when loss[t + 1] (the mask is on targets). Positions
/// restart at 0 for every example, and `segment` numbers the examples of a row (0, 1, ...;
/// -1 on padding) so that an attention can refuse every pair of positions in different
/// segments.
///
/// model_inputs() turns a padded batch into a model's ids and loss targets; a packed one is
/// refused there until the attention ops take positions and segments (below).
///
/// What the model side needs for a packed batch to equal the examples run one by one: rotary
/// (or learned) position embeddings read from `positions` instead of the column index; causal
/// attention masked to `segment[i] == segment[j]` (a block-diagonal causal mask), and padded
/// columns masked out; the loss summed over `loss` positions and divided by their count (not by
/// rows × columns). remat's attention ops do not take positions or segments yet: this header is
/// the data side only.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/tensor.hpp"
#include "remat/hub/chat_tokens.hpp"
#include "remat/ops/loss.hpp"

namespace remat::hub {

/// How examples become rows.
enum class Layout {
  pad,  ///< one example per row, the rest padding
  pack  ///< as many whole examples per row as fit, in order
};

/// A batch of `rows` × `columns` positions, row-major.
struct TokenBatch {
  std::size_t rows = 0, columns = 0;
  std::vector<std::int32_t> ids, targets;  ///< targets: -1 where there is none (padding)
  std::vector<std::uint8_t> loss;          ///< 1: the loss is on this target
  std::vector<std::int32_t> positions;     ///< restart at 0 per example
  std::vector<std::int32_t> segment;       ///< example index within the row, -1 on padding
};

/// Lays `examples` out in rows of `columns` positions (`pad_id` fills the rest). An example
/// with more than columns + 1 tokens, or fewer than 2, is a UsageError naming it.
inline TokenBatch lay_out(const std::vector<TokenizedExample>& examples, std::size_t columns,
                          Layout layout, std::int32_t pad_id) {
  if (columns == 0) throw UsageError("hub::lay_out: 0 columns");
  std::vector<std::vector<std::size_t>> rows;  // the examples of each row
  std::size_t used = columns;
  for (std::size_t e = 0; e < examples.size(); ++e) {
    const std::size_t n = examples[e].ids.size();
    if (n < 2 || n - 1 > columns)
      throw UsageError(remat::detail::cat("hub::lay_out: example ", e, " has ", n,
                                          " tokens; a row of ", columns, " columns takes 2 to ",
                                          columns + 1));
    if (layout == Layout::pad || used + (n - 1) > columns) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(e);
    used += n - 1;
  }
  TokenBatch b;
  b.rows = rows.size();
  b.columns = columns;
  const std::size_t total = b.rows * columns;
  b.ids.assign(total, pad_id);
  b.targets.assign(total, -1);
  b.loss.assign(total, 0);
  b.positions.assign(total, 0);
  b.segment.assign(total, -1);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::size_t at = r * columns;
    for (std::size_t s = 0; s < rows[r].size(); ++s) {
      const TokenizedExample& ex = examples[rows[r][s]];
      for (std::size_t t = 0; t + 1 < ex.ids.size(); ++t, ++at) {
        b.ids[at] = ex.ids[t];
        b.targets[at] = ex.ids[t + 1];
        b.loss[at] = ex.loss[t + 1];
        b.positions[at] = static_cast<std::int32_t>(t);
        b.segment[at] = static_cast<std::int32_t>(s);
      }
    }
  }
  return b;
}

/// A model's inputs for `b`: the (rows, columns) ids and loss targets of Llama::loss or
/// GPT::loss, each target kIgnoreTarget (ops/loss.hpp) where the loss is not on it (prompt tokens
/// under TrainOn::assistant, padding). For padded rows this is exact: an example holds its row's
/// first columns, so its positions are the column indices, and causal attention never looks
/// from it at the padding after it; the loss is the mean over the batch's counted targets. A
/// packed row (two examples or more) is a UsageError: its attention must not cross examples and
/// its positions restart, which remat's attention ops do not take yet.
inline std::pair<Tensor<std::int32_t>, Tensor<std::int32_t>> model_inputs(const TokenBatch& b) {
  const Shape shape{static_cast<std::int64_t>(b.rows), static_cast<std::int64_t>(b.columns)};
  Tensor<std::int32_t> ids(shape), targets(shape);
  for (std::size_t at = 0; at < b.ids.size(); ++at) {
    if (b.segment[at] > 0) {
      throw UsageError(remat::detail::cat(
          "hub::model_inputs: row ", at / b.columns, " packs several examples; packed rows need ",
          "per-example positions and attention, which remat's attention does not take yet: lay ",
          "the batch out with Layout::pad"));
    }
    ids[static_cast<std::int64_t>(at)] = b.ids[at];
    targets[static_cast<std::int64_t>(at)] = b.loss[at] ? b.targets[at] : kIgnoreTarget;
  }
  return {std::move(ids), std::move(targets)};
}

}  // namespace remat::hub
