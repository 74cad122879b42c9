// Flushing of subnormal numbers in remat's kernels (core/float_mode.hpp, Note [flushing
// denormals]).
#include "support/gradcheck.hpp"

#include <remat/core/float_mode.hpp>
#include <remat/optim/adamw.hpp>

#if REMAT_HAS_MXCSR
#include <xmmintrin.h>

namespace {

/// Restores the flush setting, the thread count and this thread's MXCSR when a test ends.
struct FloatModeTestScope {
  bool flush = remat::flush_denormals();
  int threads = remat::num_threads();
  unsigned mxcsr = _mm_getcsr();
  ~FloatModeTestScope() {
    remat::set_flush_denormals(flush);
    remat::set_num_threads(threads);
    _mm_setcsr(mxcsr);
  }
};

/// a * b for two (n) tensors of 1e-20: each product, 1e-40, is subnormal in float.
std::vector<float> subnormal_products(std::int64_t n) {
  remat::Tensor<float> a({n});
  for (float& v : a) v = 1e-20f;
  remat::Tape tape;
  const remat::Var<float> x = tape.input(a);
  return (x * x).value().to_vector();
}

/// Loss, input gradient and parameters after one AdamW step of a small tanh MLP on normal data.
std::vector<float> train_step(std::uint64_t seed) {
  remat::Rng rng(seed);
  remat::Parameter<float> w1(rng.uniform_tensor<float>({24, 24}, -0.2, 0.2)),
      b1(rng.uniform_tensor<float>({24}, -0.2, 0.2));
  remat::Parameter<float> w2(rng.uniform_tensor<float>({10, 24}, -0.2, 0.2)),
      b2(rng.uniform_tensor<float>({10}, -0.2, 0.2));
  const auto x = rng.normal_tensor<float>({3000, 24});
  remat::Tensor<std::int32_t> targets({3000});
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.uniform_int(10));
  remat::optim::AdamW<float> adamw({w1, b1, w2, b2}, {.lr = 1e-2});
  std::vector<float> out;
  {
    remat::Tape tape;
    const remat::Var<float> input = tape.input(x, true);
    const remat::Var<float> loss = remat::cross_entropy(
        remat::linear(remat::tanh(remat::linear(input, w1, b1)), w2, b2), targets);
    tape.backward(loss);
    out.push_back(loss.item());
    const auto g = input.grad().to_vector();
    out.insert(out.end(), g.begin(), g.end());
  }
  adamw.step();
  for (const auto* p : {&w1, &b1, &w2, &b2}) {
    const auto v = p->value().to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("kernels flush subnormal results by default, on every thread, and not when turned off",
          "[core][float_mode]") {
  const FloatModeTestScope scope;
  _mm_setcsr(_mm_getcsr() & ~remat::detail::FloatModeGuard::kFlushBits);  // a caller in IEEE mode
  REQUIRE(remat::flush_denormals());                                      // the default
  const std::int64_t n = 4 * remat::detail::kElementwiseGrain;            // enough for two threads
  for (int threads : {1, 2}) {
    remat::set_num_threads(threads);
    remat::set_flush_denormals(true);
    const auto flushed = subnormal_products(n);
    CHECK(std::count(flushed.begin(), flushed.end(), 0.0f) == n);
    remat::set_flush_denormals(false);
    const auto kept = subnormal_products(n);
    CHECK(std::count_if(kept.begin(), kept.end(),
                        [](float v) { return std::fpclassify(v) == FP_SUBNORMAL; }) == n);
  }
}

TEST_CASE("off, kernels compute with subnormals even when the caller flushes",
          "[core][float_mode]") {
  const FloatModeTestScope scope;
  _mm_setcsr(_mm_getcsr() | remat::detail::FloatModeGuard::kFlushBits);
  remat::set_flush_denormals(false);
  remat::set_num_threads(2);
  const auto kept = subnormal_products(4 * remat::detail::kElementwiseGrain);
  _mm_setcsr(scope.mxcsr);  // classify in IEEE mode: under DAZ, comparisons read subnormals as 0
  CHECK(std::count_if(kept.begin(), kept.end(), [](float v) {
          return std::fpclassify(v) == FP_SUBNORMAL;
        }) == static_cast<std::ptrdiff_t>(kept.size()));
}

TEST_CASE("a training step leaves the caller's floating-point mode as it was",
          "[core][float_mode]") {
  const FloatModeTestScope scope;
  const unsigned flush_bits = remat::detail::FloatModeGuard::kFlushBits;
  for (bool flush : {true, false}) {
    for (unsigned caller : {scope.mxcsr & ~flush_bits, scope.mxcsr | flush_bits,
                            (scope.mxcsr & ~flush_bits) | 0x8000u}) {
      remat::set_flush_denormals(flush);
      remat::set_num_threads(2);
      _mm_setcsr(caller);
      const auto result = train_step(5);
      const unsigned after = _mm_getcsr();
      _mm_setcsr(scope.mxcsr);
      CHECK(!result.empty());
      // the mode (control bits) as the caller set it; the exception flags (status) may have
      // been raised by the arithmetic, in remat and in this test alike
      const unsigned status = remat::detail::FloatModeGuard::kStatusBits;
      CHECK((after & ~status) == (caller & ~status));
    }
  }
}

TEST_CASE("flushing changes nothing on a model without subnormals, and stays bitwise deterministic",
          "[core][float_mode]") {
  const FloatModeTestScope scope;
  // GEMMs are bitwise reproducible for a given thread count (core/parallel.hpp): compare at one
  for (int threads : {1, 2}) {
    remat::set_num_threads(threads);
    remat::set_flush_denormals(true);
    const auto flushed = train_step(7);
    const auto flushed_again = train_step(7);
    remat::set_flush_denormals(false);
    const auto kept = train_step(7);
    CHECK(flushed == kept);
    CHECK(flushed == flushed_again);
    // and none of the values were subnormal, so the comparison says what the test name claims
    CHECK(std::none_of(kept.begin(), kept.end(),
                       [](float v) { return std::fpclassify(v) == FP_SUBNORMAL; }));
  }
}
#endif
