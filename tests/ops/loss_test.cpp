#include "support/gradcheck.hpp"

#include <cmath>
#include <limits>

using namespace remat;
using remat::test::gradcheck;
using remat::test::randn;

namespace {

/// How far the chunked and the plain cross-entropy of linear(h, w) may differ in double.
/// The two compute the same sums in different orders (a chunk's GEMM against the whole one, the
/// mean over chunks against one mean), so they differ by rounding only. Every result goes
/// through at most a dot product of length c, a sum of v exponentials and a mean of n rows, so
/// gamma = (c + v + n) eps bounds the relative error of each such chain (Higham, "Accuracy and
/// Stability of Numerical Algorithms", 3.1). With M = max |logit| + log v, bounding every row's
/// log-sum-exp and loss (|logit| <= max ||h_i|| max ||w_j|| by Cauchy-Schwarz), each path's loss
/// is within gamma (M + 1) of the exact one and its probabilities within a relative 2 gamma (M +
/// 1). A gradient element sums (p - y) w / n over the vocabulary (or (p - y) h / n over the rows),
/// so it is within 2 gamma (M + 2) sum_j |w_jk| / n (or sum_i |h_ik| / n); twice that for two
/// paths.
struct RoundingBounds {
  double loss = 0;
  std::vector<double> h_grad, w_grad;  // per column k
};

RoundingBounds rounding_bounds(const Tensor<double>& h, const Tensor<double>& w) {
  const std::int64_t n = h.dim(0), v = w.dim(0), c = h.dim(1);
  const double gamma = static_cast<double>(c + v + n) * std::numeric_limits<double>::epsilon();
  const auto max_row_norm = [c](const Tensor<double>& t) {
    double best = 0;
    for (std::int64_t i = 0; i < t.dim(0); ++i) {
      double s = 0;
      for (std::int64_t k = 0; k < c; ++k) s += t[i * c + k] * t[i * c + k];
      best = std::max(best, std::sqrt(s));
    }
    return best;
  };
  const double big_m = max_row_norm(h) * max_row_norm(w) + std::log(static_cast<double>(v));
  RoundingBounds b;
  b.loss = 2 * gamma * (big_m + 1);
  b.h_grad.assign(static_cast<std::size_t>(c), 0.0);
  b.w_grad.assign(static_cast<std::size_t>(c), 0.0);
  const double per = 4 * gamma * (big_m + 2) / static_cast<double>(n);
  for (std::int64_t k = 0; k < c; ++k) {
    for (std::int64_t j = 0; j < v; ++j)
      b.h_grad[static_cast<std::size_t>(k)] += per * std::abs(w[j * c + k]);
    for (std::int64_t i = 0; i < n; ++i)
      b.w_grad[static_cast<std::size_t>(k)] += per * std::abs(h[i * c + k]);
  }
  return b;
}

}  // namespace

TEMPLATE_TEST_CASE("cross_entropy is the mean negative log-likelihood", "[ops][loss]", float,
                   double) {
  using T = TestType;
  const Var<T> logits(Tensor<T>::from({2, 3}, {1, 2, 3, 0, 0, 0}));
  const auto targets = Tensor<std::int32_t>::from({2}, {2, 1});
  const double want =
      ((std::log(std::exp(1.) + std::exp(2.) + std::exp(3.)) - 3) + std::log(3.)) / 2;
  CHECK(cross_entropy(logits, targets).item() ==
        Approx(want).epsilon(std::is_same_v<T, float> ? 1e-6 : 1e-14));
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
  CHECK_THAT(remat::test::error_message([&] {
               cross_entropy(logits, Tensor<std::int32_t>::from({3}, {0, 1, 4}));
             }),
             Catch::Contains("cross_entropy") && Catch::Contains("target 4 at position 2") &&
                 Catch::Contains("[0, 4)"));
  CHECK_THROWS_AS(cross_entropy(logits, Tensor<std::int32_t>::from({3}, {0, -1, 2})), IndexError);
  CHECK_THROWS_AS(cross_entropy(logits, Tensor<std::int32_t>::from({2}, {0, 1})), ShapeError);
}

