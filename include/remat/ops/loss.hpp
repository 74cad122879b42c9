#pragma once
/// @file
/// cross_entropy: mean negative log-likelihood of integer class targets under softmax(logits).

#include <cmath>
#include <vector>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/embedding.hpp"
#include "remat/ops/gemm.hpp"

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
  const bool fits = logits.rank() >= 1 && logits.dim(-1) >= 1 &&
                    targets.numel() == logits.shape().rows() &&
                    (targets.shape() == logits.shape().dropped_back() || targets.rank() == 1);
  if (!fits) {
    throw ShapeError(
        detail::cat("cross_entropy: logits ", logits.shape(), " and targets ", targets.shape(),
                    " do not fit; targets must have the logits' shape without its last axis"));
  }
  if (logits.shape().rows() == 0)
    throw ShapeError(detail::cat("cross_entropy: logits ", logits.shape(), " have no rows"));
  detail::check_ids("cross_entropy", targets, logits.dim(-1), "target");
  return detail::record_op<detail::CrossEntropyNode<T>>({&logits}, targets);
}

namespace detail {

/// Cross-entropy of linear(h, W) computed chunk by chunk: the (rows x vocabulary) logits and
/// their gradient never exist whole, only one chunk of rows at a time, recomputed in backward.
/// linear_cross_entropy's default chunk: as many rows as fit in 8 MiB of logits, at least one.
inline std::int64_t default_chunk_rows(std::int64_t vocab, std::size_t element_bytes) {
  return std::max<std::int64_t>(
      1, (std::int64_t{8} << 20) / (vocab * static_cast<std::int64_t>(element_bytes)));
}

template <class T>
class LinearCrossEntropyNode final : public Node<T> {
 public:
  LinearCrossEntropyNode(Tensor<std::int32_t> targets, std::int64_t chunk)
      : targets_(std::move(targets)), chunk_(chunk) {}
  const char* op_name() const noexcept override { return "linear_cross_entropy"; }

  // h: (N, C), W: (V, C) -> mean over rows of lse(h W^T) - (h W^T)[target]; saves h, W and lse.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& h = in[0];
    const Tensor<T>& w = in[1];
    const std::int64_t n = h.shape().rows(), c = h.shape().last(), v = w.dim(0);
    Tensor<T> lse(Shape{n});
    Tensor<T> logits(Shape{std::min(chunk_, n), v});
    std::vector<double> losses(static_cast<std::size_t>(n));
    for (std::int64_t r0 = 0; r0 < n; r0 += chunk_) {
      const std::int64_t rows = std::min(chunk_, n - r0);
      gemm<T>(false, true, rows, v, c, T(1), h.data() + r0 * c, c, w.data(), c, T(0), logits.data(),
              v);
      for_rows(rows, v, [&](std::int64_t a, std::int64_t b) {
        for (std::int64_t r = a; r < b; ++r) {
          const auto row = view(logits, r * v, (r + 1) * v);
          const T m = row.maxCoeff();
          lse[r0 + r] = m + std::log((row - m).exp().sum());
          losses[r0 + r] =
              static_cast<double>(lse[r0 + r]) - static_cast<double>(row[targets_[r0 + r]]);
        }
      });
    }
    double total = 0;
    for (double l : losses) total += l;
    this->save(0, h);
    this->save(1, w);
    this->save(2, lse);
    return Tensor<T>::scalar(static_cast<T>(total / static_cast<double>(n)));
  }

  // per chunk: dlogits = (softmax - onehot) dloss / N; dh = dlogits W; dW += dlogits^T h
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& h = this->saved(0);
    const Tensor<T>& w = this->saved(1);
    const Tensor<T>& lse = this->saved(2);
    const std::int64_t n = h.shape().rows(), c = h.shape().last(), v = w.dim(0);
    const T g = gy[0] / T(n);
    const auto gh = grads.target(0, h.shape());
    const auto gw = grads.target(1, w.shape());
    Tensor<T> dlogits(Shape{std::min(chunk_, n), v});
    for (std::int64_t r0 = 0; r0 < n; r0 += chunk_) {
      const std::int64_t rows = std::min(chunk_, n - r0);
      gemm<T>(false, true, rows, v, c, T(1), h.data() + r0 * c, c, w.data(), c, T(0),
              dlogits.data(), v);
      for_rows(rows, v, [&](std::int64_t a, std::int64_t b) {
        for (std::int64_t r = a; r < b; ++r) {
          auto row = view(dlogits, r * v, (r + 1) * v);
          row = (row - lse[r0 + r]).exp() * g;
          row[targets_[r0 + r]] -= g;
        }
      });
      if (gh.dst) {
        gemm<T>(false, false, rows, c, v, T(1), dlogits.data(), v, w.data(), c,
                gh.overwrite ? T(0) : T(1), gh.dst->data() + r0 * c, c);
      }
      if (gw.dst) {
        const bool first = r0 == 0 && gw.overwrite;
        gemm<T>(true, false, v, c, rows, T(1), dlogits.data(), v, h.data() + r0 * c, c,
                first ? T(0) : T(1), gw.dst->data(), c);
      }
    }
  }

 private:
  Tensor<std::int32_t> targets_;
  std::int64_t chunk_;
};

}  // namespace detail

/// cross_entropy(linear(h, weight), targets) without ever holding the (rows x vocabulary) logits
/// or their gradient: rows go through in chunks of `chunk_rows` (default: as many as fit in
/// 8 MiB of logits), and backward recomputes each chunk's logits. h is (..., C), weight
/// (V, C), targets (...) in [0, V). Costs one more GEMM of the logits' size than the plain path.
template <class T>
Var<T> linear_cross_entropy(const Var<T>& h, const std::type_identity_t<Var<T>>& weight,
                            const Tensor<std::int32_t>& targets, std::int64_t chunk_rows = 0) {
  if (!targets.defined()) throw UsageError("linear_cross_entropy: the targets tensor is undefined");
  const Shape& sh = h.shape();
  const Shape& sw = weight.shape();
  if (sh.rank() < 1 || sw.rank() != 2 || sh[-1] != sw[1] || sw[0] < 1 ||
      targets.numel() != sh.rows() || sh.rows() == 0) {
    throw ShapeError(detail::cat(
        "linear_cross_entropy: hidden ", sh, ", weight ", sw, " and targets ", targets.shape(),
        " do not fit; need hidden (..., C), weight (V, C) and one target per row of hidden"));
  }
  if (chunk_rows < 0)
    throw UsageError(
        detail::cat("linear_cross_entropy: chunk_rows must be >= 0, got ", chunk_rows));
  detail::check_ids("linear_cross_entropy", targets, sw[0], "target");
  const std::int64_t chunk =
      chunk_rows > 0 ? chunk_rows : detail::default_chunk_rows(sw[0], sizeof(T));
  return detail::record_op<detail::LinearCrossEntropyNode<T>>({&h, &weight}, targets,
                                                              std::min(chunk, sh.rows()));
}

namespace detail {
/// The op names this header's nodes report, for save policies (core/save_policy.hpp).
inline const bool k_loss_names_registered =
    register_op_names({"cross_entropy", "linear_cross_entropy"});
}  // namespace detail

}  // namespace remat
