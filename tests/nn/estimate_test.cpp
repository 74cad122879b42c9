#include "support/gradcheck.hpp"
#include "support/models.hpp"

#include <remat/train/estimate.hpp>
#include <remat/optim/adamw.hpp>
#include <remat/optim/sgd.hpp>

using namespace remat;

namespace {

struct Case {
  nn::GPTConfig config;
  std::int64_t batch, time;
  bool chunked;
};

// Small enough for the suite, varied enough to move every term: dropout, tied weights, a
// sequence shorter than the context, the plain loss, and a vocabulary whose logits need chunks.
const Case kCases[] = {
    {{.vocab = 64, .context = 32, .layers = 3, .heads = 2, .width = 32, .seed = 1}, 2, 32, true},
    {{.vocab = 64, .context = 32, .layers = 3, .heads = 4, .width = 32, .dropout = 0.1, .seed = 2},
     3,
     16,
     true},
    {{.vocab = 50, .context = 16, .layers = 2, .heads = 2, .width = 16, .tied = true, .seed = 3},
     4,
     16,
     false},
    {{.vocab = 40000, .context = 64, .layers = 2, .heads = 2, .width = 32, .seed = 4}, 2, 64, true},
    // long sequences on a narrow model: attention's (T x T) scratch outweighs the (N x C) tensors
    {{.vocab = 12, .context = 128, .layers = 2, .heads = 1, .width = 8, .seed = 5}, 1, 128, true},
    {{.vocab = 12, .context = 128, .layers = 2, .heads = 2, .width = 8, .dropout = 0.2, .seed = 6},
     1,
     128,
     false},
    // a vocabulary narrower than the model, plain loss
    {{.vocab = 16, .context = 16, .layers = 2, .heads = 2, .width = 64, .seed = 7}, 2, 16, false},
};

// kCases with the fused attention, then with the flash one, plus flash cases whose length is not a
// multiple of its block of query rows (kFlashBlockRows), with and without dropout.
std::vector<Case> with_flash_cases() {
  std::vector<Case> out;
  for (const AttentionKernel attention : {AttentionKernel::fused, AttentionKernel::flash}) {
    for (const Case& c : kCases) {
      out.push_back(c);
      out.back().config.attention = attention;
    }
  }
  out.push_back({{.vocab = 12,
                  .context = 160,
                  .layers = 2,
                  .heads = 2,
                  .width = 8,
                  .seed = 8,
                  .attention = AttentionKernel::flash},
                 1,
                 150,
                 true});
  out.push_back({{.vocab = 12,
                  .context = 160,
                  .layers = 2,
                  .heads = 1,
                  .width = 8,
                  .dropout = 0.2,
                  .seed = 9,
                  .attention = AttentionKernel::flash},
                 2,
                 97,
                 false});
  return out;
}

/// The vocabulary as the token-id type.
std::int32_t estimate_vocab(const Case& c) { return static_cast<std::int32_t>(c.config.vocab); }

template <class T>
plan::Chain profiled(const nn::GPT<T>& gpt, const Case& c) {
  const auto ids = remat::test::ids({c.batch, c.time}, estimate_vocab(c), 5);
  const auto targets = remat::test::ids({c.batch, c.time}, estimate_vocab(c), 6);
  gpt.profile(
      ids, targets,
      {.chunked = c.chunked});  // the first backward allocates the gradients: profile once more
  return gpt.profile(ids, targets, {.chunked = c.chunked});
}

// The allocator's peak, relative to `base`, over a second training step with AdamW (the first
// allocates the gradients and the moments that later steps reuse); `between_steps` receives the
// bytes still live after it (what persists from step to step).
double counted_step_peak(const Case& c, const plan::Plan* p, std::size_t base,
                         double* between_steps) {
  nn::GPT<float> gpt(c.config);
  const auto ids = remat::test::ids({c.batch, c.time}, estimate_vocab(c), 5);
  const auto targets = remat::test::ids({c.batch, c.time}, estimate_vocab(c), 6);
  optim::AdamW<float> adam(gpt.parameters());
  for (int step = 0; step < 2; ++step) {
    if (step == 1) memory::reset_peak();
    Tape tape;
    tape.backward(gpt.loss(ids, targets, {.plan = p, .chunked = c.chunked}));
    adam.step();
    adam.zero_grad();
  }
  *between_steps = static_cast<double>(memory::live_bytes() - base);
  return static_cast<double>(memory::peak_bytes() - base);
}

}  // namespace

TEST_CASE("estimate_memory counts a GPT's parameters exactly", "[nn][estimate]") {
  for (const Case& c : kCases) {
    const nn::GPT<float> gpt(c.config);
    const auto e =
        remat::train::estimate_memory<float>(c.config, {.batch = c.batch, .time = c.time});
    CHECK(e.parameter_count == gpt.parameter_count());
    CHECK(e.parameters == 4.0 * static_cast<double>(gpt.parameter_count()));
  }
}

