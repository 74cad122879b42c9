#pragma once
/// @file
/// Version and the few macros remat defines. Every macro carries the REMAT_ prefix and none of
/// them changes the layout of a class, so translation units built with different settings
/// still agree on every type.

#define REMAT_VERSION_MAJOR 0
#define REMAT_VERSION_MINOR 1
#define REMAT_VERSION_PATCH 0

/// Set to 1 by the CMake target when OpenBLAS was found: GEMMs then go through it.
#ifndef REMAT_USE_BLAS
#define REMAT_USE_BLAS 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define REMAT_RESTRICT __restrict__
#else
#define REMAT_RESTRICT
#endif
