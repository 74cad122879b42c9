#include "support/gradcheck.hpp"

namespace {

using remat::QuantizedWeight;
using remat::Tensor;
using remat::Var;
using remat::WeightStorage;

const WeightStorage kQuantizedStorages[] = {WeightStorage::bf16, WeightStorage::int8,
                                            WeightStorage::nf4};

std::shared_ptr<const QuantizedWeight> random_quantized(std::int64_t out, std::int64_t in,
                                                        WeightStorage s, std::uint64_t seed,
                                                        bool dq = true, double stddev = 1.0) {
  remat::Rng rng(seed);
  return std::make_shared<const QuantizedWeight>(
      QuantizedWeight::quantize(rng.normal_tensor<float>({out, in}, 0.0, stddev), s, dq));
}

}  // namespace

TEST_CASE("quantized linear equals a float linear on the dequantized weight", "[ops][quantized]") {
  remat::Rng rng(21);
  for (int trial = 0; trial < 12; ++trial) {
    // Some weights wider than a panel (kQuantizedPanel values), so several panels run.
    const std::int64_t rows = 1 + rng.uniform_int(20),
                       in = 1 + rng.uniform_int(trial % 3 == 0 ? 600 : 130);
    const std::int64_t out = 1 + (trial % 3 == 0 ? 250 : 0) + rng.uniform_int(90);
    const WeightStorage s = kQuantizedStorages[trial % 3];
    INFO(remat::to_string(s) << " x (" << rows << ", " << in << ") weight (" << out << ", " << in
                             << ")");
    const auto w = random_quantized(out, in, s, std::uint64_t(trial), trial % 2 == 0);
    const Tensor<float> x = rng.normal_tensor<float>({rows, in});
    const Tensor<float> b = rng.normal_tensor<float>({out});
    const Tensor<float> got = remat::linear(Var<float>(x), w, Var<float>(b)).value();
    const Tensor<float> want =
        remat::linear(Var<float>(x), Var<float>(w->dequantize()), Var<float>(b)).value();
    float scale = 0, diff = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      scale = std::max(scale, std::fabs(want[i]));
      diff = std::max(diff, std::fabs(got[i] - want[i]));
    }
    CHECK(diff <= 1e-5f * std::max(scale, 1.0f) * std::sqrt(float(in)));
    const Tensor<float> nobias = remat::linear(Var<float>(x), w).value();
    for (std::int64_t i = 0; i < nobias.numel(); ++i)
      CHECK(nobias[i] + b[i % out] == Approx(got[i]).margin(1e-4));
  }
}

TEST_CASE("quantized linear: input and bias gradients by finite differences",
          "[ops][quantized][gradcheck]") {
  for (WeightStorage s : kQuantizedStorages) {
    // A weight of more than kQuantizedPanel values: two panels (655 and 45 rows). Small values,
    // so that the 1,400 outputs' rounding stays below the differences' tolerance.
    const auto w = random_quantized(700, 200, s, 3, true, 0.01);
    remat::test::gradcheck([&](const auto& v) { return remat::linear(v[0], w, v[1]); },
                           {remat::test::randn({2, 200}, 1), remat::test::randn({700}, 2)});
    const auto small = random_quantized(5, 9, s, 4, false);
    remat::test::gradcheck([&](const auto& v) { return remat::linear(v[0], small); },
                           {remat::test::randn({2, 3, 9}, 5)});
  }
}

TEST_CASE("quantized linear: gradients are equal with and without checkpointing",
          "[ops][quantized][checkpoint]") {
  remat::Rng rng(8);
  for (WeightStorage s : kQuantizedStorages) {
    const auto w1 = random_quantized(48, 33, s, 9), w2 = random_quantized(33, 48, s, 10);
    remat::Parameter<float> b1(rng.normal_tensor<float>({48})), b2(rng.normal_tensor<float>({33}));
    const Tensor<float> x = rng.normal_tensor<float>({6, 33});
    const auto block = [&](const Var<float>& h) {
      return remat::tanh(remat::linear(remat::tanh(remat::linear(h, w1, b1)), w2, b2));
    };
    std::vector<std::vector<float>> grads[2];
    for (int mode = 0; mode < 2; ++mode) {
      b1.zero_grad();
      b2.zero_grad();
      remat::Tape tape;
      Var<float> in = tape.input(x, true);
      Var<float> y = mode == 1 ? remat::checkpoint(block, in) : block(in);
      tape.backward(remat::sum(y * y));
      grads[mode] = {in.grad().to_vector(), b1.grad().to_vector(), b2.grad().to_vector()};
    }
    CHECK(grads[0] == grads[1]);
  }
}

TEST_CASE("quantized linear rejects inputs and biases that do not fit",
          "[ops][quantized][errors]") {
  const auto w = random_quantized(4, 5, WeightStorage::nf4, 1);
  const Var<float> x(Tensor<float>::zeros({2, 3}));
  CHECK_THAT(remat::test::error_message([&] { remat::linear(x, w); }),
             Catch::Contains("quantized_linear") && Catch::Contains("(2, 3)") &&
                 Catch::Contains("(4, 5)") && Catch::Contains("nf4"));
  CHECK_THROWS_AS(remat::linear(Var<float>(Tensor<float>::zeros({2, 5})), w,
                                Var<float>(Tensor<float>::zeros({3}))),
                  remat::ShapeError);
  CHECK_THROWS_AS(remat::linear(x, std::shared_ptr<const QuantizedWeight>()), remat::ArgumentError);
}
