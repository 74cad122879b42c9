#pragma once
/// @file
/// gemm_bf16: C = alpha op(A) op(B) + beta C on row-major float buffers, with A and B rounded to
/// bfloat16 (to nearest, ties to even) and the products accumulated in float: the GEMM of 16-bit
/// training (issue: BF16 activations and GEMMs with float master weights). Three kernels, chosen
/// at run time by what the CPU (and, for AMX, the operating system) offers, each forcible:
/// - amx: Intel AMX tiles (TDPBF16PS: a 16 x 32 by 32 x 16 block product per instruction);
/// - avx512_bf16: AVX512-BF16 (VDPBF16PS: 16 lanes of two-element dot products);
/// - convert: rounds A and B to bfloat16 and back to float and runs the float GEMM (ops/gemm.hpp),
///   on every CPU. A product of two bfloat16 values is exact in float, so it computes the same
///   function; only the order of the float additions differs between kernels.
///
/// Note [BF16 GEMM packing]: the inputs are rounded (or, from a saved bfloat16 copy, copied:
/// detail::Bf16Source) and packed once per call into scratch buffers: A into rows of K bfloat16
/// values (K padded with zeros to a multiple of 32: one AMX tile row), B into panels of 16
/// columns in the "VNNI" layout both instructions read, each 32-bit word holding rows 2p and
/// 2p + 1 of one column. Two cases skip work. A bfloat16 copy of A already laid out as the
/// packed rows (M and K multiples of 32; a linear's saved input in a transformer) is read where
/// it is. And a transposed A (a linear's weight gradient, dy^T x) is packed for the
/// avx512_bf16 kernel in panels of 16 rows of op(A), as B is, since A's rows 2p and 2p + 1 are
/// then what a word holds: no transpose, which had made that GEMM's packing cost as much as
/// its products on a Zen 5. Every block of C is computed by one thread over all of K in one fixed
/// order, so the result does not depend on the thread count: run to run and replay to first pass,
/// it is bitwise the same. The scratch is outside the allocator's count, like the float GEMM's
/// (OpenBLAS packs into buffers of its own): ops skip their GEMMs in a shape-only run, so a counted
/// scratch would be a transient that predictions cannot see. Like OpenBLAS's, it is kept by the
/// calling thread from one call to the next (fresh pages for every call cost more than the packing
/// itself: a quarter of a 1024 x 1024 x 1024 product went to page faults on a Zen 5 under KVM, and
/// the convert kernel ran at a fifth of the float GEMM's rate), so a thread that runs BF16 GEMMs
/// holds its largest call's buffers, 2 bytes a value of op(A) and op(B), padded (4, unpadded, in
/// the convert kernel), until memory::release_cache() or the thread's end.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/core/bfloat16.hpp"
#include "remat/core/cpu.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/core/kernel_scratch.hpp"
#include "remat/core/parallel.hpp"
#include "remat/core/shape_only.hpp"
#include "remat/core/tensor.hpp"
#include "remat/ops/gemm.hpp"

#if REMAT_X86
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace remat {

/// The kernels gemm_bf16 can run, in increasing capability.
enum class Bf16Kernel { convert, avx512_bf16, amx };

inline const char* to_string(Bf16Kernel k) noexcept {
  switch (k) {
    case Bf16Kernel::amx:
      return "amx";
    case Bf16Kernel::avx512_bf16:
      return "avx512_bf16";
    case Bf16Kernel::convert:
      break;
  }
  return "convert";
}

namespace detail {

#if REMAT_X86
/// Whether the CPU has AVX512-BF16 (cpuid leaf 7, subleaf 1, EAX bit 5) with AVX-512 usable.
inline bool cpu_has_avx512_bf16() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (cpu_isa() < Isa::avx512 || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1U;
}

/// Whether the CPU has AMX-TILE and AMX-BF16 (cpuid leaf 7, EDX bits 24 and 22) and Linux lets
/// this process use the tile registers (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA):
/// their 8 KiB of state must be asked for once per process).
inline bool amx_usable() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 24) & 1U) || !((d >> 22) & 1U)) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

/// The most capable kernel this machine runs.
inline Bf16Kernel best_bf16_kernel() noexcept {
#if REMAT_X86
  if (amx_usable()) return Bf16Kernel::amx;
  if (cpu_has_avx512_bf16()) return Bf16Kernel::avx512_bf16;
#endif
  return Bf16Kernel::convert;
}

inline Bf16Kernel supported_bf16_kernel() noexcept {
  static const Bf16Kernel best = best_bf16_kernel();
  return best;
}

inline std::atomic<Bf16Kernel>& bf16_kernel_slot() noexcept {
  static std::atomic<Bf16Kernel> kernel{supported_bf16_kernel()};
  return kernel;
}

