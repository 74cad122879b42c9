#pragma once
/// @file
/// A fast 64-bit fingerprint of a tensor's bytes and shape. Checkpoint replay compares the
/// fingerprints of recomputed values with those taken in the forward pass.

#include <cstdint>
#include <cstring>

#include "remat/core/rng.hpp"
#include "remat/core/tensor.hpp"

namespace remat::detail {

/// Fingerprint of raw bytes: 16 independent 32-bit multiply-xor lanes (so the loop vectorizes),
/// folded with a 64-bit mixer. Any change to a single word always changes its lane.
inline std::uint64_t hash_bytes(const void* data, std::size_t bytes) noexcept {
  constexpr int kLanes = 16;
  std::uint32_t lane[kLanes];
  for (int l = 0; l < kLanes; ++l)
    lane[l] = 0x811c9dc5U + static_cast<std::uint32_t>(l) * 0x9e3779b9U;
  const auto* p = static_cast<const unsigned char*>(data);
  const std::size_t words = bytes / 4;
  const std::size_t blocks = words / kLanes;
  for (std::size_t b = 0; b < blocks; ++b) {
    std::uint32_t w[kLanes];
    std::memcpy(w, p + b * kLanes * 4, sizeof w);
    for (int l = 0; l < kLanes; ++l) lane[l] = (lane[l] ^ w[l]) * 0x01000193U;
  }
  std::uint64_t h = mix64(bytes);
  for (std::size_t i = blocks * kLanes * 4; i < bytes; ++i) h = mix64(h ^ p[i]);
  for (int l = 0; l < kLanes; ++l)
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
