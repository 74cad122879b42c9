#include "support/gradcheck.hpp"

#include <cmath>

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("cross_entropy is the mean negative log-likelihood", "[ops][loss]", float, double) {
  using T = TestType;
  const Var<T> logits(Tensor<T>::from({2, 3}, {1, 2, 3, 0, 0, 0}));
  const auto targets = Tensor<std::int32_t>::from({2}, {2, 1});
  const double want = ((std::log(std::exp(1.) + std::exp(2.) + std::exp(3.)) - 3) + std::log(3.)) / 2;
  CHECK(cross_entropy(logits, targets).item() == Approx(want).epsilon(std::is_same_v<T, float> ? 1e-6 : 1e-14));
  // (B, T, C) logits with (B, T) targets
  const Var<T> seq(Tensor<T>::zeros({2, 2, 4}));
  CHECK(cross_entropy(seq, Tensor<std::int32_t>::from({2, 2}, {0, 1, 2, 3})).item() ==
        Approx(std::log(4.)).epsilon(1e-6));
}

TEST_CASE("cross_entropy: gradient", "[ops][loss][gradcheck]") {
  const auto t = Tensor<std::int32_t>::from({4}, {0, 3, 3, 1});
  gradcheck([t](const auto& v) { return cross_entropy(v[0], t); }, {randn({4, 5}, 1)});
  const auto t3 = Tensor<std::int32_t>::from({2, 3}, {0, 1, 2, 2, 1, 0});
  gradcheck([t3](const auto& v) { return cross_entropy(v[0] * 3.0, t3); }, {randn({2, 3, 3}, 2)});
}

TEST_CASE("cross_entropy rejects bad targets, naming value and position", "[ops][loss][errors]") {
  const Var<float> logits(Tensor<float>::zeros({3, 4}));
  CHECK_THAT(remat::test::error_message([&] { cross_entropy(logits, Tensor<std::int32_t>::from({3}, {0, 1, 4})); }),
             Catch::Contains("cross_entropy") && Catch::Contains("target 4 at position 2") && Catch::Contains("[0, 4)"));
  CHECK_THROWS_AS(cross_entropy(logits, Tensor<std::int32_t>::from({3}, {0, -1, 2})), IndexError);
  CHECK_THROWS_AS(cross_entropy(logits, Tensor<std::int32_t>::from({2}, {0, 1})), ShapeError);
}
