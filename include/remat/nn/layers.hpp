#pragma once
/// @file
/// The basic layers: Linear, Embedding, LayerNorm, Dropout. Initializations follow PyTorch's
/// defaults unless a standard deviation is given.

#include <algorithm>
#include <cmath>

#include "remat/core/memory.hpp"
#include "remat/core/rng.hpp"
#include "remat/nn/module.hpp"
#include "remat/ops/dropout.hpp"
#include "remat/ops/embedding.hpp"
#include "remat/ops/layer_norm.hpp"
#include "remat/ops/linear.hpp"
#include "remat/ops/quantized_linear.hpp"

namespace remat::nn {

/// y = x W^T + b; weight (out, in), bias (out).
template <class T = float>
class Linear : public Module<T> {
 public:
  /// Weight and bias uniform in +-1/sqrt(in) (PyTorch), or weight normal(0, init_std) and bias 0.
  Linear(std::int64_t in, std::int64_t out, Rng& rng, bool with_bias = true, double init_std = 0) {
    if (in < 1 || out < 1)
      throw ShapeError(detail::cat("nn::Linear: sizes must be positive, got ", in, " -> ", out));
    const double bound = 1.0 / std::sqrt(double(in));
    weight = this->add_parameter("weight", init_std > 0
                                               ? rng.normal_tensor<T>({out, in}, 0.0, init_std)
                                               : rng.uniform_tensor<T>({out, in}, -bound, bound));
    if (with_bias) {
      bias =
          this->add_parameter("bias", init_std > 0 ? Tensor<T>::zeros({out})
                                                   : rng.uniform_tensor<T>({out}, -bound, bound));
    }
    this->set_kind("Linear", in, out);
  }

  /// A layer of these sizes whose weight (and bias) are allocated but hold no values yet, for a
  /// loader that fills them (hub/llama_load.hpp): no time spent drawing numbers it overwrites.
  static Linear uninitialized(std::int64_t in, std::int64_t out, bool with_bias = true) {
    if (in < 1 || out < 1)
      throw ShapeError(detail::cat("nn::Linear: sizes must be positive, got ", in, " -> ", out));
    return Linear(Tensor<T>(Shape{out, in}), with_bias ? Tensor<T>(Shape{out}) : Tensor<T>(), in,
                  out);
  }

  /// A layer whose weight is the frozen `weight` (a loader quantized it straight from a file:
  /// no float matrix is ever held) and whose bias, if defined, is a float Parameter.
  static Linear from_quantized(std::shared_ptr<const QuantizedWeight> weight, Tensor<T> b = {}) {
    if (!weight) throw ArgumentError("nn::Linear::from_quantized: no weight given");
    if (b.defined() && !(b.shape() == Shape{weight->rows()})) {
      throw ShapeError(detail::cat("nn::Linear::from_quantized: bias ", b.shape(),
                                   " does not fit a weight of shape ", weight->shape()));
    }
    Linear l(Tensor<T>(), std::move(b), weight->cols(), weight->rows());
    l.qweight_ = std::move(weight);
    return l;
  }

  /// The forward hook, if any, sees x and x W^T + b (Note [forward hooks]; LoRA adds to it).
  Var<T> operator()(const Var<T>& x) const { return this->hooked(x, product(x)); }

  /// Freezes the weight and stores it as `storage` (core/quantized.hpp): f32 only freezes it;
  /// bf16, int8 and nf4 replace the float weight, which leaves parameters() and is freed once
  /// no other handle holds it; the allocator's cache is emptied then (memory::release_cache), so
  /// that its bytes leave the process. The bias stays float and trainable. Once only: a
  /// quantized weight is not quantized again.
  void quantize(WeightStorage storage, bool double_quant = true) {
    if (qweight_) {
      throw UsageError(detail::cat("nn::Linear::quantize: the weight is already stored as ",
                                   to_string(qweight_->storage())));
    }
    weight.freeze();
    if (storage == WeightStorage::f32) return;
    qweight_ = std::make_shared<const QuantizedWeight>(
        QuantizedWeight::quantize(weight.value(), storage, double_quant));
    this->remove_parameter("weight");
    weight = Parameter<T>();
    // The float matrix freed goes back to the system, not to the allocator's cache: a model is
    // quantized once, and its float weights would stay resident for the whole run.
    memory::release_cache();
  }

