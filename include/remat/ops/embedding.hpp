#pragma once
/// @file
/// embedding: rows of a table picked by integer ids.

#include <cstring>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class EmbeddingNode final : public Node<T> {
 public:
  EmbeddingNode(Tensor<std::int32_t> ids, std::int64_t padding_idx)
      : ids_(std::move(ids)), padding_idx_(padding_idx) {}
  const OpType& op_type() const noexcept override { return op::embedding; }
  bool runs_shape_only() const noexcept override { return true; }

  // table: (V, C), ids: (...) -> (..., C)
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& table = in[0];
    const std::int64_t c = table.dim(1), n = ids_.numel();
    Tensor<T> out(ids_.shape().appended(c));
    for_rows(n, c, [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p)
        std::memcpy(out.data() + p * c, table.data() + ids_[p] * c, c * sizeof(T));
    });
    this->save(0, table);  // only its shape is needed; sharing the buffer costs nothing
    return out;
  }

  // Scatter-add in position order: rows picked several times add up deterministically. The
  // padding row gets nothing (torch.nn.Embedding's padding_idx).
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& table = this->saved(0);
    const std::int64_t c = table.dim(1);
    grads.add_with(0, table.shape(), [&](Tensor<T>& g, bool overwrite) {
      if (overwrite) g.fill(T(0));
      for (std::int64_t p = 0; p < ids_.numel(); ++p) {
        if (ids_[p] == padding_idx_) continue;
        view(g, ids_[p] * c, (ids_[p] + 1) * c) += view(gy, p * c, (p + 1) * c);
      }
    });
  }

 private:
  Tensor<std::int32_t> ids_;
  std::int64_t padding_idx_;  // -1: none
};

/// Throws an IndexError naming the first id outside [0, n).
inline void check_ids(const char* op, const Tensor<std::int32_t>& ids, std::int64_t n,
                      const char* what) {
  for (std::int64_t p = 0; p < ids.numel(); ++p) {
    if (ids[p] < 0 || ids[p] >= n) {
      throw IndexError(
          cat(op, ": ", what, " ", ids[p], " at position ", p, " is out of range [0, ", n, ")"));
    }
  }
}

}  // namespace detail

/// Rows of `table` (V, C) picked by `ids` (any shape, values in [0, V)): the result is (..., C).
/// The row `padding_idx` (in [0, V), or -1 for none) gets no gradient from the lookup, as with
/// torch.nn.Embedding's padding_idx (Hugging Face's models pass their pad_token_id).
template <class T>
Var<T> embedding(const Var<T>& table, const Tensor<std::int32_t>& ids,
                 std::int64_t padding_idx = -1) {
  if (table.rank() != 2)
    throw ShapeError(detail::cat("embedding: the table must be (V, C), got shape ", table.shape()));
  if (!ids.defined()) throw ArgumentError("embedding: the ids tensor is undefined");
  if (padding_idx < -1 || padding_idx >= table.dim(0)) {
    throw ArgumentError(detail::cat("embedding: padding_idx must be in [0, ", table.dim(0),
                                    ") or -1 (none), got ", padding_idx));
  }
  // a shape-only run (core/shape_only.hpp) has no id values to check
  if (!is_shape_only()) detail::check_ids("embedding", ids, table.dim(0), "id");
  return detail::record_op<detail::EmbeddingNode<T>>({&table}, ids, padding_idx);
}

}  // namespace remat
