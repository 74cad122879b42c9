// Packed rows in the grouped-query attention ops: `starts` (B, T) keeps each example of a row to
// itself (attention and RoPE positions), so that a packed row gives what its examples give one by
// one.

#include "support/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace {

// A random packed problem: shapes as flash_gqa_attention_test's, a segmentation of every row, a
// window (0: none, sometimes) and a RoPE offset and scaling that depend on positions only.
struct PackedCase {
  std::int64_t batch, kv_heads, rep, head_dim, time, block, window;
  remat::RopeOptions rope;
  remat::Tensor<std::int32_t> starts;
  std::int64_t heads() const { return kv_heads * rep; }
};

// Row b's segments as [begin, end) pairs.
std::vector<std::pair<std::int64_t, std::int64_t>> segments(const remat::Tensor<std::int32_t>& s,
                                                            std::int64_t b) {
  const std::int64_t time = s.dim(1);
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::int64_t i = 0; i < time; ++i) {
    if (s[b * time + i] == i) out.emplace_back(i, i);
    out.back().second = i + 1;
  }
  return out;
}

// Starts of random segmentations: a new example at each position with probability `p_new`.
remat::Tensor<std::int32_t> random_starts(remat::Rng& rng, std::int64_t batch, std::int64_t time,
                                          double p_new) {
  remat::Tensor<std::int32_t> s({batch, time});
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < time; ++i) {
      const bool fresh = i == 0 || rng.uniform() < p_new;
      s[b * time + i] = fresh ? static_cast<std::int32_t>(i) : s[b * time + i - 1];
    }
  }
  return s;
}

PackedCase packed_case(remat::Rng& rng, std::int64_t max_time) {
  PackedCase c{};
  c.batch = 1 + rng.uniform_int(2);
  c.kv_heads = 1 + rng.uniform_int(2);
  c.rep = 1 + rng.uniform_int(3);
  c.head_dim = 2 * (1 + rng.uniform_int(3));
  c.time = 1 + rng.uniform_int(max_time);
  c.block = 1 + rng.uniform_int(std::min<std::int64_t>(c.time + 3, 17));
  c.window = rng.uniform_int(3) == 0 ? 0 : 1 + rng.uniform_int(c.time + 1);
  c.rope.offset = rng.uniform_int(5);
  if (rng.uniform_int(3) == 0) {
    c.rope.scaling.type = remat::RopeScalingType::linear;
    c.rope.scaling.factor = 2.5;
  }
  c.starts = random_starts(rng, c.batch, c.time, 0.1 + 0.4 * rng.uniform());
  return c;
}

remat::Var<double> attend(const PackedCase& c, const remat::check::VarList& v, bool flash,
                          const remat::Tensor<std::int32_t>& starts) {
  return flash ? remat::flash_grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads,
                                                      c.rope, c.block, c.window, starts)
               : remat::grouped_query_attention(v[0], v[1], v[2], c.heads(), c.kv_heads, c.rope,
                                                c.window, starts);
}

// Rows [begin, end) of batch b of x (B, T, C), as (1, end - begin, C).
remat::Tensor<double> slice(const remat::Tensor<double>& x, std::int64_t b, std::int64_t begin,
                            std::int64_t end) {
  const std::int64_t time = x.dim(1), width = x.dim(2);
  remat::Tensor<double> out({1, end - begin, width});
  for (std::int64_t k = 0; k < out.numel(); ++k) out[k] = x[(b * time + begin) * width + k];
  return out;
}

// The largest |a - b| / (1 + |b|) between rows [begin, end) of batch b of x and `part`.
double slice_diff(const remat::Tensor<double>& x, std::int64_t b, std::int64_t begin,
                  const remat::Tensor<double>& part) {
  const std::int64_t time = x.dim(1), width = x.dim(2);
  double worst = 0;
  for (std::int64_t k = 0; k < part.numel(); ++k) {
    const double want = part[k], got = x[(b * time + begin) * width + k];
    worst = std::max(worst, std::abs(got - want) / (1 + std::abs(want)));
  }
  return worst;
}

std::vector<remat::Tensor<double>> packed_inputs(const PackedCase& c, std::uint64_t seed) {
  return {remat::test::randn({c.batch, c.time, c.heads() * c.head_dim}, seed),
          remat::test::randn({c.batch, c.time, c.kv_heads * c.head_dim}, seed + 1),
          remat::test::randn({c.batch, c.time, c.kv_heads * c.head_dim}, seed + 2)};
}

}  // namespace

