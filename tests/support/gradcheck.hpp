#pragma once
// The suite's gradient check: remat::check::gradcheck (include/remat/check/gradcheck.hpp), the
// helper users run on their own ops, as one Catch2 assertion with the mismatches in its message.
// Its tolerance is stated once for the whole suite there: |analytic - numeric| <= 1e-7 + 1e-6
// |numeric| with eps = 1e-6, in double; and the gradients inside a checkpoint must equal the
// plain ones exactly.

#include <catch2/catch.hpp>
#include <remat/remat.hpp>

#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

namespace remat::test {

using VarList = check::VarList;
using Function = check::Function;

// The suite's tolerances, for tests that difference by hand (a whole model's loss, say).
inline constexpr double kEps = check::GradcheckOptions{}.eps;
inline constexpr double kAbsTol = check::GradcheckOptions{}.atol;
inline constexpr double kRelTol = check::GradcheckOptions{}.rtol;

/// Checks f's gradients at `inputs` against central differences (see the file comment).
inline void gradcheck(const Function& f, const std::vector<Tensor<double>>& inputs,
                      std::uint64_t seed = 7) {
  const check::GradcheckResult result = check::gradcheck(f, inputs, {.seed = seed});
  INFO(result.message());
  CHECK(result.checked > 0);
  CHECK(result.ok());
}

/// f's output on a fresh tape seeded with `seed`; with `backward_seed`, the inputs' gradients
/// too (the evaluation the check itself uses), for tests that compare them with reference data.
inline Tensor<double> evaluate(const Function& f, const std::vector<Tensor<double>>& inputs,
                               std::uint64_t seed, const Tensor<double>* backward_seed = nullptr,
                               std::vector<Tensor<double>>* grads = nullptr) {
  return check::detail::evaluate(f, inputs, seed, backward_seed, grads);
}

/// A tensor of normal draws.
inline Tensor<double> randn(const Shape& shape, std::uint64_t seed) {
  Rng rng(seed);
  return rng.normal_tensor<double>(shape);
}

/// A tensor of uniform draws in [lo, hi).
inline Tensor<double> uniform(const Shape& shape, double lo, double hi, std::uint64_t seed) {
  Rng rng(seed);
  return rng.uniform_tensor<double>(shape, lo, hi);
}

/// Integer ids in [0, n).
inline Tensor<std::int32_t> ids(const Shape& shape, std::int32_t n, std::uint64_t seed) {
  Rng rng(seed);
  Tensor<std::int32_t> t(shape);
  for (std::int32_t& v : t) v = static_cast<std::int32_t>(rng.uniform_int(n));
  return t;
}

/// The message of the remat::Error that `fn` throws (fails the test if none is thrown).
template <class Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const remat::Error& e) {
    return e.what();
  }
  FAIL("expected a remat::Error");
  return {};
}

}  // namespace remat::test
