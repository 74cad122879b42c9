#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("layout ops move elements as documented", "[ops][layout]", float, double) {
  using T = TestType;
  const Var<T> x(Tensor<T>::from({2, 3}, {1, 2, 3, 4, 5, 6}));
  CHECK(transpose(x).shape() == Shape{3, 2});
  CHECK(transpose(x).value().to_vector() == std::vector<T>{1, 4, 2, 5, 3, 6});
  CHECK(reshape(x, {3, -1}).shape() == Shape{3, 2});
  CHECK(reshape(x, {6}).value().to_vector() == std::vector<T>{1, 2, 3, 4, 5, 6});
  CHECK(slice(x, 1, 3).value().to_vector() == std::vector<T>{2, 3, 5, 6});
  const auto parts = split(x, std::vector<std::int64_t>{1, 2});
  REQUIRE(parts.size() == 2);
  CHECK(parts[0].value().to_vector() == std::vector<T>{1, 4});
  CHECK(concat(std::vector<Var<T>>{parts[1], parts[0]}).value().to_vector() ==
        std::vector<T>{2, 3, 1, 5, 6, 4});
}

TEST_CASE("layout ops: gradients", "[ops][layout][gradcheck]") {
  gradcheck([](const auto& v) { return reshape(v[0], {4, -1}); }, {randn({2, 3, 2}, 1)});
  gradcheck([](const auto& v) { return transpose(v[0]); }, {randn({3, 4}, 2)});
  gradcheck([](const auto& v) { return transpose(v[0]); }, {randn({2, 3, 4}, 3)});
  gradcheck([](const auto& v) { return slice(v[0], 1, 3); }, {randn({2, 3, 4}, 4)});
  // every part of a split used, each differently, so each slice's gradient lands in its place
  gradcheck(
      [](const auto& v) {
        const auto p = split(v[0], 3);
        return concat(std::vector<Var<double>>{tanh(p[2]), p[0] * 2.0, exp(p[1])});
      },
      {randn({2, 6}, 5)});
  gradcheck(
      [](const auto& v) {
        return concat(std::vector<Var<double>>{v[0], v[1], v[0]});
      },
      {randn({2, 2, 3}, 6), randn({2, 2, 1}, 7)});
}

TEST_CASE("layout ops reject bad shapes and ranges", "[ops][layout][errors]") {
  const Var<float> x(Tensor<float>::zeros({2, 3}));
  CHECK_THAT(remat::test::error_message([&] {
               reshape(x, {4, 2});
             }),
             Catch::Contains("reshape") && Catch::Contains("(2, 3)"));
  CHECK_THROWS_AS(reshape(x, {-1, -1}), ShapeError);
  CHECK_THROWS_AS(reshape(x, {4, -1}), ShapeError);
  CHECK_THAT(remat::test::error_message([&] { slice(x, 2, 5); }),
             Catch::Contains("slice") && Catch::Contains("[2, 5)"));
  CHECK_THROWS_AS(split(x, 2), ShapeError);
  CHECK_THROWS_AS(split(x, std::vector<std::int64_t>{1, 1}), ShapeError);
  CHECK_THROWS_AS(concat(std::vector<Var<float>>{x, Var<float>(Tensor<float>::zeros({3, 3}))}),
                  ShapeError);
  CHECK_THROWS_AS(transpose(Var<float>(Tensor<float>::zeros({3}))), ShapeError);
}
