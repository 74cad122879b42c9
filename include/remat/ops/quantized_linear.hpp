#pragma once
/// @file
/// linear with a frozen quantized weight: y = x deq(W)^T + b, W a QuantizedWeight (BF16, INT8 or
/// NF4, core/quantized.hpp). A large weight is never dequantized whole: the GEMMs run over panels
/// of kQuantizedPanel weight values (a block of W's rows), each dequantized once into a float
/// scratch of about 8 MiB (counted by the allocator; more for weights wider than 8,192, whose
/// panels keep 256 rows) and multiplied at once by detail::gemm. Under Precision::bf16 there is no
/// float panel (but with the convert kernel, which multiplies float copies): gemm_bf16 makes W's
/// rows in bfloat16 from their storage as it packs them (Bf16Rows), one GEMM for the whole weight.
/// Backward gives the input's gradient (dx = dy deq(W), panel by panel again) and the bias's; the
/// weight is frozen: no gradient, no optimizer state. Dequantization is deterministic, so a
/// checkpoint replay reproduces the forward bit for bit.

#include <algorithm>
#include <memory>
#include <type_traits>

#include "remat/core/quantized.hpp"
#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/gemm_bf16.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {

/// Weight values dequantized at once: 2^21 (8 MiB of float scratch, the loss head's tile size),
/// 2,340 rows of Qwen2.5-0.5B's gate_proj (896 wide). Smaller panels cost threads: a panel's
/// backward adds dy[:, panel] W[panel] into the whole input gradient with k = the panel's rows.
/// With 256-row panels (2^17 values) two threads ran that weight's forward and backward at 512
/// rows in 34.0 ms against 27.8 ms with these, and the 0.5B QLoRA step took 6.14 s against 5.53 s
/// (1.63x one thread's time, now 1.79x); one thread gains 3 %, weights 4,864 and 6,144 wide lose
/// 0 to 3 % (quantized_bench --batch 512, medians of 3; docs/benchmarks.md). Weights of fewer
/// values are dequantized whole ...
inline constexpr std::int64_t kQuantizedPanel = std::int64_t(1) << 21;
/// ... and a panel holds at least this many rows: a weight wider than 8,192 would otherwise have
/// panels of a few rows (26 of a 2^17-value panel of a 4,864-wide weight made forward GEMMs 26
/// outputs wide and a backward of rank-26 products, 2.1 times slower at 512 rows).
inline constexpr std::int64_t kQuantizedPanelRows = 256;

namespace detail {

/// Rows of an (out, in) quantized weight dequantized at once: kQuantizedPanel values, at least
/// kQuantizedPanelRows rows, at most the weight's. The estimator prices the same scratch.
inline std::int64_t quantized_panel_rows(std::int64_t in, std::int64_t out) {
  return std::clamp<std::int64_t>(std::max(kQuantizedPanel / in, kQuantizedPanelRows), 1, out);
}

template <class T>
class QuantizedLinearNode final : public Node<T> {
 public:
  // panel_rows: W's rows dequantized at once (quantized_panel_rows; tests choose smaller ones)
  QuantizedLinearNode(std::shared_ptr<const QuantizedWeight> w, std::int64_t rows, bool bias,
                      Shape out_shape, std::int64_t panel_rows)
      : w_(std::move(w)),
        rows_(rows),
        in_(w_->cols()),
        out_(w_->rows()),
        panel_rows_(panel_rows),
        bias_(bias),
        out_shape_(out_shape) {
    REMAT_ASSERT(panel_rows_ >= 1, "quantized_linear: panels of ", panel_rows_, " rows");
  }
  const OpType& op_type() const noexcept override { return op::quantized_linear; }
  bool runs_shape_only() const noexcept override { return true; }
  // The weight is frozen, so backward needs no value of x, only its shape: nothing is saved
  // (its input was saved for its shape once, a whole activation when no other op kept it,
  // such as down_proj's input without an adapter), and a kept output resaves nothing.
  bool can_resave() const noexcept override { return true; }
  void resave(typename Node<T>::Inputs, const Tensor<T>&) override {}
  double forward_flops(typename Node<T>::Inputs, const Tensor<T>&) const override {
    return 2.0 * static_cast<double>(rows_) * static_cast<double>(in_) * static_cast<double>(out_);
  }

  // x: (rows, in), W: (out, in) quantized, b: (out) -> (rows, out); one GEMM per panel of W's rows
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> y(out_shape_);
    if (bias_ && !shape_only()) fill_rows(rows_, out_, in[1].data(), y.data(), out_);
    if constexpr (std::is_same_v<T, float>) {
      if (feeds_bf16_gemm()) {  // one GEMM, W's rows made in bfloat16 as it packs them
        gemm_bf16(false, true, rows_, out_, in_, 1.0f, in[0].data(), in_, weight_rows(),
                  bias_ ? 1.0f : 0.0f, y.data(), out_);
        return y;
      }
    }
    Tensor<T> panel = scratch();
    if (shape_only()) return y;  // once the scratch is made, as a real run makes it
    for_panels([&](std::int64_t o0, std::int64_t o1) {  // y[:, o0:o1] (+)= x W[o0:o1]^T
      dequantize(o0, o1, panel);
      gemm_in<T>(this->bf16, false, true, rows_, o1 - o0, in_, T(1), in[0].data(), in_,
                 panel.data(), in_, bias_ ? T(1) : T(0), y.data() + o0, out_);
    });
    return y;
  }