TEST_CASE(
    "grouped-query attention over packed rows equals each example run alone, values and "
    "gradients, fused and flash",
    "[ops][attention][flash][packed]") {
  remat::Rng rng(91);
  for (int trial = 0; trial < 40; ++trial) {
    const PackedCase c = packed_case(rng, 40);
    const std::vector<remat::Tensor<double>> in = packed_inputs(c, 1000 + 10 * trial);
    const remat::Tensor<double> seed_grad = remat::test::randn(in[0].shape(), 7000 + trial);
    for (const bool flash : {false, true}) {
      INFO("trial " << trial << (flash ? " flash" : " fused") << ": B " << c.batch << " H "
                    << c.heads() << " G " << c.kv_heads << " D " << c.head_dim << " T " << c.time
                    << " block " << c.block << " window " << c.window << " offset "
                    << c.rope.offset);
      std::vector<remat::Tensor<double>> grads;
      const remat::Tensor<double> y = remat::test::evaluate(
          [&](const auto& v) { return attend(c, v, flash, c.starts); }, in, 5, &seed_grad, &grads);
      REQUIRE(grads.size() == 3);
      for (std::int64_t b = 0; b < c.batch; ++b) {
        for (const auto& [begin, end] : segments(c.starts, b)) {
          INFO("row " << b << ", example [" << begin << ", " << end << ")");
          std::vector<remat::Tensor<double>> one_in, one_grads;
          for (const auto& x : in) one_in.push_back(slice(x, b, begin, end));
          const remat::Tensor<double> one_seed = slice(seed_grad, b, begin, end);
          const remat::Tensor<double> one =
              remat::test::evaluate([&](const auto& v) { return attend(c, v, flash, {}); }, one_in,
                                    5, &one_seed, &one_grads);
          CHECK(slice_diff(y, b, begin, one) < 1e-13);
          for (std::size_t k = 0; k < 3; ++k)
            CHECK(slice_diff(grads[k], b, begin, one_grads[k]) < 1e-12);
        }
      }
    }
  }
}

TEST_CASE(
    "grouped-query attention over packed rows: gradients by finite differences, checkpoint "
    "replay bitwise",
    "[ops][attention][flash][packed][gradcheck]") {
  remat::Rng rng(92);
  for (int trial = 0; trial < 8; ++trial) {
    const PackedCase c = packed_case(rng, 10);
    for (const bool flash : {false, true}) {
      INFO("trial " << trial << (flash ? " flash" : " fused") << ": H " << c.heads() << " G "
                    << c.kv_heads << " D " << c.head_dim << " T " << c.time << " block " << c.block
                    << " window " << c.window);
      remat::test::gradcheck([&](const auto& v) { return attend(c, v, flash, c.starts); },
                             packed_inputs(c, 2000 + 10 * trial));
    }
  }
}

TEST_CASE(
    "grouped-query attention: starts of one example per row change nothing (bitwise where the "
    "products keep their shape)",
    "[ops][attention][flash][packed]") {
  remat::Rng rng(93);
  for (int trial = 0; trial < 10; ++trial) {
    PackedCase c = packed_case(rng, 30);
    c.starts = remat::Tensor<std::int32_t>::zeros({c.batch, c.time});
    const std::vector<remat::Tensor<double>> in = packed_inputs(c, 3000 + 10 * trial);
    const remat::Tensor<double> seed_grad = remat::test::randn(in[0].shape(), 8000 + trial);
    for (const bool flash : {false, true}) {
      INFO("trial " << trial << (flash ? " flash" : " fused") << " window " << c.window);
      std::vector<remat::Tensor<double>> g_none, g_zero;
      const remat::Tensor<double> none = remat::test::evaluate(
          [&](const auto& v) { return attend(c, v, flash, {}); }, in, 5, &seed_grad, &g_none);
      const remat::Tensor<double> zero = remat::test::evaluate(
          [&](const auto& v) { return attend(c, v, flash, c.starts); }, in, 5, &seed_grad, &g_zero);
      // the flash blocks skip the keys before a window's start only when given starts
      if (!flash || c.window == 0) {
        CHECK(zero.to_vector() == none.to_vector());
        for (std::size_t k = 0; k < 3; ++k) CHECK(g_zero[k].to_vector() == g_none[k].to_vector());
      } else {
        CHECK(slice_diff(zero, 0, 0, none) < 1e-13);
      }
    }
  }
}

