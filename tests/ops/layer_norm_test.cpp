#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("layer_norm normalizes each row, then scales and shifts", "[ops][layer_norm]",
                   float, double) {
  using T = TestType;
  Rng rng(5);
  const Var<T> x(rng.normal_tensor<T>({3, 8}, 2.0, 3.0));
  const Var<T> ones(Tensor<T>::ones({8})), zeros(Tensor<T>::zeros({8}));
  const Tensor<T> y = layer_norm(x, ones, zeros).value();
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  for (std::int64_t r = 0; r < 3; ++r) {
    double m = 0, v = 0, mx = 0, vx = 0;
    for (std::int64_t c = 0; c < 8; ++c) m += y[r * 8 + c] / 8.0;
    for (std::int64_t c = 0; c < 8; ++c) v += (y[r * 8 + c] - m) * (y[r * 8 + c] - m) / 8.0;
    for (std::int64_t c = 0; c < 8; ++c) mx += double(x.value()[r * 8 + c]) / 8.0;
    for (std::int64_t c = 0; c < 8; ++c)
      vx += (x.value()[r * 8 + c] - mx) * (x.value()[r * 8 + c] - mx) / 8.0;
    CHECK(std::abs(m) <= tol);
    // the 1e-5 inside the square root makes the variance var / (var + 1e-5), not 1
    CHECK(std::abs(v - vx / (vx + 1e-5)) <= tol);
  }
  const Tensor<T> z =
      layer_norm(x, Var<T>(Tensor<T>::full({8}, T(2))), Var<T>(Tensor<T>::full({8}, T(1)))).value();
  for (std::int64_t i = 0; i < 24; ++i) CHECK(std::abs(z[i] - (2 * y[i] + 1)) <= 10 * tol);
}

TEST_CASE("layer_norm: gradients for input, gamma and beta", "[ops][layer_norm][gradcheck]") {
  const auto f = [](const auto& v) { return layer_norm(v[0], v[1], v[2]); };
  gradcheck(f, {randn({3, 5}, 1), randn({5}, 2), randn({5}, 3)});
  gradcheck(f, {randn({2, 2, 4}, 4), randn({4}, 5), randn({4}, 6)});
}

TEST_CASE("layer_norm rejects parameters that do not fit", "[ops][layer_norm][errors]") {
  const Var<float> x(Tensor<float>::zeros({2, 4}));
  const Var<float> g(Tensor<float>::ones({3}));
  CHECK_THAT(remat::test::error_message([&] { layer_norm(x, g, g); }),
             Catch::Contains("layer_norm") && Catch::Contains("(2, 4)") && Catch::Contains("(3,)"));
}
