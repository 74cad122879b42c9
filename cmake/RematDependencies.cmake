# Finds what remat's headers need and attaches it to a target as INTERFACE requirements.
# Used by the top-level CMakeLists.txt and, after installation, by remat-config.cmake, so that
# add_subdirectory and find_package consumers get exactly the same dependencies.
include_guard(GLOBAL)
include(CMakeFindDependencyMacro)

find_package(Eigen3 3.4 REQUIRED NO_MODULE)

if(REMAT_USE_BLAS)
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  unset(BLA_VENDOR)
  if(BLAS_FOUND)
    message(STATUS "remat: GEMMs run through OpenBLAS (${BLAS_LIBRARIES})")
  else()
    message(STATUS "remat: OpenBLAS not found; GEMMs run through Eigen")
  endif()
endif()

find_package(Threads REQUIRED)  # remat's own pool for element-wise loops

# Only remat/io needs a JSON parser (for safetensors headers); without it the rest works.
find_package(nlohmann_json 3 QUIET)

# remat/hub (tokenizers) needs PCRE2 (regexes with Unicode properties) and ICU (Unicode
# normalization forms), through pkg-config; without them remat builds without remat::hub.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  # GLOBAL: a parent project that add_subdirectory()s remat links remat::hub from its own scope
  pkg_check_modules(REMAT_PCRE2 QUIET IMPORTED_TARGET GLOBAL libpcre2-8)
  pkg_check_modules(REMAT_ICU QUIET IMPORTED_TARGET GLOBAL icu-uc)
endif()

# remat::remat takes them as INTERFACE; the compiled remat_instances library (REMAT_PRECOMPILE_HEADERS)
# as PUBLIC, the optional second argument.
function(remat_link_dependencies target)
  set(scope INTERFACE)
  if(ARGC GREATER 1)
    set(scope ${ARGV1})
  endif()
  target_link_libraries(${target} ${scope} Eigen3::Eigen)
  if(REMAT_USE_BLAS AND BLAS_FOUND)
    target_link_libraries(${target} ${scope} BLAS::BLAS)
    target_compile_definitions(${target} ${scope} REMAT_USE_BLAS=1)
  endif()
  target_link_libraries(${target} ${scope} Threads::Threads)
  if(nlohmann_json_FOUND)
    target_link_libraries(${target} ${scope} nlohmann_json::nlohmann_json)
  endif()
endfunction()
