// BF16 training (core/precision.hpp): what a PrecisionGuard changes, to the byte and to the bit.
// - saves: a bfloat16 copy per activation, shared by the ops saving it, leaves kept as they are;
// - plans: checkpointed, policy and plain gradients bitwise equal, replays verified;
// - accuracy: the GEMM ops against float64 within bfloat16's bound, on every kernel;
// - predictions: estimate_memory and step_peak equal the counted peak of a BF16 step.
#include "support/gradcheck.hpp"
#include "support/models.hpp"

#include <remat/optim/adamw.hpp>
#include <remat/train/estimate.hpp>

using namespace remat;
using remat::test::BlockModel;
using remat::test::ChainModel;
using remat::test::step;

namespace {

// bfloat16's unit roundoff (8 significant bits) and float's.
constexpr double kBf16U = 0x1p-8;
constexpr double kFloatU = 0x1p-24;

// The bound gemm_bf16 states for one element of a k-term product: both inputs rounded to
// bfloat16, then k float additions; `magnitude` is sum_i |a_i| |b_i| taken exactly.
double gemm_bound(std::int64_t k, double magnitude) {
  return (2 * kBf16U + kBf16U * kBf16U +
          static_cast<double>(k) * kFloatU * (1 + kBf16U) * (1 + kBf16U)) *
         magnitude;
}

// sum_i a(i) b(i) over n terms in double (exact for float inputs up to rounding of the sum), and
// sum_i |a(i) b(i)|, the magnitude gemm_bound() scales with.
struct Dot {
  double exact = 0, magnitude = 0;
};
template <class A, class B>
Dot dot(std::int64_t n, A a, B b) {
  Dot d;
  for (std::int64_t i = 0; i < n; ++i) {
    d.exact += double(a(i)) * b(i);
    d.magnitude += std::abs(double(a(i)) * b(i));
  }
  return d;
}

// The bytes a tape holds after the forward pass of a chain of `layers`, keeping only the loss.
std::size_t held_after_forward(const ChainModel& model, const Tensor<float>& x, Precision p) {
  const PrecisionGuard guard(p);
  Tape tape;
  const std::size_t before = memory::live_bytes();
  Var<float> loss;
  {
    Var<float> h = tape.input(x);
    for (const auto& layer : model.layers) h = layer(h);
    loss = sum(h);
  }
  return memory::live_bytes() - before;
}

}  // namespace

TEST_CASE("PrecisionGuard sets this thread's precision for a scope", "[precision]") {
  CHECK(current_precision() == Precision::f32);
  {
    const PrecisionGuard bf16(Precision::bf16);
    CHECK(current_precision() == Precision::bf16);
    {
      const PrecisionGuard f32(Precision::f32);
      CHECK(current_precision() == Precision::f32);
    }
    CHECK(current_precision() == Precision::bf16);
  }
  CHECK(current_precision() == Precision::f32);
  CHECK(parse_precision("bf16", "--dtype") == Precision::bf16);
  CHECK(parse_precision("bfloat16", "--dtype") == Precision::bf16);
  CHECK(parse_precision("f32", "--dtype") == Precision::f32);
  CHECK(parse_precision("float32", "--dtype") == Precision::f32);
  CHECK_THROWS_AS(parse_precision("fp16", "--dtype"), ArgumentError);
  CHECK_THAT(test::error_message([] { parse_precision("fp16", "--dtype"); }),
             Catch::Contains("--dtype") && Catch::Contains("'fp16'"));
}

TEST_CASE("BF16 keeps a saved activation as one bfloat16 copy, shared by the ops that save it",
          "[precision]") {
  Rng rng(3);
  const std::int64_t n = 8, d = 16, bytes = n * d * 4;
  const Parameter<float> w1(rng.normal_tensor<float>({d, d})), w2(rng.normal_tensor<float>({d, d}));
  const auto x = rng.normal_tensor<float>({n, d});
  const PrecisionGuard bf16(Precision::bf16);
  Tape tape;
  const Var<float> in = tape.input(x);
  const Var<float> h = in + 0.0f;  // an activation (add saves nothing)
  // the first linear of h saves a bfloat16 copy of it (and its weight, a leaf, as it is)
  std::size_t before = memory::live_bytes();
  const Var<float> a = linear(h, w1);
  CHECK(memory::live_bytes() - before == static_cast<std::size_t>(bytes + bytes / 2));
  // the second shares that copy: its output only
  before = memory::live_bytes();
  const Var<float> b = linear(h, w2);
  CHECK(memory::live_bytes() - before == static_cast<std::size_t>(bytes));
  // the step's input is saved as a copy too (only what parameters hold is kept as it is)
  before = memory::live_bytes();
  const Var<float> c = linear(in, w1);
  CHECK(memory::live_bytes() - before == static_cast<std::size_t>(bytes + bytes / 2));
  // a view of a parameter is the parameter's: a matmul by a reshape of it copies nothing of it
  before = memory::live_bytes();
  const Var<float> w1_rows = reshape(Var<float>(w1), Shape{d, d});
  const Var<float> e = matmul(h, w1_rows);
  CHECK(memory::live_bytes() - before == static_cast<std::size_t>(bytes));
  tape.backward(sum(a + b + c + e));
  CHECK(w1.grad().defined());
}

