#pragma once
/// @file
/// rope: rotary position embedding in Hugging Face's "rotate half" convention (Llama, Qwen2).
/// For a head vector x of even size D at position p, with h = D/2 and frequencies
/// f_i = theta^(-2i/D), i < h:
///   y_i     = x_i cos(p f_i) - x_{i+h} sin(p f_i)
///   y_{i+h} = x_{i+h} cos(p f_i) + x_i sin(p f_i)
/// which is HF's q * cos + rotate_half(q) * sin. The backward is the inverse rotation.
/// Frequencies may be scaled for long contexts as Hugging Face's rope_scaling types linear,
/// dynamic (NTK) and llama3 do (RopeScaling).

#include <cmath>
#include <vector>

#include "remat/core/record.hpp"
#include "remat/core/elementwise.hpp"
#include "remat/ops/op_types.hpp"

namespace remat {

/// Hugging Face's rope types (rope_scaling's "rope_type", formerly "type"); none is "default".
enum class RopeScalingType { none, linear, dynamic, llama3 };

/// How the frequencies are stretched (modeling_rope_utils.py's ROPE_INIT_FUNCTIONS):
/// - linear: every frequency divided by `factor`;
/// - dynamic (NTK): while the last position + 1 exceeds `max_position_embeddings` =: L, the base
///   becomes theta ((factor s / L) - (factor - 1))^(D / (D - 2)) for s = last position + 1;
///   within L it is the plain rope;
/// - llama3: wavelengths 2 pi / f above original_max_position_embeddings / low_freq_factor are
///   divided by `factor`, those below original_max_position_embeddings / high_freq_factor kept,
///   those between interpolated smoothly.
/// Every step is rounded as Hugging Face's float32 tensors round it.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;                       ///< llama3
  double high_freq_factor = 4.0;                      ///< llama3
  std::int64_t original_max_position_embeddings = 0;  ///< llama3
  std::int64_t max_position_embeddings = 0;           ///< dynamic: the config's
};

/// Where rotary embeddings start and how fast they turn.
struct RopeOptions {
  double theta = 10000.0;   ///< base of the frequencies (HF's rope_theta)
  std::int64_t offset = 0;  ///< position of the first time step (tokens already seen)
  RopeScaling scaling{};    ///< none: Hugging Face's "default" rope
};

/// Hugging Face's name of a rope type ("default" for none).
inline const char* to_string(RopeScalingType t) noexcept {
  switch (t) {
    case RopeScalingType::linear:
      return "linear";
    case RopeScalingType::dynamic:
      return "dynamic";
    case RopeScalingType::llama3:
      return "llama3";
    case RopeScalingType::none:
      break;
  }
  return "default";
}

namespace detail {

/// The inverse frequencies f_i, i < D/2, of `dim`-sized heads whose last position is
/// seq_len - 1, computed as Hugging Face's rope init functions compute them in float32 (each
/// tensor-with-scalar step rounds the scalar to float; `x / tensor` is reciprocal(tensor) * x).
inline std::vector<float> rope_inverse_frequencies(std::int64_t dim, const RopeOptions& o,
                                                   std::int64_t seq_len) {
  const RopeScaling& sc = o.scaling;
  float base = static_cast<float>(o.theta);
  if (sc.type == RopeScalingType::dynamic && seq_len > sc.max_position_embeddings) {
    // HF's forward passes seq_len as a 0-dim int64 tensor: the arithmetic runs in float32
    const float f = static_cast<float>(sc.factor);
    float grow = f * static_cast<float>(seq_len);
    grow = grow / static_cast<float>(sc.max_position_embeddings);
    grow = grow - static_cast<float>(sc.factor - 1);
    grow = std::pow(grow, static_cast<float>(double(dim) / double(dim - 2)));
    base = static_cast<float>(o.theta) * grow;
  }
  const std::int64_t half = dim / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[static_cast<std::size_t>(i)] = 1.0f / std::pow(base, exponent);
  }
  if (sc.type == RopeScalingType::linear) {
    for (float& f : inv) f = f / static_cast<float>(sc.factor);
  } else if (sc.type == RopeScalingType::llama3) {
    const auto old_context = static_cast<double>(sc.original_max_position_embeddings);
    const auto low_wavelen = static_cast<float>(old_context / sc.low_freq_factor);
    const auto high_wavelen = static_cast<float>(old_context / sc.high_freq_factor);
    const auto factor = static_cast<float>(sc.factor);
    for (float& f : inv) {
      const float wavelen = (1.0f / f) * static_cast<float>(2 * 3.141592653589793);
      const float llama = wavelen > low_wavelen ? f / factor : f;
      const float smooth = ((1.0f / wavelen) * static_cast<float>(old_context) -
                            static_cast<float>(sc.low_freq_factor)) /
                           static_cast<float>(sc.high_freq_factor - sc.low_freq_factor);
      const float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      f = medium ? smoothed : llama;
    }
  }
  return inv;
}

