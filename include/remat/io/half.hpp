#pragma once
/// @file
/// The 16-bit floating-point formats of model checkpoints, bit-exact as PyTorch converts them:
/// bfloat16 (BF16: float's sign and 8-bit exponent, 7 mantissa bits) and IEEE half (F16: 5-bit
/// exponent, 10 mantissa bits). Widening to float is exact for every bit pattern (subnormals,
/// infinities; NaNs keep sign and payload and come out quiet); narrowing to bfloat16 rounds to
/// nearest, ties to even, as a tensor's `.bfloat16()` does (tests/reference/half_reference.py
/// checks every case against torch 1.13).

#include <bit>
#include <cmath>
#include <cstdint>

namespace remat::io {

/// The float a bfloat16 bit pattern holds: its 16 bits are float's upper half, so exact.
inline float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

/// `value` rounded to the nearest bfloat16, ties to even; every NaN becomes 0xffff, as a
/// tensor's `.bfloat16()` gives it in torch 1.13 (ATen's vectorized conversion; only the scalar
/// c10::BFloat16 constructor gives 0x7fc0).
inline std::uint16_t float_to_bf16(float value) noexcept {
  if (std::isnan(value)) return 0xffff;
  const auto u = std::bit_cast<std::uint32_t>(value);
  // Adding 0x7fff plus the lowest kept bit carries into the kept bits exactly when the dropped
  // half is above one half, or equal to it with the kept part odd (ties to even); an overflow
  // carries into the exponent and gives infinity, as rounding should.
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// A double narrowed as torch narrows it to bfloat16: to float first (round to nearest), then
/// to bfloat16 (ATen converts a double tensor through float).
inline std::uint16_t double_to_bf16(double value) noexcept {
  return float_to_bf16(static_cast<float>(value));
}

/// The float an IEEE half bit pattern holds, exactly: subnormals scaled, infinities kept, NaN
/// payloads shifted into float's mantissa with the sign kept and the quiet bit set.
inline float f16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {
    // infinity, or a NaN with its payload shifted into float's mantissa and made quiet, as
    // torch (and the F16C instruction) does
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13) |
                                (mantissa != 0 ? 0x400000u : 0u));
  }
  if (exponent == 0) {
    // 0 or a subnormal: mantissa * 2^-24, exact in float (at most 10 significant bits).
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace remat::io
