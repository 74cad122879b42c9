#pragma once
/// @file
/// The counting allocator. Every tensor byte remat allocates goes through here, so live and peak
/// byte counts are exact: they are what benchmarks report and what tests assert. In a shape-only
/// run (core/shape_only.hpp) the same counting happens with no memory behind it.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <unordered_map>
#include <vector>

#include "remat/core/kernel_scratch.hpp"

#if __has_include(<sys/mman.h>)
#include <sys/mman.h>
#endif

namespace remat {
namespace detail {

struct MemoryCounters {
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::size_t> allocations{0};
  /// The most bytes held at once: live, plus freed buffers the cache keeps for reuse (the
  /// process's counters only; a shape-only run has no cache).
  std::atomic<std::size_t> held_peak{0};
  /// The most bytes live at once since the process started (reset_peak leaves it): what the
  /// cache may hold (the process's counters only).
  std::atomic<std::size_t> high_water{0};
};

/// The counters of this thread's shape-only run (core/shape_only.hpp), null outside one. A
/// tensor made in the run holds them, so it is uncounted from them whenever it dies.
inline std::shared_ptr<MemoryCounters>& shape_only_counters() noexcept {
  thread_local std::shared_ptr<MemoryCounters> counters;
  return counters;
}

/// True while this thread runs shape-only: tensors get a shape and no data, ops skip arithmetic.
inline bool shape_only() noexcept { return shape_only_counters() != nullptr; }

/// The counters of the process's real buffers.
inline MemoryCounters& process_counters() noexcept {
  static MemoryCounters counters;
  return counters;
}

/// The counters this thread's allocations go to: the process's, or its shape-only run's.
inline MemoryCounters& memory_counters() noexcept {
  if (const std::shared_ptr<MemoryCounters>& run = shape_only_counters()) return *run;
  return process_counters();
}

/// Raises `peak` to `now` if it is below: the maximum over the order the updates happened in.
inline void raise_to(std::atomic<std::size_t>& peak, std::size_t now) noexcept {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

/// Adds an allocation of `bytes` to `c`, raising the peak to the live count it produced (which
/// it returns): the peak stays exact when threads allocate concurrently, as the maximum over the
/// order the fetch_adds happened in.
inline std::size_t count_allocation(MemoryCounters& c, std::size_t bytes) noexcept {
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t now = c.live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  raise_to(c.peak, now);
  return now;
}

/// Alignment of every tensor buffer: a cache line, and enough for any SIMD load.
inline constexpr std::size_t kTensorAlignment = 64;

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

/// Buffers of at least this many bytes get pages of their own from the system, returned when
/// freed. From the C++ heap, glibc serves sizes below its mmap threshold, which rises to 32 MiB
/// as large buffers are freed, out of heaps that keep freed memory and reuse it piecemeal: a
/// 2B-class step without checkpoints, its activations of 8 to 48 MiB, ended resident 800 MiB
/// above the bytes the allocator held (docs/benchmarks.md). Under AddressSanitizer every buffer
/// comes from the heap, where it watches them.
inline constexpr std::size_t kOwnPagesBytes = std::size_t{1} << 20;

/// A buffer of `bytes` (a multiple of kTensorAlignment) from the system.
inline void* system_allocate(std::size_t bytes) {
#if __has_include(<sys/mman.h>)
  if (!kAddressSanitizer && bytes >= kOwnPagesBytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
#endif
  return ::operator new (bytes, std::align_val_t{kTensorAlignment});
}

/// Returns a buffer system_allocate(bytes) gave.
inline void system_free(void* p, std::size_t bytes) noexcept {
#if __has_include(<sys/mman.h>)
  if (!kAddressSanitizer && bytes >= kOwnPagesBytes) {
    ::munmap(p, bytes);
    return;
  }
#endif
  ::operator delete (p, std::align_val_t{kTensorAlignment});
}

/// Freed buffers kept for reuse, by rounded size. A training loop allocates the same sizes every
/// step; handing them back to the system and faulting fresh pages in again cost a quarter of a
/// step's time in measurements (docs/benchmarks.md). The counters above count the bytes tensors
/// asked for, so caching changes none of the live figures; memory::cached_bytes() tells what the
/// cache holds, memory::peak_held_bytes() the peak of live plus cached bytes (approximate: cached
/// bytes are counted rounded, and a concurrent hit may be seen on both sides for a moment).
///
/// The cache holds at most the most bytes ever live at once (the high-water mark), or 1 GiB
/// if that is more: a step that frees its activations in the backward pass finds them all
/// again in the next forward pass, however many gigabytes they are, and what the cache holds
/// stays within what the program once needed. A limit (memory::set_cache_limit) caps it
/// further; there is none by default.
class BlockCache {
 public:
  // Under AddressSanitizer nothing is cached: a reused buffer would hide a use after free.
  static constexpr std::size_t kDefaultLimit =
      kAddressSanitizer ? 0 : std::numeric_limits<std::size_t>::max();
  /// What the cache may hold however little was ever live.
  static constexpr std::size_t kFloor = std::size_t{1} << 30;

  static std::size_t rounded(std::size_t bytes) noexcept {
    const std::size_t grain = bytes >= 4096 ? 4096 : kTensorAlignment;
    return (bytes + grain - 1) / grain * grain;
  }

  /// A buffer for `bytes`, cached or new, and the bytes the cache holds after it.
  std::pair<void*, std::size_t> take(std::size_t bytes) {
    const std::size_t size = rounded(bytes);
    std::size_t cached = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        return {p, cached_};
      }
      cached = cached_;
    }
    return {system_allocate(size), cached};
  }

  /// Takes back a freed buffer for `bytes`; `high_water`: the process's live high-water mark.
  void give(void* p, std::size_t bytes, std::size_t high_water) noexcept {
    const std::size_t size = rounded(bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!closed_ && cached_ + size <= std::min(limit_, std::max(kFloor, high_water))) {
        try {
          free_[size].push_back(p);
          cached_ += size;
          return;
        } catch (...) {  // no room to remember it: free it instead
        }
      }
    }
    system_free(p, size);
  }