TEST_CASE("BF16 linear and matmul read their saved copies in backward: no float tensor of them",
          "[precision]") {
  // x (n, d) against a weight of one output: the backward's own tensors (dy, dW) are small,
  // and x's gradient is not asked for, so a float tensor made of x's copy (n d 4 bytes) would
  // be most of what the backward pass adds.
  Rng rng(31);
  const std::int64_t n = 64, d = 256;
  const auto x = rng.normal_tensor<float>({n, d});
  const Parameter<float> w(rng.normal_tensor<float>({1, d})), wt(rng.normal_tensor<float>({d, 1}));
  for (const bool use_matmul : {false, true}) {
    const PrecisionGuard bf16(Precision::bf16);
    Tape tape;
    const Var<float> h = tape.input(x) * 2.0f;  // an activation, no gradient asked for
    const Var<float> loss = sum(use_matmul ? matmul(h, Var<float>(wt)) : linear(h, w));
    const std::size_t before = memory::live_bytes();
    memory::reset_peak();
    tape.backward(loss);
    INFO((use_matmul ? "matmul" : "linear")
         << ": the backward pass added " << memory::peak_bytes() - before << " B");
    CHECK(memory::peak_bytes() - before < x.bytes() / 4);
    CHECK((use_matmul ? wt : w).grad().defined());
  }
}

TEST_CASE(
    "BF16 halves what a chain's tape holds after the forward pass, but for a copy of its input",
    "[precision]") {
  for (const char* activation : {"tanh", "gelu"}) {
    const ChainModel model(4, 16, activation, 5);
    Rng rng(6);
    const auto x = rng.normal_tensor<float>({8, 16});
    const std::size_t f32 = held_after_forward(model, x, Precision::f32);
    const std::size_t bf16 = held_after_forward(model, x, Precision::bf16);
    const std::size_t loss = 4;                    // the scalar loss, float in both
    const std::size_t input_copy = x.bytes() / 2;  // the first layer's save of the step's input
    INFO(activation << ": f32 holds " << f32 << " B, bf16 " << bf16 << " B");
    CHECK(bf16 > loss);
    CHECK(2 * (bf16 - loss - input_copy) == f32 - loss);
  }
}

TEST_CASE(
    "BF16 keeps the fused attention's probabilities as a bfloat16 copy, flash's statistics "
    "as they are",
    "[precision]") {
  Rng rng(11);
  const std::int64_t b = 2, t = 12, heads = 2, c = 8;
  const auto x = rng.normal_tensor<float>({b, t, 3 * c});
  const auto gy = rng.normal_tensor<float>({b, t, c});
  // What the op holds after its forward pass (its output y and its saves), and dx.
  const auto run = [&](Precision p, AttentionKernel kernel) {
    const PrecisionGuard guard(p);
    Tape tape;
    const Var<float> in = tape.input(x, true);
    const Var<float> qkv = in + 0.0f;  // an activation: saved as a copy under BF16
    const std::size_t before = memory::live_bytes();
    const Var<float> y = attention(qkv, {.heads = heads, .kernel = kernel});
    const std::size_t held = memory::live_bytes() - before;
    tape.backward(sum(y * tape.input(gy)));
    return std::pair(held, in.grad().clone());
  };
  const std::size_t y_bytes = b * t * c * 4, qkv_bytes = b * t * 3 * c * 4;
  const std::size_t probs = b * heads * t * t * 4, lse = b * heads * t * 4;
  const auto [fused32, dx32] = run(Precision::f32, AttentionKernel::fused);
  const auto [fused16, dx16] = run(Precision::bf16, AttentionKernel::fused);
  const std::size_t flash16 = run(Precision::bf16, AttentionKernel::flash).first;
  CHECK(fused32 == y_bytes + probs);  // qkv is saved as it is: no new bytes
  CHECK(fused16 == y_bytes + qkv_bytes / 2 + probs / 2);
  CHECK(flash16 == y_bytes + qkv_bytes / 2 + lse);
  // the backward read the rounded probabilities: close to float32's gradient, not equal
  double worst = 0, scale = 0;
  for (std::int64_t i = 0; i < dx32.numel(); ++i) {
    worst = std::max(worst, double(std::abs(dx16.data()[i] - dx32.data()[i])));
    scale = std::max(scale, double(std::abs(dx32.data()[i])));
  }
  CHECK(worst > 0);
  CHECK(worst < 0.05 * scale);
}

