#pragma once
/// @file
/// QuantizedWeight: a frozen (rows, cols) matrix stored in fewer bits than float, and its
/// quantize/dequantize. Three formats:
///  - BF16: the top 16 bits of each float, rounded to nearest even (2 bytes a value);
///  - INT8: per row, q = rint(x / absmax(row) * 127), x ~ q * absmax / 127 (1 byte + 4 per row);
///  - NF4: QLoRA's 4-bit NormalFloat (Dettmers et al. 2023, bitsandbytes): the matrix read flat
///    in row-major order, in blocks of 64 values; each value times the reciprocal of its block's
///    absmax goes to one of 16 fixed codes (kNf4Codes): the number of midpoints between
///    consecutive codes that lie below it, as bitsandbytes' kernel decides (a tie goes to the
///    lower code; an all-zero block gets code 0). Two codes a byte, the first in the high nibble
///    (bitsandbytes' packing). The last block may be short (no padding is stored).
///    With double quantization (the default, as QLoRA: bitsandbytes' quantize_4bit with
///    compress_statistics=True) the float absmaxes are quantized again: their mean is
///    subtracted (one float offset) and the centred values are stored as 8-bit codes of
///    bitsandbytes' signed dynamic map (kDynamicCodes, create_dynamic_map(signed=True)) in blocks
///    of 256, each with its float absmax; a code is chosen as bitsandbytes' blockwise kernel
///    chooses it (value times the reciprocal of the absmax, nearest code, Note [dynamic code]).
///    Dequantization is bitsandbytes': code * absmax2 + offset, then NF4 code * that absmax, in
///    float. 4 bits + 8/64 + 32/(64*256) = 4.127 bits a value (0.516 bytes); without double
///    quantization 4.5 bits (0.5625 bytes).
/// The offset is bitsandbytes' `absmax.mean()`: torch's float32 mean on the CPU, summed in
/// torch's order (core/torch_sum.hpp, Note [torch's float sum]), so that the offset, the codes,
/// the absmaxes and the dequantized weights equal bitsandbytes' bit for bit wherever torch's
/// own mean is one value: fewer than 32,768 blocks (a matrix under 2,097,152 weights) or torch on
/// one thread (tests/reference/make_quantized_reference.py).
///
/// Every buffer is a Tensor, so the allocator counts it (bytes()). Quantization reads float
/// (a double matrix is rounded to float first); dequantize<T>() computes each value in float
/// and converts it, so a float and a double dequantization agree exactly.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "remat/core/bfloat16.hpp"
#include "remat/core/error.hpp"
#include "remat/core/tensor.hpp"
#include "remat/core/torch_sum.hpp"