/// K padded to whole AMX tile rows (32 bfloat16 values), and M and N to whole 32 x 32 blocks of
/// C (two AMX tiles a side; four of AVX-512's 8 rows, two 16-column panels).
inline std::int64_t padded_k(std::int64_t k) noexcept { return (k + 31) / 32 * 32; }
inline std::int64_t padded_block(std::int64_t n) noexcept { return (n + 31) / 32 * 32; }

/// A GEMM operand, row-major with rows `ld` values apart: float values, rounded to bfloat16 as
/// they are packed, or bfloat16 values already (an op's saved copy, Note [BF16 saves] in
/// core/precision.hpp), copied. Both give the same packed bits, since rounding a bfloat16 value
/// changes nothing; the copy is read at half the bytes and not rounded again.
struct Bf16Source {
  const float* values = nullptr;
  const std::uint16_t* bf16 = nullptr;  ///< used when set
  std::int64_t ld = 0;

  /// Values [c0, c0 + n) of row r in bfloat16 into out.
  void row(std::int64_t r, std::int64_t c0, std::int64_t n, std::uint16_t* out) const noexcept {
    if (bf16) {
      std::memcpy(out, bf16 + r * ld + c0, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
    } else {
      round_to_bf16(values + r * ld + c0, 1, n, out);
    }
  }
};

/// op(A) = A^T packed, 32 x 32 values at a time: 32 rows of A (32 values of K) read in order
/// and rounded into a tile, then written out as 32 runs of op(A)'s rows, so that neither A nor
/// the packed rows are strided through.
inline void pack_a_bf16_transposed(std::int64_t m, std::int64_t k, const Bf16Source& a,
                                   std::uint16_t* out) {
  const std::int64_t kp = padded_k(k);
  for_rows(padded_block(m) / 32, 32 * kp, [&](std::int64_t b0, std::int64_t b1) {
    std::uint16_t tile[32][32];  // [value of K][row of op(A)]
    for (std::int64_t block = b0; block < b1; ++block) {
      const std::int64_t r0 = block * 32, rows = std::clamp<std::int64_t>(m - r0, 0, 32);
      for (std::int64_t i0 = 0; i0 < kp; i0 += 32) {
        for (std::int64_t i = 0; i < 32; ++i) {
          const bool inside = i0 + i < k;
          if (inside) a.row(i0 + i, r0, rows, tile[i]);
          std::fill(tile[i] + (inside ? rows : 0), tile[i] + 32, std::uint16_t{0});
        }
        for (std::int64_t r = 0; r < 32; ++r) {
          std::uint16_t* dst = out + (r0 + r) * kp + i0;
          for (std::int64_t i = 0; i < 32; ++i) dst[i] = tile[i][r];
        }
      }
    }
  });
}

/// op(A) (m x k) as padded_block(m) rows of padded_k(k) bfloat16 values, zeros past the ends.
inline void pack_a_bf16(bool trans, std::int64_t m, std::int64_t k, const Bf16Source& a,
                        std::uint16_t* out) {
  if (trans) {
    pack_a_bf16_transposed(m, k, a, out);
    return;
  }
  const std::int64_t kp = padded_k(k);
  for_rows(padded_block(m), kp, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      std::uint16_t* row = out + r * kp;
      const std::int64_t inside = r < m ? k : 0;
      if (inside > 0) a.row(r, 0, k, row);
      std::fill(row + inside, row + kp, std::uint16_t{0});
    }
  });
}

/// The VNNI word of two bfloat16 values: `low` from row 2p of op(B), `high` from row 2p + 1.
inline std::uint32_t vnni_word(std::uint16_t low, std::uint16_t high) noexcept {
  return std::uint32_t{low} | std::uint32_t{high} << 16;
}

