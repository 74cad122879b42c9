#pragma once
// Checks for CLI11 flags shared by the examples and benchmarks. CLI11's own PositiveNumber lets
// "nan" through and its NonNegativeNumber prints a range of 309 digits; these say what they want
// in words and reject NaN and infinity.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

namespace flags {

namespace detail {

inline CLI::Validator number_check(bool allow_zero, const char* name) {
  return CLI::Validator(
      [allow_zero](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok =
            !text.empty() && *end == '\0' && std::isfinite(v) && (allow_zero ? v >= 0 : v > 0);
        if (ok) return {};
        return "'" + text + "' is not " +
               (allow_zero ? "a finite number >= 0" : "a finite number > 0");
      },
      name);
}

}  // namespace detail

/// A finite number > 0.
inline const CLI::Validator positive = detail::number_check(false, "POSITIVE");
/// A finite number >= 0.
inline const CLI::Validator non_negative = detail::number_check(true, "NON-NEGATIVE");

/// Parses argv into `app`; on --help prints the flags and exits 0, on a bad or unknown flag
/// prints the error and the list of valid flags and exits non-zero.
inline void parse(CLI::App& app, int argc, char** argv) {
  app.failure_message(CLI::FailureMessage::help);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
}

/// parse() for programs that must return from main to end cleanly (MPI programs, whose
/// Environment finalizes MPI when it goes out of scope): returns -1 when the flags parsed, or the
/// exit code after --help or a bad flag. Only a process with `print` set prints (rank 0), so
/// that N ranks do not print N copies.
inline int parse_or_exit_code(CLI::App& app, int argc, char** argv, bool print) {
  app.failure_message(CLI::FailureMessage::help);
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    std::ostringstream quiet;
    return print ? app.exit(e) : app.exit(e, quiet, quiet);
  }
}

}  // namespace flags
