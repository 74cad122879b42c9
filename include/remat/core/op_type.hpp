#pragma once
/// @file
/// An op's identity. Every kind of op has one OpType object, and ops are told apart by its
/// address, not by comparing names: a save policy that keeps `op::linear` keeps the op whose
/// node returns that object, whatever it is called, and a misspelt identity does not compile.
/// The name is for messages, traces and files.
///
/// Built-in ops' identities are in ops/op_types.hpp. A custom op defines its own, once, at
/// namespace scope (an inline variable has one address in the whole program):
///
///     inline constexpr remat::OpType kBump{"bump"};
///     const remat::OpType& op_type() const noexcept override { return kBump; }

#include <functional>
#include <vector>

namespace remat {

/// One kind of op. Not copyable: its address is its identity.
class OpType {
 public:
  /// What a save policy may ask of an op besides its identity.
  enum class Kind {
    gemm,  ///< a matrix product with a weight or another operand (save_matmuls() keeps these)
    other,
  };

  constexpr explicit OpType(const char* name, Kind kind = Kind::other) noexcept
      : name_(name), kind_(kind) {}
  OpType(const OpType&) = delete;
  OpType& operator=(const OpType&) = delete;

  /// "linear", "layer_norm", ... as errors, traces and plan files print it.
  constexpr const char* name() const noexcept { return name_; }
  /// Whether the op is a matrix product (Kind::gemm).
  constexpr bool is_gemm() const noexcept { return kind_ == Kind::gemm; }

  friend bool operator==(const OpType& a, const OpType& b) noexcept { return &a == &b; }

 private:
  const char* name_;
  Kind kind_;
};

/// A list of op identities, as save_ops() and recompute_ops() take them: {op::linear, kBump}.
using OpTypes = std::vector<std::reference_wrapper<const OpType>>;

}  // namespace remat
