#pragma once
/// @file
/// detail::gemm: C = alpha * op(A) * op(B) + beta * C on row-major buffers, through OpenBLAS
/// when the target found it (REMAT_USE_BLAS) and through Eigen otherwise. Calling CBLAS directly
/// rather than through Eigen's BLAS back end keeps transposes free (no copies) and lets gradient
/// GEMMs accumulate into their destination (beta = 1), without changing how user code that
/// includes Eigen behaves.
///
/// Note [GEMM kernel choice]: OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels from
/// a table of CPU models, and a CPU newer than its table gets its SSE3 "Prescott" kernels: a
/// fifth of the speed on a recent Xeon. So on first use remat asks which kernels OpenBLAS chose
/// (openblas_get_corename) and which vector instructions those kernels use, and compares with
/// what the CPU offers (cpuid, core/cpu.hpp). If OpenBLAS fell short, remat re-selects the kernels
/// matching the CPU's instructions through OpenBLAS's own core override (SkylakeX for AVX-512,
/// Haswell for AVX2 + FMA); if that is impossible (a build without DYNAMIC_ARCH), it uses Eigen's
/// GEMM when Eigen was compiled for wider instructions than OpenBLAS's kernels use. The
/// alternatives measured (BLIS, oneDNN) and the figures are in docs/design.md.

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <Eigen/Core>

#include "remat/core/config.hpp"
#include "remat/core/cpu.hpp"
#include "remat/core/error.hpp"
#include "remat/core/float_mode.hpp"
#include "remat/core/memory.hpp"
#include "remat/core/parallel.hpp"

#if REMAT_USE_BLAS
#include <cblas.h>
// Present in DYNAMIC_ARCH builds of OpenBLAS only: weak, so that other builds still link (the
// addresses are then null and remat does not try to re-select kernels).
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));
#endif

