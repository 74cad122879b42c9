#pragma once
/// @file
/// Optimizer: the base of SGD and AdamW. It holds the parameters it updates and their state
/// (allocated through the counting allocator, like every tensor), checks it is used right, and
/// hands that state out and takes it back (state() / load_state()) so that a run can be saved and
/// resumed exactly, whatever the optimizer.
///
/// Parameter groups: an optimizer built from ParamGroups gives each group its own weight decay
/// and learning-rate factor (the group's lr is lr_scale times the optimizer's lr(), so a
/// schedule's set_lr() moves every group together); param_groups() builds the usual two groups,
/// "no decay for biases, norms and embeddings", in one line. Groups are configuration, not
/// state: a resumed run builds the same groups and load_state()s the per-parameter buffers.
///
/// Gradient accumulation over micro-batches: backward() adds into the gradients it finds, so k
/// backward passes between zero_grad() and step() accumulate. With a loss that is a mean over a
/// micro-batch's rows, scale each micro-batch's loss by 1/k (k micro-batches of equal size):
/// the accumulated gradient is then the gradient of the mean over all k micro-batches, the
/// full-batch gradient, to rounding (tests/optim/groups_test.cpp bounds the difference).
///   opt.zero_grad();
///   for (int i = 0; i < k; ++i) { Tape tape; tape.backward(model.loss(batch[i]) * (1.0f / k)); }
///   opt.step();

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "remat/core/grad_mode.hpp"
#include "remat/core/parameter.hpp"
#include "remat/core/shape_only.hpp"

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

/// Parameters that share a weight decay and a learning-rate factor.
template <class T = float>
struct ParamGroup {
  std::vector<Parameter<T>> params;
  std::optional<double> weight_decay;  ///< unset: the optimizer's option
  double lr_scale = 1.0;               ///< the group's lr is lr_scale * the optimizer's lr()
};

/// The usual rule for parameters that take no weight decay: biases and norm scales (rank < 2)
/// and embedding tables (a module path ending in "embed_tokens", "wte", "wpe" or "embedding").
inline bool biases_norms_embeddings(const std::string& name, const Shape& shape) {
  if (shape.rank() < 2) return true;
  const std::string module = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0
                                 ? name.substr(0, name.size() - 7)
                                 : name;
  const std::size_t dot = module.rfind('.');
  const std::string last = dot == std::string::npos ? module : module.substr(dot + 1);
  return last == "embed_tokens" || last == "wte" || last == "wpe" || last == "embedding";
}

struct GroupOptions {
  double weight_decay = 0.0;  ///< for the parameters no_decay does not pick
  /// Which parameters take no decay (by dotted name and shape); none when empty.
  std::function<bool(const std::string& name, const Shape& shape)> no_decay;
};

/// Two groups from a model's named_parameters(): the parameters `no_decay` picks, with weight
/// decay 0, then the others, with options.weight_decay; frozen parameters are left out (they
/// are never updated). Empty groups are dropped.
///   AdamW opt(optim::param_groups(model.named_parameters(), {.weight_decay = 0.1,
///                                 .no_decay = optim::biases_norms_embeddings}), {.lr = 3e-4});
template <class T>
std::vector<ParamGroup<T>> param_groups(
    const std::vector<std::pair<std::string, Parameter<T>>>& named, const GroupOptions& options) {
  if (!(options.weight_decay >= 0.0))
    throw ArgumentError(
        detail::cat("param_groups: weight_decay must be >= 0, got ", options.weight_decay));
  ParamGroup<T> plain{{}, 0.0, 1.0}, decayed{{}, options.weight_decay, 1.0};
  for (const auto& [name, p] : named) {
    if (p.frozen()) continue;
    (options.no_decay && options.no_decay(name, p.shape()) ? plain : decayed).params.push_back(p);
  }
  std::vector<ParamGroup<T>> out;
  for (ParamGroup<T>* g : {&plain, &decayed}) {
    if (!g->params.empty()) out.push_back(std::move(*g));
  }
  return out;
}

template <class T = float>
class Optimizer {
 public:
  explicit Optimizer(std::vector<Parameter<T>> params, double lr, const char* name)
      : params_(std::move(params)), lr_(lr), name_(name) {
    check_params();
    check_lr(lr);
  }