// Attention's output in BF16 against float64, per element, causal, packed q/k/v (B, T, 3C).
// Bound: a score s_j = (q . k_j) / sqrt(D) has its operands rounded to bfloat16, so it is off by
// at most delta_j = gemm_bound(D, sum |q| |k_j|) / sqrt(D); with every score off by at most
// Delta = max_j delta_j, each probability is within a factor exp(+-2 Delta) of its own. The
// probabilities and v are rounded again for p v (1 + u each), their products are exact in
// float, and the softmax and the sum of T products add float rounding: (2T + 16) 2^-24 covers
// exp's few ulps, the normalization and the sum. So
//   |y_c - exact| <= (exp(2 Delta) (1 + u)^2 (1 + (2T + 16) 2^-24) - 1) sum_j p_j |v_jc|.
// On the convert kernel the products stay float (u = 0 above and in Delta's bfloat16 terms);
// on a tile kernel some element must be further than float alone allows.
TEST_CASE("BF16 attention is within its bound of float64: bfloat16 products on a tile kernel",
          "[precision][ops]") {
  const Bf16Kernel best = supported_bf16_kernel();
  Rng rng(37);
  const std::int64_t B = 2, T = 21, H = 2, D = 16, C = H * D;
  const auto x = rng.normal_tensor<float>({B, T, 3 * C});
  const auto at = [&](std::int64_t b, std::int64_t t, std::int64_t col) {
    return double(x[(b * T + t) * 3 * C + col]);
  };
  for (Bf16Kernel kernel : {Bf16Kernel::convert, Bf16Kernel::avx512_bf16, Bf16Kernel::amx}) {
    if (kernel > best) continue;
    set_bf16_kernel(kernel);
    const double u = kernel == Bf16Kernel::convert ? 0.0 : kBf16U;
    for (const AttentionKernel kind : {AttentionKernel::fused, AttentionKernel::flash}) {
      INFO("kernel " << to_string(kernel) << ", "
                     << (kind == AttentionKernel::flash ? "flash" : "fused"));
      const PrecisionGuard bf16(Precision::bf16);
      Tape tape;
      const Var<float> qkv = tape.input(x) + 0.0f;
      const Tensor<float> y = attention(qkv, {.heads = H, .kernel = kind}).value();
      std::size_t beyond_float = 0, outside = 0;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < T; ++i) {
            std::vector<double> p(static_cast<std::size_t>(i + 1));
            double top = -INFINITY, delta = 0;
            for (std::int64_t j = 0; j <= i; ++j) {
              double dot = 0, magnitude = 0;
              for (std::int64_t d = 0; d < D; ++d) {
                const double qd = at(b, i, h * D + d), kd = at(b, j, C + h * D + d);
                dot += qd * kd;
                magnitude += std::abs(qd * kd);
              }
              const double rounding = (2 * u + u * u + D * kFloatU * (1 + u) * (1 + u));
              delta = std::max(delta, rounding * magnitude / std::sqrt(double(D)));
              p[std::size_t(j)] = dot / std::sqrt(double(D));
              top = std::max(top, p[std::size_t(j)]);
            }
            double total = 0;
            for (double& w : p) total += (w = std::exp(w - top));
            const double factor =
                std::exp(2 * delta) * (1 + u) * (1 + u) * (1 + (2.0 * T + 16) * kFloatU) - 1;
            for (std::int64_t c = 0; c < D; ++c) {
              double exact = 0, magnitude = 0;
              for (std::int64_t j = 0; j <= i; ++j) {
                const double v = at(b, j, 2 * C + h * D + c);
                exact += p[std::size_t(j)] / total * v;
                magnitude += p[std::size_t(j)] / total * std::abs(v);
              }
              const double error = std::abs(y[(b * T + i) * C + h * D + c] - exact);
              outside += error > factor * magnitude;
              beyond_float += error > 8 * kFloatU * magnitude;
            }
          }
      CHECK(outside == 0);
      if (u > 0) CHECK(beyond_float > 0);  // the products were rounded: float would be closer
    }
  }
  set_bf16_kernel(best);
}

