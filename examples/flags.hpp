#pragma once
// What the examples and benchmarks share around their flags:
// - checks for CLI11 flags (CLI11's own PositiveNumber lets "nan" through and its
//   NonNegativeNumber prints a range of 309 digits; these say what they want in words and reject
//   NaN and infinity; CLI11 reads "-1" into an unsigned flag as 2^64 - 1, `count` refuses it);
// - checks of the paths flags name, before anything is read or computed: an input must be a
//   regular file (a FIFO would block the program forever), an output must not be a directory or
//   a FIFO and its folder must exist;
// - the machine's memory and `fits()`, to refuse a run that cannot fit before allocating it;
// - a save policy from its text (`--policy`, `--checkpoint policy:...`);
// - `run_main()`, every program's error boundary: any exception ends the program with one line
//   on stderr and exit status 1, never a signal.
#include <CLI/CLI.hpp>
#include <remat/core/error.hpp>
#include <remat/core/precision.hpp>
#include <remat/core/save_policy.hpp>
#include <remat/ops/op_types.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace flags {

namespace detail {

inline CLI::Validator number_check(bool allow_zero, const char* name) {
  return CLI::Validator(
      [allow_zero](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok =
            !text.empty() && *end == '\0' && std::isfinite(v) && (allow_zero ? v >= 0 : v > 0);
        // CLI11 reads an integer past 2^63 - 1 into a 64-bit flag as 2^63 - 1: refused here
        errno = 0;
        std::strtoll(text.c_str(), &end, 10);
        if (*end == '\0' && errno == ERANGE) return "'" + text + "' is out of range (> 2^63 - 1)";
        if (ok) return {};
        return "'" + text + "' is not " +
               (allow_zero ? "a finite number >= 0" : "a finite number > 0");
      },
      name);
}

inline std::string file_type(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "a file";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  return "neither a file nor a directory";
}

/// The folder a path is in ("." for a bare name).
inline std::string parent_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

/// "" when `dir` is an existing directory, else why not.
inline std::string check_directory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "'" + dir + "': " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "'" + dir + "' is " + file_type(st) + ", not a directory";
  return {};
}

}  // namespace detail

/// A finite number > 0.
inline const CLI::Validator positive = detail::number_check(false, "POSITIVE");
/// A finite number >= 0.
inline const CLI::Validator non_negative = detail::number_check(true, "NON-NEGATIVE");

/// An integer >= 0 written in decimal digits only (for unsigned flags: seeds, counts).
inline const CLI::Validator count(
    [](std::string& text) -> std::string {
      const bool digits = !text.empty() && text.size() <= 20 &&
                          text.find_first_not_of("0123456789") == std::string::npos;
      if (digits && (text.size() < 20 || text <= "18446744073709551615")) return {};
      return "'" + text + "' is not an integer in [0, 2^64 - 1]";
    },
    "UINT");

/// Most worker threads a flag may ask for: more would only cost memory (a stack each) and time.
inline constexpr long kMaxThreads = 1024;

/// A number of worker threads: an integer in [1, kMaxThreads], or 0 too (`allow_zero`: the
/// library's default).
inline CLI::Validator thread_count(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& text) -> std::string {
        char* end = nullptr;
        const long v = std::strtol(text.c_str(), &end, 10);
        if (!text.empty() && *end == '\0' && v >= (allow_zero ? 0 : 1) && v <= kMaxThreads)
          return {};
        return "'" + text + "' is not an integer in [" + (allow_zero ? "0" : "1") + ", " +
               std::to_string(kMaxThreads) + "]";
      },
      "THREADS");
}

/// A probability of dropping: a finite number in [0, 1) (1 would drop everything and scale the
/// rest by 1/0).
inline const CLI::Validator probability(
    [](std::string& text) -> std::string {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (!text.empty() && *end == '\0' && v >= 0 && v < 1) return {};
      return "'" + text + "' is not a number in [0, 1)";
    },
    "[0,1)");

/// A text that is not empty (an empty prompt would be answered from nothing, silently).
inline const CLI::Validator non_empty(
    [](std::string& text) -> std::string { return text.empty() ? "an empty text" : ""; }, "TEXT");

/// A date as a Llama 3.1+ chat template writes it, strftime's "%d %b %Y": "04 Dec 2026" (two
/// digits, an English month's three letters, four digits). Another form would render text the
/// model never saw in training.
inline const CLI::Validator chat_date(
    [](std::string& text) -> std::string {
      static constexpr std::string_view kMonths = "JanFebMarAprMayJunJulAugSepOctNovDec";
      const auto digits = [&](std::size_t at, std::size_t n) {
        return std::all_of(text.begin() + std::ptrdiff_t(at), text.begin() + std::ptrdiff_t(at + n),
                           [](unsigned char c) { return std::isdigit(c) != 0; });
      };
      if (text.size() == 11 && digits(0, 2) && text[2] == ' ' && text[6] == ' ' && digits(7, 4)) {
        const std::size_t month = kMonths.find(std::string_view(text).substr(3, 3));
        const int day = std::stoi(text.substr(0, 2));
        if (month != std::string_view::npos && month % 3 == 0 && day >= 1 && day <= 31) return {};
      }
      return "'" + text + "' is not a date as \"04 Dec 2026\" (day, English month, year)";
    },
    "DATE");