namespace remat {

/// Which GEMM remat uses and why, for logs and benchmark reports.
struct GemmBackend {
  std::string name;    ///< "OpenBLAS 0.3.21 (SkylakeX kernels)" or "Eigen (avx2)"
  std::string reason;  ///< why this one: what the CPU offers and what the backend chose
};

namespace detail {

enum class GemmPath { blas, eigen };

struct GemmChoice {
  GemmPath path = GemmPath::eigen;
  GemmBackend backend;
};

/// The widest instructions Eigen's kernels were compiled for (Eigen chooses them by macros at
/// compile time, from the flags of the translation unit).
inline constexpr Isa eigen_isa() noexcept {
#if defined(EIGEN_VECTORIZE_AVX512)
  return Isa::avx512;
#elif defined(EIGEN_VECTORIZE_AVX2) && defined(EIGEN_VECTORIZE_FMA)
  return Isa::avx2;
#else
  return Isa::baseline;
#endif
}

#if REMAT_USE_BLAS
/// The vector instructions an OpenBLAS kernel set uses, by the kernel set's name (OpenBLAS's
/// names of its kernel families, not of CPU models: every CPU maps onto one of these).
inline Isa openblas_kernel_isa(std::string core) {
  std::transform(core.begin(), core.end(), core.begin(),
                 [](unsigned char ch) { return char(std::tolower(ch)); });
  if (core == "skylakex" || core == "cooperlake" || core == "sapphirerapids") return Isa::avx512;
  if (core == "haswell" || core == "zen") return Isa::avx2;
  return Isa::baseline;
}

inline std::string openblas_name() {
  const std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  return config.substr(0, config.find(' ', config.find(' ') + 1)) + " (" + openblas_get_corename() +
         " kernels)";
}

/// Makes OpenBLAS use the kernel set `core` (as OPENBLAS_CORETYPE would at start-up) and says
/// whether it took. Only between GEMMs: call it before any other thread runs one. The variable
/// is set only for the instant OpenBLAS reads it and restored after, so the process's
/// environment is as the user left it.
inline bool openblas_use_core(const std::string& core) {
  if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit) return false;
  const char* previous = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = previous ? previous : "";
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (previous) {
    ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  } else {
    ::unsetenv("OPENBLAS_CORETYPE");
  }
  std::string chosen = openblas_get_corename();
  std::transform(chosen.begin(), chosen.end(), chosen.begin(),
                 [](unsigned char ch) { return char(std::tolower(ch)); });
  std::string wanted = core;
  std::transform(wanted.begin(), wanted.end(), wanted.begin(),
                 [](unsigned char ch) { return char(std::tolower(ch)); });
  return chosen == wanted;
}
#endif

/// Decides which GEMM to use on this machine (Note [GEMM kernel choice]).
inline GemmChoice choose_gemm() {
#if REMAT_USE_BLAS
  openblas_set_num_threads(1);  // remat's pool runs it (Note [one pool])
#endif
  const Isa cpu = cpu_isa();
  const std::string eigen_name = cat("Eigen (", to_string(eigen_isa()), ")");
#if REMAT_USE_BLAS
  const std::string first = openblas_get_corename();
  const Isa chosen = openblas_kernel_isa(first);
  if (chosen >= cpu) {
    return {GemmPath::blas,
            {openblas_name(), cat("OpenBLAS chose its ", first, " kernels (", to_string(chosen),
                                  "), all this CPU offers (", to_string(cpu), ")")}};
  }
  const std::string fix = cpu == Isa::avx512 ? "SkylakeX" : "Haswell";
  if (openblas_use_core(fix)) {
    return {GemmPath::blas,
            {openblas_name(),
             cat("OpenBLAS chose its ", first, " kernels (", to_string(chosen), ") on a CPU with ",
                 to_string(cpu), "; remat re-selected its ", fix, " kernels")}};
  }
  if (eigen_isa() > chosen) {
    return {GemmPath::eigen,
            {eigen_name,
             cat("OpenBLAS chose its ", first, " kernels (", to_string(chosen), ") on a CPU with ",
                 to_string(cpu), " and cannot change them; Eigen was compiled for ",
                 to_string(eigen_isa()))}};
  }
  return {GemmPath::blas,
          {openblas_name(),
           cat("OpenBLAS chose its ", first, " kernels (", to_string(chosen), ") on a CPU with ",
               to_string(cpu), " and cannot change them; Eigen was compiled for no more")}};
#else
  return {GemmPath::eigen,
          {eigen_name,
           cat("built without OpenBLAS (REMAT_USE_BLAS=0); this CPU offers ", to_string(cpu))}};
#endif
}

/// The choice in force, made on first use.
inline GemmChoice& gemm_choice() {
  static GemmChoice choice = choose_gemm();
  return choice;
}

}  // namespace detail

/// Which GEMM remat uses on this machine, and why (Note [GEMM kernel choice]).
inline GemmBackend gemm_backend() { return detail::gemm_choice().backend; }

}  // namespace remat

namespace remat::detail {

#if REMAT_USE_BLAS
template <class T>
void blas_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
               const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
               std::int64_t ldc) {
  constexpr std::int64_t kMaxBlasInt = 0x7fffffff;
  if (m > kMaxBlasInt || n > kMaxBlasInt || k > kMaxBlasInt) {
    throw ShapeError(cat("matmul: extents (", m, ", ", n, ", ", k, ") exceed what BLAS can index"));
  }
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto i = [](std::int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
  } else {
    static_assert(std::is_same_v<T, double>, "gemm: float or double only");
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
  }
}

