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

// The op with panels of `panel_rows` of W's rows: small weights then run several panels, as a
// large one does with the default (detail::quantized_panel_rows, 2^21 values), and the panel's
// last rows may fall short of a whole panel.
template <class T>
Var<T> linear_in_panels(const Var<T>& x, const std::shared_ptr<const QuantizedWeight>& w,
                        const std::type_identity_t<Var<T>>* bias, std::int64_t panel_rows) {
  using Node = remat::detail::QuantizedLinearNode<T>;
  const remat::Shape y = x.shape().with_last(w->rows());
  if (bias)
    return remat::detail::record_op<Node>({&x, bias}, w, x.shape().rows(), true, y, panel_rows);
  return remat::detail::record_op<Node>({&x}, w, x.shape().rows(), false, y, panel_rows);
}

}  // namespace

TEST_CASE("quantized linear equals a float linear on the dequantized weight", "[ops][quantized]") {
  remat::Rng rng(21);
  for (int trial = 0; trial < 12; ++trial) {
    const std::int64_t rows = 1 + rng.uniform_int(20),
                       in = 1 + rng.uniform_int(trial % 3 == 0 ? 600 : 130);
    const std::int64_t out = 1 + (trial % 3 == 0 ? 250 : 0) + rng.uniform_int(90);
    const std::int64_t panel = 1 + rng.uniform_int(trial % 2 ? out : 8);  // several panels
    const WeightStorage s = kQuantizedStorages[trial % 3];
    INFO(remat::to_string(s) << " x (" << rows << ", " << in << ") weight (" << out << ", " << in
                             << ") panels of " << panel << " rows");
    const auto w = random_quantized(out, in, s, std::uint64_t(trial), trial % 2 == 0);
    const Tensor<float> x = rng.normal_tensor<float>({rows, in});
    const Tensor<float> b = rng.normal_tensor<float>({out});
    const Var<float> bias(b);
    const Tensor<float> want =
        remat::linear(Var<float>(x), Var<float>(w->dequantize()), bias).value();
    for (const auto& got : {linear_in_panels(Var<float>(x), w, &bias, panel).value(),
                            remat::linear(Var<float>(x), w, bias).value()}) {
      float scale = 0, diff = 0;
      for (std::int64_t i = 0; i < want.numel(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        diff = std::max(diff, std::fabs(got[i] - want[i]));
      }
      CHECK(diff <= 1e-5f * std::max(scale, 1.0f) * std::sqrt(float(in)));
    }
    const Tensor<float> got = linear_in_panels(Var<float>(x), w, &bias, panel).value();
    const Tensor<float> nobias = linear_in_panels(Var<float>(x), w, nullptr, panel).value();
    for (std::int64_t i = 0; i < nobias.numel(); ++i)
      CHECK(nobias[i] + b[i % out] == Approx(got[i]).margin(1e-4));
  }
}

TEST_CASE("quantized linear: input and bias gradients by finite differences",
          "[ops][quantized][gradcheck]") {
  for (WeightStorage s : kQuantizedStorages) {
    // Panels of 1, 3 (the last one short) and all 70 rows; small values, so that the outputs'
    // rounding stays below the differences' tolerance.
    const auto w = random_quantized(70, 20, s, 3, true, 0.01);
    for (const std::int64_t panel : {1, 3, 70}) {
      remat::test::gradcheck([&](const auto& v) { return linear_in_panels(v[0], w, &v[1], panel); },
                             {remat::test::randn({2, 20}, 1), remat::test::randn({70}, 2)});
    }
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
    const auto block = [&](const Var<float>& h) {  // w1 in panels of 5 rows, w2 whole
      const Var<float> bias1 = b1;
      return remat::tanh(remat::linear(remat::tanh(linear_in_panels(h, w1, &bias1, 5)), w2, b2));
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

// Under Precision::bf16 a frozen weight feeds gemm_bf16's tile kernels through Bf16Rows, its rows
// made in bfloat16 from their storage: the same bits as gemm_bf16 on the dequantized float
// weight (the same rounded values, packed the same way), with no float panel counted (the
// forward's peak is the output, nothing else: with the weight frozen the op saves nothing of
// its input, whose shape is all its backward needs). The convert kernel
// keeps the float panels (counted; products summed by the float GEMM in panel-sized pieces, so
// equal to float rounding, not to the bit).
TEST_CASE("quantized linear in BF16: the weight's rows feed gemm_bf16 without a float panel",
          "[ops][quantized][bf16]") {
  remat::Rng rng(33);
  for (const auto kernel :
       {remat::Bf16Kernel::convert, remat::Bf16Kernel::avx512_bf16, remat::Bf16Kernel::amx}) {
    if (kernel > remat::supported_bf16_kernel()) continue;
    remat::set_bf16_kernel(kernel);
    for (int trial = 0; trial < 6; ++trial) {
      const std::int64_t rows = 1 + rng.uniform_int(40), in = 1 + rng.uniform_int(300);
      const std::int64_t out = 1 + rng.uniform_int(trial % 2 ? 700 : 90);
      const WeightStorage s = kQuantizedStorages[trial % 3];
      INFO(remat::to_string(kernel) << " " << remat::to_string(s) << " x (" << rows << ", " << in
                                    << ") weight (" << out << ", " << in << ")");
      const auto w = random_quantized(out, in, s, std::uint64_t(40 + trial), trial % 2 == 0);
      const Tensor<float> deq = w->dequantize();
      const Tensor<float> x = rng.normal_tensor<float>({rows, in});
      const Tensor<float> b = rng.normal_tensor<float>({out});
      const Tensor<float> gy = rng.normal_tensor<float>({rows, out});

      const remat::PrecisionGuard bf16(remat::Precision::bf16);
      remat::Tape tape;
      Var<float> xv = tape.input(x, true);
      const Var<float> bv = tape.input(b, false);
      const remat::memory::Probe probe;
      const Var<float> y = remat::linear(xv, w, bv);
      const bool panels = kernel == remat::Bf16Kernel::convert;
      const std::size_t panel_bytes =
          panels ? std::size_t(remat::detail::quantized_panel_rows(in, out) * in) * 4 : 0;
      CHECK(probe.peak_above_start() == y.value().bytes() + panel_bytes);
      tape.backward(y, gy);

      Tensor<float> want_y({rows, out});
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t o = 0; o < out; ++o) want_y[r * out + o] = b[o];
      remat::gemm_bf16(false, true, rows, out, in, 1.0f, x.data(), in, deq.data(), in, 1.0f,
                       want_y.data(), out);
      Tensor<float> want_gx({rows, in});
      remat::gemm_bf16(false, false, rows, in, out, 1.0f, gy.data(), out, deq.data(), in, 0.0f,
                       want_gx.data(), in);
      if (!panels) {
        CHECK(y.value().to_vector() == want_y.to_vector());
        CHECK(xv.grad().to_vector() == want_gx.to_vector());
      } else {
        const auto close = [&](const Tensor<float>& got, const Tensor<float>& want,
                               std::int64_t terms) {
          float scale = 1, diff = 0;
          for (std::int64_t i = 0; i < want.numel(); ++i) {
            scale = std::max(scale, std::fabs(want[i]));
            diff = std::max(diff, std::fabs(got[i] - want[i]));
          }
          return diff <= 1e-5f * scale * std::sqrt(float(terms));
        };
        CHECK(close(y.value(), want_y, in));
        CHECK(close(xv.grad(), want_gx, out));
      }
    }
  }
  remat::set_bf16_kernel(remat::supported_bf16_kernel());
}

TEST_CASE("gemm_bf16 from rows refuses rows that do not fit B", "[ops][bf16][errors]") {
  const remat::Bf16Rows rows{3, 4, [](std::int64_t, std::int64_t, std::uint16_t*) {}};
  float a[8] = {}, c[8] = {};
  CHECK_THROWS_AS(remat::gemm_bf16(false, true, 2, 3, 5, 1.0f, a, 5, rows, 0.0f, c, 3),
                  remat::ShapeError);
  CHECK_THROWS_WITH(remat::gemm_bf16(false, false, 2, 4, 3, 1.0f, a, 3,
                                     remat::Bf16Rows{3, 4, nullptr}, 0.0f, c, 4),
                    Catch::Contains("gemm_bf16") && Catch::Contains("row maker"));
}
