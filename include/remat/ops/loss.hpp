#pragma once
/// @file
/// cross_entropy: mean negative log-likelihood of integer class targets under softmax(logits).
/// A target of kIgnoreTarget (-100, PyTorch's and Hugging Face's ignore_index) takes its row out
/// of the loss: the mean is over the other rows, and the row's gradient is zero. That is how a
/// loss mask is given (prompt tokens, padding, a packed sequence's boundaries).

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "remat/core/elementwise.hpp"
#include "remat/core/record.hpp"
#include "remat/core/vector_kernels.hpp"
#include "remat/ops/embedding.hpp"
#include "remat/ops/gemm.hpp"
#include "remat/ops/gemm_bf16.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {

/// The target that takes a row out of cross_entropy and linear_cross_entropy (see the file
/// comment): PyTorch's default ignore_index, so targets made for transformers read the same.
inline constexpr std::int32_t kIgnoreTarget = -100;

namespace detail {

/// Checks targets as check_ids does, kIgnoreTarget allowed, and returns how many rows count.
/// With none, the loss is 0 and every gradient 0 (PyTorch's mean over no rows is NaN, which
/// would end a run for a batch with nothing to learn). A shape-only run (core/shape_only.hpp)
/// reads no targets (they may have no data): it checks nothing and returns 0, and the loss's
/// value is unknown; no allocation depends on the count.
inline std::int64_t counted_targets(const char* op, const Tensor<std::int32_t>& targets,
                                    std::int64_t classes) {
  if (shape_only()) return 0;
  std::int64_t counted = 0;
  for (std::int64_t p = 0; p < targets.numel(); ++p) {
    if (targets[p] == kIgnoreTarget) continue;
    if (targets[p] < 0 || targets[p] >= classes) {
      throw IndexError(cat(op, ": target ", targets[p], " at position ", p, " is out of range [0, ",
                           classes, ") and is not kIgnoreTarget (", kIgnoreTarget, ")"));
    }
    ++counted;
  }
  return counted;
}

/// Each counted row's share of the gradient `dloss` of the mean (0 when no row counts).
template <class T>
T per_counted_row(T dloss, std::int64_t counted) {
  return counted > 0 ? dloss / T(counted) : T(0);
}

/// log(sum(exp(x))) of a row of n values, shifted by its largest so that no exp overflows. A
/// float row's exponentials run on the dispatched kernels (Note [ISA dispatch] in
/// core/vector_kernels.hpp: Eigen's are SSE2-wide under a user's usual flags, and a vocabulary's
/// rows make them a tenth of a loss head); a double row's by Eigen.
template <class T>
T row_log_sum_exp(const T* x, std::int64_t n) {
  const ConstArrayView<T> row(x, n);
  const T m = row.maxCoeff();
  if constexpr (std::is_same_v<T, float>)
    return m + std::log(vec::exp_sum(x, n, m));
  else
    return m + std::log((row - m).exp().sum());
}

/// A counted row's logits gradient: out = (softmax(x) - onehot(target)) * g, softmax from the
/// row's log-sum-exp `lse`, on row_log_sum_exp's kernels (out == x allowed).
template <class T>
void to_row_logits_grad(const T* x, T* out, std::int64_t n, T lse, std::int32_t target, T g) {
  if constexpr (std::is_same_v<T, float>)
    vec::exp_shifted(x, out, n, lse, g);
  else
    ArrayView<T>(out, n) = (ConstArrayView<T>(x, n) - lse).exp() * g;
  out[target] -= g;
}

template <class T>
class CrossEntropyNode final : public Node<T> {
 public:
  CrossEntropyNode(Tensor<std::int32_t> targets, std::int64_t counted)
      : targets_(std::move(targets)), counted_(counted) {}
  const OpType& op_type() const noexcept override { return op::cross_entropy; }
  bool runs_shape_only() const noexcept override { return true; }