TEST_CASE("BF16 gradients are bitwise equal under every checkpoint plan and policy",
          "[precision][checkpoint]") {
  const BlockModel model(3, 16, 0.1, 7);
  Rng rng(8);
  const auto x = rng.normal_tensor<float>({2, 6, 16});
  const auto run = [&](Precision p, int mode) {
    const PrecisionGuard guard(p);
    return step(model.params,
                [&](Tape& tape) {
                  Var<float> h = tape.input(x);
                  for (const auto& layer : model.layers) {
                    if (mode == 0) h = layer(h);
                    if (mode == 1) h = checkpoint(layer, h);
                    if (mode == 2) h = checkpoint(layer, save_matmuls(), h);
                  }
                  return sum(h * h);
                },
                99, {.verify_replay = true});
  };
  const auto plain = run(Precision::bf16, 0);
  CHECK(run(Precision::bf16, 1).grads == plain.grads);
  CHECK(run(Precision::bf16, 2).grads == plain.grads);
  CHECK(run(Precision::bf16, 1).replays == 3);
  // and BF16 did compute differently, close to float32
  const auto f32 = run(Precision::f32, 0);
  CHECK(f32.grads != plain.grads);
  for (std::size_t i = 0; i < f32.grads.size(); ++i) {
    double diff = 0, norm = 0;
    for (std::size_t j = 0; j < f32.grads[i].size(); ++j) {
      diff = std::max(diff, std::abs(double(f32.grads[i][j]) - plain.grads[i][j]));
      norm = std::max(norm, std::abs(double(f32.grads[i][j])));
    }
    INFO("parameter " << i << ": max difference " << diff << ", max |gradient| " << norm);
    CHECK(diff <= 0.05 * norm);
  }
}

TEST_CASE("BF16 linear and matmul are within bfloat16's bound of float64, on every kernel",
          "[precision][ops]") {
  const Bf16Kernel best = supported_bf16_kernel();
  Rng rng(9);
  const std::int64_t m = 37, k = 70, o = 45;
  const auto x = rng.normal_tensor<float>({m, k});
  const auto w = rng.normal_tensor<float>({o, k});
  const auto r = rng.normal_tensor<float>({m, o});  // the loss's weights: dL/dy = r
  for (Bf16Kernel kernel : {Bf16Kernel::convert, Bf16Kernel::avx512_bf16, Bf16Kernel::amx}) {
    if (kernel > best) continue;
    set_bf16_kernel(kernel);
    INFO("kernel " << to_string(kernel));
    for (const bool use_matmul : {false, true}) {
      INFO((use_matmul ? "matmul" : "linear"));
      const PrecisionGuard bf16(Precision::bf16);
      Tensor<float> wt({k, o});  // matmul's (in, out) layout
      for (std::int64_t j = 0; j < o; ++j)
        for (std::int64_t p = 0; p < k; ++p) wt[p * o + j] = w[j * k + p];
      const Parameter<float> weight(use_matmul ? wt : w);
      Tape tape;
      const Var<float> in = tape.input(x, true);
      const Var<float> h = in + 0.0f;  // not a leaf: its save is the bfloat16 copy
      const Var<float> y = use_matmul ? matmul(h, weight) : linear(h, weight);
      tape.backward(sum(y * Var<float>(r)));
      Tensor<float> gw({o, k});  // dL/dW laid out (out, in) for both ops
      for (std::int64_t j = 0; j < o; ++j)
        for (std::int64_t p = 0; p < k; ++p)
          gw[j * k + p] = use_matmul ? weight.grad()[p * o + j] : weight.grad()[j * k + p];
      const Tensor<float>& gx = in.grad();
      std::size_t rounded = 0;
      for (std::int64_t i = 0; i < m; ++i)  // y = x W^T
        for (std::int64_t j = 0; j < o; ++j) {
          const Dot e = dot(
              k, [&](auto p) { return x[i * k + p]; }, [&](auto p) { return w[j * k + p]; });
          const double error = std::abs(y.value()[i * o + j] - e.exact);
          CHECK(error <= gemm_bound(k, e.magnitude));
          rounded += error > 4 * kFloatU * e.magnitude;
        }
      CHECK(rounded > 0);  // the inputs were rounded: float's GEMM would be this close
      for (std::int64_t i = 0; i < m; ++i)  // dx = r W
        for (std::int64_t p = 0; p < k; ++p) {
          const Dot e = dot(
              o, [&](auto j) { return r[i * o + j]; }, [&](auto j) { return w[j * k + p]; });
          CHECK(std::abs(gx[i * k + p] - e.exact) <= gemm_bound(o, e.magnitude));
        }
      for (std::int64_t j = 0; j < o; ++j)  // dW = r^T x
        for (std::int64_t p = 0; p < k; ++p) {
          const Dot e = dot(
              m, [&](auto i) { return r[i * o + j]; }, [&](auto i) { return x[i * k + p]; });
          CHECK(std::abs(gw[j * k + p] - e.exact) <= gemm_bound(m, e.magnitude));
        }
    }
  }
  set_bf16_kernel(best);
}