namespace remat {

/// How a Linear's weight is stored.
enum class WeightStorage { f32, bf16, int8, nf4 };

inline const char* to_string(WeightStorage s) noexcept {
  switch (s) {
    case WeightStorage::f32:
      return "f32";
    case WeightStorage::bf16:
      return "bf16";
    case WeightStorage::int8:
      return "int8";
    case WeightStorage::nf4:
      return "nf4";
  }
  return "?";
}

/// The 16 NormalFloat4 values (QLoRA, Appendix E; bitsandbytes' NF4 table), ascending.
inline constexpr std::array<float, 16> kNf4Codes = {-1.0f,
                                                    -0.6961928009986877f,
                                                    -0.5250730514526367f,
                                                    -0.39491748809814453f,
                                                    -0.28444138169288635f,
                                                    -0.18477343022823334f,
                                                    -0.09105003625154495f,
                                                    0.0f,
                                                    0.07958029955625534f,
                                                    0.16093020141124725f,
                                                    0.24611230194568634f,
                                                    0.33791524171829224f,
                                                    0.44070982933044434f,
                                                    0.5626170039176941f,
                                                    0.7229568362236023f,
                                                    1.0f};

/// bitsandbytes' signed 8-bit dynamic map, ascending: create_dynamic_map(signed=True,
/// max_exponent_bits=7, total_bits=8) as torch computes it in float32 (the test compares it
/// with the map tests/reference/make_quantized_reference.py builds with bitsandbytes' code).
/// Mantissas with 1 to 7 significant decimal-exponent steps, 0 at index 127 and 1 at 255.
inline constexpr std::array<float, 256> kDynamicCodes = {
    -0x1.fc6666p-1f,  -0x1.f53332p-1f,  -0x1.eep-1f,      -0x1.e6ccccp-1f,
    -0x1.df9998p-1f,  -0x1.d86666p-1f,  -0x1.d13334p-1f,  -0x1.cap-1f,
    -0x1.c2ccccp-1f,  -0x1.bb9998p-1f,  -0x1.b46666p-1f,  -0x1.ad3332p-1f,
    -0x1.a6p-1f,      -0x1.9eccccp-1f,  -0x1.979998p-1f,  -0x1.906666p-1f,
    -0x1.893334p-1f,  -0x1.82p-1f,      -0x1.7acccep-1f,  -0x1.73999ap-1f,
    -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5ep-1f,      -0x1.56cccep-1f,
    -0x1.4f999ap-1f,  -0x1.486666p-1f,  -0x1.413334p-1f,  -0x1.3ap-1f,
    -0x1.32ccccp-1f,  -0x1.2b999ap-1f,  -0x1.246668p-1f,  -0x1.1d3334p-1f,
    -0x1.16p-1f,      -0x1.0eccccp-1f,  -0x1.07999ap-1f,  -0x1.006666p-1f,
    -0x1.f26668p-2f,  -0x1.e4p-2f,      -0x1.d59998p-2f,  -0x1.c73334p-2f,
    -0x1.b8ccccp-2f,  -0x1.aa6664p-2f,  -0x1.9cp-2f,      -0x1.8d9998p-2f,
    -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626664p-2f,  -0x1.54p-2f,
    -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,
    -0x1.0cp-2f,      -0x1.fb3334p-3f,  -0x1.de6668p-3f,  -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f,  -0x1.88p-3f,      -0x1.6b3332p-3f,  -0x1.4e6666p-3f,
    -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.fp-4f,       -0x1.b66668p-4f,
    -0x1.93d70ap-4f,  -0x1.8851eap-4f,  -0x1.7ccccep-4f,  -0x1.7147aep-4f,
    -0x1.65c29p-4f,   -0x1.5a3d7p-4f,   -0x1.4eb85p-4f,   -0x1.433334p-4f,
    -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,
    -0x1.09999ap-4f,  -0x1.fc28f4p-5f,  -0x1.e51ebap-5f,  -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f,  -0x1.ap-5f,       -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
    -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c28ep-5f,
    -0x1.fd70a4p-6f,  -0x1.cf5c26p-6f,  -0x1.a147aep-6f,  -0x1.733334p-6f,
    -0x1.451eb8p-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c29p-7f,
    -0x1.3e76c8p-7f,  -0x1.2c083p-7f,   -0x1.19999ap-7f,  -0x1.072b02p-7f,
    -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,  -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,
    -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
    -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f,   -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0.0f,
    0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
    0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,
    0x1.19ce0ap-12f,  0x1.8fc506p-12f,  0x1.02de02p-11f,  0x1.3dd982p-11f,
    0x1.78d5p-11f,    0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
    0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,
    0x1.0c49bap-8f,   0x1.3126e8p-8f,   0x1.56041ap-8f,   0x1.7ae148p-8f,
    0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
    0x1.19999ap-7f,   0x1.2c083p-7f,    0x1.3e76c8p-7f,   0x1.75c29p-7f,
    0x1.d1eb86p-7f,   0x1.170a3ep-6f,   0x1.451eb8p-6f,   0x1.733334p-6f,
    0x1.a147aep-6f,   0x1.cf5c26p-6f,   0x1.fd70a4p-6f,   0x1.15c28ep-5f,
    0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,
    0x1.88f5c2p-5f,   0x1.ap-5f,        0x1.b70a3ep-5f,   0x1.ce147ap-5f,
    0x1.e51ebap-5f,   0x1.fc28f4p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
    0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,
    0x1.4eb85p-4f,    0x1.5a3d7p-4f,    0x1.65c29p-4f,    0x1.7147aep-4f,
    0x1.7ccccep-4f,   0x1.8851eap-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
    0x1.fp-4f,        0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,
    0x1.6b3332p-3f,   0x1.88p-3f,       0x1.a4ccccp-3f,   0x1.c1999ap-3f,
    0x1.de6668p-3f,   0x1.fb3334p-3f,   0x1.0cp-2f,       0x1.1a6668p-2f,
    0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.54p-2f,
    0x1.626664p-2f,   0x1.70ccccp-2f,   0x1.7f3334p-2f,   0x1.8d9998p-2f,
    0x1.9cp-2f,       0x1.aa6664p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
    0x1.d59998p-2f,   0x1.e4p-2f,       0x1.f26668p-2f,   0x1.006666p-1f,
    0x1.07999ap-1f,   0x1.0eccccp-1f,   0x1.16p-1f,       0x1.1d3334p-1f,
    0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3ap-1f,
    0x1.413334p-1f,   0x1.486666p-1f,   0x1.4f999ap-1f,   0x1.56cccep-1f,
    0x1.5ep-1f,       0x1.653334p-1f,   0x1.6c6668p-1f,   0x1.73999ap-1f,
    0x1.7acccep-1f,   0x1.82p-1f,       0x1.893334p-1f,   0x1.906666p-1f,
    0x1.979998p-1f,   0x1.9eccccp-1f,   0x1.a6p-1f,       0x1.ad3332p-1f,
    0x1.b46666p-1f,   0x1.bb9998p-1f,   0x1.c2ccccp-1f,   0x1.cap-1f,
    0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df9998p-1f,   0x1.e6ccccp-1f,
    0x1.eep-1f,       0x1.f53332p-1f,   0x1.fc6666p-1f,   0x1p+0f,
};

/// Values per NF4 block, and absmaxes per block of the second (double) quantization.
inline constexpr std::int64_t kNf4Block = 64;
inline constexpr std::int64_t kNf4ScaleBlock = 256;

namespace detail {

/// The NF4 code of v (v scaled into [-1, 1]): how many of the 15 midpoints between consecutive
/// codes lie strictly below v (bitsandbytes' decision tree, its thresholds being these midpoints
/// taken in double and rounded to float), so a tie goes to the lower code. NaN gets code 0, as
/// in bitsandbytes.
inline std::uint8_t nearest_nf4(float v) noexcept {
  std::uint8_t code = 0;
  for (std::size_t i = 0; i + 1 < kNf4Codes.size(); ++i) {
    const float midpoint = float((double(kNf4Codes[i]) + double(kNf4Codes[i + 1])) / 2);
    code = static_cast<std::uint8_t>(code + (v > midpoint ? 1 : 0));
  }
  return code;
}

// Note [dynamic code]: bitsandbytes' blockwise 8-bit quantization (its kernel without stochastic
// rounding) finds a value's code by a binary search over the 256 codes that starts at index 127
// and halves its step from 64 to 1, remembering the last code passed on each side (the ends of
// the map when none); then it takes the neighbour when the value lies beyond the midpoint
// between it and the code reached, strictly, so a value exactly at a midpoint keeps the code
// reached. nearest_dynamic() follows those steps: codes may differ from a plain nearest search
// only at exact midpoints, and then they are bitsandbytes'.
inline std::uint8_t nearest_dynamic(float x) noexcept {
  int at = 127, below = 0, above = 255;
  float below_value = -1.0f, above_value = 1.0f;
  for (int step = 64; step > 0; step /= 2) {
    const float value = kDynamicCodes[std::size_t(at)];
    if (x > value) {
      below = at, below_value = value, at += step;
    } else {
      above = at, above_value = value, at -= step;
    }
  }
  if (above == 255) above_value = kDynamicCodes[255];
  if (below == 0) below_value = kDynamicCodes[0];
  const float reached = kDynamicCodes[std::size_t(at)];
  if (x > reached)
    return static_cast<std::uint8_t>(x > (above_value + reached) * 0.5f ? above : at);
  return static_cast<std::uint8_t>(x < (below_value + reached) * 0.5f ? below : at);
}

/// rint(v * 127) as int8, for v in [-1, 1].
inline std::int8_t int8_code(float x, float absmax) noexcept {
  const float v = absmax > 0 ? x / absmax : 0.0f;
  return static_cast<std::int8_t>(std::nearbyint(v * 127.0f));
}

}  // namespace detail

/// A frozen matrix in BF16, INT8 or NF4 (see the file comment). Immutable once built.
class QuantizedWeight {
 public:
  /// Quantizes the (rows, cols) row-major matrix at `values`. Rejects an empty shape and
  /// non-finite values (naming the first one's position).
  template <class T>
  static QuantizedWeight quantize(const T* values, std::int64_t rows, std::int64_t cols,
                                  WeightStorage storage, bool double_quant = true) {
    if (rows < 1 || cols < 1) {
      throw ShapeError(detail::cat("QuantizedWeight: shape (", rows, ", ", cols,
                                   ") is empty; a weight is (out, in), both positive"));
    }
    if (storage == WeightStorage::f32) {
      throw ArgumentError(
          "QuantizedWeight: f32 is not a quantized storage (keep the float Parameter)");
    }
    const std::int64_t n = rows * cols;
    Tensor<float> x({n});
    QuantizedWeight q(rows, cols, storage);
    if (storage == WeightStorage::bf16) {
      q.bf16_ = Tensor<std::uint16_t>({n});
    } else if (storage == WeightStorage::int8) {
      q.int8_ = Tensor<std::int8_t>({n});
      q.scale_ = Tensor<float>({rows});
    }
    // a shape-only weight (core/shape_only.hpp) gets its storage's tensors and no codes
    const bool codes = x.has_data();
    if (codes && values == nullptr) throw ArgumentError("QuantizedWeight: null values");
    if (codes) q.encode(values, x);
    if (storage == WeightStorage::nf4) q.quantize_nf4(x, double_quant, codes);
    return q;
  }

