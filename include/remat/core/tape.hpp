#pragma once
/// @file
/// Tape: records one step's operations, runs its backward pass, and frees everything when it
/// goes out of scope. While it lives it is the current tape of its thread: ops whose inputs
/// name no tape (parameters, constants) record onto it. A tape belongs to the thread that created
/// it: it records and runs backward there only (Note [one thread per tape] in tape_state.hpp).

#include <functional>
#include <memory>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <vector>

#include "remat/core/record.hpp"

namespace remat {

namespace detail {
struct TapeAccess;
}

/// What Tape::backward() tells its caller while the sweep runs (dist::DataParallel starts each
/// gradient's reduction as soon as it is final this way). Either may be empty.
struct BackwardHooks {
  /// A Parameter's gradient is final (no op left to run adds to it): called once for each
  /// parameter the tape used that needs a gradient, with its Parameter::identity(), as soon as
  /// the sweep has passed its first use.
  std::function<void(const void* parameter)> gradient_ready;
  /// Called after each node the sweep passes, replays included: a place to poll for progress.
  std::function<void()> after_op;
};

/// Records one step's operations and runs its backward pass.
class Tape {
 public:
  explicit Tape(const TapeOptions& options = {})
      : state_(std::make_shared<detail::TapeState>(options)),
        previous_(std::exchange(detail::current_tape_slot(), state_)) {}

  ~Tape() {
    state_->ended = true;
    state_->clear();
    if (detail::current_tape_slot() == state_) detail::current_tape_slot() = std::move(previous_);
  }

  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  /// A leaf holding `value`; with requires_grad, backward() fills its grad().
  template <class T>
  Var<T> input(Tensor<T> value, bool requires_grad = false) {
    if (!value.defined()) throw ArgumentError("Tape::input: the tensor is undefined");
    auto leaf = std::make_unique<detail::Leaf<T>>(
        requires_grad ? detail::LeafKind::input : detail::LeafKind::constant, value);
    leaf->requires_grad = requires_grad;
    const std::uint32_t id = state_->push(std::move(leaf));
    return detail::VarAccess::on_tape(state_, id, std::move(value));
  }

  /// Backward pass from a single-valued Var (a loss): its gradient is 1.
  template <class T>
  void backward(const Var<T>& root) {
    backward(root, BackwardHooks{});
  }

  /// Backward pass from any Var given the gradient of its value.
  template <class T>
  void backward(const Var<T>& root, const Tensor<T>& grad) {
    backward(root, grad, BackwardHooks{});
  }

  /// Backward pass from a single-valued Var, telling `hooks` as gradients become final.
  template <class T>
  void backward(const Var<T>& root, const BackwardHooks& hooks) {
    check_single_valued(root);
    backward(root, Tensor<T>::ones(root.shape()), hooks);
  }

  /// Backward pass from any Var given the gradient of its value, telling `hooks` as gradients
  /// become final (BackwardHooks).
  template <class T>
  void backward(const Var<T>& root, const Tensor<T>& grad, const BackwardHooks& hooks) {
    check_root(root);
    if (!(grad.shape() == root.shape())) {
      throw ShapeError(detail::cat("backward: gradient of shape ", grad.shape(),
                                   " given for an output of shape ", root.shape()));
    }
    const std::uint32_t id = detail::VarAccess::node_id(root);
    detail::node_cast<T>(&state_->node(id)).grad_slot() = grad;
    const HookScope scope(*state_, hooks);
    state_->sweep(id);
  }

  /// Number of nodes recorded so far.
  std::size_t size() const noexcept { return state_->size(); }
  /// The seed random ops on this tape draw from.
  std::uint64_t seed() const noexcept { return state_->seed; }
  /// What the backward pass recomputed: segments replayed, ops run again, seconds spent.
  const ReplayStats& replay_stats() const noexcept { return state_->stats(); }

