#include "support/gradcheck.hpp"

#include <cmath>

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;
using remat::test::uniform;

namespace {

double gelu_erf_reference(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

double gelu_tanh_reference(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace

TEMPLATE_TEST_CASE("unary ops match their scalar definitions", "[ops][unary]", float, double) {
  using T = TestType;
  const auto x = Tensor<T>::from({5}, {T(-2), T(-0.5), T(0.25), T(1), T(3)});
  const auto pos = Tensor<T>::from({3}, {T(0.5), T(2), T(9)});
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-14;
  const auto check = [&](const Var<T>& y, const Tensor<T>& in, double (*f)(double)) {
    for (std::int64_t i = 0; i < in.numel(); ++i) {
      const double want = f(in[i]);
      CHECK(std::abs(y.value()[i] - want) <= tol * (1 + std::abs(want)));
    }
  };
  check(exp(Var<T>(x)), x, [](double v) { return std::exp(v); });
  check(tanh(Var<T>(x)), x, [](double v) { return std::tanh(v); });
  check(sigmoid(Var<T>(x)), x, [](double v) { return 1 / (1 + std::exp(-v)); });
  check(relu(Var<T>(x)), x, [](double v) { return v > 0 ? v : 0; });
  check(gelu(Var<T>(x)), x, gelu_erf_reference);
  check(gelu_tanh(Var<T>(x)), x, gelu_tanh_reference);
  check(log(Var<T>(pos)), pos, [](double v) { return std::log(v); });
  check(sqrt(Var<T>(pos)), pos, [](double v) { return std::sqrt(v); });
}

TEST_CASE("unary ops: gradients", "[ops][unary][gradcheck]") {
  for (const Shape& shape : {Shape{5}, Shape{2, 3, 4}}) {
    DYNAMIC_SECTION("shape " << shape) {
      const auto x = randn(shape, 11);
      const auto positive = uniform(shape, 0.2, 3.0, 12);
      auto away_from_zero = randn(shape, 13);  // relu has a kink at 0
      for (double& v : away_from_zero) v += v > 0 ? 0.1 : -0.1;
      gradcheck([](const auto& v) { return exp(v[0]); }, {x});
      gradcheck([](const auto& v) { return log(v[0]); }, {positive});
      gradcheck([](const auto& v) { return sqrt(v[0]); }, {positive});
      gradcheck([](const auto& v) { return tanh(v[0]); }, {x});
      gradcheck([](const auto& v) { return sigmoid(v[0]); }, {x});
      gradcheck([](const auto& v) { return relu(v[0]); }, {away_from_zero});
      gradcheck([](const auto& v) { return gelu(v[0]); }, {x});
      gradcheck([](const auto& v) { return gelu_tanh(v[0]); }, {x});
    }
  }
}
