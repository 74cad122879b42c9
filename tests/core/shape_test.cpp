#include "support/gradcheck.hpp"

#include <cstdint>
#include <vector>

using namespace remat;
using remat::test::error_message;

namespace {

__extension__ typedef unsigned __int128 shape_u128;

/// The true element count of `dims`, or -1 when it exceeds INT64_MAX (computed in 128 bits: an
/// oracle independent of Shape's own arithmetic).
std::int64_t shape_true_count(const std::vector<std::int64_t>& dims) {
  for (const std::int64_t d : dims) {
    if (d == 0) return 0;
  }
  shape_u128 n = 1;
  for (const std::int64_t d : dims) {
    n *= static_cast<shape_u128>(d);  // n < 2^64 and d < 2^63 here: no 128-bit overflow
    if (n > static_cast<shape_u128>(INT64_MAX)) return -1;
  }
  return static_cast<std::int64_t>(n);
}

/// An extent drawn to land near the int64 boundary: 0, a small one, or 2^k - 1, 2^k, 2^k + 1.
std::int64_t shape_random_extent(Rng& rng) {
  const double u = rng.uniform();
  if (u < 0.1) return 0;
  if (u < 0.3) return 1 + rng.uniform_int(5);
  const std::int64_t k = 1 + rng.uniform_int(62);
  return (std::int64_t{1} << k) - 1 + rng.uniform_int(k == 62 ? 2 : 3);
}

std::vector<std::int64_t> shape_random_dims(Rng& rng) {
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rng.uniform_int(Shape::kMaxRank + 1)));
  for (auto& d : dims) d = shape_random_extent(rng);
  return dims;
}

}  // namespace

TEST_CASE("a Shape holds at most 2^63 - 1 elements, a zero extent makes any shape empty",
          "[core][shape][errors]") {
  Rng rng(26);
  int accepted = 0, refused = 0, empty_with_huge = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::vector<std::int64_t> dims = shape_random_dims(rng);
    const std::int64_t count = shape_true_count(dims);
    std::string listed;
    for (const std::int64_t d : dims) listed += std::to_string(d) + " ";
    INFO("extents " << listed);
    if (count < 0) {
      const std::string message =
          error_message([&] { (void)Shape(std::span<const std::int64_t>(dims)); });
      CHECK_THAT(message, Catch::Contains("more than 2^63 - 1 elements"));
      CHECK_THAT(message, Catch::Contains(std::to_string(dims.back())));
      CHECK_THROWS_AS(Shape(std::span<const std::int64_t>(dims)), ShapeError);
      ++refused;
      continue;
    }
    const Shape s{std::span<const std::int64_t>(dims)};
    CHECK(s.numel() == count);
    ++accepted;
    std::vector<std::int64_t> nonzero;
    for (const std::int64_t d : dims) {
      if (d != 0) nonzero.push_back(d);
    }
    if (count == 0 && shape_true_count(nonzero) < 0) ++empty_with_huge;
    // every Shape built from it is checked as well: dropping, replacing or appending an extent
    for (int k = 0; k <= s.rank(); ++k) {
      std::vector<std::int64_t> kept(dims.begin(), dims.end() - k);
      if (shape_true_count(kept) < 0)
        CHECK_THROWS_AS(s.dropped_back(k), ShapeError);
      else
        CHECK(s.dropped_back(k).numel() == shape_true_count(kept));
    }
    const std::int64_t extent = shape_random_extent(rng);
    if (s.rank() > 0) {
      auto changed = dims;
      changed.back() = extent;
      if (shape_true_count(changed) < 0)
        CHECK_THROWS_AS(s.with_last(extent), ShapeError);
      else
        CHECK(s.with_last(extent).numel() == shape_true_count(changed));
      // rows(): all extents but the last, exact or a ShapeError
      const std::int64_t rows = shape_true_count({dims.begin(), dims.end() - 1});
      if (rows < 0)
        CHECK_THROWS_AS(s.rows(), ShapeError);
      else
        CHECK(s.rows() == rows);
    }
    if (s.rank() < Shape::kMaxRank) {
      auto longer = dims;
      longer.push_back(extent);
      if (shape_true_count(longer) < 0)
        CHECK_THROWS_AS(s.appended(extent), ShapeError);
      else
        CHECK(s.appended(extent).numel() == shape_true_count(longer));
    }
  }
  CHECK(accepted > 1000);
  CHECK(refused > 500);
  CHECK(empty_with_huge > 20);
}

TEMPLATE_TEST_CASE("tensors refuse shapes whose bytes cannot exist, and hold 0 bytes when empty",
                   "[core][shape][errors]", float, double) {
  using T = TestType;
  // the case: numel overflowed to 0 and zeros() made an empty tensor
  CHECK_THROWS_AS(Tensor<T>::zeros({std::int64_t{1} << 62, 8}), ShapeError);
  // elements that fit in int64_t, bytes that do not fit in 2^62
  const std::string message = error_message([] {
    (void)Tensor<T>(Shape{std::int64_t{1} << 61, 3});
  });
  CHECK_THAT(message, Catch::Contains("(2305843009213693952, 3)") && Catch::Contains("2^62 bytes"));
  // an empty tensor with huge other extents holds nothing
  const Tensor<T> empty = Tensor<T>::zeros({std::int64_t{1} << 40, std::int64_t{1} << 40, 0});
  CHECK(empty.numel() == 0);
  CHECK(empty.bytes() == 0);
  CHECK_THROWS_AS(empty.shape().rows(), ShapeError);  // 2^80 rows of nothing
  CHECK(Tensor<T>::zeros({0, std::int64_t{1} << 40, std::int64_t{1} << 40}).shape().rows() == 0);
}
