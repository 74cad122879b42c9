// Planner tests. The judges are independent of the planners' own recursions:
// - one-level plans: every plan is enumerated and run through plan::predict();
// - nested plans: Dijkstra over every schedule of Griewank's model (advance a step, store or
//   drop a snapshot, restore one, reverse the last step), which knows nothing of segments.
#include <catch2/catch.hpp>
#include <remat/checkpoint/plan.hpp>
#include <remat/core/rng.hpp>

#include <map>
#include <queue>
#include <tuple>

using namespace remat::plan;

namespace {

Chain random_chain(std::size_t n, std::uint64_t seed) {
  remat::Rng rng(seed);
  Chain c;
  for (std::size_t i = 0; i <= n; ++i) c.boundary_bytes.push_back(std::floor(rng.uniform(1, 20)));
  for (std::size_t i = 0; i < n; ++i) {
    c.activation_bytes.push_back(std::floor(rng.uniform(0, 40)));
    c.forward_transient_bytes.push_back(std::floor(rng.uniform(0, 10)));
    c.backward_transient_bytes.push_back(std::floor(rng.uniform(0, 10)));
    c.forward_cost.push_back(std::floor(rng.uniform(1, 9)));
    c.saves_output.push_back(rng.uniform() < 0.5);
    c.saves_input.push_back(rng.uniform() < 0.7);
    c.segment_transient_bytes.push_back(std::floor(rng.uniform(0, 40)));
    c.replay_transient_bytes.push_back(std::floor(rng.uniform(0, 10)));
    c.replay_free_peak_bytes.push_back(std::floor(rng.uniform(0, 80)));
    c.dropped_transient_bytes.push_back(std::floor(rng.uniform(0, 40)));
    c.dropped_free_peak_bytes.push_back(std::floor(rng.uniform(0, 60)));
  }
  c.loss_bytes = std::floor(rng.uniform(0, 10));
  c.loss_output_bytes = std::floor(rng.uniform(0, 3));
  c.loss_forward_transient_bytes = std::floor(rng.uniform(0, 25));
  c.loss_backward_transient_bytes = std::floor(rng.uniform(0, 25));
  c.output_held = rng.uniform() < 0.5;
  return c;
}

Chain uniform_chain(std::size_t n) {
  Chain c = Chain::uniform(n, 4, 8, 1);
  c.forward_transient_bytes.assign(n, 2);
  c.backward_transient_bytes.assign(n, 3);
  return c;
}

// Every one-level plan: each layer plain, or part of a segment of any length.
void enumerate_one_level(std::size_t s, std::size_t n, std::vector<Segment>& cur,
                         std::vector<std::vector<Segment>>& out) {
  if (s == n) {
    out.push_back(cur);
    return;
  }
  enumerate_one_level(s + 1, n, cur, out);
  for (std::size_t e = s + 1; e <= n; ++e) {
    cur.push_back(Segment{s, e, {}});
    enumerate_one_level(e, n, cur, out);
    cur.pop_back();
  }
}

// The fewest forward evaluations of any schedule reversing the chain with at most `slots`
// snapshots besides the input (Griewank's model, one taped step at a time).
double dijkstra_schedules(const Chain& c, std::size_t slots) {
  const int n = static_cast<int>(c.layers());
  using State =
      std::tuple<int, int, unsigned>;  // steps left, current position (-1: none), snapshots
  std::map<State, double> dist;
  using Item = std::pair<double, State>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> queue;
  const auto relax = [&](const State& s, double d) {
    auto it = dist.find(s);
    if (it == dist.end() || d < it->second) {
      dist[s] = d;
      queue.push({d, s});
    }
  };
  relax({n, 0, 0u}, 0);
  while (!queue.empty()) {
    const auto [d, st] = queue.top();
    queue.pop();
    if (d > dist[st]) continue;
    const auto [left, cur, snaps] = st;
    if (left == 0) return d;
    if (cur >= 0 && cur + 1 <= left - 1) relax({left, cur + 1, snaps}, d + c.cost(cur));  // advance
    if (cur >= 1 && !(snaps >> cur & 1u) &&
        static_cast<std::size_t>(__builtin_popcount(snaps)) < slots) {
      relax({left, cur, snaps | 1u << cur}, d);  // store a snapshot
    }
    for (int p = 0; p < left; ++p) {
      if (p == 0 || (snaps >> p & 1u)) relax({left, p, snaps}, d);     // restore
      if (snaps >> p & 1u) relax({left, cur, snaps & ~(1u << p)}, d);  // drop
    }
    if (cur == left - 1) {  // reverse the last step: its taped forward, then its backward
      const unsigned keep = left - 1 >= 32 ? ~0u : (1u << (left - 1)) - 1;
      relax({left - 1, -1, snaps & keep}, d + c.cost(left - 1));
    }
  }
  return -1;
}

}  // namespace

