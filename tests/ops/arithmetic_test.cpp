#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("binary ops compute element-wise values with bias-style broadcasting",
                   "[ops][arithmetic]", float, double) {
  using T = TestType;
  const Var<T> a(Tensor<T>::from({2, 3}, {1, 2, 3, 4, 5, 6}));
  const Var<T> b(Tensor<T>::from({3}, {10, 20, 40}));
  CHECK(add(a, b).value().to_vector() == std::vector<T>{11, 22, 43, 14, 25, 46});
  CHECK(sub(b, a).value().to_vector() == std::vector<T>{9, 18, 37, 6, 15, 34});
  CHECK(mul(a, b).value().to_vector() == std::vector<T>{10, 40, 120, 40, 100, 240});
  CHECK(div(b, a).value().to_vector() ==
        std::vector<T>{10, 10, T(40) / 3, T(10) / 4, 4, T(40) / 6});
  CHECK((a * T(2) + T(1)).value().to_vector() == std::vector<T>{3, 5, 7, 9, 11, 13});
  CHECK((-a).value().to_vector() == std::vector<T>{-1, -2, -3, -4, -5, -6});
  CHECK(add(a, b).shape() == Shape{2, 3});
}

TEST_CASE("binary ops: gradients for every broadcasting family", "[ops][arithmetic][gradcheck]") {
  const std::vector<std::pair<Shape, Shape>> families = {
      {{3, 4}, {3, 4}},     // same shape
      {{2, 3, 4}, {4}},     // bias over the last axis
      {{2, 3, 4}, {3, 4}},  // a matrix repeated over a batch
      {{3, 4}, {1, 4}},     // leading 1s ignored
      {{4}, {3, 4}},        // the first operand repeats
      {{}, {2, 3}},         // a scalar
      {{2, 3}, {1}},        // a one-element vector
  };
  for (const auto& [sa, sb] : families) {
    DYNAMIC_SECTION("shapes " << sa << " and " << sb) {
      const auto a = randn(sa, 1);
      // keep divisors away from zero
      auto b = randn(sb, 2);
      for (double& v : b) v = v > 0 ? v + 0.5 : v - 0.5;
      gradcheck([](const auto& v) { return add(v[0], v[1]); }, {a, b});
      gradcheck([](const auto& v) { return sub(v[0], v[1]); }, {a, b});
      gradcheck([](const auto& v) { return mul(v[0], v[1]); }, {a, b});
      gradcheck([](const auto& v) { return div(v[0], v[1]); }, {a, b});
    }
  }
}

TEST_CASE("a Var used twice accumulates both gradients", "[ops][arithmetic][gradcheck]") {
  gradcheck([](const auto& v) { return mul(v[0], v[0]) + v[0]; }, {randn({3, 2}, 3)});
  gradcheck([](const auto& v) { return div(v[0], add_scalar(mul(v[0], v[0]), 1.0)); },
            {randn({5}, 4)});
}

TEST_CASE("scalar ops: gradients", "[ops][arithmetic][gradcheck]") {
  gradcheck([](const auto& v) { return neg(v[0]); }, {randn({2, 3}, 5)});
  gradcheck([](const auto& v) { return scale(v[0], -2.5); }, {randn({2, 3}, 6)});
  gradcheck([](const auto& v) { return add_scalar(v[0], 3.0); }, {randn({4}, 7)});
  gradcheck([](const auto& v) { return 2.0 * v[0] - 1.0; }, {randn({4}, 8)});
  gradcheck([](const auto& v) { return v[0] / 4.0; }, {randn({4}, 9)});
}

TEST_CASE("binary ops reject shapes that do not broadcast, naming op and shapes",
          "[ops][arithmetic][errors]") {
  const Var<float> a(Tensor<float>::zeros({3, 4}));
  const Var<float> b(Tensor<float>::zeros({3}));
  const std::string msg = remat::test::error_message([&] { add(a, b); });
  CHECK_THAT(msg, Catch::Contains("add") && Catch::Contains("(3, 4)") && Catch::Contains("(3,)"));
  CHECK_THROWS_AS(mul(a, Var<float>(Tensor<float>::zeros({4, 4}))), ShapeError);
  CHECK_THROWS_AS(div(a, Var<float>(Tensor<float>::zeros({2, 3, 5}))), ShapeError);
}
