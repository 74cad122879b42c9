// The float kernels dispatched by instruction set (core/vector_kernels.hpp, Note [ISA dispatch]):
// every path this CPU offers, forced in turn with remat::set_isa.
#include "support/gradcheck.hpp"
#include "support/isa_scope.hpp"
#include "support/models.hpp"

#include <remat/core/bfloat16.hpp>
#include <remat/core/hash.hpp>
#include <remat/core/vector_kernels.hpp>
#include <remat/optim/adamw.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

/// The instruction sets this CPU can run, narrowest first.
std::vector<remat::Isa> runnable_isas() {
  std::vector<remat::Isa> out;
  for (remat::Isa isa : {remat::Isa::baseline, remat::Isa::avx2, remat::Isa::avx512}) {
    if (isa <= remat::cpu_isa()) out.push_back(isa);
  }
  return out;
}

double gelu_reference(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_grad_reference(double x) {
  const double c = 0.7978845608028654, k = 0.044715, t = std::tanh(c * (x + k * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * k * x * x);
}

/// Random float arrays of a random length (tails of every size) with values in [-lo, hi].
std::vector<float> random_array(remat::Rng& rng, std::int64_t n, double lo, double hi) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * rng.uniform());
  return v;
}

/// Largest |kernel - reference| over the arrays, and whether splitting an array in two at a
/// random point changed any bit of the result.
struct KernelCheck {
  double tanh_error = 0, tanh_grad_error = 0, gelu_error = 0, gelu_grad_error = 0, adamw_error = 0;
  int split_mismatches = 0;
};

KernelCheck check_kernels(std::uint64_t seed) {
  namespace vec = remat::detail::vec;
  remat::Rng rng(seed);
  KernelCheck r;
  for (int round = 0; round < 40; ++round) {
    const std::int64_t n = 1 + rng.uniform_int(150);
    const auto x = random_array(rng, n, -12, 12), gy = random_array(rng, n, -2, 2);
    std::vector<float> y(n), g(n), whole(n), split(n);
    vec::tanh_forward(x.data(), y.data(), n);
    vec::tanh_backward(gy.data(), y.data(), g.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      r.tanh_error = std::max(r.tanh_error, std::abs(y[i] - std::tanh(double(x[i]))));
      r.tanh_grad_error =
          std::max(r.tanh_grad_error, std::abs(g[i] - double(gy[i]) * (1 - double(y[i]) * y[i])));
    }
    vec::gelu_forward(x.data(), y.data(), n);
    vec::gelu_backward(gy.data(), x.data(), g.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      r.gelu_error =
          std::max(r.gelu_error, std::abs(y[i] - gelu_reference(x[i])) / (1 + std::abs(x[i])));
      // in float, 1 - t^2 loses digits where t is near 1, and the term it multiplies grows as
      // |x|^3: measure the error in units of the largest term's size
      const double largest =
          std::abs(gy[i]) * (1 + std::abs(x[i]) * (1 + 3 * 0.044715 * x[i] * x[i]));
      r.gelu_grad_error =
          std::max(r.gelu_grad_error, std::abs(g[i] - gy[i] * gelu_grad_reference(x[i])) / largest);
    }
    // split at a random point: bitwise the same as in one piece
    const std::int64_t cut = rng.uniform_int(n + 1);
    vec::gelu_backward(gy.data(), x.data(), whole.data(), n);
    vec::gelu_backward(gy.data(), x.data(), split.data(), cut);
    vec::gelu_backward(gy.data() + cut, x.data() + cut, split.data() + cut, n - cut);
    r.split_mismatches += whole != split;
    vec::tanh_forward(x.data(), whole.data(), n);
    vec::tanh_forward(x.data(), split.data(), cut);
    vec::tanh_forward(x.data() + cut, split.data() + cut, n - cut);
    r.split_mismatches += whole != split;

    // AdamW, against the formula in double
    auto p = random_array(rng, n, -1, 1), m = random_array(rng, n, -0.1, 0.1),
         v = random_array(rng, n, 0, 0.01);
    const auto grad = random_array(rng, n, -1, 1);
    const remat::detail::AdamWConstants k{0.9f, 0.999f, 1e-2f, 1.5f, 20.0f, 0.999f, 1e-8f};
    std::vector<double> want(n);
    for (std::int64_t i = 0; i < n; ++i) {
      const double mi = double(0.9f) * m[i] + (1 - double(0.9f)) * grad[i];
      const double vi = double(0.999f) * v[i] + (1 - double(0.999f)) * double(grad[i]) * grad[i];
      want[i] = p[i] * double(0.999f) -
                double(1e-2f) * (mi * 1.5) / (std::sqrt(vi * 20.0) + double(1e-8f));
    }
    vec::adamw_update(p.data(), m.data(), v.data(), grad.data(), n, k);
    for (std::int64_t i = 0; i < n; ++i)
      r.adamw_error =
          std::max(r.adamw_error, std::abs(p[i] - want[i]) / (1e-3 + std::abs(want[i])));
  }
  return r;
}

