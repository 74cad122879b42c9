#pragma once
/// @file
/// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, PyTorch's formulation:
/// p *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).

#include <cmath>

#include "remat/core/vector_kernels.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/optim/optimizer.hpp"

namespace remat::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

template <class T = float>
class AdamW final : public Optimizer<T> {
 public:
  AdamW(std::vector<Parameter<T>> params, AdamWOptions options = {})
      : Optimizer<T>(std::move(params), options.lr, "AdamW"), options_(options) {
    init();
  }
  /// Parameters in groups with their own weight decay and lr factor (optim/optimizer.hpp).
  AdamW(const std::vector<ParamGroup<T>>& groups, AdamWOptions options = {})
      : Optimizer<T>(groups, options.lr, "AdamW"), options_(options) {
    init();
  }

  const AdamWOptions& options() const noexcept { return options_; }
  /// First and second moment estimates of parameter i (undefined before its first update).
  Tensor<T>& first_moment(std::size_t i) { return m_.at(i); }
  Tensor<T>& second_moment(std::size_t i) { return v_.at(i); }
  /// Number of updates parameter i has received (the t of its bias correction).
  std::int64_t& updates(std::size_t i) { return updates_.at(i); }

  bool runs_shape_only() const noexcept override { return true; }
  std::vector<std::string> buffer_names() const override { return {"m", "v"}; }
  std::vector<std::string> counter_names() const override { return {"updates"}; }

 private:
  void init() {
    const AdamWOptions& options = options_;
    const bool ok = options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 &&
                    options.beta2 < 1 && options.eps > 0 && options.weight_decay >= 0;
    if (!ok) {
      throw ArgumentError(
          detail::cat("AdamW: need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0; got beta1 ",
                      options.beta1, ", beta2 ", options.beta2, ", eps ", options.eps,
                      ", weight_decay ", options.weight_decay));
    }
    m_.resize(this->parameters().size());
    v_.resize(this->parameters().size());
    updates_.assign(this->parameters().size(), 0);
  }

  void save_slot(std::size_t i, std::map<std::string, Tensor<T>>& buffers,
                 std::map<std::string, std::int64_t>& counters) const override {
    if (m_[i].defined()) buffers["m"] = m_[i].clone();
    if (v_[i].defined()) buffers["v"] = v_[i].clone();
    counters["updates"] = updates_[i];
  }
  std::string check_slot(const std::map<std::string, Tensor<T>>& buffers,
                         const std::map<std::string, std::int64_t>& counters) const override {
    // update() allocates both moments on a parameter's first update and counts every update.
    const bool moments = buffers.count("m") != 0;
    if (moments != (buffers.count("v") != 0))
      return "it has one of the moments m and v without the other";
    if (moments != (counters.at("updates") > 0)) {
      return detail::cat("its update count is ", counters.at("updates"), " but it has ",
                         moments ? "" : "no ", "moments");
    }
    return "";
  }
  void load_slot(std::size_t i, const std::map<std::string, Tensor<T>>& buffers,
                 const std::map<std::string, std::int64_t>& counters) override {
    const bool moments = buffers.count("m") != 0;
    m_[i] = moments ? buffers.at("m").clone() : Tensor<T>();
    v_[i] = moments ? buffers.at("v").clone() : Tensor<T>();
    updates_[i] = counters.at("updates");
  }

  void update(std::size_t i, Tensor<T>& value, const Tensor<T>& grad) override {
    if (!m_[i].defined()) {
      m_[i] = Tensor<T>::zeros(value.shape());
      v_[i] = Tensor<T>::zeros(value.shape());
    }
    const double t = static_cast<double>(++updates_[i]);  // per parameter, as in PyTorch
    const T lr = T(this->lr_of(i));
    const T b1 = T(options_.beta1), b2 = T(options_.beta2);
    const T c1 = T(1.0 / (1.0 - std::pow(options_.beta1, t)));
    const T c2 = T(1.0 / (1.0 - std::pow(options_.beta2, t)));
    const T decay = T(1) - lr * T(this->weight_decay_of(i, options_.weight_decay)),
            eps = T(options_.eps);
    // One fused pass per chunk: the update is memory-bound, so each array is read once.
    detail::for_chunks(value.numel(), [&](std::int64_t s, std::int64_t e) {
      if constexpr (std::is_same_v<T,
                                   float>) {  // dispatched by instruction set (Note [ISA dispatch])
        const detail::AdamWConstants k{b1, b2, lr, c1, c2, decay, eps};
        detail::vec::adamw_update(value.data() + s, m_[i].data() + s, v_[i].data() + s,
                                  grad.data() + s, e - s, k);
        return;
      }
      auto p = detail::view(value, s, e);
      auto m = detail::view(m_[i], s, e);
      auto v = detail::view(v_[i], s, e);
      const auto g = detail::view(grad, s, e);
      m = b1 * m + (T(1) - b1) * g;
      v = b2 * v + (T(1) - b2) * g.square();
      p = p * decay - lr * (m * c1) / ((v * c2).sqrt() + eps);
    });
  }

  AdamWOptions options_;
  std::vector<Tensor<T>> m_, v_;
  std::vector<std::int64_t> updates_;
};

}  // namespace remat::optim
