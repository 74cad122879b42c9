#pragma once
/// @file
/// Ops that move elements without arithmetic: reshape, transpose (last two axes), slice and
/// split along the last axis, concat along the last axis.

#include <cstring>
#include <span>
#include <vector>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class ReshapeNode final : public Node<T> {
 public:
  ReshapeNode(Shape in, Shape out) : in_(in), out_(out) {}
  const OpType& op_type() const noexcept override { return op::reshape; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override { return in[0].reshape(out_); }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override { grads.add(0, gy.reshape(in_)); }

 private:
  Shape in_, out_;
};

/// Copies the (rows x cols) matrices of `src` transposed into `dst`, for each of `batch`.
template <class T>
void transpose_matrices(const T* src, T* dst, std::int64_t batch, std::int64_t rows,
                        std::int64_t cols) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  parallel_for(
      batch, std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(1, rows * cols)),
      [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b) {
          Eigen::Map<Mat>(dst + b * rows * cols, cols, rows) =
              Eigen::Map<const Mat>(src + b * rows * cols, rows, cols).transpose();
        }
      });
}

template <class T>
class TransposeNode final : public Node<T> {
 public:
  const OpType& op_type() const noexcept override { return op::transpose; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Shape& s = in[0].shape();
    Tensor<T> out(s.with(-2, s[-1]).with(-1, s[-2]));
    transpose_matrices(in[0].data(), out.data(), s.dropped_back(2).numel(), s[-2], s[-1]);
    return out;
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Shape& s = gy.shape();
    Tensor<T> gx(s.with(-2, s[-1]).with(-1, s[-2]));
    transpose_matrices(gy.data(), gx.data(), s.dropped_back(2).numel(), s[-2], s[-1]);
    grads.add(0, std::move(gx));
  }
};

/// Copies columns [c0, c0 + width) of each row of a (rows x cols) buffer into (rows x width).
template <class T>
void copy_columns(const T* src, std::int64_t cols, std::int64_t c0, T* dst, std::int64_t width,
                  std::int64_t rows) {
  for_rows(rows, width, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      std::memcpy(dst + r * width, src + r * cols + c0, width * sizeof(T));
  });
}

template <class T>
class SliceNode final : public Node<T> {
 public:
  SliceNode(Shape in, std::int64_t begin, std::int64_t end) : in_(in), begin_(begin), end_(end) {}
  const OpType& op_type() const noexcept override { return op::slice; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(in_.with_last(end_ - begin_));
    copy_columns(in[0].data(), in_.last(), begin_, out.data(), end_ - begin_, in_.rows());
    return out;
  }
  // The gradient lands in columns [begin, end) of the input's gradient; the slices of a split
  // all add into the same buffer, so a split costs one input-sized gradient, not one per part.
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const std::int64_t width = end_ - begin_, cols = in_.last();
    grads.add_with(0, in_, [&](Tensor<T>& gx, bool overwrite) {
      if (overwrite) gx.fill(T(0));
      for_rows(in_.rows(), width, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r)
          view(gx, r * cols + begin_, r * cols + end_) += view(gy, r * width, (r + 1) * width);
      });
    });
  }

 private:
  Shape in_;
  std::int64_t begin_, end_;
};

template <class T>
class ConcatNode final : public Node<T> {
 public:
  ConcatNode(std::vector<std::int64_t> widths, Shape out) : widths_(std::move(widths)), out_(out) {}
  const OpType& op_type() const noexcept override { return op::concat; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(out_);
    const std::int64_t rows = out_.rows(), cols = out_.last();
    for_rows(rows, cols, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        std::int64_t c = 0;
        for (std::size_t k = 0; k < in.size(); ++k) {
          std::memcpy(out.data() + r * cols + c, in[k].data() + r * widths_[k],
                      widths_[k] * sizeof(T));
          c += widths_[k];
        }
      }
    });
    return out;
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    std::int64_t c = 0;
    for (std::size_t k = 0; k < widths_.size(); ++k) {
      if (grads.needs(static_cast<int>(k))) {
        Tensor<T> gk(out_.with_last(widths_[k]));
        copy_columns(gy.data(), out_.last(), c, gk.data(), widths_[k], out_.rows());
        grads.add(static_cast<int>(k), std::move(gk));
      }
      c += widths_[k];
    }
  }

 private:
  std::vector<std::int64_t> widths_;
  Shape out_;
};

}  // namespace detail

