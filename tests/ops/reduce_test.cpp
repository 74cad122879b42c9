#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("sum and mean, of everything and along an axis", "[ops][reduce]", float,
                   double) {
  using T = TestType;
  const Var<T> x(Tensor<T>::from({2, 3}, {1, 2, 3, 4, 5, 6}));
  CHECK(sum(x).item() == 21);
  CHECK(sum(x).rank() == 0);
  CHECK(mean(x).item() == T(3.5));
  CHECK(sum(x, 0).value().to_vector() == std::vector<T>{5, 7, 9});
  CHECK(sum(x, -1).value().to_vector() == std::vector<T>{6, 15});
  CHECK(sum(x, 1, true).shape() == Shape{2, 1});
  CHECK(mean(x, 0).value().to_vector() == std::vector<T>{T(2.5), T(3.5), T(4.5)});
}

TEST_CASE("sum of many elements does not depend on the thread count", "[ops][reduce]") {
  Rng rng(4);
  const auto big = rng.normal_tensor<float>({300001});
  const int before = num_threads();
  set_num_threads(1);
  const float one = sum(Var<float>(big)).item();
  set_num_threads(2);
  const float two = sum(Var<float>(big)).item();
  set_num_threads(before);
  CHECK(one == two);
}

TEST_CASE("reductions: gradients", "[ops][reduce][gradcheck]") {
  const auto x = randn({2, 3, 4}, 1);
  gradcheck([](const auto& v) { return sum(v[0]); }, {x});
  gradcheck([](const auto& v) { return mean(v[0]); }, {x});
  for (int axis : {0, 1, 2, -1}) {
    DYNAMIC_SECTION("axis " << axis) {
      gradcheck([axis](const auto& v) { return sum(v[0], axis); }, {x});
      gradcheck([axis](const auto& v) { return mean(v[0], axis, true); }, {x});
    }
  }
}

TEST_CASE("reductions reject bad axes", "[ops][reduce][errors]") {
  const Var<float> x(Tensor<float>::zeros({2, 3}));
  CHECK_THAT(remat::test::error_message([&] { sum(x, 2); }),
             Catch::Contains("axis 2") && Catch::Contains("(2, 3)"));
  CHECK_THROWS_AS(mean(x, -3), IndexError);
  CHECK_THROWS_AS(mean(Var<float>(Tensor<float>::zeros({0}))), ShapeError);
}
