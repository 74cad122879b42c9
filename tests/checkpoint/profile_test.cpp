// Predicted against counted memory: plan::profile() measures a chain, the planners predict each
// plan's peak, and the counting allocator says what a real step used.
#include "support/gradcheck.hpp"
#include "support/models.hpp"

using namespace remat;
using remat::test::ChainModel;

namespace {

constexpr int kBatch = 16, kWidth = 32;
constexpr std::size_t kBoundary = kBatch * kWidth * sizeof(float);

/// Peak bytes above the step's start for one step (forward, sum loss, backward) under `p`. The
/// step holds the chain's output until backward ends (Chain::output_held) unless `hold` is false.
std::size_t counted_peak(ChainModel& model, const Tensor<float>& x, const plan::Plan& p,
                         bool hold = true) {
  for (auto q : model.parameters()) q.zero_grad();  // keeps the buffers: steady state
  memory::Probe probe;
  {
    Tape tape;
    if (hold) {
      const Var<float> y = checkpoint_sequential(model.layers, p, tape.input(x));
      tape.backward(sum(y));
    } else {
      const Var<float> loss =
          sum(checkpoint_sequential(model.layers, p, tape.input(x)));  // y dies here
      tape.backward(loss);
    }
  }
  return probe.peak_above_start();
}

}  // namespace

TEST_CASE(
    "one checkpoint per layer: the counted peak is n boundaries, one layer's interior and "
    "gradients",
    "[checkpoint][memory]") {
  // n layers of Linear + GELU on (16, 32) floats: every boundary, interior and gradient is
  // B = 2 KiB. The n-1 segments keep their inputs x_1..x_{n-2} (x_0 exists before the step);
  // the last layer runs plainly and keeps its input x_{n-1} and its interior z (the linear
  // output GELU saves). The peak comes in that layer's backward: those n blocks, the loss's
  // gradient of x_n and GELU's gradient of z, n + 2 blocks, plus the loss value and its seed
  // (one float each).
  for (int n : {8, 64}) {
    ChainModel model(n, kWidth, "gelu", 1);
    Rng rng(2);
    const auto x = rng.normal_tensor<float>({kBatch, kWidth});
    counted_peak(model, x, plan::none(std::size_t(n)));  // warm-up: parameter gradient buffers
    const std::size_t every = counted_peak(model, x, plan::every(std::size_t(n)), false);
    CHECK(every == (n + 2) * kBoundary + 2 * sizeof(float));
    // without checkpoints each layer keeps its input and its linear output: 2n blocks and more
    CHECK(counted_peak(model, x, plan::none(std::size_t(n))) > 2 * n * kBoundary);
  }
}

TEST_CASE("predicted peaks equal counted peaks to the byte on chains of 64 and 256 layers",
          "[checkpoint][memory][profile]") {
  for (int n : {64, 256}) {
    for (const char* activation : {"gelu", "tanh"}) {
      ChainModel model(n, kWidth, activation, 3);
      Rng rng(4);
      const auto x = rng.normal_tensor<float>({kBatch, kWidth});
      counted_peak(model, x, plan::none(std::size_t(n)));  // warm-up
      const plan::Chain chain =
          plan::profile(model.layers, x, [](const Var<float>& y) { return sum(y); });
      for (auto q : model.parameters()) q.zero_grad();
      CHECK(chain.boundary_bytes[1] == kBoundary);
      CHECK(chain.saves_output[0] == (std::string(activation) == "tanh"));
      const double none_peak = plan::none(chain).peak_bytes;
      for (const plan::Plan& p :
           {plan::none(chain), plan::every(chain), plan::sqrt(chain), plan::optimal(chain, 1),
            plan::optimal(chain, 6), plan::budget(chain, none_peak / 3),
            plan::budget(chain, none_peak / 10)}) {
        const double counted = static_cast<double>(counted_peak(model, x, p));
        INFO(n << " layers, " << activation << ", " << p.describe() << ", counted " << counted);
        CHECK(p.peak_bytes == counted);
        // a caller that lets the output go: x_n lives at most until the loss's backward is done
        plan::Chain unheld = chain;
        unheld.output_held = false;
        const plan::Plan q = plan::custom(unheld, p.segments);
        CHECK(q.peak_bytes <= p.peak_bytes);
        CHECK(static_cast<double>(counted_peak(model, x, p, false)) <= q.peak_bytes);
      }
    }
  }
}

