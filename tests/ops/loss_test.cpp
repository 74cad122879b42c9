#include "support/gradcheck.hpp"

#include <cmath>

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

TEMPLATE_TEST_CASE("cross_entropy is the mean negative log-likelihood", "[ops][loss]", float, double) {
  using T = TestType;
  const Var<T> logits(Tensor<T>::from({2, 3}, {1, 2, 3, 0, 0, 0}));
  const auto targets = Tensor<std::int32_t>::from({2}, {2, 1});
  const double want = ((std::log(std::exp(1.) + std::exp(2.) + std::exp(3.)) - 3) + std::log(3.)) / 2;
  CHECK(cross_entropy(logits, targets).item() == Approx(want).epsilon(std::is_same_v<T, float> ? 1e-6 : 1e-14));
  // (B, T, C) logits with (B, T) targets
  const Var<T> seq(Tensor<T>::zeros({2, 2, 4}));
  CHECK(cross_entropy(seq, Tensor<std::int32_t>::from({2, 2}, {0, 1, 2, 3})).item() ==
        Approx(std::log(4.)).epsilon(1e-6));
}

TEST_CASE("cross_entropy: gradient", "[ops][loss][gradcheck]") {
  const auto t = Tensor<std::int32_t>::from({4}, {0, 3, 3, 1});
  gradcheck([t](const auto& v) { return cross_entropy(v[0], t); }, {randn({4, 5}, 1)});
  const auto t3 = Tensor<std::int32_t>::from({2, 3}, {0, 1, 2, 2, 1, 0});
  gradcheck([t3](const auto& v) { return cross_entropy(v[0] * 3.0, t3); }, {randn({2, 3, 3}, 2)});
}

TEST_CASE("cross_entropy rejects bad targets, naming value and position", "[ops][loss][errors]") {
  const Var<float> logits(Tensor<float>::zeros({3, 4}));
  CHECK_THAT(remat::test::error_message([&] { cross_entropy(logits, Tensor<std::int32_t>::from({3}, {0, 1, 4})); }),
             Catch::Contains("cross_entropy") && Catch::Contains("target 4 at position 2") && Catch::Contains("[0, 4)"));
  CHECK_THROWS_AS(cross_entropy(logits, Tensor<std::int32_t>::from({3}, {0, -1, 2})), IndexError);
  CHECK_THROWS_AS(cross_entropy(logits, Tensor<std::int32_t>::from({2}, {0, 1})), ShapeError);
}

TEST_CASE("linear_cross_entropy equals cross_entropy of linear, value and gradients", "[ops][loss]") {
  Rng rng(5);
  const auto h = rng.normal_tensor<double>({37, 8});
  const auto w = rng.normal_tensor<double>({11, 8});
  const auto t = remat::test::ids({37}, 11, 6);
  for (std::int64_t chunk : {0, 1, 5, 37, 100}) {
    Tape a, b;
    auto ha = a.input(h.clone(), true), wa = a.input(w.clone(), true);
    auto hb = b.input(h.clone(), true), wb = b.input(w.clone(), true);
    const Var<double> chunked = linear_cross_entropy(ha, wa, t, chunk);
    const Var<double> plain = cross_entropy(linear(hb, wb), t);
    a.backward(chunked);
    b.backward(plain);
    INFO("chunk " << chunk);
    CHECK(std::abs(chunked.item() - plain.item()) <= 1e-5 * std::abs(plain.item()));
    for (std::int64_t i = 0; i < h.numel(); ++i) CHECK(std::abs(ha.grad()[i] - hb.grad()[i]) <= 1e-5 * (1e-3 + std::abs(hb.grad()[i])));
    for (std::int64_t i = 0; i < w.numel(); ++i) CHECK(std::abs(wa.grad()[i] - wb.grad()[i]) <= 1e-5 * (1e-3 + std::abs(wb.grad()[i])));
  }
}

TEST_CASE("linear_cross_entropy: gradients", "[ops][loss][gradcheck]") {
  const auto t = Tensor<std::int32_t>::from({5}, {0, 3, 3, 1, 2});
  gradcheck([t](const auto& v) { return linear_cross_entropy(v[0], v[1], t, 2); }, {randn({5, 3}, 7), randn({4, 3}, 8)});
}

TEST_CASE("linear_cross_entropy never holds the logits: 10x less memory than the plain path", "[ops][loss][memory]") {
  // 2 x 1024 tokens, vocabulary 32,000, width 256, in double as the issue asks
  const std::int64_t n = 2 * 1024, v = 32000, c = 256;
  Rng rng(9);
  const auto h = rng.normal_tensor<double>({n, c}, 0.0, 0.1);
  const auto w = rng.normal_tensor<double>({v, c}, 0.0, 0.02);
  const auto t = remat::test::ids({n}, static_cast<std::int32_t>(v), 10);
  const auto peak_of = [&](bool chunked, double* loss, Tensor<double>* gh) {
    Tape tape;
    auto hv = tape.input(h, true);
    Parameter<double> wp(w);
    memory::Probe probe;
    const Var<double> l = chunked ? linear_cross_entropy(hv, wp, t) : cross_entropy(linear(hv, wp), t);
    tape.backward(l);
    *loss = l.item();
    *gh = hv.grad();
    return probe.peak_above_start();
  };
  double loss_plain = 0, loss_chunked = 0;
  Tensor<double> g_plain, g_chunked;
  const std::size_t plain = peak_of(false, &loss_plain, &g_plain);
  const std::size_t chunked = peak_of(true, &loss_chunked, &g_chunked);
  INFO("plain peak " << plain << " bytes, chunked " << chunked);
  CHECK(plain >= 10 * chunked);
  CHECK(std::abs(loss_chunked - loss_plain) <= 1e-5 * std::abs(loss_plain));
  double diff = 0, scale = 0;  // relative to the gradient's largest entry
  for (std::int64_t i = 0; i < g_plain.numel(); ++i) {
    diff = std::max(diff, std::abs(g_chunked[i] - g_plain[i]));
    scale = std::max(scale, std::abs(g_plain[i]));
  }
  CHECK(diff <= 1e-5 * scale);
}

TEST_CASE("linear_cross_entropy rejects shapes and targets that do not fit", "[ops][loss][errors]") {
  const Var<float> h(Tensor<float>::zeros({3, 4}));
  const Var<float> w(Tensor<float>::zeros({5, 4}));
  CHECK_THAT(remat::test::error_message([&] { linear_cross_entropy(h, Var<float>(Tensor<float>::zeros({5, 3})), Tensor<std::int32_t>::zeros({3})); }),
             Catch::Contains("linear_cross_entropy") && Catch::Contains("(5, 3)"));
  CHECK_THROWS_AS(linear_cross_entropy(h, w, Tensor<std::int32_t>::from({3}, {0, 5, 1})), IndexError);
  CHECK_THROWS_AS(linear_cross_entropy(h, w, Tensor<std::int32_t>::zeros({2})), ShapeError);
}