TEST_CASE("flash_grouped_query_attention over packed rows keeps what it keeps without them",
          "[ops][attention][flash][packed][memory]") {
  const std::int64_t batch = 2, time = 50, heads = 4, kv_heads = 2, dim = 8;
  remat::Rng rng(5);
  const remat::Tensor<float> q = rng.normal_tensor<float>({batch, time, heads * dim});
  const remat::Tensor<float> kv = rng.normal_tensor<float>({batch, time, kv_heads * dim});
  const remat::Tensor<std::int32_t> starts = random_starts(rng, batch, time, 0.2);
  const auto kept_after_forward = [&](bool flash, const remat::Tensor<std::int32_t>& s) {
    remat::Tape tape;
    const remat::Var<float> vq = tape.input(q, true), vk = tape.input(kv, true),
                            vv = tape.input(kv.clone(), true);
    const std::size_t before = remat::memory::live_bytes();
    const remat::Var<float> y =
        flash ? remat::flash_grouped_query_attention(vq, vk, vv, heads, kv_heads, {},
                                                     remat::kFlashBlockRows, 0, s)
              : remat::grouped_query_attention(vq, vk, vv, heads, kv_heads, {}, 0, s);
    return remat::memory::live_bytes() - before;
  };
  for (const bool flash : {false, true})
    CHECK(kept_after_forward(flash, starts) == kept_after_forward(flash, {}));
}

TEST_CASE("grouped-query attention rejects starts that are not contiguous examples",
          "[ops][attention][flash][packed][errors]") {
  const remat::Var<double> q(remat::Tensor<double>::zeros({2, 4, 4})),
      kv(remat::Tensor<double>::zeros({2, 4, 2}));
  const auto starts = [](std::vector<std::int32_t> v) {
    remat::Tensor<std::int32_t> s({2, 4});
    for (std::int64_t i = 0; i < 8; ++i) s[i] = v[std::size_t(i)];
    return s;
  };
  for (const bool flash : {false, true}) {
    const char* op = flash ? "flash_grouped_query_attention" : "grouped_query_attention";
    const auto call = [&](const remat::Tensor<std::int32_t>& s) {
      return flash ? remat::flash_grouped_query_attention(q, kv, kv, 2, 1, {}, 4, 0, s)
                   : remat::grouped_query_attention(q, kv, kv, 2, 1, {}, 0, s);
    };
    const auto run = [&](const remat::Tensor<std::int32_t>& s) {
      return remat::test::error_message([&] { call(s); });
    };
    // (B, T) = (2, 4) or nothing
    CHECK_THAT(run(remat::Tensor<std::int32_t>::zeros({2, 5})),
               Catch::Contains(op) && Catch::Contains("(2, 4)") && Catch::Contains("(2, 5)"));
    CHECK_THROWS_AS(call(remat::Tensor<std::int32_t>::zeros({8})), remat::ShapeError);
    // a start after its position, before the row, skipping back, or not the previous one
    CHECK_THAT(run(starts({0, 0, 0, 0, 0, 2, 1, 1})), Catch::Contains(op) &&
                                                          Catch::Contains("starts[1, 1] = 2") &&
                                                          Catch::Contains("row 1 position 1"));
    CHECK_THAT(run(starts({-1, 0, 0, 0, 0, 0, 0, 0})), Catch::Contains("starts[0, 0] = -1"));
    CHECK_THAT(run(starts({0, 1, 0, 0, 0, 0, 0, 0})),
               Catch::Contains("starts[0, 2] = 0") && Catch::Contains("previous position's (1)"));
    CHECK_THAT(run(starts({0, 0, 1, 1, 0, 0, 0, 0})), Catch::Contains("starts[0, 2] = 1"));
    CHECK_THROWS_AS(call(starts({0, 0, 2, 2, 0, 1, 1, 2})), remat::ArgumentError);
    // the contiguous ones pass
    CHECK_NOTHROW(call(starts({0, 0, 2, 2, 0, 1, 1, 1})));
    CHECK_NOTHROW(call(starts({0, 1, 2, 3, 0, 0, 0, 3})));
  }
}