  /// How the weight is stored.
  WeightStorage storage() const noexcept {
    return qweight_ ? qweight_->storage() : WeightStorage::f32;
  }
  /// The quantized weight (null while the weight is a float Parameter).
  const std::shared_ptr<const QuantizedWeight>& quantized_weight() const noexcept {
    return qweight_;
  }
  std::int64_t in_features() const { return qweight_ ? qweight_->cols() : weight.dim(1); }
  std::int64_t out_features() const { return qweight_ ? qweight_->rows() : weight.dim(0); }

  Parameter<T> weight, bias;

 private:
  Var<T> product(const Var<T>& x) const {
    if (qweight_) return bias.defined() ? linear(x, qweight_, bias) : linear(x, qweight_);
    return bias.defined() ? linear(x, weight, bias) : linear(x, weight);
  }

  /// A weight of `in` -> `out` (undefined: quantized storage comes next) and a bias, as given.
  Linear(Tensor<T> w, Tensor<T> b, std::int64_t in, std::int64_t out) {
    if (w.defined()) weight = this->add_parameter("weight", std::move(w));
    if (b.defined()) bias = this->add_parameter("bias", std::move(b));
    this->set_kind("Linear", in, out);
  }

  std::shared_ptr<const QuantizedWeight> qweight_;
};

/// Rows of a (num, dim) table picked by integer ids; normal(0, init_std) initialization.
template <class T = float>
class Embedding : public Module<T> {
 public:
  /// Rows drawn from normal(0, init_std); the row `padding_idx` (-1: none) is zeros, as
  /// torch.nn.Embedding makes it, and gets no gradient from the lookup (ops/embedding.hpp).
  Embedding(std::int64_t num, std::int64_t dim, Rng& rng, double init_std = 1.0,
            std::int64_t padding_idx = -1)
      : padding_idx_(checked_padding_idx(num, dim, padding_idx)) {
    Tensor<T> w = rng.normal_tensor<T>({num, dim}, 0.0, init_std);
    if (padding_idx >= 0 && w.has_data()) std::fill_n(w.data() + padding_idx * dim, dim, T(0));
    weight = this->add_parameter("weight", std::move(w));
  }

  /// A table of these sizes allocated but holding no values yet, for a loader that fills it.
  static Embedding uninitialized(std::int64_t num, std::int64_t dim,
                                 std::int64_t padding_idx = -1) {
    return Embedding(Tensor<T>(Shape{num, dim}), checked_padding_idx(num, dim, padding_idx));
  }

  Var<T> operator()(const Tensor<std::int32_t>& ids) const {
    return embedding(weight, ids, padding_idx_);
  }

  std::int64_t padding_idx() const noexcept { return padding_idx_; }

  Parameter<T> weight;

 private:
  Embedding(Tensor<T> w, std::int64_t padding_idx) : padding_idx_(padding_idx) {
    weight = this->add_parameter("weight", std::move(w));
  }

  static std::int64_t checked_padding_idx(std::int64_t num, std::int64_t dim,
                                          std::int64_t padding_idx) {
    if (num < 1 || dim < 1)
      throw ShapeError(detail::cat("nn::Embedding: sizes must be positive, got ", num, " x ", dim));
    if (padding_idx < -1 || padding_idx >= num) {
      throw ArgumentError(detail::cat("nn::Embedding: padding_idx must be in [0, ", num,
                                      ") or -1 (none), got ", padding_idx));
    }
    return padding_idx;
  }

  std::int64_t padding_idx_ = -1;
};

/// Layer normalization over the last axis, with a learned scale (ones) and shift (zeros).
template <class T = float>
class LayerNorm : public Module<T> {
 public:
  explicit LayerNorm(std::int64_t dim, double eps = 1e-5) : eps_(eps) {
    if (dim < 1) throw ShapeError(detail::cat("nn::LayerNorm: size must be positive, got ", dim));
    weight = this->add_parameter("weight", Tensor<T>::ones({dim}));
    bias = this->add_parameter("bias", Tensor<T>::zeros({dim}));
  }

  Var<T> operator()(const Var<T>& x) const { return layer_norm(x, weight, bias, T(eps_)); }

  Parameter<T> weight, bias;

 private:
  double eps_;
};

/// Dropout with probability p while training; the identity in evaluation.
template <class T = float>
class Dropout : public Module<T> {
 public:
  explicit Dropout(double p) : p_(p) {
    if (!(p >= 0.0 && p < 1.0))
      throw ArgumentError(detail::cat("nn::Dropout: p must be in [0, 1), got ", p));
  }

  Var<T> operator()(const Var<T>& x) const { return dropout(x, p_, this->training()); }
  double p() const noexcept { return p_; }

 private:
  double p_;
};

}  // namespace remat::nn