  /// The Parameters this tape has recorded a use of, by Parameter::identity(), in the order of
  /// their first use. A parameter's gradient is final once the backward sweep passes its first
  /// use, so the reverse of this order is the one in which BackwardHooks::gradient_ready hears
  /// of those that need gradients.
  std::vector<const void*> parameters_by_first_use() const {
    std::vector<const void*> out;
    for (std::uint32_t id : first_uses(*state_))
      out.push_back(state_->node(id).parameter_identity());
    return out;
  }

 private:
  friend struct detail::TapeAccess;

  /// Installs `hooks` on the tape's sweep for one backward pass.
  class HookScope {
   public:
    HookScope(detail::TapeState& tape, const BackwardHooks& hooks)
        : tape_(tape), installed_(hooks.gradient_ready || hooks.after_op) {
      if (!installed_) return;
      // a parameter's first leaf is the last node of the sweep that writes into its gradient
      std::vector<bool> first_use(tape.size(), false);
      for (std::uint32_t id : first_uses(tape)) first_use[id] = true;
      tape.on_swept = [&hooks, first_use = std::move(first_use)](const detail::NodeBase& n) {
        if (hooks.gradient_ready && n.is_leaf() && n.requires_grad && first_use[n.id])
          hooks.gradient_ready(n.parameter_identity());
        if (hooks.after_op) hooks.after_op();
      };
    }
    ~HookScope() {
      if (installed_) tape_.on_swept = nullptr;
    }
    HookScope(const HookScope&) = delete;
    HookScope& operator=(const HookScope&) = delete;

   private:
    detail::TapeState& tape_;
    bool installed_;
  };

  /// The ids of the leaves that are each parameter's first use, in order.
  static std::vector<std::uint32_t> first_uses(const detail::TapeState& tape) {
    std::vector<std::uint32_t> out;
    std::unordered_set<const void*> seen;
    for (std::uint32_t i = 0; i < tape.size(); ++i) {
      const void* p = tape.node(i).parameter_identity();
      if (p && seen.insert(p).second) out.push_back(i);
    }
    return out;
  }

  template <class T>
  static void check_single_valued(const Var<T>& root) {
    if (root.numel() != 1) {
      throw ArgumentError(
          detail::cat("backward: the output has shape ", root.shape(),
                      ", not a single value; pass its gradient: backward(output, grad)"));
    }
  }

  template <class T>
  void check_root(const Var<T>& root) const {
    if (!state_->on_owner_thread()) {
      std::ostringstream ids;
      ids << "this Tape was created on thread " << state_->owner
          << " and backward() was called on thread " << std::this_thread::get_id();
      throw UsageError(
          detail::cat("backward: ", ids.str(),
                      ". A tape records and runs backward on the thread that created it; give each "
                      "thread its own Tape"));
    }
    if (detail::VarAccess::tape_state(root) != state_) {
      throw UsageError("backward: the output was not recorded on this tape");
    }
    if (state_->swept() || state_->sweeping()) {
      throw UsageError(
          "backward: this tape was already swept; a tape supports one backward pass. "
          "Record the next step on a new Tape");
    }
    if (state_->recording_segment()) {
      throw UsageError("backward: a checkpoint segment is still open; close it before backward");
    }
    if (const detail::NodeBase& out = state_->node(detail::VarAccess::node_id(root));
        !out.requires_grad) {
      throw UsageError(
          detail::cat("backward: the output (op '", out.op_name(), "', shape ", root.shape(),
                      ") does not depend on any parameter or input that requires a gradient"));
    }
  }

  std::shared_ptr<detail::TapeState> state_;
  std::shared_ptr<detail::TapeState> previous_;
};

namespace detail {
/// The tape's state, for remat's own code that works at the level of nodes (the profiler, tests).
struct TapeAccess {
  static TapeState& state(Tape& tape) noexcept { return *tape.state_; }
  static const TapeState& state(const Tape& tape) noexcept { return *tape.state_; }
};
}  // namespace detail

}  // namespace remat