/// `x` rounded to bfloat16 by IEEE's rule, written without bit tricks: the two bfloat16 values
/// around x (its upper half, and the next one away from zero; past the largest finite one, 2^128
/// as if the exponent went on), the nearer taken, ties to the even one; a NaN made quiet.
std::uint16_t bf16_reference(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const auto upper = static_cast<std::uint16_t>(bits >> 16);
  if (std::isnan(x)) return static_cast<std::uint16_t>(upper | 0x40);
  const auto value = [](std::uint32_t half) {
    const std::uint32_t b = half << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return std::isinf(f) ? std::copysign(std::ldexp(1.0, 128), double(f)) : double(f);
  };
  if (std::isinf(x)) return upper;
  const double below = value(upper), above = value(upper + 1u);
  const double to_below = std::abs(double(x) - below), to_above = std::abs(above - double(x));
  if (to_below != to_above)
    return to_below < to_above ? upper : static_cast<std::uint16_t>(upper + 1);
  return (upper & 1) == 0 ? upper : static_cast<std::uint16_t>(upper + 1);
}

/// Floats whose bit patterns are drawn to cover every case of the rounding: any pattern (NaNs,
/// infinities, subnormals), exact ties, values next to the largest finite bfloat16.
std::vector<float> rounding_cases(remat::Rng& rng, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) {
    auto bits = static_cast<std::uint32_t>(rng.next_u64());
    switch (rng.uniform_int(4)) {
      case 0:
        bits = (bits & 0xffff0000u) | 0x8000u;
        break;  // a tie
      case 1:
        bits = (bits & 0x80000000u) | 0x7f7f0000u | (bits & 0xffffu);
        break;  // near max
      case 2:
        bits &= 0x807fffffu;
        break;  // subnormal or zero
      default:
        break;
    }
    std::memcpy(&x, &bits, 4);
  }
  return v;
}

}  // namespace

TEST_CASE("every instruction-set path rounds to bfloat16 by IEEE's rule and widens exactly",
          "[core][isa][bf16]") {
  namespace vec = remat::detail::vec;
  const remat::test::IsaScope scope;
  for (remat::Isa isa : runnable_isas()) {
    remat::set_isa(isa);
    INFO("path " << remat::to_string(isa));
    remat::Rng rng(23);
    int wrong = 0, wrong_scalar = 0, wrong_widened = 0;
    for (int round = 0; round < 200; ++round) {
      const std::int64_t n = 1 + rng.uniform_int(150);  // tails of every length
      const std::vector<float> x = rounding_cases(rng, n);
      std::vector<std::uint16_t> h(static_cast<std::size_t>(n));
      std::vector<float> back(static_cast<std::size_t>(n));
      vec::round_to_bf16(x.data(), h.data(), n);
      vec::widen_bf16(h.data(), back.data(), n);
      for (std::size_t i = 0; i < x.size(); ++i) {
        wrong += h[i] != bf16_reference(x[i]);
        wrong_scalar += remat::detail::float_to_bf16(x[i]) != bf16_reference(x[i]);
        std::uint32_t widened;
        std::memcpy(&widened, &back[i], 4);
        wrong_widened += widened != std::uint32_t{h[i]} << 16;
      }
    }
    CHECK(wrong == 0);
    CHECK(wrong_scalar == 0);
    CHECK(wrong_widened == 0);
  }
}