TEST_CASE("linear_cross_entropy equals cross_entropy of linear, value and gradients",
          "[ops][loss]") {
  Rng rng(5);
  const std::int64_t n = 37, v = 11, c = 8;
  const auto h = rng.normal_tensor<double>({n, c});
  const auto w = rng.normal_tensor<double>({v, c});
  const auto t = remat::test::ids({n}, static_cast<std::int32_t>(v), 6);
  const RoundingBounds bound = rounding_bounds(h, w);
  for (std::int64_t chunk : {0, 1, 5, 37, 100}) {
    Tape a, b;
    auto ha = a.input(h.clone(), true), wa = a.input(w.clone(), true);
    auto hb = b.input(h.clone(), true), wb = b.input(w.clone(), true);
    const Var<double> chunked = linear_cross_entropy(ha, wa, t, chunk);
    const Var<double> plain = cross_entropy(linear(hb, wb), t);
    a.backward(chunked);
    b.backward(plain);
    INFO("chunk " << chunk << ", loss bound " << bound.loss);
    CHECK(std::abs(chunked.item() - plain.item()) <= bound.loss);
    for (std::int64_t i = 0; i < h.numel(); ++i)
      CHECK(std::abs(ha.grad()[i] - hb.grad()[i]) <= bound.h_grad[static_cast<std::size_t>(i % c)]);
    for (std::int64_t i = 0; i < w.numel(); ++i)
      CHECK(std::abs(wa.grad()[i] - wb.grad()[i]) <= bound.w_grad[static_cast<std::size_t>(i % c)]);
  }
}

TEST_CASE("linear_cross_entropy: gradients", "[ops][loss][gradcheck]") {
  const auto t = Tensor<std::int32_t>::from({5}, {0, 3, 3, 1, 2});
  gradcheck([t](const auto& v) { return linear_cross_entropy(v[0], v[1], t, 2); },
            {randn({5, 3}, 7), randn({4, 3}, 8)});
}

// Note [fused loss head]: with a frozen weight, forward computes h's gradient for a unit dloss
// and backward scales it by the dloss it is given. The same bounds hold, times that dloss, plus
// the one rounding of the scaling (eps of each gradient element).
TEST_CASE("linear_cross_entropy on a frozen weight: value and gradient under any upstream scale",
          "[ops][loss]") {
  Rng rng(31);
  for (int trial = 0; trial < 12; ++trial) {
    const std::int64_t n = 1 + rng.uniform_int(40), v = 2 + rng.uniform_int(30),
                       c = 1 + rng.uniform_int(9);
    const auto h = rng.normal_tensor<double>({n, c});
    const auto w = rng.normal_tensor<double>({v, c});
    auto t = remat::test::ids({n}, static_cast<std::int32_t>(v), trial + 40);
    for (std::int64_t r = 0; r < n; ++r)
      if (rng.uniform_int(4) == 0) t[r] = kIgnoreTarget;
    const double scale = rng.uniform(-3, 3);
    const std::int64_t chunk = rng.uniform_int(n + 2);  // 0: the default
    const RoundingBounds bound = rounding_bounds(h, w);
    Tape a, b;
    auto ha = a.input(h.clone(), true), hb = b.input(h.clone(), true);
    const Var<double> frozen(w.clone());
    const Var<double> fused = linear_cross_entropy(ha, frozen, t, chunk);
    const Var<double> plain = cross_entropy(linear(hb, Var<double>(w.clone())), t);
    a.backward(fused * scale);
    b.backward(plain * scale);
    INFO(n << " rows, vocabulary " << v << ", width " << c << ", chunk " << chunk << ", scale "
           << scale);
    CHECK(std::abs(fused.item() - plain.item()) <= bound.loss);
    for (std::int64_t i = 0; i < h.numel(); ++i) {
      const double slack = std::abs(scale) * bound.h_grad[static_cast<std::size_t>(i % c)] +
                           std::numeric_limits<double>::epsilon() * std::abs(ha.grad()[i]);
      CHECK(std::abs(ha.grad()[i] - hb.grad()[i]) <= slack);
      if (t[i / c] == kIgnoreTarget) CHECK(ha.grad()[i] == 0.0);
    }
  }
}