TEST_CASE(
    "plan::predict: no checkpointing keeps every layer; one segment per layer keeps boundaries",
    "[checkpoint][plan]") {
  const Chain c = Chain::uniform(5, 10, 100);
  // none: peak at the start of backward: all five layers' activations, boundaries x_1..x_5, the
  // loss gradient
  CHECK(none(c).peak_bytes == 5 * 100 + 5 * 10 + 10);
  CHECK(none(c).recompute == 0);
  const Plan e = every(c);
  CHECK(e.segments.size() == 4);  // the last layer runs plainly
  CHECK(e.recompute == 4);
  CHECK(e.recompute_fraction == 0.8);
  // every: inputs x_1..x_3 captured, layer 4 kept (its 100 bytes, x_4 and x_5), the loss gradient
  CHECK(e.peak_bytes == 3 * 10 + 100 + 10 + 10 + 10);
  const Prediction p = predict(c, e.segments);
  CHECK(p.max_checkpoints == 3);
  CHECK(p.max_materialized == 1);
}

TEST_CASE("plan: sqrt cuts ceil(sqrt(n)) runs of near-equal length, all but the last checkpointed",
          "[checkpoint][plan]") {
  const Plan p = sqrt(std::size_t{10});
  REQUIRE(p.segments.size() == 3);  // runs [0,2) [2,5) [5,7) checkpointed, [7,10) plain
  CHECK(p.segments[0].begin == 0);
  CHECK(p.segments.back().end == 7);
  for (const Segment& s : p.segments) CHECK((s.end - s.begin == 2 || s.end - s.begin == 3));
  CHECK(p.recompute_fraction == 0.7);
}

TEST_CASE("plan::budget's dynamic program is optimal over every one-level plan",
          "[checkpoint][plan][bruteforce]") {
  for (std::size_t n = 1; n <= 10; ++n) {
    for (int variant = 0; variant < 3; ++variant) {
      const Chain c = variant == 0 ? uniform_chain(n) : random_chain(n, 100 * n + variant);
      std::vector<std::vector<Segment>> plans;
      std::vector<Segment> cur;
      enumerate_one_level(0, n, cur, plans);
      std::vector<Prediction> predicted;
      for (const auto& p : plans) predicted.push_back(predict(c, p));
      std::vector<double> budgets;
      for (const Prediction& p : predicted) budgets.push_back(p.peak_bytes);
      std::sort(budgets.begin(), budgets.end());
      budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
      for (double b : budgets) {
        double best = std::numeric_limits<double>::infinity();
        for (const Prediction& p : predicted) {
          if (p.peak_bytes <= b) best = std::min(best, p.recompute);
        }
        const auto choice = remat::plan::detail::OneLevelPlanner(c).best(b);
        INFO("n " << n << " variant " << variant << " budget " << b);
        REQUIRE(choice.recompute == best);
        const Prediction mine = predict(c, choice.segments);
        CHECK(mine.recompute == best);
        CHECK(mine.peak_bytes == choice.peak);  // the DP's closed form agrees with the simulation
        CHECK(mine.peak_bytes <= b);
        // budget() may prefer a nested plan, but only one that fits and recomputes less
        const Plan chosen = budget(c, b);
        CHECK(chosen.peak_bytes <= b);
        CHECK(chosen.recompute <= best);
      }
    }
  }
}

TEST_CASE("plan::optimal matches the best schedule of Griewank's model",
          "[checkpoint][plan][bruteforce]") {
  for (std::size_t n = 1; n <= 10; ++n) {
    for (int variant = 0; variant < 2; ++variant) {
      const Chain c = variant == 0 ? uniform_chain(n) : random_chain(n, 7 * n + variant);
      for (std::size_t slots = 0; slots < n; ++slots) {
        const double schedule = dijkstra_schedules(c, slots);
        const Plan p = optimal(c, slots);
        const Prediction pred = predict(c, p.segments);
        INFO("n " << n << " variant " << variant << " slots " << slots);
        // the first pass is one forward of every layer, which schedules count and plans do not
        CHECK(p.recompute == schedule - c.total_cost());
        CHECK(pred.max_checkpoints <= slots);
        CHECK(pred.max_materialized <= 1);
      }
    }
  }
}

