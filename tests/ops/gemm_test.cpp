// The GEMM's backend choice (ops/gemm.hpp, Note [GEMM kernel choice]) and every path it can take.
#include "support/gradcheck.hpp"

#include <remat/core/cpu.hpp>
#include <remat/ops/gemm.hpp>

#include <cmath>

namespace {

/// C = op(A) op(B) in double, row-major, for checking a float or double GEMM.
template <class T>
std::vector<double> reference_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                                   const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l)
        s += double(ta ? a[l * m + i] : a[i * k + l]) * double(tb ? b[j * k + l] : b[l * n + j]);
      c[i * n + j] = s;
    }
  return c;
}

/// Runs remat::detail::gemm (or, with `eigen`, Eigen's GEMM directly: a build for the baseline
/// never dispatches to it) on random shapes and transposes (and beta = 0 and 1) and counts the
/// elements outside float rounding of the double reference.
template <class T>
int gemm_errors(std::uint64_t seed, bool eigen = false) {
  remat::Rng rng(seed);
  int errors = 0;
  for (int round = 0; round < 12; ++round) {
    const std::int64_t m = 1 + rng.uniform_int(70), n = 1 + rng.uniform_int(70),
                       k = 1 + rng.uniform_int(300);
    const bool ta = rng.uniform_int(2) == 1, tb = rng.uniform_int(2) == 1,
               accumulate = rng.uniform_int(2) == 1;
    std::vector<T> a(m * k), b(k * n), c(m * n);
    for (auto& v : a) v = T(rng.normal());
    for (auto& v : b) v = T(rng.normal());
    for (auto& v : c) v = T(rng.normal());
    std::vector<double> want = reference_gemm(ta, tb, m, n, k, a, b);
    if (accumulate)
      for (std::size_t i = 0; i < want.size(); ++i) want[i] += double(c[i]);
    const auto run = eigen ? &remat::detail::eigen_gemm<T> : &remat::detail::gemm<T>;
    run(ta, tb, m, n, k, T(1), a.data(), ta ? m : k, b.data(), tb ? k : n, accumulate ? T(1) : T(0),
        c.data(), n);
    // float accumulation over k products of unit normals: error ~ eps sqrt(k) |terms|; allow k eps
    const double tol = double(std::numeric_limits<T>::epsilon()) * double(k + 1) * 4;
    for (std::size_t i = 0; i < want.size(); ++i)
      errors += !(std::abs(double(c[i]) - want[i]) <= tol * (1 + std::abs(want[i])));
  }
  return errors;
}

}  // namespace

TEST_CASE("gemm_backend names a backend and the reason for it", "[ops][gemm]") {
  const remat::GemmBackend backend = remat::gemm_backend();
  INFO(backend.name << ": " << backend.reason << " on " << remat::cpu_name());
  CHECK(!backend.name.empty());
  CHECK(backend.reason.find(remat::to_string(remat::cpu_isa())) != std::string::npos);
}

#if REMAT_USE_BLAS
TEST_CASE("the GEMM runs kernels that use the CPU's widest vector instructions", "[ops][gemm]") {
  const auto& choice = remat::detail::gemm_choice();
  INFO(choice.backend.name << ": " << choice.backend.reason << " on " << remat::cpu_name());
  const remat::Isa used = choice.path == remat::detail::GemmPath::blas
                              ? remat::detail::openblas_kernel_isa(openblas_get_corename())
                              : remat::detail::eigen_isa();
  CHECK(used >= remat::cpu_isa());
}

TEST_CASE("when OpenBLAS chose slow kernels, remat re-selects fast ones and computes right",
          "[ops][gemm]") {
  // What Debian's OpenBLAS does on CPUs newer than its table: its SSE3 Prescott kernels.
  REQUIRE(remat::detail::openblas_use_core("Prescott"));
  REQUIRE(remat::detail::openblas_kernel_isa(openblas_get_corename()) == remat::Isa::baseline);
  remat::detail::gemm_choice() = remat::detail::choose_gemm();
  const auto& choice = remat::detail::gemm_choice();
  INFO(choice.backend.name << ": " << choice.backend.reason);
  if (remat::cpu_isa() != remat::Isa::baseline) {
    CHECK(choice.path == remat::detail::GemmPath::blas);
    CHECK(choice.backend.reason.find("re-selected") != std::string::npos);
    CHECK(remat::detail::openblas_kernel_isa(openblas_get_corename()) == remat::cpu_isa());
  }
  CHECK(gemm_errors<float>(11) == 0);
  CHECK(gemm_errors<double>(12) == 0);
}

TEST_CASE("OpenBLAS's Prescott kernels, kept, still compute right", "[ops][gemm]") {
  REQUIRE(remat::detail::openblas_use_core("Prescott"));
  CHECK(gemm_errors<float>(13) == 0);
  CHECK(gemm_errors<double>(14) == 0);
  remat::detail::gemm_choice() = remat::detail::choose_gemm();  // back to the fast kernels
  CHECK(remat::detail::openblas_kernel_isa(openblas_get_corename()) >= remat::cpu_isa());
}
#endif

TEST_CASE("the Eigen GEMM path computes right", "[ops][gemm]") {
  CHECK(gemm_errors<float>(21, true) == 0);
  CHECK(gemm_errors<double>(22, true) == 0);
}
