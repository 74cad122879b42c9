#pragma once
/// @file
/// attention(): scaled dot-product attention, one node for every model remat runs. Its options
/// (AttentionOptions) say which keys a query sees (causal or all, a sliding window, packed rows'
/// examples), an additive bias on the scores, how heads share keys and values (grouped-query),
/// whether queries and keys are rotated first (RoPE), the dropout on the weights, and the kernel:
/// `fused` keeps the (B, H, T, T) probabilities for backward, `flash` keeps one log-sum-exp per
/// query row and recomputes them. q, k and v come apart (Llama: three projections) or side by side
/// in one packed tensor (GPT: one projection); heads are read in place from either with strided
/// GEMMs.
///
/// Note [attention by query blocks]: the FlashAttention idea (Dao et al. 2022) on the CPU. Queries
/// are taken `block_rows` at a time; a causal block of rows [i0, i1) sees keys [0, i1) only, so
/// its scores are one (rows x i1) GEMM, its softmax is exact over whole rows (no running rescale
/// is needed, since a block holds whole rows), and its output one more GEMM. The only scratch is
/// one or two (block_rows x T) buffers: O(block_rows T) instead of O(T^2) per head, and nothing
/// kept between forward and backward but the operands and the log-sum-exps. The backward pass
/// recomputes P = exp(S - lse) per block with one GEMM more than the fused kernel's four, but
/// every GEMM skips the keys a block cannot see, about half of the (T x T) work the fused kernel
/// does. The fused kernel is the same loop over one block of all T rows, whose scores are the
/// saved probabilities: the two kernels share every line but where P comes from.
///
/// Packed rows pass `starts` (B, T): for each position, the position its example starts at.
/// Query i then sees keys starts[i] <= j <= i only, and RoPE turns queries and keys by position
/// rope.offset + i - starts[i]: each example is attended as if it had a row of its own. (Under
/// dynamic rope scaling the frequencies stay those of the whole row's length, offset + T, as for
/// a padded row.) The node keeps the tensor (a shared handle, not a copy), so replays read it
/// too; a flash block skips the keys before the first example any of its rows sees.
///
/// A `bias` is kept the same way (the flash kernel's backward adds it again to the recomputed
/// scores): change its values between forward and backward and the gradients are of neither.
///
/// Under Precision::bf16 (core/precision.hpp) the operands it keeps and the fused kernel's
/// probabilities are bfloat16 copies, and its products (q k^T, p v and their gradients) run in
/// gemm_bf16 on a CPU with a tile kernel (AMX or AVX512-BF16); the softmax and the log-sum-exps
/// stay float. On the convert kernel (no BF16 instructions) the products stay float: rounding
/// both operands of each small product there cost more than it saves. They were float on every
/// CPU until rounding ran on wide vectors: packing per head made a GPT step 1.1x slower then; it
/// is now 1.05x faster (docs/benchmarks.md).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "remat/core/elementwise.hpp"
#include "remat/core/record.hpp"
#include "remat/core/rng.hpp"
#include "remat/ops/attention_rows.hpp"
#include "remat/ops/gemm_bf16.hpp"
#include "remat/ops/op_types.hpp"
#include "remat/ops/rope.hpp"

