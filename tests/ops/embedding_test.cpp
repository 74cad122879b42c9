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

TEST_CASE("embedding: the padding row gets no gradient from the lookup, every other row its own",
          "[ops][embedding][gradcheck]") {
  // torch.nn.Embedding's padding_idx: the forward is unchanged, the backward skips that row
  const auto ids = Tensor<std::int32_t>::from({2, 3}, {1, 3, 1, 0, 1, 3});
  const Tensor<double> upstream = randn({2, 3, 3}, 3);
  const auto gradient = [&](std::int64_t padding_idx) {
    Parameter<double> table(randn({4, 3}, 1));
    {
      Tape tape;
      const Var<double> e = embedding(table, ids, padding_idx);
      if (padding_idx >= 0)
        CHECK(e.value().to_vector() == embedding(table, ids).value().to_vector());
      tape.backward(sum(e * Var<double>(upstream)));
    }
    return table.grad().to_vector();
  };
  const std::vector<double> plain = gradient(-1);
  for (std::int64_t pad = 0; pad < 4; ++pad) {
    const std::vector<double> padded = gradient(pad);
    for (std::size_t i = 0; i < plain.size(); ++i) {
      INFO("padding_idx " << pad << ", element " << i);
      CHECK(padded[i] == (static_cast<std::int64_t>(i / 3) == pad ? 0.0 : plain[i]));
    }
  }
  // a padding_idx no id picks changes nothing: the gradient check holds
  gradcheck([ids](const auto& v) { return embedding(v[0], ids, 2); }, {randn({4, 3}, 1)});
  const Var<float> table(Tensor<float>::zeros({5, 2}));
  CHECK_THAT(remat::test::error_message(
                 [&] { embedding(table, Tensor<std::int32_t>::from({1}, {0}), 5); }),
             Catch::Contains("padding_idx") && Catch::Contains("5"));
  CHECK_THROWS_AS(embedding(table, Tensor<std::int32_t>::from({1}, {0}), -2), ArgumentError);
}
