#include <catch2/catch.hpp>
#include <remat/remat.hpp>

#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <unistd.h>

using namespace remat;

namespace {

/// One operation of a generated sequence: three times in five (or when nothing is held), a new
/// tensor of 1 to `max_pages` whole 4 KiB pages, never written; otherwise one held tensor freed.
void allocate_or_free(std::mt19937& rng, std::vector<Tensor<float>>& held, unsigned max_pages) {
  if (held.empty() || rng() % 5 < 3) {
    held.emplace_back(Shape{static_cast<std::int64_t>(1 + rng() % max_pages) * 1024});
  } else {
    held.erase(held.begin() + static_cast<std::ptrdiff_t>(rng() % held.size()));
  }
}

}  // namespace

TEST_CASE("the counting allocator counts tensor bytes exactly", "[core][memory]") {
  const std::size_t live0 = memory::live_bytes();
  const std::size_t count0 = memory::allocation_count();
  {
    Tensor<float> a({3, 4});
    CHECK(memory::live_bytes() == live0 + 48);
    Tensor<double> b = Tensor<double>::zeros({5});
    CHECK(memory::live_bytes() == live0 + 48 + 40);
    Tensor<float> shared = a;                  // shares: no allocation
    Tensor<float> view = a.reshape({2, 6});    // shares: no allocation
    Tensor<float> rows = a.narrow_rows(1, 3);  // shares: no allocation
    CHECK(memory::live_bytes() == live0 + 88);
    Tensor<float> copy = a.clone();  // copies: 48 more
    CHECK(memory::live_bytes() == live0 + 136);
    CHECK(memory::allocation_count() == count0 + 3);
  }
  CHECK(memory::live_bytes() == live0);
  Tensor<float> empty({0, 7});  // zero bytes, nothing allocated
  CHECK(memory::allocation_count() == count0 + 3);
}

TEST_CASE("peak bytes and the probe", "[core][memory]") {
  memory::Probe probe;
  {
    Tensor<float> a({1000});
    { Tensor<float> b({500}); }
    Tensor<float> c({200});
  }
  CHECK(probe.peak_above_start() == 6000);
  memory::reset_peak();
  CHECK(memory::peak_bytes() == memory::live_bytes());
}