TEST_CASE("BF16 linear + tanh layers share each tanh's copy with the next linear, priced exactly",
          "[checkpoint][memory][profile][precision]") {
  // Note [shared copies]: each tanh keeps a bfloat16 copy of its output, which the next linear
  // saves as its input. A layer run while the layer before is kept keeps that copy less,
  // 16 x 32 bfloat16 values; every planner's prediction must hold both cases to the byte, for
  // plain layers and for layers under a save policy.
  const PrecisionGuard bf16(Precision::bf16);
  const int n = 24;
  ChainModel model(n, kWidth, "tanh", 11);
  Rng rng(12);
  const auto x = rng.normal_tensor<float>({kBatch, kWidth});
  counted_peak(model, x, plan::none(std::size_t(n)));  // warm-up
  const plan::Chain chain =
      plan::profile(model.layers, x, [](const Var<float>& y) { return sum(y); });
  for (auto q : model.parameters()) q.zero_grad();
  REQUIRE(chain.with_input_copy);
  CHECK_FALSE(chain.unpriced_copies);
  REQUIRE(chain.policies.size() == 1);  // save_matmuls, measured both ways too
  const double copy = kBatch * kWidth * 2.0;
  for (std::size_t l = 0; l < std::size_t(n); ++l) {
    CHECK(chain.keeps_output_copy(l));
    if (l > 0) CHECK(chain.activation(l) - chain.with_input_copy->activation(l) == copy);
  }
  const double none_peak = plan::none(chain).peak_bytes;
  plan::Chain layers_only = chain;  // a planner over whole layers only, as remat_bench offers
  layers_only.policies.clear();
  for (const plan::Plan& p :
       {plan::none(chain), plan::every(chain), plan::sqrt(chain), plan::optimal(chain, 1),
        plan::optimal(chain, 4), plan::budget(chain, none_peak / 2),
        plan::budget(chain, none_peak / 3), plan::budget(layers_only, none_peak / 3),
        plan::custom(chain, {plan::Segment{3, 9, {plan::Segment{5, 7, {}}}}}),
        // policy layers: alone, after a kept layer, chained with each other, before a segment
        plan::custom(
            chain,
            {plan::Segment{2, 3, {}, save_matmuls()}, plan::Segment{5, 6, {}, save_matmuls()},
             plan::Segment{6, 7, {}, save_matmuls()}, plan::Segment{7, 8, {}, save_matmuls()},
             plan::Segment{8, 12, {}}, plan::Segment{12, 13, {}, save_matmuls()}})}) {
    INFO(p.describe());
    CHECK(p.predicted);
    CHECK(p.peak_bytes == static_cast<double>(counted_peak(model, x, p)));
  }
  // The loss runs with with_input_copy's figures after a last layer kept with its copy: a chain
  // without its loss (will_it_fit's layers' own peak; a profile with no loss) zeroes them too.
  REQUIRE(chain.with_input_copy->loss_backward_transient_bytes > 0);
  const plan::Chain no_loss = plan::profile(model.layers, x);
  for (auto q : model.parameters()) q.zero_grad();
  for (const plan::Chain& c : {chain.without_loss(), no_loss}) {
    REQUIRE(c.with_input_copy);
    for (const plan::Chain* figures : {&c, c.with_input_copy.get()}) {
      CHECK(figures->loss_bytes == 0);
      CHECK(figures->loss_output_bytes == 0);
      CHECK(figures->loss_forward_transient_bytes == 0);
      CHECK(figures->loss_backward_transient_bytes == 0);
    }
  }
}

