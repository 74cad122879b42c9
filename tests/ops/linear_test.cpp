#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("linear computes x W^T + b", "[ops][linear]", float, double) {
  using T = TestType;
  const Var<T> x(Tensor<T>::from({2, 3}, {1, 2, 3, 4, 5, 6}));
  const Var<T> w(Tensor<T>::from({2, 3}, {1, 0, -1, 2, 1, 0}));
  const Var<T> b(Tensor<T>::from({2}, {10, 20}));
  CHECK(linear(x, w, b).value().to_vector() == std::vector<T>{8, 24, 8, 33});
  CHECK(linear(x, w).value().to_vector() == std::vector<T>{-2, 4, -2, 13});
}

TEST_CASE("linear: gradients with and without bias, 2-D and batched inputs",
          "[ops][linear][gradcheck]") {
  gradcheck([](const auto& v) { return linear(v[0], v[1], v[2]); },
            {randn({5, 4}, 1), randn({3, 4}, 2), randn({3}, 3)});
  gradcheck([](const auto& v) { return linear(v[0], v[1], v[2]); },
            {randn({2, 3, 4}, 4), randn({2, 4}, 5), randn({2}, 6)});
  gradcheck([](const auto& v) { return linear(v[0], v[1]); }, {randn({3, 4}, 7), randn({5, 4}, 8)});
}

TEST_CASE("linear accumulates into Parameter gradients", "[ops][linear]") {
  Parameter<double> w(randn({3, 4}, 1));
  Parameter<double> b(randn({3}, 2));
  const auto x = randn({5, 4}, 3);
  Tape tape;
  auto loss = sum(linear(tape.input(x), w, b));
  tape.backward(loss);
  // d sum(x W^T + b) / dW[o][i] = sum over rows of x[r][i]; / db[o] = rows
  for (std::int64_t o = 0; o < 3; ++o) {
    CHECK(b.grad()[o] == 5.0);
    for (std::int64_t i = 0; i < 4; ++i) {
      double s = 0;
      for (std::int64_t r = 0; r < 5; ++r) s += x[r * 4 + i];
      CHECK(w.grad()[o * 4 + i] == Approx(s).epsilon(1e-12));
    }
  }
}

TEST_CASE("linear rejects weights and biases that do not fit", "[ops][linear][errors]") {
  const Var<float> x(Tensor<float>::zeros({2, 3}));
  const std::string msg = remat::test::error_message([&] {
    linear(x, Var<float>(Tensor<float>::zeros({4, 5})));
  });
  CHECK_THAT(msg,
             Catch::Contains("linear") && Catch::Contains("(2, 3)") && Catch::Contains("(4, 5)"));
  CHECK_THROWS_AS(
      linear(x, Var<float>(Tensor<float>::zeros({4, 3})), Var<float>(Tensor<float>::zeros({3}))),
      ShapeError);
}
