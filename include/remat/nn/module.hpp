#pragma once
/// @file
/// Module: what every layer and model derives from. A module owns parameters and child modules
/// under names, and everything that walks the tree (parameters(), named_parameters(), train(),
/// eval(), freeze()) reaches every registered descendant. Parameter names are dotted paths
/// ("blocks.3.attn.qkv.weight").
///
/// Note [module handles]: a module's registry (its parameters, its children, its mode) is shared
/// by copies of the module, as a Parameter's value is by copies of the Parameter. So a parent
/// that registers a child member and is then moved (into a vector, out of a factory) still
/// reaches the same child, and a copy of a module is the same module, not a clone. Assigning a
/// new module to a member after registering it does not re-register it: build children first,
/// then register them.

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "remat/core/parameter.hpp"

namespace remat::nn {

template <class T = float>
class Module {
 public:
  using NamedParameter = std::pair<std::string, Parameter<T>>;

  /// Every parameter of this module and its descendants with its dotted name, depth first in
  /// the order parameters and children were added. A parameter reached twice (a child
  /// registered under two names) is listed once, under the first name.
  std::vector<NamedParameter> named_parameters() const {
    std::vector<NamedParameter> out;
    std::unordered_set<const void*> seen;
    // Entries in the order they were added, a child's expanded where it was registered; an
    // explicit stack instead of recursion, however deep the tree.
    struct Frame {
      const State* state;
      std::string prefix;
      std::size_t next;
    };
    std::vector<Frame> stack{{state_.get(), std::string(), 0}};
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (f.next == f.state->entries.size()) {
        stack.pop_back();
        continue;
      }
      const Entry& e = f.state->entries[f.next++];
      std::string name = f.prefix + e.name;
      if (e.child) {
        stack.push_back(Frame{e.child.get(), std::move(name) + ".", 0});  // f is not used after this
      } else if (seen.insert(e.param.identity()).second) {
        out.emplace_back(std::move(name), e.param);
      }
    }
    return out;
  }

  /// Every parameter, in named_parameters() order.
  std::vector<Parameter<T>> parameters() const {
    std::vector<Parameter<T>> out;
    for (auto& [name, p] : named_parameters()) out.push_back(std::move(p));
    return out;
  }

  /// The parameter called `name`; throws a UsageError naming the first one when there is none.
  Parameter<T> parameter(const std::string& name) const {
    const std::vector<NamedParameter> all = named_parameters();
    for (const auto& [n, p] : all) {
      if (n == name) return p;
    }
    throw UsageError(detail::cat("Module: no parameter named '", name, "' (", all.size(), " parameters, the first is '",
                                 all.empty() ? std::string("none") : all.front().first, "')"));
  }

  /// Number of scalar parameters (each parameter counted once).
  std::int64_t parameter_count() const {
    std::int64_t n = 0;
    for (const auto& [name, p] : named_parameters()) n += p.numel();
    return n;
  }

  /// Freezes (or unfreezes) every parameter whose name starts with `prefix` ("" for all), in
  /// this module and its descendants: a frozen parameter gets no gradient and no optimizer update.
  void freeze(const std::string& prefix = "") { set_frozen(prefix, true); }
  void unfreeze(const std::string& prefix = "") { set_frozen(prefix, false); }

  virtual ~Module() = default;
  // Copies and moves share the registry (Note [module handles]); a moved-from module stays usable.
  Module(const Module&) = default;
  Module(Module&& other) noexcept : state_(other.state_) {}
  Module& operator=(const Module&) = default;
  Module& operator=(Module&& other) noexcept {
    state_ = other.state_;
    return *this;
  }

  /// Training mode (dropout on) or evaluation mode (off), for this module and every registered
  /// descendant.
  void train(bool on = true) {
    visit([&](State& s) { s.training = on; });
  }
  void eval() { train(false); }
  bool training() const noexcept { return state_->training; }

 protected:
  Module() = default;

  /// Adds a parameter named `name` holding `value` and returns its handle.
  Parameter<T> add_parameter(const std::string& name, Tensor<T> value) {
    check_new_name(name);
    state_->entries.push_back(Entry{name, Parameter<T>(std::move(value)), nullptr});
    return state_->entries.back().param;
  }

  /// Unregisters the parameter named `name` (a Linear whose weight became quantized storage):
  /// it leaves parameters() and named_parameters(); handles to it stay valid.
  void remove_parameter(const std::string& name) {
    auto& es = state_->entries;
    const auto it = std::find_if(es.begin(), es.end(), [&](const Entry& e) { return !e.child && e.name == name; });
    if (it == es.end()) throw UsageError(detail::cat("Module: no parameter named '", name, "' to remove"));
    es.erase(it);
  }

  /// Registers `child` (usually a member) under `name`: its parameters appear as
  /// "name.weight", "name.sub.bias" and so on, and train(), eval() and freeze() reach it. The
  /// child is shared, not copied (Note [module handles]), and takes this module's current mode.
  void add_module(const std::string& name, const Module& child) {
    check_new_name(name);
    if (child.reaches(*state_)) {
      throw UsageError(detail::cat("Module: adding '", name, "' would make the module its own descendant"));
    }
    child.state_->training = state_->training;
    state_->entries.push_back(Entry{name, Parameter<T>(), child.state_});
  }

 private:
  struct State;
  struct Entry {
    std::string name;
    Parameter<T> param;             // when child is null
    std::shared_ptr<State> child;  // a registered module
  };
  struct State {
    std::vector<Entry> entries;  // parameters and children, in the order they were added
    bool training = true;
  };

  /// Calls fn(state) on this module's state and every descendant's, with an explicit stack (no
  /// recursion, however deep the tree).
  template <class Fn>
  void visit(Fn&& fn) const {
    std::vector<State*> stack{state_.get()};
    while (!stack.empty()) {
      State* s = stack.back();
      stack.pop_back();
      fn(*s);
      for (const Entry& e : s->entries) {
        if (e.child) stack.push_back(e.child.get());
      }
    }
  }

  /// Whether `target` is this module's state or a descendant's.
  bool reaches(const State& target) const {
    bool found = false;
    visit([&](const State& s) { found = found || &s == &target; });
    return found;
  }

  void check_new_name(const std::string& name) const {
    if (name.empty()) throw UsageError("Module: a parameter or child needs a non-empty name");
    for (const Entry& e : state_->entries) {
      if (e.name == name) throw UsageError(detail::cat("Module: '", name, "' added twice"));
    }
  }

  void set_frozen(const std::string& prefix, bool frozen) {
    std::size_t matched = 0;
    for (auto& [name, p] : named_parameters()) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      if (frozen) p.freeze();
      else p.unfreeze();
      ++matched;
    }
    if (matched == 0) throw UsageError(detail::cat("Module: no parameter name starts with '", prefix, "'"));
  }

  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace remat::nn