/// Note [one pool]: OpenBLAS runs single-threaded, and a GEMM worth splitting is cut into one
/// slab of C per thread of remat's pool (rows when C is taller than wide, else columns), each a
/// single-threaded OpenBLAS call over all of K. With OpenBLAS's own threads, whose workers keep
/// spinning (sched_yield) for a long while after each call, they and the pool's workers fought
/// over the cores whenever the two alternated, as a step's GEMMs and element-wise loops do: on a
/// 2-core Zen 5, BF16 GEMMs (run by the pool) after float ones got no speed from the second
/// thread at all, and a GPT step in float32 ran 10 % slower (docs/design.md). A slab's values do
/// not depend on which thread runs it; they can depend on the slabs' bounds (6 of 200 generated
/// shapes differed in some bit between one call and two to four slabs), so a float GEMM is
/// bitwise reproducible for a given thread count, as with OpenBLAS's threads before. Inside a
/// parallel loop (attention's units) a GEMM runs whole: the loop is the parallel part.
template <class T>
void pool_blas_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                    T* c, std::int64_t ldc) {
  // below about 64^3 multiply-adds a slab costs more in dispatch than it saves
  constexpr double kSplitWork = 1 << 18;
  const std::int64_t slabs = ThreadPool::instance().size();
  // inside a parallel loop (attention's heads) the loop is what runs in parallel: the GEMM runs
  // whole, with the same bits on any thread
  if (slabs < 2 || ThreadPool::inside_loop() || double(m) * double(n) * double(k) < kSplitWork) {
    blas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool by_rows = m >= n;
  parallel_for(slabs, 1, [&](std::int64_t s0, std::int64_t s1) {
    for (std::int64_t s = s0; s < s1; ++s) {
      const std::int64_t extent = by_rows ? m : n;
      const std::int64_t i0 = extent * s / slabs, i1 = extent * (s + 1) / slabs;
      if (i1 == i0) continue;
      if (by_rows) {  // rows [i0, i1) of op(A) and C
        blas_gemm(trans_a, trans_b, i1 - i0, n, k, alpha, trans_a ? a + i0 : a + i0 * lda, lda, b,
                  ldb, beta, c + i0 * ldc, ldc);
      } else {  // columns [i0, i1) of op(B) and C
        blas_gemm(trans_a, trans_b, m, i1 - i0, k, alpha, a, lda, trans_b ? b + i0 * ldb : b + i0,
                  ldb, beta, c + i0, ldc);
      }
    }
  });
}
#endif

template <class T>
void eigen_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                std::int64_t ldc) {
  using Stride = Eigen::OuterStride<>;
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ConstMap = Eigen::Map<const Mat, 0, Stride>;
  Eigen::Map<Mat, 0, Stride> C(c, m, n, Stride(ldc));
  const ConstMap A(a, trans_a ? k : m, trans_a ? m : k, Stride(lda));
  const ConstMap B(b, trans_b ? n : k, trans_b ? k : n, Stride(ldb));
  if (beta == T(0)) {
    C.setZero();
  } else if (beta != T(1)) {
    C *= beta;
  }
  if (k == 0) return;
  if (trans_a && trans_b) {
    C.noalias() += alpha * A.transpose() * B.transpose();
  } else if (trans_a) {
    C.noalias() += alpha * A.transpose() * B;
  } else if (trans_b) {
    C.noalias() += alpha * A * B.transpose();
  } else {
    C.noalias() += alpha * A * B;
  }
}

/// Row-major GEMM. op(A) is m x k, op(B) is k x n, C is m x n; lda, ldb, ldc are row strides.
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  // nothing to multiply in a shape-only run (core/shape_only.hpp)
  if (m == 0 || n == 0 || shape_only()) return;
  const FloatModeGuard float_mode;  // the calling thread's part; parallel_for sets the pool's
#if REMAT_USE_BLAS
  // The first GEMM makes the choice, re-selecting OpenBLAS's kernels if they fall short (Note
  // [GEMM kernel choice]); every GEMM must pass here, whichever path it then takes.
  const GemmPath path = gemm_choice().path;
  // Eigen's GEMM is chosen only when it was compiled for wider vectors than OpenBLAS's kernels,
  // never when it was compiled for the baseline, as users' default flags do: then it is not even
  // instantiated, which saves a third of a small program's compile time.
  if (eigen_isa() == Isa::baseline || path == GemmPath::blas) {
    pool_blas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if constexpr (eigen_isa() != Isa::baseline) {
    eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#else
  eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

}  // namespace remat::detail