// Note [online loss head]: past 2,048 tokens the vocabulary is folded block by block, each
// row's sums rescaled when a later block raises its max. Generated heads whose rows grow with
// the token (the max in the last block: a rescale every block), shrink (the max in the first:
// none) or neither, frozen and trained, against the plain path within the bounds above (one
// rounding more a block is far inside the v eps they allow).
TEST_CASE("linear_cross_entropy over several vocabulary blocks equals the plain path",
          "[ops][loss]") {
  Rng rng(47);
  for (int trial = 0; trial < 9; ++trial) {
    const std::int64_t n = 3 + rng.uniform_int(10), v = 2049 + rng.uniform_int(4000),
                       c = 1 + rng.uniform_int(6);
    REQUIRE(remat::detail::loss_vocab_block(v, c) == 2048);
    const auto h = rng.normal_tensor<double>({n, c});
    auto w = rng.normal_tensor<double>({v, c});
    const double growth = trial % 3 == 0 ? 4.0 : trial % 3 == 1 ? -4.0 : 0.0;
    for (std::int64_t j = 0; j < v; ++j) {
      const double along = static_cast<double>(j) / static_cast<double>(v - 1);
      for (std::int64_t k = 0; k < c; ++k)
        w[j * c + k] *= std::exp(growth * (growth > 0 ? along : along - 1));
    }
    auto t = remat::test::ids({n}, static_cast<std::int32_t>(v), trial + 70);
    // targets at the blocks' edges, where a wrong bound would read the next block's logit
    const std::int32_t edges[] = {0, 2047, 2048, static_cast<std::int32_t>(v - 1)};
    for (std::int64_t r = 0; r < n; ++r) {
      if (r % 2 == 0)
        t[r] = edges[(r / 2 + trial) % 4];
      else if (rng.uniform_int(3) == 0)
        t[r] = kIgnoreTarget;
    }
    const std::int64_t chunk = rng.uniform_int(n + 2);  // 0: the default
    const bool trained = trial % 2 == 0;
    const RoundingBounds bound = rounding_bounds(h, w);
    Tape a, b;
    auto ha = a.input(h.clone(), true), hb = b.input(h.clone(), true);
    auto wa = a.input(w.clone(), trained), wb = b.input(w.clone(), trained);
    const Var<double> tiled = linear_cross_entropy(ha, wa, t, chunk);
    const Var<double> plain = cross_entropy(linear(hb, wb), t);
    a.backward(tiled);
    b.backward(plain);
    INFO(n << " rows, vocabulary " << v << ", width " << c << ", growth " << growth << ", chunk "
           << chunk << (trained ? ", trained" : ", frozen"));
    CHECK(std::abs(tiled.item() - plain.item()) <= bound.loss);
    for (std::int64_t i = 0; i < h.numel(); ++i) {
      const double slack = bound.h_grad[static_cast<std::size_t>(i % c)] +
                           std::numeric_limits<double>::epsilon() * std::abs(ha.grad()[i]);
      CHECK(std::abs(ha.grad()[i] - hb.grad()[i]) <= slack);
    }
    if (!trained) continue;
    for (std::int64_t i = 0; i < w.numel(); ++i)
      CHECK(std::abs(wa.grad()[i] - wb.grad()[i]) <= bound.w_grad[static_cast<std::size_t>(i % c)]);
  }
}

TEST_CASE("linear_cross_entropy over several vocabulary blocks: gradients",
          "[ops][loss][gradcheck]") {
  // 2,500 tokens: two blocks; the head grows with the token, so the second block raises the max
  Tensor<double> w = randn({2500, 2}, 16);
  for (std::int64_t i = 0; i < w.numel(); ++i)
    w[i] *= 1.0 + 3.0 * static_cast<double>(i / 2) / 2500;
  const auto t = Tensor<std::int32_t>::from({3}, {2400, kIgnoreTarget, 7});
  gradcheck([t, w](const auto& v) { return linear_cross_entropy(v[0], Var<double>(w), t, 2); },
            {randn({3, 2}, 17)});
  gradcheck([t](const auto& v) { return linear_cross_entropy(v[0], v[1], t, 0); },
            {randn({3, 2}, 18), w});
}

