#pragma once
/// @file
/// rms_norm over the last axis with a learned scale: y = x / sqrt(mean(x^2) + eps) * weight
/// (Llama's and Qwen2's RMSNorm; no mean is subtracted and there is no shift).

#include <cmath>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class RmsNormNode final : public Node<T> {
 public:
  explicit RmsNormNode(T eps) : eps_(eps) {}
  const OpType& op_type() const noexcept override { return op::rms_norm; }
  bool runs_shape_only() const noexcept override { return true; }

  // x: (rows, c); saves x, weight, and each row's 1/rms (one number a row).
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& x = in[0];
    const auto w = view(in[1], 0, in[1].numel());
    const std::int64_t c = x.shape().last(), rows = x.shape().rows();
    Tensor<T> y(x.shape()), rstd(Shape{rows});
    for_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto xr = view(x, r * c, (r + 1) * c);
        const T rs = T(1) / std::sqrt(xr.square().sum() / T(c) + eps_);
        view(y, r * c, (r + 1) * c) = xr * rs * w;
        rstd[r] = rs;
      }
    });
    this->save(0, x);
    this->save(1, in[1]);
    this->save_exact(2, rstd);
    return y;
  }

  // xhat = x rstd; dxhat = dy w; dx = rstd (dxhat - xhat mean(dxhat xhat)); dw = sum dy xhat
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& x = this->saved(0);
    const Tensor<T>& rstd = this->saved(2);
    const auto w = view(this->saved(1), 0, this->saved(1).numel());
    const std::int64_t c = x.shape().last(), rows = x.shape().rows();
    const auto xhat = [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
      return view(x, r * c + c0, r * c + c1) * rstd[r];
    };
    if (grads.needs(0)) {
      Tensor<T> gx(x.shape());
      for_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
          auto gr = view(gx, r * c, (r + 1) * c);
          gr = view(gy, r * c, (r + 1) * c) * w;  // dxhat, in place
          const T mean_dx = (gr * xhat(r, 0, c)).sum() / T(c);
          gr = rstd[r] * (gr - xhat(r, 0, c) * mean_dx);
        }
      });
      grads.add(0, std::move(gx));
    }
    grads.add_with(1, this->saved(1).shape(), [&](Tensor<T>& g, bool overwrite) {
      sum_rows_into(g.data(), rows, c, overwrite,
                    [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
                      return view(gy, r * c + c0, r * c + c1) * xhat(r, c0, c1);
                    });
    });
  }

 private:
  T eps_;
};

}  // namespace detail

/// Scales each row of x (..., C) to unit root mean square, then by weight (C,).
template <class T>
Var<T> rms_norm(const Var<T>& x, const std::type_identity_t<Var<T>>& weight,
                std::type_identity_t<T> eps = T(1e-6)) {
  if (x.rank() < 1 || x.dim(-1) < 1 || !(weight.shape() == Shape{x.dim(-1)})) {
    throw ShapeError(detail::cat("rms_norm: input ", x.shape(), " and weight ", weight.shape(),
                                 " do not fit; weight must be (C,) for an input (..., C), C > 0"));
  }
  if (!(eps > T(0))) throw ArgumentError(detail::cat("rms_norm: eps must be positive, got ", eps));
  return detail::record_op<detail::RmsNormNode<T>>({&x, &weight}, T(eps));
}

}  // namespace remat
