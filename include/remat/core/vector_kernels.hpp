#pragma once
/// @file
/// Float kernels compiled for several instruction sets in one build, the widest the CPU offers
/// chosen at run time.
///
/// Note [ISA dispatch]: remat is header-only, so users compile it with their own flags, usually
/// without -march, and Eigen then uses SSE2 only (it picks its packet width from the compiler's
/// macros at compile time). The hottest element-wise kernels (tanh and GELU forward and
/// backward, the AdamW update, bfloat16 rounding and widening, the cross-entropies' exponentials,
/// a replay's fingerprints) are therefore written once with GCC/Clang vector extensions
/// (core/detail/vector_kernels.inc) and compiled three times, inside target regions: baseline
/// (16-byte vectors), AVX2 + FMA (32 bytes), AVX-512 (64 bytes). Each call goes to the set
/// remat::active_isa() names: the CPU's widest by default, any narrower one after remat::set_isa
/// (tests and benchmarks force each path). Paths differ by rounding only (FMA or not, the order of
/// a sum's lanes; the bfloat16 conversions are integer arithmetic, the same bits on every path); a
/// given path is bitwise reproducible and independent of chunking.

#include <cstddef>
#include <cstdint>

#include "remat/core/cpu.hpp"

#if REMAT_X86 && defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 9))
#define REMAT_ISA_DISPATCH 1
#include <immintrin.h>
#else
#define REMAT_ISA_DISPATCH 0
#endif

namespace remat::detail {

/// The per-step constants of an AdamW update (optim/adamw.hpp).
struct AdamWConstants {
  float b1, b2, lr, c1, c2, decay, eps;
};

}  // namespace remat::detail

#define REMAT_KERNEL_NS isa_baseline
#define REMAT_KERNEL_BYTES 16
#define REMAT_KERNEL_FMA(a, b, c) ((a) * (b) + (c))
#if REMAT_ISA_DISPATCH
#define REMAT_KERNEL_SQRT(a) ((V)_mm_sqrt_ps((__m128)(a)))
#else
#define REMAT_KERNEL_SQRT(a) remat_lanewise_sqrt(a)
#endif
#if !REMAT_ISA_DISPATCH
namespace remat::detail::isa_baseline {
typedef float V __attribute__((vector_size(16)));
inline V remat_lanewise_sqrt(V a) {
  for (int i = 0; i < 4; ++i) a[i] = __builtin_sqrtf(a[i]);
  return a;
}
}  // namespace remat::detail::isa_baseline
#endif
#include "remat/core/detail/vector_kernels.inc"
#undef REMAT_KERNEL_NS
#undef REMAT_KERNEL_BYTES
#undef REMAT_KERNEL_FMA
#undef REMAT_KERNEL_SQRT

#if REMAT_ISA_DISPATCH
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define REMAT_KERNEL_NS isa_avx2
#define REMAT_KERNEL_BYTES 32
#define REMAT_KERNEL_FMA(a, b, c) ((V)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define REMAT_KERNEL_SQRT(a) ((V)_mm256_sqrt_ps((__m256)(a)))
#include "remat/core/detail/vector_kernels.inc"
#undef REMAT_KERNEL_NS
#undef REMAT_KERNEL_BYTES
#undef REMAT_KERNEL_FMA
#undef REMAT_KERNEL_SQRT
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(                                                        \
    __attribute__((target("avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx2,fma"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx2,fma")
#endif
#define REMAT_KERNEL_NS isa_avx512
#define REMAT_KERNEL_BYTES 64
#define REMAT_KERNEL_FMA(a, b, c) ((V)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
// maskz with all lanes: _mm512_sqrt_ps trips GCC 12's -Wmaybe-uninitialized in its own header
#define REMAT_KERNEL_SQRT(a) ((V)_mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xffff), (__m512)(a)))
#include "remat/core/detail/vector_kernels.inc"
#undef REMAT_KERNEL_NS
#undef REMAT_KERNEL_BYTES
#undef REMAT_KERNEL_FMA
#undef REMAT_KERNEL_SQRT
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // REMAT_ISA_DISPATCH

namespace remat::detail {

// Calls kernel `name` of the active instruction set.
#if REMAT_ISA_DISPATCH
#define REMAT_DISPATCH(name, ...)           \
  switch (::remat::active_isa()) {          \
    case ::remat::Isa::avx512:              \
      return isa_avx512::name(__VA_ARGS__); \
    case ::remat::Isa::avx2:                \
      return isa_avx2::name(__VA_ARGS__);   \
    case ::remat::Isa::baseline:            \
      break;                                \
  }                                         \
  return isa_baseline::name(__VA_ARGS__)
#else
#define REMAT_DISPATCH(name, ...) return isa_baseline::name(__VA_ARGS__)
#endif

namespace vec {

inline void tanh_forward(const float* x, float* y, std::int64_t n) {
  REMAT_DISPATCH(tanh_forward, x, y, n);
}
inline void tanh_backward(const float* gy, const float* y, float* gx, std::int64_t n) {
  REMAT_DISPATCH(tanh_backward, gy, y, gx, n);
}
inline void gelu_forward(const float* x, float* y, std::int64_t n) {
  REMAT_DISPATCH(gelu_forward, x, y, n);
}
inline void gelu_backward(const float* gy, const float* x, float* gx, std::int64_t n) {
  REMAT_DISPATCH(gelu_backward, gy, x, gx, n);
}
/// y[0, n) = exp(x[0, n) - shift) * scale (y == x allowed); exp to about 1 ulp, 0 below -104.
inline void exp_shifted(const float* x, float* y, std::int64_t n, float shift, float scale) {
  REMAT_DISPATCH(exp_shifted, x, y, n, shift, scale);
}
/// The sum of exp(x[0, n) - shift), in an order fixed by the path (not by the caller's chunks).
inline float exp_sum(const float* x, std::int64_t n, float shift) {
  REMAT_DISPATCH(exp_sum, x, n, shift);
}
inline void adamw_update(float* p, float* m, float* v, const float* g, std::int64_t n,
                         const AdamWConstants& k) {
  REMAT_DISPATCH(adamw_update, p, m, v, g, n, k);
}

/// y[0, n) = x[0, n) rounded to bfloat16 (core/bfloat16.hpp's float_to_bf16, bit for bit).
inline void round_to_bf16(const float* x, std::uint16_t* y, std::int64_t n) {
  REMAT_DISPATCH(round_to_bf16, x, y, n);
}
/// y[0, n) = the floats bfloat16 values x[0, n) hold.
inline void widen_bf16(const std::uint16_t* x, float* y, std::int64_t n) {
  REMAT_DISPATCH(widen_bf16, x, y, n);
}
/// hash_bytes's 64 lanes (core/hash.hpp) over `blocks` blocks of 256 bytes at p.
inline void hash_lanes(const unsigned char* p, std::size_t blocks, std::uint32_t* lanes) {
  REMAT_DISPATCH(hash_lanes, p, blocks, lanes);
}

}  // namespace vec

#undef REMAT_DISPATCH

}  // namespace remat::detail
