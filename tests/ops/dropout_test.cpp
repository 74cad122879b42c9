#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

namespace {

std::vector<float> run_dropout(std::uint64_t seed, int ops_before) {
  Tape tape(TapeOptions{.seed = seed});
  auto x = tape.input(Tensor<float>::ones({1000}));
  for (int i = 0; i < ops_before; ++i) x = x * 1.0f;
  return dropout(x, 0.3).value().to_vector();
}

}  // namespace

TEST_CASE("dropout zeroes about p of the elements and scales the rest", "[ops][dropout]") {
  const std::vector<float> y = run_dropout(42, 0);
  int zeros = 0;
  for (float v : y) {
    if (v == 0)
      ++zeros;
    else
      CHECK(v == Approx(1 / 0.7));
  }
  CHECK(zeros > 240);
  CHECK(zeros < 360);
}

TEST_CASE("dropout's mask is a function of (seed, position on the tape)", "[ops][dropout]") {
  CHECK(run_dropout(42, 0) == run_dropout(42, 0));
  CHECK(run_dropout(42, 0) != run_dropout(43, 0));
  CHECK(run_dropout(42, 0) != run_dropout(42, 1));
}

TEST_CASE("dropout is the identity when not training or when p is 0", "[ops][dropout]") {
  const Var<float> x(Tensor<float>::full({10}, 2.0f));
  CHECK(dropout(x, 0.5, false).value().to_vector() == x.value().to_vector());
  CHECK(dropout(x, 0.0).value().to_vector() == x.value().to_vector());
}

TEST_CASE("dropout: gradient uses the forward pass's mask", "[ops][dropout][gradcheck]") {
  gradcheck([](const auto& v) { return dropout(v[0], 0.4); }, {randn({4, 5}, 1)});
  gradcheck([](const auto& v) { return tanh(dropout(v[0] * 2.0, 0.25)); }, {randn({30}, 2)});
}

TEST_CASE("dropout rejects p outside the unit interval", "[ops][dropout][errors]") {
  const Var<float> x(Tensor<float>::ones({3}));
  CHECK_THAT(remat::test::error_message([&] { dropout(x, 1.0); }),
             Catch::Contains("dropout") && Catch::Contains("got 1"));
  CHECK_THROWS_AS(dropout(x, -0.1), ArgumentError);
}
