#pragma once
/// @file
/// The batch layout of tokenized examples: padded (one example per row) or packed (several
/// examples per row, in order). Each example of n tokens gives n - 1 positions: input ids[t],
/// target ids[t + 1], counted in the loss when loss[t + 1] (the mask is on targets). Positions
/// restart at 0 for every example, and `segment` numbers the examples of a row (0, 1, ...;
/// -1 on padding) so that an attention can refuse every pair of positions in different
/// segments.
///
/// batch_inputs() turns any batch, padded or packed, into a model's ids, loss targets and
/// `starts` (each position's example's first column); model_inputs() gives the ids and targets of
/// a padded batch alone.
///
/// What the model side needs for a packed batch to equal the examples run one by one: rotary
/// position embeddings counted from each example's start instead of the column index; causal
/// attention masked to the example (a block-diagonal causal mask); the loss summed over `loss`
/// positions and divided by their count (not by rows × columns). nn::Llama takes the starts for
/// the first two (its loss(), logits(), hidden() and profile(); ops/attention.hpp), and its
/// loss is that mean. GPT's learned positions and attention take no starts: train it padded.

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

/// Rows of `columns` positions filled in order, as packing fills them: n positions go on the last
/// row if they fit, else they begin a new one. lay_out(), a packed batch drawn from many examples
/// and the count of rows a set of examples fills all place by this one rule.
struct RowFill {
  explicit RowFill(std::size_t columns_) : columns(columns_), used(columns_) {}
  /// Whether n positions would begin a new row.
  bool begins_row(std::size_t n) const { return used + n > columns; }
  /// Places n positions; true when they began a new row.
  bool place(std::size_t n) {
    const bool fresh = begins_row(n);
    if (fresh) {
      ++rows;
      used = 0;
    }
    used += n;
    return fresh;
  }
  std::size_t columns;
  std::size_t rows = 0;  ///< rows begun
  std::size_t used;      ///< positions taken on the last row (columns before any: none fits)
};

/// The rows `examples` fill packed in order into rows of `columns` positions: lay_out's count for
/// Layout::pack, without laying them out.
inline std::size_t packed_rows(const std::vector<TokenizedExample>& examples, std::size_t columns) {
  RowFill fill(columns);
  for (const TokenizedExample& e : examples) fill.place(e.ids.size() - 1);
  return fill.rows;
}

/// Lays `examples` out in rows of `columns` positions (`pad_id` fills the rest). An example
/// with more than columns + 1 tokens, or fewer than 2, is an ArgumentError naming it.
inline TokenBatch lay_out(const std::vector<TokenizedExample>& examples, std::size_t columns,
                          Layout layout, std::int32_t pad_id) {
  if (columns == 0) throw ArgumentError("hub::lay_out: 0 columns");
  std::vector<std::vector<std::size_t>> rows;  // the examples of each row
  RowFill fill(columns);
  for (std::size_t e = 0; e < examples.size(); ++e) {
    const std::size_t n = examples[e].ids.size();
    if (n < 2 || n - 1 > columns)
      throw ArgumentError(remat::detail::cat("hub::lay_out: example ", e, " has ", n,
                                             " tokens; a row of ", columns, " columns takes 2 to ",
                                             columns + 1));
    if (layout == Layout::pad || fill.place(n - 1)) rows.emplace_back();
    rows.back().push_back(e);
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
/// packed row (two examples or more) is an ArgumentError: its attention must not cross examples and
/// its positions restart, which only the starts of batch_inputs() tell a model.
inline std::pair<Tensor<std::int32_t>, Tensor<std::int32_t>> model_inputs(const TokenBatch& b) {
  const Shape shape{static_cast<std::int64_t>(b.rows), static_cast<std::int64_t>(b.columns)};
  Tensor<std::int32_t> ids(shape), targets(shape);
  for (std::size_t at = 0; at < b.ids.size(); ++at) {
    if (b.segment[at] > 0) {
      throw ArgumentError(remat::detail::cat(
          "hub::model_inputs: row ", at / b.columns, " packs several examples; packed rows need ",
          "per-example positions and attention: use hub::batch_inputs and pass its starts to ",
          "nn::Llama (or lay the batch out with Layout::pad)"));
    }
    ids[static_cast<std::int64_t>(at)] = b.ids[at];
    targets[static_cast<std::int64_t>(at)] = b.loss[at] ? b.targets[at] : kIgnoreTarget;
  }
  return {std::move(ids), std::move(targets)};
}

/// A model's inputs for a batch: token ids and loss targets as model_inputs() gives them, and
/// `starts`, for each position the column its example starts at (what nn::Llama's loss() and
/// logits() take for packed rows).
struct BatchInputs {
  Tensor<std::int32_t> ids, targets, starts;
};

namespace detail {

/// A TokenBatch's vectors must all hold rows × columns entries (lay_out's do).
inline void check_batch_sizes(const TokenBatch& b) {
  const std::size_t n = b.rows * b.columns;
  for (const std::size_t size :
       {b.ids.size(), b.targets.size(), b.loss.size(), b.positions.size(), b.segment.size()}) {
    if (size != n) {
      throw ArgumentError(remat::detail::cat("hub::batch_inputs: a batch of ", b.rows, " x ",
                                             b.columns, " positions has a vector of ", size,
                                             " entries"));
    }
  }
}

/// Row r's starts: a new example wherever the segment changes, the padding after the last one
/// included (it forms an example of its own, which no counted target reads). Each example's
/// positions must count from its start, as the model's RoPE will.
inline void row_starts(const TokenBatch& b, std::size_t r, std::int32_t* starts) {
  std::int32_t start = 0;
  for (std::size_t c = 0; c < b.columns; ++c) {
    const std::size_t at = r * b.columns + c;
    if (c > 0 && b.segment[at] != b.segment[at - 1]) start = static_cast<std::int32_t>(c);
    starts[c] = start;
    if (b.segment[at] >= 0 && b.positions[at] != static_cast<std::int32_t>(c) - start) {
      throw ArgumentError(remat::detail::cat(
          "hub::batch_inputs: row ", r, " column ", c, " (segment ", b.segment[at],
          ", which starts at column ", start, ") has position ", b.positions[at], ", not ",
          static_cast<std::int32_t>(c) - start, ": positions must restart at 0 per example"));
    }
  }
}

}  // namespace detail

/// The ids, targets and starts of `b`, padded or packed: ids and targets as model_inputs()'s
/// (kIgnoreTarget where the loss is not on a target), starts as detail::row_starts() finds them.
/// nn::Llama::loss(ids, targets, {.starts = starts}) then gives the mean loss over the batch's
/// counted targets, and its gradients, that its examples give one by one (the mean over all of
/// their counted targets); tests/hub/model_inputs_test.cpp checks it in double.
inline BatchInputs batch_inputs(const TokenBatch& b) {
  detail::check_batch_sizes(b);
  const Shape shape{static_cast<std::int64_t>(b.rows), static_cast<std::int64_t>(b.columns)};
  BatchInputs in{Tensor<std::int32_t>(shape), Tensor<std::int32_t>(shape),
                 Tensor<std::int32_t>(shape)};
  for (std::size_t at = 0; at < b.ids.size(); ++at) {
    in.ids[static_cast<std::int64_t>(at)] = b.ids[at];
    in.targets[static_cast<std::int64_t>(at)] = b.loss[at] ? b.targets[at] : kIgnoreTarget;
  }
  for (std::size_t r = 0; r < b.rows; ++r)
    detail::row_starts(b, r, in.starts.data() + static_cast<std::int64_t>(r * b.columns));
  return in;
}

}  // namespace remat::hub
