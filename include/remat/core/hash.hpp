#pragma once
/// @file
/// A fast 64-bit fingerprint of a tensor's bytes and shape. Checkpoint replay compares the
/// fingerprints of recomputed values with those taken in the forward pass.

#include <cstddef>
#include <cstdint>

#include "remat/core/rng.hpp"
#include "remat/core/tensor.hpp"
#include "remat/core/vector_kernels.hpp"

namespace remat::detail {

/// Fingerprint of raw bytes: 64 independent 32-bit multiply-xor lanes on the CPU's widest
/// vectors (vec::hash_lanes; each a multiply's latency behind itself, so four AVX-512 vectors
/// keep the multiplier busy), folded with a 64-bit mixer. Any change to a single word always
/// changes its lane, and then the fingerprint (each fold is a bijection). A replay fingerprints
/// what it recomputes, on the step's critical path: 16 lanes in plain C++ took 140 us a MiB at
/// -O2 (SSE2 has no 32-bit vector multiply), 62 at -O3, on a Zen 5.
inline std::uint64_t hash_bytes(const void* data, std::size_t bytes) noexcept {
  constexpr std::size_t kLanes = 64;
  std::uint32_t lane[kLanes];
  for (std::size_t l = 0; l < kLanes; ++l)
    lane[l] = 0x811c9dc5U + static_cast<std::uint32_t>(l) * 0x9e3779b9U;
  const auto* p = static_cast<const unsigned char*>(data);
  const std::size_t blocks = bytes / (kLanes * 4);
  vec::hash_lanes(p, blocks, lane);
  std::uint64_t h = mix64(bytes);
  for (std::size_t i = blocks * kLanes * 4; i < bytes; ++i) h = mix64(h ^ p[i]);
  for (std::size_t l = 0; l < kLanes; ++l)
    h = mix64(h ^ (static_cast<std::uint64_t>(lane[l]) << (l % 2 * 32)));
  return h;
}

template <class T>
std::uint64_t hash_tensor(const Tensor<T>& t) noexcept {
  // a shape-only tensor (core/shape_only.hpp) is fingerprinted by its shape alone
  std::uint64_t h = t.has_data() ? hash_bytes(t.data(), t.bytes()) : 0;
  for (std::int64_t d : t.shape()) h = mix64(h ^ static_cast<std::uint64_t>(d));
  return h;
}

}  // namespace remat::detail
