#pragma once
/// @file
/// What the CPU can do, asked of the CPU itself (cpuid through the compiler's builtins), never
/// of a table of CPU models: new models keep appearing and tables fall behind (Debian 12's
/// OpenBLAS runs SSE3 kernels on recent Xeons it does not recognise; BLIS 0.9 runs its generic
/// kernels on AMD's Zen 5). The answers name the CPU beside every figure remat's benchmarks print.

#include <atomic>
#include <cstring>
#include <string>

#include "remat/core/error.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define REMAT_X86 1
#include <cpuid.h>
#else
#define REMAT_X86 0
#endif

namespace remat {

/// Vector instruction sets remat's kernels distinguish, in increasing order.
enum class Isa {
  baseline,  ///< what the compiler targets without -march (SSE2 on x86-64)
  avx2,      ///< AVX2 and FMA (x86-64-v3)
  avx512,    ///< AVX-512 F, CD, BW, DQ, VL (x86-64-v4)
};

inline const char* to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    case Isa::baseline:
      break;
  }
  return "baseline";
}

namespace detail {

/// The widest Isa this CPU and its operating system support. GCC's and Clang's
/// __builtin_cpu_supports also check that the OS saves the wider registers (XCR0).
inline Isa detect_isa() noexcept {
#if REMAT_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return Isa::avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
#endif
  return Isa::baseline;
}

}  // namespace detail

/// The widest instruction set this CPU offers remat (detected once per process).
inline Isa cpu_isa() noexcept {
  static const Isa isa = detail::detect_isa();
  return isa;
}

namespace detail {

inline std::atomic<Isa>& active_isa_setting() noexcept {
  static std::atomic<Isa> isa{cpu_isa()};
  return isa;
}

}  // namespace detail

/// The instruction set remat's dispatched kernels run (core/vector_kernels.hpp): cpu_isa()
/// unless set_isa chose a narrower one.
inline Isa active_isa() noexcept {
  return detail::active_isa_setting().load(std::memory_order_relaxed);
}

/// Makes remat's dispatched kernels run `isa`, for tests and benchmarks that measure each path
/// on one machine. Throws ArgumentError if this CPU does not offer it.
inline void set_isa(Isa isa) {
  if (isa > cpu_isa()) {
    throw ArgumentError(detail::cat("set_isa: this CPU offers at most ", to_string(cpu_isa()),
                                    ", not ", to_string(isa)));
  }
  detail::active_isa_setting().store(isa, std::memory_order_relaxed);
}

/// The CPU's own name (cpuid's brand string, e.g. "AMD EPYC 9R45 96-Core Processor"), or
/// "unknown CPU" where it has none.
inline std::string cpu_name() {
#if REMAT_X86
  unsigned regs[12] = {};
  unsigned top = __get_cpuid_max(0x80000000u, nullptr);
  if (top >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i)
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                  &regs[4 * i + 3]);
    char text[sizeof regs + 1] = {};
    std::memcpy(text, regs, sizeof regs);
    std::string name(text);
    const auto first = name.find_first_not_of(' ');  // some brand strings are padded
    const auto last = name.find_last_not_of(' ');
    if (first != std::string::npos) return name.substr(first, last - first + 1);
  }
#endif
  return "unknown CPU";
}

}  // namespace remat