  template <class T>
  static QuantizedWeight quantize(const Tensor<T>& w, WeightStorage storage,
                                  bool double_quant = true) {
    if (w.rank() != 2) {
      throw ShapeError(detail::cat("QuantizedWeight: weight of shape ", w.shape(),
                                   " is not a matrix (out, in)"));
    }
    return quantize(w.data(), w.dim(0), w.dim(1), storage, double_quant);
  }

  std::int64_t rows() const noexcept { return rows_; }
  std::int64_t cols() const noexcept { return cols_; }
  Shape shape() const { return Shape{rows_, cols_}; }
  WeightStorage storage() const noexcept { return storage_; }
  bool double_quant() const noexcept { return qabsmax_.defined(); }

  /// Bytes a (rows, cols) weight stored as `storage` holds, without quantizing anything (what
  /// bytes() returns once it is). f32: 4 a value.
  static double bytes_for(std::int64_t rows, std::int64_t cols, WeightStorage storage,
                          bool double_quant = true) noexcept {
    const double n = static_cast<double>(rows) * static_cast<double>(cols);
    switch (storage) {
      case WeightStorage::f32:
        return 4 * n;
      case WeightStorage::bf16:
        return 2 * n;
      case WeightStorage::int8:
        return n + 4 * static_cast<double>(rows);
      case WeightStorage::nf4:
        break;
    }
    const double blocks = std::ceil(n / kNf4Block), packed = std::ceil(n / 2);
    if (!double_quant) return packed + 4 * blocks;
    return packed + blocks + 4 * std::ceil(blocks / kNf4ScaleBlock) +
           4;  // 8-bit codes, an absmax per 256, the offset
  }