TEST_CASE("plan::optimal, uniform: Griewank and Walther's binomial count", "[checkpoint][plan]") {
  // For n steps and s snapshots, t the least integer with C(s+t, s) >= n, the fewest forward
  // evaluations is t n - C(s+t, t-1), counting the advances (the first sweep's included) and not
  // the taped forward of each reversed step. In our terms: a plan's recompute counts every layer
  // forward after the first pass, taped or not, and the chain's input is kept for free, so a
  // plan with `slots` checkpoints recomputes exactly that count for s = slots + 1.
  const auto binom = [](std::size_t a, std::size_t b) {
    double r = 1;
    for (std::size_t i = 1; i <= b; ++i) r = r * double(a - b + i) / double(i);
    return r;
  };
  for (std::size_t n : {5, 17, 60, 200, 1000}) {
    for (std::size_t slots : {1, 2, 3, 5, 9}) {
      const std::size_t s = slots + 1;
      std::size_t t = 0;
      while (binom(s + t, s) < double(n)) ++t;
      const double forwards = double(t) * double(n) - (t == 0 ? 0.0 : binom(s + t, t - 1));
      const Plan p = optimal(std::size_t{n}, slots);
      INFO("n " << n << " slots " << slots << " t " << t);
      CHECK(p.recompute == forwards);
    }
  }
}

TEST_CASE("plan::optimal: the uniform recursion's bisection finds the same minimum as a full scan",
          "[checkpoint][plan]") {
  // Beyond kExactLayers layers the planner bisects on the slope of a convex cost; compare with
  // a plain memoized full scan of the same recursion.
  const std::size_t n = 150;
  std::map<std::tuple<std::size_t, std::size_t, bool>, double> memo;
  std::function<double(std::size_t, std::size_t, bool)> full = [&](std::size_t len, std::size_t k,
                                                                   bool root) -> double {
    const auto key = std::make_tuple(len, k, root);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    double best =
        root ? full(len, k, false) : double(len) + (len > 1 ? full(len - 1, k, false) : 0.0);
    if (k > 0 && len >= 2) {
      for (std::size_t m = 1; m <= (root ? len - 1 : len - 2); ++m) {
        const double c = root ? full(len - m, k - 1, true) + full(m, k, false)
                              : double(m) + full(len - m, k - 1, false) + full(m, k, false);
        best = std::min(best, c);
      }
    }
    return memo[key] = best;
  };
  for (std::size_t k : {0, 1, 2, 4, 7}) {
    remat::plan::detail::NestedPlanner planner(Chain::uniform(n), k);
    for (std::size_t len : {2, 3, 10, 49, 97, 150}) {
      CHECK(planner.t(0, len, k) == full(len, k, false));
      CHECK(planner.h(0, len, k) == full(len, k, true));
    }
  }
}

TEST_CASE("plan::optimal: one planner gives every slot count the plan a planner made for it gives",
          "[checkpoint][plan]") {
  // budget's and frontier's searches share one planner (its tables hold every smaller count)
  for (std::size_t n : {1, 2, 7, 30, 120}) {  // 120: the uniform mode
    for (int variant = 0; variant < 2; ++variant) {
      const Chain c = variant == 0 ? uniform_chain(n) : random_chain(n, 13 * n + variant);
      remat::plan::detail::NestedPlanner shared(c, n);
      // descending, so that the larger counts fill the tables first
      for (std::size_t slots = n + 1; slots-- > 0;) {
        INFO("n " << n << " variant " << variant << " slots " << slots);
        CHECK(shared.plan(slots) == remat::plan::detail::NestedPlanner(c, slots).plan(slots));
      }
    }
  }
}

TEST_CASE(
    "plan::budget gives the least recompute that fits, and names the smallest feasible budget",
    "[checkpoint][plan]") {
  const Chain c = uniform_chain(64);
  const Plan loose = budget(c, none(c).peak_bytes);
  CHECK(loose.recompute == 0);
  const Plan tight = budget(c, sqrt(c).peak_bytes);
  CHECK(tight.peak_bytes <= sqrt(c).peak_bytes);
  CHECK(tight.recompute <= sqrt(c).recompute);
  // below every one-level plan, a nested plan still fits
  const double low = optimal(c, 2).peak_bytes;
  const Plan nested = budget(c, low);
  CHECK(nested.peak_bytes <= low);
  CHECK(nested.depth() > 1);
  const double least = optimal(c, 0).peak_bytes;
  try {
    budget(c, least - 1);
    FAIL("expected a PlanError");
  } catch (const remat::PlanError& e) {
    CHECK_THAT(e.what(), Catch::Contains("smallest feasible budget") &&
                             Catch::Contains(std::to_string(int(least))));
  }
  CHECK_THROWS_AS(budget(c, -5), remat::PlanError);
}