namespace remat {

/// Query rows per block of the flash kernel (Note [attention by query blocks]): a (64 x T) float
/// block is 64 KiB at T = 256, in L2 with the keys it is multiplied with.
inline constexpr std::int64_t kFlashBlockRows = 64;

/// Note [attention by units]: the op's work is cut into units, one per (batch, key/value group),
/// each the heads of its group in order, and the units run in parallel on the pool: a head's
/// GEMMs (T x D by D x T) are too small to split across threads, and splitting them made a
/// 2-thread GPT step's attention slower than one thread's. A unit writes only its own rows and
/// columns (its heads' outputs, its group's dK and dV), so units need no locks, and its GEMMs run
/// whole (inside a parallel loop), with the same bits on any thread count (a lone unit runs on
/// the caller, and its GEMMs split as any other). Units run on kAttentionSlots slots at most,
/// unit u on slot u mod slots, each slot with its own block buffers: the buffers the op counts
/// depend on the shapes only, never on the thread count.
inline constexpr std::int64_t kAttentionSlots = 8;

/// What the attention op keeps for its backward pass. Both compute the same function, to rounding,
/// with the same dropout draws.
/// - fused: the (B, H, T, T) probabilities;
/// - flash: one log-sum-exp per query row (B, H, T); backward recomputes the probabilities by
///   blocks of query rows.
enum class AttentionKernel { fused, flash };

/// "fused" or "flash".
inline const char* to_string(AttentionKernel k) noexcept {
  return k == AttentionKernel::flash ? "flash" : "fused";
}

/// The options of attention(). Defaults: causal multi-head attention, no RoPE, no dropout, fused.
struct AttentionOptions {
  std::int64_t heads = 1;     ///< query heads H
  std::int64_t kv_heads = 0;  ///< key/value heads G dividing H (grouped-query); 0: G = H
  bool causal = true;         ///< query i sees keys j <= i; false: every key of its row
  /// Rotary embeddings applied to queries and keys first (Llama); none: no rotation (GPT).
  std::optional<RopeOptions> rope{};
  /// > 0: query i sees keys i - window < j <= i only (Hugging Face's sliding_window); 0: none.
  std::int64_t window = 0;
  /// Packed rows (B, T): the first position of each position's example; undefined: one example a
  /// row (see the file comment).
  Tensor<std::int32_t> starts{};
  /// Added to the scores Q K^T / sqrt(D) before the softmax: (T, T), or (B or 1, H or 1, T, T)
  /// broadcast over batches and heads (Hugging Face's 4-D float attention masks, ALiBi's slopes
  /// times distances). Finite or -inf, which hides a key; a query whose every key it hides gets
  /// zero weights. A constant, like the masks: no gradient reaches it. Undefined: none.
  Tensor<float> bias{};
  double dropout = 0.0;  ///< probability of dropping an attention weight, in [0, 1)
  AttentionKernel kernel = AttentionKernel::fused;
  std::int64_t block_rows = kFlashBlockRows;  ///< query rows per block of the flash kernel
};

namespace detail {

/// Where one operand's heads sit: head h of position t of batch b starts at
/// data + (b T + t) ld + h D.
template <class P>
struct HeadRows {
  P* data = nullptr;
  std::int64_t ld = 0;
};

/// Packed rows' starts: (B, T), and each example a run of positions, so that position i starts
/// an example (starts[i] == i) or continues the one before it (starts[i] == starts[i - 1]); that
/// also gives 0 <= starts[i] <= i, which the kernels index by. Undefined: nothing to check.
inline void check_starts(const char* op, const Tensor<std::int32_t>& starts, std::int64_t batch,
                         std::int64_t time) {
  if (!starts.defined()) return;
  if (!(starts.shape() == Shape{batch, time})) {
    throw ShapeError(cat(op, ": starts must have the shape (B, T) = ", Shape{batch, time},
                         " of the queries' batch and time, got ", starts.shape()));
  }
  if (shape_only()) return;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int32_t* s = starts.data() + b * time;
    for (std::int64_t i = 0; i < time; ++i) {
      if (s[i] == i || (i > 0 && s[i] == s[i - 1])) continue;
      throw ArgumentError(
          cat(op, ": starts[", b, ", ", i, "] = ", s[i], ": row ", b, " position ", i,
              " must start an example (", i, ")",
              i > 0 ? cat(" or continue the previous position's (", s[i - 1], ")") : std::string(),
              "; starts hold, for each position, the first position of its example"));
    }
  }
}

/// The bias: (T, T) or (B or 1, H or 1, T, T), each value finite or -inf (a hidden key).
inline void check_bias(const Tensor<float>& bias, std::int64_t batch, std::int64_t heads,
                       std::int64_t time) {
  if (!bias.defined()) return;
  const Shape& s = bias.shape();
  const bool ok = (s.rank() == 2 || (s.rank() == 4 && (s[0] == 1 || s[0] == batch) &&
                                     (s[1] == 1 || s[1] == heads))) &&
                  s[s.rank() - 2] == time && s[s.rank() - 1] == time;
  if (!ok) {
    throw ShapeError(cat("attention: bias must be (T, T) or (B or 1, heads or 1, T, T) with B ",
                         batch, ", heads ", heads, ", T ", time, "; got ", s));
  }
  if (shape_only() || !bias.has_data()) return;
  for (std::int64_t i = 0; i < bias.numel(); ++i) {
    const float x = bias[i];
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) {
      throw ArgumentError(cat("attention: bias[", i, "] (flat index of ", s, ") is ", x,
                              "; a bias is finite, or -inf to hide a key"));
    }
  }
}