#if REMAT_X86
/// The words (pairs of bfloat16 values) of 16 rows of `words` words each, rows `ld` values
/// apart, transposed into `out`: word w of row j becomes word j of out's row w (16 words, 64
/// bytes). Four stages of shuffles per 16 x 16 words: the scalar loop, a word at a time, was a
/// tenth of the mlp benchmark's BF16 step on a Zen 5. `words` is a multiple of 16.
__attribute__((target("avx512f"))) inline void transpose_words_avx512(const std::uint16_t* rows,
                                                                      std::int64_t ld,
                                                                      std::int64_t words,
                                                                      std::uint16_t* out) {
  // Masked forms with every lane written: the same instructions, but GCC 12 warns that the
  // unmasked forms' merge source (an undefined vector) may be used uninitialized.
  const __mmask16 all = 0xffff;
  const __mmask8 all64 = 0xff;
  for (std::int64_t w0 = 0; w0 < words; w0 += 16) {
    __m512i r[16], t[16];
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(rows + j * ld + 2 * w0);
    // within each 128-bit lane, the rows' words in pairs, then in fours: r[4g + c]'s lane L
    // then holds word 4L + c of rows 4g .. 4g + 3
    for (int j = 0; j < 16; j += 2) {
      t[j] = _mm512_mask_unpacklo_epi32(r[j], all, r[j], r[j + 1]);
      t[j + 1] = _mm512_mask_unpackhi_epi32(r[j], all, r[j], r[j + 1]);
    }
    for (int g = 0; g < 16; g += 4) {
      r[g] = _mm512_mask_unpacklo_epi64(t[g], all64, t[g], t[g + 2]);
      r[g + 1] = _mm512_mask_unpackhi_epi64(t[g], all64, t[g], t[g + 2]);
      r[g + 2] = _mm512_mask_unpacklo_epi64(t[g + 1], all64, t[g + 1], t[g + 3]);
      r[g + 3] = _mm512_mask_unpackhi_epi64(t[g + 1], all64, t[g + 1], t[g + 3]);
    }
    // then each c's 4 x 4 lanes transposed: out's row w0 + 4L + c is lane L of r[c], r[4 + c],
    // r[8 + c] and r[12 + c]
    for (int c = 0; c < 4; ++c) {
      const __m512i v0 = _mm512_mask_shuffle_i32x4(r[c], all, r[c], r[4 + c], 0x44);
      const __m512i v1 = _mm512_mask_shuffle_i32x4(r[c], all, r[c], r[4 + c], 0xee);
      const __m512i v2 = _mm512_mask_shuffle_i32x4(r[8 + c], all, r[8 + c], r[12 + c], 0x44);
      const __m512i v3 = _mm512_mask_shuffle_i32x4(r[8 + c], all, r[8 + c], r[12 + c], 0xee);
      std::uint16_t* dst = out + (w0 + c) * 32;
      _mm512_storeu_si512(dst, _mm512_mask_shuffle_i32x4(v0, all, v0, v2, 0x88));
      _mm512_storeu_si512(dst + 4 * 32, _mm512_mask_shuffle_i32x4(v0, all, v0, v2, 0xdd));
      _mm512_storeu_si512(dst + 8 * 32, _mm512_mask_shuffle_i32x4(v1, all, v1, v3, 0x88));
      _mm512_storeu_si512(dst + 12 * 32, _mm512_mask_shuffle_i32x4(v1, all, v1, v3, 0xdd));
    }
  }
}

/// A panel's 16 row pairs: pair i from rows 2i (low halves) and 2i + 1 (high) of `rows`, 16
/// bfloat16 values each, `ld` values apart; its 16 words at out + 32 i.
__attribute__((target("avx512f"))) inline void interleave_pairs_avx512(const std::uint16_t* rows,
                                                                       std::int64_t ld,
                                                                       std::uint16_t* out) {
  const __mmask16 all = 0xffff;  // masked forms: see transpose_words_avx512
  for (std::int64_t i = 0; i < 16; ++i) {
    const std::uint16_t* even = rows + 2 * i * ld;
    // unaligned 32-byte loads, which may alias the bfloat16 values
    const __m512i low = _mm512_maskz_cvtepu16_epi32(
        all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(even)));
    const __m512i high = _mm512_maskz_cvtepu16_epi32(
        all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + ld)));
    _mm512_storeu_si512(out + i * 32, _mm512_or_si512(low, _mm512_maskz_slli_epi32(all, high, 16)));
  }
}
#endif

/// Whether the packing's shuffles may use AVX-512 (remat::set_isa forces the scalar loops, which
/// write the same bits, on any CPU).
inline bool pack_with_avx512() noexcept {
#if REMAT_X86
  return active_isa() >= Isa::avx512;
#else
  return false;
#endif
}

/// A panel's 16 row pairs (interleave_pairs_avx512), by AVX-512 shuffles or by a scalar loop
/// that writes the same bits.
inline void interleave_pairs(const std::uint16_t* rows, std::int64_t ld, std::uint16_t* out) {
#if REMAT_X86
  if (pack_with_avx512()) {
    interleave_pairs_avx512(rows, ld, out);
    return;
  }
#endif
  for (std::int64_t i = 0; i < 16; ++i) {
    std::uint32_t row_pair[16];
    for (std::int64_t j = 0; j < 16; ++j)
      row_pair[j] = vnni_word(rows[2 * i * ld + j], rows[(2 * i + 1) * ld + j]);
    std::memcpy(out + i * 32, row_pair, sizeof row_pair);
  }
}