TEST_CASE("BF16 loss head: bfloat16 GEMMs on a tile kernel within their bound, float on convert",
          "[precision][ops]") {
  // Width 2048: the vocabulary goes through in blocks of 2048 rows of W (8 MiB of packed
  // bfloat16), so 5,000 tokens take three; 6 rows in chunks of 4.
  const Bf16Kernel best = supported_bf16_kernel();
  Rng rng(41);
  const std::int64_t n = 6, c = 2048, v = 5000, chunk = 4;
  const auto h = rng.normal_tensor<float>({n, c});
  const auto w = rng.normal_tensor<float>({v, c}, 0.0, 0.02);
  Tensor<std::int32_t> targets({n});
  for (std::int64_t i = 0; i < n; ++i) targets[i] = static_cast<std::int32_t>(i * 811 % v);
  // float64: each logit, the bound on its error (gemm_bound), each row's softmax
  std::vector<double> z(n * v), delta(n * v), p(n * v);
  double loss = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double top = -INFINITY, total = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      const Dot e = dot(
          c, [&](auto k) { return h[i * c + k]; }, [&](auto k) { return w[j * c + k]; });
      z[i * v + j] = e.exact;
      delta[i * v + j] = gemm_bound(c, e.magnitude);
      top = std::max(top, e.exact);
    }
    for (std::int64_t j = 0; j < v; ++j) total += std::exp(z[i * v + j] - top);
    for (std::int64_t j = 0; j < v; ++j) p[i * v + j] = std::exp(z[i * v + j] - top) / total;
    loss += (top + std::log(total) - z[i * v + targets[i]]) / double(n);
  }
  // float's own error in a softmax over v terms (exp, sums), on top of the logits' errors
  const double eps = (double(v) + 16) * kFloatU;
  // the loss from the bfloat16-rounded inputs in float64: what the head computes but for
  // float's accumulation, which moves a logit by at most c u |h| |w| (a far tighter check)
  const auto rounded = [](float x) {
    return double(remat::detail::bf16_to_float(remat::detail::float_to_bf16(x)));
  };
  double rounded_loss = 0, accumulation = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::vector<double> zr(v);
    double top = -INFINITY, total = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      const Dot e = dot(
          c, [&](auto k) { return rounded(h[i * c + k]); },
          [&](auto k) { return rounded(w[j * c + k]); });
      zr[j] = e.exact;
      accumulation = std::max(accumulation, double(c) * kFloatU * e.magnitude);
      top = std::max(top, e.exact);
    }
    for (std::int64_t j = 0; j < v; ++j) total += std::exp(zr[j] - top);
    rounded_loss += (top + std::log(total) - zr[targets[i]]) / double(n);
  }
  const auto run = [&](bool trained, Precision precision) {
    const PrecisionGuard guard(precision);
    Parameter<float> weight(w);
    if (!trained) weight.freeze();
    Tape tape;
    const Var<float> x = tape.input(h, true);
    const Var<float> l = linear_cross_entropy(x + 0.0f, weight, targets, chunk);
    tape.backward(l);
    return std::tuple{l.value()[0], x.grad(), trained ? weight.grad() : Tensor<float>()};
  };
  for (Bf16Kernel kernel : {Bf16Kernel::convert, Bf16Kernel::avx512_bf16, Bf16Kernel::amx}) {
    if (kernel > best) continue;
    set_bf16_kernel(kernel);
    for (const bool trained : {false, true}) {
      INFO("kernel " << to_string(kernel) << (trained ? ", trained head" : ", frozen head"));
      const auto [l16, gh16, gw16] = run(trained, Precision::bf16);
      const auto [l32, gh32, gw32] = run(trained, Precision::f32);
      if (kernel == Bf16Kernel::convert) {  // the head stays float there: the same bits
        CHECK(l16 == l32);
        CHECK(std::equal(gh16.data(), gh16.data() + gh16.numel(), gh32.data()));
        if (trained) CHECK(std::equal(gw16.data(), gw16.data() + gw16.numel(), gw32.data()));
        continue;
      }
      CHECK(l16 != l32);  // its GEMMs ran in bfloat16
      double largest = 0;
      for (double d : delta) largest = std::max(largest, d);
      CHECK(std::abs(l16 - loss) <= 2 * largest + eps * (1 + loss));
      CHECK(std::abs(l16 - rounded_loss) <= 2 * accumulation + eps * (1 + loss));
      // a probability from logits each within delta: within exp(2 Delta_i) (1 + eps) of it
      std::vector<double> grown(n);
      for (std::int64_t i = 0; i < n; ++i) {
        double d = 0;
        for (std::int64_t j = 0; j < v; ++j) d = std::max(d, delta[i * v + j]);
        grown[i] = std::exp(2 * d) * (1 + eps);
      }
      const double g = 1.0 / double(n);
      std::size_t outside = 0;
      for (std::int64_t i = 0; i < n; ++i) {  // dh = g (p - onehot) W
        const double f = grown[i];
        for (std::int64_t k = 0; k < c; ++k) {
          double exact = 0, magnitude = 0, moved = 0;
          for (std::int64_t j = 0; j < v; ++j) {
            const double wa = std::abs(double(w[j * c + k])), hot = j == targets[i];
            exact += (p[i * v + j] - hot) * w[j * c + k];
            magnitude += (p[i * v + j] * f + hot) * wa;
            moved += p[i * v + j] * wa;
          }
          const double bound = g * (gemm_bound(v, magnitude) + (f - 1) * moved);
          outside += std::abs(gh16[i * c + k] - g * exact) > bound;
        }
      }
      CHECK(outside == 0);
      if (!trained) continue;
      for (std::int64_t j = 0; j < v; j += 7)  // dW = g (p - onehot)^T h, every seventh row
        for (std::int64_t k = 0; k < c; ++k) {
          double exact = 0, magnitude = 0, moved = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            const double ha = std::abs(double(h[i * c + k])), hot = j == targets[i];
            exact += (p[i * v + j] - hot) * h[i * c + k];
            magnitude += (p[i * v + j] * grown[i] + hot) * ha;
            moved += p[i * v + j] * (grown[i] - 1) * ha;
          }
          outside += std::abs(gw16[j * c + k] - g * exact) > g * (gemm_bound(n, magnitude) + moved);
        }
      CHECK(outside == 0);
    }
  }
  if (best == Bf16Kernel::convert)
    WARN("no AMX or AVX512-BF16 on " << cpu_name() << ": the bfloat16 head's bounds not checked");
  set_bf16_kernel(best);
}