/// The options' checks that need no shapes: each names the option and its value.
inline void check_attention_options(const AttentionOptions& o) {
  const bool heads_ok =
      o.heads >= 1 && o.kv_heads >= 0 && (o.kv_heads == 0 || o.heads % o.kv_heads == 0);
  if (!heads_ok) {
    throw ArgumentError(cat("attention: kv_heads must divide heads (or be 0: as many), got heads ",
                            o.heads, ", kv_heads ", o.kv_heads));
  }
  if (!(o.dropout >= 0.0 && o.dropout < 1.0))
    throw ArgumentError(cat("attention: dropout must be in [0, 1), got ", o.dropout));
  if (o.block_rows < 1)
    throw ArgumentError(cat("attention: block_rows must be at least 1, got ", o.block_rows));
  check_window("attention", o.window);
  if (!o.causal && (o.window > 0 || o.starts.defined())) {
    throw ArgumentError(
        cat("attention: a sliding window (", o.window,
            ") and packed rows' starts are causal masks; causal = false takes neither"));
  }
  if (o.rope) check_rope_options("attention", *o.rope);
}

template <class T>
class AttentionNode final : public Node<T> {
 public:
  /// `packed`: one input (B, T, (H + 2G) D), q, k and v side by side; else three.
  AttentionNode(std::int64_t batch, std::int64_t time, std::int64_t dim, bool packed,
                AttentionOptions o, std::uint64_t seed)
      : b_(batch),
        t_(time),
        h_(o.heads),
        g_(o.kv_heads == 0 ? o.heads : o.kv_heads),
        d_(dim),
        rep_(h_ / g_),
        packed_(packed),
        flash_(o.kernel == AttentionKernel::flash),
        rows_(flash_ ? std::max<std::int64_t>(1, std::min(o.block_rows, time)) : time),
        slots_(std::min(batch * g_, kAttentionSlots)),
        p_(o.dropout),
        seed_(seed),
        threshold_(static_cast<std::uint32_t>(std::min(o.dropout * 4294967296.0, 4294967295.0))),
        o_(std::move(o)) {}
  const OpType& op_type() const noexcept override { return op::attention; }
  bool runs_shape_only() const noexcept override { return true; }
  double forward_flops(typename Node<T>::Inputs, const Tensor<T>&) const override {
    return attention_flops(b_, h_, t_, d_, rows_, o_.causal);
  }
  // The fused kernel's probabilities under BF16: backward widens one head's at a time into its
  // slot's buffer, never the whole (B, H, T, T) in float, which was the largest transient of a
  // BF16 step's backward pass (Note [BF16 saves]).
  bool reads_copy(int slot) const noexcept override { return slot == kStats; }