TEST_CASE(
    "BF16: a layer passing on a view of the copy the layer before kept is refused, not priced",
    "[checkpoint][profile][precision]") {
  // Note [shared copies]: a layer whose output is a view of its input (a reshape) hands on the
  // copy the layer before it kept; whose copy that is, no layer-level figure can say
  const PrecisionGuard bf16(Precision::bf16);
  ChainModel model(4, kWidth, "tanh", 13);
  std::vector<remat::test::Layer> layers;
  for (const remat::test::Layer& layer : model.layers) {
    layers.push_back(layer);
    layers.push_back([](const Var<float>& y) { return reshape(y, {kBatch, kWidth}); });
  }
  Rng rng(14);
  const auto x = rng.normal_tensor<float>({kBatch, kWidth});
  const plan::Chain chain = plan::profile(layers, x, [](const Var<float>& y) { return sum(y); });
  for (auto q : model.parameters()) q.zero_grad();
  CHECK(chain.unpriced_copies);
  CHECK_FALSE(plan::none(chain).predicted);
  CHECK_FALSE(plan::every(chain).predicted);
  CHECK_THROWS_WITH(plan::budget(chain, 1e9), Catch::Contains("cannot price"));
  CHECK_THROWS_AS(plan::optimal(chain, 1), PlanError);
  CHECK_THROWS_AS(plan::frontier(chain), PlanError);
}

TEST_CASE("a budget plan's counted peak stays within its budget", "[checkpoint][memory][profile]") {
  const int n = 64;
  ChainModel model(n, kWidth, "gelu", 5);
  Rng rng(6);
  const auto x = rng.normal_tensor<float>({kBatch, kWidth});
  counted_peak(model, x, plan::none(std::size_t(n)));
  const plan::Chain chain =
      plan::profile(model.layers, x, [](const Var<float>& y) { return sum(y); });
  for (double fraction : {0.9, 0.5, 0.25, 0.1, 0.05}) {
    const double budget = fraction * plan::none(chain).peak_bytes;
    const plan::Plan p = plan::budget(chain, budget);
    INFO(p.describe() << ", budget " << budget);
    CHECK(p.peak_bytes <= budget);
    CHECK(static_cast<double>(counted_peak(model, x, p)) <= budget);
  }
}

TEST_CASE("profile measures boundaries, activations, output saving and costs",
          "[checkpoint][profile]") {
  ChainModel model(4, kWidth, "gelu", 7);
  Rng rng(8);
  const auto x = rng.normal_tensor<float>({kBatch, kWidth});
  const plan::Chain c = plan::profile(model.layers, x, plan::ProfileOptions{.repeats = 2});
  REQUIRE(c.layers() == 4);
  for (std::size_t l = 0; l < 4; ++l) {
    CHECK(c.boundary_bytes[l] == kBoundary);
    CHECK(c.activation_bytes[l] == kBoundary);  // GELU keeps the linear output
    CHECK_FALSE(c.saves_output[l]);
    CHECK(c.forward_cost[l] > 0);
  }
  CHECK(c.loss_bytes == 0);
  CHECK_THROWS_AS(plan::profile(std::vector<remat::test::Layer>{}, x), PlanError);
}

TEST_CASE("profile prices each layer at its measured replay, attributed to the right layer",
          "[checkpoint][profile]") {
  // a light layer (one GEMM), a heavy one (twenty) and a light one: priced by the replay clock
  // (ProfileOptions::price_replays), the heavy layer must cost several times either light one;
  // a reading attributed to the wrong layer would invert that
  Rng rng(21);
  Parameter<float> w(rng.normal_tensor<float>({96, 96}, 0.0, 0.1));
  const auto light = [&](const Var<float>& x) { return tanh(linear(x, w)); };
  const auto heavy = [&](const Var<float>& x) {
    Var<float> h = x;
    for (int i = 0; i < 20; ++i) h = tanh(linear(h, w));
    return h;
  };
  const std::vector<std::function<Var<float>(const Var<float>&)>> layers{light, heavy, light};
  const auto x = rng.normal_tensor<float>({96, 96});
  // Clocks read under load (ctest runs two tests at once on two cores) can inflate one layer's
  // median: the ordering must show in one of three profiles. A wrong attribution fails all three.
  for (const bool replays : {true, false}) {
    plan::Chain c;
    const auto ordered = [&] {
      return c.forward_cost[1] > 4 * c.forward_cost[0] &&
             c.forward_cost[1] > 4 * c.forward_cost[2] && c.forward_cost[0] > 0;
    };
    for (int attempt = 0; attempt < 3 && (attempt == 0 || !ordered()); ++attempt)
      c = plan::profile(layers, x, plan::ProfileOptions{.repeats = 5, .price_replays = replays});
    INFO((replays ? "replay" : "first-pass") << " costs " << c.forward_cost[0] << ", "
                                             << c.forward_cost[1] << ", " << c.forward_cost[2]);
    CHECK(ordered());
  }
  w.zero_grad();
}