TEST_CASE("counters stay exact when many threads allocate and free at once",
          "[core][memory][threads]") {
  const std::size_t live0 = memory::live_bytes();
  const std::size_t count0 = memory::allocation_count();
  memory::reset_peak();
  constexpr int kThreads = 8, kRounds = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      std::vector<Tensor<float>> held;
      for (int i = 0; i < kRounds; ++i) {
        held.emplace_back(Shape{(t * 7 + i) % 97 + 1});
        if (held.size() > 5) held.erase(held.begin());
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(memory::live_bytes() == live0);
  CHECK(memory::allocation_count() == count0 + kThreads * kRounds);
  // each thread holds at most 6 buffers of at most 97 floats at once
  CHECK(memory::peak_bytes() <= live0 + kThreads * 6 * 97 * 4);
  CHECK(memory::peak_bytes() > live0);
}

TEST_CASE("freed buffers are cached for reuse without changing the counts", "[core][memory]") {
  memory::set_cache_limit(std::size_t{1} << 30);  // caching on, even under AddressSanitizer
  memory::release_cache();
  const std::size_t live0 = memory::live_bytes();
  const void* first = nullptr;
  {
    Tensor<float> a({1000, 10});
    first = a.data();
  }
  CHECK(memory::live_bytes() == live0);
  CHECK(memory::cached_bytes() == 40960);  // 40000 bytes, rounded up to 4 KiB pages
  {
    Tensor<float> b({10000});  // the same rounded size: the same buffer again
    CHECK(b.data() == first);
    CHECK(memory::live_bytes() == live0 + 40000);
    CHECK(memory::cached_bytes() == 0);
  }
  memory::release_cache();
  CHECK(memory::cached_bytes() == 0);
  memory::set_cache_limit(0);
  { Tensor<float> c({10000}); }
  CHECK(memory::cached_bytes() == 0);
  memory::set_cache_limit(remat::detail::BlockCache::kDefaultLimit);
}

TEST_CASE("the held peak counts the cache beside the live bytes", "[core][memory]") {
  // generated sequences of allocations and frees of whole pages (the cache's rounding is then
  // exact): after each, the held peak is at least live + cached now and at least the live peak,
  // and it is reached: a step-by-step maximum of live + cached equals it
  memory::set_cache_limit(std::size_t{1} << 30);
  std::mt19937 rng(7);
  for (int sequence = 0; sequence < 10; ++sequence) {
    memory::release_cache();
    memory::reset_peak();
    std::size_t most = memory::live_bytes() + memory::cached_bytes();
    std::vector<Tensor<float>> held;
    for (int op = 0; op < 200; ++op) {
      allocate_or_free(rng, held, 16);
      const std::size_t now = memory::live_bytes() + memory::cached_bytes();
      most = std::max(most, now);
      INFO("sequence " << sequence << ", op " << op);
      REQUIRE(memory::peak_held_bytes() >= now);
      REQUIRE(memory::peak_held_bytes() >= memory::peak_bytes());
    }
    CHECK(memory::peak_held_bytes() == most);
  }
  // a buffer freed into the cache, then one of another size: held beyond the live peak
  memory::release_cache();
  memory::reset_peak();
  const std::size_t live0 = memory::live_bytes();
  CHECK(memory::peak_held_bytes() == live0);
  { Tensor<float> a({10 * 1024}); }
  { Tensor<float> b({20 * 1024}); }
  CHECK(memory::peak_bytes() == live0 + 20 * 4096);
  CHECK(memory::peak_held_bytes() == live0 + 30 * 4096);
  memory::set_cache_limit(remat::detail::BlockCache::kDefaultLimit);
}

namespace {

/// This process's resident bytes now, from /proc/self/statm; 0 where there is no such file.
std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t size_pages = 0;
  std::size_t resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("a freed large buffer leaves the process", "[core][memory]") {
  if (remat::detail::kAddressSanitizer || resident_bytes() == 0) {
    WARN("no /proc/self/statm, or AddressSanitizer (which takes every buffer from the heap)");
    return;
  }
  // glibc's malloc serves 8 MiB from its heap once a 16 MiB mapped block was freed, and keeps
  // the freed 8 MiB holes between live buffers resident (this test fails so on the allocator
  // that took every buffer from operator new): buffers from the allocator must not
  memory::set_cache_limit(0);
  { Tensor<float> large = Tensor<float>::zeros({4 << 20}); }
  constexpr std::size_t kBuffers = 16;
  constexpr std::int64_t kFloats = 2 << 20;  // 8 MiB
  std::vector<Tensor<float>> kept;
  std::vector<Tensor<float>> dropped;
  for (std::size_t i = 0; i < kBuffers; ++i) {
    (i % 2 == 0 ? dropped : kept).push_back(Tensor<float>::zeros({kFloats}));  // pages touched
  }
  const std::size_t before = resident_bytes();
  dropped.clear();
  const std::size_t after = resident_bytes();
  INFO("resident before " << before << " bytes, after " << after);
  // 64 MiB freed; allow 8 MiB for whatever else the process did meanwhile
  CHECK(after + (56u << 20) <= before);
  memory::set_cache_limit(remat::detail::BlockCache::kDefaultLimit);
}

TEST_CASE("the cache holds up to the most bytes ever live, or 1 GiB", "[core][memory]") {
  if (remat::detail::BlockCache::kDefaultLimit == 0) return;  // sanitized: nothing is cached
  const auto high_water = [] {
    return remat::detail::process_counters().high_water.load(std::memory_order_relaxed);
  };
  const std::size_t cap_floor = remat::detail::BlockCache::kFloor;
  memory::release_cache();
  // a step of 1.5 GiB, freed, is found again whole by the next step: past the 1 GiB floor, the
  // cache holds what was live at once (the buffers are never written: no page is resident)
  constexpr std::int64_t kFloats = 64 << 20;  // 256 MiB
  std::vector<Tensor<float>> step;
  for (int i = 0; i < 6; ++i) step.emplace_back(Shape{kFloats});
  REQUIRE(high_water() >= 6 * std::size_t{256 << 20});
  step.clear();
  CHECK(memory::cached_bytes() == 6 * std::size_t{256 << 20});
  for (int i = 0; i < 6; ++i) step.emplace_back(Shape{kFloats});
  CHECK(memory::cached_bytes() == 0);
  step.clear();
  // buffers of other sizes, freed, are not kept past the high-water mark (those cached stay)
  for (int i = 0; i < 7; ++i) step.emplace_back(Shape{kFloats - 1024});
  step.clear();
  CHECK(memory::cached_bytes() <= std::max(cap_floor, high_water()));
  CHECK(memory::cached_bytes() >= 6 * std::size_t{256 << 20});
  // generated sequences: after each allocation or free, the cache within its bound
  std::mt19937 rng(11);
  for (int sequence = 0; sequence < 10; ++sequence) {
    std::vector<Tensor<float>> held;
    for (int op = 0; op < 300; ++op) {
      allocate_or_free(rng, held, 4096);  // up to 16 MiB: most pages of their own (mapped)
      INFO("sequence " << sequence << ", op " << op);
      REQUIRE(memory::cached_bytes() <= std::max(cap_floor, high_water()));
    }
  }
  memory::release_cache();
  CHECK(memory::cached_bytes() == 0);
}

TEST_CASE("a real tensor that dies inside a shape-only run leaves the process's count",
          "[core][memory][shape_only]") {
  const std::size_t live0 = memory::live_bytes();
  std::optional<Tensor<float>> real(Tensor<float>({1000}));
  CHECK(memory::live_bytes() == live0 + 4000);
  {
    ShapeOnly run;
    real.reset();
    CHECK(memory::live_bytes() == 0);  // the run's own count, which it was never part of
  }
  CHECK(memory::live_bytes() == live0);
}
