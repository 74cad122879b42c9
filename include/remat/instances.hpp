#pragma once
/// @file
/// The float instantiations of remat's templates that the opt-in `remat_instances` library
/// compiles once (src/instances.cpp), declared `extern template` here so that a translation unit
/// which sees this header does not instantiate, optimize and emit them again: the nodes of every
/// op (their forward and backward), the op functions, the tape's recording, the GEMM, the nn
/// modules and the optimizers. With CMake's `REMAT_PRECOMPILE_HEADERS` this header comes in
/// through the precompiled header of `remat::remat`, which also links the library; a program
/// that includes it by hand must link `remat_instances` (or build src/instances.cpp) itself.
///
/// Why: a GCC precompiled header saves parsing only, and a trainer's compile time is mostly the
/// instantiation and code generation of these templates (docs/design.md, "Build"). Other element
/// types (double in gradient checks) are instantiated in the user's TU as before.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "remat/core/record.hpp"
#include "remat/nn/gpt.hpp"
#include "remat/nn/layers.hpp"
#include "remat/nn/llama.hpp"
#include "remat/nn/module.hpp"
#include "remat/nn/transformer.hpp"
#include "remat/ops/arithmetic.hpp"
#include "remat/ops/attention.hpp"
#include "remat/ops/broadcast_to.hpp"
#include "remat/ops/dropout.hpp"
#include "remat/ops/embedding.hpp"
#include "remat/ops/gemm.hpp"
#include "remat/ops/layer_norm.hpp"
#include "remat/ops/layout.hpp"
#include "remat/ops/linear.hpp"
#include "remat/ops/loss.hpp"
#include "remat/ops/mask.hpp"
#include "remat/ops/matmul.hpp"
#include "remat/ops/mse_loss.hpp"
#include "remat/ops/quantized_linear.hpp"
#include "remat/ops/reduce.hpp"
#include "remat/ops/rms_norm.hpp"
#include "remat/ops/rope.hpp"
#include "remat/ops/silu.hpp"
#include "remat/ops/softmax.hpp"
#include "remat/ops/unary.hpp"
#include "remat/ops/where.hpp"
#include "remat/optim/adamw.hpp"
#include "remat/optim/optimizer.hpp"
#include "remat/optim/sgd.hpp"

