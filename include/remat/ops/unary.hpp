#pragma once
/// @file
/// Element-wise functions: exp, log, sqrt, tanh, sigmoid, relu, gelu, gelu_tanh. Each is a small
/// struct holding its forward and its derivative side by side; UnaryNode runs them over the tensor.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "remat/core/bfloat16.hpp"
#include "remat/core/record.hpp"
#include "remat/core/vector_kernels.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

/// What a unary op's derivative reads: its input x or its output y.
enum class Uses { input, output };

struct ExpOp {
  static constexpr const OpType& type = op::exp;
  static constexpr Uses uses = Uses::output;
  static auto f(const auto& x) { return x.exp(); }
  static void df(auto&& gx, const auto& gy, const auto& y) { gx = gy * y; }
};

struct LogOp {
  static constexpr const OpType& type = op::log;
  static constexpr Uses uses = Uses::input;
  static auto f(const auto& x) { return x.log(); }
  static void df(auto&& gx, const auto& gy, const auto& x) { gx = gy / x; }
};

struct SqrtOp {
  static constexpr const OpType& type = op::sqrt;
  static constexpr Uses uses = Uses::output;
  static auto f(const auto& x) { return x.sqrt(); }
  static void df(auto&& gx, const auto& gy, const auto& y) { gx = gy / (y + y); }
};

struct TanhOp {
  static constexpr const OpType& type = op::tanh;
  static constexpr Uses uses = Uses::output;
  static auto f(const auto& x) { return x.tanh(); }
  template <class A>
  static void df(auto&& gx, const auto& gy, const A& y) {
    gx = gy * (typename A::Scalar(1) - y.square());
  }
  // float: the same math, dispatched by instruction set (Note [ISA dispatch])
  static void vector_f(const float* x, float* y, std::int64_t n) { vec::tanh_forward(x, y, n); }
  static void vector_df(const float* gy, const float* y, float* gx, std::int64_t n) {
    vec::tanh_backward(gy, y, gx, n);
  }
};

struct SigmoidOp {
  static constexpr const OpType& type = op::sigmoid;
  static constexpr Uses uses = Uses::output;
  static auto f(const auto& x) { return x.logistic(); }
  template <class A>
  static void df(auto&& gx, const auto& gy, const A& y) {
    gx = gy * y * (typename A::Scalar(1) - y);
  }
};

struct ReluOp {
  static constexpr const OpType& type = op::relu;
  static constexpr Uses uses = Uses::output;
  template <class A>
  static auto f(const A& x) {
    return x.cwiseMax(typename A::Scalar(0));
  }
  template <class A>
  static void df(auto&& gx, const auto& gy, const A& y) {
    using T = typename A::Scalar;
    gx = gy * (y > T(0)).template cast<T>();
  }
};

/// GELU, exact (PyTorch's default gelu): y = x/2 (1 + erf(x / sqrt 2)).
struct GeluOp {
  static constexpr const OpType& type = op::gelu;
  static constexpr Uses uses = Uses::input;
  static constexpr double rsqrt2 = 0.7071067811865476;    // 1 / sqrt(2)
  static constexpr double rsqrt2pi = 0.3989422804014327;  // 1 / sqrt(2 pi)
  // Eigen's erf lives in its unsupported modules: the scalar std::erf, element by element.
  template <class A>
  static auto erf_of_scaled(const A& x) {
    using T = typename A::Scalar;
    return x.unaryExpr([](T v) { return static_cast<T>(std::erf(v * T(rsqrt2))); });
  }
  template <class A>
  static auto f(const A& x) {
    using T = typename A::Scalar;
    return T(0.5) * x * (T(1) + erf_of_scaled(x));
  }
  // dy/dx = (1 + erf(x / sqrt 2))/2 + x phi(x), phi the standard normal density
  template <class A>
  static void df(auto&& gx, const auto& gy, const A& x) {
    using T = typename A::Scalar;
    gx = gy * (T(0.5) * (T(1) + erf_of_scaled(x)) + T(rsqrt2pi) * x * (T(-0.5) * x.square()).exp());
  }
};

