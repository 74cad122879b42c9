#pragma once
/// @file
/// gradcheck(): checks an op's backward against finite differences, for built-in ops (the test
/// suite runs it on every one) and for your own (docs/guide.md, "Writing your own op").
///
/// For f: inputs -> output it compares the gradient backward() computes for the scalar
/// L(x) = <R, f(x)> (R a fixed random tensor, so every output element matters) with central
/// differences (L(x + eps e_j) - L(x - eps e_j)) / (2 eps), element by element, and accepts
/// |analytic - numeric| <= atol + rtol |numeric|. Run it in double: with eps = 1e-6 the truncation
/// error of central differences is O(eps^2) and the rounding error O(1e-16 |L| / eps) =
/// O(1e-10 |L|), both well inside the default tolerances; in float the rounding error alone
/// (1e-7 / eps) would swamp any useful tolerance, so the helper takes Var<double> only.
///
/// It also runs f inside a checkpoint, with replay verification on, and requires the gradients
/// to equal the plain ones exactly (==): an op whose forward is not deterministic, or that writes
/// into its inputs, fails there with the op named, as it would in a checkpointed model.
///
/// Every evaluation records on a fresh tape with the same seed and the same inputs, so random ops
/// (dropout) draw the same numbers each time.

#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "remat/checkpoint/checkpoint.hpp"
#include "remat/core/rng.hpp"
#include "remat/core/tape.hpp"

namespace remat::check {

/// How gradcheck() compares.
struct GradcheckOptions {
  double eps = 1e-6;             ///< step of the central differences
  double atol = 1e-7;            ///< absolute tolerance
  double rtol = 1e-6;            ///< tolerance relative to the numeric gradient
  std::uint64_t seed = 7;        ///< the tapes' seed (random ops) and R's
  bool checkpoint = true;        ///< also require checkpointed gradients == plain ones
  std::size_t max_reported = 8;  ///< mismatches listed in message()
};

/// One gradient element outside the tolerance.
struct GradMismatch {
  std::size_t input = 0;     ///< which input
  std::int64_t element = 0;  ///< flat (row-major) index in that input
  double analytic = 0;       ///< what backward() computed
  double numeric = 0;        ///< what central differences give
};

/// What gradcheck() found. Converts to true when everything agreed.
struct GradcheckResult {
  std::size_t checked = 0;               ///< gradient elements compared
  std::vector<GradMismatch> mismatches;  ///< every element outside the tolerance
  std::string problem;                   ///< a failure that is not one element (checkpoint, replay)
  GradcheckOptions options;

  bool ok() const noexcept { return mismatches.empty() && problem.empty(); }
  explicit operator bool() const noexcept { return ok(); }

