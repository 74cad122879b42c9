// Depth at scale: a 10,000-layer chain trains inside a 2 MiB activation budget, where a sqrt(n)
// plan does not fit and a multi-level plan does, with the gradients of the unplanned run.
#include "support/gradcheck.hpp"
#include "support/models.hpp"

#include <remat/optim/sgd.hpp>

using namespace remat;

TEST_CASE("a 10,000-layer chain trains with a nested plan inside a 2 MiB activation budget",
          "[checkpoint][depth]") {
  constexpr int kLayers = 10000, kWidth = 64, kBatch = 64;
  constexpr std::size_t kBudget = 2 * 1024 * 1024;
  remat::test::ChainModel model(kLayers, kWidth, "tanh", 1);
  Rng rng(2);
  const auto x = rng.normal_tensor<float>({kBatch, kWidth});
  const auto targets = remat::test::targets(kBatch, kWidth, 3);
  const auto loss_of = [&](const Var<float>& y) { return cross_entropy(y, targets); };
  const auto params = model.parameters();
  optim::SGD<float> sgd(params, {.lr = 0.05});

  const auto step = [&](const plan::Plan& p, std::size_t* peak) {
    memory::Probe probe;
    float loss = 0;
    {
      Tape tape;
      const Var<float> l = loss_of(checkpoint_sequential(model.layers, p, tape.input(x)));
      tape.backward(l);
      loss = l.item();
    }
    if (peak) *peak = probe.peak_above_start();
    return loss;
  };

  step(plan::none(std::size_t{kLayers}), nullptr);  // warm-up: gradient buffers
  for (auto q : params) q.zero_grad();
  const plan::Chain chain =
      plan::profile(model.layers, x, loss_of, plan::ProfileOptions{.repeats = 1});
  for (auto q : params) q.zero_grad();
  CHECK(plan::sqrt(chain).peak_bytes > kBudget);  // sqrt(n) does not fit
  const plan::Plan p = plan::budget(chain, kBudget);
  INFO(p.describe());
  CHECK(p.depth() > 1);
  CHECK(p.peak_bytes <= kBudget);

  // the unplanned gradients, then the planned ones: equal with ==
  step(plan::none(std::size_t{kLayers}), nullptr);
  std::vector<std::vector<float>> plain;
  for (const auto& q : params) plain.push_back(q.grad().to_vector());
  for (auto q : params) q.zero_grad();
  std::size_t peak = 0;
  step(p, &peak);
  CHECK(peak <= kBudget);
  bool equal = true;
  for (std::size_t i = 0; i < params.size(); ++i)
    equal = equal && params[i].grad().to_vector() == plain[i];
  CHECK(equal);

  // and a few training steps stay within the budget while the loss goes down
  float first = 0, last = 0;
  for (int s = 0; s < 3; ++s) {
    for (auto q : params) q.zero_grad();
    const float loss = step(p, &peak);
    CHECK(peak <= kBudget);
    sgd.step();
    if (s == 0) first = loss;
    last = loss;
  }
  CHECK(last < first);
}