/// A precision a step computes in: f32 or bf16 (remat::parse_precision's names).
inline const CLI::Validator precision_name(
    [](std::string& text) -> std::string {
      try {
        remat::parse_precision(text, "--dtype");
        return {};
      } catch (const remat::ArgumentError& e) {
        return e.what();
      }
    },
    "f32|bf16");

/// A file to read: it exists and is a regular file (or a link to one). A FIFO would block the
/// program in open() until someone writes to it.
inline const CLI::Validator input_file(
    [](std::string& path) -> std::string {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0)
        return "cannot read '" + path + "': " + std::strerror(errno);
      if (!S_ISREG(st.st_mode))
        return "'" + path + "' is " + detail::file_type(st) + ", not a file";
      return {};
    },
    "FILE");

/// A folder to read: it exists and is a directory.
inline const CLI::Validator input_dir(detail::check_directory, "DIR");

/// A file or a folder to read (a FIFO or a device is neither).
inline const CLI::Validator input_file_or_dir(
    [](std::string& path) -> std::string {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0)
        return "cannot read '" + path + "': " + std::strerror(errno);
      if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        return "'" + path + "' is " + detail::file_type(st) + ", not a file or a folder";
      return {};
    },
    "PATH");

/// A file to write ('' for none): not an existing directory, FIFO or device, in an existing
/// folder. Checked when the flags are parsed, so that a long run does not fail at its end.
inline const CLI::Validator output_file(
    [](std::string& path) -> std::string {
      if (path.empty()) return {};
      struct stat st {};
      if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
        return "cannot write '" + path + "': it is " + detail::file_type(st);
      const std::string why = detail::check_directory(detail::parent_of(path));
      return why.empty() ? why : "cannot write '" + path + "': " + why;
    },
    "FILE");

/// A folder to write ('' for none): an existing directory, or a name in an existing folder.
inline const CLI::Validator output_dir(
    [](std::string& path) -> std::string {
      if (path.empty()) return {};
      struct stat st {};
      if (::stat(path.c_str(), &st) == 0)
        return S_ISDIR(st.st_mode) ? ""
                                   : "cannot write into '" + path + "': it is " +
                                         detail::file_type(st) + ", not a folder";
      const std::string why = detail::check_directory(detail::parent_of(path));
      return why.empty() ? why : "cannot create '" + path + "': " + why;
    },
    "DIR");

/// A number as the shortest text that reads back to the same value ("0.1", not 0.1000...01):
/// what a run records of its flags and figures, to compare or read back exactly.
inline std::string exact_text(double value) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return error == std::errc() ? std::string(buffer, end) : std::to_string(value);
}

/// Bytes as a person reads them: "512 B", "3.7 TiB".
inline std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char out[64];
  if (bytes >= 1e6)
    std::snprintf(out, sizeof out, "%.3g %s", bytes, units[u]);
  else
    std::snprintf(out, sizeof out, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return out;
}

/// A save policy from its text: "save_matmuls", "save_ops:a,b,..." or "recompute_ops:a,b,..."
/// (op names as op_type_named() knows them). An unknown op name is op_type_named()'s PlanError
/// (it lists the built-in ops); any other text, an ArgumentError naming `flag`.
inline remat::SavePolicy save_policy(const std::string& spec, const std::string& flag) {
  if (spec == "save_matmuls") return remat::save_matmuls();
  const std::size_t colon = spec.find(':');
  remat::OpTypes ops;
  if (colon != std::string::npos) {
    std::stringstream in(spec.substr(colon + 1));
    for (std::string n; std::getline(in, n, ',');) {
      if (!n.empty()) ops.push_back(remat::op_type_named(n, flag));
    }
  }
  const std::string kind = spec.substr(0, colon);
  if (!ops.empty() && kind == "save_ops") return remat::save_ops(ops);
  if (!ops.empty() && kind == "recompute_ops") return remat::recompute_ops(ops);
  throw remat::ArgumentError(remat::detail::cat(
      flag, ": '", spec,
      "' is not save_matmuls, save_ops:a,b,... or recompute_ops:a,b,... (with op names)"));
}

/// The memory this process may use: the machine's (MemTotal, or sysconf's physical pages), or
/// its control group's limit when that is lower (a container).
inline double machine_memory() {
  double total = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kib = 0;
    meminfo >> kib;
    if (key == "MemTotal:") total = kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (total <= 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    total = pages > 0 && page > 0 ? double(pages) * double(page)
                                  : std::numeric_limits<double>::infinity();
  }
  for (const char* limit_file :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(limit_file);
    double limit = 0;
    if (in >> limit && limit > 0) total = std::min(total, limit);  // "max" reads as no number
  }
  return total;
}

