#pragma once
/// @file
/// causal_mask: hides the future from attention scores.

#include <limits>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class CausalMaskNode final : public Node<T> {
 public:
  const OpType& op_type() const noexcept override { return op::causal_mask; }
  bool runs_shape_only() const noexcept override { return true; }

  // scores: (..., q, k). Query i sees keys j <= i + (k - q): the last query sees every key.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out = in[0].clone();
    apply(out, std::numeric_limits<T>::lowest());
    return out;
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    Tensor<T> gx = gy.clone();
    apply(gx, T(0));
    grads.add(0, std::move(gx));
  }

 private:
  // lowest() rather than -infinity: the anomaly mode does not mistake a mask for an overflow.
  // softmax gives exactly 0 there in float and double because it sets to 0 every weight whose
  // exp falls below the normal range (ops/softmax.hpp); exp itself would not (Eigen clamps it).
  static void apply(Tensor<T>& t, T fill) {
    const std::int64_t q = t.dim(-2), k = t.dim(-1), offset = k - q;
    for_rows(t.shape().rows(), k, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t first_hidden = std::max<std::int64_t>(0, r % q + offset + 1);
        if (first_hidden < k) view(t, r * k + first_hidden, (r + 1) * k).setConstant(fill);
      }
    });
  }
};

}  // namespace detail

/// Sets scores (..., q, k) where a query would see a later key to the lowest finite value, so
/// that a softmax gives them weight 0. Needs k >= q.
template <class T>
Var<T> causal_mask(const Var<T>& scores) {
  if (scores.rank() < 2 || scores.dim(-1) < scores.dim(-2)) {
    throw ShapeError(detail::cat("causal_mask: needs scores (..., q, k) with k >= q, got shape ",
                                 scores.shape()));
  }
  return detail::record_op<detail::CausalMaskNode<T>>({&scores});
}

}  // namespace remat
