#pragma once
/// @file
/// The counting allocator. Every tensor byte remat allocates goes through here, so live and peak
/// byte counts are exact: they are what benchmarks report and what tests assert.

#include <atomic>
#include <cstddef>
#include <new>

namespace remat {
namespace detail {

struct MemoryCounters {
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::size_t> allocations{0};
};

inline MemoryCounters& memory_counters() noexcept {
  static MemoryCounters counters;
  return counters;
}

/// Alignment of every tensor buffer: a cache line, and enough for any SIMD load.
inline constexpr std::size_t kTensorAlignment = 64;

inline void* allocate_bytes(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = ::operator new(bytes, std::align_val_t{kTensorAlignment});
  MemoryCounters& c = memory_counters();
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  // The peak is raised to the live count this very allocation produced, so it stays exact when
  // threads allocate concurrently: it is the maximum over the order the fetch_adds happened in.
  const std::size_t now = c.live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = c.peak.load(std::memory_order_relaxed);
  while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return p;
}

inline void deallocate_bytes(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  memory_counters().live.fetch_sub(bytes, std::memory_order_relaxed);
  ::operator delete(p, std::align_val_t{kTensorAlignment});
}

}  // namespace detail

namespace memory {

/// Bytes of tensor storage alive right now, over all threads.
inline std::size_t live_bytes() noexcept {
  return detail::memory_counters().live.load(std::memory_order_relaxed);
}

/// The most bytes that were alive at once since the start or the last reset_peak().
inline std::size_t peak_bytes() noexcept {
  return detail::memory_counters().peak.load(std::memory_order_relaxed);
}

/// Number of tensor buffers allocated since the program started.
inline std::size_t allocation_count() noexcept {
  return detail::memory_counters().allocations.load(std::memory_order_relaxed);
}

/// Starts a new peak measurement from the current live count.
inline void reset_peak() noexcept {
  detail::MemoryCounters& c = detail::memory_counters();
  c.peak.store(c.live.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

/// Measures the peak of a region above what was live when it began:
/// `memory::Probe probe; step(); probe.peak_above_start()`.
class Probe {
 public:
  Probe() noexcept : start_(live_bytes()) { reset_peak(); }
  /// Bytes live when the probe was made.
  std::size_t start() const noexcept { return start_; }
  /// Peak since the probe was made, minus what was live at its start.
  std::size_t peak_above_start() const noexcept {
    const std::size_t peak = peak_bytes();
    return peak > start_ ? peak - start_ : 0;
  }

 private:
  std::size_t start_;
};

}  // namespace memory
}  // namespace remat