/// Applies REMAT_X to each instantiation, written as it follows `template` (or `extern
/// template`): this header declares them with REMAT_DETAIL_EXTERN_INSTANCE, src/instances.cpp
/// defines them from the same list, so the two cannot drift apart.
// clang-format off
#define REMAT_FLOAT_INSTANCES(REMAT_X)                                                            \
  /* the tape and its nodes */                                                                    \
  REMAT_X(class remat::Node<float>)                                                               \
  REMAT_X(class remat::detail::Leaf<float>)                                                       \
  REMAT_X(remat::Var<float> remat::detail::record<float>(std::unique_ptr<remat::Node<float>>,     \
                                                         std::span<const remat::Var<float>* const>)) \
  REMAT_X(std::shared_ptr<remat::detail::TapeState> remat::detail::recording_tape<float>(         \
      const char*, std::span<const remat::Var<float>* const>))                                    \
  REMAT_X(std::uint32_t remat::detail::resolve<float>(remat::detail::TapeState&,                  \
                                                      const remat::Var<float>&, const char*,      \
                                                      std::size_t))                               \
  REMAT_X(void remat::detail::gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t,   \
                                          float, const float*, std::int64_t, const float*,        \
                                          std::int64_t, float, float*, std::int64_t))             \
  REMAT_X(class remat::detail::BinaryNode<float>)                                                 \
  REMAT_X(class remat::detail::AddNode<float>)                                                    \
  REMAT_X(class remat::detail::SubNode<float>)                                                    \
  REMAT_X(class remat::detail::MulNode<float>)                                                    \
  REMAT_X(class remat::detail::DivNode<float>)                                                    \
  REMAT_X(class remat::detail::AffineNode<float>)                                                 \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::ExpOp>)                            \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::LogOp>)                            \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::SqrtOp>)                           \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::TanhOp>)                           \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::SigmoidOp>)                        \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::ReluOp>)                           \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::GeluOp>)                           \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::GeluTanhOp>)                       \
  REMAT_X(class remat::detail::UnaryNode<float, remat::detail::SiluOp>)                           \
  REMAT_X(class remat::detail::SwigluNode<float>)                                                 \
  REMAT_X(class remat::detail::LinearNode<float>)                                                 \
  REMAT_X(class remat::detail::QuantizedLinearNode<float>)                                        \
  REMAT_X(class remat::detail::MatmulNode<float>)                                                 \
  REMAT_X(class remat::detail::BroadcastToNode<float>)                                            \
  REMAT_X(class remat::detail::SumAllNode<float>)                                                 \
  REMAT_X(class remat::detail::SumAxisNode<float>)                                                \
  REMAT_X(class remat::detail::MseLossNode<float>)                                                \
  REMAT_X(class remat::detail::CrossEntropyNode<float>)                                           \
  REMAT_X(class remat::detail::LinearCrossEntropyNode<float>)                                     \
  REMAT_X(class remat::detail::SoftmaxNode<float, false>)                                         \
  REMAT_X(class remat::detail::SoftmaxNode<float, true>)                                          \
  REMAT_X(class remat::detail::LayerNormNode<float>)                                              \
  REMAT_X(class remat::detail::RmsNormNode<float>)                                                \
  REMAT_X(class remat::detail::DropoutNode<float>)                                                \
  REMAT_X(class remat::detail::EmbeddingNode<float>)                                              \
  REMAT_X(class remat::detail::WhereNode<float>)                                                  \
  REMAT_X(class remat::detail::MaskedFillNode<float>)                                             \
  REMAT_X(class remat::detail::CausalMaskNode<float>)                                             \
  REMAT_X(class remat::detail::ReshapeNode<float>)                                                \
  REMAT_X(class remat::detail::TransposeNode<float>)                                              \
  REMAT_X(class remat::detail::SliceNode<float>)                                                  \
  REMAT_X(class remat::detail::ConcatNode<float>)                                                 \
  REMAT_X(class remat::detail::RopeNode<float>)                                                   \
  REMAT_X(class remat::detail::AttentionNode<float>)                                        \
  /* the op functions (each checks its inputs and records its node) */                           \
  REMAT_X(remat::Var<float> remat::add<float>(const remat::Var<float>&,                           \
                                              const std::type_identity_t<remat::Var<float>>&))    \
  REMAT_X(remat::Var<float> remat::sub<float>(const remat::Var<float>&,                           \
                                              const std::type_identity_t<remat::Var<float>>&))    \
  REMAT_X(remat::Var<float> remat::mul<float>(const remat::Var<float>&,                           \
                                              const std::type_identity_t<remat::Var<float>>&))    \
  REMAT_X(remat::Var<float> remat::div<float>(const remat::Var<float>&,                           \
                                              const std::type_identity_t<remat::Var<float>>&))    \
  REMAT_X(remat::Var<float> remat::operator+<float>(                                              \
      const remat::Var<float>&, const std::type_identity_t<remat::Var<float>>&))                  \
  REMAT_X(remat::Var<float> remat::operator-<float>(                                              \
      const remat::Var<float>&, const std::type_identity_t<remat::Var<float>>&))                  \
  REMAT_X(remat::Var<float> remat::operator*<float>(                                              \
      const remat::Var<float>&, const std::type_identity_t<remat::Var<float>>&))                  \
  REMAT_X(remat::Var<float> remat::operator/<float>(                                              \
      const remat::Var<float>&, const std::type_identity_t<remat::Var<float>>&))                  \
  REMAT_X(remat::Var<float> remat::neg<float>(const remat::Var<float>&))                          \
  REMAT_X(remat::Var<float> remat::scale<float>(const remat::Var<float>&, float))                 \
  REMAT_X(remat::Var<float> remat::add_scalar<float>(const remat::Var<float>&, float))            \
  REMAT_X(remat::Var<float> remat::exp<float>(const remat::Var<float>&))                          \
  REMAT_X(remat::Var<float> remat::log<float>(const remat::Var<float>&))                          \
  REMAT_X(remat::Var<float> remat::sqrt<float>(const remat::Var<float>&))                         \
  REMAT_X(remat::Var<float> remat::tanh<float>(const remat::Var<float>&))                         \
  REMAT_X(remat::Var<float> remat::sigmoid<float>(const remat::Var<float>&))                      \
  REMAT_X(remat::Var<float> remat::relu<float>(const remat::Var<float>&))                         \
  REMAT_X(remat::Var<float> remat::gelu<float>(const remat::Var<float>&))                         \
  REMAT_X(remat::Var<float> remat::gelu_tanh<float>(const remat::Var<float>&))                    \
  REMAT_X(remat::Var<float> remat::silu<float>(const remat::Var<float>&))                         \
  REMAT_X(remat::Var<float> remat::swiglu<float>(const remat::Var<float>&,                        \
                                                 const std::type_identity_t<remat::Var<float>>&)) \
  REMAT_X(remat::Var<float> remat::linear<float>(const remat::Var<float>&,                        \
                                                 const std::type_identity_t<remat::Var<float>>&,  \
                                                 const std::type_identity_t<remat::Var<float>>&)) \
  REMAT_X(remat::Var<float> remat::linear<float>(const remat::Var<float>&,                        \
                                                 const std::type_identity_t<remat::Var<float>>&)) \
  REMAT_X(remat::Var<float> remat::matmul<float>(const remat::Var<float>&,                        \
                                                 const std::type_identity_t<remat::Var<float>>&)) \
  REMAT_X(remat::Var<float> remat::broadcast_to<float>(const remat::Var<float>&,                  \
                                                       const remat::Shape&))                      \
  REMAT_X(remat::Var<float> remat::sum<float>(const remat::Var<float>&))                          \
  REMAT_X(remat::Var<float> remat::mean<float>(const remat::Var<float>&))                         \
  REMAT_X(remat::Var<float> remat::sum<float>(const remat::Var<float>&, int, bool))               \
  REMAT_X(remat::Var<float> remat::mean<float>(const remat::Var<float>&, int, bool))              \
  REMAT_X(remat::Var<float> remat::mse_loss<float>(                                               \
      const remat::Var<float>&, const std::type_identity_t<remat::Var<float>>&, remat::Reduction)) \
  REMAT_X(remat::Var<float> remat::cross_entropy<float>(const remat::Var<float>&,                 \
                                                        const remat::Tensor<std::int32_t>&))      \
  REMAT_X(remat::Var<float> remat::softmax<float>(const remat::Var<float>&))                      \
  REMAT_X(remat::Var<float> remat::log_softmax<float>(const remat::Var<float>&))                  \
  REMAT_X(remat::Var<float> remat::layer_norm<float>(                                             \
      const remat::Var<float>&, const std::type_identity_t<remat::Var<float>>&,                   \
      const std::type_identity_t<remat::Var<float>>&, float))                                     \
  REMAT_X(remat::Var<float> remat::rms_norm<float>(                                               \
      const remat::Var<float>&, const std::type_identity_t<remat::Var<float>>&, float))           \
  REMAT_X(remat::Var<float> remat::dropout<float>(const remat::Var<float>&, double, bool))        \
  REMAT_X(remat::Var<float> remat::embedding<float>(                                               \
      const remat::Var<float>&, const remat::Tensor<std::int32_t>&, std::int64_t))                 \
  REMAT_X(remat::Var<float> remat::reshape<float>(const remat::Var<float>&, const remat::Shape&)) \
  REMAT_X(remat::Var<float> remat::transpose<float>(const remat::Var<float>&))                    \
  REMAT_X(remat::Var<float> remat::slice<float>(const remat::Var<float>&, std::int64_t,           \
                                                std::int64_t))                                    \
  REMAT_X(remat::Var<float> remat::concat<float>(const std::vector<remat::Var<float>>&))          \
  /* the modules and the optimizers */                                                            \
  REMAT_X(class remat::nn::Module<float>)                                                         \
  REMAT_X(class remat::nn::Linear<float>)                                                         \
  REMAT_X(class remat::nn::Embedding<float>)                                                      \
  REMAT_X(class remat::nn::LayerNorm<float>)                                                      \
  REMAT_X(class remat::nn::Dropout<float>)                                                        \
  REMAT_X(class remat::nn::MLP<float>)                                                            \
  REMAT_X(class remat::nn::CausalSelfAttention<float>)                                            \
  REMAT_X(class remat::nn::TransformerBlock<float>)                                               \
  REMAT_X(class remat::nn::GPT<float>)                                                            \
  REMAT_X(class remat::nn::RMSNorm<float>)                                                        \
  REMAT_X(class remat::nn::LlamaAttention<float>)                                                 \
  REMAT_X(class remat::nn::LlamaMLP<float>)                                                       \
  REMAT_X(class remat::nn::LlamaDecoderLayer<float>)                                              \
  REMAT_X(class remat::nn::Llama<float>)                                                          \
  REMAT_X(class remat::optim::Optimizer<float>)                                                   \
  REMAT_X(class remat::optim::SGD<float>)                                                         \
  REMAT_X(class remat::optim::AdamW<float>)
// clang-format on

/// `extern template` for one entry of REMAT_FLOAT_INSTANCES.
#define REMAT_DETAIL_EXTERN_INSTANCE(...) extern template __VA_ARGS__;

REMAT_FLOAT_INSTANCES(REMAT_DETAIL_EXTERN_INSTANCE)