TEST_CASE("linear_cross_entropy on a frozen weight: gradients", "[ops][loss][gradcheck]") {
  const auto t = Tensor<std::int32_t>::from({5}, {0, kIgnoreTarget, 3, 1, 2});
  const Tensor<double> w = randn({4, 3}, 15);
  gradcheck([t, w](const auto& v) { return linear_cross_entropy(v[0], Var<double>(w), t, 2); },
            {randn({5, 3}, 14)});
  gradcheck([t, w](const auto& v) { return linear_cross_entropy(v[0], Var<double>(w), t, 0); },
            {randn({5, 3}, 16)});
}

// Inside a checkpoint segment the loss's first run saves nothing (it computes the value only)
// and its replay computes the unit gradient: the gradients equal the plain step's bit for bit.
TEST_CASE("linear_cross_entropy on a frozen weight: checkpointed gradients equal plain ones",
          "[ops][loss][checkpoint]") {
  Rng rng(12);
  const std::int64_t n = 23, v = 17, c = 6;
  const Tensor<float> x = rng.normal_tensor<float>({n, c});
  const Var<float> w(rng.normal_tensor<float>({v, c}));
  Parameter<float> scale(rng.normal_tensor<float>({c}));
  const auto t = remat::test::ids({n}, static_cast<std::int32_t>(v), 13);
  const auto head = [&](const Var<float>& h) {
    return linear_cross_entropy(remat::tanh(h) * scale, w, t, 5);
  };
  std::vector<float> grads[2], values[2];
  for (int mode = 0; mode < 2; ++mode) {
    scale.zero_grad();
    Tape tape;
    const Var<float> in = tape.input(x, true);
    const Var<float> loss = mode == 1 ? remat::checkpoint(head, in) : head(in);
    tape.backward(loss * 0.75f);
    values[mode] = {loss.item()};
    grads[mode] = in.grad().to_vector();
    const std::vector<float> s = scale.grad().to_vector();
    grads[mode].insert(grads[mode].end(), s.begin(), s.end());
  }
  CHECK(values[0] == values[1]);
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("an ignored target takes its row out of the loss, exactly", "[ops][loss]") {
  // the loss with ignored rows equals the loss of the other rows alone, and so do their
  // gradients, to the last bits: a row's exponentials may take Eigen's vector or scalar path
  // depending on where the row lies in memory (each within an ulp or two of exp), so 1e-14
  // relative; the ignored rows' gradients are exactly zero
  Rng rng(21);
  for (int trial = 0; trial < 20; ++trial) {
    const std::int64_t n = 1 + rng.uniform_int(12), c = 1 + rng.uniform_int(7);
    const auto x = rng.normal_tensor<double>({n, c});
    Tensor<std::int32_t> t({n});
    std::vector<std::int64_t> kept;
    for (std::int64_t r = 0; r < n; ++r) {
      const bool ignored = rng.uniform_int(3) == 0;
      t[r] = ignored ? kIgnoreTarget : static_cast<std::int32_t>(rng.uniform_int(c));
      if (!ignored) kept.push_back(r);
    }
    const auto m = static_cast<std::int64_t>(kept.size());
    Tensor<double> xk({std::max<std::int64_t>(m, 1), c});
    Tensor<std::int32_t> tk({std::max<std::int64_t>(m, 1)});
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t k = 0; k < c; ++k) xk[i * c + k] = x[kept[std::size_t(i)] * c + k];
      tk[i] = t[kept[std::size_t(i)]];
    }
    Tape a, b;
    auto xa = a.input(x.clone(), true), xb = b.input(xk, true);
    const Var<double> with_ignored = cross_entropy(xa, t);
    a.backward(with_ignored);
    INFO(n << " rows, " << m << " kept");
    if (m == 0) {  // nothing to learn: 0, and no gradient
      CHECK(with_ignored.item() == 0.0);
      for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(xa.grad()[i] == 0.0);
      continue;
    }
    const Var<double> alone = cross_entropy(xb, tk);
    b.backward(alone);
    CHECK(with_ignored.item() == Approx(alone.item()).epsilon(1e-14).margin(0));
    std::int64_t k_row = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      const bool ignored = t[r] == kIgnoreTarget;
      for (std::int64_t k = 0; k < c; ++k) {
        if (ignored)
          CHECK(xa.grad()[r * c + k] == 0.0);
        else
          CHECK(xa.grad()[r * c + k] == Approx(xb.grad()[k_row * c + k]).epsilon(1e-14).margin(0));
      }
      k_row += !ignored;
    }
  }
}

