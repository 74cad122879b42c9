#pragma once
/// @file
/// silu (x sigmoid(x), PyTorch's F.silu) and swiglu(gate, up) = silu(gate) * up, the gated
/// activation of Llama's and Qwen's MLPs, as one node: it keeps its two inputs and nothing else.

#include "remat/ops/unary.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

/// silu: y = x s(x), s the logistic function; dy/dx = s (1 + x (1 - s)).
struct SiluOp {
  static constexpr const OpType& type = op::silu;
  static constexpr Uses uses = Uses::input;
  template <class A>
  static auto f(const A& x) {
    return x * x.logistic();
  }
  template <class A>
  static void df(auto&& gx, const auto& gy, const A& x) {
    using T = typename A::Scalar;
    gx = x.logistic();  // s, computed once, then used twice in place
    gx = gy * gx * (T(1) + x * (T(1) - gx));
  }
};

template <class T>
class SwigluNode final : public Node<T> {
 public:
  const OpType& op_type() const noexcept override { return op::swiglu; }
  bool runs_shape_only() const noexcept override { return true; }

  // gate, up: (..., F) -> silu(gate) * up
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(in[0].shape());
    for_chunks(out.numel(), [&](std::int64_t s, std::int64_t e) {
      view(out, s, e) = SiluOp::f(view(in[0], s, e)) * view(in[1], s, e);
    });
    this->save(0, in[0]);
    this->save(1, in[1]);
    return out;
  }

  // d gate = dy up silu'(gate); d up = dy silu(gate)
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& gate = this->saved(0);
    const Tensor<T>& up = this->saved(1);
    if (grads.needs(0)) {
      Tensor<T> g(gate.shape());
      for_chunks(g.numel(), [&](std::int64_t s, std::int64_t e) {
        SiluOp::df(view(g, s, e), view(gy, s, e) * view(up, s, e), view(gate, s, e));
      });
      grads.add(0, std::move(g));
    }
    if (grads.needs(1)) {
      Tensor<T> g(up.shape());
      for_chunks(g.numel(), [&](std::int64_t s, std::int64_t e) {
        view(g, s, e) = view(gy, s, e) * SiluOp::f(view(gate, s, e));
      });
      grads.add(1, std::move(g));
    }
  }
};

}  // namespace detail

/// SiLU (swish): x sigmoid(x).
template <class T>
Var<T> silu(const Var<T>& x) {
  return detail::unary<detail::SiluOp>(x);
}

/// The SwiGLU gate: silu(gate) * up, element-wise, for two Vars of one shape. The MLP of Llama
/// and Qwen2 is down(swiglu(gate(x), up(x))).
template <class T>
Var<T> swiglu(const Var<T>& gate, const std::type_identity_t<Var<T>>& up) {
  if (!(gate.shape() == up.shape())) {
    throw ShapeError(detail::cat("swiglu: gate ", gate.shape(), " and up ", up.shape(),
                                 " must have the same shape"));
  }
  return detail::record_op<detail::SwigluNode<T>>({&gate, &up});
}

}  // namespace remat