/// op(B) = B^T packed, B's rows made in bfloat16 by `rows(r0, r1, out)`: column c of op(B) is
/// row c of B, whose consecutive values make up one VNNI word each. A panel's 16 rows are made
/// into a buffer, whose words are then written out a row pair (16 words, 64 bytes) at a time.
template <class Rows>
void pack_b_bf16_transposed(std::int64_t k, std::int64_t n, std::int64_t panels, Rows& rows,
                            std::uint16_t* out) {
  const std::int64_t kp = padded_k(k);
  for_rows(panels, kp * 16, [&](std::int64_t p0, std::int64_t p1) {
    // 16 rows of B: 32 bytes a value of K, outside the allocator's count like the scratch
    std::vector<std::uint16_t> block(static_cast<std::size_t>(16 * kp));
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t made = std::clamp<std::int64_t>(n - p * 16, 0, 16);
      if (made > 0) rows(p * 16, p * 16 + made, block.data(), kp);
      for (std::int64_t j = 0; j < 16; ++j)
        std::fill(block.data() + j * kp + (j < made ? k : 0), block.data() + (j + 1) * kp,
                  std::uint16_t{0});
      std::uint16_t* panel = out + p * kp * 16;
#if REMAT_X86
      if (pack_with_avx512()) {
        transpose_words_avx512(block.data(), kp, kp / 2, panel);
        continue;
      }
#endif
      for (std::int64_t q = 0; q < kp / 2; ++q) {
        std::uint32_t row_pair[16];
        for (std::int64_t j = 0; j < 16; ++j)
          row_pair[j] = vnni_word(block[j * kp + 2 * q], block[j * kp + 2 * q + 1]);
        std::memcpy(panel + q * 32, row_pair, sizeof row_pair);
      }
    }
  });
}

/// op(B) (k x n) as `panels` panels of 16 columns, one after the other, zeros past the ends;
/// within a panel, row pair p's 16 words, each holding rows 2p (low half) and 2p + 1 (high half)
/// of one column. B's rows are made in bfloat16 by `rows(r0, r1, out, ld)` (rows [r0, r1) of B,
/// ld values apart: op(B) = B^T when `trans`), 32 rows of op(B) at a time, then written panel by
/// panel: 16 pairs, 1 KiB in a row. A pair at a time wrote 64 bytes to every panel, panels
/// 32 kp bytes apart, all in one set of the L1 cache when kp is a multiple of 128: packing a
/// 1024 x 1024 weight's rows took 0.37 ms on a Zen 5, 0.20 ms a block at a time.
template <class Rows>
void pack_b_bf16_rows(bool trans, std::int64_t k, std::int64_t n, std::int64_t panels, Rows&& rows,
                      std::uint16_t* out) {
  if (trans) {
    pack_b_bf16_transposed(k, n, panels, rows, out);
    return;
  }
  const std::int64_t kp = padded_k(k), width = panels * 16;
  for_rows(kp / 32, 32 * width, [&](std::int64_t b0, std::int64_t b1) {
    // 32 rows of op(B): 64 bytes a column, outside the allocator's count like the scratch
    std::vector<std::uint16_t> block(static_cast<std::size_t>(32 * width));
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t r0 = 32 * b, made = std::clamp<std::int64_t>(k - r0, 0, 32);
      if (made > 0) rows(r0, r0 + made, block.data(), width);
      for (std::int64_t r = 0; r < 32; ++r)
        std::fill(block.data() + r * width + (r < made ? n : 0), block.data() + (r + 1) * width,
                  std::uint16_t{0});
      for (std::int64_t p = 0; p < panels; ++p)
        interleave_pairs(block.data() + p * 16, width, out + p * kp * 16 + r0 * 16);
    }
  });
}

/// B's rows [r0, r1), `cols` values each, in bfloat16 into out, ld values apart.
inline auto source_rows(const Bf16Source& b, std::int64_t cols) {
  return [=](std::int64_t r0, std::int64_t r1, std::uint16_t* out, std::int64_t ld) {
    for (std::int64_t r = r0; r < r1; ++r) b.row(r, 0, cols, out + (r - r0) * ld);
  };
}

/// C's block [i0, i0 + rows) x [j0, j0 + cols) = alpha * block + beta * C (beta 0: C is not
/// read, so it may hold anything), or alpha * block + bias (bias[j] for column j0 + j) when a
/// bias row is given: the bits of beta = 1 on a C filled with the bias, without writing C twice
/// and reading it back (a linear's bias).
inline void write_block(const float* block, std::int64_t ld_block, std::int64_t rows,
                        std::int64_t cols, float alpha, float beta, const float* bias, float* c,
                        std::int64_t ldc) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* src = block + i * ld_block;
    float* dst = c + i * ldc;
    if (bias) {  // three loops, each one the compiler vectorizes
      for (std::int64_t j = 0; j < cols; ++j) dst[j] = alpha * src[j] + bias[j];
    } else if (beta == 0) {
      for (std::int64_t j = 0; j < cols; ++j) dst[j] = alpha * src[j];
    } else {
      for (std::int64_t j = 0; j < cols; ++j) dst[j] = alpha * src[j] + beta * dst[j];
    }
  }
}

