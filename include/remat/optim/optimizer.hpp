#pragma once
/// @file
/// Optimizer: the base of SGD and AdamW. It holds the parameters it updates and their state
/// (allocated through the counting allocator, like every tensor), checks it is used right, and
/// hands that state out and takes it back (state() / load_state()) so that a run can be saved and
/// resumed exactly, whatever the optimizer.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "remat/core/grad_mode.hpp"
#include "remat/core/parameter.hpp"

namespace remat::optim {

/// Everything an optimizer carries from one step to the next, as plain values: restoring it into
/// an optimizer of the same kind over parameters of the same shapes makes the next steps
/// bitwise the same as the original's.
template <class T = float>
struct OptimizerState {
  /// The optimizer's name ("SGD", "AdamW"): state only loads into the same kind.
  std::string optimizer;
  std::int64_t steps = 0;
  double lr = 0.0;
  /// Per parameter, in the optimizer's order: its buffers by name (SGD: "velocity"; AdamW: "m",
  /// "v"), each of the parameter's shape; a buffer not allocated yet is absent.
  std::vector<std::map<std::string, Tensor<T>>> buffers;
  /// Per parameter: its integer counters by name (AdamW: "updates"); every counter is present.
  std::vector<std::map<std::string, std::int64_t>> counters;
};

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
  /// "SGD", "AdamW", ...
  const char* name() const noexcept { return name_; }

  /// The names of the per-parameter buffers and counters state() reports.
  virtual std::vector<std::string> buffer_names() const = 0;
  virtual std::vector<std::string> counter_names() const = 0;

  /// A copy of the optimizer's state (buffers are cloned: later steps do not change it).
  OptimizerState<T> state() const {
    OptimizerState<T> s{name_, steps_, lr_, {}, {}};
    s.buffers.resize(params_.size());
    s.counters.resize(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) save_slot(i, s.buffers[i], s.counters[i]);
    return s;
  }

  /// Throws a UsageError naming the first thing in `s` that does not fit this optimizer: another
  /// optimizer's state, another number of parameters, a buffer or counter it does not know or of
  /// the wrong shape, a negative count, or buffers and counters that contradict each other.
  void check_state(const OptimizerState<T>& s) const {
    const auto bad = [&](const std::string& why) { throw UsageError(detail::cat(name_, ".load_state: ", why)); };
    if (s.optimizer != name_) bad(detail::cat("the state is of ", s.optimizer.empty() ? "no optimizer" : s.optimizer, ", not of ", name_));
    if (s.steps < 0) bad(detail::cat("negative step count ", s.steps));
    if (!(s.lr >= 0.0)) bad(detail::cat("learning rate must be >= 0, got ", s.lr));
    if (s.buffers.size() != params_.size() || s.counters.size() != params_.size()) {
      bad(detail::cat("the state is for ", s.buffers.size(), " parameters (", s.counters.size(), " with counters), this optimizer has ",
                      params_.size()));
    }
    const std::vector<std::string> buffers = buffer_names(), counters = counter_names();
    const auto known = [](const std::vector<std::string>& names, const std::string& n) {
      return std::find(names.begin(), names.end(), n) != names.end();
    };
    for (std::size_t i = 0; i < params_.size(); ++i) {
      for (const auto& [n, t] : s.buffers[i]) {
        if (!known(buffers, n)) bad(detail::cat("parameter ", i, " has a buffer '", n, "' that ", name_, " does not keep"));
        if (!t.defined() || !(t.shape() == params_[i].shape())) {
          bad(detail::cat("buffer '", n, "' of parameter ", i, " has shape ", t.defined() ? t.shape() : Shape{}, ", the parameter ",
                          params_[i].shape()));
        }
      }
      for (const std::string& n : counters) {
        const auto it = s.counters[i].find(n);
        if (it == s.counters[i].end()) bad(detail::cat("parameter ", i, " has no counter '", n, "'"));
        if (it->second < 0) bad(detail::cat("counter '", n, "' of parameter ", i, " is negative (", it->second, ")"));
      }
      for (const auto& [n, c] : s.counters[i]) {
        if (!known(counters, n)) bad(detail::cat("parameter ", i, " has a counter '", n, "' that ", name_, " does not keep"));
      }
      const std::string why = check_slot(s.buffers[i], s.counters[i]);
      if (!why.empty()) bad(detail::cat("parameter ", i, ": ", why));
    }
  }

  /// Restores a state taken by state() (of this optimizer or another of the same kind over
  /// parameters of the same shapes), all or nothing: check_state() first. Buffers are cloned.
  void load_state(const OptimizerState<T>& s) {
    check_state(s);
    for (std::size_t i = 0; i < params_.size(); ++i) load_slot(i, s.buffers[i], s.counters[i]);
    steps_ = s.steps;
    lr_ = s.lr;
  }

 protected:
  /// Updates parameter i in place given its gradient.
  virtual void update(std::size_t i, Tensor<T>& value, const Tensor<T>& grad) = 0;

  /// Parameter i's buffers (cloned) and counters, for state().
  virtual void save_slot(std::size_t i, std::map<std::string, Tensor<T>>& buffers,
                         std::map<std::string, std::int64_t>& counters) const = 0;
  /// Why one parameter's buffers and counters (names and shapes already checked) contradict each
  /// other, or "" when they do not.
  virtual std::string check_slot(const std::map<std::string, Tensor<T>>& buffers,
                                 const std::map<std::string, std::int64_t>& counters) const = 0;
  /// Replaces parameter i's state with clones of checked buffers and counters.
  virtual void load_slot(std::size_t i, const std::map<std::string, Tensor<T>>& buffers,
                         const std::map<std::string, std::int64_t>& counters) = 0;

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