  /// Bytes held (every buffer, as the allocator counts them).
  std::size_t bytes() const noexcept {
    const auto b = [](const auto& t) { return t.defined() ? t.bytes() : std::size_t(0); };
    return b(bf16_) + b(int8_) + b(scale_) + b(packed_) + b(qabsmax_) + b(absmax2_) + b(offset_);
  }

  /// Writes rows [r0, r1) dequantized into out ((r1 - r0) * cols values, row-major).
  template <class T>
  void dequantize_rows(std::int64_t r0, std::int64_t r1, T* out) const {
    decode_rows(r0, r1, out, [](float x) { return T(x); });
  }

  /// Rows [r0, r1) dequantized and rounded to bfloat16 (their 16 bits), as the BF16 GEMM reads
  /// them: each value is the float dequantize_rows gives, rounded, made without a float copy of
  /// the rows (a BF16 weight's bits are its values).
  void dequantize_rows_bf16(std::int64_t r0, std::int64_t r1, std::uint16_t* out) const {
    decode_rows(r0, r1, out, [](float x) { return detail::float_to_bf16(x); });
  }

  /// The whole matrix dequantized (for tests and merging; the ops never call it).
  template <class T = float>
  Tensor<T> dequantize() const {
    Tensor<T> w({rows_, cols_});
    if (w.has_data()) dequantize_rows(0, rows_, w.data());
    return w;
  }

