#pragma once
/// @file
/// Parameter<T>: a persistent, trainable value. It lives outside tapes; each tape that uses it
/// records a leaf for it, and backward() accumulates into its gradient. Copies share the
/// parameter (value, gradient and frozen flag), like a reference.

#include <span>

#include "remat/core/var.hpp"

namespace remat {

template <class T = float>
class Parameter : public Var<T> {
 public:
  /// An undefined parameter (to be assigned later).
  Parameter() = default;

  /// A parameter holding `value` (not copied: later writes to the tensor are the parameter's).
  explicit Parameter(Tensor<T> initial, bool requires_grad = true)
      : Var<T>(std::make_shared<detail::ParamState<T>>(std::move(initial), requires_grad)) {}

  /// The value, writable: optimizers and loaders update it in place.
  Tensor<T>& data() { return state().value; }
  using Var<T>::value;

  /// Forgets the gradient. Its buffer is kept and overwritten by the next backward(), so steady
  /// training steps allocate no parameter gradients (grad() is undefined until then).
  void zero_grad() noexcept {
    if (this->param_state()) this->param_state()->grad_valid = false;
  }

  /// The gradient's elements, to be overwritten whole by code that makes the gradient outside
  /// backward() (dist::DataParallel writes the ranks' average there); what they hold on return
  /// is unspecified. They live in the buffer backward() would reuse, or in a new one when there
  /// is none or something else holds it (a Tensor grad() returned must not change under its
  /// holder, as backward() copies on write). grad() returns them from then on. As zero_grad(),
  /// not while another thread's live tape trains the parameter.
  std::span<T> overwrite_grad() {
    detail::ParamState<T>& s = state();
    if (!s.requires_grad)
      throw UsageError(detail::cat("Parameter::overwrite_grad: the parameter (shape ",
                                   s.value.shape(), ") is frozen and takes no gradient"));
    if (!s.grad.defined() || !(s.grad.shape() == s.value.shape()) || !s.grad.is_unique())
      s.grad = Tensor<T>(s.value.shape());
    s.grad_valid = true;
    return {s.grad.data(), static_cast<std::size_t>(s.grad.numel())};
  }

  /// Forgets the gradient and frees its buffer.
  void free_grad() noexcept {
    if (!this->param_state()) return;
    this->param_state()->grad_valid = false;
    this->param_state()->grad.reset();
  }

  /// A frozen parameter receives no gradient and makes no op depend on it for backward.
  bool frozen() const noexcept {
    return this->param_state() && !this->param_state()->requires_grad;
  }
  void freeze() {
    state().requires_grad = false;
    free_grad();
  }
  void unfreeze() { state().requires_grad = true; }

  /// Identity shared by copies of this parameter.
  const void* identity() const noexcept { return this->param_state().get(); }

 private:
  detail::ParamState<T>& state() const {
    if (!this->param_state()) throw UsageError("Parameter: used before it was given a value");
    return *this->param_state();
  }
};

}  // namespace remat
