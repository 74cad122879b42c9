#pragma once
/// @file
/// broadcast_to(x, shape): x repeated to a larger shape by NumPy's rules (axes aligned from the
/// last; an extent of 1, or a missing leading axis, repeats). Its gradient sums over the repeated
/// axes, in a fixed order. add/sub/mul/div use it for operands whose shapes broadcast by NumPy's
/// rules but not bias-style (ops/broadcast.hpp), such as (B, 1, C) against (B, T, 1).

#include <array>

#include "remat/core/record.hpp"
#include "remat/ops/broadcast.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

/// The shape a and b broadcast to by NumPy's rules, or a ShapeError naming `op`.
inline Shape numpy_broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  std::array<std::int64_t, Shape::kMaxRank> dims{};
  for (int i = 1; i <= rank; ++i) {
    const std::int64_t da = i <= a.rank() ? a[-i] : 1, db = i <= b.rank() ? b[-i] : 1;
    if (da != db && da != 1 && db != 1) {
      throw ShapeError(cat(op, ": shapes ", a, " and ", b, " do not broadcast: axis ", -i,
                           " has extents ", da, " and ", db,
                           " (NumPy's rules: aligned from the last axis, each pair of extents "
                           "equal or one of them 1)"));
    }
    dims[rank - i] = da == 1 ? db : da;
  }
  return Shape(std::span<const std::int64_t>(dims.data(), rank));
}

/// Whether a and b combine bias-style (ops/broadcast.hpp), which needs no copies.
inline bool bias_style(const Shape& a, const Shape& b) noexcept {
  return a == b || (b.numel() <= a.numel() && is_suffix(b, a)) || is_suffix(a, b);
}

template <class T>
class BroadcastToNode final : public Node<T> {
 public:
  BroadcastToNode(Shape in, Shape out) : in_(in), out_(out) {
    // the input's strides seen from the output's axes: 0 on repeated axes
    std::int64_t stride = 1;
    for (int i = 1; i <= out_.rank(); ++i) {
      const bool present = i <= in_.rank();
      strides_[out_.rank() - i] = present && in_[-i] != 1 ? stride : 0;
      if (present) stride *= in_[-i];
    }
  }
  const OpType& op_type() const noexcept override { return op::broadcast_to; }
  bool runs_shape_only() const noexcept override { return true; }

  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(out_);
    if (shape_only()) return out;  // allocated as in a real run, nothing to copy
    const T* x = in[0].data();
    T* y = out.data();
    for_each_index([&](std::int64_t o, std::int64_t i) { y[o] = x[i]; });
    return out;
  }
  // the gradient of each input element sums the output gradients it was copied to, in the
  // output's order (the same bits for any thread count)
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    Tensor<T> gx = Tensor<T>::zeros(in_);
    if (!shape_only()) {
      T* g = gx.data();
      const T* dy = gy.data();
      for_each_index([&](std::int64_t o, std::int64_t i) { g[i] += dy[o]; });
    }
    grads.add(0, std::move(gx));
  }

 private:
  /// Calls fn(output offset, input offset) for every output element in order.
  template <class Fn>
  void for_each_index(Fn&& fn) const {
    const std::int64_t n = out_.numel();
    if (n == 0) return;
    std::array<std::int64_t, Shape::kMaxRank> idx{};
    std::int64_t i = 0;
    for (std::int64_t o = 0; o < n; ++o) {
      fn(o, i);
      for (int axis = out_.rank() - 1; axis >= 0; --axis) {  // odometer increment
        i += strides_[axis];
        if (++idx[axis] < out_[axis]) break;
        i -= strides_[axis] * out_[axis];
        idx[axis] = 0;
      }
    }
  }

  Shape in_, out_;
  std::array<std::int64_t, Shape::kMaxRank> strides_{};
};

}  // namespace detail

/// x repeated to `shape` by NumPy's broadcasting rules (PyTorch's broadcast_to / expand, but a
/// copy). The gradient sums over the repeated axes.
template <class T>
Var<T> broadcast_to(const Var<T>& x, const Shape& shape) {
  if (!(detail::numpy_broadcast_shape("broadcast_to", x.shape(), shape) == shape)) {
    throw ShapeError(
        detail::cat("broadcast_to: shape ", x.shape(), " cannot be repeated to ", shape,
                    " (NumPy's rules: aligned from the last axis, each extent equal or 1)"));
  }
  if (x.shape() == shape) return x;
  return detail::record_op<detail::BroadcastToNode<T>>({&x}, x.shape(), shape);
}

}  // namespace remat