/// Refuses (ArgumentError) what needs more than `memory` bytes: "PROGRAM: WHAT needs 3.7 TiB; this
/// machine has 24.0 GiB". Called with the estimate before anything that large is allocated.
inline void fits(const char* program, const std::string& what, double bytes,
                 double memory = machine_memory()) {
  if (!(bytes <= memory)) {  // NaN too
    throw remat::ArgumentError(std::string(program) + ": " + what + " needs " + human_bytes(bytes) +
                               "; this machine has " + human_bytes(memory));
  }
}

namespace detail {

inline const char*& program_name() {
  static const char* name = "program";
  return name;
}

/// One line for the exception being handled: remat's own messages as they are (prefixed with the
/// program's name unless they start with it), the standard library's with what they mean.
inline std::string describe_current_exception(const char* program) {
  const std::string prefix = std::string(program) + ": ";
  try {
    throw;
  } catch (const remat::Error& e) {
    const std::string what = e.what();
    return what.rfind(prefix, 0) == 0 ? what : prefix + what;
  } catch (const std::bad_alloc&) {
    return prefix + "out of memory (std::bad_alloc): a size is larger than this machine holds";
  } catch (const std::filesystem::filesystem_error& e) {
    return prefix + e.what();
  } catch (const std::system_error& e) {  // std::thread's constructor, say
    return prefix + "system error: " + e.what();
  } catch (const std::invalid_argument& e) {
    return prefix + "invalid value (" + e.what() + ")";
  } catch (const std::out_of_range& e) {
    return prefix + "value out of range (" + e.what() + ")";
  } catch (const std::exception& e) {
    return prefix + e.what();
  } catch (...) {
    return prefix + "unknown error";
  }
}

/// std::terminate's handler: an exception that escapes a worker thread or a noexcept function
/// still ends the program with one line and exit status 1, not with SIGABRT.
[[noreturn]] inline void on_terminate() {
  const std::string line = std::current_exception() ? describe_current_exception(program_name())
                                                    : std::string(program_name()) + ": terminated";
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

}  // namespace detail

/// Runs a program's body inside its error boundary: `body()`'s return value is the exit status;
/// any exception it throws (remat::Error, std::bad_alloc, std::invalid_argument, a failed thread
/// creation, anything) is reported as one line on stderr, "PROGRAM: what happened", and the exit
/// status is `fail(line)`: by default the line is printed and 1 returned (an MPI program passes
/// one that stops the other ranks too). An exception escaping elsewhere (a worker thread) ends
/// the program with one line and status 1 through std::terminate.
///
///     int main(int argc, char** argv) {
///       return flags::run_main("my_program", [&] { ... return 0; });
///     }
template <class Body, class Fail>
int run_main(const char* program, Body&& body, Fail&& fail) {
  detail::program_name() = program;
  std::set_terminate(detail::on_terminate);
  std::string line;
  try {
    return std::forward<Body>(body)();
  } catch (...) {
    line = detail::describe_current_exception(program);
  }
  std::fflush(stdout);  // the progress printed so far, before the error
  return std::forward<Fail>(fail)(line);
}

template <class Body>
int run_main(const char* program, Body&& body) {
  return run_main(program, std::forward<Body>(body), [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
    return 1;
  });
}

/// One line for a bad or unknown flag: the program, CLI11's message and the flags the program
/// takes, so that the error reads like every other failure (run_main) and still says what to type.
inline std::string parse_error_line(const CLI::App& app, const CLI::ParseError& e) {
  std::string line = std::filesystem::path(app.get_name()).filename().string();
  line += ": ";
  line += e.what();
  line += "; flags:";
  for (const CLI::Option* option : app.get_options()) {
    const std::string name = option->get_name();
    if (!name.empty()) line += " " + name;  // empty: hidden
  }
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

/// What parse() and parse_or_exit_code() do with a ParseError: --help prints the flags and gives
/// 0; anything else prints parse_error_line() (when `print`) and gives 1, as every other failure
/// does (run_main), not CLI11's own codes (105 for a bad value, 109 for an unknown flag).
inline int report_parse_error(const CLI::App& app, const CLI::ParseError& e, bool print) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
    std::ostringstream quiet;
    return print ? app.exit(e) : app.exit(e, quiet, quiet);
  }
  if (print) std::fprintf(stderr, "%s\n", parse_error_line(app, e).c_str());
  return 1;
}

/// Parses argv into `app`; on --help prints the flags and exits 0, on a bad or unknown flag
/// prints one line (the error and the valid flags) and exits non-zero.
inline void parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(report_parse_error(app, e, true));
  }
}

/// parse() for programs that must return from main to end cleanly (MPI programs, whose
/// Environment finalizes MPI when it goes out of scope): returns -1 when the flags parsed, or the
/// exit code after --help or a bad flag. Only a process with `print` set prints (rank 0), so
/// that N ranks do not print N copies.
inline int parse_or_exit_code(CLI::App& app, int argc, char** argv, bool print) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    return report_parse_error(app, e, print);
  }
}

}  // namespace flags
