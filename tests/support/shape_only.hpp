#pragma once
// Shape-only runs against real ones: the allocator's figures of the same code run both ways.
#include <remat/core/memory.hpp>
#include <remat/core/shape_only.hpp>

#include <catch2/catch.hpp>
#include <cstddef>
#include <optional>

namespace remat::test {

/// What the allocator counted while a function ran, above what was live when it started.
struct Counted {
  std::size_t peak = 0;         ///< the peak above the start
  std::size_t allocations = 0;  ///< tensors allocated
  std::size_t left = 0;         ///< bytes still live at the end (held by what fn keeps)
  bool operator==(const Counted&) const = default;
};

/// fn() counted in a real run, or in a shape-only one.
template <class Fn>
Counted counted(bool shape_only, Fn&& fn) {
  std::optional<ShapeOnly> run;
  if (shape_only) run.emplace();
  const std::size_t allocations = memory::allocation_count();
  const memory::Probe probe;
  fn();
  return {probe.peak_above_start(), memory::allocation_count() - allocations,
          memory::live_bytes() - probe.start()};
}

/// Runs fn() for real and shape-only and requires the same counts, to the byte. fn makes its
/// own inputs (inside the run, so that they have no data in the shape-only one) and returns
/// nothing it made.
template <class Fn>
Counted check_shape_only_exact(Fn&& fn) {
  const Counted real = counted(false, fn);
  const Counted shape = counted(true, fn);
  CHECK(shape.peak == real.peak);
  CHECK(shape.allocations == real.allocations);
  CHECK(shape.left == real.left);
  return real;
}

}  // namespace remat::test
