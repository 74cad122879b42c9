#include "support/gradcheck.hpp"
#include "support/models.hpp"

#include <remat/nn/gpt.hpp>

using namespace remat;
using remat::test::error_message;

namespace {

nn::GPTConfig small(double dropout = 0.0, bool tied = false) {
  return nn::GPTConfig{.vocab = 11,
                       .context = 8,
                       .layers = 3,
                       .heads = 2,
                       .width = 8,
                       .dropout = dropout,
                       .tied = tied,
                       .seed = 3};
}

}  // namespace

TEST_CASE("GPT parameters have stable dotted names", "[nn][gpt]") {
  const nn::GPT<float> gpt(small());
  std::vector<std::string> names;
  for (const auto& [name, p] : gpt.named_parameters()) names.push_back(name);
  CHECK(names.front() == "wte.weight");
  CHECK(std::count(names.begin(), names.end(), "blocks.2.attn.qkv.weight") == 1);
  CHECK(std::count(names.begin(), names.end(), "blocks.0.mlp.proj.bias") == 1);
  CHECK(std::count(names.begin(), names.end(), "blocks.1.ln2.weight") == 1);
  CHECK(names.back() == "head.weight");
  CHECK(gpt.parameter("blocks.2.attn.qkv.weight").shape() == Shape{24, 8});
  CHECK_THROWS_AS(gpt.parameter("blocks.9.attn.qkv.weight"), ArgumentError);
  // embeddings 11x8 + 8x8; per block 2 LN (32) + qkv (8x24+24) + proj (72) + fc (8x32+32) + proj
  // (32x8+8); ln_f 16; head 88
  CHECK(gpt.parameter_count() == 88 + 64 + 3 * (32 + 216 + 72 + 288 + 264) + 16 + 88);
  const nn::GPT<float> tied(small(0.0, true));
  CHECK(tied.named_parameters().back().first == "ln_f.bias");
}

TEST_CASE("GPT: the chunked loss equals the plain one, and every plan gives the same gradients",
          "[nn][gpt]") {
  nn::GPT<float> gpt(small(0.1));
  const auto ids = remat::test::ids({2, 8}, 11, 1);
  const auto targets = remat::test::ids({2, 8}, 11, 2);
  const auto run = [&](const plan::Plan* p, bool chunked) {
    return remat::test::step(gpt.parameters(), [&](Tape&) {
      return gpt.loss(ids, targets, {.plan = p, .chunked = chunked});
    });
  };
  const auto plain = run(nullptr, false);
  const auto chunked = run(nullptr, true);
  CHECK(std::abs(chunked.loss - plain.loss) <= 1e-5f * plain.loss);
  const plan::Chain chain = plan::Chain::uniform(3, 1, 4);
  for (const plan::Plan& p :
       {plan::none(chain), plan::every(chain), plan::sqrt(chain), plan::optimal(chain, 1)}) {
    INFO(p.describe());
    const auto r = run(&p, true);
    CHECK(r.loss == chunked.loss);
    CHECK(r.grads == chunked.grads);
  }
}

TEST_CASE("GPT: parameter gradients of a double model match central differences",
          "[nn][gpt][gradcheck]") {
  nn::GPT<double> gpt(
      nn::GPTConfig{.vocab = 7, .context = 5, .layers = 2, .heads = 2, .width = 4, .seed = 4});
  const auto ids = remat::test::ids({2, 5}, 7, 3);
  const auto targets = remat::test::ids({2, 5}, 7, 4);
  for (auto p : gpt.parameters()) p.free_grad();
  {
    Tape tape;
    tape.backward(gpt.loss(ids, targets));
  }
  Rng pick(5);
  for (const auto& [name, param] : gpt.named_parameters()) {
    Parameter<double> p = param;
    const Tensor<double> g = p.grad().clone();
    for (int sample = 0; sample < 3; ++sample) {
      const std::int64_t i = pick.uniform_int(p.numel());
      const double x = p.value()[i];
      const auto loss_at = [&](double v) {
        p.data()[i] = v;
        NoGradGuard guard;
        return gpt.loss(ids, targets).item();
      };
      const double numeric = (loss_at(x + remat::test::kEps) - loss_at(x - remat::test::kEps)) /
                             (2 * remat::test::kEps);
      p.data()[i] = x;
      INFO(name << "[" << i << "]: analytic " << g[i] << ", numeric " << numeric);
      CHECK(std::abs(g[i] - numeric) <=
            remat::test::kAbsTol + remat::test::kRelTol * std::abs(numeric));
    }
  }
}

TEST_CASE("freezing a prefix stops its gradients", "[nn][gpt]") {
  nn::GPT<float> gpt(small());
  gpt.freeze("blocks.0.");
  const auto ids = remat::test::ids({1, 8}, 11, 1);
  Tape tape;
  tape.backward(gpt.loss(ids, ids));
  CHECK_FALSE(gpt.parameter("blocks.0.attn.qkv.weight").grad().defined());
  CHECK(gpt.parameter("blocks.1.attn.qkv.weight").grad().defined());
  CHECK(gpt.parameter("wte.weight").grad().defined());
  gpt.unfreeze();
  CHECK_THROWS_AS(gpt.freeze("nothing."), ArgumentError);
}

TEST_CASE("GPT rejects bad configs and inputs", "[nn][gpt][errors]") {
  CHECK_THROWS_AS(nn::GPT<float>(nn::GPTConfig{.heads = 3, .width = 8}), ArgumentError);
  const nn::GPT<float> gpt(small());
  CHECK_THAT(error_message([&] {
               gpt.logits(Tensor<std::int32_t>::zeros({1, 9}));
             }),
             Catch::Contains("context = 8"));
  CHECK_THROWS_AS(gpt.logits(Tensor<std::int32_t>::full({1, 2}, 11)), IndexError);
  CHECK_THROWS_AS(
      gpt.loss(Tensor<std::int32_t>::zeros({1, 2}), Tensor<std::int32_t>::zeros({2, 1})),
      ShapeError);
}

