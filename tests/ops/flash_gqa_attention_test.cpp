#include "support/gradcheck.hpp"

#include <algorithm>
#include <cmath>

namespace {

// A random grouped-query problem: batch, key/value heads, queries per group, an even head size,
// a length often not a multiple of the block, and a RoPE offset.
struct FlashGqaCase {
  std::int64_t batch, kv_heads, rep, head_dim, time, block;
  remat::RopeOptions rope;
  std::int64_t heads() const { return kv_heads * rep; }
};

FlashGqaCase flash_gqa_case(remat::Rng& rng, std::int64_t max_time) {
  FlashGqaCase c{};
  c.batch = 1 + rng.uniform_int(2);
  c.kv_heads = 1 + rng.uniform_int(2);
  c.rep = 1 + rng.uniform_int(3);
  c.head_dim = 2 * (1 + rng.uniform_int(3));
  c.time = 1 + rng.uniform_int(max_time);
  c.block = 1 + rng.uniform_int(std::min<std::int64_t>(c.time + 3, 17));
  c.rope.offset = rng.uniform_int(5);
  return c;
}

double flash_gqa_max_rel_diff(const remat::Tensor<double>& a, const remat::Tensor<double>& b) {
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
  return worst;
}

}  // namespace

TEST_CASE(
    "flash_grouped_query_attention matches grouped_query_attention on random shapes, values and "
    "gradients",
    "[ops][attention][flash]") {
  remat::Rng rng(77);
  for (int trial = 0; trial < 30; ++trial) {
    const FlashGqaCase c = flash_gqa_case(rng, 40);
    INFO("trial " << trial << ": B " << c.batch << " H " << c.heads() << " G " << c.kv_heads
                  << " D " << c.head_dim << " T " << c.time << " block " << c.block << " offset "
                  << c.rope.offset);
    const std::vector<remat::Tensor<double>> in = {
        remat::test::randn({c.batch, c.time, c.heads() * c.head_dim}, 10 + trial),
        remat::test::randn({c.batch, c.time, c.kv_heads * c.head_dim}, 50 + trial),
        remat::test::randn({c.batch, c.time, c.kv_heads * c.head_dim}, 90 + trial)};
    const remat::Tensor<double> seed_grad = remat::test::randn(in[0].shape(), 130 + trial);
    std::vector<remat::Tensor<double>> g_plain, g_flash;
    const remat::Tensor<double> plain = remat::test::evaluate(
        [&](const auto& v) {
          return remat::grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads, c.rope);
        },
        in, 5, &seed_grad, &g_plain);
    const remat::Tensor<double> flash = remat::test::evaluate(
        [&](const auto& v) {
          return remat::flash_grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads,
                                                      c.rope, c.block);
        },
        in, 5, &seed_grad, &g_flash);
    CHECK(flash_gqa_max_rel_diff(flash, plain) < 1e-13);
    REQUIRE(g_flash.size() == 3);
    for (std::size_t k = 0; k < 3; ++k)
      CHECK(flash_gqa_max_rel_diff(g_flash[k], g_plain[k]) < 1e-12);
  }
}

TEST_CASE(
    "flash_grouped_query_attention: gradients by finite differences, checkpoint replay bitwise",
    "[ops][attention][flash][gradcheck]") {
  remat::Rng rng(78);
  for (int trial = 0; trial < 6; ++trial) {
    const FlashGqaCase c = flash_gqa_case(rng, 9);
    INFO("trial " << trial << ": H " << c.heads() << " G " << c.kv_heads << " D " << c.head_dim
                  << " T " << c.time << " block " << c.block);
    remat::test::gradcheck(
        [&](const auto& v) {
          return remat::flash_grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads,
                                                      c.rope, c.block);
        },
        {remat::test::randn({c.batch, c.time, c.heads() * c.head_dim}, 200 + trial),
         remat::test::randn({c.batch, c.time, c.kv_heads * c.head_dim}, 300 + trial),
         remat::test::randn({c.batch, c.time, c.kv_heads * c.head_dim}, 400 + trial)});
  }
}

