// The BF16 GEMM (ops/gemm_bf16.hpp): every kernel this machine runs (convert everywhere, and
// avx512_bf16 and amx where the CPU has them), forced one after the other, on generated shapes,
// transposes, alphas and betas.
//
// Bound, per element of C = alpha op(A) op(B) + beta C, with u = 2^-8 (bfloat16 keeps 8
// significant bits, rounding to nearest) and k products: each input is within u of itself
// relative, so each product within 2u + u^2; a product of two bfloat16 values is exact in float,
// and float's sum of k terms adds at most k 2^-24 (1 + u)^2 of sum |a_i b_i|. So
//   |C - exact| <= |alpha| (2u + u^2 + k 2^-24 (1 + u)^2) sum_i |a_i b_i| + |beta C| 2^-23
// (the last term: float's rounding of alpha x + beta c). A kernel that read one packed value
// wrong, or dropped a tail of K, M or N, misses it by orders of magnitude; the plain float GEMM
// meets it too, so the test also checks that the inputs were rounded: on values chosen to be
// exact in float but not in bfloat16, every kernel must give the bfloat16 answer exactly.
#include "support/gradcheck.hpp"
#include "support/isa_scope.hpp"

#include <remat/core/memory.hpp>
#include <remat/ops/gemm_bf16.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace gemm_bf16_cases {

/// The kernels this machine can run.
std::vector<remat::Bf16Kernel> runnable_kernels() {
  std::vector<remat::Bf16Kernel> out;
  for (const auto k :
       {remat::Bf16Kernel::convert, remat::Bf16Kernel::avx512_bf16, remat::Bf16Kernel::amx}) {
    if (k <= remat::supported_bf16_kernel()) out.push_back(k);
  }
  return out;
}

/// Restores the machine's kernel when a test ends.
struct KernelScope {
  ~KernelScope() { remat::set_bf16_kernel(remat::supported_bf16_kernel()); }
};

struct Case {
  std::int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

/// The worst error of gemm_bf16 on `c` over the bound above (<= 1 passes), with generated values.
double worst_over_bound(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  const auto fill = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  const std::vector<float> a = fill(c.m * c.k), b = fill(c.k * c.n), c0 = fill(c.m * c.n);
  std::vector<float> out = c0;
  remat::gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), c.ta ? c.m : c.k, b.data(),
                   c.tb ? c.k : c.n, c.beta, out.data(), c.n);
  const double u = std::ldexp(1.0, -8);
  double worst = 0;
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.n; ++j) {
      double exact = 0, magnitude = 0;
      for (std::int64_t l = 0; l < c.k; ++l) {
        const double x = c.ta ? a[l * c.m + i] : a[i * c.k + l];
        const double y = c.tb ? b[j * c.k + l] : b[l * c.n + j];
        exact += x * y;
        magnitude += std::abs(x * y);
      }
      const double before = c.beta == 0 ? 0.0 : double(c.beta) * c0[i * c.n + j];
      const double want = c.alpha * exact + before;
      const double bound =
          std::abs(c.alpha) *
              (2 * u + u * u + double(c.k) * std::ldexp(1.0, -24) * (1 + u) * (1 + u)) * magnitude +
          std::abs(before) * std::ldexp(1.0, -23) + 1e-30;
      worst = std::max(worst, std::abs(out[i * c.n + j] - want) / bound);
    }
  }
  return worst;
}

}  // namespace gemm_bf16_cases

using namespace gemm_bf16_cases;

TEST_CASE("gemm_bf16: every kernel within bfloat16's bound on generated shapes", "[ops][bf16]") {
  const KernelScope restore;
  std::mt19937 rng(11);
  for (const remat::Bf16Kernel kernel : runnable_kernels()) {
    remat::set_bf16_kernel(kernel);
    for (int trial = 0; trial < 64; ++trial) {
      std::uniform_int_distribution<std::int64_t> size(1, trial < 50 ? 40 : 150), tall(129, 300),
          wide(33, 70), deep(1900, 2200);
      // the last trials: K so long that A's rows come in bands of 3 or 4 blocks, the last band
      // often partial (Note [BF16 block order])
      const bool banded = trial >= 60;
      const Case c{banded ? tall(rng) : size(rng),
                   banded ? wide(rng) : size(rng),
                   banded ? deep(rng) : size(rng),
                   (trial & 1) != 0,
                   (trial & 2) != 0,
                   trial % 5 == 0 ? -1.5f : 0.75f,
                   trial % 3 == 0   ? 0.0f
                   : trial % 3 == 1 ? 1.0f
                                    : -0.5f};
      INFO(remat::to_string(kernel)
           << ": m " << c.m << ", n " << c.n << ", k " << c.k << ", ta " << c.ta << ", tb " << c.tb
           << ", alpha " << c.alpha << ", beta " << c.beta);
      CHECK(worst_over_bound(c, rng) <= 1.0);
    }
  }
}

