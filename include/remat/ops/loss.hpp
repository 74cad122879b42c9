#pragma once
/// @file
/// cross_entropy: mean negative log-likelihood of integer class targets under softmax(logits).

#include <cmath>
#include <vector>

#include "remat/core/record.hpp"
#include "remat/ops/elementwise.hpp"
#include "remat/ops/embedding.hpp"

namespace remat {
namespace detail {

template <class T>
class CrossEntropyNode final : public Node<T> {
 public:
  explicit CrossEntropyNode(Tensor<std::int32_t> targets) : targets_(std::move(targets)) {}
  const char* op_name() const noexcept override { return "cross_entropy"; }

  // logits: (rows, c) -> scalar; saves the logits and each row's log-sum-exp.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& x = in[0];
    const std::int64_t c = x.shape().last(), rows = x.shape().rows();
    Tensor<T> lse(Shape{rows});
    std::vector<double> losses(static_cast<std::size_t>(rows));
    for_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto xr = view(x, r * c, (r + 1) * c);
        const T m = xr.maxCoeff();
        lse[r] = m + std::log((xr - m).exp().sum());
        losses[r] = static_cast<double>(lse[r]) - static_cast<double>(xr[targets_[r]]);
      }
    });
    double total = 0;
    for (double l : losses) total += l;
    this->save(0, x);
    this->save(1, lse);
    return Tensor<T>::scalar(static_cast<T>(total / static_cast<double>(rows)));
  }

  // dlogits = (softmax(logits) - onehot(target)) * dloss / rows
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& x = this->saved(0);
    const Tensor<T>& lse = this->saved(1);
    const std::int64_t c = x.shape().last(), rows = x.shape().rows();
    const T g = gy[0] / T(rows);
    Tensor<T> gx(x.shape());
    for_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        auto gr = view(gx, r * c, (r + 1) * c);
        gr = (view(x, r * c, (r + 1) * c) - lse[r]).exp() * g;
        gr[targets_[r]] -= g;
      }
    });
    grads.add(0, std::move(gx));
  }

 private:
  Tensor<std::int32_t> targets_;
};

}  // namespace detail

/// Mean cross-entropy of logits (..., C) against integer targets (...) in [0, C).
template <class T>
Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int32_t>& targets) {
  if (!targets.defined()) throw UsageError("cross_entropy: the targets tensor is undefined");
  const bool fits = logits.rank() >= 1 && logits.dim(-1) >= 1 && targets.numel() == logits.shape().rows() &&
                    (targets.shape() == logits.shape().dropped_back() || targets.rank() == 1);
  if (!fits) {
    throw ShapeError(detail::cat("cross_entropy: logits ", logits.shape(), " and targets ", targets.shape(),
                                 " do not fit; targets must have the logits' shape without its last axis"));
  }
  if (logits.shape().rows() == 0) throw ShapeError(detail::cat("cross_entropy: logits ", logits.shape(), " have no rows"));
  detail::check_ids("cross_entropy", targets, logits.dim(-1), "target");
  return detail::record_op<detail::CrossEntropyNode<T>>({&logits}, targets);
}

}  // namespace remat
