#include "support/gradcheck.hpp"

#include <cmath>

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("softmax rows sum to one; log_softmax is its log", "[ops][softmax]", float,
                   double) {
  using T = TestType;
  Rng rng(2);
  const Var<T> x(rng.normal_tensor<T>({4, 7}, 0.0, 5.0));
  const Tensor<T> p = softmax(x).value();
  const Tensor<T> lp = log_softmax(x).value();
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (std::int64_t r = 0; r < 4; ++r) {
    double s = 0;
    for (std::int64_t c = 0; c < 7; ++c) {
      s += p[r * 7 + c];
      CHECK(std::abs(std::log(double(p[r * 7 + c])) - lp[r * 7 + c]) <= tol * 10);
    }
    CHECK(std::abs(s - 1) <= tol);
  }
  // large logits do not overflow
  const Var<T> big(Tensor<T>::from({1, 3}, {T(1000), T(1001), T(1002)}));
  CHECK(std::isfinite(softmax(big).value()[2]));
  CHECK(std::isfinite(log_softmax(big).value()[0]));
}

TEST_CASE("softmax and log_softmax: gradients", "[ops][softmax][gradcheck]") {
  for (const Shape& s : {Shape{5}, Shape{3, 4}, Shape{2, 2, 3}}) {
    DYNAMIC_SECTION("shape " << s) {
      gradcheck([](const auto& v) { return softmax(v[0]); }, {randn(s, 1)});
      gradcheck([](const auto& v) { return log_softmax(v[0]); }, {randn(s, 2)});
    }
  }
}

TEST_CASE("softmax rejects an empty last axis", "[ops][softmax][errors]") {
  CHECK_THAT(remat::test::error_message([] {
               softmax(Var<float>(Tensor<float>::zeros({2, 0})));
             }),
             Catch::Contains("softmax") && Catch::Contains("(2, 0)"));
}
