#include <catch2/catch.hpp>
#include <remat/remat.hpp>

#include <cmath>

using namespace remat;

TEST_CASE("counter-based draws are pure functions of (key, counter)", "[core][rng]") {
  const auto a = CounterRng::at(1, 10), b = CounterRng::at(1, 10), c = CounterRng::at(1, 11),
             d = CounterRng::at(2, 10);
  int same_c = 0, same_d = 0;
  for (std::uint32_t i = 0; i < 1000; ++i) {
    CHECK(a.bits(i) == b.bits(i));
    same_c += a.bits(i) == c.bits(i);
    same_d += a.bits(i) == d.bits(i);
    CHECK(a.uniform(i) >= 0.0f);
    CHECK(a.uniform(i) < 1.0f);
  }
  CHECK(same_c < 3);
  CHECK(same_d < 3);
}

TEST_CASE("sequential draws have the right moments", "[core][rng]") {
  Rng rng(9);
  double s = 0, s2 = 0, u = 0;
  constexpr int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double z = rng.normal();
    s += z;
    s2 += z * z;
    u += rng.uniform();
  }
  // five standard errors of each estimate: 1/sqrt(n), sqrt(2/n), sqrt(1/12n)
  CHECK(std::abs(s / n) < 5 / std::sqrt(double(n)));
  CHECK(std::abs(s2 / n - 1) < 5 * std::sqrt(2.0 / n));
  CHECK(std::abs(u / n - 0.5) < 5 * std::sqrt(1.0 / (12.0 * n)));
  Rng again(9);
  Rng other(10);
  CHECK(again.next_u64() == Rng(9).next_u64());
  CHECK(again.next_u64() != other.next_u64());
  // a stream resumes from a saved position
  Rng a(3), b(3);
  for (int i = 0; i < 5; ++i) a.normal();
  b.seek(a.position());
  CHECK(a.next_u64() == b.next_u64());
}
