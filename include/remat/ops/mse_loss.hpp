#pragma once
/// @file
/// mse_loss(input, target): squared differences reduced like PyTorch's F.mse_loss (mean, sum,
/// or none). Both sides get gradients, so a target computed by the model is differentiable too.

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {

/// How a loss reduces its per-element values (PyTorch's reduction=).
enum class Reduction { mean, sum, none };

namespace detail {

template <class T>
class MseLossNode final : public Node<T> {
 public:
  explicit MseLossNode(Reduction reduction) : reduction_(reduction) {}
  const OpType& op_type() const noexcept override { return op::mse_loss; }
  bool runs_shape_only() const noexcept override { return true; }

  // d = input - target; none: d^2; sum: sum d^2; mean: sum d^2 / n. Saves d.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> d(in[0].shape());
    for_chunks(d.numel(), [&](std::int64_t s, std::int64_t e) {
      view(d, s, e) = view(in[0], s, e) - view(in[1], s, e);
    });
    this->save_exact(0, d);
    if (reduction_ == Reduction::none) {
      Tensor<T> out(d.shape());
      for_chunks(d.numel(),
                 [&](std::int64_t s, std::int64_t e) { view(out, s, e) = view(d, s, e).square(); });
      return out;
    }
    if (shape_only()) return Tensor<T>(Shape{});  // allocated as in a real run, no values read
    // One sequential sum: the same bits for any thread count.
    const T total = d.array().square().sum();
    return Tensor<T>::scalar(reduction_ == Reduction::mean ? total / T(d.numel()) : total);
  }

  // d input = 2 d dy (dy broadcast for sum, dy / n for mean); d target = -d input
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& d = this->saved(0);
    Tensor<T> g(d.shape());
    if (reduction_ == Reduction::none) {
      for_chunks(g.numel(), [&](std::int64_t s, std::int64_t e) {
        view(g, s, e) = T(2) * view(d, s, e) * view(gy, s, e);
      });
    } else if (!shape_only()) {
      const T k = T(2) * gy[0] / (reduction_ == Reduction::mean ? T(d.numel()) : T(1));
      for_chunks(g.numel(),
                 [&](std::int64_t s, std::int64_t e) { view(g, s, e) = k * view(d, s, e); });
    }
    if (grads.needs(1)) {
      Tensor<T> neg(g.shape());
      for_chunks(g.numel(),
                 [&](std::int64_t s, std::int64_t e) { view(neg, s, e) = -view(g, s, e); });
      grads.add(1, std::move(neg));
    }
    grads.add(0, std::move(g));
  }

 private:
  Reduction reduction_;
};

}  // namespace detail

/// Mean (or summed, or per-element) squared error between two Vars of one shape. The mean of an
/// empty input is NaN, as in PyTorch.
template <class T>
Var<T> mse_loss(const Var<T>& input, const std::type_identity_t<Var<T>>& target,
                Reduction reduction = Reduction::mean) {
  if (!(input.shape() == target.shape())) {
    throw ShapeError(detail::cat("mse_loss: input ", input.shape(), " and target ", target.shape(),
                                 " must have the same shape"));
  }
  if (reduction != Reduction::mean && reduction != Reduction::sum && reduction != Reduction::none) {
    throw ArgumentError(detail::cat("mse_loss: unknown reduction ", static_cast<int>(reduction)));
  }
  return detail::record_op<detail::MseLossNode<T>>({&input, &target}, reduction);
}

}  // namespace remat
