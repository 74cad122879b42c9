#pragma once
/// @file
/// The precision a step computes in: float32 throughout, or BF16 training (float master weights,
/// bfloat16 GEMMs and saved activations). PrecisionGuard sets it for a scope on this thread, as
/// NoGradGuard sets grad mode; each op records the precision it ran in, so a checkpoint replay
/// during the backward pass computes as the first pass did, wherever the guard has gone.
///
/// Note [BF16 saves]: under Precision::bf16 a float op's save() (core/node.hpp) keeps a bfloat16
/// copy of each activation it saves instead of the float tensor, and its backward reads a float
/// copy made back from it (exact: every bfloat16 is a float), freed when that backward returns.
/// What stays float:
/// - what a parameter holds (or a view of it: a reshaped weight): it is alive anyway, a copy would
///   add. The step's inputs and constants are copied like activations: a chain's first layer
///   then saves what every other layer saves, and plan::profile, which feeds each layer an input
///   of its own, measures what a step holds;
/// - what an op saves with save_exact(): norms' statistics, the losses' values (issue 24: the
///   reductions, softmax statistics and the loss stay float32);
/// - a checkpoint segment's captured inputs (Note [segment inputs stay float] below).
/// Several ops saving one tensor (the q, k and v projections of one normalized x) share one
/// copy: a cache per thread maps a float buffer to its copy while both live, holding neither.
/// A GEMM's inputs are rounded to bfloat16 by gemm_bf16 anyway, so a GEMM's saved inputs lose
/// nothing; an elementwise op's backward reads its input rounded (relative error 2^-9).
/// A GEMM packs a copy as it is (Node::saved_copy, Node::reads_copy: `linear`'s input in its
/// forward, once saved, and in its weight gradient; `matmul`'s operands in backward): no float
/// tensor is made of it in backward and it is not rounded a second time, the same bits at half the
/// bytes read (remat_bench's gpt step on an AMX Xeon, one thread: 0.59 to 0.54 s,
/// docs/benchmarks.md). A trained chunked loss head packs its input h's copy the same way. Ops
/// that read a copy value by value widen it a piece at a time instead of whole: a unary
/// element-wise op (exp ... gelu_tanh) 1,024 values on the stack, the fused attention one head's
/// probabilities into its slot's buffer; a float tensor of the whole copy was the largest transient
/// of their backward.
///
/// Note [segment inputs stay float]: a segment replays from its captured input; kept float, the
/// replay computes exactly what the first pass did, so checkpointed and plain gradients stay
/// bitwise equal under every plan and policy in BF16 as in float32. The cost is 4 bytes per
/// boundary element instead of 2.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "remat/core/bfloat16.hpp"
#include "remat/core/error.hpp"
#include "remat/core/parallel.hpp"
#include "remat/core/shape_only.hpp"
#include "remat/core/tensor.hpp"

namespace remat {

/// What a step computes in.
enum class Precision {
  f32,   ///< float32 everywhere
  bf16,  ///< bfloat16 GEMMs and saved activations; statistics, losses and the optimizer float
};

inline const char* to_string(Precision p) noexcept { return p == Precision::bf16 ? "bf16" : "f32"; }

/// "f32" or "bf16" (a --dtype flag's value); anything else is an ArgumentError naming `what`.
inline Precision parse_precision(std::string_view text, std::string_view what) {
  if (text == "f32" || text == "float32") return Precision::f32;
  if (text == "bf16" || text == "bfloat16") return Precision::bf16;
  throw ArgumentError(detail::cat(what, ": unknown precision '", text,
                                  "'; expected f32 (or float32) or bf16 (or bfloat16)"));
}

namespace detail {

inline Precision& precision_slot() noexcept {
  thread_local Precision precision = Precision::f32;
  return precision;
}

}  // namespace detail

/// The precision ops recorded now on this thread compute in.
inline Precision current_precision() noexcept { return detail::precision_slot(); }

/// Makes ops on this thread compute in `precision` until the guard ends:
///
///     remat::PrecisionGuard bf16(remat::Precision::bf16);
///     auto loss = model.loss(batch);   // GEMMs and saved activations in bfloat16
///     tape.backward(loss);             // replays compute as recorded
///
/// Precision::bf16 applies to float ops; a double op under it is a UsageError.
class PrecisionGuard {
 public:
  explicit PrecisionGuard(Precision precision) noexcept : previous_(detail::precision_slot()) {
    detail::precision_slot() = precision;
  }
  ~PrecisionGuard() { detail::precision_slot() = previous_; }
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

 private:
  Precision previous_;
};

namespace detail {

/// The bfloat16 copies of float buffers that are alive, by buffer (Note [BF16 saves]).
class Bf16SaveCache {
 public:
  /// Whether a bfloat16 copy of `t`'s elements is alive.
  bool holds(const Tensor<float>& t) const {
    const auto it = copies_.find(WeakTensor<float>(t));
    return it != copies_.end() && !it->second.expired();
  }

  /// The bfloat16 copy of `t`, shared with any op that saved the same elements before while
  /// that copy lives.
  Tensor<std::uint16_t> copy_of(const Tensor<float>& t) {
    const WeakTensor<float> key(t);
    if (auto it = copies_.find(key); it != copies_.end()) {
      Tensor<std::uint16_t> copy = it->second.lock();
      if (copy.defined()) return copy.reshape(t.shape());
      copies_.erase(it);
    }
    Tensor<std::uint16_t> copy = rounded(t);
    copies_.emplace(key, WeakTensor<std::uint16_t>(copy));
    if (copies_.size() >= 2 * swept_size_) sweep();
    return copy;
  }

 private:
  static Tensor<std::uint16_t> rounded(const Tensor<float>& t) {
    Tensor<std::uint16_t> copy(t.shape());
    if (!copy.has_data()) return copy;
    const float* src = t.data();
    std::uint16_t* dst = copy.data();
    parallel_for(t.numel(), 1 << 15, [&](std::int64_t b, std::int64_t e) {
      round_to_bf16(src + b, 1, e - b, dst + b);
    });
    return copy;
  }
  /// Drops the entries whose copy or buffer is gone; amortized, by doubling.
  void sweep() {
    std::erase_if(
        copies_, [](const auto& entry) { return entry.first.expired() || entry.second.expired(); });
    swept_size_ = std::max<std::size_t>(64, copies_.size());
  }

  std::map<WeakTensor<float>, WeakTensor<std::uint16_t>> copies_;
  std::size_t swept_size_ = 64;
};

/// This thread's cache (a tape and its replays run on one thread).
inline Bf16SaveCache& bf16_save_cache() {
  thread_local Bf16SaveCache cache;
  return cache;
}

/// The float tensor a bfloat16 copy holds, in a new (counted) buffer.
inline Tensor<float> widened(const Tensor<std::uint16_t>& copy) {
  Tensor<float> t(copy.shape());
  if (!t.has_data()) return t;
  const std::uint16_t* src = copy.data();
  float* dst = t.data();
  parallel_for(copy.numel(), 1 << 15,
               [&](std::int64_t b, std::int64_t e) { widen_bf16(src + b, e - b, dst + b); });
  return t;
}

}  // namespace detail
}  // namespace remat