TEST_CASE("gemm_bf16 rounds its inputs to bfloat16 and sums the products in float", "[ops][bf16]") {
  const KernelScope restore;
  // 1 + 2^-10 is a float but not a bfloat16 (whose spacing at 1 is 2^-7): it rounds to 1;
  // 3 + 2^-6 is a bfloat16 (spacing 2^-6 in [2, 4)). The products of the rounded values are
  // exact in float, and so is every partial sum (multiples of 2^-7 below 2^17): each kernel must
  // give the sum of the rounded products bit for bit, whatever its order of additions.
  const std::int64_t k = 70;  // past two AMX tile rows of K, with a tail
  std::vector<float> a(k), b(k);
  double want = 0;
  for (std::int64_t l = 0; l < k; ++l) {
    a[l] = l % 2 ? 1.0f + std::ldexp(1.0f, -10) : 3.0f + std::ldexp(1.0f, -6);
    b[l] = l % 3 ? 0.5f : -2.0f;
    const double rounded = l % 2 ? 1.0 : 3.0 + std::ldexp(1.0, -6);  // bfloat16(a[l])
    want += rounded * b[l];
  }
  for (const remat::Bf16Kernel kernel : runnable_kernels()) {
    remat::set_bf16_kernel(kernel);
    float c = std::nanf("");  // beta 0: C is never read, even when not a number
    remat::gemm_bf16(false, false, 1, 1, k, 1.0f, a.data(), k, b.data(), 1, 0.0f, &c, 1);
    INFO(remat::to_string(kernel));
    CHECK(double(c) == want);
  }
}

TEST_CASE("gemm_bf16 gives the same bits on any thread count and run to run", "[ops][bf16]") {
  const KernelScope restore;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int threads = remat::num_threads();
  // one band of rows, and bands of 4 blocks whose last is partial (Note [BF16 block order])
  const std::array<std::array<std::int64_t, 3>, 2> shapes{{{97, 130, 211}, {300, 130, 2000}}};
  for (const auto& [m, n, k] : shapes) {
    std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
    for (float& x : a) x = normal(rng);
    for (float& x : b) x = normal(rng);
    for (const remat::Bf16Kernel kernel : runnable_kernels()) {
      if (kernel == remat::Bf16Kernel::convert) continue;  // the float GEMM's own threads decide
      remat::set_bf16_kernel(kernel);
      std::vector<std::vector<float>> runs;
      for (const int t : {1, 2, 3, 1}) {
        remat::set_num_threads(t);
        std::vector<float>& c = runs.emplace_back(static_cast<std::size_t>(m * n));
        remat::gemm_bf16(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
      }
      remat::set_num_threads(threads);
      INFO(remat::to_string(kernel) << ", m " << m << ", k " << k);
      CHECK(runs[0] == runs[1]);
      CHECK(runs[0] == runs[2]);
      CHECK(runs[0] == runs[3]);
    }
  }
}

TEST_CASE("gemm_bf16's tile kernels give the same bits for A^T as for A transposed in memory",
          "[ops][bf16]") {
  // A transposed A is packed otherwise than a plain one (Note [BF16 GEMM packing]: in panels for
  // avx512_bf16, by a transpose for amx), but each element of C must still be the same products
  // summed in the same order.
  const KernelScope restore;
  std::mt19937 rng(31);
  std::normal_distribution<float> normal;
  for (const remat::Bf16Kernel kernel : runnable_kernels()) {
    if (kernel == remat::Bf16Kernel::convert) continue;  // the float GEMM orders its own sums
    remat::set_bf16_kernel(kernel);
    for (int trial = 0; trial < 12; ++trial) {
      std::uniform_int_distribution<std::int64_t> size(1, 100);
      const std::int64_t m = size(rng), n = size(rng), k = size(rng);
      const bool tb = trial & 1;
      std::vector<float> a(static_cast<std::size_t>(m * k)), at(a.size()),
          b(static_cast<std::size_t>(k * n));
      for (float& x : a) x = normal(rng);  // a: m x k; at: k x m, its transpose
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t l = 0; l < k; ++l) at[l * m + i] = a[i * k + l];
      for (float& x : b) x = normal(rng);
      std::vector<float> plain(static_cast<std::size_t>(m * n), 0.25f), transposed = plain;
      remat::gemm_bf16(false, tb, m, n, k, 0.5f, a.data(), k, b.data(), tb ? k : n, 1.0f,
                       plain.data(), n);
      remat::gemm_bf16(true, tb, m, n, k, 0.5f, at.data(), m, b.data(), tb ? k : n, 1.0f,
                       transposed.data(), n);
      INFO(remat::to_string(kernel) << ": m " << m << ", n " << n << ", k " << k << ", tb " << tb);
      CHECK(transposed == plain);
    }
  }
}

