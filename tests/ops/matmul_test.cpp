#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

namespace {

// Naive product of the matrices of a (batch, m, k) and b (batch or 1, k, n).
template <class T>
std::vector<T> naive(const Tensor<T>& a, const Tensor<T>& b, std::int64_t batch, std::int64_t m,
                     std::int64_t k, std::int64_t n, bool shared) {
  std::vector<T> c(batch * m * n, T(0));
  for (std::int64_t p = 0; p < batch; ++p)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        T s = 0;
        for (std::int64_t l = 0; l < k; ++l)
          s += a[(p * m + i) * k + l] * b[((shared ? 0 : p) * k + l) * n + j];
        c[(p * m + i) * n + j] = s;
      }
  return c;
}

}  // namespace

TEMPLATE_TEST_CASE("matmul matches a naive product", "[ops][matmul]", float, double) {
  using T = TestType;
  Rng rng(3);
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  const auto compare = [&](const Shape& sa, const Shape& sb, std::int64_t batch, bool shared) {
    const auto a = rng.normal_tensor<T>(sa);
    const auto b = rng.normal_tensor<T>(sb);
    const Var<T> c = matmul(Var<T>(a), Var<T>(b));
    const auto want = naive(a, b, batch, sa[-2], sa[-1], sb[-1], shared);
    REQUIRE(c.numel() == static_cast<std::int64_t>(want.size()));
    for (std::size_t i = 0; i < want.size(); ++i)
      CHECK(std::abs(c.value()[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  };
  compare({3, 4}, {4, 5}, 1, true);
  compare({2, 3, 4}, {2, 4, 5}, 2, false);
  compare({2, 3, 4}, {4, 5}, 2, true);
  compare({17, 33}, {33, 9}, 1, true);
}

TEST_CASE("matmul: gradients for 2-D, batched and shared-matrix products",
          "[ops][matmul][gradcheck]") {
  const auto f = [](const auto& v) { return matmul(v[0], v[1]); };
  gradcheck(f, {randn({3, 4}, 1), randn({4, 5}, 2)});
  gradcheck(f, {randn({2, 3, 4}, 3), randn({2, 4, 2}, 4)});
  gradcheck(f, {randn({2, 3, 4}, 5), randn({4, 2}, 6)});
  gradcheck(f, {randn({2, 2, 3, 2}, 7), randn({2, 2, 2, 3}, 8)});
  // the same Var on both sides
  gradcheck([](const auto& v) { return matmul(v[0], v[0]); }, {randn({3, 3}, 9)});
}

TEST_CASE("matmul rejects operands that do not multiply", "[ops][matmul][errors]") {
  const Var<float> a(Tensor<float>::zeros({2, 3}));
  const std::string msg = remat::test::error_message([&] {
    matmul(a, Var<float>(Tensor<float>::zeros({4, 5})));
  });
  CHECK_THAT(msg,
             Catch::Contains("matmul") && Catch::Contains("(2, 3)") && Catch::Contains("(4, 5)"));
  CHECK_THROWS_AS(matmul(a, Var<float>(Tensor<float>::zeros({3}))), ShapeError);
  CHECK_THROWS_AS(matmul(Var<float>(Tensor<float>::zeros({2, 2, 3})),
                         Var<float>(Tensor<float>::zeros({3, 3, 1}))),
                  ShapeError);
}
