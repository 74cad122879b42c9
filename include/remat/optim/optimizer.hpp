#pragma once
/// @file
/// Optimizer: the base of SGD and AdamW. It holds the parameters it updates and their state
/// (allocated through the counting allocator, like every tensor), and checks it is used right.

#include <string>
#include <unordered_set>
#include <vector>

#include "remat/core/grad_mode.hpp"
#include "remat/core/parameter.hpp"

namespace remat::optim {

template <class T = float>
class Optimizer {
 public:
  explicit Optimizer(std::vector<Parameter<T>> params, double lr, const char* name)
      : params_(std::move(params)), lr_(lr), name_(name) {
    std::unordered_set<const void*> seen;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].defined()) {
        throw UsageError(detail::cat(name_, ": parameter ", i, " is undefined"));
      }
      if (!seen.insert(params_[i].identity()).second) {
        throw UsageError(detail::cat(name_, ": parameter ", i, " (shape ", params_[i].shape(),
                                     ") is listed twice; each parameter must appear once"));
      }
    }
    check_lr(lr);
  }
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Updates every parameter that has a gradient. Throws when none has one (backward() was not
  /// called, or every parameter is frozen): a silent no-op step would hide the bug.
  void step() {
    NoGradGuard no_grad;
    bool any = false;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Parameter<T>& p = params_[i];
      if (p.frozen() || !p.grad().defined()) continue;
      if (!(p.grad().shape() == p.shape())) {
        throw ShapeError(detail::cat(name_, ": parameter ", i, " has shape ", p.shape(), " but its gradient has shape ",
                                     p.grad().shape()));
      }
      update(i, p.data(), p.grad());
      any = true;
    }
    if (!any) {
      throw UsageError(detail::cat(name_, ".step(): none of the ", params_.size(),
                                   " parameters has a gradient; call tape.backward(loss) before step(), "
                                   "and check that the loss uses this optimizer's parameters"));
    }
    ++steps_;
  }

  /// Drops every parameter's gradient (the next backward allocates fresh ones).
  void zero_grad() noexcept {
    for (Parameter<T>& p : params_) p.zero_grad();
  }

  double lr() const noexcept { return lr_; }
  void set_lr(double lr) {
    check_lr(lr);
    lr_ = lr;
  }
  /// Number of completed step() calls.
  std::int64_t steps() const noexcept { return steps_; }
  void set_steps(std::int64_t steps) noexcept { steps_ = steps; }
  const std::vector<Parameter<T>>& parameters() const noexcept { return params_; }

 protected:
  /// Updates parameter i in place given its gradient.
  virtual void update(std::size_t i, Tensor<T>& value, const Tensor<T>& grad) = 0;

  const char* name() const noexcept { return name_; }

 private:
  void check_lr(double lr) const {
    if (!(lr >= 0.0)) throw UsageError(detail::cat(name_, ": learning rate must be >= 0, got ", lr));
  }

  std::vector<Parameter<T>> params_;
  double lr_;
  const char* name_;
  std::int64_t steps_ = 0;
};

}  // namespace remat::optim
