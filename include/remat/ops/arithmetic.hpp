#pragma once
/// @file
/// add, sub, mul, div (with NumPy's broadcasting: bias-style shapes combine without copies, see
/// broadcast.hpp; others are repeated first, see broadcast_to.hpp), neg, scale, add_scalar, and
/// the operators + - * / on Vars and scalars.

#include <type_traits>

#include "remat/core/record.hpp"
#include "remat/ops/broadcast.hpp"
#include "remat/ops/broadcast_to.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

/// out = f(a, b) element-wise, the smaller operand repeating as the Broadcast says.
template <class T, class F>
Tensor<T> apply_broadcast(const Broadcast& bc, const Tensor<T>& a, const Tensor<T>& b, F f) {
  Tensor<T> out(bc.out);
  if (bc.repeated < 0) {
    for_chunks(out.numel(), [&](std::int64_t s, std::int64_t e) {
      view(out, s, e) = f(view(a, s, e), view(b, s, e));
    });
    return out;
  }
  const std::int64_t n = bc.inner;
  for_rows(bc.outer, n, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t s = r * n;
      if (bc.repeated == 1) {
        view(out, s, s + n) = f(view(a, s, s + n), view(b, 0, n));
      } else {
        view(out, s, s + n) = f(view(a, 0, n), view(b, s, s + n));
      }
    }
  });
  return out;
}

/// Adds the gradient g(r, c0, c1) (an expression over row r, columns [c0, c1) of the output) to
/// operand k, summing over the rows where operand k repeats.
template <class T, class G>
void add_broadcast_grad(Grads<T>& grads, int k, const Broadcast& bc, const Shape& shape, G g) {
  if (!grads.needs(k)) return;
  if (bc.repeated == k) {
    grads.add_with(k, shape, [&](Tensor<T>& dst, bool overwrite) {
      sum_rows_into(dst.data(), bc.outer, bc.inner, overwrite,
                    [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
                      return g(r * bc.inner + c0, r * bc.inner + c1);
                    });
    });
    return;
  }
  Tensor<T> out(shape);
  if (bc.repeated < 0) {
    for_chunks(out.numel(), [&](std::int64_t s, std::int64_t e) { view(out, s, e) = g(s, e); });
  } else {  // the other operand repeats: keep each range inside one repetition (see operand())
    for_rows(bc.outer, bc.inner, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r)
        view(out, r * bc.inner, (r + 1) * bc.inner) = g(r * bc.inner, (r + 1) * bc.inner);
    });
  }
  grads.add(k, std::move(out));
}

/// Operand k's elements matching output elements [s, e): the same range, or for the repeating
/// operand, the matching part of its one copy ([s, e) must then lie within one repetition).
template <class T>
ConstArrayView<T> operand(const Tensor<T>& t, int k, const Broadcast& bc, std::int64_t s,
                          std::int64_t e) {
  if (bc.repeated != k) return view(t, s, e);
  const std::int64_t off = bc.inner == 0 ? 0 : s % bc.inner;
  return view(t, off, off + (e - s));
}

/// What add, sub, mul and div nodes share: the broadcast between their operands and the
/// operands' shapes (each gradient takes its operand's shape).
template <class T>
class BinaryNode : public Node<T> {
 public:
  BinaryNode(Broadcast bc, Shape a, Shape b)
      : bc_(std::move(bc)), a_(std::move(a)), b_(std::move(b)) {}

 protected:
  const Shape& operand_shape(int k) const noexcept { return k == 0 ? a_ : b_; }

  Broadcast bc_;
  Shape a_, b_;
};

template <class T>
class AddNode final : public BinaryNode<T> {
 public:
  using BinaryNode<T>::BinaryNode;
  const OpType& op_type() const noexcept override { return op::add; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    return apply_broadcast(bc_, in[0], in[1], [](const auto& x, const auto& y) { return x + y; });
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    for (int k = 0; k < 2; ++k) {
      if (bc_.repeated == k) {
        add_broadcast_grad(grads, k, bc_, this->operand_shape(k),
                           [&](std::int64_t s, std::int64_t e) { return view(gy, s, e); });
      } else {
        grads.add(k, gy.reshape(this->operand_shape(k)));
      }
    }
  }

 private:
  using BinaryNode<T>::bc_, BinaryNode<T>::a_, BinaryNode<T>::b_;
};

template <class T>
class SubNode final : public BinaryNode<T> {
 public:
  using BinaryNode<T>::BinaryNode;
  const OpType& op_type() const noexcept override { return op::sub; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    return apply_broadcast(bc_, in[0], in[1], [](const auto& x, const auto& y) { return x - y; });
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    if (bc_.repeated == 0) {
      add_broadcast_grad(grads, 0, bc_, a_,
                         [&](std::int64_t s, std::int64_t e) { return view(gy, s, e); });
    } else {
      grads.add(0, gy.reshape(a_));
    }
    add_broadcast_grad(grads, 1, bc_, b_,
                       [&](std::int64_t s, std::int64_t e) { return -view(gy, s, e); });
  }

 private:
  using BinaryNode<T>::bc_, BinaryNode<T>::a_, BinaryNode<T>::b_;
};

template <class T>
class MulNode final : public BinaryNode<T> {
 public:
  using BinaryNode<T>::BinaryNode;
  const OpType& op_type() const noexcept override { return op::mul; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    this->save(0, in[0]);
    this->save(1, in[1]);
    return apply_broadcast(bc_, in[0], in[1], [](const auto& x, const auto& y) { return x * y; });
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& a = this->saved(0);
    const Tensor<T>& b = this->saved(1);
    add_broadcast_grad(grads, 0, bc_, a_, [&](std::int64_t s, std::int64_t e) {
      return view(gy, s, e) * operand(b, 1, bc_, s, e);
    });
    add_broadcast_grad(grads, 1, bc_, b_, [&](std::int64_t s, std::int64_t e) {
      return view(gy, s, e) * operand(a, 0, bc_, s, e);
    });
  }