TEST_CASE("estimate_memory's gradients and optimizer state are what a real step allocates",
          "[nn][estimate]") {
  for (const Case& c : kCases) {
    for (const remat::train::OptimizerKind kind :
         {remat::train::OptimizerKind::sgd, remat::train::OptimizerKind::sgd_momentum,
          remat::train::OptimizerKind::adamw}) {
      INFO("vocab " << c.config.vocab << ", tied " << c.config.tied << ", optimizer "
                    << static_cast<int>(kind));
      const auto e = remat::train::estimate_memory<float>(
          c.config, {.batch = c.batch, .time = c.time, .optimizer = kind});
      nn::GPT<float> gpt(c.config);
      const auto ids = remat::test::ids({c.batch, c.time}, estimate_vocab(c), 5);
      {
        Tape tape;
        tape.backward(gpt.loss(ids, ids));
      }
      // gradients: the buffers backward() left on the parameters
      double grad_bytes = 0;
      for (const auto& p : gpt.parameters()) grad_bytes += static_cast<double>(p.grad().bytes());
      CHECK(e.gradients == grad_bytes);
      // optimizer state: what the optimizer's first step leaves allocated
      const std::size_t before = memory::live_bytes();
      std::size_t after = 0;
      if (kind == remat::train::OptimizerKind::adamw) {
        optim::AdamW<float> opt(gpt.parameters());
        opt.step();
        after = memory::live_bytes();
      } else {
        optim::SGD<float> opt(gpt.parameters(),
                              {.momentum = kind == remat::train::OptimizerKind::sgd ? 0.0 : 0.9});
        opt.step();
        after = memory::live_bytes();
      }
      CHECK(e.optimizer_state == static_cast<double>(after - before));
    }
  }
}

TEMPLATE_TEST_CASE("estimate_memory's chain is the one plan::profile measures on the model",
                   "[nn][estimate]", float, double) {
  for (const Case& c : with_flash_cases()) {
    const nn::GPT<TestType> gpt(c.config);
    const plan::Chain measured = profiled(gpt, c);
    const plan::Chain& predicted =
        remat::train::estimate_memory<TestType>(
            c.config, {.batch = c.batch, .time = c.time, .chunked_loss = c.chunked})
            .chain;
    INFO("vocab " << c.config.vocab << ", batch " << c.batch << ", time " << c.time << ", chunked "
                  << c.chunked << ", attention " << to_string(c.config.attention));
    CHECK(predicted.boundary_bytes == measured.boundary_bytes);
    CHECK(predicted.activation_bytes == measured.activation_bytes);
    CHECK(predicted.forward_transient_bytes == measured.forward_transient_bytes);
    // The profile runs the blocks on a detached input, so its first block computes no input
    // gradient; in a GPT step the embeddings need it, and the estimate prices it for every block.
    CHECK(measured.backward_transient_bytes[0] <= predicted.backward_transient_bytes[0]);
    CHECK(std::equal(
        predicted.backward_transient_bytes.begin() + 1, predicted.backward_transient_bytes.end(),
        measured.backward_transient_bytes.begin() + 1, measured.backward_transient_bytes.end()));
    CHECK(predicted.saves_output == measured.saves_output);
    CHECK(predicted.loss_bytes == measured.loss_bytes);
    CHECK(predicted.loss_output_bytes == measured.loss_output_bytes);
    CHECK(predicted.loss_forward_transient_bytes == measured.loss_forward_transient_bytes);
    CHECK(predicted.loss_backward_transient_bytes == measured.loss_backward_transient_bytes);
    CHECK(predicted.input_made_in_step == measured.input_made_in_step);
    CHECK(predicted.output_held == measured.output_held);
  }
}

TEST_CASE("estimate_memory predicts a whole training step's counted peak to the byte",
          "[nn][estimate]") {
  for (const Case& c : with_flash_cases()) {
    const auto e = remat::train::estimate_memory<float>(
        c.config, {.batch = c.batch, .time = c.time, .chunked_loss = c.chunked});
    for (const plan::Plan& p : {plan::none(e.chain), plan::every(e.chain), plan::sqrt(e.chain),
                                plan::optimal(e.chain, 1)}) {
      const std::size_t base = memory::live_bytes();
      double between_steps = 0;
      const double counted = counted_step_peak(c, &p, base, &between_steps);
      INFO("vocab " << c.config.vocab << ", attention " << to_string(c.config.attention) << ", "
                    << p.describe() << ": estimated " << e.total(p) << " B, counted " << counted
                    << " B");
      // what persists between steps is exactly the weights, their gradients, AdamW's moments and
      // the data
      CHECK(e.persistent() == between_steps);
      CHECK(e.total(p) == counted);
      CHECK(e.activations(p) == counted - e.persistent());
      // the count alone, without the profile
      CHECK(remat::train::step_peak<float>(
                c.config, {.batch = c.batch, .time = c.time, .chunked_loss = c.chunked}, p) ==
            counted);
    }
  }
}