TEST_CASE("planners reject malformed chains and plans", "[checkpoint][plan][errors]") {
  Chain c = Chain::uniform(3);
  c.boundary_bytes.pop_back();
  CHECK_THROWS_WITH(
      every(c), Catch::Contains("plan::every: chain has 3 layers but 3 boundary sizes (needs 4)"));
  Chain d = Chain::uniform(3);
  d.activation_bytes[1] = -1;
  CHECK_THROWS_AS(sqrt(d), remat::PlanError);
  CHECK_THROWS_AS(predict(Chain::uniform(3), {Segment{0, 2, {}}, Segment{1, 3, {}}}),
                  remat::PlanError);
  CHECK_THROWS_AS(predict(Chain::uniform(3), {Segment{0, 4, {}}}), remat::PlanError);
  CHECK_THROWS_AS(predict(Chain::uniform(3), {Segment{0, 3, {Segment{0, 3, {}}}}}),
                  remat::PlanError);
}

TEST_CASE("Plan::describe names the planner and prints sizes in B, KiB and MiB",
          "[checkpoint][plan]") {
  CHECK(std::string(to_string(Kind::budget)) == "budget");
  CHECK(std::string(to_string(Kind::custom)) == "custom");
  CHECK(format_bytes(812) == "812 B");
  CHECK(format_bytes(3.25 * 1024) == "3.25 KiB");
  CHECK(format_bytes(1.5 * 1024 * 1024) == "1.50 MiB");
  CHECK(format_bytes(3.0 * 1024 * 1024 * 1024) == "3.00 GiB");
  const Plan p = every(Chain::uniform(4, 1 << 20, 3 << 20));
  CHECK(p.kind == Kind::every);
  // x_1, x_2 captured, layer 3 kept (3 MiB, x_3, x_4), the loss gradient: 8 MiB
  CHECK(p.summary() ==
        "every: 3 segments over 4 layers, depth 1, predicted peak 8.00 MiB, recompute 75.0 % of a "
        "forward");
  CHECK(p.describe().find(
            p.summary() +
            "\n  layer 0: replayed in segment [0, 1) at depth 1, recomputes 3.00 MiB") == 0);
  CHECK(optimal(std::size_t{6}, 2).describe().find("optimal: ") == 0);
  CHECK(optimal(std::size_t{6}, 2).describe().find("predicted peak") ==
        std::string::npos);  // made from a count
  CHECK(custom(Chain::uniform(2), {Segment{0, 1, {}}}).kind == Kind::custom);
}

TEST_CASE("plan::frontier: Pareto points no one-level or binomial plan beats",
          "[checkpoint][plan][bruteforce]") {
  for (std::size_t n = 1; n <= 8; ++n) {
    for (int variant = 0; variant < 3; ++variant) {
      const Chain c = variant == 0 ? uniform_chain(n) : random_chain(n, 31 * n + variant);
      const std::vector<Plan> f = frontier(c);
      INFO("n " << n << " variant " << variant);
      REQUIRE(!f.empty());
      CHECK(f.front().recompute == 0);  // the first point keeps everything
      for (std::size_t i = 1; i < f.size(); ++i) {
        CHECK(f[i].peak_bytes < f[i - 1].peak_bytes);
        CHECK(f[i].recompute > f[i - 1].recompute);
      }
      for (const Plan& p : f) CHECK(predict(c, p.segments).peak_bytes == p.peak_bytes);
      // the least-memory point needs no more than the binomial plan with no checkpoints
      CHECK(f.back().peak_bytes <= optimal(c, 0).peak_bytes);
      std::vector<std::vector<Segment>> plans;
      std::vector<Segment> cur;
      enumerate_one_level(0, n, cur, plans);
      for (std::size_t k = 0; k < n; ++k) plans.push_back(optimal(c, k).segments);
      for (const auto& segments : plans) {
        const Prediction q = predict(c, segments);
        for (const Plan& p : f) {
          if (q.peak_bytes <= p.peak_bytes) CHECK(q.recompute >= p.recompute);
        }
      }
    }
  }
}
