#pragma once
/// @file
/// Module: what every layer and model derives from. A module owns its parameters under stable
/// dotted names ("blocks.3.attn.qkv.weight"), collected from its children when they are added.
/// Parameters are shared handles, so modules can be moved and the names stay right.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "remat/core/parameter.hpp"

namespace remat::nn {

template <class T = float>
class Module {
 public:
  using NamedParameter = std::pair<std::string, Parameter<T>>;

  /// Every parameter with its dotted name, in the order they were added.
  const std::vector<NamedParameter>& named_parameters() const noexcept { return params_; }

  std::vector<Parameter<T>> parameters() const {
    std::vector<Parameter<T>> out;
    for (const auto& [name, p] : params_) out.push_back(p);
    return out;
  }

  /// The parameter called `name`; throws a UsageError listing close names when there is none.
  Parameter<T> parameter(const std::string& name) const {
    for (const auto& [n, p] : params_) {
      if (n == name) return p;
    }
    throw UsageError(detail::cat("Module: no parameter named '", name, "' (", params_.size(), " parameters, the first is '",
                                 params_.empty() ? std::string("none") : params_.front().first, "')"));
  }

  /// Number of scalar parameters.
  std::int64_t parameter_count() const noexcept {
    std::int64_t n = 0;
    for (const auto& [name, p] : params_) n += p.numel();
    return n;
  }

  /// Freezes (or unfreezes) every parameter whose name starts with `prefix` ("" for all): a
  /// frozen parameter gets no gradient and no optimizer update.
  void freeze(const std::string& prefix = "") { set_frozen(prefix, true); }
  void unfreeze(const std::string& prefix = "") { set_frozen(prefix, false); }

  virtual ~Module() = default;
  Module(const Module&) = default;
  Module(Module&&) noexcept = default;
  Module& operator=(const Module&) = default;
  Module& operator=(Module&&) noexcept = default;

  /// Training mode turns dropout on; evaluation mode off. Modules with children override this
  /// to pass it on.
  virtual void train(bool on = true) { training_ = on; }
  void eval() { train(false); }
  bool training() const noexcept { return training_; }

 protected:
  Module() = default;

  /// Adds a parameter named `name` holding `value` and returns its handle.
  Parameter<T> add_parameter(const std::string& name, Tensor<T> value) {
    for (const auto& [n, p] : params_) {
      if (n == name) throw UsageError(detail::cat("Module: parameter '", name, "' added twice"));
    }
    params_.emplace_back(name, Parameter<T>(std::move(value)));
    return params_.back().second;
  }

  /// Adds a child's parameters under "name.".
  void add_module(const std::string& name, const Module& child) {
    for (const auto& [n, p] : child.params_) params_.emplace_back(name + "." + n, p);
  }

 private:
  void set_frozen(const std::string& prefix, bool frozen) {
    std::size_t matched = 0;
    for (auto& [name, p] : params_) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      if (frozen) p.freeze();
      else p.unfreeze();
      ++matched;
    }
    if (matched == 0) throw UsageError(detail::cat("Module: no parameter name starts with '", prefix, "'"));
  }

  std::vector<NamedParameter> params_;
  bool training_ = true;
};

}  // namespace remat::nn