TEST_CASE("ignored targets: gradients, and the chunked loss agrees", "[ops][loss][gradcheck]") {
  const auto t = Tensor<std::int32_t>::from({5}, {0, kIgnoreTarget, 3, kIgnoreTarget, 2});
  gradcheck([t](const auto& v) { return cross_entropy(v[0], t); }, {randn({5, 4}, 11)});
  gradcheck([t](const auto& v) { return linear_cross_entropy(v[0], v[1], t, 2); },
            {randn({5, 3}, 12), randn({4, 3}, 13)});
  // chunked and plain paths with a chunk wholly ignored, within the rounding bounds above
  Rng rng(8);
  const std::int64_t n = 12, v = 7, c = 5;
  const auto h = rng.normal_tensor<double>({n, c});
  const auto w = rng.normal_tensor<double>({v, c});
  auto targets = remat::test::ids({n}, static_cast<std::int32_t>(v), 3);
  for (std::int64_t r : {0, 1, 2, 3, 9}) targets[r] = kIgnoreTarget;
  const RoundingBounds bound = rounding_bounds(h, w);
  for (std::int64_t chunk : {1, 4, 12}) {
    Tape a, b;
    auto ha = a.input(h.clone(), true), wa = a.input(w.clone(), true);
    auto hb = b.input(h.clone(), true), wb = b.input(w.clone(), true);
    const Var<double> chunked = linear_cross_entropy(ha, wa, targets, chunk);
    const Var<double> plain = cross_entropy(linear(hb, wb), targets);
    a.backward(chunked);
    b.backward(plain);
    INFO("chunk " << chunk);
    CHECK(std::abs(chunked.item() - plain.item()) <= bound.loss);
    for (std::int64_t i = 0; i < h.numel(); ++i)
      CHECK(std::abs(ha.grad()[i] - hb.grad()[i]) <= bound.h_grad[static_cast<std::size_t>(i % c)]);
    for (std::int64_t i = 0; i < w.numel(); ++i)
      CHECK(std::abs(wa.grad()[i] - wb.grad()[i]) <= bound.w_grad[static_cast<std::size_t>(i % c)]);
    for (std::int64_t k = 0; k < 4 * c; ++k) CHECK(ha.grad()[k] == 0.0);  // rows 0-3 ignored
  }
  // all ignored: 0 and no gradient, chunked too
  Tape tape;
  auto hz = tape.input(h.clone(), true), wz = tape.input(w.clone(), true);
  const Var<double> none =
      linear_cross_entropy(hz, wz, Tensor<std::int32_t>::full({n}, kIgnoreTarget), 5);
  tape.backward(none);
  CHECK(none.item() == 0.0);
  for (std::int64_t i = 0; i < w.numel(); ++i) CHECK(wz.grad()[i] == 0.0);
  // any other negative target is still an error, which names the ignored value
  CHECK_THAT(remat::test::error_message([&] {
               cross_entropy(Var<float>(Tensor<float>::zeros({2, 3})),
                             Tensor<std::int32_t>::from({2}, {0, -1}));
             }),
             Catch::Contains("target -1 at position 1") && Catch::Contains("kIgnoreTarget (-100)"));
}

TEST_CASE("linear_cross_entropy never holds the logits: 10x less memory than the plain path",
          "[ops][loss][memory]") {
  // 2 x 1024 tokens, vocabulary 32,000, width 256, in double
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
    const Var<double> l =
        chunked ? linear_cross_entropy(hv, wp, t) : cross_entropy(linear(hv, wp), t);
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
  const RoundingBounds bound = rounding_bounds(h, w);
  CHECK(std::abs(loss_chunked - loss_plain) <= bound.loss);
  std::int64_t outside = 0;
  for (std::int64_t i = 0; i < g_plain.numel(); ++i)
    outside += std::abs(g_chunked[i] - g_plain[i]) > bound.h_grad[static_cast<std::size_t>(i % c)];
  CHECK(outside == 0);
}

