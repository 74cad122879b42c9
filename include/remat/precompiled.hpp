#pragma once
/// @file
/// The header CMake's `REMAT_PRECOMPILE_HEADERS` precompiles for `remat::remat`: everything of
/// remat/remat.hpp except the file formats that read JSON (remat/io, remat/train,
/// hub/llama_config.hpp, hub/peft.hpp), and remat/instances.hpp's `extern template` declarations
/// of the float instantiations that the remat_instances library compiles once.
///
/// Why not the file formats: with GCC, every TU that starts from a precompiled header
/// instantiates again each template that the header's inline functions use (GCC writes the
/// header before instantiating them), and nlohmann/json's parser was half of that: a TU that
/// includes nothing more paid 1.3 s of CPU with them and 0.7 s without (docs/benchmarks.md,
/// "Compile time"). A TU that includes them parses them itself, as it would without the option.
/// A header added to remat/remat.hpp belongs here too (if missing, it is only parsed per TU).

#include "remat/checkpoint/checkpoint.hpp"
#include "remat/checkpoint/plan.hpp"
#include "remat/checkpoint/profile.hpp"
#include "remat/checkpoint/sequential.hpp"
#include "remat/check/gradcheck.hpp"
#include "remat/core/config.hpp"
#include "remat/core/cpu.hpp"
#include "remat/core/error.hpp"
#include "remat/core/float_mode.hpp"
#include "remat/core/grad_mode.hpp"
#include "remat/core/grads.hpp"
#include "remat/core/memory.hpp"
#include "remat/core/parallel.hpp"
#include "remat/core/param_state.hpp"
#include "remat/core/parameter.hpp"
#include "remat/core/print.hpp"
#include "remat/core/quantized.hpp"
#include "remat/core/record.hpp"
#include "remat/core/rng.hpp"
#include "remat/core/shape.hpp"
#include "remat/core/tape.hpp"
#include "remat/core/trace.hpp"
#include "remat/core/tensor.hpp"
#include "remat/core/var.hpp"
#include "remat/train/estimate.hpp"
#include "remat/nn/generate.hpp"
#include "remat/nn/gpt.hpp"
#include "remat/nn/kv_cache.hpp"
#include "remat/nn/layers.hpp"
#include "remat/nn/llama.hpp"
#include "remat/nn/lora.hpp"
#include "remat/nn/module.hpp"
#include "remat/nn/sampling.hpp"
#include "remat/nn/transformer.hpp"
#include "remat/ops/arithmetic.hpp"
#include "remat/ops/attention.hpp"
#include "remat/ops/broadcast_to.hpp"
#include "remat/ops/dropout.hpp"
#include "remat/ops/embedding.hpp"
#include "remat/ops/gemm.hpp"
#include "remat/ops/gemm_bf16.hpp"
#include "remat/ops/layer_norm.hpp"
#include "remat/ops/layout.hpp"
#include "remat/ops/linear.hpp"
#include "remat/ops/quantized_linear.hpp"
#include "remat/ops/loss.hpp"
#include "remat/ops/mask.hpp"
#include "remat/ops/matmul.hpp"
#include "remat/ops/mse_loss.hpp"
#include "remat/ops/reduce.hpp"
#include "remat/ops/rms_norm.hpp"
#include "remat/ops/rope.hpp"
#include "remat/ops/silu.hpp"
#include "remat/ops/softmax.hpp"
#include "remat/ops/unary.hpp"
#include "remat/ops/where.hpp"
#include "remat/optim/adamw.hpp"
#include "remat/optim/clip.hpp"
#include "remat/optim/optimizer.hpp"
#include "remat/optim/schedule.hpp"
#include "remat/optim/sgd.hpp"

#include "remat/instances.hpp"