  // dx = dy deq(W) = sum over panels of dy[:, o0:o1] W[o0:o1]; db = column sums of dy
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    if (grads.needs(0) && feeds_bf16_gemm()) {
      grads.add_with(0, out_shape_.with_last(in_), [&](Tensor<T>& gx, bool overwrite) {
        if constexpr (std::is_same_v<T, float>) {
          gemm_bf16(false, false, rows_, in_, out_, 1.0f, gy.data(), out_, weight_rows(),
                    overwrite ? 0.0f : 1.0f, gx.data(), in_);
        }
      });
    } else if (grads.needs(0)) {
      // made outside the write, which a shape-only run skips; live as long as in the write
      Tensor<T> panel = scratch();
      grads.add_with(0, out_shape_.with_last(in_), [&](Tensor<T>& gx, bool overwrite) {
        bool first = true;
        for_panels([&](std::int64_t o0, std::int64_t o1) {
          dequantize(o0, o1, panel);
          gemm_in<T>(this->bf16, false, false, rows_, in_, o1 - o0, T(1), gy.data() + o0, out_,
                     panel.data(), in_, first && overwrite ? T(0) : T(1), gx.data(), in_);
          first = false;
        });
      });
    }
    if (bias_) {
      grads.add_with(1, Shape{out_}, [&](Tensor<T>& gb, bool overwrite) {
        sum_rows_into(gb.data(), rows_, out_, overwrite,
                      [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
                        return view(gy, r * out_ + c0, r * out_ + c1);
                      });
      });
    }
  }

 private:
  // Under Precision::bf16 the weight feeds gemm_bf16's tile kernels directly: no float panel,
  // one GEMM for the whole weight (its packing, outside the count, holds 2 bytes a weight
  // value). The convert kernel (CPUs without BF16 instructions) multiplies float copies, so
  // there the panels stay: a float copy of the whole weight is what they avoid.
  bool feeds_bf16_gemm() const noexcept {
    return std::is_same_v<T, float> && this->bf16 && bf16_kernel() != Bf16Kernel::convert;
  }
  Bf16Rows weight_rows() const {
    return {out_, in_, [w = w_.get()](std::int64_t r0, std::int64_t r1, std::uint16_t* out) {
              w->dequantize_rows_bf16(r0, r1, out);
            }};
  }
  Tensor<T> scratch() const { return Tensor<T>({panel_rows_, in_}); }
  // W's rows [o0, o1) into the panel, split across remat's threads: decoded on one thread, they
  // would leave the others idle between GEMMs, a serial share of every quantized step.
  void dequantize(std::int64_t o0, std::int64_t o1, Tensor<T>& panel) const {
    parallel_for(o1 - o0, std::max<std::int64_t>(1, kElementwiseGrain / in_),
                 [&](std::int64_t a, std::int64_t b) {
                   w_->dequantize_rows(o0 + a, o0 + b, panel.data() + a * in_);
                 });
  }
  template <class Fn>
  void for_panels(Fn&& fn) const {
    for (std::int64_t o0 = 0; o0 < out_; o0 += panel_rows_)
      fn(o0, std::min(out_, o0 + panel_rows_));
  }

  std::shared_ptr<const QuantizedWeight> w_;
  std::int64_t rows_, in_, out_, panel_rows_;
  bool bias_;
  Shape out_shape_;
};

inline void check_quantized_linear(const Shape& x, const QuantizedWeight& w, const Shape* b) {
  if (x.rank() < 1 || x[-1] != w.cols()) {
    throw ShapeError(
        cat("quantized_linear: input ", x, " and ", to_string(w.storage()), " weight ", w.shape(),
            " do not fit; the weight must be (out, in) with in equal to the input's last axis"));
  }
  if (b && !(b->rank() == 1 && (*b)[0] == w.rows())) {
    throw ShapeError(cat("quantized_linear: bias ", *b, " does not fit weight ", w.shape(),
                         "; it must be (", w.rows(), ",)"));
  }
}

}  // namespace detail

/// x deq(W)^T + b with a frozen quantized weight: x is (..., in), weight (out, in), bias (out).
/// The node shares `weight` (no copy).
template <class T>
Var<T> linear(const Var<T>& x, std::shared_ptr<const QuantizedWeight> weight,
              const std::type_identity_t<Var<T>>& bias) {
  if (!weight) throw ArgumentError("quantized_linear: null weight");
  const Shape sb = bias.shape();
  detail::check_quantized_linear(x.shape(), *weight, &sb);
  const std::int64_t out = weight->rows();
  return detail::record_op<detail::QuantizedLinearNode<T>>(
      {&x, &bias}, std::move(weight), x.shape().rows(), true, x.shape().with_last(out),
      detail::quantized_panel_rows(x.shape()[-1], out));
}

/// x deq(W)^T without a bias.
template <class T>
Var<T> linear(const Var<T>& x, std::shared_ptr<const QuantizedWeight> weight) {
  if (!weight) throw ArgumentError("quantized_linear: null weight");
  detail::check_quantized_linear(x.shape(), *weight, nullptr);
  const std::int64_t out = weight->rows();
  return detail::record_op<detail::QuantizedLinearNode<T>>(
      {&x}, std::move(weight), x.shape().rows(), false, x.shape().with_last(out),
      detail::quantized_panel_rows(x.shape()[-1], out));
}

}  // namespace remat