/// Where a 32 x 32 block of A B goes: C's corner of `rows` x `cols` (at most 32 each) at `c`,
/// rows `ldc` apart, written as write_block writes it.
struct BlockOut {
  std::int64_t rows, cols;
  float alpha, beta;
  const float* bias;  ///< the block's first column of the bias row, or null
  float* c;
  std::int64_t ldc;
};

#if REMAT_X86
/// One 32 x 32 block of A B from the packed operands, by AVX512-BF16, written into C: 8 rows at
/// a time, two panels of 16 columns, one VDPBF16PS per (row, panel) and row pair. A's block is
/// packed in rows (pack_a_bf16), or, with `APanels`, in panels as B is (Note [BF16 GEMM
/// packing]); either way the same pairs meet the same panels in the same order. The
/// accumulators go to C by write_block's arithmetic (alpha times the sum, plus the bias or beta
/// C), masked to the block's corner: without a float block in between, C is written once, 64
/// bytes at a time, and rows past the corner are not computed.
template <bool APanels>
__attribute__((target("avx512f,avx512bf16"))) inline void block_avx512_bf16(const std::uint16_t* a,
                                                                            const std::uint16_t* b0,
                                                                            const std::uint16_t* b1,
                                                                            std::int64_t kp,
                                                                            const BlockOut& out) {
  // where row r0 + r's pair p of values is: rows of kp values, or panels of 16 rows by pairs
  const std::int64_t row_step = APanels ? 2 : kp, pair_step = APanels ? 32 : 2;
  const auto lanes = [](std::int64_t n) {
    return static_cast<__mmask16>(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1);
  };
  const __mmask16 mask[2] = {lanes(out.cols), lanes(out.cols - 16)};
  const __m512 alpha = _mm512_set1_ps(out.alpha), beta = _mm512_set1_ps(out.beta);
  for (int r0 = 0; r0 < out.rows; r0 += 8) {
    const std::uint16_t* rows = APanels ? a + r0 / 16 * kp * 16 + r0 % 16 * 2 : a + r0 * kp;
    // Both loops over the 8 rows are unrolled whatever the optimization level: GCC 12 leaves
    // them rolled at -O2 and -O1, acc then lives in memory, and the kernel ran at a third of its
    // -O3 rate (123 against 345 GFLOP/s on a Zen 5; a BF16 step slower than float32's).
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
    for (std::int64_t p = 0; p < kp / 2; ++p) {
      const __m512bh v0 = (__m512bh)_mm512_loadu_si512(b0 + p * 32);
      const __m512bh v1 = (__m512bh)_mm512_loadu_si512(b1 + p * 32);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        std::uint32_t pair;
        std::memcpy(&pair, rows + r * row_step + p * pair_step, sizeof pair);
        const __m512bh u = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], u, v0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], u, v1);
      }
    }
    for (int r = 0; r < 8 && r0 + r < out.rows; ++r) {
      float* dst = out.c + (r0 + r) * out.ldc;
      for (int h = 0; h < 2; ++h) {
        if (mask[h] == 0) continue;
        __m512 v = _mm512_mul_ps(alpha, acc[r][h]);
        if (out.bias) {
          v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[h], out.bias + 16 * h));
        } else if (out.beta != 0) {
          v = _mm512_add_ps(v, _mm512_mul_ps(beta, _mm512_maskz_loadu_ps(mask[h], dst + 16 * h)));
        }
        _mm512_mask_storeu_ps(dst + 16 * h, mask[h], v);
      }
    }
  }
}

/// The tile configuration of block_amx: tiles 0-3 the four 16 x 16 float quarters of C, 4-5
/// two 16-row slices of A (32 bfloat16 values a row), 6-7 two 16-pair slices of B panels.
struct alignas(64) AmxConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

/// One 32 x 32 block of A B from the packed operands, by AMX: per 32 values of K, two A tiles
/// and two B tiles, four TDPBF16PS. The tiles must be configured (AmxTiles).
__attribute__((target("amx-tile,amx-bf16"))) inline void block_amx(const std::uint16_t* a,
                                                                   const std::uint16_t* b0,
                                                                   const std::uint16_t* b1,
                                                                   std::int64_t kp, float* out) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const long a_stride = static_cast<long>(kp * 2);
  for (std::int64_t k0 = 0; k0 < kp; k0 += 32) {
    _tile_loadd(4, a + k0, a_stride);
    _tile_loadd(5, a + 16 * kp + k0, a_stride);
    _tile_loadd(6, b0 + k0 * 16, 64);
    _tile_loadd(7, b1 + k0 * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 16, 128);
  _tile_stored(2, out + 16 * 32, 128);
  _tile_stored(3, out + 16 * 32 + 16, 128);
}

