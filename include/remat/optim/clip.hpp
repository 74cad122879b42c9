#pragma once
/// @file
/// Global-norm gradient clipping: scales every gradient by max_norm / (norm + 1e-6) when the L2
/// norm of all of them together exceeds max_norm (PyTorch's clip_grad_norm_, epsilon included).

#include <cmath>
#include <vector>

#include "remat/core/parameter.hpp"
#include "remat/core/shape_only.hpp"

namespace remat::optim {

/// Clips the parameters' gradients to a global L2 norm of at most max_norm (parameters without a
/// gradient are skipped) and returns the norm before clipping, summed in double in a fixed order.
/// In a shape-only run (core/shape_only.hpp) the gradients have no values: it clips nothing and
/// returns 0 (clipping allocates nothing, so the run's counts are a real step's).
template <class T>
double clip_grad_norm(const std::vector<Parameter<T>>& params, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    throw ArgumentError(
        detail::cat("clip_grad_norm: max_norm must be positive and finite, got ", max_norm));
  }
  if (is_shape_only()) return 0;
  double sum = 0;
  for (const Parameter<T>& p : params) {
    const Tensor<T> g = p.grad();
    if (!g.defined()) continue;
    for (const T v : g) sum += double(v) * double(v);
  }
  const double norm = std::sqrt(sum);
  if (norm > max_norm) {
    const T scale = static_cast<T>(max_norm / (norm + 1e-6));
    for (const Parameter<T>& p : params) {
      Tensor<T> g = p.grad();  // shares the buffer: scaling it scales the parameter's gradient
      if (g.defined()) g.array() *= scale;
    }
  }
  return norm;
}

}  // namespace remat::optim