 private:
  using BinaryNode<T>::bc_, BinaryNode<T>::a_, BinaryNode<T>::b_;
};

template <class T>
class DivNode final : public BinaryNode<T> {
 public:
  using BinaryNode<T>::BinaryNode;
  const OpType& op_type() const noexcept override { return op::div; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    this->save(0, in[0]);
    this->save(1, in[1]);
    return apply_broadcast(bc_, in[0], in[1], [](const auto& x, const auto& y) { return x / y; });
  }
  // d(a/b)/da = 1/b, d(a/b)/db = -a/b^2
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& a = this->saved(0);
    const Tensor<T>& b = this->saved(1);
    add_broadcast_grad(grads, 0, bc_, a_, [&](std::int64_t s, std::int64_t e) {
      return view(gy, s, e) / operand(b, 1, bc_, s, e);
    });
    add_broadcast_grad(grads, 1, bc_, b_, [&](std::int64_t s, std::int64_t e) {
      return -view(gy, s, e) * operand(a, 0, bc_, s, e) / operand(b, 1, bc_, s, e).square();
    });
  }

 private:
  using BinaryNode<T>::bc_, BinaryNode<T>::a_, BinaryNode<T>::b_;
};

/// y = alpha * x + beta, the scalar affine map behind neg, scale and add_scalar.
template <class T>
class AffineNode final : public Node<T> {
 public:
  AffineNode(const OpType& type, T alpha, T beta) : type_(type), alpha_(alpha), beta_(beta) {}
  const OpType& op_type() const noexcept override { return type_; }
  bool runs_shape_only() const noexcept override { return true; }
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(in[0].shape());
    for_chunks(out.numel(), [&](std::int64_t s, std::int64_t e) {
      view(out, s, e) = alpha_ * view(in[0], s, e) + beta_;
    });
    return out;
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    Tensor<T> gx(gy.shape());
    for_chunks(gx.numel(),
               [&](std::int64_t s, std::int64_t e) { view(gx, s, e) = alpha_ * view(gy, s, e); });
    grads.add(0, std::move(gx));
  }

 private:
  const OpType& type_;
  T alpha_, beta_;
};

template <template <class> class NodeT, class T>
Var<T> binary(const char* op, const Var<T>& a, const Var<T>& b) {
  const Shape sa = a.shape(), sb = b.shape();
  if (!bias_style(sa, sb)) {  // NumPy's rules: repeat both operands to the common shape first
    const Shape out = numpy_broadcast_shape(op, sa, sb);
    const Var<T> ea = broadcast_to(a, out), eb = broadcast_to(b, out);
    return record_op<NodeT<T>>({&ea, &eb}, broadcast(op, out, out), out, out);
  }
  return record_op<NodeT<T>>({&a, &b}, broadcast(op, sa, sb), sa, sb);
}

}  // namespace detail

/// a + b, broadcasting by NumPy's rules; gradients sum over the repeated axes.
template <class T>
Var<T> add(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  return detail::binary<detail::AddNode>("add", a, b);
}
/// a - b, broadcasting by NumPy's rules.
template <class T>
Var<T> sub(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  return detail::binary<detail::SubNode>("sub", a, b);
}
/// a * b element-wise, broadcasting by NumPy's rules.
template <class T>
Var<T> mul(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  return detail::binary<detail::MulNode>("mul", a, b);
}
/// a / b element-wise, broadcasting by NumPy's rules.
template <class T>
Var<T> div(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  return detail::binary<detail::DivNode>("div", a, b);
}

/// -x
template <class T>
Var<T> neg(const Var<T>& x) {
  return detail::record_op<detail::AffineNode<T>>({&x}, op::neg, T(-1), T(0));
}
/// s * x for a scalar s.
template <class T>
Var<T> scale(const Var<T>& x, std::type_identity_t<T> s) {
  return detail::record_op<detail::AffineNode<T>>({&x}, op::scale, s, T(0));
}
/// x + s for a scalar s.
template <class T>
Var<T> add_scalar(const Var<T>& x, std::type_identity_t<T> s) {
  return detail::record_op<detail::AffineNode<T>>({&x}, op::add_scalar, T(1), s);
}

template <class T>
Var<T> operator+(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  return add(a, b);
}
template <class T>
Var<T> operator-(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  return sub(a, b);
}
template <class T>
Var<T> operator*(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  return mul(a, b);
}
template <class T>
Var<T> operator/(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  return div(a, b);
}
template <class T>
Var<T> operator-(const Var<T>& x) {
  return neg(x);
}
template <class T>
Var<T> operator*(const Var<T>& x, std::type_identity_t<T> s) {
  return scale(x, s);
}
template <class T>
Var<T> operator*(std::type_identity_t<T> s, const Var<T>& x) {
  return scale(x, s);
}
template <class T>
Var<T> operator/(const Var<T>& x, std::type_identity_t<T> s) {
  return scale(x, T(1) / s);
}
template <class T>
Var<T> operator+(const Var<T>& x, std::type_identity_t<T> s) {
  return add_scalar(x, s);
}
template <class T>
Var<T> operator-(const Var<T>& x, std::type_identity_t<T> s) {
  return add_scalar(x, -s);
}

}  // namespace remat