/// The same values seen with another shape of as many elements. One extent may be -1, inferred.
/// The extents may be known only at run time (a std::vector, a span).
template <class T>
Var<T> reshape(const Var<T>& x, std::span<const std::int64_t> extents) {
  std::vector<std::int64_t> dims(extents.begin(), extents.end());
  std::int64_t known = 1;
  int inferred = -1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (dims[i] < 0) {
      throw ShapeError(
          detail::cat("reshape: extent ", dims[i], " is invalid; only one extent may be -1"));
    } else {
      known *= dims[i];
    }
  }
  if (inferred >= 0) {
    if (known == 0 || x.numel() % known != 0) {
      throw ShapeError(detail::cat("reshape: cannot infer the -1 extent to view ", x.shape(),
                                   " with ", x.numel(), " elements"));
    }
    dims[inferred] = x.numel() / known;
  }
  const Shape out{std::span<const std::int64_t>(dims)};
  if (out.numel() != x.numel()) {
    throw ShapeError(detail::cat("reshape: cannot view ", x.shape(), " (", x.numel(),
                                 " elements) as ", out, " (", out.numel(), " elements)"));
  }
  return detail::record_op<detail::ReshapeNode<T>>({&x}, x.shape(), out);
}

template <class T>
Var<T> reshape(const Var<T>& x, std::initializer_list<std::int64_t> extents) {
  return reshape(x, std::span<const std::int64_t>(extents.begin(), extents.size()));
}

/// reshape to a Shape computed at run time (no -1 extents: a Shape holds none).
template <class T>
Var<T> reshape(const Var<T>& x, const Shape& shape) {
  return reshape(x, std::span<const std::int64_t>(shape.begin(), shape.end()));
}

/// Swaps the last two axes (copies).
template <class T>
Var<T> transpose(const Var<T>& x) {
  if (x.rank() < 2)
    throw ShapeError(detail::cat("transpose: needs at least two axes, got shape ", x.shape()));
  return detail::record_op<detail::TransposeNode<T>>({&x});
}

/// Entries [begin, end) of the last axis.
template <class T>
Var<T> slice(const Var<T>& x, std::int64_t begin, std::int64_t end) {
  if (x.rank() < 1 || begin < 0 || end < begin || end > x.dim(-1)) {
    throw IndexError(detail::cat("slice: range [", begin, ", ", end,
                                 ") does not fit the last axis of shape ", x.shape()));
  }
  return detail::record_op<detail::SliceNode<T>>({&x}, x.shape(), begin, end);
}

/// The last axis cut into consecutive parts of the given widths (which must add up to it).
template <class T>
std::vector<Var<T>> split(const Var<T>& x, const std::vector<std::int64_t>& widths) {
  std::int64_t total = 0;
  for (std::int64_t w : widths) {
    if (w < 0) throw ShapeError(detail::cat("split: negative width ", w));
    total += w;
  }
  if (x.rank() < 1 || total != x.dim(-1)) {
    throw ShapeError(detail::cat("split: widths add up to ", total, " but the last axis of shape ",
                                 x.shape(), " is ", x.rank() ? x.dim(-1) : 0));
  }
  std::vector<Var<T>> parts;
  std::int64_t begin = 0;
  for (std::int64_t w : widths) {
    parts.push_back(slice(x, begin, begin + w));
    begin += w;
  }
  return parts;
}

/// The last axis cut into `parts` equal parts.
template <class T>
std::vector<Var<T>> split(const Var<T>& x, int parts) {
  if (parts < 1 || x.rank() < 1 || x.dim(-1) % parts != 0) {
    throw ShapeError(detail::cat("split: cannot cut the last axis of shape ", x.shape(), " into ",
                                 parts, " equal parts"));
  }
  return split(x, std::vector<std::int64_t>(parts, x.dim(-1) / parts));
}

/// Joins Vars along the last axis; all other axes must match.
template <class T>
Var<T> concat(const std::vector<Var<T>>& parts) {
  if (parts.empty()) throw ShapeError("concat: needs at least one input");
  std::vector<std::int64_t> widths;
  std::vector<const Var<T>*> inputs;
  std::int64_t total = 0;
  for (const Var<T>& p : parts) {
    if (p.rank() < 1 || !(p.shape().dropped_back() == parts[0].shape().dropped_back())) {
      throw ShapeError(detail::cat("concat: shape ", p.shape(), " does not match ",
                                   parts[0].shape(), " on the axes before the last"));
    }
    widths.push_back(p.dim(-1));
    inputs.push_back(&p);
    total += p.dim(-1);
  }
  const Shape out = parts[0].shape().with_last(total);
  return detail::record<T>(std::make_unique<detail::ConcatNode<T>>(std::move(widths), out), inputs);
}

}  // namespace remat
