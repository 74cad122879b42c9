#pragma once
// Runs test code in a child process, for failures that would otherwise take the test binary down
// or hang it: a signal (SIGBUS from a truncated memory map) or a blocking open (a FIFO).

#include <catch2/catch.hpp>

#include <remat/core/error.hpp>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace remat::test {

/// Runs `fn` (returning the status to exit with) in a child process killed after `seconds`
/// (SIGALRM), and returns its exit status, or 128 + the signal that ended it; an exception out
/// of `fn` exits with 125.
template <class Fn>
int run_in_child(Fn&& fn, unsigned seconds = 20) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(seconds);
    int status = 125;
    try {
      status = fn();
    } catch (...) {
    }
    std::_Exit(status);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// 0 when `fn` throws a remat::Error whose message holds every fragment, 1 when it throws
/// nothing, 2 when the message misses a fragment (run it in a child: see run_in_child).
template <class Fn>
int error_status(Fn&& fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
  } catch (const remat::Error& e) {
    const std::string m = e.what();
    for (const char* f : fragments) {
      if (m.find(f) == std::string::npos) return 2;
    }
    return 0;
  }
  return 1;
}

}  // namespace remat::test