  /// A summary naming the first mismatches (empty when ok()).
  std::string message() const {
    std::ostringstream out;
    if (!problem.empty()) out << "gradcheck: " << problem << (mismatches.empty() ? "" : "; ");
    if (!mismatches.empty()) {
      out << "gradcheck: " << mismatches.size() << " of " << checked
          << " gradient elements differ from central differences (eps " << options.eps
          << ", accepted |a - n| <= " << options.atol << " + " << options.rtol << " |n|)";
      out.precision(10);
      for (std::size_t i = 0; i < mismatches.size() && i < options.max_reported; ++i) {
        const GradMismatch& m = mismatches[i];
        out << (i == 0 ? ": " : "; ") << "input " << m.input << " element " << m.element
            << ": analytic " << m.analytic << ", numeric " << m.numeric;
      }
    }
    return out.str();
  }
};

using VarList = std::vector<Var<double>>;
/// The function under test: the inputs as Vars (each requiring a gradient) to one output.
using Function = std::function<Var<double>(const VarList&)>;

namespace detail {

inline double dot(const Tensor<double>& a, const Tensor<double>& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a[i] * b[i];
  return s;
}

/// f's output on a fresh tape seeded with `seed`; with `backward_seed`, also runs backward (f
/// inside a verified checkpoint when `checkpointed`) and returns the inputs' gradients.
inline Tensor<double> evaluate(const Function& f, const std::vector<Tensor<double>>& inputs,
                               std::uint64_t seed, const Tensor<double>* backward_seed = nullptr,
                               std::vector<Tensor<double>>* grads = nullptr,
                               bool checkpointed = false) {
  Tape tape(TapeOptions{.seed = seed, .verify_replay = checkpointed});
  VarList vars;
  for (const Tensor<double>& x : inputs) vars.push_back(tape.input(x.clone(), true));
  Var<double> y;
  if (checkpointed) {
    CheckpointScope scope;
    y = f(vars);
  } else {
    y = f(vars);
  }
  if (!y.defined()) throw ArgumentError("gradcheck: the function returned an undefined Var");
  if (backward_seed) {
    tape.backward(y, *backward_seed);
    for (const Var<double>& v : vars) {
      Tensor<double> g = v.grad();
      grads->push_back(g.defined() ? g.clone() : Tensor<double>::zeros(v.shape()));
    }
  }
  return y.value().clone();
}

}  // namespace detail

/// Checks f's gradients at `inputs` against central differences, and (by default) that f
/// inside a checkpoint gives the same gradients bit for bit. See the file comment.
inline GradcheckResult gradcheck(const Function& f, const std::vector<Tensor<double>>& inputs,
                                 const GradcheckOptions& options = {}) {
  if (!(options.eps > 0) || !(options.atol >= 0) || !(options.rtol >= 0)) {
    throw ArgumentError(remat::detail::cat(
        "gradcheck: eps must be positive and the tolerances non-negative, got eps ", options.eps,
        ", atol ", options.atol, ", rtol ", options.rtol));
  }
  GradcheckResult result;
  result.options = options;
  Rng rng(options.seed);
  const Tensor<double> y0 = detail::evaluate(f, inputs, options.seed);
  const Tensor<double> r = rng.normal_tensor<double>(y0.shape());
  std::vector<Tensor<double>> analytic;
  detail::evaluate(f, inputs, options.seed, &r, &analytic);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    for (std::int64_t j = 0; j < inputs[i].numel(); ++j) {
      std::vector<Tensor<double>> plus, minus;
      for (const Tensor<double>& x : inputs) {
        plus.push_back(x.clone());
        minus.push_back(x.clone());
      }
      plus[i][j] += options.eps;
      minus[i][j] -= options.eps;
      const double numeric = (detail::dot(r, detail::evaluate(f, plus, options.seed)) -
                              detail::dot(r, detail::evaluate(f, minus, options.seed))) /
                             (2 * options.eps);
      const double a = analytic[i][j];
      ++result.checked;
      // written so that a NaN on either side is a mismatch
      if (!(std::abs(a - numeric) <= options.atol + options.rtol * std::abs(numeric))) {
        result.mismatches.push_back(GradMismatch{i, j, a, numeric});
      }
    }
  }
  if (options.checkpoint) {
    std::vector<Tensor<double>> replayed;
    try {
      detail::evaluate(f, inputs, options.seed, &r, &replayed, true);
      for (std::size_t i = 0; i < inputs.size() && result.problem.empty(); ++i) {
        for (std::int64_t j = 0; j < inputs[i].numel(); ++j) {
          if (!(replayed[i][j] == analytic[i][j])) {
            result.problem =
                remat::detail::cat("inside a checkpoint, the gradient of input ", i, " element ", j,
                                   " is ", replayed[i][j], " instead of ", analytic[i][j],
                                   " (ops must be deterministic and must not write into their "
                                   "inputs or keep state between calls)");
            break;
          }
        }
      }
    } catch (const ReplayError& e) {
      result.problem = remat::detail::cat(
          "inside a checkpoint, the replay differed from the forward pass (", e.what(), ")");
    }
  }
  return result;
}

/// gradcheck(), throwing a GradcheckError with its message() when the check fails: for programs
/// and test frameworks that want an exception.
inline void require_gradients(const Function& f, const std::vector<Tensor<double>>& inputs,
                              const GradcheckOptions& options = {}) {
  const GradcheckResult result = gradcheck(f, inputs, options);
  if (!result.ok()) throw GradcheckError(result.message());
}

}  // namespace remat::check
