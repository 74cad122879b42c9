# Flags for remat's own executables (tests, examples, benchmarks). Nothing here touches the
# remat target or global flags: consumers choose their own.
include_guard(GLOBAL)
include(CheckCXXSourceRuns)

# x86-64-v3 (AVX2 + FMA) was measured faster than -march=native for Eigen's kernels on this
# project's AMD machines (docs/benchmarks.md); use it when both compiler and CPU support it.
set(REMAT_ARCH "x86-64-v3" CACHE STRING "-march value for remat's own targets (empty: compiler default)")
set(REMAT_ARCH_FLAGS "")
if(REMAT_ARCH)
  set(CMAKE_REQUIRED_FLAGS "-march=${REMAT_ARCH}")
  check_cxx_source_runs([[
    int main() {
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 0 : 1;
    }]] REMAT_ARCH_RUNS_HERE)
  unset(CMAKE_REQUIRED_FLAGS)
  if(REMAT_ARCH_RUNS_HERE)
    set(REMAT_ARCH_FLAGS "-march=${REMAT_ARCH}")
  endif()
endif()

option(REMAT_SANITIZE "Build remat's own targets with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
set(REMAT_SANITIZE_FLAGS "")
if(REMAT_SANITIZE)
  set(REMAT_SANITIZE_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
endif()

function(remat_configure_target target)
  target_link_libraries(${target} PRIVATE remat::remat)
  # Designated initializers that omit defaulted fields (TapeOptions{.seed = 1}) are the intended
  # style; GCC 12's -Wmissing-field-initializers flags them anyway.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wno-missing-field-initializers
                         ${REMAT_ARCH_FLAGS} ${REMAT_SANITIZE_FLAGS})
  target_link_options(${target} PRIVATE ${REMAT_SANITIZE_FLAGS})
endfunction()