// An element-wise op under BF16 saves a bfloat16 copy of its input (or output), and its backward
// widens that copy 1,024 values at a time on the stack: the op's backward holds no more than
// float32's (its gradient), and gives the bits float32 gives on the rounded values. 70,001 values:
// two chunks of the pool (35,000 and 35,001), each ending in a short piece.
TEST_CASE("BF16 element-wise ops read their copy in pieces and hold no float tensor of it",
          "[precision][ops]") {
  Rng rng(53);
  const std::int64_t n = 70001;
  const auto x = rng.normal_tensor<float>({n});
  const auto gy = rng.normal_tensor<float>({n});
  Tensor<float> rounded_x(x.shape());
  for (std::int64_t i = 0; i < n; ++i)
    rounded_x[i] = remat::detail::bf16_to_float(remat::detail::float_to_bf16(x[i]));
  // the most bytes live while the op's backward ran, above those live when backward began
  const auto backward = [&](const auto& op, const Tensor<float>& input, Precision precision) {
    const PrecisionGuard guard(precision);
    Tape tape;
    const Var<float> v = tape.input(input, true);
    const Var<float> y = op(v + 0.0f);
    const std::size_t start = memory::live_bytes();
    Trace trace;
    tape.backward(y, gy);
    std::size_t peak = 0;
    for (const TraceEvent& e : trace.events())
      if (e.phase == TracePhase::backward && e.name != "add_scalar") peak = e.peak - start;
    return std::pair{peak, v.grad().to_vector()};
  };
  const auto check = [&](const auto& op, bool saves_input) {
    const auto [peak32, g32] = backward(op, saves_input ? rounded_x : x, Precision::f32);
    const auto [peak16, g16] = backward(op, x, Precision::bf16);
    CHECK(peak32 == std::size_t(n) * 4);  // the gradient
    CHECK(peak16 == peak32);
    if (saves_input) CHECK(g16 == g32);
  };
  check([](const Var<float>& v) { return gelu_tanh(v); }, true);
  check([](const Var<float>& v) { return gelu(v); }, true);
  check([](const Var<float>& v) { return tanh(v); }, false);
}

// Under BF16 the fused attention keeps its (B, H, T, T) probabilities as a bfloat16 copy, and its
// backward widens them one head at a time into its slot's (T, T) buffer: the backward pass holds
// what float32's does, plus the widened q, k, v (a copy each, as every activation) and the slots'
// buffers, never the whole probabilities in float. 32 units on 8 slots, so the difference shows.
TEST_CASE("BF16 attention widens its probabilities a head at a time in backward",
          "[precision][ops]") {
  const Bf16Kernel best = supported_bf16_kernel();
  Rng rng(47);
  const std::int64_t B = 4, T = 24, H = 8, D = 4, C = H * D;
  const auto x = rng.normal_tensor<float>({B, T, 3 * C});
  const auto gy = rng.normal_tensor<float>({B, T, C});
  const auto backward_peak = [&](Precision precision) {
    const PrecisionGuard guard(precision);
    Tape tape;
    const Var<float> qkv = tape.input(x, true);
    const Var<float> y = attention(qkv, {.heads = H});
    const memory::Probe probe;
    tape.backward(y, gy);
    return std::pair{probe.peak_above_start(), qkv.grad().to_vector()};
  };
  for (Bf16Kernel kernel : {Bf16Kernel::convert, Bf16Kernel::avx512_bf16, Bf16Kernel::amx}) {
    if (kernel > best) continue;
    set_bf16_kernel(kernel);
    INFO("kernel " << to_string(kernel));
    const auto [peak32, g32] = backward_peak(Precision::f32);
    const auto [peak16, g16] = backward_peak(Precision::bf16);
    const std::size_t widened_qkv = std::size_t(B * T * 3 * C) * 4;
    const std::size_t slot_buffers = std::size_t(std::min<std::int64_t>(B * H, 8) * T * T) * 4;
    CHECK(peak16 == peak32 + widened_qkv + slot_buffers);
    CHECK(backward_peak(Precision::bf16).second == g16);  // deterministic
  }
  set_bf16_kernel(best);
}