TEST_CASE("linear_cross_entropy's tiles: vocabulary blocks of 2,048, chunks of 8 MiB of them",
          "[ops][loss]") {
  using remat::detail::default_chunk_rows;
  using remat::detail::loss_vocab_block;
  CHECK(loss_vocab_block(151936, 896) == 2048);
  CHECK(loss_vocab_block(300, 16) == 300);             // the whole vocabulary
  CHECK(loss_vocab_block(248000, 2048) == 2048);       // its bfloat16 copy: 8 MiB
  CHECK(loss_vocab_block(128256, 4096) == 1024);       // wider: 8 MiB of bfloat16 hold 1,024 rows
  CHECK(loss_vocab_block(128256, 5000) == 832);        // rounded down to 32 rows
  CHECK(loss_vocab_block(32000, 1 << 20) == 32);       // at least 32
  CHECK(default_chunk_rows(151936, 896, 4) == 1024);   // 1,024 x 2,048 floats: 8 MiB
  CHECK(default_chunk_rows(151936, 896, 8) == 512);    // doubles
  CHECK(default_chunk_rows(128256, 4096, 4) == 1024);  // its rows' bfloat16 copy: 8 MiB
  CHECK(default_chunk_rows(128256, 8192, 4) == 512);
  CHECK(default_chunk_rows(300, 16, 4) == 6990);
  // and the op allocates what the rule says: one tile in forward, whatever the vocabulary, and
  // with a frozen head the input's unit gradient it keeps
  for (const std::int64_t vocab : {151936, 5000, 1000}) {
    for (const bool h_grad : {false, true}) {
      const std::int64_t rows = 200, width = 8, block = std::min<std::int64_t>(vocab, 2048);
      remat::Tape tape;
      const auto h = tape.input(remat::Tensor<float>::zeros({rows, width}), h_grad);
      const auto w = tape.input(remat::Tensor<float>::zeros({vocab, width}), false);
      const remat::Tensor<std::int32_t> targets = remat::Tensor<std::int32_t>::zeros({rows});
      remat::memory::Probe probe;
      (void)remat::linear_cross_entropy(h, w, targets);
      // the tile, each row's log-sum-exp and running sum (a float each), the loss scalar
      const std::int64_t floats = rows * block + 2 * rows + 1 + (h_grad ? rows * width : 0);
      INFO("vocabulary " << vocab << (h_grad ? ", h's gradient" : ""));
      CHECK(probe.peak_above_start() >= std::size_t(floats * 4));
      CHECK(probe.peak_above_start() < std::size_t(floats * 4 + 1024));
    }
  }
}

TEST_CASE("linear_cross_entropy rejects shapes and targets that do not fit",
          "[ops][loss][errors]") {
  const Var<float> h(Tensor<float>::zeros({3, 4}));
  const Var<float> w(Tensor<float>::zeros({5, 4}));
  CHECK_THAT(remat::test::error_message([&] {
               linear_cross_entropy(h, Var<float>(Tensor<float>::zeros({5, 3})),
                                    Tensor<std::int32_t>::zeros({3}));
             }),
             Catch::Contains("linear_cross_entropy") && Catch::Contains("(5, 3)"));
  CHECK_THROWS_AS(linear_cross_entropy(h, w, Tensor<std::int32_t>::from({3}, {0, 5, 1})),
                  IndexError);
  CHECK_THROWS_AS(linear_cross_entropy(h, w, Tensor<std::int32_t>::zeros({2})), ShapeError);
  CHECK_THAT(remat::test::error_message([&] {
               linear_cross_entropy(Var<float>(Tensor<float>::zeros({3, 0})),
                                    Var<float>(Tensor<float>::zeros({5, 0})),
                                    Tensor<std::int32_t>::zeros({3}));
             }),
             Catch::Contains("(5, 0)") && Catch::Contains("C >= 1"));
}
