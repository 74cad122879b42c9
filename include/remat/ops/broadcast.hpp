#pragma once
/// @file
/// Bias-style broadcasting for binary ops: two operands of the same shape, or one whose shape
/// (leading 1s ignored) is a suffix of the other's, like a bias (C) against activations (B, T, C).
/// The smaller operand repeats over the leading axes of the larger.

#include "remat/core/error.hpp"
#include "remat/core/shape.hpp"

namespace remat::detail {

struct Broadcast {
  Shape out;               ///< shape of the result: the larger operand's
  std::int64_t outer = 1;  ///< how many times the smaller operand repeats
  std::int64_t inner = 0;  ///< elements of the smaller operand
  int repeated = -1;       ///< which operand repeats (0 or 1), -1 when the shapes are equal
};

/// Whether `small` (leading 1s dropped) equals the trailing axes of `big`.
inline bool is_suffix(const Shape& small, const Shape& big) noexcept {
  int lead = 0;
  while (lead < small.rank() && small[lead] == 1) ++lead;
  const int rank = small.rank() - lead;
  if (rank > big.rank()) return false;
  for (int i = 0; i < rank; ++i) {
    if (small[lead + i] != big[big.rank() - rank + i]) return false;
  }
  return true;
}

inline Broadcast broadcast(const char* op, const Shape& a, const Shape& b) {
  Broadcast bc;
  if (a == b) {
    bc.out = a;
    bc.inner = a.numel();
    return bc;
  }
  const bool b_repeats = b.numel() <= a.numel() && is_suffix(b, a);
  const bool a_repeats = !b_repeats && is_suffix(a, b);
  if (!a_repeats && !b_repeats) {
    throw ShapeError(
        cat(op, ": shapes ", a, " and ", b,
            " do not broadcast; one operand's shape must equal the trailing axes of the other's "
            "(like a bias of shape (C) against (N, C))"));
  }
  const Shape& big = b_repeats ? a : b;
  const Shape& small = b_repeats ? b : a;
  bc.out = big;
  bc.inner = small.numel();
  bc.outer = bc.inner == 0 ? 0 : big.numel() / bc.inner;
  bc.repeated = b_repeats ? 1 : 0;
  return bc;
}

}  // namespace remat::detail