// A trained head's GEMMs round h to bfloat16 as they pack it, so under BF16 on a tile kernel the
// op keeps h as its bfloat16 copy (2 bytes a value, not float's 4) and packs that copy in both
// passes: the same loss and gradients, to the bit, as from h rounded beforehand. On the convert
// kernel the head's GEMMs are float and h stays float.
TEST_CASE("BF16 loss head: a trained head keeps h as its bfloat16 copy", "[precision][ops]") {
  const Bf16Kernel best = supported_bf16_kernel();
  Rng rng(43);
  const std::int64_t n = 13, c = 40, v = 2100, chunk = 5;  // two vocabulary blocks, 3 chunks
  const auto h = rng.normal_tensor<float>({n, c});
  Tensor<float> rounded_h(h.shape());
  for (std::int64_t i = 0; i < h.numel(); ++i)
    rounded_h[i] = remat::detail::bf16_to_float(remat::detail::float_to_bf16(h[i]));
  const auto w = rng.normal_tensor<float>({v, c}, 0.0, 0.1);
  Tensor<std::int32_t> targets({n});
  for (std::int64_t i = 0; i < n; ++i) targets[i] = static_cast<std::int32_t>(i * 977 % v);
  // the bytes the op keeps from forward to backward (h is an activation: x + 0), and the results
  const auto run = [&](const Tensor<float>& input, Precision precision) {
    const PrecisionGuard guard(precision);
    Parameter<float> weight(w);
    Tape tape;
    const Var<float> x = tape.input(input, true);
    const std::size_t before = memory::live_bytes();
    const Var<float> l = linear_cross_entropy(x + 0.0f, weight, targets, chunk);
    const std::size_t kept = memory::live_bytes() - before;
    tape.backward(l);
    return std::tuple{kept, l.value()[0], x.grad().to_vector(), weight.grad().to_vector()};
  };
  for (Bf16Kernel kernel : {Bf16Kernel::convert, Bf16Kernel::avx512_bf16, Bf16Kernel::amx}) {
    if (kernel > best) continue;
    set_bf16_kernel(kernel);
    INFO("kernel " << to_string(kernel));
    const bool tiles = kernel != Bf16Kernel::convert;
    const auto [kept32, l32, gh32, gw32] = run(h, Precision::f32);
    const auto [kept16, l16, gh16, gw16] = run(h, Precision::bf16);
    CHECK(kept32 - kept16 == (tiles ? std::size_t(n * c) * 2 : 0));
    if (!tiles) {  // float GEMMs: the same bits as float32
      CHECK(l16 == l32);
      CHECK(gh16 == gh32);
      CHECK(gw16 == gw32);
      continue;
    }
    const auto [kept_r, l_r, gh_r, gw_r] = run(rounded_h, Precision::bf16);
    CHECK(kept_r == kept16);
    CHECK(l16 == l_r);
    CHECK(gh16 == gh_r);
    CHECK(gw16 == gw_r);
  }
  set_bf16_kernel(best);
}

TEST_CASE("BF16 refuses an op on double, naming it", "[precision]") {
  const PrecisionGuard bf16(Precision::bf16);
  Tape tape;
  const Var<double> x = tape.input(Tensor<double>::ones({2, 2}), true);
  CHECK_THROWS_AS(tanh(x), UsageError);
  CHECK_THAT(test::error_message([&] { tanh(x); }),
             Catch::Contains("tanh") && Catch::Contains("Precision::bf16"));
  const nn::LlamaConfig config{.vocab_size = 16,
                               .hidden_size = 8,
                               .intermediate_size = 8,
                               .num_hidden_layers = 1,
                               .num_attention_heads = 2,
                               .num_key_value_heads = 2,
                               .max_position_embeddings = 8};
  const train::StepShape step{.batch = 1, .precision = Precision::bf16};
  CHECK_THROWS_AS(train::estimate_memory<double>(config, step), ArgumentError);
  CHECK_THAT(test::error_message([&] { train::estimate_memory<double>(config, step); }),
             Catch::Contains("estimate_memory") && Catch::Contains("bf16"));
}

