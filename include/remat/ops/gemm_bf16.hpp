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
/// Note [BF16 GEMM packing]: the inputs are rounded and packed once per call into scratch
/// buffers: A into rows of K bfloat16 values (K padded with zeros to a
/// multiple of 32: one AMX tile row), B into panels of 16 columns in the "VNNI" layout both
/// instructions read, each 32-bit word holding rows 2p and 2p + 1 of one column. Every block of
/// C is computed by one thread over all of K in one fixed order, so the result does not depend
/// on the thread count: run to run and replay to first pass, it is bitwise the same. The scratch
/// is outside the allocator's count, like the float GEMM's (OpenBLAS packs into buffers of its
/// own): ops skip their GEMMs in a shape-only run, so a counted scratch would be a transient
/// that predictions cannot see. It is at most 2 bytes a value of op(A) and op(B), padded, or 4
/// in the convert kernel, and lives for one call.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "remat/core/bfloat16.hpp"
#include "remat/core/cpu.hpp"
#include "remat/core/elementwise.hpp"
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

/// op(A) = A^T packed: a block of 32 rows of op(A) (columns of A) at a time, reading A's rows
/// in order, so that neither side strides through memory.
inline void pack_a_bf16_transposed(std::int64_t m, std::int64_t k, const float* a, std::int64_t lda,
                                   std::uint16_t* out) {
  const std::int64_t kp = padded_k(k);
  for_rows(padded_block(m) / 32, 32 * kp, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t block = b0; block < b1; ++block) {
      const std::int64_t r0 = block * 32, rows = std::clamp<std::int64_t>(m - r0, 0, 32);
      std::uint16_t* dst = out + r0 * kp;
      for (std::int64_t i = 0; i < k; ++i) {
        const float* src = a + i * lda + r0;
        for (std::int64_t r = 0; r < rows; ++r) dst[r * kp + i] = float_to_bf16(src[r]);
      }
      for (std::int64_t r = 0; r < 32; ++r)
        std::fill(dst + r * kp + (r < rows ? k : 0), dst + (r + 1) * kp, std::uint16_t{0});
    }
  });
}

/// op(A) (m x k) as padded_block(m) rows of padded_k(k) bfloat16 values, zeros past the ends.
inline void pack_a_bf16(bool trans, std::int64_t m, std::int64_t k, const float* a,
                        std::int64_t lda, std::uint16_t* out) {
  if (trans) {
    pack_a_bf16_transposed(m, k, a, lda, out);
    return;
  }
  const std::int64_t kp = padded_k(k);
  for_rows(padded_block(m), kp, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      std::uint16_t* row = out + r * kp;
      const std::int64_t inside = r < m ? k : 0;
      if (inside > 0) round_to_bf16(a + r * lda, 1, k, row);
      std::fill(row + inside, row + kp, std::uint16_t{0});
    }
  });
}

/// op(B) = B^T packed: column c of op(B) is row c of B, whose consecutive values make up one
/// VNNI word each, so B is read in order.
inline void pack_b_bf16_transposed(std::int64_t k, std::int64_t n, std::int64_t panels,
                                   const float* b, std::int64_t ldb, std::uint16_t* out) {
  const std::int64_t kp = padded_k(k);
  for_rows(panels, kp * 16, [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      std::uint16_t* panel = out + p * kp * 16;
      for (std::int64_t j = 0; j < 16; ++j) {
        const std::int64_t c = p * 16 + j;
        const std::int64_t inside = c < n ? k : 0;
        for (std::int64_t i = 0; i < inside; ++i)
          panel[(i / 2) * 32 + 2 * j + (i & 1)] = float_to_bf16(b[c * ldb + i]);
        for (std::int64_t i = inside; i < kp; ++i) panel[(i / 2) * 32 + 2 * j + (i & 1)] = 0;
      }
    }
  });
}

/// op(B) (k x n) as `panels` panels of 16 columns, one after the other, zeros past the ends;
/// within a panel, row pair p's 16 words, each holding rows 2p (low half) and 2p + 1 (high half)
/// of one column. Rounded a row of op(B) at a time, then interleaved.
inline void pack_b_bf16(bool trans, std::int64_t k, std::int64_t n, std::int64_t panels,
                        const float* b, std::int64_t ldb, std::uint16_t* out) {
  if (trans) {
    pack_b_bf16_transposed(k, n, panels, b, ldb, out);
    return;
  }
  const std::int64_t kp = padded_k(k), width = panels * 16;
  for_rows(kp / 2, 2 * width, [&](std::int64_t q0, std::int64_t q1) {
    // two rounded rows of op(B): 4 bytes a column, outside the allocator's count, like
    // OpenBLAS's own packing buffers
    std::vector<std::uint16_t> rows(static_cast<std::size_t>(2 * width), 0);
    std::uint16_t* even = rows.data();
    std::uint16_t* odd = rows.data() + width;
    for (std::int64_t q = q0; q < q1; ++q) {
      for (int half = 0; half < 2; ++half) {  // op(B)'s rows 2q and 2q + 1, zeros past k
        const std::int64_t i = 2 * q + half;
        std::uint16_t* dst = half ? odd : even;
        if (i < k) round_to_bf16(b + i * ldb, 1, n, dst);
        std::fill(dst + (i < k ? n : 0), dst + width, std::uint16_t{0});
      }
      for (std::int64_t p = 0; p < panels; ++p) {
        std::uint16_t* words = out + p * kp * 16 + q * 32;
        for (std::int64_t j = 0; j < 16; ++j) {
          words[2 * j] = even[p * 16 + j];
          words[2 * j + 1] = odd[p * 16 + j];
        }
      }
    }
  });
}

