#include "support/gradcheck.hpp"

#include <algorithm>
#include <cmath>

namespace {

// A random attention problem: batch, heads, head size, length and block size drawn so that the
// length is often not a multiple of the block (and sometimes shorter than it).
struct FlashCase {
  std::int64_t batch, heads, head_dim, time, block;
  remat::Shape qkv_shape() const { return {batch, time, 3 * heads * head_dim}; }
};

FlashCase flash_case(remat::Rng& rng, std::int64_t max_time) {
  FlashCase c{};
  c.batch = 1 + static_cast<std::int64_t>(rng.uniform_int(3));
  c.heads = 1 + static_cast<std::int64_t>(rng.uniform_int(3));
  c.head_dim = 1 + static_cast<std::int64_t>(rng.uniform_int(6));
  c.time = 1 + static_cast<std::int64_t>(rng.uniform_int(max_time));
  c.block = 1 + static_cast<std::int64_t>(rng.uniform_int(std::min<std::int64_t>(c.time + 3, 17)));
  return c;
}

// max |a - b| / (1 + |b|) over the elements.
template <class T>
double flash_max_rel_diff(const remat::Tensor<T>& a, const remat::Tensor<T>& b) {
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (1 + std::abs(double(b[i]))));
  }
  return worst;
}

}  // namespace

TEST_CASE(
    "flash_causal_self_attention matches causal_self_attention on random shapes, values and "
    "gradients",
    "[ops][attention][flash]") {
  remat::Rng rng(2026);
  for (int trial = 0; trial < 40; ++trial) {
    const FlashCase c = flash_case(rng, 40);
    const double dropout = trial % 4 == 3 ? 0.25 : 0.0;
    INFO("trial " << trial << ": B " << c.batch << " H " << c.heads << " D " << c.head_dim << " T "
                  << c.time << " block " << c.block << " dropout " << dropout);
    const remat::Tensor<double> qkv = remat::test::randn(c.qkv_shape(), 100 + trial);
    const remat::Tensor<double> seed_grad =
        remat::test::randn({c.batch, c.time, c.heads * c.head_dim}, 200 + trial);
    std::vector<remat::Tensor<double>> g_fused, g_flash;
    const remat::Tensor<double> fused = remat::test::evaluate(
        [&](const auto& v) { return remat::causal_self_attention(v[0], c.heads, dropout); }, {qkv},
        5, &seed_grad, &g_fused);
    const remat::Tensor<double> flash = remat::test::evaluate(
        [&](const auto& v) {
          return remat::flash_causal_self_attention(v[0], c.heads, dropout, c.block);
        },
        {qkv}, 5, &seed_grad, &g_flash);
    REQUIRE(flash.shape() == fused.shape());
    CHECK(flash_max_rel_diff(flash, fused) < 1e-13);
    REQUIRE(g_flash.size() == 1);
    CHECK(flash_max_rel_diff(g_flash[0], g_fused[0]) < 1e-12);
  }
}

TEST_CASE("flash_causal_self_attention matches in float at the default block size",
          "[ops][attention][flash]") {
  remat::Rng rng(7);
  for (const std::int64_t time : {1, 63, 64, 65, 130, 200}) {
    const std::int64_t heads = 2, channels = 16;
    INFO("T " << time);
    const remat::Tensor<float> qkv = rng.normal_tensor<float>({2, time, 3 * channels});
    remat::Tape fused_tape;
    const remat::Tensor<float> fused =
        remat::causal_self_attention(fused_tape.input(qkv), heads).value();
    remat::Tape flash_tape;
    const remat::Tensor<float> flash =
        remat::flash_causal_self_attention(flash_tape.input(qkv), heads).value();
    CHECK(flash_max_rel_diff(flash, fused) < 1e-5);
  }
}

TEST_CASE("flash_causal_self_attention: gradients by finite differences, checkpoint replay bitwise",
          "[ops][attention][flash][gradcheck]") {
  // gradcheck also runs f inside a checkpoint and requires the gradients to equal (==) these.
  remat::Rng rng(31);
  for (int trial = 0; trial < 8; ++trial) {
    const FlashCase c = flash_case(rng, 11);
    const double dropout = trial % 2 == 1 ? 0.3 : 0.0;
    INFO("trial " << trial << ": B " << c.batch << " H " << c.heads << " D " << c.head_dim << " T "
                  << c.time << " block " << c.block << " dropout " << dropout);
    remat::test::gradcheck(
        [&](const auto& v) {
          return remat::flash_causal_self_attention(v[0], c.heads, dropout, c.block);
        },
        {remat::test::randn(c.qkv_shape(), 300 + trial)});
  }
}

TEST_CASE(
    "flash_causal_self_attention keeps qkv and one log-sum-exp per row, not the probabilities",
    "[ops][attention][flash][memory]") {
  const std::int64_t batch = 2, time = 96, heads = 3, channels = 24;
  remat::Rng rng(3);
  const remat::Tensor<float> x = rng.normal_tensor<float>({batch, time, 3 * channels});
  const auto kept_after_forward = [&](bool flash) {
    remat::Tape tape;
    const remat::Var<float> qkv = tape.input(x, true);
    const std::size_t before = remat::memory::live_bytes();
    const remat::Var<float> y = flash ? remat::flash_causal_self_attention(qkv, heads)
                                      : remat::causal_self_attention(qkv, heads);
    return remat::memory::live_bytes() - before - static_cast<std::size_t>(y.value().bytes());
  };
  CHECK(kept_after_forward(true) == static_cast<std::size_t>(batch * heads * time) * sizeof(float));
  CHECK(kept_after_forward(false) ==
        static_cast<std::size_t>(batch * heads * time * time) * sizeof(float));
}

TEST_CASE("flash_causal_self_attention rejects bad shapes, dropout and block sizes",
          "[ops][attention][flash][errors]") {
  const remat::Var<float> qkv(remat::Tensor<float>::zeros({2, 3, 12}));
  CHECK_THAT(remat::test::error_message([&] { remat::flash_causal_self_attention(qkv, 3); }),
             Catch::Contains("flash_causal_self_attention") && Catch::Contains("(2, 3, 12)") &&
                 Catch::Contains("heads = 3"));
  CHECK_THROWS_AS(remat::flash_causal_self_attention(
                      remat::Var<float>(remat::Tensor<float>::zeros({2, 12})), 2),
                  remat::ShapeError);
  CHECK_THROWS_AS(remat::flash_causal_self_attention(qkv, 2, 1.5), remat::ArgumentError);
  CHECK_THAT(
      remat::test::error_message([&] { remat::flash_causal_self_attention(qkv, 2, 0.0, 0); }),
      Catch::Contains("block_rows") && Catch::Contains("(2, 3, 12)"));
}
