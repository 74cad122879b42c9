#pragma once
/// @file
/// SGD with momentum and (coupled, L2) weight decay, PyTorch's formulation:
/// g = grad + wd * p; v = momentum * v + g (v = g on the first step); p -= lr * v.

#include "remat/core/elementwise.hpp"
#include "remat/optim/optimizer.hpp"

namespace remat::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
};

template <class T = float>
class SGD final : public Optimizer<T> {
 public:
  SGD(std::vector<Parameter<T>> params, SGDOptions options = {})
      : Optimizer<T>(std::move(params), options.lr, "SGD"),
        options_(options),
        velocity_(this->parameters().size()) {
    check_options();
  }
  /// Parameters in groups with their own weight decay and lr factor (optim/optimizer.hpp).
  SGD(const std::vector<ParamGroup<T>>& groups, SGDOptions options = {})
      : Optimizer<T>(groups, options.lr, "SGD"),
        options_(options),
        velocity_(this->parameters().size()) {
    check_options();
  }

 private:
  void check_options() const {
    const SGDOptions& options = options_;
    if (!(options.momentum >= 0.0) || !(options.weight_decay >= 0.0)) {
      throw ArgumentError(detail::cat("SGD: momentum and weight_decay must be >= 0, got ",
                                      options.momentum, " and ", options.weight_decay));
    }
  }

 public:
  const SGDOptions& options() const noexcept { return options_; }
  /// The momentum buffer of parameter i (undefined before its first update, or without momentum).
  Tensor<T>& velocity(std::size_t i) { return velocity_.at(i); }

  bool runs_shape_only() const noexcept override { return true; }
  std::vector<std::string> buffer_names() const override { return {"velocity"}; }
  std::vector<std::string> counter_names() const override { return {}; }

 private:
  void save_slot(std::size_t i, std::map<std::string, Tensor<T>>& buffers,
                 std::map<std::string, std::int64_t>&) const override {
    if (velocity_[i].defined()) buffers["velocity"] = velocity_[i].clone();
  }
  std::string check_slot(const std::map<std::string, Tensor<T>>& buffers,
                         const std::map<std::string, std::int64_t>&) const override {
    // Without momentum the velocity is never read: one in the state means a differently set up run.
    if (options_.momentum == 0.0 && buffers.count("velocity"))
      return "the state has a velocity, but this SGD has no momentum";
    return "";
  }
  void load_slot(std::size_t i, const std::map<std::string, Tensor<T>>& buffers,
                 const std::map<std::string, std::int64_t>&) override {
    const auto it = buffers.find("velocity");
    velocity_[i] = it == buffers.end() ? Tensor<T>() : it->second.clone();
  }

  void update(std::size_t i, Tensor<T>& value, const Tensor<T>& grad) override {
    const T lr = T(this->lr_of(i)), wd = T(this->weight_decay_of(i, options_.weight_decay)),
            mu = T(options_.momentum);
    Tensor<T>& v = velocity_[i];
    const bool first = !v.defined();
    if (mu != T(0) && first) v = Tensor<T>(value.shape());
    detail::for_chunks(value.numel(), [&](std::int64_t s, std::int64_t e) {
      auto p = detail::view(value, s, e);
      const auto g = detail::view(grad, s, e);
      if (mu == T(0)) {
        p -= lr * (g + wd * p);
        return;
      }
      auto vel = detail::view(v, s, e);
      if (first)
        vel = g + wd * p;
      else
        vel = mu * vel + g + wd * p;
      p -= lr * vel;
    });
  }

  SGDOptions options_;
  std::vector<Tensor<T>> velocity_;
};

}  // namespace remat::optim