TEST_CASE("gemm_bf16 packs B to the same bits with AVX-512 shuffles as with the scalar loops",
          "[ops][bf16]") {
  // The panels' words are moved, not computed: any word out of place changes the bits. Shapes
  // with tails of K (to the pair and to 32) and of N (to 16), and whole tiles, both orientations.
  if (remat::cpu_isa() < remat::Isa::avx512) {
    WARN("this CPU has no AVX-512: only the scalar packing runs, nothing to compare it with");
    return;
  }
  const remat::test::IsaScope restore;
  std::mt19937 rng(37);
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 24; ++trial) {
    std::uniform_int_distribution<std::int64_t> size(1, 150), tiles(1, 6);
    const bool whole = trial % 3 == 0;
    const std::int64_t k = whole ? 32 * tiles(rng) : size(rng),
                       n = whole ? 32 * tiles(rng) : size(rng);
    const bool tb = trial & 1;
    std::vector<float> b(static_cast<std::size_t>(k * n));
    for (float& x : b) x = normal(rng);
    const std::int64_t panels = remat::detail::padded_block(n) / 16;
    const auto pack = [&](remat::Isa isa) {
      remat::set_isa(isa);
      std::vector<std::uint16_t> out(
          static_cast<std::size_t>(panels * 16 * remat::detail::padded_k(k)), 0xdead);
      remat::detail::pack_b_bf16_rows(
          tb, k, n, panels,
          remat::detail::source_rows(remat::detail::Bf16Source{b.data(), nullptr, tb ? k : n},
                                     tb ? k : n),
          out.data());
      return out;
    };
    const std::vector<std::uint16_t> scalar = pack(remat::Isa::baseline);
    const std::vector<std::uint16_t> shuffled = pack(remat::Isa::avx512);
    INFO("k " << k << ", n " << n << ", tb " << tb);
    CHECK(shuffled == scalar);
  }
}

TEST_CASE("gemm_bf16's kernels: the machine's best by default, a missing one refused by name",
          "[ops][bf16][errors]") {
  const KernelScope restore;
  CHECK(remat::bf16_kernel() == remat::supported_bf16_kernel());
  remat::set_bf16_kernel(remat::Bf16Kernel::convert);  // every machine runs it
  CHECK(remat::bf16_kernel() == remat::Bf16Kernel::convert);
  if (remat::supported_bf16_kernel() != remat::Bf16Kernel::amx) {
    CHECK_THROWS_WITH(remat::set_bf16_kernel(remat::Bf16Kernel::amx),
                      Catch::Contains("set_bf16_kernel") && Catch::Contains("amx") &&
                          Catch::Contains(remat::to_string(remat::supported_bf16_kernel())));
  }
  // k = 0: C = beta C, nothing read from A or B
  float c[2] = {2.0f, -4.0f};
  remat::gemm_bf16(false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c, 2);
  CHECK(c[0] == 1.0f);
  CHECK(c[1] == -2.0f);
}

TEST_CASE("gemm_bf16 keeps its packing scratch per thread until memory::release_cache",
          "[ops][bf16][memory]") {
  const KernelScope restore;
  std::mt19937 rng(11);
  for (const auto kernel : runnable_kernels()) {
    remat::set_bf16_kernel(kernel);
    INFO(remat::to_string(kernel));
    remat::memory::release_cache();
    REQUIRE(remat::detail::kernel_scratch().bytes() == 0);
    const std::size_t live = remat::memory::live_bytes();
    // a large call, then a smaller one on the scratch the first left behind (dirty padding
    // included): both within the bound, and the scratch neither counted nor shrunk
    CHECK(worst_over_bound({70, 45, 99, true, false, 1.0f, 0.0f}, rng) <= 1.0);
    const std::size_t held = remat::detail::kernel_scratch().bytes();
    CHECK(held >= 2 * (70 + 45) * 99);  // at least 2 bytes a value of op(A) and op(B)
    CHECK(worst_over_bound({5, 3, 7, false, true, 1.0f, 0.0f}, rng) <= 1.0);
    CHECK(remat::detail::kernel_scratch().bytes() == held);
    CHECK(remat::memory::live_bytes() == live);
    remat::memory::release_cache();
    CHECK(remat::detail::kernel_scratch().bytes() == 0);
  }
}

