#pragma once
/// @file
/// The built-in ops' identities (core/op_type.hpp), in one place: the op headers' nodes return
/// these, save policies name them (`save_ops({op::linear, op::layer_norm})`), and
/// op_type_named() finds one from its name for text that names ops (a command-line flag).

#include <array>
#include <sstream>
#include <string_view>

#include "remat/core/error.hpp"
#include "remat/core/op_type.hpp"

namespace remat::op {

// element-wise arithmetic (ops/arithmetic.hpp)
inline constexpr OpType add{"add"};
inline constexpr OpType sub{"sub"};
inline constexpr OpType mul{"mul"};
inline constexpr OpType div{"div"};
inline constexpr OpType neg{"neg"};
inline constexpr OpType scale{"scale"};
inline constexpr OpType add_scalar{"add_scalar"};
inline constexpr OpType broadcast_to{"broadcast_to"};
inline constexpr OpType where{"where"};
inline constexpr OpType masked_fill{"masked_fill"};
// element-wise functions (ops/unary.hpp, ops/silu.hpp, ops/dropout.hpp)
inline constexpr OpType exp{"exp"};
inline constexpr OpType log{"log"};
inline constexpr OpType sqrt{"sqrt"};
inline constexpr OpType tanh{"tanh"};
inline constexpr OpType sigmoid{"sigmoid"};
inline constexpr OpType relu{"relu"};
inline constexpr OpType gelu{"gelu"};
inline constexpr OpType gelu_tanh{"gelu_tanh"};
inline constexpr OpType silu{"silu"};
inline constexpr OpType swiglu{"swiglu"};
inline constexpr OpType dropout{"dropout"};
// matrix products
inline constexpr OpType matmul{"matmul", OpType::Kind::gemm};
inline constexpr OpType linear{"linear", OpType::Kind::gemm};
inline constexpr OpType quantized_linear{"quantized_linear", OpType::Kind::gemm};
// reductions and normalizations
inline constexpr OpType sum{"sum"};
inline constexpr OpType mean{"mean"};
inline constexpr OpType softmax{"softmax"};
inline constexpr OpType log_softmax{"log_softmax"};
inline constexpr OpType layer_norm{"layer_norm"};
inline constexpr OpType rms_norm{"rms_norm"};
// layout (ops/layout.hpp)
inline constexpr OpType reshape{"reshape"};
inline constexpr OpType transpose{"transpose"};
inline constexpr OpType slice{"slice"};
inline constexpr OpType concat{"concat"};
// transformer pieces
inline constexpr OpType embedding{"embedding"};
inline constexpr OpType rope{"rope"};
inline constexpr OpType causal_mask{"causal_mask"};
inline constexpr OpType attention{"attention"};
// losses
inline constexpr OpType mse_loss{"mse_loss"};
inline constexpr OpType cross_entropy{"cross_entropy"};
inline constexpr OpType linear_cross_entropy{"linear_cross_entropy"};

/// Every identity above (op_type_named() searches it; a test checks that each op a model
/// records is in it).
inline constexpr auto kBuiltin = std::to_array<const OpType*>({&add,
                                                               &sub,
                                                               &mul,
                                                               &div,
                                                               &neg,
                                                               &scale,
                                                               &add_scalar,
                                                               &broadcast_to,
                                                               &where,
                                                               &masked_fill,
                                                               &exp,
                                                               &log,
                                                               &sqrt,
                                                               &tanh,
                                                               &sigmoid,
                                                               &relu,
                                                               &gelu,
                                                               &gelu_tanh,
                                                               &silu,
                                                               &swiglu,
                                                               &dropout,
                                                               &matmul,
                                                               &linear,
                                                               &quantized_linear,
                                                               &sum,
                                                               &mean,
                                                               &softmax,
                                                               &log_softmax,
                                                               &layer_norm,
                                                               &rms_norm,
                                                               &reshape,
                                                               &transpose,
                                                               &slice,
                                                               &concat,
                                                               &embedding,
                                                               &rope,
                                                               &causal_mask,
                                                               &attention,
                                                               &mse_loss,
                                                               &cross_entropy,
                                                               &linear_cross_entropy});

}  // namespace remat::op

namespace remat {

/// The built-in op called `name` ("linear", "gelu_tanh", ...), for text that names ops.
/// Throws a PlanError naming `what` (the flag or file asking), the name and the known names.
inline const OpType& op_type_named(std::string_view name, std::string_view what) {
  for (const OpType* t : op::kBuiltin) {
    if (t->name() == name) return *t;
  }
  std::ostringstream known;
  for (const OpType* t : op::kBuiltin) known << (known.tellp() > 0 ? ", " : "") << t->name();
  throw PlanError(detail::cat(what, ": unknown op '", name, "' (built-in ops: ", known.str(), ")"));
}

}  // namespace remat
