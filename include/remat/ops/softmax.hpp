#pragma once
/// @file
/// softmax and log_softmax over the last axis, stabilized by the row maximum.

#include <cmath>
#include <limits>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T, bool Log>
class SoftmaxNode final : public Node<T> {
  // log of the smallest normal T: exp of anything below is denormal or 0
  static inline const T kLogMinNormal = std::log(std::numeric_limits<T>::min());

 public:
  const OpType& op_type() const noexcept override { return Log ? op::log_softmax : op::softmax; }
  bool runs_shape_only() const noexcept override { return true; }

  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& x = in[0];
    Tensor<T> y(x.shape());
    const std::int64_t c = x.shape().last();
    for_rows(x.shape().rows(), c, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto xr = view(x, r * c, (r + 1) * c);
        auto yr = view(y, r * c, (r + 1) * c);
        const T m = xr.maxCoeff();
        // Eigen's vectorized exp (a double row's) clamps its argument from below, so exp(lowest
        // - m) would come out as the smallest value it can reach (about 5e-309) instead of 0, and
        // a float row's kernel gives subnormals down to e^-104: entries whose exact exp is below
        // the normal range are set to 0, which makes masked scores (ops/mask.hpp) weigh exactly
        // nothing and changes no other weight (the row sum is >= 1).
        exp_shifted_row(xr.data(), yr.data(), c, m, T(1));
        yr = (xr - m < kLogMinNormal).select(T(0), yr);
        const T s = yr.sum();
        if constexpr (Log) {
          yr = xr - (m + std::log(s));
        } else {
          yr *= T(1) / s;
        }
      }
    });
    this->save(0, y);
    return y;
  }

  // softmax: dx = y (dy - <dy, y>); log_softmax: dx = dy - exp(y) sum(dy)
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& y = this->saved(0);
    Tensor<T> gx(y.shape());
    const std::int64_t c = y.shape().last();
    for_rows(y.shape().rows(), c, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto yr = view(y, r * c, (r + 1) * c);
        const auto gr = view(gy, r * c, (r + 1) * c);
        if constexpr (Log) {
          view(gx, r * c, (r + 1) * c) = gr - yr.exp() * gr.sum();
        } else {
          view(gx, r * c, (r + 1) * c) = yr * (gr - (gr * yr).sum());
        }
      }
    });
    grads.add(0, std::move(gx));
  }
};

template <class T>
void check_softmax_input(const char* op, const Var<T>& x) {
  if (x.rank() < 1 || x.dim(-1) < 1) {
    throw ShapeError(cat(op, ": needs a non-empty last axis, got shape ", x.shape()));
  }
}

}  // namespace detail

/// Softmax over the last axis.
template <class T>
Var<T> softmax(const Var<T>& x) {
  detail::check_softmax_input("softmax", x);
  return detail::record_op<detail::SoftmaxNode<T, false>>({&x});
}

/// Log of the softmax over the last axis, computed without forming the softmax.
template <class T>
Var<T> log_softmax(const Var<T>& x) {
  detail::check_softmax_input("log_softmax", x);
  return detail::record_op<detail::SoftmaxNode<T, true>>({&x});
}

}  // namespace remat
