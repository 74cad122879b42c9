#pragma once
/// @file
/// The error hierarchy. Every failure remat reports is a remat::Error whose message names the
/// operation and the shapes, values or positions involved, so the message alone says what to fix.

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

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

/// A bad argument: a value, size or option the function cannot take (a negative rate, a dropout
/// of 1, an undefined tensor, options that exclude each other). The message names the function
/// or flag and the value. Shapes that do not fit are ShapeErrors, indices out of range
/// IndexErrors.
class ArgumentError : public Error {
 public:
  using Error::Error;
};

/// A valid call at the wrong time or in the wrong place: backward twice, a Var used after its
/// tape ended, a tape used from another thread, adapters applied twice, ...
class UsageError : public Error {
 public:
  using Error::Error;
};

/// An internal invariant that does not hold (REMAT_ASSERT): a bug in remat, not in the caller.
class InternalError : public Error {
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

/// REMAT_ASSERT's message: "internal error at file:line: what (condition does not hold)".
inline std::string internal_error_message(std::string_view condition, const char* file, int line,
                                          const std::string& what) {
  std::string out = cat("internal error at ", file, ":", line, ": ", what);
  if (condition != "false") out += cat(" (", condition, " does not hold)");
  return out;
}

}  // namespace detail
}  // namespace remat

/// Checks an internal invariant; when it does not hold, throws an InternalError naming the place,
/// what follows (printable parts, as detail::cat takes them) and the condition. Always on: the
/// checks guard rare paths, and a wrong result must never pass silently. REMAT_ASSERT(false, ...)
/// marks a path that must not be reached.
#define REMAT_ASSERT(condition, ...)                                           \
  do {                                                                         \
    if (!(condition)) {                                                        \
      throw ::remat::InternalError(::remat::detail::internal_error_message(    \
          #condition, __FILE__, __LINE__, ::remat::detail::cat(__VA_ARGS__))); \
    }                                                                          \
  } while (false)