  // logits: (rows, c) -> scalar; saves the logits and each row's log-sum-exp (0 where the
  // row is ignored).
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& x = in[0];
    const std::int64_t c = x.shape().last(), rows = x.shape().rows();
    Tensor<T> lse = Tensor<T>::zeros(Shape{rows});
    // each row's loss, summed in a fixed order below (none to hold in a shape-only run)
    std::vector<double> losses(shape_only() ? 0 : static_cast<std::size_t>(rows));
    for_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        if (targets_[r] == kIgnoreTarget) continue;
        const T* xr = x.data() + r * c;
        lse[r] = row_log_sum_exp(xr, c);
        losses[r] = static_cast<double>(lse[r]) - static_cast<double>(xr[targets_[r]]);
      }
    });
    double total = 0;
    for (double l : losses) total += l;
    this->save_exact(0, x);
    this->save_exact(1, lse);
    return Tensor<T>::scalar(counted_ > 0 ? static_cast<T>(total / static_cast<double>(counted_))
                                          : T(0));
  }

  // dlogits = (softmax(logits) - onehot(target)) * dloss / counted rows; 0 on ignored rows
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Tensor<T>& x = this->saved(0);
    const Tensor<T>& lse = this->saved(1);
    const std::int64_t c = x.shape().last(), rows = x.shape().rows();
    const T g = shape_only() ? T(0) : per_counted_row(gy[0], counted_);
    Tensor<T> gx(x.shape());
    for_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        if (targets_[r] == kIgnoreTarget) {
          view(gx, r * c, (r + 1) * c).setZero();
          continue;
        }
        to_row_logits_grad(x.data() + r * c, gx.data() + r * c, c, lse[r], targets_[r], g);
      }
    });
    grads.add(0, std::move(gx));
  }

 private:
  Tensor<std::int32_t> targets_;
  std::int64_t counted_;  // rows whose target is not kIgnoreTarget
};

}  // namespace detail

/// Mean cross-entropy of logits (..., C) against integer targets (...) in [0, C), over the rows
/// whose target is not kIgnoreTarget (0 if there are none).
template <class T>
Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int32_t>& targets) {
  if (!targets.defined()) throw ArgumentError("cross_entropy: the targets tensor is undefined");
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
  const std::int64_t counted = detail::counted_targets("cross_entropy", targets, logits.dim(-1));
  return detail::record_op<detail::CrossEntropyNode<T>>({&logits}, targets, counted);
}

namespace detail {

/// Cross-entropy of linear(h, W) computed chunk by chunk: the (rows x vocabulary) logits and
/// their gradient never exist whole, only one chunk of rows at a time (Note [fused loss head]
/// says when backward recomputes them).
/// linear_cross_entropy's default chunk: as many rows as fit in 8 MiB of logits, but at least
/// 128 rows while they fit in 128 MiB, and at least one. Each chunk's GEMMs read the whole (V, C)
/// weight: with few rows they are bound by reading it, not by arithmetic. Measured (ops_bench
/// --loss-head 151936,896,512: V 151,936, C 896, 512 rows, forward and backward, 2 threads, Xeon
/// with AVX-512, 2026-12-03), frozen head: 16-row chunks 4.2 s, 32 rows 2.7 s, 64 rows 1.9 s,
/// 128 rows 1.42 s, 256 rows 1.22 s, 512 rows 1.12 s; trained head 7.5, 4.7, 3.3, 2.7, 2.3,
/// 2.1 s: about 0.1 s a chunk for reading the head against 2 ms a row. 128 rows cost 74 MiB at
/// that vocabulary, 121 MiB at 248,000; larger chunks are the caller's choice of memory
/// (nn::LossOptions::chunk_rows; finetune --auto grows them into the memory a step leaves).
inline std::int64_t default_chunk_rows(std::int64_t vocab, std::size_t element_bytes) {
  const auto rows_in = [&](std::int64_t mib) {
    return (mib << 20) / (vocab * static_cast<std::int64_t>(element_bytes));
  };
  return std::max<std::int64_t>({1, rows_in(8), std::min<std::int64_t>(128, rows_in(128))});
}

template <class T>
class LinearCrossEntropyNode final : public Node<T> {
 public:
  LinearCrossEntropyNode(Tensor<std::int32_t> targets, std::int64_t counted, std::int64_t chunk,
                         bool weight_trained)
      : targets_(std::move(targets)),
        counted_(counted),
        chunk_(chunk),
        weight_trained_(weight_trained) {}
  const OpType& op_type() const noexcept override { return op::linear_cross_entropy; }
  bool runs_shape_only() const noexcept override { return true; }

