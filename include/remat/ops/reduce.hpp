#pragma once
/// @file
/// sum and mean, of all elements or along one axis. Sums are taken in a fixed order (blocks of
/// fixed size, added in sequence), so a result does not depend on the thread count.

#include <vector>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

/// Sum of n values in blocks of kBlock, the block sums added in order.
template <class T>
T ordered_sum(const T* p, std::int64_t n) {
  constexpr std::int64_t kBlock = 8192;
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<T> partial(static_cast<std::size_t>(blocks));
  parallel_for(blocks, 4, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      partial[b] = ConstArrayView<T>(p + b * kBlock, std::min(kBlock, n - b * kBlock)).sum();
    }
  });
  T total = T(0);
  for (T v : partial) total += v;
  return total;
}

template <class T>
class SumAllNode final : public Node<T> {
 public:
  SumAllNode(const OpType& type, Shape in, T scale) : type_(type), in_(in), scale_(scale) {}
  const OpType& op_type() const noexcept override { return type_; }
  bool runs_shape_only() const noexcept override { return true; }
  // shape-only run: the same tensors as in a real one, no values read
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    if (shape_only()) return Tensor<T>(Shape{});
    return Tensor<T>::scalar(ordered_sum(in[0].data(), in[0].numel()) * scale_);
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    grads.add(0, shape_only() ? Tensor<T>(in_) : Tensor<T>::full(in_, gy[0] * scale_));
  }

 private:
  const OpType& type_;
  Shape in_;
  T scale_;
};

/// Sum over the middle axis of x viewed as (outer, len, inner), times scale.
template <class T>
class SumAxisNode final : public Node<T> {
 public:
  SumAxisNode(const OpType& type, Shape in, Shape out, std::int64_t outer, std::int64_t len,
              std::int64_t inner, T scale)
      : type_(type), in_(in), out_(out), outer_(outer), len_(len), inner_(inner), scale_(scale) {}
  const OpType& op_type() const noexcept override { return type_; }
  bool runs_shape_only() const noexcept override { return true; }

  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(out_);
    const T* x = in[0].data();
    for_rows(outer_, len_ * inner_, [&](std::int64_t o0, std::int64_t o1) {
      for (std::int64_t o = o0; o < o1; ++o) {
        const T* block = x + o * len_ * inner_;
        if (inner_ == 1) {
          out[o] = ConstArrayView<T>(block, len_).sum() * scale_;
          continue;
        }
        ArrayView<T> acc(out.data() + o * inner_, inner_);
        acc.setZero();
        for (std::int64_t l = 0; l < len_; ++l)
          acc += ConstArrayView<T>(block + l * inner_, inner_);
        acc *= scale_;
      }
    });
    return out;
  }

  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    Tensor<T> gx(in_);
    for_rows(outer_, len_ * inner_, [&](std::int64_t o0, std::int64_t o1) {
      for (std::int64_t o = o0; o < o1; ++o) {
        for (std::int64_t l = 0; l < len_; ++l) {
          ArrayView<T>(gx.data() + (o * len_ + l) * inner_, inner_) =
              ConstArrayView<T>(gy.data() + o * inner_, inner_) * scale_;
        }
      }
    });
    grads.add(0, std::move(gx));
  }

 private:
  const OpType& type_;
  Shape in_, out_;
  std::int64_t outer_, len_, inner_;
  T scale_;
};

template <class T>
Var<T> reduce_axis(const OpType& type, const Var<T>& x, int axis, bool keepdim, bool mean) {
  const Shape& s = x.shape();
  const int a = s.normalize_axis(axis);
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < a; ++i) outer *= s[i];
  for (int i = a + 1; i < s.rank(); ++i) inner *= s[i];
  const std::int64_t len = s[a];
  std::vector<std::int64_t> dims;
  for (int i = 0; i < s.rank(); ++i) {
    if (i != a)
      dims.push_back(s[i]);
    else if (keepdim)
      dims.push_back(1);
  }
  const T scale = mean ? (len == 0 ? T(0) : T(1) / T(len)) : T(1);
  return record_op<SumAxisNode<T>>({&x}, type, s, Shape(std::span<const std::int64_t>(dims)), outer,
                                   len, inner, scale);
}

}  // namespace detail

/// Sum of all elements, as a rank-0 Var.
template <class T>
Var<T> sum(const Var<T>& x) {
  return detail::record_op<detail::SumAllNode<T>>({&x}, op::sum, x.shape(), T(1));
}

/// Mean of all elements, as a rank-0 Var.
template <class T>
Var<T> mean(const Var<T>& x) {
  if (x.numel() == 0)
    throw ShapeError(detail::cat("mean: the input of shape ", x.shape(), " has no elements"));
  return detail::record_op<detail::SumAllNode<T>>({&x}, op::mean, x.shape(), T(1) / T(x.numel()));
}

/// Sum along one axis (negative counts from the end); keepdim keeps it with extent 1.
template <class T>
Var<T> sum(const Var<T>& x, int axis, bool keepdim = false) {
  return detail::reduce_axis(op::sum, x, axis, keepdim, false);
}

/// Mean along one axis (negative counts from the end); keepdim keeps it with extent 1.
template <class T>
Var<T> mean(const Var<T>& x, int axis, bool keepdim = false) {
  return detail::reduce_axis(op::mean, x, axis, keepdim, true);
}

}  // namespace remat