TEST_CASE("GPT parameter names are exactly those saved files use", "[nn][gpt]") {
  for (const bool tied : {false, true}) {
    const nn::GPT<float> gpt(small(0.1, tied));
    std::vector<std::string> want = {"wte.weight", "wpe.weight"};
    for (int b = 0; b < 3; ++b) {
      for (const char* leaf :
           {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
            "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias",
            "mlp.proj.weight", "mlp.proj.bias"}) {
        want.push_back("blocks." + std::to_string(b) + "." + leaf);
      }
    }
    want.push_back("ln_f.weight");
    want.push_back("ln_f.bias");
    if (!tied) want.push_back("head.weight");
    std::vector<std::string> names;
    for (const auto& [name, p] : gpt.named_parameters()) names.push_back(name);
    CHECK(names == want);
  }
}

namespace {

nn::GPTConfig flash_config(double dropout) {
  return nn::GPTConfig{.vocab = 13,
                       .context = 80,
                       .layers = 3,
                       .heads = 2,
                       .width = 8,
                       .dropout = dropout,
                       .seed = 5,
                       .attention = AttentionKernel::flash};
}

// The counted peak above the start of one GPT step under `p`.
std::size_t gpt_step_peak(const nn::GPT<float>& gpt, const Tensor<std::int32_t>& ids,
                          const Tensor<std::int32_t>& targets, const plan::Plan& p) {
  for (auto param : gpt.parameters()) param.zero_grad();
  memory::Probe probe;
  {
    Tape tape(TapeOptions{.seed = 7});
    tape.backward(gpt.loss(ids, targets, {.plan = &p}));
  }
  return probe.peak_above_start();
}

}  // namespace

TEST_CASE(
    "GPT with flash attention: the fused model's loss and gradients to rounding, every plan's "
    "gradients exactly",
    "[nn][gpt][flash]") {
  for (const double dropout : {0.0, 0.1}) {
    INFO("dropout " << dropout);
    nn::GPTConfig fused_config = flash_config(dropout);
    fused_config.attention = AttentionKernel::fused;
    nn::GPT<float> flash(flash_config(dropout)), fused(fused_config);
    const auto ids =
        remat::test::ids({2, 70}, 13, 1);  // 70 rows: a block of 64 query rows and one of 6
    const auto targets = remat::test::ids({2, 70}, 13, 2);
    const auto run = [&](nn::GPT<float>& gpt, const plan::Plan* p) {
      return remat::test::step(gpt.parameters(),
                               [&](Tape&) { return gpt.loss(ids, targets, {.plan = p}); });
    };
    const auto reference = run(fused, nullptr);
    const auto plain = run(flash, nullptr);
    CHECK(std::abs(plain.loss - reference.loss) <= 1e-5f * reference.loss);
    REQUIRE(plain.grads.size() == reference.grads.size());
    for (std::size_t k = 0; k < plain.grads.size(); ++k) {
      float scale = 0, worst = 0;
      for (std::size_t i = 0; i < plain.grads[k].size(); ++i) {
        scale = std::max(scale, std::abs(reference.grads[k][i]));
        worst = std::max(worst, std::abs(plain.grads[k][i] - reference.grads[k][i]));
      }
      INFO("parameter " << k << ": largest gradient " << scale << ", largest difference " << worst);
      CHECK(worst <= 1e-4f * scale);
    }
    const plan::Chain chain = plan::Chain::uniform(3, 1, 4);
    for (const plan::Plan& p : {plan::every(chain), plan::sqrt(chain), plan::optimal(chain, 1)}) {
      INFO(p.describe());
      const auto r = run(flash, &p);
      CHECK(r.loss == plain.loss);
      CHECK(r.grads == plain.grads);
    }
  }
}

TEST_CASE(
    "GPT with flash or fused attention: predicted peaks equal counted peaks under every planner",
    "[nn][gpt][flash][memory]") {
  // The blocks' chain does not see the embedding's position ids (T int32), alive through the step.
  const std::int64_t time = 77;
  const double positions = 4.0 * time;
  for (const AttentionKernel attention : {AttentionKernel::flash, AttentionKernel::fused}) {
    for (const double dropout : {0.0, 0.2}) {
      nn::GPTConfig config = flash_config(dropout);
      config.attention = attention;
      const nn::GPT<float> gpt(config);
      const auto ids = remat::test::ids({2, time}, 13, 3);
      const auto targets = remat::test::ids({2, time}, 13, 4);
      gpt_step_peak(gpt, ids, targets,
                    plan::none(std::size_t(3)));  // allocates the gradient buffers
      const plan::Chain chain = gpt.profile(ids, targets);
      std::vector<plan::Plan> plans{plan::none(chain), plan::every(chain), plan::sqrt(chain),
                                    plan::optimal(chain, 1)};
      for (const double f : {0.3, 0.7})
        plans.push_back(plan::budget(
            chain, plans[3].peak_bytes + f * (plans[0].peak_bytes - plans[3].peak_bytes)));
      for (const plan::Plan& p : plans) {
        const std::size_t counted = gpt_step_peak(gpt, ids, targets, p);
        INFO(to_string(attention) << ", dropout " << dropout << ", " << p.describe() << ", counted "
                                  << counted);
        CHECK(p.peak_bytes + positions == static_cast<double>(counted));
      }
    }
  }
}