/// This thread's tiles configured for block_amx while the scope lasts (loading a configuration
/// costs more than a block's products at small K: once per chunk of blocks, not per block).
struct AmxTiles {
  __attribute__((target("amx-tile"))) AmxTiles() {
    static const AmxConfig config;
    _tile_loadconfig(&config);
  }
  __attribute__((target("amx-tile"))) ~AmxTiles() { _tile_release(); }
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
};
#endif

/// Note [BF16 block order]: the tile kernels compute C by blocks of 32 x 32, each over all of K,
/// and the threads take contiguous runs of blocks in this order: bands of rows whose packed A
/// (2 bytes a value) fits in kBf16BandBytes, and in a band, its blocks down one column of blocks
/// after another. The band's A stays in the core's L2 cache while B's panels go by, each read
/// once per band and reused from L1 down the band. Down whole columns, as before, A was read
/// again for every column of blocks; a transformer's activations (2,048 rows of K = 256 to 2,048
/// values: 1 to 8 MiB) do not stay in L2, and a BF16 GPT step on a Zen 5 (1 MiB of L2 a core)
/// was 3 to 9 % slower (docs/benchmarks.md). Half a server core's L2 (1 to 2 MiB on Zen 4 and 5
/// and Intel's since Skylake): the band and B's panel fit together, and an A that fits whole (the
/// benchmark mlp's, 256 x 1,024) makes one band, the order before, where bands of a quarter read
/// B twice and were slower. The order decides only which block comes when: every block's bits
/// are the same.
inline constexpr std::int64_t kBf16BandBytes = 512 << 10;

/// gemm_bf16 by a tile kernel (amx or avx512_bf16) over 32 x 32 blocks of C, in parallel; B's
/// rows made in bfloat16 by `b_rows` (pack_b_bf16_rows); a bias row added in place of beta C
/// when given (write_block).
template <class Rows>
void gemm_bf16_blocks(Bf16Kernel kernel, bool ta, bool tb, std::int64_t m, std::int64_t n,
                      std::int64_t k, float alpha, const Bf16Source& a, Rows&& b_rows, float beta,
                      const float* bias, float* c, std::int64_t ldc) {
  const std::int64_t kp = padded_k(k), mp = padded_block(m), np = padded_block(n);
  if (shape_only()) return;
  // A bfloat16 copy whose rows are already the packed rows (K and M multiples of 32, the rows
  // contiguous: a linear's saved input, in a transformer) is read where it is, not copied.
  const bool a_packed = !ta && a.bf16 && a.ld == k && k == kp && m == mp;
  // A^T in panels, made as B's are, without a transpose (Note [BF16 GEMM packing]); AMX loads
  // tiles of rows
  const bool a_panels = ta && kernel == Bf16Kernel::avx512_bf16;
  // not a structured binding: the lambdas below capture them (clang before 16 cannot)
  const std::pair<std::uint16_t*, std::uint16_t*> packed =
      kernel_scratch().reserve<std::uint16_t>(a_packed ? 0 : mp * kp, np * kp);
  const std::uint16_t* const pa = a_packed ? a.bf16 : packed.first;
  std::uint16_t* const pb = packed.second;
  if (a_panels) {
    pack_b_bf16_rows(false, k, m, mp / 16, source_rows(a, m), packed.first);
  } else if (!a_packed) {
    pack_a_bf16(ta, m, k, a, packed.first);
  }
  pack_b_bf16_rows(tb, k, n, np / 16, b_rows, pb);
  const std::int64_t row_blocks = mp / 32, col_blocks = np / 32;
  // Note [BF16 block order]
  const std::int64_t band = std::clamp<std::int64_t>(kBf16BandBytes / (64 * kp), 1, row_blocks);
  const auto blocks = [&](std::int64_t s, std::int64_t e, auto&& product) {
    for (std::int64_t t = s; t < e; ++t) {
      const std::int64_t first = t / (band * col_blocks) * band;  // the band's first row block
      const std::int64_t rows = std::min(band, row_blocks - first), u = t - first * col_blocks;
      const std::int64_t i0 = (first + u % rows) * 32, j0 = u / rows * 32;
      const std::uint16_t* b0 = pb + (j0 / 16) * kp * 16;
      product(pa + i0 * kp, b0, b0 + kp * 16, kp,
              BlockOut{std::min<std::int64_t>(32, m - i0), std::min<std::int64_t>(32, n - j0),
                       alpha, beta, bias ? bias + j0 : nullptr, c + i0 * ldc + j0, ldc});
    }
  };
  parallel_for(row_blocks * col_blocks, 1, [&](std::int64_t s, std::int64_t e) {
#if REMAT_X86
    if (kernel == Bf16Kernel::amx) {
      const AmxTiles tiles;
      alignas(64) float block[32 * 32];  // AMX stores whole tiles: C's corner is written after
      blocks(s, e,
             [&](const std::uint16_t* a0, const std::uint16_t* b0, const std::uint16_t* b1,
                 std::int64_t kp0, const BlockOut& out) {
               block_amx(a0, b0, b1, kp0, block);
               write_block(block, 32, out.rows, out.cols, out.alpha, out.beta, out.bias, out.c,
                           out.ldc);
             });
    } else if (a_panels) {
      blocks(s, e, block_avx512_bf16<true>);
    } else {
      blocks(s, e, block_avx512_bf16<false>);
    }
#else
    (void)kernel, (void)s, (void)e, (void)blocks;
#endif
  });
}