TEST_CASE(
    "flash_grouped_query_attention keeps one log-sum-exp per query row, not the probabilities",
    "[ops][attention][flash][memory]") {
  const std::int64_t batch = 2, time = 90, heads = 4, kv_heads = 2, dim = 8;
  remat::Rng rng(4);
  const remat::Tensor<float> q = rng.normal_tensor<float>({batch, time, heads * dim});
  const remat::Tensor<float> kv = rng.normal_tensor<float>({batch, time, kv_heads * dim});
  const auto kept_after_forward = [&](bool flash) {
    remat::Tape tape;
    const remat::Var<float> vq = tape.input(q, true), vk = tape.input(kv, true),
                            vv = tape.input(kv.clone(), true);
    const std::size_t before = remat::memory::live_bytes();
    const remat::Var<float> y =
        flash ? remat::flash_grouped_query_attention(vq, vk, vv, heads, kv_heads)
              : remat::grouped_query_attention(vq, vk, vv, heads, kv_heads);
    return remat::memory::live_bytes() - before - static_cast<std::size_t>(y.value().bytes());
  };
  // both keep the rotated queries and keys; then the fused op the probabilities, the flash op a
  // number a row
  const std::size_t rotated = static_cast<std::size_t>(q.bytes() + kv.bytes());
  CHECK(kept_after_forward(true) ==
        rotated + static_cast<std::size_t>(batch * heads * time) * sizeof(float));
  CHECK(kept_after_forward(false) ==
        rotated + static_cast<std::size_t>(batch * heads * time * time) * sizeof(float));
}

TEST_CASE("flash_grouped_query_attention rejects bad shapes and block sizes",
          "[ops][attention][flash][errors]") {
  const remat::Var<float> q(remat::Tensor<float>::zeros({1, 3, 8})),
      kv(remat::Tensor<float>::zeros({1, 3, 4}));
  CHECK_THAT(
      remat::test::error_message([&] { remat::flash_grouped_query_attention(q, kv, kv, 2, 3); }),
      Catch::Contains("flash_grouped_query_attention") && Catch::Contains("(1, 3, 8)") &&
          Catch::Contains("kv_heads 3"));
  CHECK_THROWS_AS(remat::flash_grouped_query_attention(q, q, kv, 2, 1), remat::ShapeError);
  CHECK_THAT(remat::test::error_message(
                 [&] { remat::flash_grouped_query_attention(q, kv, kv, 2, 1, {}, 0); }),
             Catch::Contains("block_rows"));
}

TEST_CASE(
    "grouped-query attention under a sliding window: flash (any block of query rows) matches "
    "fused, a window as long as the sequence is no window, and gradients check",
    "[ops][attention][flash][window]") {
  remat::Rng rng(79);
  for (int trial = 0; trial < 24; ++trial) {
    const FlashGqaCase c = flash_gqa_case(rng, 30);
    const std::int64_t window = 1 + rng.uniform_int(c.time + 1);
    INFO("trial " << trial << ": B " << c.batch << " H " << c.heads() << " G " << c.kv_heads
                  << " D " << c.head_dim << " T " << c.time << " block " << c.block << " window "
                  << window);
    const std::vector<remat::Tensor<double>> in = {
        remat::test::randn({c.batch, c.time, c.heads() * c.head_dim}, 510 + trial),
        remat::test::randn({c.batch, c.time, c.kv_heads * c.head_dim}, 550 + trial),
        remat::test::randn({c.batch, c.time, c.kv_heads * c.head_dim}, 590 + trial)};
    const remat::Tensor<double> seed_grad = remat::test::randn(in[0].shape(), 630 + trial);
    std::vector<remat::Tensor<double>> g_fused, g_flash, g_plain;
    const auto fused = remat::test::evaluate(
        [&](const auto& v) {
          return remat::grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads, c.rope,
                                                window);
        },
        in, 5, &seed_grad, &g_fused);
    const auto flash = remat::test::evaluate(
        [&](const auto& v) {
          return remat::flash_grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads,
                                                      c.rope, c.block, window);
        },
        in, 5, &seed_grad, &g_flash);
    const auto plain = remat::test::evaluate(
        [&](const auto& v) {
          return remat::grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads, c.rope);
        },
        in, 5, &seed_grad, &g_plain);
    CHECK(flash_gqa_max_rel_diff(flash, fused) < 1e-13);
    for (std::size_t k = 0; k < 3; ++k)
      CHECK(flash_gqa_max_rel_diff(g_flash[k], g_fused[k]) < 1e-12);
    // the window sees every key of every row only when it is as long as the sequence
    if (window >= c.time) {
      CHECK(fused.to_vector() == plain.to_vector());
    } else {
      CHECK(flash_gqa_max_rel_diff(fused, plain) > 1e-6);
    }
    if (trial < 4) {
      remat::test::gradcheck(
          [&](const auto& v) {
            return remat::flash_grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads,
                                                        c.rope, c.block, window);
          },
          in);
    }
  }
  const remat::Var<double> q(remat::Tensor<double>::zeros({1, 3, 4})),
      kv(remat::Tensor<double>::zeros({1, 3, 2}));
  CHECK_THAT(
      remat::test::error_message([&] { remat::grouped_query_attention(q, kv, kv, 2, 1, {}, -1); }),
      Catch::Contains("sliding window") && Catch::Contains("-1"));
}
