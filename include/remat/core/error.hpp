#pragma once
/// @file
/// The error hierarchy. Every failure remat reports is a remat::Error whose message names the
/// operation and the shapes, values or positions involved, so the message alone says what to fix.

#include <sstream>
#include <stdexcept>
#include <string>

namespace remat {

/// Base of every exception remat throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Operands whose shapes do not fit the operation (broadcasting, matmul, reshape, ...).
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// An index or integer argument out of its range (embedding ids, class targets, axes).
class IndexError : public Error {
 public:
  using Error::Error;
};

/// A valid call at the wrong time: backward twice, a Var used after its tape ended, ...
class UsageError : public Error {
 public:
  using Error::Error;
};

/// A checkpoint segment whose replay did not reproduce its forward pass bit for bit.
class ReplayError : public Error {
 public:
  using Error::Error;
};

/// A NaN or infinity found by the anomaly mode.
class NumericError : public Error {
 public:
  using Error::Error;
};

/// A gradient that disagrees with finite differences, or that changes inside a checkpoint
/// (check::require_gradients, for your own ops).
class GradcheckError : public Error {
 public:
  using Error::Error;
};

/// A planner asked for something no plan can give (for example a budget below the smallest
/// feasible peak).
class PlanError : public Error {
 public:
  using Error::Error;
};

/// A file that cannot be read or written, or whose contents are malformed.
class IoError : public Error {
 public:
  using Error::Error;
};

namespace detail {

/// Concatenates anything printable into one message.
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace detail
}  // namespace remat