  /// NF4 block b's absmax as dequantization uses it (after double quantization, if any:
  /// bitsandbytes' dynamic code times its group's absmax, plus the offset, in float).
  float block_absmax(std::int64_t b) const noexcept {
    if (!qabsmax_.defined()) return scale_[b];
    const float centred = kDynamicCodes[qabsmax_[b]] * absmax2_[b / kNf4ScaleBlock];
    return centred + offset_[0];
  }
  /// Double quantization's state, for tests: each block's 8-bit code of its centred absmax, each
  /// group of 256 blocks' absmax, and the offset (the mean absmax).
  const Tensor<std::uint8_t>& absmax_codes() const noexcept { return qabsmax_; }
  const Tensor<float>& absmax_scales() const noexcept { return absmax2_; }
  float absmax_offset() const noexcept { return offset_[0]; }
  /// NF4 code of flat element e (0..15).
  std::uint8_t nf4_code(std::int64_t e) const noexcept {
    const std::uint8_t byte = packed_[e >> 1];
    return (e & 1) ? byte & 15u : byte >> 4;
  }
  /// Raw buffers, for tests: INT8 codes and per-row scales; BF16 bits.
  const Tensor<std::int8_t>& int8_codes() const noexcept { return int8_; }
  const Tensor<float>& int8_scales() const noexcept { return scale_; }
  const Tensor<std::uint16_t>& bf16_bits() const noexcept { return bf16_; }

 private:
  QuantizedWeight(std::int64_t rows, std::int64_t cols, WeightStorage storage)
      : rows_(rows), cols_(cols), storage_(storage) {}

  // Copies the values into x, refusing a non-finite one, and codes them as BF16 or INT8.
  template <class T>
  void encode(const T* values, Tensor<float>& x) {
    const std::int64_t n = rows_ * cols_;
    for (std::int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(values[i]);
      if (!std::isfinite(x[i])) {
        throw NumericError(detail::cat("QuantizedWeight: value ", x[i], " at (", i / cols_, ", ",
                                       i % cols_, ") of a (", rows_, ", ", cols_,
                                       ") weight is not finite"));
      }
    }
    if (storage_ == WeightStorage::bf16) {
      for (std::int64_t i = 0; i < n; ++i) bf16_[i] = detail::float_to_bf16(x[i]);
    } else if (storage_ == WeightStorage::int8) {
      for (std::int64_t r = 0; r < rows_; ++r) {
        const float a = absmax(x.data() + r * cols_, cols_);
        for (std::int64_t c = 0; c < cols_; ++c)
          int8_[r * cols_ + c] = detail::int8_code(x[r * cols_ + c], a);
        scale_[r] = a / 127.0f;
      }
    }
  }