  // q: (B, T, H D), k, v: (B, T, G D) -> y: (B, T, H D). Per (b, h), with g = h / (H/G), and
  // block of query rows [i0, i1) seeing keys [k0, k1): S = Q[i0:i1] K_g[k0:k1]^T / sqrt(D) (Q and
  // K rotated first under RoPE), P = softmax(mask(S + bias)), lse = log-sum-exp of each row
  // (flash), y[i0:i1] = dropout(P) V_g[k0:k1]. Columns [0, k0) of S are only set to zero.
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    const std::array<Tensor<T>, 3> held = kept_operands(in);
    Tensor<T> y(Shape{b_, t_, cq()});
    Tensor<T> stats = flash_ ? Tensor<T>(Shape{b_, h_, t_}) : Tensor<T>(Shape{b_, h_, t_, t_});
    Tensor<T> scores = slot_buffers(flash_);
    Tensor<T> dropped = slot_buffers(p_ > 0);
    for (int i = 0; i < 3; ++i) this->save(i, held[static_cast<std::size_t>(i)]);
    if (!shape_only()) forward_blocks(held, y, stats, scores, dropped);
    // Saved once filled, since under BF16 save() copies: the fused kernel's probabilities are an
    // activation like the others (a bfloat16 copy, half the bytes of the largest thing a step
    // keeps), the flash kernel's log-sum-exps softmax statistics that stay float.
    if (flash_) {
      this->save_exact(kStats, stats);
    } else {
      this->save(kStats, stats);
    }
    return y;
  }

  // Per unit (Note [attention by units]), per block (the last first), P = the saved probabilities
  // (fused) or exp(S - lse) (flash); dV_g[k0:k1] += dropout(P)^T dY[i0:i1]; dP = dropout'(dY
  // V_g^T); dS = P (dP - rowsum(dP P)) / sqrt(D); dQ[i0:i1] = dS K_g[k0:k1]; dK_g[k0:k1] += dS^T
  // Q[i0:i1]; under RoPE, dQ and dK are rotated back. The last block of the first head of a group
  // sees every key from its k0 on, so it writes all of the group's dK and dV (the rows before its
  // k0 set to zero: earlier blocks, whose k0 is smaller, add into them).
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    const Operands<const T> x = operands(this->saved(0), this->saved(1), this->saved(2));
    const Tensor<T>& stats = this->saved(kStats);  // undefined when it is a copy (reads_copy)
    const Tensor<std::uint16_t>& probs_copy = this->saved_copy(kStats);
    Gradients g = gradients(grads);
    if (!g.qk && !g.v) return;
    // allocated in a shape-only run too (whose loop runs nothing), as in a real one
    Tensor<T> probs = slot_buffers(flash_ || probs_copy.defined());
    Tensor<T> dp = slot_buffers(g.qk);
    Tensor<T> dropped = slot_buffers(p_ > 0);
    const T scale = T(1) / std::sqrt(T(d_));
    const std::int64_t last = (t_ - 1) / rows_ * rows_;
    for_units([&](std::int64_t b, std::int64_t group, std::int64_t slot) {
      T* const probs_at = probs.defined() ? slot_rows(probs, slot) : nullptr;
      T* const dp_at = g.qk ? slot_rows(dp, slot) : nullptr;
      T* const dropped_at = p_ > 0 ? slot_rows(dropped, slot) : nullptr;
      for (std::int64_t h = group * rep_; h < (group + 1) * rep_; ++h) {
        const KeyRange keys = keys_of(b, h);
        const T* dy = gy.data() + b * t_ * cq() + h * d_;
        if constexpr (std::is_same_v<T, float>) {  // the head's (T, T) probabilities, widened
          if (probs_copy.defined())
            widen_bf16(probs_copy.data() + (b * h_ + h) * t_ * t_, t_ * t_, probs_at);
        }
        for (std::int64_t i0 = last; i0 >= 0; i0 -= rows_) {
          const std::int64_t i1 = std::min(i0 + rows_, t_), rows = i1 - i0;
          const std::int64_t k0 = first_block_key(keys, i0), k1 = keys.block_end(i1);
          const bool first_write = h % rep_ == 0 && i0 == last;
          if (flash_) {
            gemm_in<T>(bf16_gemms(), false, true, rows, k1 - k0, d_, scale,
                       q_at(x.q, b, h) + i0 * x.q.ld, x.q.ld, kv_at(x.k, b, h) + k0 * x.k.ld,
                       x.k.ld, T(0), probs_at + k0, t_);
            softmax_recompute_rows(probs_at, t_, stats.data() + (b * h_ + h) * t_, i0, i1, keys);
          }
          const T* p = probs_at ? probs_at : stats.data() + (b * h_ + h) * t_ * t_;
          const T* weights = dropped_out(p, dropped_at, b, h, i0, i1);
          if (g.v) {
            const bool overwrite = g.overwrite_v && first_write;
            if (overwrite) zero_rows(g.dv, b, h, k0);
            gemm_in<T>(bf16_gemms(), true, false, k1 - k0, d_, rows, T(1), weights + k0, t_,
                       dy + i0 * cq(), cq(), overwrite ? T(0) : T(1),
                       kv_at(g.dv, b, h) + k0 * g.dv.ld, g.dv.ld);
          }
          if (!g.qk) continue;
          gemm_in<T>(bf16_gemms(), false, true, rows, k1 - k0, d_, T(1), dy + i0 * cq(), cq(),
                     kv_at(x.v, b, h) + k0 * x.v.ld, x.v.ld, T(0), dp_at + k0, t_);
          if (p_ > 0) apply_dropout(dp_at, dp_at, b, h, i0, i1);
          softmax_backward_rows(p, dp_at, t_, scale, i0, i1, keys);
          gemm_in<T>(bf16_gemms(), false, false, rows, d_, k1 - k0, T(1), dp_at + k0, t_,
                     kv_at(x.k, b, h) + k0 * x.k.ld, x.k.ld, g.overwrite_qk ? T(0) : T(1),
                     q_at(g.dq, b, h) + i0 * g.dq.ld, g.dq.ld);
          const bool overwrite = g.overwrite_qk && first_write;
          if (overwrite) zero_rows(g.dk, b, h, k0);
          gemm_in<T>(bf16_gemms(), true, false, k1 - k0, d_, rows, T(1), dp_at + k0, t_,
                     q_at(x.q, b, h) + i0 * x.q.ld, x.q.ld, overwrite ? T(0) : T(1),
                     kv_at(g.dk, b, h) + k0 * g.dk.ld, g.dk.ld);
        }
      }
    });
    probs.reset();
    dp.reset();
    dropped.reset();
    finish_gradients(g, grads);
  }

 private:
  static constexpr int kStats = 3;  ///< the saved probabilities (fused) or log-sum-exps (flash)

  /// Whether the products run in bfloat16: under Precision::bf16 on a tile kernel. The convert
  /// kernel (CPUs without BF16 instructions) would round both operands of every small product
  /// into float copies first, which made a GPT step 10 % slower there.
  bool bf16_gemms() const noexcept {
    return std::is_same_v<T, float> && this->bf16 && bf16_kernel() != Bf16Kernel::convert;
  }

  template <class P>
  struct Operands {
    HeadRows<P> q, k, v;
  };

  /// Where backward() writes dQ, dK and dV, and whether each first write overwrites.
  struct Gradients {
    bool qk = false, v = false;  ///< which are needed
    bool overwrite_qk = true, overwrite_v = true;
    HeadRows<T> dq, dk, dv;
    Tensor<T> dq_own, dk_own;  ///< separate inputs: dQ and dK before grads.add (and RoPE's inverse)
  };

  std::int64_t cq() const noexcept { return h_ * d_; }
  std::int64_t ckv() const noexcept { return g_ * d_; }
  std::int64_t packed_width() const noexcept { return cq() + 2 * ckv(); }

  /// The heads of a packed (B, T, (H + 2G) D) buffer: q, then k, then v.
  template <class P>
  Operands<P> packed_operands(P* base) const {
    const std::int64_t ld = packed_width();
    return {{base, ld}, {base + cq(), ld}, {base + cq() + ckv(), ld}};
  }
  template <class P>
  Operands<P> separate_operands(P* q, P* k, P* v) const {
    return {{q, cq()}, {k, ckv()}, {v, ckv()}};
  }

  /// The operands backward() reads: the inputs, or under RoPE the rotated queries and keys with
  /// the values. Returned as tensors, not pointers: the rotated ones live as long as the caller
  /// holds them (the tape saves them only when it records for backward).
  std::array<Tensor<T>, 3> kept_operands(typename Node<T>::Inputs in) const {
    if (packed_) return {in[0], Tensor<T>(), Tensor<T>()};
    if (!o_.rope) return {in[0], in[1], in[2]};
    std::array<Tensor<T>, 3> held{Tensor<T>(in[0].shape()), Tensor<T>(in[1].shape()), in[2]};
    rotate(in[0], in[1], held[0], held[1], false);
    return held;
  }
  /// forward()'s arithmetic: y, and the probabilities (fused) or log-sum-exps (flash) in stats,
  /// unit by unit (Note [attention by units]).
  void forward_blocks(const std::array<Tensor<T>, 3>& held, Tensor<T>& y, Tensor<T>& stats,
                      Tensor<T>& scores, Tensor<T>& dropped) const {
    const Operands<const T> x = operands(held[0], held[1], held[2]);
    const T scale = T(1) / std::sqrt(T(d_));
    for_units([&](std::int64_t b, std::int64_t group, std::int64_t slot) {
      T* const dropped_at = p_ > 0 ? slot_rows(dropped, slot) : nullptr;
      for (std::int64_t h = group * rep_; h < (group + 1) * rep_; ++h) {
        const KeyRange keys = keys_of(b, h);
        for (std::int64_t i0 = 0; i0 < t_; i0 += rows_) {
          const std::int64_t i1 = std::min(i0 + rows_, t_), rows = i1 - i0;
          const std::int64_t k0 = first_block_key(keys, i0), k1 = keys.block_end(i1);
          T* s = flash_ ? slot_rows(scores, slot) : stats.data() + (b * h_ + h) * t_ * t_;
          gemm_in<T>(bf16_gemms(), false, true, rows, k1 - k0, d_, scale,
                     q_at(x.q, b, h) + i0 * x.q.ld, x.q.ld, kv_at(x.k, b, h) + k0 * x.k.ld, x.k.ld,
                     T(0), s + k0, t_);
          softmax_rows(s, t_, flash_ ? stats.data() + (b * h_ + h) * t_ : nullptr, i0, i1, keys);
          const T* weights = dropped_out(s, dropped_at, b, h, i0, i1);
          gemm_in<T>(bf16_gemms(), false, false, rows, d_, k1 - k0, T(1), weights + k0, t_,
                     kv_at(x.v, b, h) + k0 * x.v.ld, x.v.ld, T(0),
                     y.data() + (b * t_ + i0) * cq() + h * d_, cq());
        }
      }
    });
  }

  /// Runs fn(b, group, slot) for every unit (Note [attention by units]): slots_ of them at a
  /// time, unit u = b G + group on slot u mod slots_, a slot's units in order.
  template <class Fn>
  void for_units(Fn&& fn) const {
    const std::int64_t units = b_ * g_;
    parallel_for(slots_, 1, [&](std::int64_t s0, std::int64_t s1) {
      for (std::int64_t slot = s0; slot < s1; ++slot)
        for (std::int64_t u = slot; u < units; u += slots_) fn(u / g_, u % g_, slot);
    });
  }
  /// (slots, block rows, T): one block buffer per slot when `needed`; none otherwise.
  Tensor<T> slot_buffers(bool needed) const {
    return needed ? Tensor<T>(Shape{slots_, rows_, t_}) : Tensor<T>();
  }
  /// The block buffer of one slot.
  T* slot_rows(Tensor<T>& buffers, std::int64_t slot) const {
    return buffers.data() + slot * rows_ * t_;
  }

  /// Where the heads of q, k and v sit in the kept operands.
  Operands<const T> operands(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c) const {
    if (packed_) return packed_operands<const T>(a.data());
    return separate_operands<const T>(a.data(), b.data(), c.data());
  }

  /// Packed: one gradient (B, T, (H + 2G) D) takes dQ, dK and dV in place. Apart: dQ and dK in
  /// buffers of their own (RoPE turns them back before they are added), dV in its target.
  Gradients gradients(Grads<T>& grads) const {
    Gradients g;
    if (packed_) {
      const typename Grads<T>::Target t = grads.target(0, Shape{b_, t_, packed_width()});
      if (!t.dst) return g;
      const Operands<T> d = packed_operands(t.dst->data());
      g.qk = g.v = true;
      g.overwrite_qk = g.overwrite_v = t.overwrite;
      g.dq = d.q, g.dk = d.k, g.dv = d.v;
      return g;
    }
    g.qk = grads.needs(0) || grads.needs(1);
    if (g.qk) {
      g.dq_own = Tensor<T>(Shape{b_, t_, cq()});
      g.dk_own = Tensor<T>(Shape{b_, t_, ckv()});
      g.dq = {g.dq_own.data(), cq()};
      g.dk = {g.dk_own.data(), ckv()};
    }
    const typename Grads<T>::Target dv = grads.target(2, Shape{b_, t_, ckv()});
    g.v = dv.dst != nullptr;
    if (g.v) g.dv = {dv.dst->data(), ckv()}, g.overwrite_v = dv.overwrite;
    return g;
  }
  void finish_gradients(Gradients& g, Grads<T>& grads) const {
    if (packed_ || !g.qk) return;
    if (o_.rope) rotate(g.dq_own, g.dk_own, g.dq_own, g.dk_own, true);
    grads.add(0, std::move(g.dq_own));
    grads.add(1, std::move(g.dk_own));
  }

  /// Rotates queries q into qr and keys k into kr (inverse: rotates back; in place is allowed).
  void rotate(const Tensor<T>& q, const Tensor<T>& k, Tensor<T>& qr, Tensor<T>& kr,
              bool inverse) const {
    if (shape_only()) return;
    const RopeTable<T> table(t_, d_, *o_.rope);
    const std::int32_t* starts = starts_of(0);  // every row's, one after the other
    table.apply(q.data(), cq(), qr.data(), cq(), b_ * t_, t_, h_, inverse, starts);
    table.apply(k.data(), ckv(), kr.data(), ckv(), b_ * t_, t_, g_, inverse, starts);
  }

  /// Head h of batch b: its own rows of the queries, its group's of the keys and values.
  template <class P>
  P* q_at(const HeadRows<P>& r, std::int64_t b, std::int64_t h) const {
    return r.data + b * t_ * r.ld + h * d_;
  }
  template <class P>
  P* kv_at(const HeadRows<P>& r, std::int64_t b, std::int64_t h) const {
    return r.data + b * t_ * r.ld + (h / rep_) * d_;
  }

  /// The starts of batch b's row by position (packed rows), or null (one example per row).
  const std::int32_t* starts_of(std::int64_t b) const {
    return o_.starts.defined() ? o_.starts.data() + b * t_ : nullptr;
  }
  /// The keys head h of batch b sees, and its bias.
  KeyRange keys_of(std::int64_t b, std::int64_t h) const {
    return {.causal = o_.causal,
            .keys = t_,
            .window = o_.window,
            .starts = starts_of(b),
            .bias = bias_of(b, h)};
  }
  /// Head h of batch b's (T x T) bias, broadcast over the dimensions of size 1; null: none.
  const float* bias_of(std::int64_t b, std::int64_t h) const {
    const Tensor<float>& bias = o_.bias;
    if (!bias.defined()) return nullptr;
    if (bias.rank() == 2) return bias.data();
    const std::int64_t heads = bias.dim(1),
                       at = (bias.dim(0) == 1 ? 0 : b) * heads + (heads == 1 ? 0 : h);
    return bias.data() + at * t_ * t_;
  }
  /// The first key any row of the block from query row i0 sees (`keys`: its head's): with packed
  /// rows its first row's (the starts and the window's first keys only grow down a row), which
  /// the block need not multiply by; 0 otherwise, where the products keep their whole-prefix
  /// shape.
  std::int64_t first_block_key(const KeyRange& keys, std::int64_t i0) const {
    return o_.starts.defined() ? keys.first(i0) : 0;
  }

  /// Sets rows [0, n) of head h's key/value head of batch b in a gradient to zero.
  void zero_rows(const HeadRows<T>& r, std::int64_t b, std::int64_t h, std::int64_t n) const {
    for (std::int64_t j = 0; j < n; ++j) ArrayView<T>(kv_at(r, b, h) + j * r.ld, d_).setZero();
  }

  /// The weights a block multiplies the values by: p itself, or p dropped out into `dropped`.
  const T* dropped_out(const T* p, T* dropped, std::int64_t b, std::int64_t h, std::int64_t i0,
                       std::int64_t i1) const {
    if (p_ == 0) return p;
    apply_dropout(p, dropped, b, h, i0, i1);
    return dropped;
  }

  /// dst = src with the dropout mask of rows [i0, i1) of head (b, h) applied (dst may be src).
  /// Element (i, j) draws at counter ((b H + h) T + i) T + j of the node's stream, whichever
  /// kernel runs, so both drop the same weights.
  void apply_dropout(const T* src, T* dst, std::int64_t b, std::int64_t h, std::int64_t i0,
                     std::int64_t i1) const {
    const CounterRng rng = CounterRng::at(seed_, this->id);
    const T keep_scale = static_cast<T>(1.0 / (1.0 - p_));
    const std::uint32_t threshold = threshold_;
    const std::int64_t width = o_.causal ? i1 : t_;
    for_rows(i1 - i0, width, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto base = static_cast<std::uint32_t>(((b * h_ + h) * t_ + i0 + r) * t_);
        const T* sr = src + r * t_;
        T* dr = dst + r * t_;
        for (std::int64_t j = 0; j < width; ++j) {
          dr[j] = rng.bits(base + static_cast<std::uint32_t>(j)) >= threshold ? sr[j] * keep_scale
                                                                              : T(0);
        }
      }
    });
  }

  std::int64_t b_, t_, h_, g_, d_, rep_;
  bool packed_, flash_;
  std::int64_t rows_;   ///< query rows per block: T for the fused kernel
  std::int64_t slots_;  ///< units run at a time (Note [attention by units])
  double p_;
  std::uint64_t seed_;
  std::uint32_t threshold_;
  AttentionOptions o_;
};