  // h: (N, C), W: (V, C) -> mean over counted rows of lse(h W^T) - (h W^T)[target].
  // Note [fused loss head]: when W is not trained (LoRA, a frozen head), the gradient of h for a
  // unit dloss is computed here, chunk by chunk from the logits just made, and saved in place of
  // h, W and the log-sum-exps: two GEMMs over the (V, C) weight instead of three (the backward
  // pass would recompute the logits), for the same (N, C) kept. A trained W needs each chunk's
  // logits gradient again for dW, so it saves h, W and lse and recomputes them in backward.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& h = in[0];
    const Tensor<T>& w = in[1];
    const std::int64_t n = h.shape().rows(), c = h.shape().last(), v = w.dim(0);
    const bool fused = this->saving && !weight_trained_;
    Tensor<T> lse = Tensor<T>::zeros(Shape{n});
    Tensor<T> unit_gh = fused ? Tensor<T>(h.shape()) : Tensor<T>();
    Tensor<T> logits(Shape{std::min(chunk_, n), v});
    std::vector<double> losses(shape_only() ? 0 : static_cast<std::size_t>(n));
    for (std::int64_t r0 = 0; r0 < n && !shape_only(); r0 += chunk_) {
      const std::int64_t rows = std::min(chunk_, n - r0);
      chunk_logits(h.data() + r0 * c, rows, w.data(), v, c, logits.data());
      for_rows(rows, v, [&](std::int64_t a, std::int64_t b) {
        for (std::int64_t r = a; r < b; ++r) {
          if (targets_[r0 + r] == kIgnoreTarget) continue;
          const T* row = logits.data() + r * v;
          lse[r0 + r] = row_log_sum_exp(row, v);
          losses[r0 + r] =
              static_cast<double>(lse[r0 + r]) - static_cast<double>(row[targets_[r0 + r]]);
        }
      });
      if (fused) {
        to_logits_grad(logits, r0, rows, lse, per_counted_row(T(1), counted_));
        chunk_input_grad(logits.data(), rows, w.data(), v, c, T(0), unit_gh.data() + r0 * c);
      }
    }
    double total = 0;
    for (double l : losses) total += l;
    if (fused) {
      this->save_exact(0, unit_gh);
    } else {
      this->save_exact(0, h);
      this->save_exact(1, w);
      this->save_exact(2, lse);
    }
    return Tensor<T>::scalar(counted_ > 0 ? static_cast<T>(total / static_cast<double>(counted_))
                                          : T(0));
  }

  // fused: dh = dloss * the unit gradient forward saved. Otherwise per chunk:
  // dlogits = (softmax - onehot) dloss / counted rows (0 on ignored rows); dh = dlogits W;
  // dW += dlogits^T h
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    if (!weight_trained_) {
      const Tensor<T>& unit_gh = this->saved(0);
      grads.add_with(0, unit_gh.shape(), [&](Tensor<T>& dst, bool overwrite) {
        for_chunks(dst.numel(), [&](std::int64_t s, std::int64_t e) {
          if (overwrite)
            view(dst, s, e) = view(unit_gh, s, e) * gy[0];
          else
            view(dst, s, e) += view(unit_gh, s, e) * gy[0];
        });
      });
      return;
    }
    const Tensor<T>& h = this->saved(0);
    const Tensor<T>& w = this->saved(1);
    const Tensor<T>& lse = this->saved(2);
    const std::int64_t n = h.shape().rows(), c = h.shape().last(), v = w.dim(0);
    const auto gh = grads.target(0, h.shape());
    const auto gw = grads.target(1, w.shape());
    Tensor<T> dlogits(Shape{std::min(chunk_, n), v});
    for (std::int64_t r0 = 0; r0 < n && !shape_only(); r0 += chunk_) {
      const std::int64_t rows = std::min(chunk_, n - r0);
      chunk_logits(h.data() + r0 * c, rows, w.data(), v, c, dlogits.data());
      to_logits_grad(dlogits, r0, rows, lse, per_counted_row(gy[0], counted_));
      if (gh.dst) {
        chunk_input_grad(dlogits.data(), rows, w.data(), v, c, gh.overwrite ? T(0) : T(1),
                         gh.dst->data() + r0 * c);
      }
      if (gw.dst) {
        const bool first = r0 == 0 && gw.overwrite;
        for_vocab_blocks(v, c, [&](std::int64_t v0, std::int64_t count) {
          gemm_in<T>(bf16_gemms(), true, false, count, c, rows, T(1), dlogits.data() + v0, v,
                     h.data() + r0 * c, c, first ? T(0) : T(1), gw.dst->data() + v0 * c, c);
        });
      }
    }
  }

 private:
  /// Whether the head's GEMMs run in bfloat16: under Precision::bf16 on a tile kernel, as
  /// attention's products (AttentionNode::bf16_gemms: on the convert kernel the copies would
  /// cost more than they save). Its softmax, the loss and their statistics stay float.
  bool bf16_gemms() const noexcept {
    return std::is_same_v<T, float> && this->bf16 && bf16_kernel() != Bf16Kernel::convert;
  }

  /// Calls f(v0, count) over the vocabulary in blocks of `count` rows of W: one block in float; in
  /// bfloat16, blocks whose packed copy of W stays within 8 MiB, since gemm_bf16 packs its whole
  /// B operand into per-thread scratch outside the allocator's count (Note [BF16 GEMM packing]):
  /// a whole head would be 2 bytes a weight of it (272 MiB at Qwen2.5-0.5B's).
  template <class F>
  void for_vocab_blocks(std::int64_t v, std::int64_t c, F&& f) const {
    const std::int64_t block =
        bf16_gemms() ? std::max<std::int64_t>(32, (std::int64_t{4} << 20) / c / 32 * 32) : v;
    for (std::int64_t v0 = 0; v0 < v; v0 += block) f(v0, std::min(block, v - v0));
  }

  /// A chunk's logits (rows x V, rows V apart) = h W^T, h's rows C apart.
  void chunk_logits(const T* h, std::int64_t rows, const T* w, std::int64_t v, std::int64_t c,
                    T* logits) const {
    for_vocab_blocks(v, c, [&](std::int64_t v0, std::int64_t count) {
      gemm_in<T>(bf16_gemms(), false, true, rows, count, c, T(1), h, c, w + v0 * c, c, T(0),
                 logits + v0, v);
    });
  }

  /// dh = dlogits W + beta dh over a chunk's rows, summed block by block of the vocabulary.
  void chunk_input_grad(const T* dlogits, std::int64_t rows, const T* w, std::int64_t v,
                        std::int64_t c, T beta, T* dh) const {
    for_vocab_blocks(v, c, [&](std::int64_t v0, std::int64_t count) {
      gemm_in<T>(bf16_gemms(), false, false, rows, c, count, T(1), dlogits + v0, v, w + v0 * c, c,
                 v0 == 0 ? beta : T(1), dh, c);
    });
  }

  // Turns the chunk of logits of rows r0 .. r0 + rows into their gradient, in place:
  // (softmax - onehot(target)) * g on counted rows, 0 on ignored ones.
  void to_logits_grad(Tensor<T>& chunk, std::int64_t r0, std::int64_t rows, const Tensor<T>& lse,
                      T g) const {
    const std::int64_t v = chunk.shape().last();
    for_rows(rows, v, [&](std::int64_t a, std::int64_t b) {
      for (std::int64_t r = a; r < b; ++r) {
        T* row = chunk.data() + r * v;
        if (targets_[r0 + r] == kIgnoreTarget) {
          std::fill(row, row + v, T(0));
          continue;
        }
        to_row_logits_grad(row, row, v, lse[r0 + r], targets_[r0 + r], g);
      }
    });
  }

  Tensor<std::int32_t> targets_;
  std::int64_t counted_;  // rows whose target is not kIgnoreTarget
  std::int64_t chunk_;
  bool weight_trained_;  // Note [fused loss head]
};

}  // namespace detail

