#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("embedding picks rows by id", "[ops][embedding]", float, double) {
  using T = TestType;
  const Var<T> table(Tensor<T>::from({3, 2}, {0, 1, 10, 11, 20, 21}));
  const auto ids = Tensor<std::int32_t>::from({2, 2}, {2, 0, 2, 1});
  const Var<T> e = embedding(table, ids);
  CHECK(e.shape() == Shape{2, 2, 2});
  CHECK(e.value().to_vector() == std::vector<T>{20, 21, 0, 1, 20, 21, 10, 11});
}

TEST_CASE("embedding: gradient adds up rows picked more than once", "[ops][embedding][gradcheck]") {
  const auto ids = Tensor<std::int32_t>::from({2, 3}, {1, 3, 1, 0, 1, 3});
  gradcheck([ids](const auto& v) { return embedding(v[0], ids); }, {randn({4, 3}, 1)});
}

TEST_CASE("embedding rejects out-of-range ids, naming id and position",
          "[ops][embedding][errors]") {
  const Var<float> table(Tensor<float>::zeros({5, 2}));
  const auto bad = Tensor<std::int32_t>::from({3}, {0, 5, 1});
  CHECK_THAT(remat::test::error_message([&] { embedding(table, bad); }),
             Catch::Contains("embedding") && Catch::Contains("id 5 at position 1") &&
                 Catch::Contains("[0, 5)"));
  CHECK_THROWS_AS(embedding(table, Tensor<std::int32_t>::from({1}, {-1})), IndexError);
  CHECK_THROWS_AS(embedding(Var<float>(Tensor<float>::zeros({5})), bad), ShapeError);
}