/// gemm_bf16 by the convert kernel: the inputs rounded to bfloat16 and back (B's rows made in
/// bfloat16 by `b_rows`), then the float GEMM.
template <class Rows>
void gemm_bf16_convert(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       float alpha, const Bf16Source& a, Rows&& b_rows, float beta, float* c,
                       std::int64_t ldc) {
  const std::int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  if (shape_only()) return;
  const std::pair<float*, float*> rounded = kernel_scratch().reserve<float>(ar * ac, br * bc);
  float* const ra = rounded.first;  // named, not bound: the lambdas below capture them
  float* const rb = rounded.second;
  const auto widen_rows = [](std::int64_t rows, std::int64_t cols, auto&& make, float* out) {
    for_rows(rows, cols, [&](std::int64_t r0, std::int64_t r1) {
      // a row at a time in bfloat16: 2 bytes a column, outside the count like the scratch
      std::vector<std::uint16_t> row(static_cast<std::size_t>(cols));
      for (std::int64_t r = r0; r < r1; ++r) {
        make(r, row.data());
        widen_bf16(row.data(), cols, out + r * cols);
      }
    });
  };
  widen_rows(
      ar, ac, [&](std::int64_t r, std::uint16_t* row) { a.row(r, 0, ac, row); }, ra);
  widen_rows(
      br, bc, [&](std::int64_t r, std::uint16_t* row) { b_rows(r, r + 1, row, bc); }, rb);
  gemm<float>(ta, tb, m, n, k, alpha, ra, ac, rb, bc, beta, c, ldc);
}

/// gemm_bf16 by the machine's kernel, B's rows made by `b_rows` (the public overloads' body).
/// With a bias row (n values), C = alpha op(A) op(B) + bias on every row, and beta is not used:
/// the same bits as beta = 1 on a C filled with the bias.
template <class Rows>
void gemm_bf16_rows(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const Bf16Source& a, Rows&& b_rows, float beta, float* c, std::int64_t ldc,
                    const float* bias = nullptr) {
  if (m <= 0 || n <= 0 || shape_only()) return;
  const Bf16Kernel kernel = bf16_kernel_slot().load(std::memory_order_relaxed);
  if (bias && (k <= 0 || kernel == Bf16Kernel::convert)) {
    fill_rows(m, n, bias, c, ldc);
    beta = 1;
  }
  if (k <= 0) {  // nothing to add: C = beta C
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0 : beta * c[i * ldc + j];
    return;
  }
  if (kernel == Bf16Kernel::convert) {
    gemm_bf16_convert(ta, tb, m, n, k, alpha, a, b_rows, beta, c, ldc);
    return;
  }
  gemm_bf16_blocks(kernel, ta, tb, m, n, k, alpha, a, b_rows, beta, bias, c, ldc);
}

}  // namespace detail

/// The most capable BF16 kernel this machine runs (amx, then avx512_bf16, else convert).
inline Bf16Kernel supported_bf16_kernel() noexcept { return detail::supported_bf16_kernel(); }

/// The kernel gemm_bf16 runs: supported_bf16_kernel() unless set_bf16_kernel() chose another.
inline Bf16Kernel bf16_kernel() noexcept {
  return detail::bf16_kernel_slot().load(std::memory_order_relaxed);
}

/// Makes gemm_bf16 run `kernel` (for tests and benchmarks: every machine runs convert and
/// whatever it supports). Throws a UsageError naming the kernel and the machine's best when this
/// machine cannot run it. Call it between GEMMs, not while another thread runs one.
inline void set_bf16_kernel(Bf16Kernel kernel) {
  if (kernel > supported_bf16_kernel()) {
    throw UsageError(detail::cat("set_bf16_kernel: this machine cannot run the ", to_string(kernel),
                                 " kernel; it runs up to ", to_string(supported_bf16_kernel())));
  }
  detail::bf16_kernel_slot().store(kernel, std::memory_order_relaxed);
}