TEST_CASE("every instruction-set path fingerprints bytes as the one-word-at-a-time definition",
          "[core][isa]") {
  // detail::hash_bytes's definition: 64 multiply-xor lanes over blocks of 64 words, the tail's
  // bytes, then every lane folded in
  const auto reference = [](const std::vector<unsigned char>& bytes) {
    std::uint32_t lane[64];
    for (std::uint32_t l = 0; l < 64; ++l) lane[l] = 0x811c9dc5U + l * 0x9e3779b9U;
    const std::size_t blocks = bytes.size() / 256;
    for (std::size_t b = 0; b < blocks; ++b) {
      for (std::size_t l = 0; l < 64; ++l) {
        std::uint32_t w;
        std::memcpy(&w, bytes.data() + b * 256 + l * 4, 4);
        lane[l] = (lane[l] ^ w) * 0x01000193U;
      }
    }
    std::uint64_t h = remat::detail::mix64(bytes.size());
    for (std::size_t i = blocks * 256; i < bytes.size(); ++i)
      h = remat::detail::mix64(h ^ bytes[i]);
    for (std::size_t l = 0; l < 64; ++l)
      h = remat::detail::mix64(h ^ (static_cast<std::uint64_t>(lane[l]) << (l % 2 * 32)));
    return h;
  };
  const remat::test::IsaScope scope;
  for (remat::Isa isa : runnable_isas()) {
    remat::set_isa(isa);
    INFO("path " << remat::to_string(isa));
    remat::Rng rng(29);
    int wrong = 0, unchanged = 0;
    for (int round = 0; round < 100; ++round) {
      std::vector<unsigned char> bytes(static_cast<std::size_t>(rng.uniform_int(3000)));
      for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng.uniform_int(256));
      const std::uint64_t h = remat::detail::hash_bytes(bytes.data(), bytes.size());
      wrong += h != reference(bytes);
      if (bytes.empty()) continue;
      // one byte changed changes its lane (or the tail's fold), so the fingerprint
      bytes[static_cast<std::size_t>(rng.uniform_int(static_cast<std::int64_t>(bytes.size())))] ^=
          static_cast<unsigned char>(1 + rng.uniform_int(255));
      unchanged += remat::detail::hash_bytes(bytes.data(), bytes.size()) == h;
    }
    CHECK(wrong == 0);
    CHECK(unchanged == 0);
  }
}

TEST_CASE("every instruction-set path computes tanh, GELU and AdamW to float rounding",
          "[core][isa]") {
  const remat::test::IsaScope scope;
  for (remat::Isa isa : runnable_isas()) {
    remat::set_isa(isa);
    INFO("path " << remat::to_string(isa) << " on " << remat::cpu_name());
    const KernelCheck r = check_kernels(17);
    CHECK(r.tanh_error <= 5e-7);  // a few ulps of values in [-1, 1]
    CHECK(r.tanh_grad_error <= 1e-6);
    CHECK(r.gelu_error <= 1e-6);
    CHECK(r.gelu_grad_error <=
          4 * double(std::numeric_limits<float>::epsilon()));  // a few ulps of the largest term
    CHECK(r.adamw_error <= 2e-6);
    CHECK(r.split_mismatches == 0);
  }
}

TEST_CASE("set_isa refuses what the CPU lacks and active_isa defaults to the CPU's widest",
          "[core][isa]") {
  const remat::test::IsaScope scope;
  CHECK(scope.isa == remat::cpu_isa());
  if (remat::cpu_isa() != remat::Isa::avx512)
    CHECK_THROWS_AS(remat::set_isa(remat::Isa::avx512), remat::ArgumentError);
  remat::set_isa(remat::Isa::baseline);
  CHECK(remat::active_isa() == remat::Isa::baseline);
}

