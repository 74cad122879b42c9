#pragma once
/// @file
/// Random numbers that are pure functions of (key, counter). A dropout mask is drawn from a key
/// made of the tape's seed and the op's position in the forward pass, so a checkpoint replay, or
/// the backward pass itself, can draw the same numbers again with no state to save.

#include <cmath>
#include <cstdint>
#include <numbers>

#include "remat/core/tensor.hpp"

namespace remat {
namespace detail {

/// SplitMix64's finalizer: a bijective 64-bit mixer with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A 32-bit mixer (lowbias32); 32-bit multiplies vectorize where 64-bit ones do not.
constexpr std::uint32_t mix32(std::uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

}  // namespace detail

/// Random bits at any position of a stream named by a 64-bit key, in any order.
class CounterRng {
 public:
  explicit constexpr CounterRng(std::uint64_t key) noexcept
      : lo_(static_cast<std::uint32_t>(key)), hi_(static_cast<std::uint32_t>(key >> 32)) {}

  /// A key for the stream of (seed, position): different positions give unrelated streams.
  static constexpr CounterRng at(std::uint64_t seed, std::uint64_t position) noexcept {
    return CounterRng(detail::mix64(seed ^ detail::mix64(position + 0x9e3779b97f4a7c15ULL)));
  }

  /// 32 random bits at `counter`.
  constexpr std::uint32_t bits(std::uint32_t counter) const noexcept {
    return detail::mix32(detail::mix32(counter ^ lo_) + hi_);
  }

  /// A float in [0, 1) with 24 random bits, at `counter`.
  constexpr float uniform(std::uint32_t counter) const noexcept {
    return static_cast<float>(bits(counter) >> 8) * (1.0f / 16777216.0f);
  }

 private:
  std::uint32_t lo_, hi_;
};

/// A sequential generator for initialization and data: a seed and a running counter.
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) noexcept : key_(detail::mix64(seed)) {}

  std::uint64_t next_u64() noexcept {
    return detail::mix64(key_ + 0x9e3779b97f4a7c15ULL * ++counter_);
  }

  /// How many 64-bit draws were made; with seek(), lets a run save and resume its stream.
  std::uint64_t position() const noexcept { return counter_; }
  void seek(std::uint64_t position) noexcept { counter_ = position; }

  /// A double in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  double uniform(double lo, double hi) noexcept { return lo + (hi - lo) * uniform(); }

  /// A standard normal draw (Box-Muller).
  double normal() noexcept {
    const double u1 = 1.0 - uniform();  // in (0, 1]: log is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

  /// An integer in [0, n), n > 0.
  std::int64_t uniform_int(std::int64_t n) noexcept {
    return static_cast<std::int64_t>(next_u64() % static_cast<std::uint64_t>(n));
  }

  // A shape-only tensor (core/shape_only.hpp) has nothing to fill: it draws nothing.
  template <class T>
  void fill_uniform(Tensor<T>& t, double lo, double hi) noexcept {
    if (!t.has_data()) return;
    for (T& v : t) v = static_cast<T>(uniform(lo, hi));
  }

  template <class T>
  void fill_normal(Tensor<T>& t, double mean, double stddev) noexcept {
    if (!t.has_data()) return;
    for (T& v : t) v = static_cast<T>(mean + stddev * normal());
  }

  template <class T>
  Tensor<T> uniform_tensor(const Shape& shape, double lo, double hi) {
    Tensor<T> t(shape);
    fill_uniform(t, lo, hi);
    return t;
  }

  template <class T>
  Tensor<T> normal_tensor(const Shape& shape, double mean = 0.0, double stddev = 1.0) {
    Tensor<T> t(shape);
    fill_normal(t, mean, stddev);
    return t;
  }

 private:
  std::uint64_t key_;
  std::uint64_t counter_ = 0;
};

}  // namespace remat
