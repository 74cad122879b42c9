#pragma once
/// @file
/// where(cond, a, b) and masked_fill(x, mask, value): pick element-wise by a boolean mask. The
/// mask's shape is the Vars' shape or a trailing part of it (a (T, T) mask over (B, H, T, T)
/// scores), repeated over the leading axes. Gradients flow to the picked side only.

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

/// Runs fn(i, m) for every element i of a tensor of n elements and its mask element m.
template <class Fn>
void for_masked(std::int64_t n, const Tensor<bool>& mask, Fn&& fn) {
  const std::int64_t period = mask.numel();
  for_chunks(n, [&](std::int64_t s, std::int64_t e) {
    for (std::int64_t i = s; i < e; ++i) fn(i, mask[i % period]);
  });
}

template <class T>
class WhereNode final : public Node<T> {
 public:
  explicit WhereNode(Tensor<bool> cond) : cond_(std::move(cond)) {}
  const OpType& op_type() const noexcept override { return op::where; }
  bool runs_shape_only() const noexcept override { return true; }

  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(in[0].shape());
    const T* a = in[0].data();
    const T* b = in[1].data();
    T* y = out.data();
    for_masked(out.numel(), cond_, [&](std::int64_t i, bool m) { y[i] = m ? a[i] : b[i]; });
    return out;
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    for (int k = 0; k < 2; ++k) {
      if (!grads.needs(k)) continue;
      Tensor<T> g(gy.shape());
      const bool pick = k == 0;
      for_masked(g.numel(), cond_,
                 [&](std::int64_t i, bool m) { g[i] = m == pick ? gy[i] : T(0); });
      grads.add(k, std::move(g));
    }
  }

 private:
  Tensor<bool> cond_;  // a mask is an argument, like an embedding's ids: kept by the recipe
};

template <class T>
class MaskedFillNode final : public Node<T> {
 public:
  MaskedFillNode(Tensor<bool> mask, T value) : mask_(std::move(mask)), value_(value) {}
  const OpType& op_type() const noexcept override { return op::masked_fill; }
  bool runs_shape_only() const noexcept override { return true; }

  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(in[0].shape());
    const T* x = in[0].data();
    T* y = out.data();
    for_masked(out.numel(), mask_, [&](std::int64_t i, bool m) { y[i] = m ? value_ : x[i]; });
    return out;
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    Tensor<T> g(gy.shape());
    for_masked(g.numel(), mask_, [&](std::int64_t i, bool m) { g[i] = m ? T(0) : gy[i]; });
    grads.add(0, std::move(g));
  }

 private:
  Tensor<bool> mask_;
  T value_;
};

/// Whether `mask` is x's shape or a trailing part of it.
inline bool mask_fits(const Shape& mask, const Shape& x) {
  if (mask.rank() > x.rank()) return false;
  for (int i = 1; i <= mask.rank(); ++i) {
    if (mask[-i] != x[-i]) return false;
  }
  return true;
}

}  // namespace detail

/// a where cond is true, b elsewhere. a and b have one shape; cond that shape or a trailing
/// part of it.
template <class T>
Var<T> where(const Tensor<bool>& cond, const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  if (!cond.defined() || !(a.shape() == b.shape()) || !detail::mask_fits(cond.shape(), a.shape())) {
    throw ShapeError(detail::cat(
        "where: cond ", cond.defined() ? cond.shape() : Shape{}, ", a ", a.shape(), " and b ",
        b.shape(),
        " do not fit; a and b need one shape, cond that shape or a trailing part of it"));
  }
  return detail::record_op<detail::WhereNode<T>>({&a, &b}, cond.clone());
}

/// x with `value` wherever mask is true (PyTorch's masked_fill). mask: x's shape or a trailing
/// part of it. The gradient is zero where the value was written.
template <class T>
Var<T> masked_fill(const Var<T>& x, const Tensor<bool>& mask, std::type_identity_t<T> value) {
  if (!mask.defined() || !detail::mask_fits(mask.shape(), x.shape())) {
    throw ShapeError(detail::cat("masked_fill: mask ", mask.defined() ? mask.shape() : Shape{},
                                 " does not fit x ", x.shape(),
                                 "; it must be x's shape or a trailing part of it"));
  }
  return detail::record_op<detail::MaskedFillNode<T>>({&x}, mask.clone(), T(value));
}

}  // namespace remat