TEST_CASE("gemm_in packs an operand's saved bfloat16 copy to the bits its floats give",
          "[ops][bf16]") {
  // An op's backward reads its saved copy as it is (Note [BF16 saves]); the GEMM must come out
  // as gemm_bf16 on the float values, bit for bit, whichever operand is a copy and however
  // either is transposed.
  const KernelScope restore;
  std::mt19937 rng(29);
  std::normal_distribution<float> normal;
  for (const remat::Bf16Kernel kernel : runnable_kernels()) {
    remat::set_bf16_kernel(kernel);
    for (int trial = 0; trial < 36; ++trial) {
      // from trial 24, M and K multiples of 32: a copy of A is then read in place, not packed
      std::uniform_int_distribution<std::int64_t> size(1, 70), blocks(1, 3);
      const bool aligned = trial >= 24;
      const std::int64_t m = aligned ? 32 * blocks(rng) : size(rng), n = size(rng),
                         k = aligned ? 32 * blocks(rng) : size(rng);
      const bool ta = trial & 1, tb = trial & 2;
      const int copies = 1 + trial / 4 % 3;  // 1: A, 2: B, 3: both
      std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
      for (float& x : a) x = normal(rng);
      for (float& x : b) x = normal(rng);
      std::vector<std::uint16_t> a16(a.size()), b16(b.size());
      remat::detail::round_to_bf16(a.data(), 1, static_cast<std::int64_t>(a.size()), a16.data());
      remat::detail::round_to_bf16(b.data(), 1, static_cast<std::int64_t>(b.size()), b16.data());
      const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
      std::vector<float> want(static_cast<std::size_t>(m * n), 0.5f), got = want;
      remat::gemm_bf16(ta, tb, m, n, k, 1.5f, a.data(), lda, b.data(), ldb, -1.0f, want.data(), n);
      // a copied operand's float values are not there: the copy alone must be read
      const remat::detail::GemmOperand<float> oa{(copies & 1) ? nullptr : a.data(), lda,
                                                 (copies & 1) ? a16.data() : nullptr};
      const remat::detail::GemmOperand<float> ob{(copies & 2) ? nullptr : b.data(), ldb,
                                                 (copies & 2) ? b16.data() : nullptr};
      remat::detail::gemm_in<float>(true, ta, tb, m, n, k, 1.5f, oa, ob, -1.0f, got.data(), n);
      INFO(remat::to_string(kernel) << ": m " << m << ", n " << n << ", k " << k << ", ta " << ta
                                    << ", tb " << tb << ", copies " << copies);
      CHECK(got == want);
    }
  }
}

TEST_CASE("gemm_in adds a bias row as beta = 1 on a C filled with it would, bit for bit",
          "[ops][bf16]") {
  // A linear's bias: the tile kernels add it as they write C (no fill of C, no read back); the
  // convert kernel and the float GEMM fill C first. Every path must give the fill's bits.
  const KernelScope restore;
  std::mt19937 rng(31);
  std::normal_distribution<float> normal;
  for (const remat::Bf16Kernel kernel : runnable_kernels()) {
    remat::set_bf16_kernel(kernel);
    for (int trial = 0; trial < 16; ++trial) {
      std::uniform_int_distribution<std::int64_t> size(1, 70);
      const std::int64_t m = size(rng), n = size(rng), k = trial == 0 ? 0 : size(rng);
      const bool bf16 = trial % 4 != 3, tb = trial & 1;
      std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
          bias(static_cast<std::size_t>(n));
      for (auto* v : {&a, &b, &bias})
        for (float& x : *v) x = normal(rng);
      const std::int64_t ldb = tb ? k : n;
      std::vector<float> want(static_cast<std::size_t>(m * n));
      for (std::int64_t i = 0; i < m; ++i)
        std::copy(bias.begin(), bias.end(), want.begin() + i * n);
      std::vector<float> got(want.size(), std::nanf(""));  // C is not read
      remat::detail::gemm_in<float>(bf16, false, tb, m, n, k, 0.75f, a.data(), k, b.data(), ldb,
                                    1.0f, want.data(), n);
      remat::detail::gemm_in<float>(bf16, false, tb, m, n, k, 0.75f, {a.data(), k}, {b.data(), ldb},
                                    0.0f, got.data(), n, bias.data());
      INFO(remat::to_string(kernel) << (bf16 ? " bf16" : " float") << ": m " << m << ", n " << n
                                    << ", k " << k << ", tb " << tb);
      CHECK(got == want);
    }
  }
}