/// GELU, tanh approximation (GPT-2's, PyTorch's gelu(approximate='tanh')):
/// y = x/2 (1 + tanh(u)), u = c (x + 0.044715 x^3), c = sqrt(2/pi).
struct GeluTanhOp {
  static constexpr const OpType& type = op::gelu_tanh;
  static constexpr Uses uses = Uses::input;
  static constexpr double c = 0.7978845608028654;  // sqrt(2 / pi)
  static constexpr double k = 0.044715;
  template <class A>
  static auto f(const A& x) {
    using T = typename A::Scalar;
    return T(0.5) * x * (T(1) + (T(c) * (x + T(k) * x.cube())).tanh());
  }
  // dy/dx = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3k x^2), t = tanh(u)
  template <class A>
  static void df(auto&& gx, const auto& gy, const A& x) {
    using T = typename A::Scalar;
    gx = (T(c) * (x + T(k) * x.cube())).tanh();  // t, computed once, then used twice in place
    gx = gy * (T(0.5) * (T(1) + gx) +
               T(0.5) * x * (T(1) - gx.square()) * T(c) * (T(1) + T(3 * k) * x.square()));
  }
  static void vector_f(const float* x, float* y, std::int64_t n) { vec::gelu_forward(x, y, n); }
  static void vector_df(const float* gy, const float* x, float* gx, std::int64_t n) {
    vec::gelu_backward(gy, x, gx, n);
  }
};

/// Whether Op has float kernels dispatched by instruction set (used for T = float).
template <class T, class Op>
inline constexpr bool has_vector_kernel = std::is_same_v<T, float>&& requires {
  &Op::vector_f;
};

template <class T, class Op>
class UnaryNode final : public Node<T> {
 public:
  const OpType& op_type() const noexcept override { return Op::type; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(in[0].shape());
    for_chunks(out.numel(), [&](std::int64_t s, std::int64_t e) {
      if constexpr (has_vector_kernel<T, Op>) {
        Op::vector_f(in[0].data() + s, out.data() + s, e - s);
      } else {
        view(out, s, e) = Op::f(view(in[0], s, e));
      }
    });
    this->save(0, Op::uses == Uses::input ? in[0] : out);
    return out;
  }
  // A bfloat16 copy of what it saved (Note [BF16 saves]) is widened a piece at a time on the
  // stack: a float tensor of it would add the input's size to the backward pass's peak (8 MiB
  // of a BF16 GPT step's, at its last gelu).
  bool reads_copy(int slot) const noexcept override { return slot == 0; }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& used = this->saved(0);  // undefined when saved as a copy
    const Tensor<std::uint16_t>& copy = this->saved_copy(0);
    Tensor<T> gx(gy.shape());
    for_chunks(gx.numel(), [&](std::int64_t s, std::int64_t e) {
      if constexpr (std::is_same_v<T, float>) {
        if (copy.defined()) return df_from_copy(gy.data(), copy.data(), gx.data(), s, e);
      }
      df(gy.data() + s, used.data() + s, gx.data() + s, e - s);
    });
    grads.add(0, std::move(gx));
  }

 private:
  static constexpr std::int64_t kPiece = 1024;  ///< values widened at a time (4 KiB of stack)

  static void df(const T* gy, const T* used, T* gx, std::int64_t n) {
    if constexpr (has_vector_kernel<T, Op>) {
      Op::vector_df(gy, used, gx, n);
    } else {
      Op::df(ArrayView<T>(gx, n), ConstArrayView<T>(gy, n), ConstArrayView<T>(used, n));
    }
  }
  static void df_from_copy(const T* gy, const std::uint16_t* copy, T* gx, std::int64_t s,
                           std::int64_t e) {
    T used[kPiece];
    for (std::int64_t a = s; a < e; a += kPiece) {
      const std::int64_t n = std::min(kPiece, e - a);
      widen_bf16(copy + a, n, used);
      df(gy + a, used, gx + a, n);
    }
  }
};

template <class Op, class T>
Var<T> unary(const Var<T>& x) {
  return record_op<UnaryNode<T, Op>>({&x});
}

}  // namespace detail

template <class T>
Var<T> exp(const Var<T>& x) {
  return detail::unary<detail::ExpOp>(x);
}
/// Natural logarithm; inputs must be positive.
template <class T>
Var<T> log(const Var<T>& x) {
  return detail::unary<detail::LogOp>(x);
}
template <class T>
Var<T> sqrt(const Var<T>& x) {
  return detail::unary<detail::SqrtOp>(x);
}
template <class T>
Var<T> tanh(const Var<T>& x) {
  return detail::unary<detail::TanhOp>(x);
}
template <class T>
Var<T> sigmoid(const Var<T>& x) {
  return detail::unary<detail::SigmoidOp>(x);
}
template <class T>
Var<T> relu(const Var<T>& x) {
  return detail::unary<detail::ReluOp>(x);
}
/// GELU, exact: x Phi(x) with the normal CDF written through erf (PyTorch's default gelu).
template <class T>
Var<T> gelu(const Var<T>& x) {
  return detail::unary<detail::GeluOp>(x);
}
/// GELU with the tanh approximation (GPT-2's; PyTorch's gelu(approximate='tanh')).
template <class T>
Var<T> gelu_tanh(const Var<T>& x) {
  return detail::unary<detail::GeluTanhOp>(x);
}

}  // namespace remat