  static float absmax(const float* x, std::int64_t n) noexcept {
    float a = 0;
    for (std::int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
    return a;
  }

  void quantize_nf4(const Tensor<float>& x, bool double_quant, bool codes) {
    const std::int64_t n = x.numel();
    const std::int64_t blocks = (n + kNf4Block - 1) / kNf4Block;
    packed_ = Tensor<std::uint8_t>::zeros({(n + 1) / 2});
    Tensor<float> amax({blocks});
    for (std::int64_t b = 0; codes && b < blocks; ++b) {
      const std::int64_t e0 = b * kNf4Block, e1 = std::min(n, e0 + kNf4Block);
      const float a = absmax(x.data() + e0, e1 - e0);
      amax[b] = a;
      // bitsandbytes multiplies by the reciprocal (not a division: the last bit may differ); an
      // all-zero block (0 * inf is NaN there) gets code 0 and dequantizes to -0.0 * 0
      const float inverse = a > 0 ? 1.0f / a : 0.0f;
      for (std::int64_t e = e0; e < e1; ++e) {
        const std::uint8_t code = a > 0 ? detail::nearest_nf4(x[e] * inverse) : 0;
        packed_[e >> 1] |= static_cast<std::uint8_t>((e & 1) ? code : code << 4);
      }
    }
    if (!double_quant) {
      scale_ = amax;
      return;
    }
    // Second level (bitsandbytes' quantize_blockwise of absmax - offset, blocks of 256): the
    // mean as torch takes it (Note [torch's float sum]), then each group's absmax and codes.
    offset_ = Tensor<float>({1});
    if (codes) offset_[0] = detail::torch_cpu_mean(amax.data(), blocks);
    const std::int64_t groups = (blocks + kNf4ScaleBlock - 1) / kNf4ScaleBlock;
    qabsmax_ = Tensor<std::uint8_t>({blocks});
    absmax2_ = Tensor<float>({groups});
    for (std::int64_t g = 0; codes && g < groups; ++g) {
      const std::int64_t b0 = g * kNf4ScaleBlock, b1 = std::min(blocks, b0 + kNf4ScaleBlock);
      float a2 = 0;
      for (std::int64_t b = b0; b < b1; ++b) a2 = std::max(a2, std::fabs(amax[b] - offset_[0]));
      // all absmaxes equal: bitsandbytes' 0 * inf is NaN, whose search ends at code 0
      const float inverse = a2 > 0 ? 1.0f / a2 : 0.0f;
      for (std::int64_t b = b0; b < b1; ++b)
        qabsmax_[b] = a2 > 0 ? detail::nearest_dynamic((amax[b] - offset_[0]) * inverse) : 0;
      absmax2_[g] = a2;
    }
  }

  // Rows [r0, r1) dequantized in float, each value written as to(value).
  template <class Out, class To>
  void decode_rows(std::int64_t r0, std::int64_t r1, Out* out, To to) const {
    const std::int64_t begin = r0 * cols_, end = r1 * cols_;
    if (storage_ == WeightStorage::bf16) {
      for (std::int64_t e = begin; e < end; ++e)
        out[e - begin] = to(detail::bf16_to_float(bf16_[e]));
    } else if (storage_ == WeightStorage::int8) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const float s = scale_[r];
        const std::int8_t* q = int8_.data() + r * cols_;
        Out* o = out + (r - r0) * cols_;
        for (std::int64_t c = 0; c < cols_; ++c) o[c] = to(float(q[c]) * s);
      }
    } else {
      dequantize_nf4(begin, end, out, to);
    }
  }

  // Block by block: the block's 16 dequantized values are computed once (a table), and each
  // element is a table look-up: one multiply per 64 values instead of one per value.
  template <class Out, class To>
  void dequantize_nf4(std::int64_t begin, std::int64_t end, Out* out, To to) const {
    const std::uint8_t* p = packed_.data();
    for (std::int64_t e = begin; e < end;) {
      const std::int64_t b = e / kNf4Block;
      const std::int64_t stop = std::min(end, (b + 1) * kNf4Block);
      const float a = block_absmax(b);
      Out lut[16];
      for (int i = 0; i < 16; ++i) lut[i] = to(kNf4Codes[std::size_t(i)] * a);
      if (e & 1) out[e - begin] = lut[p[e >> 1] & 15u], ++e;
      for (; e + 1 < stop; e += 2) {
        const std::uint8_t byte = p[e >> 1];
        out[e - begin] = lut[byte >> 4];
        out[e + 1 - begin] = lut[byte & 15u];
      }
      if (e < stop) out[e - begin] = lut[p[e >> 1] >> 4], ++e;
    }
  }

  std::int64_t rows_, cols_;
  WeightStorage storage_;
  Tensor<std::uint16_t> bf16_;  // BF16 bits
  Tensor<std::int8_t> int8_;    // INT8 codes
  Tensor<float> scale_;  // INT8: absmax / 127 per row; NF4 without double quant: absmax per block
  Tensor<std::uint8_t> packed_;   // NF4 codes, two a byte
  Tensor<std::uint8_t> qabsmax_;  // NF4 double quant: dynamic code of absmax - offset per block
  Tensor<float> absmax2_;         // ... the absmax of those per 256 blocks
  Tensor<float> offset_;          // ... the mean absmax (one value)
};

}  // namespace remat
