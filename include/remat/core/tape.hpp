#pragma once
/// @file
/// Tape: records one step's operations, runs its backward pass, and frees everything when it
/// goes out of scope. While it lives it is the current tape of its thread: ops whose inputs
/// name no tape (parameters, constants) record onto it. A tape belongs to the thread that created
/// it: it records and runs backward there only (Note [one thread per tape] in tape_state.hpp).

#include <memory>
#include <sstream>
#include <thread>

#include "remat/core/record.hpp"

namespace remat {

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
    if (!value.defined()) throw UsageError("Tape::input: the tensor is undefined");
    auto leaf = std::make_unique<detail::Leaf<T>>(
        requires_grad ? detail::LeafKind::input : detail::LeafKind::constant, value);
    leaf->requires_grad = requires_grad;
    const std::uint32_t id = state_->push(std::move(leaf));
    return detail::VarAccess::on_tape(state_, id, std::move(value));
  }

  /// Backward pass from a single-valued Var (a loss): its gradient is 1.
  template <class T>
  void backward(const Var<T>& root) {
    if (root.numel() != 1) {
      throw UsageError(
          detail::cat("backward: the output has shape ", root.shape(),
                      ", not a single value; pass its gradient: backward(output, grad)"));
    }
    backward(root, Tensor<T>::ones(root.shape()));
  }

  /// Backward pass from any Var given the gradient of its value.
  template <class T>
  void backward(const Var<T>& root, const Tensor<T>& grad) {
    check_root(root);
    if (!(grad.shape() == root.shape())) {
      throw ShapeError(detail::cat("backward: gradient of shape ", grad.shape(),
                                   " given for an output of shape ", root.shape()));
    }
    detail::node_cast<T>(&state_->node(root.node_id())).grad_slot() = grad;
    state_->sweep(root.node_id());
  }

  /// Number of nodes recorded so far.
  std::size_t size() const noexcept { return state_->size(); }
  /// The seed random ops on this tape draw from.
  std::uint64_t seed() const noexcept { return state_->seed; }

  detail::TapeState& state() noexcept { return *state_; }
  const std::shared_ptr<detail::TapeState>& shared_state() const noexcept { return state_; }

 private:
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
    if (root.tape_state() != state_) {
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
    if (!state_->node(root.node_id()).requires_grad) {
      throw UsageError(detail::cat(
          "backward: the output (op '", state_->node(root.node_id()).op_name(), "', shape ",
          root.shape(), ") does not depend on any parameter or input that requires a gradient"));
    }
  }

  std::shared_ptr<detail::TapeState> state_;
  std::shared_ptr<detail::TapeState> previous_;
};

}  // namespace remat
