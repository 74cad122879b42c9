#pragma once
/// @file
/// bfloat16, the 16-bit format of BF16 training: float's sign and 8-bit exponent with 7 mantissa
/// bits, so a value is float's upper half. Rounding is to nearest, ties to even; a NaN stays a
/// quiet NaN of the same sign. (io/half.hpp converts as torch writes checkpoint files, where
/// every NaN becomes 0xffff.)

#include <cstdint>
#include <cstring>

#include "remat/core/vector_kernels.hpp"

namespace remat::detail {

/// `x` rounded to the nearest bfloat16 (ties to even), as its 16 bits. Without a branch (the
/// NaN case is a select), so that loops of it vectorize.
inline std::uint16_t float_to_bf16(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  // Adding 0x7fff plus the lowest kept bit carries into the kept bits exactly when the dropped
  // half is above one half, or equal to it with the kept part odd.
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/// The float a bfloat16 holds: exact.
inline float bf16_to_float(std::uint16_t b) noexcept {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// dst[0, n) = src[0, n) (every `stride`-th float) rounded to bfloat16. Contiguous values go
/// through the CPU's widest vectors (core/vector_kernels.hpp): with the user's usual flags the
/// compiler vectorizes the loop for SSE2 only, and rounding every saved activation and GEMM
/// operand that way took 15 % of a BF16 GPT step on an AVX-512 CPU.
inline void round_to_bf16(const float* src, std::int64_t stride, std::int64_t n,
                          std::uint16_t* dst) noexcept {
  if (stride == 1) {
    vec::round_to_bf16(src, dst, n);
  } else {
    for (std::int64_t j = 0; j < n; ++j) dst[j] = float_to_bf16(src[j * stride]);
  }
}

/// dst[0, n) = the floats bfloat16 values src[0, n) hold (exact).
inline void widen_bf16(const std::uint16_t* src, std::int64_t n, float* dst) noexcept {
  vec::widen_bf16(src, dst, n);
}

}  // namespace remat::detail
