#pragma once
/// @file
/// detail::gemm: C = alpha * op(A) * op(B) + beta * C on row-major buffers, through OpenBLAS
/// when the target found it (REMAT_USE_BLAS) and through Eigen otherwise. Calling CBLAS directly
/// rather than through Eigen's BLAS back end keeps transposes free (no copies) and lets gradient
/// GEMMs accumulate into their destination (beta = 1), without changing how user code that
/// includes Eigen behaves.

#include <cstdint>
#include <string>

#include "remat/core/config.hpp"
#include "remat/core/error.hpp"

#if REMAT_USE_BLAS
#include <cblas.h>
#else
#include <Eigen/Core>
#endif

namespace remat {

/// Which GEMM remat uses, for logs and benchmark reports: "OpenBLAS <version> (<kernel> kernels)"
/// or "Eigen".
inline std::string gemm_backend() {
#if REMAT_USE_BLAS
  const std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  return config.substr(0, config.find(' ', config.find(' ') + 1)) + " (" + openblas_get_corename() + " kernels)";
#else
  return "Eigen";
#endif
}

}  // namespace remat

namespace remat::detail {

/// Row-major GEMM. op(A) is m x k, op(B) is k x n, C is m x n; lda, ldb, ldc are row strides.
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
#if REMAT_USE_BLAS
  constexpr std::int64_t kMaxBlasInt = 0x7fffffff;
  if (m > kMaxBlasInt || n > kMaxBlasInt || k > kMaxBlasInt) {
    throw ShapeError(cat("matmul: extents (", m, ", ", n, ", ", k, ") exceed what BLAS can index"));
  }
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto i = [](std::int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  } else {
    static_assert(std::is_same_v<T, double>, "gemm: float or double only");
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  }
#else
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
#endif
}

}  // namespace remat::detail