/// Row-major C = alpha op(A) op(B) + beta C, with op(A) m x k and op(B) k x n rounded to bfloat16
/// and the products summed in float (see the file comment); lda, ldb, ldc are row strides, and
/// beta = 0 does not read C. Deterministic: the same inputs give the same bits on any thread
/// count. Error bound (each element, u = 2^-8 bfloat16's unit roundoff, k terms): |C - exact| <=
/// (2u + u^2 + k 2^-24 (1 + u)^2) sum_i |a_i| |b_i|, the inputs' rounding plus float's
/// accumulation.
inline void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      float alpha, const float* a, std::int64_t lda, const float* b,
                      std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  detail::gemm_bf16_rows(trans_a, trans_b, m, n, k, alpha, detail::Bf16Source{a, nullptr, lda},
                         detail::source_rows(detail::Bf16Source{b, nullptr, ldb}, trans_b ? k : n),
                         beta, c, ldc);
}

/// A matrix held in another format whose rows are made in bfloat16 on demand: a frozen weight
/// (QuantizedWeight::dequantize_rows_bf16), so that it feeds gemm_bf16 without a float copy.
/// `make(r0, r1, out)` writes rows [r0, r1), `cols` values each, one after the other; gemm_bf16
/// calls it from several threads at once, on disjoint rows, and never for an empty range.
struct Bf16Rows {
  std::int64_t rows = 0, cols = 0;
  std::function<void(std::int64_t r0, std::int64_t r1, std::uint16_t* out)> make;
};

/// gemm_bf16 with B made by `b`: (n, k) when trans_b (op(B) = B^T), else (k, n). The same
/// values as gemm_bf16 on B's float values (rounding a bfloat16 value changes nothing), and the
/// same bits in the forward direction (trans_b). Throws a ShapeError when `b` does not fit.
inline void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      float alpha, const float* a, std::int64_t lda, const Bf16Rows& b, float beta,
                      float* c, std::int64_t ldc) {
  if (b.rows != (trans_b ? n : k) || b.cols != (trans_b ? k : n) || !b.make) {
    throw ShapeError(detail::cat("gemm_bf16: B made by rows is (", b.rows, ", ", b.cols,
                                 "), expected (", trans_b ? n : k, ", ", trans_b ? k : n, ")",
                                 b.make ? "" : " with a row maker"));
  }
  const auto rows = [&](std::int64_t r0, std::int64_t r1, std::uint16_t* out, std::int64_t ld) {
    if (ld == b.cols) {
      b.make(r0, r1, out);
      return;
    }
    for (std::int64_t r = r0; r < r1; ++r) b.make(r, r + 1, out + (r - r0) * ld);
  };
  detail::gemm_bf16_rows(trans_a, trans_b, m, n, k, alpha, detail::Bf16Source{a, nullptr, lda},
                         rows, beta, c, ldc);
}

namespace detail {

/// An operand of gemm_in: its values, or a bfloat16 copy of them when the op saved one
/// (Node::saved_copy; only float ops have copies, and only under Precision::bf16), with rows
/// `ld` values apart in either.
template <class T>
struct GemmOperand {
  const T* values;
  std::int64_t ld;
  const std::uint16_t* copy = nullptr;  ///< used when set

  /// The operand `offset` values further on (a matrix of a batch).
  GemmOperand at(std::int64_t offset) const noexcept {
    return {values ? values + offset : nullptr, ld, copy ? copy + offset : nullptr};
  }
};

/// gemm_in on operands that may come from bfloat16 copies: those are packed as they are, not
/// widened and rounded again (the same bits). With a bias row (n values), C = alpha op(A) op(B)
/// + bias on every row and beta is not used: the bits of beta = 1 on a C filled with the bias,
/// which a BF16 tile kernel adds as it writes C instead.
template <class T>
void gemm_in(bool bf16, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
             T alpha, const GemmOperand<T>& a, const GemmOperand<T>& b, T beta, T* c,
             std::int64_t ldc, const T* bias = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16) {
      const auto source = [](const GemmOperand<float>& x) {
        return Bf16Source{x.values, x.copy, x.ld};
      };
      gemm_bf16_rows(trans_a, trans_b, m, n, k, alpha, source(a),
                     source_rows(source(b), trans_b ? k : n), beta, c, ldc, bias);
      return;
    }
  }
  if (bias && m > 0 && n > 0 && !shape_only()) {
    fill_rows(m, n, bias, c, ldc);
    beta = T(1);
  }
  gemm<T>(trans_a, trans_b, m, n, k, alpha, a.values, a.ld, b.values, b.ld, beta, c, ldc);
}

/// gemm<T>, or gemm_bf16 when `bf16` (an op recorded under Precision::bf16, core/precision.hpp;
/// only float ops are), on plain operands.
template <class T>
void gemm_in(bool bf16, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
             T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
             std::int64_t ldc) {
  gemm_in<T>(bf16, trans_a, trans_b, m, n, k, alpha, GemmOperand<T>{a, lda}, GemmOperand<T>{b, ldb},
             beta, c, ldc);
}

}  // namespace detail
}  // namespace remat