  /// Frees every cached buffer.
  void release() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) system_free(p, size);
    }
    free_.clear();
    cached_ = 0;
  }

  void set_limit(std::size_t bytes) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = bytes;
    }
    if (cached() > bytes) release();
  }

  std::size_t cached() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

  /// At exit: free everything and cache nothing more (tensors in static storage die later).
  void close() noexcept {
    release();
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
  std::size_t limit_ = kDefaultLimit;
  bool closed_ = false;
};

/// The process's cache. It is never destroyed (a tensor in static storage may be freed after
/// any destructor has run); a static guard empties and closes it at exit instead.
inline BlockCache& block_cache() noexcept {
  static BlockCache* cache = new BlockCache;
  static struct Closer {
    ~Closer() { cache->close(); }
  } closer;
  return *cache;
}

/// A real buffer of `bytes`, counted in the process's counters (also inside a shape-only run,
/// where a real tensor may still be made or die: one that lived before it began).
inline void* allocate_bytes(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  MemoryCounters& c = process_counters();
  const auto [p, cached] = block_cache().take(bytes);
  const std::size_t live = count_allocation(c, bytes);
  raise_to(c.high_water, live);
  // live + cached grows here (give() moves bytes from live to cached or to the system, but for
  // the cache's rounding of a buffer's size, which this peak leaves out)
  raise_to(c.held_peak, live + cached);
  return p;
}

inline void deallocate_bytes(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  MemoryCounters& c = process_counters();
  c.live.fetch_sub(bytes, std::memory_order_relaxed);
  block_cache().give(p, bytes, c.high_water.load(std::memory_order_relaxed));
}

/// A tensor's buffer of `bytes`, owned: freeing the owner returns the buffer and uncounts it. In
/// a shape-only run the buffer is null and only the run's counters move.
template <class T>
std::shared_ptr<T> allocate_storage(std::size_t bytes) {
  if (const std::shared_ptr<MemoryCounters>& run = shape_only_counters()) {
    if (bytes > 0) count_allocation(*run, bytes);  // as allocate_bytes: an empty tensor is none
    return std::shared_ptr<T>(static_cast<T*>(nullptr), [bytes, run](T*) noexcept {
      run->live.fetch_sub(bytes, std::memory_order_relaxed);
    });
  }
  T* data = static_cast<T*>(allocate_bytes(bytes));
  return std::shared_ptr<T>(data, [bytes](T* p) noexcept { deallocate_bytes(p, bytes); });
}

}  // namespace detail

namespace memory {

/// Bytes of tensor storage alive right now, over all threads (in a shape-only run: the run's).
inline std::size_t live_bytes() noexcept {
  return detail::memory_counters().live.load(std::memory_order_relaxed);
}

/// The most bytes that were alive at once since the start or the last reset_peak().
inline std::size_t peak_bytes() noexcept {
  return detail::memory_counters().peak.load(std::memory_order_relaxed);
}

/// The most bytes held at once since the start or the last reset_peak(): live bytes plus the
/// freed buffers the cache kept for reuse at that moment (see set_cache_limit).
/// What the process holds of tensor memory; peak_bytes() is what tensors needed.
inline std::size_t peak_held_bytes() noexcept {
  return detail::memory_counters().held_peak.load(std::memory_order_relaxed);
}

/// Number of tensor buffers allocated since the program started.
inline std::size_t allocation_count() noexcept {
  return detail::memory_counters().allocations.load(std::memory_order_relaxed);
}

/// Bytes held by freed buffers kept for reuse (not counted as live).
inline std::size_t cached_bytes() noexcept { return detail::block_cache().cached(); }

/// Returns every cached buffer to the system, and the calling thread's kernel scratch (the
/// packed operands of its largest BF16 GEMM, ops/gemm_bf16.hpp).
inline void release_cache() noexcept {
  detail::block_cache().release();
  detail::kernel_scratch().release();
}

/// Caps the bytes the reuse cache may hold. By default there is no cap but its rule: at most the
/// most bytes ever live at once, or 1 GiB (detail::BlockCache); 0 turns caching off, and is the
/// default under AddressSanitizer.
inline void set_cache_limit(std::size_t bytes) noexcept { detail::block_cache().set_limit(bytes); }

/// Starts a new peak measurement from the current live count.
inline void reset_peak() noexcept {
  detail::MemoryCounters& c = detail::memory_counters();
  const std::size_t live = c.live.load(std::memory_order_relaxed);
  c.peak.store(live, std::memory_order_relaxed);
  c.held_peak.store(detail::shape_only() ? 0 : live + cached_bytes(), std::memory_order_relaxed);
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
