#pragma once
/// @file
/// cross_entropy: mean negative log-likelihood of integer class targets under softmax(logits).
/// A target of kIgnoreTarget (-100, PyTorch's and Hugging Face's ignore_index) takes its row out
/// of the loss: the mean is over the other rows, and the row's gradient is zero. That is how a
/// loss mask is given (prompt tokens, padding, a packed sequence's boundaries).

#include <algorithm>
#include <cmath>
#include <limits>
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
/// row's log-sum-exp `lse` (out == x allowed).
template <class T>
void to_row_logits_grad(const T* x, T* out, std::int64_t n, T lse, std::int32_t target, T g) {
  exp_shifted_row(x, out, n, lse, g);
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

// Note [online loss head]
// linear_cross_entropy never holds a row's V logits: it computes them a tile at a time, a chunk
// of rows against a block of the vocabulary, and folds each block into the row's running max m
// and running sum s of exp(logit - m), rescaling s when a block raises m (the online softmax of
// flash attention, over a vocabulary instead of keys). A frozen head's input gradient (Note
// [fused loss head]) is folded the same way: u = sum over v of exp(logit_v - m) W_v, rescaled
// with s, and made after the last block as (u / s - W_target) * g. So a chunk reads the whole
// (V, C) weight once, for both of its GEMMs while the block is in cache, whatever its rows; and
// the memory is the tile's, not rows x V, so one chunk can hold a step's rows. (Chunks that held
// their rows' whole logits read the head twice each: docs/design.md has the figures.)

/// The vocabulary block of linear_cross_entropy's tiles (Note [online loss head]): at most 2,048
/// rows of W, fewer for heads wider than 2,048 so that gemm_bf16's packed copy of a block stays
/// within 8 MiB (Note [BF16 GEMM packing]; default_chunk_rows bounds the rows' copy the same way).
/// It depends on the head's shape only, never on the chunk or the dtype, so a row's sums run in the
/// same order whatever the chunk.
inline std::int64_t loss_vocab_block(std::int64_t vocab, std::int64_t width) {
  const std::int64_t packed = std::max<std::int64_t>(32, (std::int64_t{4} << 20) / width / 32 * 32);
  return std::min<std::int64_t>({vocab, 2048, packed});
}

/// linear_cross_entropy's default chunk: the rows whose tile against a vocabulary block fills
/// 8 MiB (1,024 rows against 2,048 tokens in float), and at most the rows whose bfloat16 copy,
/// which gemm_bf16 packs whole as the block does W's, stays within 8 MiB (4,681 at width 896),
/// at least one.
inline std::int64_t default_chunk_rows(std::int64_t vocab, std::int64_t width,
                                       std::size_t element_bytes) {
  const auto tile_row = static_cast<std::int64_t>(loss_vocab_block(vocab, width) * element_bytes);
  return std::max<std::int64_t>(
      1, std::min((std::int64_t{8} << 20) / tile_row, (std::int64_t{4} << 20) / width));
}

/// Folds a block of a row's logits x (n values, overwritten by exp(x - m)) into the row's running
/// max m and sum s of exp(logit - m) (Note [online loss head]). When the block raises m, s and the
/// fused gradient's row u (c values; null when there is none) are rescaled to the new max first.
template <class T>
void fold_logits_block(T* x, std::int64_t n, T& m, T& s, T* u, std::int64_t c) {
  const T block_max = ConstArrayView<T>(x, n).maxCoeff();
  if (block_max > m) {
    const T rescale = std::exp(m - block_max);  // 0 on a row's first block, where m = -inf
    s *= rescale;
    if (u) ArrayView<T>(u, c) *= rescale;
    m = block_max;
  }
  if (m == -std::numeric_limits<T>::infinity()) {  // every logit so far -inf: exp(-inf - m)
    std::fill_n(x, n, T(0));                       // would be NaN, where the row's max is not
    return;
  }
  exp_shifted_row(x, x, n, m, T(1));
  s += ConstArrayView<T>(x, n).sum();
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
  // a trained head's BF16 GEMMs read h's bfloat16 copy (Note [BF16 saves]): they round h to
  // bfloat16 anyway, so a float h kept for them would hold twice the bytes for the same products
  bool reads_copy(int slot) const noexcept override {
    return weight_trained_ && slot == 0 && bf16_gemms();
  }

  // h: (N, C), W: (V, C) -> mean over counted rows of lse(h W^T) - (h W^T)[target], a tile at a
  // time (Note [online loss head]).
  // Note [fused loss head]: when W is not trained (LoRA, a frozen head), the gradient of h for a
  // unit dloss is computed here, from the tiles just made, and saved in place of h, W and the
  // log-sum-exps: two GEMMs over the (V, C) weight instead of three (the backward pass would
  // recompute the logits), for the same (N, C) kept. A trained W needs each tile's logits
  // gradient again for dW, so it saves h, W and lse and recomputes them in backward.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const Tensor<T>& h = in[0];
    const Tensor<T>& w = in[1];
    const std::int64_t n = h.shape().rows(), c = h.shape().last(), v = w.dim(0);
    const bool fused = this->saving && !weight_trained_;
    Tensor<T> lse = Tensor<T>::zeros(Shape{n});  // each row's running max, then its log-sum-exp
    Tensor<T> sums = Tensor<T>::zeros(Shape{n});
    Tensor<T> unit_gh = fused ? Tensor<T>::zeros(h.shape()) : Tensor<T>();
    Tensor<T> tile = new_tile(n, v, c);
    // each counted row's loss: minus its target's logit, then plus its log-sum-exp
    std::vector<double> losses(shape_only() ? 0 : static_cast<std::size_t>(n));
    if (!shape_only()) std::fill_n(lse.data(), n, -std::numeric_limits<T>::infinity());
    if (weight_trained_) {  // first, so that the tiles are made from h's copy, as backward's are
      if (bf16_gemms())
        this->save(0, h);
      else
        this->save_exact(0, h);  // float GEMMs (the convert kernel) read h as it is
      this->save_exact(1, w);
    }
    for (std::int64_t r0 = 0; r0 < n && !shape_only(); r0 += chunk_) {
      const std::int64_t rows = std::min(chunk_, n - r0);
      T* u = fused ? unit_gh.data() + r0 * c : nullptr;
      for_vocab_blocks(v, c, [&](std::int64_t v0, std::int64_t count) {
        tile_logits(h_rows(h, r0, c), rows, w.data() + v0 * c, count, c, tile.data());
        for_rows(rows, count, [&](std::int64_t a, std::int64_t b) {
          for (std::int64_t r = a; r < b; ++r) {
            T* x = tile.data() + r * count;
            const std::int32_t t = targets_[r0 + r];
            if (t == kIgnoreTarget) {
              std::fill_n(x, count, T(0));  // adds nothing to the fused gradient
              continue;
            }
            if (t >= v0 && t < v0 + count) losses[r0 + r] = -static_cast<double>(x[t - v0]);
            fold_logits_block(x, count, lse[r0 + r], sums[r0 + r], u ? u + r * c : nullptr, c);
          }
        });
        if (fused) {
          gemm_in<T>(bf16_gemms(), false, false, rows, c, count, T(1), tile.data(), count,
                     w.data() + v0 * c, c, T(1), u, c);
        }
      });
      finish_rows(r0, rows, w, lse, sums, losses, u, c);
    }
    double total = 0;
    for (double l : losses) total += l;
    if (fused) this->save_exact(0, unit_gh);
    if (weight_trained_) this->save_exact(2, lse);
    return Tensor<T>::scalar(counted_ > 0 ? static_cast<T>(total / static_cast<double>(counted_))
                                          : T(0));
  }

  // fused: dh = dloss * the unit gradient forward saved. Otherwise per tile:
  // dlogits = (softmax - onehot) dloss / counted rows (0 on ignored rows); dh += dlogits W_block;
  // dW_block += dlogits^T h
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
    const Tensor<T>& h = this->saved(0);  // undefined when backward reads its copy
    const Tensor<T>& w = this->saved(1);
    const Tensor<T>& lse = this->saved(2);
    const Shape sh = this->saved_shape(0);
    const std::int64_t n = sh.rows(), c = sh.last(), v = w.dim(0);
    const auto gh = grads.target(0, sh);
    const auto gw = grads.target(1, w.shape());
    Tensor<T> tile = new_tile(n, v, c);
    for (std::int64_t r0 = 0; r0 < n && !shape_only(); r0 += chunk_) {
      const std::int64_t rows = std::min(chunk_, n - r0);
      const GemmOperand<T> hc = h_rows(h, r0, c);
      for_vocab_blocks(v, c, [&](std::int64_t v0, std::int64_t count) {
        const T* wb = w.data() + v0 * c;
        tile_logits(hc, rows, wb, count, c, tile.data());
        to_logits_grad(tile.data(), r0, rows, v0, count, lse, per_counted_row(gy[0], counted_));
        if (gh.dst) {
          const bool first = v0 == 0 && gh.overwrite;
          gemm_in<T>(bf16_gemms(), false, false, rows, c, count, T(1), tile.data(), count, wb, c,
                     first ? T(0) : T(1), gh.dst->data() + r0 * c, c);
        }
        if (gw.dst) {
          const bool first = r0 == 0 && gw.overwrite;
          gemm_in<T>(bf16_gemms(), true, false, count, c, rows, T(1), {tile.data(), count}, hc,
                     first ? T(0) : T(1), gw.dst->data() + v0 * c, c);
        }
      });
    }
  }

 private:
  /// Whether the head's GEMMs run in bfloat16: under Precision::bf16 on a tile kernel, as
  /// attention's products (AttentionNode::bf16_gemms: on the convert kernel the copies would
  /// cost more than they save). Its softmax, the loss and their statistics stay float.
  bool bf16_gemms() const noexcept {
    return std::is_same_v<T, float> && this->bf16 && bf16_kernel() != Bf16Kernel::convert;
  }

  /// The tile of logits a chunk of rows makes against a vocabulary block (counted as any tensor).
  Tensor<T> new_tile(std::int64_t n, std::int64_t v, std::int64_t c) const {
    return Tensor<T>(Shape{std::min(chunk_, n), loss_vocab_block(v, c)});
  }

  /// Calls f(v0, count) over the vocabulary in blocks of loss_vocab_block rows of W.
  template <class F>
  static void for_vocab_blocks(std::int64_t v, std::int64_t c, F&& f) {
    const std::int64_t block = loss_vocab_block(v, c);
    for (std::int64_t v0 = 0; v0 < v; v0 += block) f(v0, std::min(block, v - v0));
  }

  /// h's rows from r0 on as a GEMM operand: `h`, or the bfloat16 copy a trained head saved of it
  /// (then `h` may be undefined).
  GemmOperand<T> h_rows(const Tensor<T>& h, std::int64_t r0, std::int64_t c) const noexcept {
    return GemmOperand<T>{h.data(), c, this->saved_copy(0).data()}.at(r0 * c);
  }

  /// A tile of logits (rows x count, packed) = h W_block^T, h's rows C apart.
  void tile_logits(const GemmOperand<T>& h, std::int64_t rows, const T* wb, std::int64_t count,
                   std::int64_t c, T* tile) const {
    gemm_in<T>(bf16_gemms(), false, true, rows, count, c, T(1), h, {wb, c}, T(0), tile, count);
  }

  // After a chunk's last block: each counted row's log-sum-exp and loss, and its fused unit
  // gradient (u / s - W_target) * g from the sum u folded over the blocks; 0 on ignored rows.
  void finish_rows(std::int64_t r0, std::int64_t rows, const Tensor<T>& w, Tensor<T>& lse,
                   const Tensor<T>& sums, std::vector<double>& losses, T* u, std::int64_t c) const {
    const T g = per_counted_row(T(1), counted_);
    for_rows(rows, c, [&](std::int64_t a, std::int64_t b) {
      for (std::int64_t r = a; r < b; ++r) {
        const std::int32_t t = targets_[r0 + r];
        if (t == kIgnoreTarget) {
          lse[r0 + r] = T(0);
          continue;  // u's row stayed 0: its tiles were
        }
        lse[r0 + r] += std::log(sums[r0 + r]);
        losses[r0 + r] += static_cast<double>(lse[r0 + r]);
        if (u) {
          ArrayView<T> ur(u + r * c, c);
          ur = (ur / sums[r0 + r] - ConstArrayView<T>(w.data() + t * c, c)) * g;
        }
      }
    });
  }

  // Turns a tile of logits (rows r0 .. r0 + rows, vocabulary v0 .. v0 + count) into their
  // gradient in place: (softmax - onehot(target)) * g on counted rows, 0 on ignored ones.
  void to_logits_grad(T* tile, std::int64_t r0, std::int64_t rows, std::int64_t v0,
                      std::int64_t count, const Tensor<T>& lse, T g) const {
    for_rows(rows, count, [&](std::int64_t a, std::int64_t b) {
      for (std::int64_t r = a; r < b; ++r) {
        T* x = tile + r * count;
        const std::int32_t t = targets_[r0 + r];
        if (t == kIgnoreTarget) {
          std::fill_n(x, count, T(0));
          continue;
        }
        exp_shifted_row(x, x, count, lse[r0 + r], g);
        if (t >= v0 && t < v0 + count) x[t - v0] -= g;
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
/// or their gradient: a tile at a time, `chunk_rows` rows against a block of the vocabulary
/// (default: detail::default_chunk_rows, the rows of an 8 MiB tile against a
/// detail::loss_vocab_block; Note [online loss head]). With a weight that is not trained (a
/// frozen head, LoRA), forward also computes h's gradient and the pass costs the plain path's
/// two GEMMs; with a trained weight, backward recomputes each tile, one GEMM of the logits' size
/// more (Note [fused loss head]). h is (..., C), weight (V, C) with C >= 1, targets (...) in
/// [0, V) or kIgnoreTarget.
template <class T>
Var<T> linear_cross_entropy(const Var<T>& h, const std::type_identity_t<Var<T>>& weight,
                            const Tensor<std::int32_t>& targets, std::int64_t chunk_rows = 0) {
  if (!targets.defined())
    throw ArgumentError("linear_cross_entropy: the targets tensor is undefined");
  const Shape& sh = h.shape();
  const Shape& sw = weight.shape();
  if (sh.rank() < 1 || sw.rank() != 2 || sh[-1] != sw[1] || sw[0] < 1 || sw[1] < 1 ||
      targets.numel() != sh.rows() || sh.rows() == 0) {
    throw ShapeError(detail::cat(
        "linear_cross_entropy: hidden ", sh, ", weight ", sw, " and targets ", targets.shape(),
        " do not fit; need hidden (..., C), weight (V, C), C >= 1, and one target per row of "
        "hidden"));
  }
  if (chunk_rows < 0)
    throw ArgumentError(
        detail::cat("linear_cross_entropy: chunk_rows must be >= 0, got ", chunk_rows));
  const std::int64_t counted = detail::counted_targets("linear_cross_entropy", targets, sw[0]);
  const std::int64_t chunk =
      chunk_rows > 0 ? chunk_rows : detail::default_chunk_rows(sw[0], sw[1], sizeof(T));
  return detail::record_op<detail::LinearCrossEntropyNode<T>>(
      {&h, &weight}, targets, counted, std::min(chunk, sh.rows()), weight.requires_grad());
}

}  // namespace remat