/// The shape checks of both overloads: q (B, T, H D) with T >= 1 (and D even under RoPE), k and v
/// (B, T, G D).
inline void check_attention_shapes(const Shape& q, const Shape& k, const Shape& v,
                                   const AttentionOptions& o, const char* given) {
  const std::int64_t kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  const bool ok = q.rank() == 3 && q[1] >= 1 && q[2] % o.heads == 0 &&
                  (!o.rope || (q[2] / o.heads) % 2 == 0) &&
                  k == q.with_last(q[2] / o.heads * kv_heads) && v == k;
  if (!ok) {
    throw ShapeError(cat("attention: needs q (B, T, heads x D) with T >= 1",
                         o.rope ? " and D even (RoPE)" : "", ", k and v (B, T, kv_heads x D); got ",
                         given, ", heads ", o.heads, ", kv_heads ", kv_heads));
  }
}

}  // namespace detail

/// Attention over q (B, T, heads x D) and k, v (B, T, kv_heads x D): returns (B, T, heads x D),
/// the heads' outputs side by side (Hugging Face's layout before o_proj). Query head h reads
/// key/value head h / (heads / kv_heads) (Hugging Face's repeat_kv); each query's weights are the
/// softmax of its scores Q K^T / sqrt(D) over the keys it sees (AttentionOptions), dropped out
/// with probability `dropout`. Under `rope`, queries and keys are first rotated by positions
/// rope.offset + t (+ the example's start with packed rows). Bad shapes are a ShapeError, bad
/// options an ArgumentError, each naming what it was given.
template <class T>
Var<T> attention(const Var<T>& q, const std::type_identity_t<Var<T>>& k,
                 const std::type_identity_t<Var<T>>& v, AttentionOptions o) {
  detail::check_attention_options(o);
  const Shape& s = q.shape();
  detail::check_attention_shapes(
      s, k.shape(), v.shape(), o,
      detail::cat("q ", s, ", k ", k.shape(), ", v ", v.shape()).c_str());
  detail::check_starts("attention", o.starts, s[0], s[1]);
  detail::check_bias(o.bias, s[0], o.heads, s[1]);
  const std::uint64_t seed = detail::rng_seed_for(q);
  return detail::record_op<detail::AttentionNode<T>>({&q, &k, &v}, s[0], s[1], s[2] / o.heads,
                                                     false, std::move(o), seed);
}

