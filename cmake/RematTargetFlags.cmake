# Flags for remat's own executables (tests, examples, benchmarks). Nothing here touches the
# remat target or global flags: consumers choose their own.
include_guard(GLOBAL)
include(CheckCXXSourceRuns)

# No -march by default: remat's own targets build as users build remat (plain flags), so the
# tests exercise the run-time instruction-set dispatch (core/vector_kernels.hpp) and the
# benchmarks measure what users get. REMAT_ARCH=x86-64-v3, native, ... builds for a given CPU
# (checked to run here: the tests must be able to run).
set(REMAT_ARCH "" CACHE STRING "-march value for remat's own targets (empty: compiler default, as users build)")
set(REMAT_ARCH_FLAGS "")
if(REMAT_ARCH)
  set(CMAKE_REQUIRED_FLAGS "-march=${REMAT_ARCH}")
  check_cxx_source_runs([[
    int main() { return 0; }]] REMAT_ARCH_RUNS_HERE_${REMAT_ARCH})
  unset(CMAKE_REQUIRED_FLAGS)
  if(REMAT_ARCH_RUNS_HERE_${REMAT_ARCH})
    set(REMAT_ARCH_FLAGS "-march=${REMAT_ARCH}")
  else()
    message(WARNING "remat: -march=${REMAT_ARCH} does not build or run here; building without it")
  endif()
endif()

option(REMAT_SANITIZE "Build remat's own targets with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
set(REMAT_SANITIZE_FLAGS "")
if(REMAT_SANITIZE)
  set(REMAT_SANITIZE_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  # GCC 12 at -O1 with the sanitizers' instrumentation warns "may be used uninitialized" inside
  # libstdc++'s own std::regex and std::function; the Release build keeps the warning.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND REMAT_SANITIZE_FLAGS -Wno-maybe-uninitialized)
  endif()
endif()

# Warnings are errors in CI (tools/dev test). -Wconversion is not in the set yet: a syntax-only
# pass over every file found 3 warnings, but the templates the tests instantiate hold more.
option(REMAT_WERROR "Treat warnings in remat's own targets as errors" OFF)
set(REMAT_WERROR_FLAGS "")
if(REMAT_WERROR)
  set(REMAT_WERROR_FLAGS -Werror)
endif()

# With REMAT_PRECOMPILE_HEADERS, every target linking remat::remat would build its own copy of
# the precompiled header: twenty copies of 13 s of CPU each, a sixth of CI's Release build.
# remat's own targets share the one remat_pch_host builds. GCC checks at every use that the header
# was built with flags that fit (-Winvalid-pch, an error under REMAT_WERROR); definitions the
# headers never read (the tests' data paths) may differ.
if(REMAT_PRECOMPILE_HEADERS)
  file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/remat_pch_host.cpp"
    CONTENT "// builds the precompiled header remat's own targets share (RematTargetFlags.cmake)\n")
  add_library(remat_pch_host OBJECT "${CMAKE_CURRENT_BINARY_DIR}/remat_pch_host.cpp")
endif()

function(remat_configure_target target)
  target_link_libraries(${target} PRIVATE remat::remat)
  if(TARGET remat_pch_host AND NOT target STREQUAL "remat_pch_host")
    target_precompile_headers(${target} REUSE_FROM remat_pch_host)
  endif()
  # Designated initializers that omit defaulted fields (TapeOptions{.seed = 1}) are the intended
  # style; GCC 12's -Wmissing-field-initializers flags them anyway.
  # GCC 12 reports `"text" + std::string` at -O3 as an overlapping memcpy (its bug 105329): off.
  # Clang's -Wconversion includes -Wsign-conversion, GCC's does not: the set is GCC's on both.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                         -Wno-missing-field-initializers
                         $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict>
                         $<$<CXX_COMPILER_ID:Clang>:-Wno-sign-conversion>
                         ${REMAT_WERROR_FLAGS} ${REMAT_ARCH_FLAGS} ${REMAT_SANITIZE_FLAGS})
  target_link_options(${target} PRIVATE ${REMAT_SANITIZE_FLAGS})
endfunction()

if(TARGET remat_pch_host)
  remat_configure_target(remat_pch_host)
endif()
