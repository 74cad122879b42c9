#pragma once
/// @file
/// matmul: (m, k) @ (k, n); batched (..., m, k) @ (..., k, n) with equal leading axes; and
/// (..., m, k) @ (k, n), one matrix applied to every row of a batch (a single GEMM).

#include "remat/core/record.hpp"
#include "remat/ops/gemm_bf16.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {
namespace detail {

template <class T>
class MatmulNode final : public Node<T> {
 public:
  // batch: number of (m x k) @ (k x n) products; shared_b: one b for all of them.
  MatmulNode(std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n, bool shared_b,
             Shape out)
      : batch_(batch), m_(m), k_(k), n_(n), shared_b_(shared_b), out_(out) {}
  const OpType& op_type() const noexcept override { return op::matmul; }
  bool runs_shape_only() const noexcept override { return true; }
  bool can_resave() const noexcept override { return true; }
  void resave(typename Node<T>::Inputs in, const Tensor<T>&) override {
    this->save(0, in[0]);
    this->save(1, in[1]);
  }
  double forward_flops(typename Node<T>::Inputs, const Tensor<T>&) const override {
    return 2.0 * static_cast<double>(batch_) * static_cast<double>(m_) * static_cast<double>(k_) *
           static_cast<double>(n_);
  }
  // both operands' GEMMs read their bfloat16 copies (Note [BF16 saves])
  bool reads_copy(int) const noexcept override { return true; }

  Tensor<T> forward(typename Node<T>::Inputs in) override {
    this->save(0, in[0]);
    this->save(1, in[1]);
    Tensor<T> out(out_);
    // shape-only run: allocated as in a real run, nothing to compute
    if (shape_only()) return out;
    const GemmOperand<T> a = operand(0, in[0], k_), b = operand(1, in[1], n_);
    if (shared_b_) {  // (batch*m, k) @ (k, n)
      gemm_in<T>(this->bf16, false, false, batch_ * m_, n_, k_, T(1), a, b, T(0), out.data(), n_);
      return out;
    }
    for (std::int64_t i = 0; i < batch_; ++i) {
      gemm_in<T>(this->bf16, false, false, m_, n_, k_, T(1), a.at(i * m_ * k_), b.at(i * k_ * n_),
                 T(0), out.data() + i * m_ * n_, n_);
    }
    return out;
  }

  // dA = dC B^T, dB = A^T dC (summed over the batch when B is shared)
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const GemmOperand<T> a = operand(0, this->saved(0), k_), b = operand(1, this->saved(1), n_);
    const GemmOperand<T> g{gy.data(), n_};
    const std::int64_t rows = shared_b_ ? batch_ * m_ : m_;
    const std::int64_t products = shared_b_ ? 1 : batch_;
    grads.add_with(0, this->saved_shape(0), [&](Tensor<T>& ga, bool overwrite) {
      for (std::int64_t i = 0; i < products; ++i) {
        gemm_in<T>(this->bf16, false, true, rows, k_, n_, T(1), g.at(i * rows * n_),
                   b.at(i * k_ * n_), overwrite ? T(0) : T(1), ga.data() + i * rows * k_, k_);
      }
    });
    grads.add_with(1, this->saved_shape(1), [&](Tensor<T>& gb, bool overwrite) {
      for (std::int64_t i = 0; i < products; ++i) {
        gemm_in<T>(this->bf16, true, false, k_, n_, rows, T(1), a.at(i * rows * k_),
                   g.at(i * rows * n_), overwrite ? T(0) : T(1), gb.data() + i * k_ * n_, n_);
      }
    });
  }

 private:
  /// Input `slot` as a GEMM operand with rows `ld` values apart: `t`, or the bfloat16 copy saved
  /// of it (then `t` may be undefined).
  GemmOperand<T> operand(int slot, const Tensor<T>& t, std::int64_t ld) const noexcept {
    return {t.data(), ld, this->saved_copy(slot).data()};
  }

  std::int64_t batch_, m_, k_, n_;
  bool shared_b_;
  Shape out_;
};

}  // namespace detail

/// Matrix product over the last two axes. a is (..., m, k); b is (..., k, n) with the same
/// leading axes, or (k, n) to multiply every matrix of a by it.
template <class T>
Var<T> matmul(const Var<T>& a, const std::type_identity_t<Var<T>>& b) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const auto fail = [&](const char* why) {
    return ShapeError(detail::cat("matmul: cannot multiply ", sa, " by ", sb, ": ", why));
  };
  if (sa.rank() < 2 || sb.rank() < 2) throw fail("both operands need at least two axes");
  const std::int64_t m = sa[-2], k = sa[-1], n = sb[-1];
  if (sb[-2] != k)
    throw fail("the last axis of the first must equal the second-to-last of the second");
  const bool shared_b = sb.rank() == 2;
  if (!shared_b && !(sa.dropped_back(2) == sb.dropped_back(2))) {
    throw fail("the leading (batch) axes must be equal, or the second operand must be a matrix");
  }
  const std::int64_t batch = sa.dropped_back(2).numel();
  return detail::record_op<detail::MatmulNode<T>>({&a, &b}, batch, m, k, n, shared_b,
                                                  sa.with_last(n));
}

}  // namespace remat
