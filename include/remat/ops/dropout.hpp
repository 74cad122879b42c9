#pragma once
/// @file
/// dropout. The mask is never stored: element i of the op at tape position p keeps its value
/// when bits(seed, p, i) clear the threshold, a pure function that the replay and the backward
/// pass evaluate again. Plain and checkpointed runs record the same positions, so they draw the
/// same masks and give bitwise-equal gradients.

#include <cmath>

#include "remat/core/record.hpp"
#include "remat/core/rng.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class DropoutNode final : public Node<T> {
 public:
  DropoutNode(double p, std::uint64_t seed)
      : threshold_(static_cast<std::uint32_t>(std::min(p * 4294967296.0, 4294967295.0))),
        scale_(static_cast<T>(1.0 / (1.0 - p))),
        seed_(seed) {}
  const OpType& op_type() const noexcept override { return op::dropout; }
  bool runs_shape_only() const noexcept override { return true; }

  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(in[0].shape());
    apply(in[0], out);
    return out;
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    Tensor<T> gx(gy.shape());
    apply(gy, gx);
    grads.add(0, std::move(gx));
  }

 private:
  void apply(const Tensor<T>& src, Tensor<T>& dst) const {
    const CounterRng rng = CounterRng::at(seed_, this->id);
    const T* REMAT_RESTRICT s = src.data();
    T* REMAT_RESTRICT d = dst.data();
    const std::uint32_t threshold = threshold_;
    const T scale = scale_;
    for_chunks(src.numel(), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        d[i] = rng.bits(static_cast<std::uint32_t>(i)) >= threshold ? s[i] * scale : T(0);
      }
    });
  }

  std::uint32_t threshold_;  // an element is kept when its 32 random bits are >= this
  T scale_;
  std::uint64_t seed_;
};

}  // namespace detail

/// Zeroes each element with probability p and scales the rest by 1 / (1 - p); the identity
/// when not training or when p is 0.
template <class T>
Var<T> dropout(const Var<T>& x, double p, bool training = true) {
  if (!(p >= 0.0 && p < 1.0))
    throw ArgumentError(detail::cat("dropout: p must be in [0, 1), got ", p));
  if (!training || p == 0.0) return x;
  return detail::record_op<detail::DropoutNode<T>>({&x}, p, detail::rng_seed_for(x));
}

}  // namespace remat
