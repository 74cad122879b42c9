// Plans that choose ops (Note [policy layers] in plan/simulator.hpp): on generated blocks, plans
// mixing plain layers, layers under save policies and save_nothing segments are predicted to the
// byte; budget plans keep their budget in the real step; the dynamic program of plan::budget()
// equals a brute force over every assignment on small generated chains, with up to four
// policies; policies derived from generated blocks (plan::derive_policies) give plans predicted
// to the byte. A failure prints the seed: rerun that case alone with REMAT_BLOCK_SEED=<seed>.
#include <catch2/catch.hpp>
#include <remat/remat.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/random_block.hpp"

namespace {

std::size_t policy_plan_step(remat_test::RandomChain& chain, const remat_test::RandomLoss& loss,
                             const remat::Tensor<float>& x, const remat::plan::Plan& p,
                             std::vector<remat::Tensor<float>>* grads = nullptr) {
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
      for (auto& q : layer)
        grads->push_back(q.grad().defined() ? q.grad().clone() : remat::Tensor<float>());
    }
  }
  return peak;
}

bool policy_plan_equal(const std::vector<remat::Tensor<float>>& a,
                       const std::vector<remat::Tensor<float>>& b) {
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
  return {remat::save_matmuls(), remat::save_ops({remat::op::linear, remat::op::layer_norm}),
          remat::recompute_ops({remat::op::tanh, remat::op::relu, remat::op::gelu,
                                remat::op::sigmoid, remat::op::dropout})};
}

