#pragma once
/// @file
/// Var<T>: a value in a computation. A Var is one of three things: a node on a tape (what ops
/// return while a Tape is recording), a constant (a tensor outside any tape), or a Parameter,
/// which joins whatever tape uses it. Vars are cheap handles: copying one shares its value.

#include <memory>

#include "remat/core/param_state.hpp"
#include "remat/core/tape_state.hpp"

namespace remat {
namespace detail {
struct VarAccess;
}

template <class T = float>
class Var {
 public:
  using Scalar = T;

  /// An undefined Var.
  Var() = default;

  /// A constant: a value that belongs to no tape and needs no gradient.
  explicit Var(Tensor<T> value) : value_(std::move(value)) {}

  bool defined() const noexcept { return param_ != nullptr || value_.defined(); }
  const Tensor<T>& value() const noexcept { return param_ ? param_->value : value_; }
  const Shape& shape() const noexcept { return value().shape(); }
  int rank() const noexcept { return shape().rank(); }
  std::int64_t numel() const noexcept { return shape().numel(); }
  std::int64_t dim(int axis) const { return shape()[axis]; }
  /// The single value of a one-element Var (a loss, say).
  T item() const { return value().item(); }

  /// Whether backward() will compute a gradient for this Var.
  bool requires_grad() const {
    if (param_) return param_->requires_grad;
    if (!tape_) return false;
    check_tape_alive("requires_grad");
    return tape_->node(id_).requires_grad;
  }

  /// The gradient backward() accumulated: for a Parameter, or an input made with requires_grad.
  /// Undefined when none reached it.
  Tensor<T> grad() const {
    if (param_) return param_->grad_valid ? param_->grad : Tensor<T>();
    if (!tape_) return Tensor<T>();
    check_tape_alive("grad");
    return detail::node_cast<T>(&tape_->node(id_)).grad_slot();
  }

  /// True for a node on a tape; false for constants and parameters.
  bool on_tape() const noexcept { return tape_ != nullptr; }

 protected:
  explicit Var(std::shared_ptr<detail::ParamState<T>> param) : param_(std::move(param)) {}

  // Internals, for Parameter and for the tape's machinery (through detail::VarAccess).
  const std::shared_ptr<detail::TapeState>& tape_state() const noexcept { return tape_; }
  std::uint32_t node_id() const noexcept { return id_; }
  const std::shared_ptr<detail::ParamState<T>>& param_state() const noexcept { return param_; }

  void check_tape_alive(const char* what) const {
    if (tape_->ended) {
      throw UsageError(detail::cat(
          what, "(): this Var (shape ", shape(),
          ") belongs to a tape that has ended; read gradients before the Tape goes out of scope"));
    }
  }

 private:
  friend struct detail::VarAccess;

  /// A node on a tape (made only by the tape's machinery, through detail::VarAccess).
  Var(std::shared_ptr<detail::TapeState> tape, std::uint32_t id, Tensor<T> value)
      : tape_(std::move(tape)), id_(id), value_(std::move(value)) {}

  std::shared_ptr<detail::TapeState> tape_;
  std::uint32_t id_ = detail::kNone;
  Tensor<T> value_;
  std::shared_ptr<detail::ParamState<T>> param_;
};

namespace detail {

/// How the tape's machinery (Tape::input, record, checkpoint scopes) makes a Var that names a
/// node and reads what a Var refers to; the rest of the world sees values and gradients only.
struct VarAccess {
  template <class T>
  static Var<T> on_tape(std::shared_ptr<TapeState> tape, std::uint32_t id, Tensor<T> value) {
    return Var<T>(std::move(tape), id, std::move(value));
  }
  template <class T>
  static const std::shared_ptr<TapeState>& tape_state(const Var<T>& v) noexcept {
    return v.tape_state();
  }
  template <class T>
  static std::uint32_t node_id(const Var<T>& v) noexcept {
    return v.node_id();
  }
  template <class T>
  static const std::shared_ptr<ParamState<T>>& param_state(const Var<T>& v) noexcept {
    return v.param_state();
  }
};

}  // namespace detail
}  // namespace remat
