#include "support/gradcheck.hpp"

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("causal_mask hides later keys; softmax gives them zero weight", "[ops][mask]",
                   float, double) {
  using T = TestType;
  Rng rng(1);
  const Var<T> scores(rng.normal_tensor<T>({2, 3, 3}));
  const Tensor<T> p = softmax(causal_mask(scores)).value();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 3; ++j) {
        if (j > i)
          CHECK(p[(b * 3 + i) * 3 + j] == 0);
        else
          CHECK(p[(b * 3 + i) * 3 + j] > 0);
      }
  // with more keys than queries, the last query sees every key
  const Tensor<T> wide = causal_mask(Var<T>(Tensor<T>::zeros({2, 4}))).value();
  CHECK(wide.to_vector() == std::vector<T>{0, 0, 0, std::numeric_limits<T>::lowest(), 0, 0, 0, 0});
}

TEMPLATE_TEST_CASE("masked softmax weights are exactly 0 on long rows, where exp runs vectorized",
                   "[ops][mask][softmax]", float, double) {
  using T = TestType;
  Rng rng(3);
  for (const std::int64_t keys : {7, 16, 33, 64, 129}) {
    const Var<T> scores(rng.normal_tensor<T>({2, keys, keys}));
    Tape tape;
    const Var<T> x = tape.input(scores.value().clone(), true);
    const Var<T> p = softmax(causal_mask(x));
    tape.backward(sum(p * Var<T>(rng.normal_tensor<T>(p.shape()))));
    const Tensor<T>& pv = p.value();
    const Tensor<T> g = x.grad();
    std::int64_t hidden = 0;
    for (std::int64_t r = 0; r < 2 * keys; ++r) {
      double row_sum = 0;
      for (std::int64_t j = 0; j < keys; ++j) {
        const T w = pv[r * keys + j];
        row_sum += w;
        if (j > r % keys) {
          ++hidden;
          CHECK(w == T(0));  // not a denormal like 5e-309
          CHECK(g[r * keys + j] == T(0));
        } else {
          CHECK(w > T(0));
        }
      }
      CHECK(std::abs(row_sum - 1) <= 1e-5);
    }
    CHECK(hidden == keys * (keys - 1));
  }
}

TEST_CASE("causal_mask: gradient", "[ops][mask][gradcheck]") {
  // The masked outputs are the lowest double, so the check goes through the softmax, as in use.
  gradcheck([](const auto& v) { return softmax(causal_mask(v[0])); }, {randn({2, 4, 4}, 1)});
  gradcheck([](const auto& v) { return softmax(causal_mask(v[0])); }, {randn({3, 5}, 2)});
  // and directly: gradients pass through visible scores and stop at hidden ones
  Tape tape;
  auto x = tape.input(Tensor<double>::zeros({2, 2}), true);
  tape.backward(causal_mask(x), Tensor<double>::from({2, 2}, {1, 2, 3, 4}));
  CHECK(x.grad().to_vector() == std::vector<double>{1, 0, 3, 4});
}

TEST_CASE("causal_mask rejects scores with fewer keys than queries", "[ops][mask][errors]") {
  CHECK_THAT(remat::test::error_message([] {
               causal_mask(Var<float>(Tensor<float>::zeros({3, 2})));
             }),
             Catch::Contains("causal_mask") && Catch::Contains("(3, 2)"));
}