/// A random one-level plan mixing plain layers, policy layers and save_nothing segments.
std::vector<remat::plan::Segment> random_mixed_segments(
    remat::Rng& rng, std::size_t n, const std::vector<remat::SavePolicy>& policies) {
  std::vector<remat::plan::Segment> out;
  for (std::size_t l = 0; l < n;) {
    const auto pick = rng.uniform_int(3);
    if (pick == 0) {
      ++l;  // plain
    } else if (pick == 1) {
      out.push_back(remat::plan::Segment{l,
                                         l + 1,
                                         {},
                                         policies[static_cast<std::size_t>(rng.uniform_int(
                                             static_cast<std::int64_t>(policies.size())))]});
      ++l;
    } else {
      const std::size_t e =
          l + 1 + static_cast<std::size_t>(rng.uniform_int(static_cast<std::int64_t>(n - l)));
      out.push_back(remat::plan::Segment{l, e, {}});
      l = e;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("plans mixing save policies are predicted to the byte on random blocks",
          "[checkpoint][policy][profile][random]") {
  const char* only = std::getenv("REMAT_BLOCK_SEED");
  const std::uint64_t base = only ? std::stoull(only) : 20261202;
  const int cases = only ? 1 : 120;
  const std::vector<remat::SavePolicy> policies = policy_plan_policies();
  for (int c = 0; c < cases; ++c) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(c);
    remat_test::RandomCase generated(seed, 6);
    auto& [case_seed, rng, width, batch, n, block, chain, loss, x] = generated;
    INFO(generated.describe());
    std::vector<remat::Tensor<float>> plain_grads, grads;
    policy_plan_step(chain, loss, x, remat::plan::none(n));  // warm-up: parameter gradient buffers
    policy_plan_step(chain, loss, x, remat::plan::none(n), &plain_grads);
    remat::plan::Chain profiled = remat::plan::profile(
        chain.layers, x, loss, remat::plan::ProfileOptions{.repeats = 1, .policies = policies});
    REQUIRE(profiled.policies.size() == policies.size());
    // costs from the seed, not the clock, so that the plans (and a failure) reproduce
    for (std::size_t l = 0; l < n; ++l) {
      profiled.forward_cost[l] = static_cast<double>(2 + rng.uniform_int(9));
      for (auto& q : profiled.policies) {
        q.replay_cost[l] = static_cast<double>(
            rng.uniform_int(static_cast<std::int64_t>(profiled.forward_cost[l])));
        for (auto& v : q.chained) v.replay_cost[l] = q.replay_cost[l];
      }
    }
    std::vector<remat::plan::Plan> plans;
    for (int k = 0; k < 6; ++k)
      plans.push_back(remat::plan::custom(profiled, random_mixed_segments(rng, n, policies)));
    const double high = remat::plan::none(profiled).peak_bytes,
                 low = remat::plan::optimal(profiled, 0).peak_bytes;
    for (double f : {0.1, 0.3, 0.5, 0.7, 0.9})
      plans.push_back(remat::plan::budget(profiled, low + f * (high - low)));
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

namespace {

/// A generated chain with random sizes and costs for every layer plain, in segments, and under
/// each of `policies` (integers, so that sums of costs compare exactly). The first `chained`
/// policies have figures for layers chained with their neighbours.
remat::plan::Chain policy_plan_chain(std::size_t n, remat::Rng& rng,
                                     const std::vector<remat::SavePolicy>& policies,
                                     std::size_t chained = 1) {
  const auto u = [&](double lo, double hi) { return std::floor(rng.uniform(lo, hi)); };
  remat::plan::Chain c;
  for (std::size_t i = 0; i <= n; ++i) c.boundary_bytes.push_back(u(1, 20));
  for (std::size_t i = 0; i < n; ++i) {
    c.activation_bytes.push_back(u(0, 40));
    c.forward_transient_bytes.push_back(u(0, 10));
    c.backward_transient_bytes.push_back(u(0, 10));
    c.forward_cost.push_back(u(1, 9));
    c.saves_output.push_back(rng.uniform() < 0.5);
    c.saves_input.push_back(rng.uniform() < 0.7);
    c.segment_transient_bytes.push_back(u(0, 40));
    c.replay_transient_bytes.push_back(u(0, 10));
    c.replay_free_peak_bytes.push_back(u(0, 80));
    c.dropped_transient_bytes.push_back(u(0, 40));
    c.dropped_free_peak_bytes.push_back(u(0, 60));
  }
  if (rng.uniform() < 0.5) c.last_unheld_backward_transient_bytes = u(0, 10);
  c.loss_bytes = u(0, 10);
  c.loss_output_bytes = u(0, 3);
  c.loss_forward_transient_bytes = u(0, 25);
  c.loss_backward_transient_bytes = u(0, 25);
  c.output_held = rng.uniform() < 0.5;
  c.input_made_in_step = rng.uniform() < 0.3;
  const auto figures = [&](const remat::SavePolicy& policy) {
    remat::plan::PolicyCosts q;
    q.policy = policy;
    for (std::size_t i = 0; i < n; ++i) {
      q.activation_bytes.push_back(
          u(0, c.activation_bytes[i] + 1));  // keeps part of what the layer keeps
      q.forward_transient_bytes.push_back(u(0, 20));
      q.backward_transient_bytes.push_back(u(0, 40));
      q.saves_input.push_back(rng.uniform() < 0.7);
      q.saves_output.push_back(rng.uniform() < 0.3);
      q.replay_cost.push_back(u(0, c.forward_cost[i]));
    }
    if (rng.uniform() < 0.5) q.last_unheld_backward_transient_bytes = u(0, 40);
    return q;
  };
  for (std::size_t p = 0; p < policies.size(); ++p) {
    remat::plan::PolicyCosts q = figures(policies[p]);
    // the first `chained` policies have figures for layers chained with their neighbours; the
    // others do not, so that plans never run two adjacent layers under them
    if (p < chained) {
      for (int k = 0; k < 3; ++k) q.chained.push_back(figures(policies[p]));
    }
    c.policies.push_back(std::move(q));
  }
  return c;
}

/// Every one-level plan with policy layers: each layer plain, under one of `policies` in a
/// segment of its own, or part of a save_nothing segment of any length.
void enumerate_policy_plans(std::size_t s, std::size_t n,
                            const std::vector<remat::SavePolicy>& policies,
                            std::vector<remat::plan::Segment>& cur,
                            std::vector<std::vector<remat::plan::Segment>>& out,
                            std::size_t chained = 1) {
  if (s == n) {
    out.push_back(cur);
    return;
  }
  enumerate_policy_plans(s + 1, n, policies, cur, out, chained);
  for (std::size_t p = 0; p < policies.size(); ++p) {
    const remat::SavePolicy& policy = policies[p];
    // adjacent layers under a policy without chained figures cannot be predicted: not plans
    if (p >= chained && !cur.empty() && cur.back().end == s && cur.back().policy == policy)
      continue;
    cur.push_back(remat::plan::Segment{s, s + 1, {}, policy});
    enumerate_policy_plans(s + 1, n, policies, cur, out, chained);
    cur.pop_back();
  }
  for (std::size_t e = s + 1; e <= n; ++e) {
    cur.push_back(remat::plan::Segment{s, e, {}});
    enumerate_policy_plans(e, n, policies, cur, out, chained);
    cur.pop_back();
  }
}

/// The brute force's answers on `chain`: for nine budgets spaced from the least predicted peak
/// of any one-level plan with policy layers (`chained` policies with chained figures) to the
/// most, the least recompute among the plans within each.
struct PolicyPlanOptimum {
  double budget, recompute, least_peak, most_peak;
};

std::vector<PolicyPlanOptimum> policy_plan_optima(const remat::plan::Chain& chain, std::size_t n,
                                                  const std::vector<remat::SavePolicy>& policies,
                                                  std::size_t chained) {
  std::vector<std::vector<remat::plan::Segment>> plans;
  std::vector<remat::plan::Segment> cur;
  enumerate_policy_plans(0, n, policies, cur, plans, chained);
  std::vector<remat::plan::Prediction> predicted;
  double low = std::numeric_limits<double>::infinity(), high = 0;
  for (const auto& segments : plans) {
    predicted.push_back(remat::plan::predict(chain, segments));
    low = std::min(low, predicted.back().peak_bytes);
    high = std::max(high, predicted.back().peak_bytes);
  }
  std::vector<PolicyPlanOptimum> out;
  for (int b = 0; b <= 8; ++b) {
    const double budget = low + (high - low) * b / 8.0;
    double best = std::numeric_limits<double>::infinity();
    for (const remat::plan::Prediction& p : predicted) {
      if (p.peak_bytes <= budget) best = std::min(best, p.recompute);
    }
    out.push_back({budget, best, low, high});
  }
  return out;
}

}  // namespace

TEST_CASE(
    "plan::budget's dynamic program over policy layers equals a brute force over every assignment",
    "[checkpoint][plan][policy][bruteforce]") {
  const std::vector<remat::SavePolicy> policies{
      remat::save_matmuls(),
      remat::save_if("big", [](const remat::OpInfo& op) { return op.flops > 1e6; })};
  remat::Rng rng(20261130);
  int compared = 0, with_policies = 0;
  for (int c = 0; c < 60; ++c) {
    const std::size_t n = 1 + static_cast<std::size_t>(rng.uniform_int(5));
    const remat::plan::Chain chain = policy_plan_chain(n, rng, policies);
    for (const PolicyPlanOptimum& o : policy_plan_optima(chain, n, policies, 1)) {
      const double budget = o.budget, best = o.recompute;
      INFO("case " << c << ", " << n << " layers, budget " << budget << " (least peak "
                   << o.least_peak << ", most " << o.most_peak << ")");
      REQUIRE(std::isfinite(best));
      const auto dp = remat::plan::detail::OneLevelPlanner(chain).best(budget);
      CHECK(dp.recompute == best);
      for (const remat::plan::Segment& s : dp.segments)
        with_policies += s.policy.keeps_anything() ? 1 : 0;
      // the program's own peak is the simulator's
      const remat::plan::Prediction again = remat::plan::predict(chain, dp.segments);
      CHECK(again.peak_bytes == dp.peak);
      CHECK(again.recompute == dp.recompute);
      CHECK(again.peak_bytes <= budget);
      // budget() may also take a nested plan, never a worse one
      const remat::plan::Plan p = remat::plan::budget(chain, budget);
      CHECK(p.recompute <= best);
      CHECK(p.peak_bytes <= budget);
      CHECK(remat::plan::predict(chain, p.segments).peak_bytes == p.peak_bytes);
      ++compared;
    }
  }
  CHECK(compared == 60 * 9);
  CHECK(with_policies > 100);  // the optimum often runs layers under policies
}

TEST_CASE(
    "plan::budget's dynamic program over many policies, several chained, equals a brute force",
    "[checkpoint][plan][policy][bruteforce]") {
  // as many choices per layer as a profile with derived policies gives (Note [derived policies]),
  // three of the four with chained figures
  const std::vector<remat::SavePolicy> policies{
      remat::save_matmuls(), remat::recompute_ops({remat::op::tanh}),
      remat::recompute_ops({remat::op::tanh, remat::op::layer_norm}),
      remat::save_if("big", [](const remat::OpInfo& op) { return op.flops > 1e6; })};
  remat::Rng rng(20261201);
  int compared = 0, with_policies = 0, chained_neighbours = 0;
  for (int c = 0; c < 50; ++c) {
    const std::size_t n = 1 + static_cast<std::size_t>(rng.uniform_int(4));
    const remat::plan::Chain chain = policy_plan_chain(n, rng, policies, 3);
    for (const PolicyPlanOptimum& o : policy_plan_optima(chain, n, policies, 3)) {
      const double budget = o.budget, best = o.recompute;
      INFO("case " << c << ", " << n << " layers, budget " << budget << " (least peak "
                   << o.least_peak << ", most " << o.most_peak << ")");
      REQUIRE(std::isfinite(best));
      const auto dp = remat::plan::detail::OneLevelPlanner(chain).best(budget);
      CHECK(dp.recompute == best);
      for (std::size_t i = 0; i < dp.segments.size(); ++i) {
        const remat::plan::Segment& s = dp.segments[i];
        with_policies += s.policy.keeps_anything() ? 1 : 0;
        if (i > 0 && s.policy.keeps_anything() && dp.segments[i - 1].end == s.begin &&
            dp.segments[i - 1].policy == s.policy)
          ++chained_neighbours;
      }
      const remat::plan::Prediction again = remat::plan::predict(chain, dp.segments);
      CHECK(again.peak_bytes == dp.peak);
      CHECK(again.recompute == dp.recompute);
      CHECK(again.peak_bytes <= budget);
      const remat::plan::Plan p = remat::plan::budget(chain, budget);
      CHECK(p.recompute <= best);
      CHECK(p.peak_bytes <= budget);
      ++compared;
    }
  }
  CHECK(compared == 50 * 9);
  CHECK(with_policies > 100);
  CHECK(chained_neighbours > 10);  // optima with adjacent layers under one policy were compared
}

TEST_CASE("policies derived from generated blocks: plans predicted to the byte, budgets kept",
          "[checkpoint][policy][profile][random]") {
  const char* only = std::getenv("REMAT_BLOCK_SEED");
  const std::uint64_t base = only ? std::stoull(only) : 20261203;
  const int cases = only ? 1 : 80;
  int offered = 0, planned_with = 0;
  for (int c = 0; c < cases; ++c) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(c);
    remat_test::RandomCase generated(seed, 5);
    auto& [case_seed, rng, width, batch, n, block, chain, loss, x] = generated;
    INFO(generated.describe());
    // blocks with dead ops included: this test found the replay bug that mispredicted them
    // (Tape: a replay runs the nodes the sweep has passed for their values alone)
    std::vector<remat::Tensor<float>> plain_grads, grads;
    policy_plan_step(chain, loss, x, remat::plan::none(n));  // warm-up: parameter gradient buffers
    policy_plan_step(chain, loss, x, remat::plan::none(n), &plain_grads);
    // each derived policy recomputes one op class more than the one before, and frees more
    const std::vector<remat::plan::DerivedPolicy> derived =
        remat::plan::derive_policies(chain.layers, x, 3, 1);
    CHECK(derived.size() <= 3);
    for (std::size_t i = 0; i < derived.size(); ++i) {
      INFO("derived " << derived[i].policy.name());
      CHECK(derived[i].classes.size() == i + 1);
      CHECK(derived[i].policy.name().rfind("recompute_ops(", 0) == 0);
      CHECK(derived[i].freed_bytes > (i > 0 ? derived[i - 1].freed_bytes : 0.0));
      if (i > 0) {
        CHECK(std::equal(derived[i - 1].classes.begin(), derived[i - 1].classes.end(),
                         derived[i].classes.begin()));
      }
    }
    remat::plan::Chain profiled = remat::plan::profile(
        chain.layers, x, loss,
        remat::plan::ProfileOptions{.repeats = 1, .policies = {}, .derived_policies = 3});
    // every derived policy keeps something and has a name of its own: all are profiled, in order
    REQUIRE(profiled.policies.size() == profiled.derived.size());
    for (std::size_t i = 0; i < profiled.derived.size(); ++i)
      CHECK(profiled.policies[i].policy == profiled.derived[i].policy);
    CHECK(profiled.policies.size() <= 3);
    offered += profiled.policies.empty() ? 0 : 1;
    // costs from the seed, not the clock, so that the plans reproduce (the derived policies
    // themselves rest on measured times)
    for (std::size_t l = 0; l < n; ++l) {
      profiled.forward_cost[l] = static_cast<double>(2 + rng.uniform_int(9));
      for (auto& q : profiled.policies) {
        q.replay_cost[l] = static_cast<double>(
            rng.uniform_int(static_cast<std::int64_t>(profiled.forward_cost[l])));
        for (auto& v : q.chained) v.replay_cost[l] = q.replay_cost[l];
      }
    }
    const double high = remat::plan::none(profiled).peak_bytes,
                 low = remat::plan::optimal(profiled, 0).peak_bytes;
    std::vector<std::pair<remat::plan::Plan, double>> plans;  // with the budget, or 0
    for (double f : {0.1, 0.3, 0.5, 0.7, 0.9}) {
      const double budget = low + f * (high - low);
      plans.emplace_back(remat::plan::budget(profiled, budget), budget);
    }
    for (remat::plan::Plan& p : remat::plan::frontier(profiled))
      plans.emplace_back(std::move(p), 0);
    for (const auto& planned : plans) {
      const remat::plan::Plan& p = planned.first;
      const double budget = planned.second;
      const std::size_t counted = policy_plan_step(chain, loss, x, p, &grads);
      INFO(p.describe() << "\ncounted " << counted << " bytes, budget " << budget);
      CHECK(p.peak_bytes == static_cast<double>(counted));
      if (budget > 0) CHECK(static_cast<double>(counted) <= budget);
      CHECK(policy_plan_equal(grads, plain_grads));
      for (const remat::plan::Segment& s : p.segments)
        planned_with += s.policy.keeps_anything() ? 1 : 0;
    }
  }
  if (!only) {
    CHECK(offered > cases / 2);  // most blocks have op classes worth recomputing
    CHECK(planned_with > 20);    // and plans use them
  }
}

TEST_CASE("derived policies: op classes split by output shape, classes freeing nothing left out",
          "[checkpoint][policy][profile]") {
  remat::Rng rng(9);
  remat::Parameter<float> up(rng.uniform_tensor<float>({16, 4}, -0.3, 0.3));
  remat::Parameter<float> down(rng.uniform_tensor<float>({4, 16}, -0.3, 0.3));
  const std::vector<std::function<remat::Var<float>(const remat::Var<float>&)>> layers(
      3, [&](const remat::Var<float>& h) {
        return remat::linear(remat::gelu(remat::linear(h, up)), down);
      });
  const remat::Tensor<float> x = rng.normal_tensor<float>({5, 4});
  std::vector<remat::plan::detail::OpClass> classes;
  std::vector<double> seconds;
  remat::plan::detail::survey_op_classes(layers, x, 2, classes, seconds);
  REQUIRE(classes.size() == 3);
  CHECK(classes[0].label() == "linear[5x16]");
  CHECK(classes[1].label() == "gelu");
  CHECK(classes[2].label() == "linear[5x4]");
  REQUIRE(seconds.size() == 3);
  for (double s : seconds) CHECK(s >= 0);
  // Recomputing either GEMM alone frees nothing (GELU saves the first one's output, the second
  // one's input is GELU's output, kept as GELU's value), so whatever the times, the first policy
  // recomputes GELU: its output, which the second GEMM saved, goes (5 x 16 floats per layer; the
  // GEMM, resaved, keeps its own output, the next layer's input, held anyway)
  const std::vector<remat::plan::DerivedPolicy> derived =
      remat::plan::derive_policies(layers, x, 5, 2);
  REQUIRE(!derived.empty());
  CHECK(derived[0].policy.name() == "recompute_ops(gelu)");
  CHECK(derived[0].freed_bytes == 3.0 * 5 * 16 * 4);
  // then the first GEMM, whose output GELU's replay no longer needs kept; recomputing the second
  // frees nothing (its output is the next layer's input), and the prefix recomputing all three
  // classes would be a plain segment
  REQUIRE(derived.size() == 2);
  CHECK(derived[1].policy.name() == "recompute_ops(gelu, linear[5x16])");
  CHECK(derived[1].freed_bytes == 2 * 3.0 * 5 * 16 * 4);
  // a policy over a class split by shape recomputes only that shape's ops
  const remat::SavePolicy first_gemm = remat::plan::detail::recompute_classes({classes[0]});
  const remat::Shape wide{5, 16}, narrow{5, 4};
  CHECK(first_gemm.name() == "recompute_ops(linear[5x16])");
  CHECK_FALSE(first_gemm.keeps(remat::OpInfo{remat::op::linear, wide, 0.0}));
  CHECK(first_gemm.keeps(remat::OpInfo{remat::op::linear, narrow, 0.0}));
  CHECK(first_gemm.keeps(remat::OpInfo{remat::op::gelu, wide, 0.0}));
}

TEST_CASE("policy plans: bad input is a PlanError naming the segment or the policy",
          "[checkpoint][plan][policy]") {
  remat::Rng rng(4);
  const remat::plan::Chain chain = policy_plan_chain(4, rng, {remat::save_matmuls()});
  const auto message = [&](const std::vector<remat::plan::Segment>& segments) {
    try {
      remat::plan::predict(chain, segments);
    } catch (const remat::PlanError& e) {
      return std::string(e.what());
    }
    return std::string("no PlanError");
  };
  // over two layers, nested, a policy the chain has no costs for
  CHECK(message({remat::plan::Segment{1, 3, {}, remat::save_matmuls()}})
            .find("segment [1, 3) carries the policy 'save_matmuls'") != std::string::npos);
  CHECK(
      message({remat::plan::Segment{0, 3, {remat::plan::Segment{1, 2, {}, remat::save_matmuls()}}}})
          .find("[1, 2) (nested)") != std::string::npos);
  const std::string unknown = message({remat::plan::Segment{
      2, 3, {}, remat::save_if("mine", [](const remat::OpInfo&) { return true; })}});
  CHECK(unknown.find("'mine'") != std::string::npos);
  CHECK(unknown.find("it has: save_matmuls") != std::string::npos);
  CHECK(message({remat::plan::Segment{2, 3, {}, remat::save_matmuls()}}) == "no PlanError");
  // inconsistent costs
  remat::plan::Chain c = chain;
  c.policies[0].replay_cost.pop_back();
  CHECK_THROWS_WITH(remat::plan::none(c),
                    Catch::Contains("policy 'save_matmuls'") &&
                        Catch::Contains("3 values where the chain has 4 layers"));
  c = chain;
  c.policies[0].activation_bytes[2] = -1;
  CHECK_THROWS_WITH(remat::plan::budget(c, 1e9), Catch::Contains("-1 for layer 2"));
  c = chain;
  c.policies.push_back(c.policies[0]);
  CHECK_THROWS_WITH(remat::plan::frontier(c),
                    Catch::Contains("two entries for policy 'save_matmuls'"));
  c = chain;
  c.policies[0].policy = remat::save_nothing();
  CHECK_THROWS_AS(remat::plan::every(c), remat::PlanError);
}

TEST_CASE("Plan::describe says per layer what is kept and what is replayed",
          "[checkpoint][plan][policy]") {
  remat::plan::Chain c = remat::plan::Chain::uniform(3, 1 << 20, 3 << 20);
  remat::plan::PolicyCosts q;
  q.policy = remat::save_matmuls();
  q.activation_bytes = {2 << 20, 2 << 20, 2 << 20};
  q.forward_transient_bytes = q.backward_transient_bytes = {0, 0, 0};
  q.saves_input = {true, true, true};
  q.saves_output = {false, false, false};
  q.replay_cost = {0.25, 0.25, 0.25};
  c.policies.push_back(q);
  const remat::plan::Plan p = remat::plan::custom(
      c, {remat::plan::Segment{0, 1, {}, remat::save_matmuls()}, remat::plan::Segment{1, 2, {}}});
  const std::string d = p.describe();
  INFO(d);
  CHECK(d.find(p.summary() + "\n") == 0);
  CHECK(d.find("\n  layer 0: save_matmuls, keeps 2.00 MiB, replays the rest (1.00 MiB, 25 % of its "
               "forward time)") != std::string::npos);
  CHECK(d.find("\n  layer 1: replayed in segment [1, 2) at depth 1, recomputes 3.00 MiB, the "
               "segment keeps its input (1.00 MiB)") != std::string::npos);
  CHECK(d.find("\n  layer 2: kept, 3.00 MiB") != std::string::npos);
  CHECK(p.recompute == 1.25);  // layer 0's replay and layer 1's forward
}

TEST_CASE("GPT::loss runs op-level budget plans: predicted peak counted, plain gradients",
          "[checkpoint][policy][nn][gpt]") {
  remat::Rng rng(12);
  for (const bool chunked : {true, false}) {
    remat::nn::GPT<float> gpt(remat::nn::GPTConfig{.vocab = 13,
                                                   .context = 12,
                                                   .layers = 4,
                                                   .heads = 2,
                                                   .width = 16,
                                                   .dropout = 0.1,
                                                   .seed = 5});
    remat::Tensor<std::int32_t> ids({3, 12}), targets({3, 12});
    for (auto& t : ids) t = static_cast<std::int32_t>(rng.uniform_int(13));
    for (auto& t : targets) t = static_cast<std::int32_t>(rng.uniform_int(13));
    const auto step = [&](const remat::plan::Plan* p, std::vector<remat::Tensor<float>>& grads) {
      for (auto q : gpt.parameters()) q.zero_grad();
      remat::memory::Probe probe;
      {
        remat::Tape tape(remat::TapeOptions{.seed = 9});
        tape.backward(gpt.loss(ids, targets, {.plan = p, .chunked = chunked}));
      }
      grads.clear();
      for (auto q : gpt.parameters()) grads.push_back(q.grad().clone());
      return probe.peak_above_start();
    };
    std::vector<remat::Tensor<float>> plain, grads;
    step(nullptr, plain);  // warm-up: gradient buffers
    step(nullptr, plain);
    const std::vector<remat::SavePolicy> policies{
        remat::save_matmuls(), remat::save_ops({remat::op::linear, remat::op::attention})};
    remat::plan::Chain chain =
        gpt.profile(ids, targets, {.chunked = chunked},
                    remat::plan::ProfileOptions{.repeats = 1, .policies = policies});
    for (auto q : gpt.parameters()) q.zero_grad();
    for (std::size_t l = 0; l < chain.layers();
         ++l) {  // reproducible costs: replaying a policy layer costs less
      chain.forward_cost[l] = 10;
      for (std::size_t p = 0; p < 2; ++p) {
        chain.policies[p].replay_cost[l] = p == 0 ? 6 : 2;
        for (auto& v : chain.policies[p].chained) v.replay_cost[l] = p == 0 ? 6 : 2;
      }
    }
    const remat::plan::Plan none = remat::plan::none(chain);
    const double high = none.peak_bytes, low = remat::plan::every(chain).peak_bytes;
    // GPT's chain leaves out what the embeddings hold for their backward (the position ids, a
    // few bytes), so even none()'s prediction is that much low: op-level plans must add no error
    const double offset = static_cast<double>(step(&none, grads)) - none.peak_bytes;
    CHECK(offset >= 0);
    CHECK(offset <= 4.0 * 12);
    int op_level = 0;
    for (double f : {0.2, 0.5, 0.8}) {
      const double budget = low + f * (high - low);
      const remat::plan::Plan p = remat::plan::budget(chain, budget);
      const std::size_t counted = step(&p, grads);
      INFO((chunked ? "chunked: " : "plain loss: ")
           << p.describe() << "\nbudget " << budget << ", counted " << counted);
      CHECK(p.peak_bytes + offset == static_cast<double>(counted));
      CHECK(static_cast<double>(counted) <= budget);
      CHECK(policy_plan_equal(grads, plain));
      for (const remat::plan::Segment& s : p.segments)
        op_level += s.policy.keeps_anything() ? 1 : 0;
    }
    CHECK(op_level > 0);
  }
}

TEST_CASE("plan::frontier with policies: no enumerated plan beats a point",
          "[checkpoint][plan][policy][bruteforce]") {
  const std::vector<remat::SavePolicy> policies{
      remat::save_matmuls(),
      remat::save_if("big", [](const remat::OpInfo& op) { return op.flops > 1e6; })};
  remat::Rng rng(77);
  int op_level_points = 0;
  for (int c = 0; c < 30; ++c) {
    const std::size_t n = 1 + static_cast<std::size_t>(rng.uniform_int(5));
    const remat::plan::Chain chain = policy_plan_chain(n, rng, policies);
    const std::vector<remat::plan::Plan> f = remat::plan::frontier(chain);
    INFO("case " << c << ", " << n << " layers");
    REQUIRE(!f.empty());
    for (std::size_t i = 1; i < f.size(); ++i) {
      CHECK(f[i].peak_bytes < f[i - 1].peak_bytes);
      CHECK(f[i].recompute > f[i - 1].recompute);
    }
    for (const remat::plan::Plan& p : f) {
      CHECK(remat::plan::predict(chain, p.segments).peak_bytes == p.peak_bytes);
      for (const remat::plan::Segment& s : p.segments)
        op_level_points += s.policy.keeps_anything() ? 1 : 0;
    }
    std::vector<std::vector<remat::plan::Segment>> plans;
    std::vector<remat::plan::Segment> cur;
    enumerate_policy_plans(0, n, policies, cur, plans);
    for (const auto& segments : plans) {
      const remat::plan::Prediction q = remat::plan::predict(chain, segments);
      for (const remat::plan::Plan& p : f) {
        if (q.peak_bytes <= p.peak_bytes) CHECK(q.recompute >= p.recompute);
      }
    }
  }
  CHECK(op_level_points > 0);
}

namespace {

/// A chain of `n` layers gelu(linear(h)) (width to width), as the mlp benchmark model.
remat_test::RandomBlock gelu_linear_block(int width) {
  remat_test::RandomBlock b;
  b.width = width;
  b.hidden = 2 * width;
  b.widths = {width, width, width};
  b.ops = {remat_test::BlockOp{remat_test::BlockOp::linear, 0, 0, width},
           remat_test::BlockOp{remat_test::BlockOp::unary, 1, 0, 0, 2}};
  return b;
}

}  // namespace

TEST_CASE("adjacent save_matmuls layers chain: a gelu(linear) layer keeps its linear output alone",
          "[checkpoint][policy][profile][random]") {
  remat::Rng rng(20261203);
  for (int c = 0; c < 12; ++c) {
    const int width = 4 << rng.uniform_int(3);
    const std::int64_t batch = 3 + rng.uniform_int(6);
    const std::size_t n = 2 + static_cast<std::size_t>(rng.uniform_int(6));
    remat_test::RandomChain chain(gelu_linear_block(width), n, batch, 40 + c);
    const remat_test::RandomLoss loss(static_cast<int>(rng.uniform_int(5)), batch, width, rng);
    const remat::Tensor<float> x = rng.normal_tensor<float>({batch, width});
    INFO("case " << c << ": " << n << " layers, width " << width << ", batch " << batch
                 << ", loss: " << remat_test::RandomLoss::names[loss.kind]);
    std::vector<remat::Tensor<float>> plain, grads;
    policy_plan_step(chain, loss, x, remat::plan::none(n));  // warm-up
    const std::size_t none_peak = policy_plan_step(chain, loss, x, remat::plan::none(n), &plain);
    remat::plan::Chain profiled = remat::plan::profile(
        chain.layers, x, loss,
        remat::plan::ProfileOptions{.repeats = 1, .policies = {remat::save_matmuls()}});
    const remat::plan::PolicyCosts& q = profiled.policies.at(0);
    REQUIRE(q.chained.size() == 3);
    const double h = static_cast<double>(batch * width * 4);  // one (batch, width) float tensor
    for (std::size_t l = 0; l < n; ++l) {
      // alone, a layer keeps its input (the segment's boundary, which the GEMM also saves) and
      // its linear output z
      CHECK(q.saves_input[l]);
      CHECK(q.activation_bytes[l] == h);
      // chained with the layer before, its segment rebuilds the input from that layer's kept z
      if (l > 0) {
        CHECK(!q.variant(2).saves_input[l]);
        CHECK(q.variant(2).activation_bytes[l] == h);
      }
      if (l > 0 && l + 1 < n) CHECK(!q.variant(3).saves_input[l]);
    }
    // every layer under save_matmuls, in adjacent segments (chained), and every() with it
    std::vector<remat::plan::Segment> all;
    for (std::size_t l = 0; l < n; ++l)
      all.push_back(remat::plan::Segment{l, l + 1, {}, remat::save_matmuls()});
    std::vector<remat::plan::Segment> every(all.begin(), all.end() - 1);
    for (const auto& segments : {all, every}) {
      const remat::plan::Plan p = remat::plan::custom(profiled, segments);
      const std::size_t counted = policy_plan_step(chain, loss, x, p, &grads);
      INFO(p.describe() << "\ncounted " << counted << " bytes, none " << none_peak);
      CHECK(p.peak_bytes == static_cast<double>(counted));
      CHECK(policy_plan_equal(grads, plain));
      // no layer but the first keeps its input h: none keeps n (h, z) pairs
      CHECK(static_cast<double>(counted) <=
            static_cast<double>(none_peak) - (static_cast<double>(n) - 2.0) * h);
    }
  }
}

TEST_CASE("adjacent policy layers without chained figures are a PlanError",
          "[checkpoint][plan][policy]") {
  remat::Rng rng(3);
  remat::plan::Chain c = policy_plan_chain(4, rng, {remat::save_matmuls()});
  const std::vector<remat::plan::Segment> adjacent{
      remat::plan::Segment{1, 2, {}, remat::save_matmuls()},
      remat::plan::Segment{2, 3, {}, remat::save_matmuls()}};
  CHECK_NOTHROW(remat::plan::predict(c, adjacent));
  c.policies[0].chained.clear();
  CHECK_THROWS_WITH(remat::plan::predict(c, adjacent),
                    Catch::Contains("layers 1 and 2 run under the policy 'save_matmuls'") &&
                        Catch::Contains("no figures for chained layers"));
  c.policies[0].chained.resize(2, c.policies[0]);
  CHECK_THROWS_WITH(remat::plan::predict(c, adjacent), Catch::Contains("3 or none"));
  // without chained figures, budget() never places two such layers side by side
  c.policies[0].chained.clear();
  const double high = remat::plan::none(c).peak_bytes, low = remat::plan::optimal(c, 0).peak_bytes;
  for (double f : {0.0, 0.3, 0.6, 0.9}) {
    const remat::plan::Plan p = remat::plan::budget(c, low + f * (high - low));
    for (std::size_t i = 1; i < p.segments.size(); ++i) {
      CHECK(!(p.segments[i].policy.keeps_anything() &&
              p.segments[i].policy == p.segments[i - 1].policy &&
              p.segments[i - 1].end == p.segments[i].begin));
    }
  }
}
