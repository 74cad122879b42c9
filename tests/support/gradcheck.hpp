#pragma once
// The finite-difference gradient check every op's tests run, in double.
//
// For f: inputs -> output, it compares the gradient backward() computes for the scalar
// L(x) = <R, f(x)> (R a fixed random tensor, so every output element matters) with central
// differences (L(x + eps e_j) - L(x - eps e_j)) / (2 eps), element by element.
//
// Tolerance, stated once for the whole suite: |analytic - numeric| <= kAbsTol + kRelTol |numeric|
// with eps = 1e-6. In double, the truncation error of central differences is O(eps^2) and the
// rounding error O(1e-16 |L| / eps) = O(1e-10 |L|), both well inside it.
//
// Every evaluation records on a fresh tape with the same seed and the same inputs, so random ops
// (dropout) draw the same numbers each time.

#include <catch2/catch.hpp>
#include <remat/remat.hpp>

#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

namespace remat::test {

inline constexpr double kEps = 1e-6;
inline constexpr double kAbsTol = 1e-7;
inline constexpr double kRelTol = 1e-6;

using VarList = std::vector<Var<double>>;
using Function = std::function<Var<double>(const VarList&)>;

inline double dot(const Tensor<double>& a, const Tensor<double>& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a[i] * b[i];
  return s;
}

/// Evaluates f on a fresh tape seeded with `seed`; with `backward_seed`, also runs backward and
/// returns the inputs' gradients through `grads`.
inline Tensor<double> evaluate(const Function& f, const std::vector<Tensor<double>>& inputs, std::uint64_t seed,
                               const Tensor<double>* backward_seed = nullptr,
                               std::vector<Tensor<double>>* grads = nullptr) {
  Tape tape(TapeOptions{.seed = seed});
  VarList vars;
  for (const Tensor<double>& x : inputs) vars.push_back(tape.input(x.clone(), true));
  Var<double> y = f(vars);
  if (backward_seed) {
    tape.backward(y, *backward_seed);
    for (const Var<double>& v : vars) {
      Tensor<double> g = v.grad();
      grads->push_back(g.defined() ? g.clone() : Tensor<double>::zeros(v.shape()));
    }
  }
  return y.value().clone();
}

/// Checks f's gradients at `inputs` against central differences (see the file comment).
inline void gradcheck(const Function& f, const std::vector<Tensor<double>>& inputs, std::uint64_t seed = 7) {
  Rng rng(seed);
  const Tensor<double> y0 = evaluate(f, inputs, seed);
  const Tensor<double> r = rng.normal_tensor<double>(y0.shape());
  std::vector<Tensor<double>> analytic;
  evaluate(f, inputs, seed, &r, &analytic);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    REQUIRE(analytic[i].shape() == inputs[i].shape());
    for (std::int64_t j = 0; j < inputs[i].numel(); ++j) {
      std::vector<Tensor<double>> plus, minus;
      for (const Tensor<double>& x : inputs) {
        plus.push_back(x.clone());
        minus.push_back(x.clone());
      }
      plus[i][j] += kEps;
      minus[i][j] -= kEps;
      const double numeric = (dot(r, evaluate(f, plus, seed)) - dot(r, evaluate(f, minus, seed))) / (2 * kEps);
      const double a = analytic[i][j];
      INFO("input " << i << " (shape " << inputs[i].shape() << ") element " << j << ": analytic " << a
                    << ", numeric " << numeric);
      CHECK(std::abs(a - numeric) <= kAbsTol + kRelTol * std::abs(numeric));
    }
  }
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