TEST_CASE("estimate_memory: checkpointing shrinks the activations, the chunked loss the logits",
          "[nn][estimate]") {
  const nn::GPTConfig config{
      .vocab = 32000, .context = 1024, .layers = 12, .heads = 12, .width = 768};
  const auto chunked = remat::train::estimate_memory<float>(config, {.batch = 2});
  const auto plain =
      remat::train::estimate_memory<float>(config, {.batch = 2, .chunked_loss = false});
  CHECK(chunked.logits == 2.0 * 1024 * 32000 * 4);
  CHECK(chunked.loss_chunk == 1024 * 2048 * 4);  // a tile: 1,024 rows of a 2,048-token block
  CHECK(chunked.activations(plan::every(chunked.chain)) < chunked.activations() / 4);
  CHECK(plain.activations() - chunked.activations() > chunked.logits);
}

TEST_CASE("estimate_memory prices the chunked loss at any chunk size to the byte",
          "[nn][estimate]") {
  const nn::GPTConfig config{
      .vocab = 300, .context = 16, .layers = 2, .heads = 2, .width = 16, .seed = 3};
  const std::int64_t batch = 2, time = 16;  // 32 rows of logits
  const std::size_t base = memory::live_bytes();
  nn::GPT<float> gpt(config);
  const auto ids = remat::test::ids({batch, time}, 300, 5);
  const auto targets = remat::test::ids({batch, time}, 300, 6);
  optim::AdamW<float> adam(gpt.parameters());
  for (const std::int64_t rows : {1, 5, 13, 32, 100}) {
    const remat::train::StepShape shape{.batch = batch, .time = time, .loss_chunk_rows = rows};
    const auto e = remat::train::estimate_memory<float>(config, shape);
    CHECK(e.loss_chunk ==
          double(std::min<std::int64_t>(rows, batch * time)) * 300 * 4);  // one block
    for (const plan::Plan& p : {plan::none(e.chain), plan::every(e.chain)}) {
      for (int step = 0; step < 2; ++step) {
        if (step == 1) memory::reset_peak();
        Tape tape;
        tape.backward(gpt.loss(ids, targets, {.plan = &p, .chunk_rows = rows}));
        adam.step();
        adam.zero_grad();
      }
      INFO("chunk rows " << rows << ", " << p.describe());
      CHECK(e.total(p) == static_cast<double>(memory::peak_bytes() - base));
      CHECK(remat::train::step_peak<float>(config, shape, p) == e.total(p));
    }
  }
  CHECK_THROWS_WITH(
      remat::train::estimate_memory<float>(config, {.batch = 1, .loss_chunk_rows = -1}),
      Catch::Contains("loss_chunk_rows -1 is negative"));
  CHECK_THROWS_WITH(remat::train::estimate_memory<float>(
                        config, {.batch = 1, .chunked_loss = false, .loss_chunk_rows = 4}),
                    Catch::Contains("loss_chunk_rows 4 is set but the loss is not chunked"));
}

TEST_CASE("estimate_memory rejects shapes that cannot run", "[nn][estimate][errors]") {
  const nn::GPTConfig config{.vocab = 10, .context = 8, .layers = 1, .heads = 2, .width = 4};
  CHECK_THROWS_WITH(remat::train::estimate_memory<float>(config, {.batch = 2, .time = 9}),
                    Catch::Contains("train::estimate_memory") && Catch::Contains("context = 8") &&
                        Catch::Contains("time 9"));
  CHECK_THROWS_AS(remat::train::estimate_memory<float>(config, {.batch = 0}), ArgumentError);
  CHECK_THROWS_AS(remat::train::estimate_memory<float>(nn::GPTConfig{.heads = 3, .width = 4}),
                  ArgumentError);
  CHECK_THROWS_AS(remat::train::estimate_memory<float>(config, {.batch = 2, .time = -1}),
                  ArgumentError);
  CHECK_THROWS_WITH(remat::train::estimate_memory<float>(nn::GPTConfig{
                        .vocab = 1 << 30, .context = 8, .layers = 1, .heads = 1, .width = 1 << 30}),
                    Catch::Contains("beyond what can be counted"));
  const auto e = remat::train::estimate_memory<float>(config, {.batch = 1});
  CHECK_THROWS_AS(e.activations(plan::every(std::size_t(5))), PlanError);
  const auto deeper = remat::train::estimate_memory<float>(
      nn::GPTConfig{.vocab = 10, .context = 8, .layers = 6, .heads = 2, .width = 4});
  CHECK_THROWS_WITH(
      deeper.total(plan::every(std::size_t(3))),
      Catch::Contains("MemoryEstimate: the plan (every) is for 3 layers but 6 were given"));
  // the count alone names itself, the step and the plan
  CHECK_THROWS_WITH(
      remat::train::step_peak<float>(config, {.batch = 2, .time = 9}, plan::none(std::size_t(1))),
      Catch::Contains("train::step_peak: need batch") && Catch::Contains("time 9"));
  CHECK_THROWS_WITH(
      remat::train::step_peak<float>(config, {.batch = 1}, plan::every(std::size_t(3))),
      Catch::Contains("train::step_peak: the plan (every) is for 3 layers but 1 were given"));
}
