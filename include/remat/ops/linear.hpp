#pragma once
/// @file
/// linear: y = x W^T + b, with W stored (out, in) as PyTorch does. One node, one GEMM forward,
/// two GEMMs backward, the bias folded in: the workhorse of every layer.

#include <optional>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/gemm_bf16.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class LinearNode final : public Node<T> {
 public:
  LinearNode(std::int64_t rows, std::int64_t in, std::int64_t out, bool bias, Shape out_shape)
      : rows_(rows), in_(in), out_(out), bias_(bias), out_shape_(out_shape) {}
  const OpType& op_type() const noexcept override { return op::linear; }
  bool runs_shape_only() const noexcept override { return true; }
  bool can_resave() const noexcept override { return true; }
  void resave(typename Node<T>::Inputs in, const Tensor<T>&) override {
    this->save(0, in[0]);
    this->save(1, in[1]);
  }
  double forward_flops(typename Node<T>::Inputs, const Tensor<T>&) const override {
    return 2.0 * static_cast<double>(rows_) * static_cast<double>(in_) * static_cast<double>(out_);
  }
  // x's GEMMs read its bfloat16 copy (Note [BF16 saves])
  bool reads_copy(int slot) const noexcept override { return slot == 0; }

  // x: (rows, in), W: (out, in), b: (out) -> (rows, out)
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    this->save(0, in[0]);
    this->save(1, in[1]);
    Tensor<T> y(out_shape_);
    if (shape_only()) return y;  // allocated as in a real run, nothing to compute
    gemm_in<T>(this->bf16, false, true, rows_, out_, in_, T(1), x_operand(in[0]),
               {in[1].data(), in_}, T(0), y.data(), out_, bias_ ? in[2].data() : nullptr);
    return y;
  }

  // dx = dy W, dW = dy^T x, db = column sums of dy
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& w = this->saved(1);
    grads.add_with(0, this->saved_shape(0), [&](Tensor<T>& gx, bool overwrite) {
      gemm_in<T>(this->bf16, false, false, rows_, in_, out_, T(1), gy.data(), out_, w.data(), in_,
                 overwrite ? T(0) : T(1), gx.data(), in_);
    });
    grads.add_with(1, w.shape(), [&](Tensor<T>& gw, bool overwrite) {
      gemm_in<T>(this->bf16, true, false, out_, in_, rows_, T(1), {gy.data(), out_},
                 x_operand(this->saved(0)), overwrite ? T(0) : T(1), gw.data(), in_);
    });
    if (bias_) {
      grads.add_with(2, Shape{out_}, [&](Tensor<T>& gb, bool overwrite) {
        sum_rows_into(gb.data(), rows_, out_, overwrite,
                      [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
                        return view(gy, r * out_ + c0, r * out_ + c1);
                      });
      });
    }
  }

 private:
  /// x as a GEMM operand: `x`, or the bfloat16 copy saved of it (then `x` may be undefined).
  GemmOperand<T> x_operand(const Tensor<T>& x) const noexcept {
    return {x.data(), in_, this->saved_copy(0).data()};
  }

  std::int64_t rows_, in_, out_;
  bool bias_;
  Shape out_shape_;
};

template <class T>
void check_linear(const Shape& x, const Shape& w, const Shape* b) {
  if (w.rank() != 2 || x.rank() < 1 || x[-1] != w[1]) {
    throw ShapeError(
        cat("linear: input ", x, " and weight ", w,
            " do not fit; the weight must be (out, in) with in equal to the input's last axis"));
  }
  if (b && !(b->rank() == 1 && (*b)[0] == w[0])) {
    throw ShapeError(
        cat("linear: bias ", *b, " does not fit weight ", w, "; it must be (", w[0], ",)"));
  }
}

}  // namespace detail

/// x W^T + b: x is (..., in), weight (out, in), bias (out); the result is (..., out).
template <class T>
Var<T> linear(const Var<T>& x, const std::type_identity_t<Var<T>>& weight,
              const std::type_identity_t<Var<T>>& bias) {
  const Shape sb = bias.shape();
  detail::check_linear<T>(x.shape(), weight.shape(), &sb);
  const std::int64_t out = weight.dim(0);
  return detail::record_op<detail::LinearNode<T>>({&x, &weight, &bias}, x.shape().rows(), x.dim(-1),
                                                  out, true, x.shape().with_last(out));
}

/// x W^T without a bias.
template <class T>
Var<T> linear(const Var<T>& x, const std::type_identity_t<Var<T>>& weight) {
  detail::check_linear<T>(x.shape(), weight.shape(), nullptr);
  const std::int64_t out = weight.dim(0);
  return detail::record_op<detail::LinearNode<T>>({&x, &weight}, x.shape().rows(), x.dim(-1), out,
                                                  false, x.shape().with_last(out));
}

}  // namespace remat