  /// Parameters in groups, in the groups' order (Note at the top of this file).
  explicit Optimizer(const std::vector<ParamGroup<T>>& groups, double lr, const char* name)
      : lr_(lr), name_(name) {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const ParamGroup<T>& group = groups[g];
      if (!(group.lr_scale >= 0.0) || (group.weight_decay && !(*group.weight_decay >= 0.0))) {
        throw ArgumentError(detail::cat(name_, ": group ", g,
                                        " needs lr_scale >= 0 and weight_decay >= 0, got ",
                                        group.lr_scale, " and ", group.weight_decay.value_or(0.0)));
      }
      for (const Parameter<T>& p : group.params) {
        params_.push_back(p);
        decay_.push_back(group.weight_decay);
        lr_scale_.push_back(group.lr_scale);
      }
    }
    check_params();
    check_lr(lr);
  }

 private:
  void check_params() const {
    std::unordered_set<const void*> seen;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].defined()) {
        throw ArgumentError(detail::cat(name_, ": parameter ", i, " is undefined"));
      }
      if (!seen.insert(params_[i].identity()).second) {
        throw ArgumentError(detail::cat(name_, ": parameter ", i, " (shape ", params_[i].shape(),
                                        ") is listed twice; each parameter must appear once"));
      }
    }
  }

 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Updates every parameter that has a gradient. Throws when none has one (backward() was not
  /// called, or every parameter is frozen): a silent no-op step would hide the bug. In a
  /// shape-only run (core/shape_only.hpp) it allocates the state a real step would, counts the
  /// step and updates nothing.
  void step() {
    if (is_shape_only() && !runs_shape_only()) {
      throw UsageError(detail::cat(
          name_,
          ".step(): this optimizer cannot run shape-only (Note [shape-only execution] in "
          "core/shape_only.hpp); one joins by allocating its state and skipping its "
          "arithmetic when remat::is_shape_only(), and overriding runs_shape_only()"));
    }
    NoGradGuard no_grad;
    bool any = false;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Parameter<T>& p = params_[i];
      if (p.frozen() || !p.grad().defined()) continue;
      if (!(p.grad().shape() == p.shape())) {
        throw ShapeError(detail::cat(name_, ": parameter ", i, " has shape ", p.shape(),
                                     " but its gradient has shape ", p.grad().shape()));
      }
      update(i, p.data(), p.grad());
      any = true;
    }
    if (!any) {
      throw UsageError(
          detail::cat(name_, ".step(): none of the ", params_.size(),
                      " parameters has a gradient; call tape.backward(loss) before step(), "
                      "and check that the loss uses this optimizer's parameters"));
    }
    ++steps_;
  }

  /// Forgets every parameter's gradient; the buffers stay and the next backward overwrites
  /// them (Parameter::zero_grad).
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

  /// Whether update() runs shape-only (allocates what it allocates, computes nothing, when
  /// remat::is_shape_only()). SGD and AdamW do; step() refuses another in a shape-only run.
  virtual bool runs_shape_only() const noexcept { return false; }

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

  /// Throws an ArgumentError naming the first thing in `s` that does not fit this optimizer:
  /// another optimizer's state, another number of parameters, a buffer or counter it does not know
  /// or of the wrong shape, a negative count, or buffers and counters that contradict each other.
  void check_state(const OptimizerState<T>& s) const {
    const auto bad = [&](const std::string& why) {
      throw ArgumentError(detail::cat(name_, ".load_state: ", why));
    };
    if (s.optimizer != name_)
      bad(detail::cat("the state is of ", s.optimizer.empty() ? "no optimizer" : s.optimizer,
                      ", not of ", name_));
    if (s.steps < 0) bad(detail::cat("negative step count ", s.steps));
    if (!(s.lr >= 0.0)) bad(detail::cat("learning rate must be >= 0, got ", s.lr));
    if (s.buffers.size() != params_.size() || s.counters.size() != params_.size()) {
      bad(detail::cat("the state is for ", s.buffers.size(), " parameters (", s.counters.size(),
                      " with counters), this optimizer has ", params_.size()));
    }
    const std::vector<std::string> buffers = buffer_names(), counters = counter_names();
    const auto known = [](const std::vector<std::string>& names, const std::string& n) {
      return std::find(names.begin(), names.end(), n) != names.end();
    };
    for (std::size_t i = 0; i < params_.size(); ++i) {
      for (const auto& [n, t] : s.buffers[i]) {
        if (!known(buffers, n))
          bad(detail::cat("parameter ", i, " has a buffer '", n, "' that ", name_,
                          " does not keep"));
        if (!t.defined() || !(t.shape() == params_[i].shape())) {
          bad(detail::cat("buffer '", n, "' of parameter ", i, " has shape ",
                          t.defined() ? t.shape() : Shape{}, ", the parameter ",
                          params_[i].shape()));
        }
      }
      for (const std::string& n : counters) {
        const auto it = s.counters[i].find(n);
        if (it == s.counters[i].end())
          bad(detail::cat("parameter ", i, " has no counter '", n, "'"));
        if (it->second < 0)
          bad(detail::cat("counter '", n, "' of parameter ", i, " is negative (", it->second, ")"));
      }
      for (const auto& [n, c] : s.counters[i]) {
        if (!known(counters, n))
          bad(detail::cat("parameter ", i, " has a counter '", n, "' that ", name_,
                          " does not keep"));
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
  /// Parameter i's learning rate: lr() times its group's lr_scale.
  double lr_of(std::size_t i) const noexcept {
    return lr_scale_.empty() ? lr_ : lr_ * lr_scale_[i];
  }
  /// Parameter i's weight decay: its group's, or `fallback` (the optimizer's option).
  double weight_decay_of(std::size_t i, double fallback) const noexcept {
    return decay_.empty() || !decay_[i] ? fallback : *decay_[i];
  }

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
    if (!(lr >= 0.0))
      throw ArgumentError(detail::cat(name_, ": learning rate must be >= 0, got ", lr));
  }

  std::vector<Parameter<T>> params_;
  std::vector<std::optional<double>>
      decay_;                     // per parameter, from its group (empty without groups)
  std::vector<double> lr_scale_;  // the same
  double lr_;
  const char* name_;
  std::int64_t steps_ = 0;
};

}  // namespace remat::optim
