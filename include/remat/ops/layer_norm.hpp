#pragma once
/// @file
/// layer_norm over the last axis with a learned scale (gamma) and shift (beta).

#include <cmath>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class LayerNormNode final : public Node<T> {
 public:
  explicit LayerNormNode(T eps) : eps_(eps) {}
  const OpType& op_type() const noexcept override { return op::layer_norm; }
  bool runs_shape_only() const noexcept override { return true; }

  // x: (rows, c); saves x, gamma, and each row's mean and 1/std (2 numbers a row).
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& x = in[0];
    const auto gamma = view(in[1], 0, in[1].numel());
    const auto beta = view(in[2], 0, in[2].numel());
    const std::int64_t c = x.shape().last(), rows = x.shape().rows();
    Tensor<T> y(x.shape()), mean(Shape{rows}), rstd(Shape{rows});
    for_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto xr = view(x, r * c, (r + 1) * c);
        const T mu = xr.sum() / T(c);
        const T var = (xr - mu).square().sum() / T(c);
        const T rs = T(1) / std::sqrt(var + eps_);
        view(y, r * c, (r + 1) * c) = (xr - mu) * rs * gamma + beta;
        mean[r] = mu;
        rstd[r] = rs;
      }
    });
    this->save(0, x);
    this->save(1, in[1]);
    this->save_exact(2, mean);
    this->save_exact(3, rstd);
    return y;
  }

  // xhat = (x - mean) rstd; dxhat = dy gamma;
  // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)); dgamma = sum dy xhat; dbeta = sum dy
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& x = this->saved(0);
    const Tensor<T>& mean = this->saved(2);
    const Tensor<T>& rstd = this->saved(3);
    const auto gamma = view(this->saved(1), 0, this->saved(1).numel());
    const std::int64_t c = x.shape().last(), rows = x.shape().rows();
    const auto xhat = [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
      return (view(x, r * c + c0, r * c + c1) - mean[r]) * rstd[r];
    };
    if (grads.needs(0)) {
      Tensor<T> gx(x.shape());
      for_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
          auto gr = view(gx, r * c, (r + 1) * c);
          gr = view(gy, r * c, (r + 1) * c) * gamma;  // dxhat, in place
          const T mean_d = gr.sum() / T(c);
          const T mean_dx = (gr * xhat(r, 0, c)).sum() / T(c);
          gr = rstd[r] * (gr - mean_d - xhat(r, 0, c) * mean_dx);
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
    grads.add_with(2, this->saved(1).shape(), [&](Tensor<T>& g, bool overwrite) {
      sum_rows_into(g.data(), rows, c, overwrite,
                    [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
                      return view(gy, r * c + c0, r * c + c1);
                    });
    });
  }

 private:
  T eps_;
};

}  // namespace detail

/// Normalizes each row over the last axis to zero mean and unit variance, then scales by gamma
/// and shifts by beta (both of shape (C), the last axis).
template <class T>
Var<T> layer_norm(const Var<T>& x, const std::type_identity_t<Var<T>>& gamma,
                  const std::type_identity_t<Var<T>>& beta, std::type_identity_t<T> eps = T(1e-5)) {
  const Shape c{x.rank() ? x.dim(-1) : 0};
  if (x.rank() < 1 || x.dim(-1) < 1 || !(gamma.shape() == c) || !(beta.shape() == c)) {
    throw ShapeError(detail::cat(
        "layer_norm: input ", x.shape(), ", gamma ", gamma.shape(), " and beta ", beta.shape(),
        " do not fit; gamma and beta must be (C,) for an input (..., C), C > 0"));
  }
  if (!(eps > T(0)))
    throw ArgumentError(detail::cat("layer_norm: eps must be positive, got ", eps));
  return detail::record_op<detail::LayerNormNode<T>>({&x, &gamma, &beta}, T(eps));
}

}  // namespace remat