TEST_CASE(
    "on every path, a model trains to the baseline's figures within rounding, and replays bitwise",
    "[core][isa]") {
  const remat::test::IsaScope scope;
  remat::test::ChainModel model(6, 40, "gelu", 3);
  remat::test::ChainModel tanh_model(6, 40, "tanh", 4);
  remat::Rng rng(5);
  const auto x = rng.normal_tensor<float>({50, 40});
  const auto targets = remat::test::targets(50, 40, 6);
  const auto run = [&](remat::test::ChainModel& m, const remat::plan::Plan& p) {
    return remat::test::step(m.parameters(), [&](remat::Tape& tape) {
      return remat::cross_entropy(remat::checkpoint_sequential(m.layers, p, tape.input(x)),
                                  targets);
    });
  };
  std::vector<remat::test::StepResult> baseline;
  for (remat::Isa isa : runnable_isas()) {
    remat::set_isa(isa);
    INFO("path " << remat::to_string(isa));
    for (auto* m : {&model, &tanh_model}) {
      const auto plain = run(*m, remat::plan::none(m->layers.size()));
      const auto checkpointed = run(*m, remat::plan::every(m->layers.size()));
      CHECK(checkpointed.replays > 0);
      CHECK(plain.loss == checkpointed.loss);
      CHECK(plain.grads == checkpointed.grads);
      if (isa == remat::Isa::baseline) {
        baseline.push_back(plain);
        continue;
      }
      const auto& base = baseline[m == &model ? 0 : 1];
      CHECK(std::abs(plain.loss - base.loss) <= 1e-5 * std::abs(base.loss));
      double worst = 0;
      for (std::size_t i = 0; i < plain.grads.size(); ++i)
        for (std::size_t j = 0; j < plain.grads[i].size(); ++j)
          worst = std::max(worst, double(std::abs(plain.grads[i][j] - base.grads[i][j])) /
                                      (1e-3 + std::abs(base.grads[i][j])));
      CHECK(worst <= 1e-3);
    }
  }
}

TEST_CASE("every instruction-set path computes exp to 2^-22 relative, and sums of exps",
          "[core][isa]") {
  namespace vec = remat::detail::vec;
  const remat::test::IsaScope scope;
  const double u = std::ldexp(1.0, -24), smallest_normal = std::ldexp(1.0, -126);
  remat::Rng rng(23);
  for (remat::Isa isa : runnable_isas()) {
    remat::set_isa(isa);
    INFO("path " << remat::to_string(isa) << " on " << remat::cpu_name());
    double relative = 0, subnormal = 0;
    int wrong_specials = 0;
    for (int round = 0; round < 60; ++round) {
      const std::int64_t n = 1 + rng.uniform_int(300);
      // the whole range, then the ends of it: where exp leaves float's normals, and overflows
      auto x = random_array(rng, n, -110, 95);
      if (round % 3 == 1) x = random_array(rng, n, -106, -85);
      if (round % 3 == 2) x = random_array(rng, n, 88.5, 88.9);
      std::vector<float> y(n);
      vec::exp_shifted(x.data(), y.data(), n, 0.0f, 1.0f);
      for (std::int64_t i = 0; i < n; ++i) {
        const double want = std::exp(double(x[i]));
        if (want > std::numeric_limits<float>::max()) {
          wrong_specials += !(std::isinf(y[i]) && y[i] > 0);
        } else if (x[i] < -104) {
          wrong_specials += y[i] != 0;
        } else if (want < smallest_normal) {  // subnormal: within one step of them
          subnormal = std::max(subnormal, std::abs(y[i] - want) / std::ldexp(1.0, -149));
        } else {
          relative = std::max(relative, std::abs(y[i] - want) / want);
        }
      }
      // the sum of exp(x - shift), against the exps of the same float differences in double:
      // each term within 2^-22, and recursive float summation adds at most n u of the total
      // (shifted by the largest, as a log-sum-exp is, or by any element while the sum fits)
      const float shift =
          round % 2 == 0 ? *std::max_element(x.begin(), x.end()) : x[rng.uniform_int(n)];
      double want = 0;
      for (float xi : x) want += std::exp(double(xi - shift));
      const double got = vec::exp_sum(x.data(), n, shift);
      if (want < 1e37) CHECK(std::abs(got - want) <= (4 * u + double(n) * u) * want);
    }
    CHECK(relative <= 4 * u);
    CHECK(subnormal <= 1);
    CHECK(wrong_specials == 0);
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> specials{std::nanf(""), -inf, inf, 0.0f, -0.0f};
    std::vector<float> y(specials.size());
    vec::exp_shifted(specials.data(), y.data(), 5, 0.0f, 1.0f);
    CHECK(std::isnan(y[0]));
    CHECK(y[1] == 0);
    CHECK((std::isinf(y[2]) && y[2] > 0));
    CHECK(y[3] == 1);
    CHECK(y[4] == 1);
    // a scale, in place
    std::vector<float> z{1.0f, -2.0f};
    vec::exp_shifted(z.data(), z.data(), 2, 1.0f, 0.5f);
    CHECK(std::abs(z[0] - 0.5) <= 0.5 * 4 * u);
    CHECK(std::abs(z[1] - 0.5 * std::exp(-3.0)) <= 0.5 * std::exp(-3.0) * 8 * u);
  }
}