namespace {

// A real step's counted peak for `make()`'s model under `p`, after a first step made the
// gradients and AdamW's state, recorded under `precision`; counted from before the model, the
// ids and the targets, as estimate_memory counts.
template <class Make>
double counted_step_peak(const Make& make, const Tensor<std::int32_t>& ids, const plan::Plan& p,
                         Precision precision) {
  const std::size_t base = memory::live_bytes();
  const Tensor<std::int32_t> inputs = ids.clone(), targets = ids.clone();
  auto model = make();
  optim::AdamW<float> adam(model.parameters());
  double peak = 0;
  for (int s = 0; s < 2; ++s) {
    if (s == 1) memory::reset_peak();
    {
      const PrecisionGuard guard(precision);
      Tape tape;
      tape.backward(model.loss(inputs, targets, {.plan = &p}));
    }
    adam.step();
    adam.zero_grad();
    peak = static_cast<double>(memory::peak_bytes() - base);
  }
  return peak;
}

}  // namespace

TEST_CASE("estimate_memory and step_peak price a BF16 step to the byte, under every plan",
          "[precision][estimate]") {
  const nn::LlamaConfig llama{.vocab_size = 40,
                              .hidden_size = 32,
                              .intermediate_size = 64,
                              .num_hidden_layers = 3,
                              .num_attention_heads = 4,
                              .num_key_value_heads = 2,
                              .max_position_embeddings = 16,
                              .seed = 4};
  const nn::GPTConfig gpt{.vocab = 40, .context = 16, .layers = 3, .heads = 4, .width = 32};
  const auto ids = test::ids({2, 16}, 40, 5);
  const auto check = [&](const auto& config, auto make) {
    const train::StepShape step{.batch = 2, .time = 16, .precision = Precision::bf16};
    const auto e = train::estimate_memory<float>(config, step);
    auto f32_step = step;
    f32_step.precision = Precision::f32;
    const auto f32 = train::estimate_memory<float>(config, f32_step);
    CHECK(e.activations(plan::none(e.chain)) < f32.activations(plan::none(f32.chain)));
    for (const plan::Plan& p : {plan::none(e.chain), plan::every(e.chain), plan::sqrt(e.chain),
                                plan::optimal(e.chain, 1)}) {
      const double counted = counted_step_peak(make, ids, p, Precision::bf16);
      INFO(p.describe() << ": estimated " << e.total(p) << " B, counted " << counted << " B");
      CHECK(e.total(p) == counted);
      CHECK(train::step_peak<float>(config, step, p) == counted);
    }
  };
  check(llama, [&] { return nn::Llama<float>(llama); });
  check(gpt, [&] { return nn::GPT<float>(gpt); });
}

namespace {

// Every parameter's gradient after one step of `model` under `p`, recorded under `precision`.
template <class Model>
std::vector<std::vector<float>> model_gradients(const Model& model, const Tensor<std::int32_t>& ids,
                                                const plan::Plan& p, Precision precision) {
  for (auto param : model.parameters()) param.free_grad();
  {
    const PrecisionGuard guard(precision);
    Tape tape({.seed = 3, .verify_replay = true});
    tape.backward(model.loss(ids, ids, {.plan = &p}));
  }
  std::vector<std::vector<float>> grads;
  for (const auto& param : model.parameters()) grads.push_back(param.grad().to_vector());
  return grads;
}

}  // namespace

TEST_CASE("a GPT's and a Llama's BF16 gradients are bitwise equal under every plan",
          "[precision][checkpoint]") {
  const nn::GPTConfig gpt_config{
      .vocab = 30, .context = 12, .layers = 3, .heads = 2, .width = 16, .dropout = 0.1};
  const nn::GPT<float> gpt(gpt_config);
  for (const AttentionKernel kernel : {AttentionKernel::fused, AttentionKernel::flash}) {
    const nn::LlamaConfig llama_config{.vocab_size = 30,
                                       .hidden_size = 16,
                                       .intermediate_size = 24,
                                       .num_hidden_layers = 3,
                                       .num_attention_heads = 4,
                                       .num_key_value_heads = 2,
                                       .max_position_embeddings = 12,
                                       .attention = kernel};
    const nn::Llama<float> llama(llama_config);
    const auto ids = test::ids({2, 12}, 30, 7);
    const auto check = [&](const auto& model) {
      const auto plain = model_gradients(model, ids, plan::none(3), Precision::bf16);
      CHECK(model_gradients(model, ids, plan::every(3), Precision::bf16) == plain);
      CHECK(model_gradients(model, ids, plan::sqrt(3), Precision::bf16) == plain);
      CHECK(model_gradients(model, ids, plan::none(3), Precision::f32) != plain);
    };
    INFO(to_string(kernel));
    check(llama);
    if (kernel == AttentionKernel::fused) check(gpt);
  }
}
