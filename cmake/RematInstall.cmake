# Install rules and an exported package, so that `find_package(remat)` works after
# `cmake --install`. The version file is ARCH_INDEPENDENT: remat is headers only.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(REMAT_CMAKE_DIR "${CMAKE_INSTALL_DATADIR}/cmake/remat")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/remat" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS remat EXPORT rematTargets)
install(EXPORT rematTargets NAMESPACE remat:: DESTINATION "${REMAT_CMAKE_DIR}")
# remat::mpi in its own export file, which remat-config.cmake loads only when MPI is found.
if(TARGET remat_mpi)
  install(TARGETS remat_mpi EXPORT rematMpiTargets)
  install(EXPORT rematMpiTargets NAMESPACE remat:: DESTINATION "${REMAT_CMAKE_DIR}")
endif()

# remat::hub likewise: remat-config.cmake finds PCRE2 and ICU through pkg-config again.
if(TARGET remat_hub)
  install(TARGETS remat_hub EXPORT rematHubTargets)
  install(EXPORT rematHubTargets NAMESPACE remat:: DESTINATION "${REMAT_CMAKE_DIR}")
endif()

set(REMAT_CONFIG_USE_BLAS OFF)
if(REMAT_USE_BLAS AND BLAS_FOUND)
  set(REMAT_CONFIG_USE_BLAS ON)
endif()

set(REMAT_CONFIG_USE_JSON ${nlohmann_json_FOUND})

# The same requirements for pkg-config users (Make, Meson): each back end the target links is
# a `Requires:` of remat.pc, and the macro the target defines is in its Cflags. The file goes to
# share/pkgconfig: remat is headers only, like Eigen's eigen3.pc.
set(REMAT_PC_REQUIRES "eigen3")
set(REMAT_PC_DEFINES "")
if(REMAT_CONFIG_USE_BLAS)
  string(APPEND REMAT_PC_REQUIRES " openblas")
  string(APPEND REMAT_PC_DEFINES " -DREMAT_USE_BLAS=1")
endif()
if(REMAT_CONFIG_USE_JSON)
  string(APPEND REMAT_PC_REQUIRES " nlohmann_json")
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/remat.pc.in" "${PROJECT_BINARY_DIR}/remat.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/remat.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/remat-config.cmake.in"
  "${PROJECT_BINARY_DIR}/remat-config.cmake" INSTALL_DESTINATION "${REMAT_CMAKE_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/remat-config-version.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/remat-config.cmake" "${PROJECT_BINARY_DIR}/remat-config-version.cmake"
  DESTINATION "${REMAT_CMAKE_DIR}")