/// attention() over q, k and v side by side in one tensor (B, T, (heads + 2 kv_heads) x D), as
/// one projection makes them (GPT's qkv: (B, T, 3C)); read in place, and its gradient written in
/// place. RoPE needs them apart (an ArgumentError here).
template <class T>
Var<T> attention(const Var<T>& qkv, AttentionOptions o) {
  detail::check_attention_options(o);
  if (o.rope) {
    throw ArgumentError(
        detail::cat("attention: RoPE rotates q and k apart; give q, k and v as "
                    "three tensors, not one packed ",
                    qkv.shape()));
  }
  const Shape& s = qkv.shape();
  const std::int64_t kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  const std::int64_t parts = o.heads + 2 * kv_heads;
  if (s.rank() != 3 || s[1] < 1 || s[2] % parts != 0) {
    throw ShapeError(detail::cat(
        "attention: needs packed qkv (B, T, (heads + 2 kv_heads) x D) with T >= 1; got ", s,
        ", heads ", o.heads, ", kv_heads ", kv_heads));
  }
  detail::check_starts("attention", o.starts, s[0], s[1]);
  detail::check_bias(o.bias, s[0], o.heads, s[1]);
  const std::uint64_t seed = detail::rng_seed_for(qkv);
  return detail::record_op<detail::AttentionNode<T>>({&qkv}, s[0], s[1], s[2] / parts, true,
                                                     std::move(o), seed);
}

}  // namespace remat
