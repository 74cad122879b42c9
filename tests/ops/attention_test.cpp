#include "support/gradcheck.hpp"

#include <cmath>

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

namespace {

// The same attention written with separate ops, one head at a time: the reference.
template <class T>
Var<T> composed_attention(const Var<T>& qkv, std::int64_t heads) {
  const std::int64_t c = qkv.dim(2) / 3, d = c / heads;
  std::vector<Var<T>> outputs;
  for (std::int64_t h = 0; h < heads; ++h) {
    const Var<T> q = slice(qkv, h * d, (h + 1) * d);
    const Var<T> k = slice(qkv, c + h * d, c + (h + 1) * d);
    const Var<T> v = slice(qkv, 2 * c + h * d, 2 * c + (h + 1) * d);
    const Var<T> p = softmax(causal_mask(matmul(q, transpose(k)) * T(1 / std::sqrt(double(d)))));
    outputs.push_back(matmul(p, v));
  }
  return concat(outputs);
}

}  // namespace

TEMPLATE_TEST_CASE("causal_self_attention equals attention composed from ops", "[ops][attention]",
                   float, double) {
  using T = TestType;
  Rng rng(1);
  const Var<T> qkv(rng.normal_tensor<T>({2, 5, 12}));
  const Tensor<T> fused = causal_self_attention(qkv, 2).value();
  const Tensor<T> composed = composed_attention(qkv, 2).value();
  REQUIRE(fused.shape() == Shape{2, 5, 4});
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (std::int64_t i = 0; i < fused.numel(); ++i) CHECK(std::abs(fused[i] - composed[i]) <= tol);
}

TEST_CASE("causal_self_attention: gradients, with and without dropout",
          "[ops][attention][gradcheck]") {
  gradcheck([](const auto& v) { return causal_self_attention(v[0], 2); }, {randn({2, 4, 12}, 1)});
  gradcheck([](const auto& v) { return causal_self_attention(v[0], 1); }, {randn({1, 3, 6}, 2)});
  gradcheck([](const auto& v) { return causal_self_attention(v[0], 3, 0.3); },
            {randn({2, 4, 9}, 3)});
}

TEST_CASE("causal_self_attention: the first query attends only to itself", "[ops][attention]") {
  Rng rng(4);
  const auto qkv = rng.normal_tensor<double>({1, 4, 6});
  const Tensor<double> y = causal_self_attention(Var<double>(qkv), 1).value();
  for (int j = 0; j < 2; ++j) CHECK(y[j] == Approx(qkv[4 + j]).epsilon(1e-14));  // v of position 0
}

TEST_CASE("causal_self_attention rejects bad shapes and dropout", "[ops][attention][errors]") {
  const Var<float> qkv(Tensor<float>::zeros({2, 3, 12}));
  CHECK_THAT(remat::test::error_message([&] { causal_self_attention(qkv, 3); }),
             Catch::Contains("causal_self_attention") && Catch::Contains("(2, 3, 12)") &&
                 Catch::Contains("heads = 3"));
  CHECK_THROWS_AS(causal_self_attention(Var<float>(Tensor<float>::zeros({2, 12})), 2), ShapeError);
  CHECK_THROWS_AS(causal_self_attention(qkv, 2, 1.5), ArgumentError);
}
