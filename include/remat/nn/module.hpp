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
///
/// Note [forward hooks]: a layer whose forward ends in `return this->hooked(x, y)` lets code
/// outside it (nn/lora.hpp) change its output: set_forward_hook(f) makes that forward return
/// f(x, y) instead of y, for every copy of the layer (the hook lives in the shared registry), so
/// a model that calls its members directly runs the hook without knowing of it. Only layers that
/// call hooked() can take a hook; they say so with a kind ("Linear") and their sizes.

#include <algorithm>
#include <functional>
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
        stack.push_back(
            Frame{e.child.get(), std::move(name) + ".", 0});  // f is not used after this
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

  /// The parameter called `name`; throws an ArgumentError naming the first one when there is none.
  Parameter<T> parameter(const std::string& name) const {
    const std::vector<NamedParameter> all = named_parameters();
    for (const auto& [n, p] : all) {
      if (n == name) return p;
    }
    throw ArgumentError(detail::cat("Module: no parameter named '", name, "' (", all.size(),
                                    " parameters, the first is '",
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

  /// Every registered descendant (not this module) with its dotted path, depth first in the
  /// order children were added; a handle shares the descendant's registry (Note [module handles]).
  std::vector<std::pair<std::string, Module>> named_modules() const {
    std::vector<std::pair<std::string, Module>> out;
    struct Frame {
      std::shared_ptr<State> state;
      std::string prefix;
    };
    std::vector<Frame> stack{{state_, std::string()}};
    while (!stack.empty()) {
      Frame f = std::move(stack.back());
      stack.pop_back();
      // Children pushed in reverse so that they pop in the order they were added.
      for (auto it = f.state->entries.rbegin(); it != f.state->entries.rend(); ++it) {
        if (!it->child) continue;
        std::string path = f.prefix + it->name;
        stack.push_back(Frame{it->child, path + "."});
      }
      if (f.state != state_)
        out.emplace_back(f.prefix.substr(0, f.prefix.size() - 1), Module(f.state));
    }
    return out;
  }

  /// What kind of hookable layer this is ("Linear"), or "" (Note [forward hooks]).
  const std::string& kind() const noexcept { return state_->kind; }
  /// A hookable layer's input and output sizes (0 for other modules).
  std::int64_t in_features() const noexcept { return state_->in_features; }
  std::int64_t out_features() const noexcept { return state_->out_features; }

  /// The function a hookable layer's forward passes its input and output through (Note
  /// [forward hooks]); an empty function removes it. Throws for a module that is not hookable.
  using ForwardHook = std::function<Var<T>(const Var<T>& x, const Var<T>& y)>;
  void set_forward_hook(ForwardHook hook) {
    if (state_->kind.empty())
      throw UsageError("Module::set_forward_hook: this module's forward does not call hooked()");
    if (!state_->weight_read_by.empty()) {
      throw UsageError(detail::cat("Module::set_forward_hook: ", state_->weight_read_by,
                                   " reads this layer's weight, not its forward: a hook would "
                                   "never run"));
    }
    state_->hook = std::move(hook);
  }
  bool has_forward_hook() const noexcept { return static_cast<bool>(state_->hook); }

  /// Marks a hookable layer whose owner reads its weight instead of calling its forward (a
  /// language model's head, which its chunked loss multiplies by the weight): it takes no hook,
  /// since one would silently never run. `reader` names the owner in errors.
  void weight_read_directly_by(std::string reader) { state_->weight_read_by = std::move(reader); }
  /// Who reads this layer's weight directly (weight_read_directly_by), or "".
  const std::string& weight_read_by() const noexcept { return state_->weight_read_by; }

  /// Registers `child` under `name` from outside (adapters add their layers to the layer they
  /// wrap); as add_module().
  void attach(const std::string& name, const Module& child) { add_module(name, child); }

  /// Unregisters the child called `name` (its parameters leave named_parameters()); throws a
  /// ArgumentError when there is none.
  void detach(const std::string& name) {
    auto& entries = state_->entries;
    const auto it = std::find_if(entries.begin(), entries.end(),
                                 [&](const Entry& e) { return e.child && e.name == name; });
    if (it == entries.end())
      throw ArgumentError(detail::cat("Module::detach: no child named '", name, "'"));
    entries.erase(it);
  }

  /// The same for every handle of one module (Note [module handles]).
  const void* identity() const noexcept { return state_.get(); }

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

  /// Marks this module as a hookable layer of `kind` with its sizes (Note [forward hooks]).
  void set_kind(std::string kind, std::int64_t in, std::int64_t out) {
    state_->kind = std::move(kind);
    state_->in_features = in;
    state_->out_features = out;
  }

  /// y, or the forward hook's f(x, y) when one is set.
  Var<T> hooked(const Var<T>& x, Var<T> y) const { return state_->hook ? state_->hook(x, y) : y; }

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
    const auto it = std::find_if(es.begin(), es.end(),
                                 [&](const Entry& e) { return !e.child && e.name == name; });
    if (it == es.end())
      throw ArgumentError(detail::cat("Module: no parameter named '", name, "' to remove"));
    es.erase(it);
  }

  /// Registers `child` (usually a member) under `name`: its parameters appear as
  /// "name.weight", "name.sub.bias" and so on, and train(), eval() and freeze() reach it. The
  /// child is shared, not copied (Note [module handles]), and takes this module's current mode.
  void add_module(const std::string& name, const Module& child) {
    check_new_name(name);
    if (child.reaches(*state_)) {
      throw UsageError(
          detail::cat("Module: adding '", name, "' would make the module its own descendant"));
    }
    child.state_->training = state_->training;
    state_->entries.push_back(Entry{name, Parameter<T>(), child.state_});
  }

 private:
  struct State;
  struct Entry {
    std::string name;
    Parameter<T> param;            // when child is null
    std::shared_ptr<State> child;  // a registered module
  };
  struct State {
    std::vector<Entry> entries;  // parameters and children, in the order they were added
    bool training = true;
    std::string kind;  // Note [forward hooks]
    std::int64_t in_features = 0, out_features = 0;
    ForwardHook hook;
    std::string weight_read_by;  // weight_read_directly_by()
  };

  explicit Module(std::shared_ptr<State> state) : state_(std::move(state)) {}

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
    if (name.empty()) throw ArgumentError("Module: a parameter or child needs a non-empty name");
    for (const Entry& e : state_->entries) {
      if (e.name == name) throw ArgumentError(detail::cat("Module: '", name, "' added twice"));
    }
  }

  void set_frozen(const std::string& prefix, bool frozen) {
    std::size_t matched = 0;
    for (auto& [name, p] : named_parameters()) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      if (frozen)
        p.freeze();
      else
        p.unfreeze();
      ++matched;
    }
    if (matched == 0)
      throw ArgumentError(detail::cat("Module: no parameter name starts with '", prefix, "'"));
  }

  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace remat::nn