/// cos and sin of p f_i for positions offset..offset+time-1 and i < D/2. The angles are those
/// Hugging Face computes, in float32: f_i = 1 / theta^(2i/D) and p f_i each rounded to float
/// (a checkpoint was trained with these; at position 4,000 a double angle is 2e-4 rad away).
/// Their cos and sin are taken in double and rounded once to T. A few KiB; rebuilt on every use.
template <class T>
struct RopeTable {
  RopeTable(std::int64_t time, std::int64_t dim, const RopeOptions& o)
      : half(dim / 2), cos(time * half), sin(time * half) {
    const std::vector<float> inv = rope_inverse_frequencies(dim, o, o.offset + time);
    for (std::int64_t i = 0; i < half; ++i) {
      const float freq = inv[static_cast<std::size_t>(i)];
      for (std::int64_t t = 0; t < time; ++t) {
        const double angle = static_cast<float>(t + o.offset) * freq;  // a float product, as HF's
        cos[t * half + i] = static_cast<T>(std::cos(angle));
        sin[t * half + i] = static_cast<T>(std::sin(angle));
      }
    }
  }

  /// Rotates (inverse: rotates back) every head of `rows` rows of `heads` head vectors of size
  /// 2 half, row r at position r % time, or r % time - starts[r] when `starts` is given (packed
  /// rows: the position within the row's example, starts[r] its first position). Rows are `ld`
  /// elements apart; dst may be src.
  void apply(const T* src, std::int64_t ld_src, T* dst, std::int64_t ld_dst, std::int64_t rows,
             std::int64_t time, std::int64_t heads, bool inverse,
             const std::int32_t* starts = nullptr) const {
    const T sign = inverse ? T(-1) : T(1);
    for_rows(rows, heads * 2 * half, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t p = starts ? r % time - starts[r] : r % time;
        const T* c = cos.data() + p * half;
        const T* s = sin.data() + p * half;
        for (std::int64_t h = 0; h < heads; ++h) {
          const T* x = src + r * ld_src + h * 2 * half;
          T* y = dst + r * ld_dst + h * 2 * half;
          for (std::int64_t i = 0; i < half; ++i) {
            const T a = x[i], b = x[i + half], si = sign * s[i];
            y[i] = a * c[i] - b * si;
            y[i + half] = b * c[i] + a * si;
          }
        }
      }
    });
  }

  std::int64_t half;
  std::vector<T> cos, sin;
};

template <class T>
class RopeNode final : public Node<T> {
 public:
  explicit RopeNode(RopeOptions options) : options_(options) {}
  const OpType& op_type() const noexcept override { return op::rope; }
  bool runs_shape_only() const noexcept override { return true; }

  // x: (..., T, H, D) -> same; keeps nothing (the rotation depends only on positions).
  Tensor<T> forward(typename Node<T>::Inputs in) override {
    Tensor<T> out(in[0].shape());
    run(in[0], out, false);
    return out;
  }
  void backward(const Tensor<T>& gy, Grads<T>& grads) override {
    Tensor<T> gx(gy.shape());
    run(gy, gx, true);
    grads.add(0, std::move(gx));
  }

 private:
  void run(const Tensor<T>& src, Tensor<T>& dst, bool inverse) const {
    if (shape_only()) return;
    const Shape& s = src.shape();
    const std::int64_t time = s[-3], heads = s[-2], dim = s[-1], width = heads * dim;
    RopeTable<T>(time, dim, options_)
        .apply(src.data(), width, dst.data(), width, s.numel() / width, time, heads, inverse);
  }

  RopeOptions options_;
};

inline void check_rope_options(const char* op, const RopeOptions& o) {
  if (!(o.theta > 0) || !std::isfinite(o.theta) || o.offset < 0) {
    throw ArgumentError(
        cat(op, ": rope theta must be positive and finite and the offset non-negative; got theta ",
            o.theta, ", offset ", o.offset));
  }
  const RopeScaling& s = o.scaling;
  const bool factor_ok = std::isfinite(s.factor) && s.factor >= 1.0;
  const bool llama3_ok =
      s.type != RopeScalingType::llama3 ||
      (s.original_max_position_embeddings >= 1 && s.low_freq_factor > 0 &&
       s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor));
  const bool dynamic_ok = s.type != RopeScalingType::dynamic || s.max_position_embeddings >= 1;
  if (s.type != RopeScalingType::none && (!factor_ok || !llama3_ok || !dynamic_ok)) {
    throw ArgumentError(
        cat(op, ": rope scaling '", to_string(s.type), "' needs a finite factor >= 1 (got ",
            s.factor, "); llama3 original_max_position_embeddings >= 1 (got ",
            s.original_max_position_embeddings, ") and 0 < low_freq_factor (", s.low_freq_factor,
            ") < high_freq_factor (", s.high_freq_factor,
            "); dynamic max_position_embeddings >= 1 (got ", s.max_position_embeddings, ")"));
  }
}

}  // namespace detail

/// Rotary position embedding of x (..., T, H, D), D even: time step t of every head is rotated
/// by the angles of position options.offset + t (Hugging Face's rotate-half layout).
template <class T>
Var<T> rope(const Var<T>& x, RopeOptions options = {}) {
  if (x.rank() < 3 || x.dim(-1) % 2 != 0 || x.dim(-1) < 2) {
    throw ShapeError(detail::cat(
        "rope: needs x of shape (..., T, H, D) with an even head size D, got ", x.shape()));
  }
  detail::check_rope_options("rope", options);
  return detail::record_op<detail::RopeNode<T>>({&x}, options);
}

}  // namespace remat