/// cross_entropy(linear(h, weight), targets) without ever holding the (rows x vocabulary) logits
/// or their gradient: rows go through in chunks of `chunk_rows` (default: detail::
/// default_chunk_rows, 8 MiB of logits or 128 rows, whichever is more, within 128 MiB). With a
/// weight that is not trained (a frozen head, LoRA), forward also computes h's gradient and the
/// pass costs the plain path's two GEMMs; with a trained weight, backward recomputes each
/// chunk's logits, one GEMM of the logits' size more (Note [fused loss head]). h is (..., C),
/// weight (V, C), targets (...) in [0, V) or kIgnoreTarget.
template <class T>
Var<T> linear_cross_entropy(const Var<T>& h, const std::type_identity_t<Var<T>>& weight,
                            const Tensor<std::int32_t>& targets, std::int64_t chunk_rows = 0) {
  if (!targets.defined())
    throw ArgumentError("linear_cross_entropy: the targets tensor is undefined");
  const Shape& sh = h.shape();
  const Shape& sw = weight.shape();
  if (sh.rank() < 1 || sw.rank() != 2 || sh[-1] != sw[1] || sw[0] < 1 ||
      targets.numel() != sh.rows() || sh.rows() == 0) {
    throw ShapeError(detail::cat(
        "linear_cross_entropy: hidden ", sh, ", weight ", sw, " and targets ", targets.shape(),
        " do not fit; need hidden (..., C), weight (V, C) and one target per row of hidden"));
  }
  if (chunk_rows < 0)
    throw ArgumentError(
        detail::cat("linear_cross_entropy: chunk_rows must be >= 0, got ", chunk_rows));
  const std::int64_t counted = detail::counted_targets("linear_cross_entropy", targets, sw[0]);
  const std::int64_t chunk =
      chunk_rows > 0 ? chunk_rows : detail::default_chunk_rows(sw[0], sizeof(T));
  return detail::record_op<detail::LinearCrossEntropyNode<T>>(
      {&h, &weight}, targets, counted, std::min(chunk, sh.rows()), weight.requires_grad());
}

}  // namespace remat