/// C's block [i0, i0 + rows) x [j0, j0 + cols) = alpha * block + beta * C (beta 0: C is not
/// read, so it may hold anything).
inline void write_block(const float* block, std::int64_t ld_block, std::int64_t rows,
                        std::int64_t cols, float alpha, float beta, float* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* src = block + i * ld_block;
    float* dst = c + i * ldc;
    if (beta == 0) {  // two loops, each one the compiler vectorizes
      for (std::int64_t j = 0; j < cols; ++j) dst[j] = alpha * src[j];
    } else {
      for (std::int64_t j = 0; j < cols; ++j) dst[j] = alpha * src[j] + beta * dst[j];
    }
  }
}

#if REMAT_X86
/// One 32 x 32 block of A B from the packed operands, by AVX512-BF16: 8 rows at a time, two
/// panels of 16 columns, one VDPBF16PS per (row, panel) and row pair.
__attribute__((target("avx512f,avx512bf16"))) inline void block_avx512_bf16(const std::uint16_t* a,
                                                                            const std::uint16_t* b0,
                                                                            const std::uint16_t* b1,
                                                                            std::int64_t kp,
                                                                            float* out) {
  for (int r0 = 0; r0 < 32; r0 += 8) {
    __m512 acc[8][2];
    for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
    for (std::int64_t p = 0; p < kp / 2; ++p) {
      const __m512bh v0 = (__m512bh)_mm512_loadu_si512(b0 + p * 32);
      const __m512bh v1 = (__m512bh)_mm512_loadu_si512(b1 + p * 32);
      for (int r = 0; r < 8; ++r) {
        std::uint32_t pair;
        std::memcpy(&pair, a + (r0 + r) * kp + 2 * p, sizeof pair);
        const __m512bh u = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], u, v0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], u, v1);
      }
    }
    for (int r = 0; r < 8; ++r) {
      _mm512_storeu_ps(out + (r0 + r) * 32, acc[r][0]);
      _mm512_storeu_ps(out + (r0 + r) * 32 + 16, acc[r][1]);
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

/// gemm_bf16 by a tile kernel (amx or avx512_bf16) over 32 x 32 blocks of C, in parallel.
inline void gemm_bf16_blocks(Bf16Kernel kernel, bool ta, bool tb, std::int64_t m, std::int64_t n,
                             std::int64_t k, float alpha, const float* a, std::int64_t lda,
                             const float* b, std::int64_t ldb, float beta, float* c,
                             std::int64_t ldc) {
  const std::int64_t kp = padded_k(k), mp = padded_block(m), np = padded_block(n);
  if (shape_only()) return;
  const auto pa =
      std::make_unique_for_overwrite<std::uint16_t[]>(static_cast<std::size_t>(mp * kp));
  const auto pb =
      std::make_unique_for_overwrite<std::uint16_t[]>(static_cast<std::size_t>(np * kp));
  pack_a_bf16(ta, m, k, a, lda, pa.get());
  pack_b_bf16(tb, k, n, np / 16, b, ldb, pb.get());
  const std::int64_t row_blocks = mp / 32, col_blocks = np / 32;
  const auto blocks = [&](std::int64_t s, std::int64_t e, auto&& product) {
    alignas(64) float block[32 * 32];
    for (std::int64_t t = s; t < e; ++t) {  // down a column of blocks: its B panels stay in cache
      const std::int64_t i0 = t % row_blocks * 32, j0 = t / row_blocks * 32;
      const std::uint16_t* b0 = pb.get() + (j0 / 16) * kp * 16;
      product(pa.get() + i0 * kp, b0, b0 + kp * 16, kp, block);
      write_block(block, 32, std::min<std::int64_t>(32, m - i0), std::min<std::int64_t>(32, n - j0),
                  alpha, beta, c + i0 * ldc + j0, ldc);
    }
  };
  parallel_for(row_blocks * col_blocks, 1, [&](std::int64_t s, std::int64_t e) {
#if REMAT_X86
    if (kernel == Bf16Kernel::amx) {
      const AmxTiles tiles;
      blocks(s, e, block_amx);
    } else {
      blocks(s, e, block_avx512_bf16);
    }
#else
    (void)kernel, (void)s, (void)e, (void)blocks;
#endif
  });
}

/// gemm_bf16 by the convert kernel: the inputs rounded to bfloat16 and back, then the float GEMM.
inline void gemm_bf16_convert(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                              float alpha, const float* a, std::int64_t lda, const float* b,
                              std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const std::int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  if (shape_only()) return;
  const auto ra = std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(ar * ac));
  const auto rb = std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(br * bc));
  const auto round = [](const float* src, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                        float* dst) {
    for_rows(rows, cols, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t j = 0; j < cols; ++j)
          dst[r * cols + j] = bf16_to_float(detail::float_to_bf16(src[r * ld + j]));
    });
  };
  round(a, ar, ac, lda, ra.get());
  round(b, br, bc, ldb, rb.get());
  gemm<float>(ta, tb, m, n, k, alpha, ra.get(), ac, rb.get(), bc, beta, c, ldc);
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
  if (m <= 0 || n <= 0 || (detail::shape_only() && k <= 0)) return;
  if (k <= 0) {  // nothing to add: C = beta C
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0 : beta * c[i * ldc + j];
    return;
  }
  const Bf16Kernel kernel = bf16_kernel();
  if (kernel == Bf16Kernel::convert) {
    detail::gemm_bf16_convert(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  detail::gemm_bf16_blocks(kernel, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace detail {

/// gemm<T>, or gemm_bf16 when `bf16` (an op recorded under Precision::bf16, core/precision.hpp;
/// only float ops are).
template <class T>
void gemm_in(bool bf16, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
             T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
             std::int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16) {
      gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
  }
  gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace detail
}  // namespace remat
