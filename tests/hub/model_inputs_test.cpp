// A padded or packed batch of conversations with loss masks, as a model's ids and targets
// (hub::model_inputs) and packed rows' starts (hub::batch_inputs): its loss and gradients equal
// those of the examples run one by one.

#include <catch2/catch.hpp>
#include <remat/hub/packing.hpp>
#include <remat/nn/llama.hpp>

#include <map>
#include <random>
#include <string>
#include <vector>

using remat::Tensor;
using remat::hub::Layout;
using remat::hub::TokenizedExample;

namespace {

using Grads = std::map<std::string, Tensor<double>>;

/// The loss and every parameter's gradient of one step of `model` on (ids, targets), packed rows
/// given their starts.
double loss_and_grads(const remat::nn::Llama<double>& model, const Tensor<std::int32_t>& ids,
                      const Tensor<std::int32_t>& targets, bool chunked, Grads& grads,
                      const Tensor<std::int32_t>& starts = {}) {
  for (auto& p : model.parameters()) p.zero_grad();
  remat::Tape tape;
  const remat::Var<double> loss = model.loss(ids, targets, {.chunked = chunked, .starts = starts});
  tape.backward(loss);
  for (const auto& [name, p] : model.named_parameters()) grads[name] = p.grad().clone();
  return loss.item();
}

/// `count` examples of 2 to `max_tokens` tokens below `vocab`, random masks with at least one
/// target counted.
std::vector<TokenizedExample> random_examples(std::mt19937& rng, std::size_t count,
                                              std::size_t max_tokens, std::int32_t vocab) {
  std::vector<TokenizedExample> examples(count);
  for (auto& e : examples) {
    const std::size_t n = std::uniform_int_distribution<std::size_t>(2, max_tokens)(rng);
    for (std::size_t i = 0; i < n; ++i) {
      e.ids.push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(vocab)));
      e.loss.push_back(static_cast<std::uint8_t>(i > 0 && rng() % 3 != 0));
    }
    e.loss.back() = 1;
  }
  return examples;
}

/// The examples run one by one, their losses and gradients combined as the mean over all of
/// their counted targets: what a batch of them must give.
double one_by_one(const remat::nn::Llama<double>& model,
                  const std::vector<TokenizedExample>& examples, bool chunked, Grads& want) {
  double total = 0, counted = 0;
  Grads one;
  for (const TokenizedExample& e : examples) {
    const auto t = static_cast<std::int64_t>(e.ids.size()) - 1;
    Tensor<std::int32_t> ids({1, t}), targets({1, t});
    double n = 0;
    for (std::int64_t i = 0; i < t; ++i) {
      ids[i] = e.ids[std::size_t(i)];
      const bool on = e.loss[std::size_t(i + 1)] != 0;
      targets[i] = on ? e.ids[std::size_t(i + 1)] : remat::kIgnoreTarget;
      n += on;
    }
    total += n * loss_and_grads(model, ids, targets, chunked, one);
    for (const auto& [name, g] : one) {
      if (!want.count(name)) want[name] = Tensor<double>::zeros(g.shape());
      for (std::int64_t k = 0; k < g.numel(); ++k) want[name][k] += n * g[k];
    }
    counted += n;
  }
  for (auto& [name, g] : want)
    for (double& x : g) x /= counted;
  return total / counted;
}

/// The batch's loss and gradients are the examples' one by one, to 1e-12 of each gradient's
/// scale.
void check_same_step(double batch_loss, const Grads& batch_grads, double want_loss,
                     const Grads& want_grads) {
  CHECK(batch_loss == Approx(want_loss).epsilon(1e-12).margin(0));
  for (const auto& [name, g] : batch_grads) {
    INFO(name);
    double worst = 0, scale = 0;
    for (std::int64_t k = 0; k < g.numel(); ++k) {
      worst = std::max(worst, std::abs(g[k] - want_grads.at(name)[k]));
      scale = std::max(scale, std::abs(g[k]));
    }
    CHECK(worst <= 1e-12 * std::max(scale, 1e-300));
  }
}

/// A small random Llama: grouped-query ratios, head sizes, q/k/v and o biases, Qwen3's q/k norms,
/// tied heads, sliding windows (on some layers), rope theta and linear scaling, fused or flash.
remat::nn::LlamaConfig random_config(std::mt19937& rng, remat::AttentionKernel attention) {
  const auto pick = [&](std::uint32_t n) { return static_cast<std::int64_t>(rng() % n); };
  remat::nn::LlamaConfig c{.vocab_size = 31,
                           .hidden_size = 12,
                           .intermediate_size = 20,
                           .num_hidden_layers = 2,
                           .max_position_embeddings = 64,
                           .initializer_range = 0.3};
  c.num_key_value_heads = 1 + pick(2);
  c.num_attention_heads = c.num_key_value_heads * (1 + pick(3));
  c.explicit_head_dim = 2 * (1 + pick(3));
  c.attention_bias = pick(2) == 1;
  c.o_proj_bias = pick(2) == 1;
  c.qk_norm = pick(2) == 1;
  if (c.qk_norm) c.model_type = "qwen3";
  c.tie_word_embeddings = pick(2) == 1;
  c.sliding_window = pick(2) == 1 ? 1 + pick(8) : 0;
  if (c.sliding_window > 0 && pick(2) == 1) c.sliding_layers = {true, false};
  c.rope_theta = static_cast<double>(100 + pick(10000));
  if (pick(3) == 0) {
    c.rope_scaling.type = remat::RopeScalingType::linear;
    c.rope_scaling.factor = 2;
  }
  c.attention = attention;
  c.seed = static_cast<std::uint64_t>(1 + pick(1000));
  return c;
}

}  // namespace

TEST_CASE("A padded batch with loss masks trains as its examples one by one, in double",
          "[hub][chat][exact]") {
  const remat::nn::Llama<double> model({.vocab_size = 31,
                                        .hidden_size = 16,
                                        .intermediate_size = 24,
                                        .num_hidden_layers = 2,
                                        .num_attention_heads = 4,
                                        .num_key_value_heads = 2,
                                        .max_position_embeddings = 64,
                                        .initializer_range = 0.3});
  std::mt19937 rng(11);
  for (int trial = 0; trial < 4; ++trial) {
    const std::vector<TokenizedExample> examples = random_examples(rng, 5, 12, 31);
    const auto [ids, targets] =
        remat::hub::model_inputs(remat::hub::lay_out(examples, 11, Layout::pad, 3));
    for (const bool chunked : {true, false}) {
      INFO("trial " << trial << (chunked ? ", chunked loss" : ", plain loss"));
      Grads batch_grads, want_grads;
      const double batch_loss = loss_and_grads(model, ids, targets, chunked, batch_grads);
      const double want_loss = one_by_one(model, examples, chunked, want_grads);
      check_same_step(batch_loss, batch_grads, want_loss, want_grads);
    }
  }
}

TEST_CASE(
    "A packed batch with loss masks and its starts trains as its examples one by one, in double, "
    "on random Llama configs, fused and flash",
    "[hub][chat][exact][packed]") {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 12; ++trial) {
    const auto attention =
        trial % 2 ? remat::AttentionKernel::flash : remat::AttentionKernel::fused;
    const remat::nn::LlamaConfig config = random_config(rng, attention);
    const remat::nn::Llama<double> model(config);
    const std::vector<TokenizedExample> examples = random_examples(rng, 7, 12, 31);
    const remat::hub::TokenBatch batch = remat::hub::lay_out(examples, 16, Layout::pack, 3);
    REQUIRE(batch.rows < examples.size());  // some row packs two examples or more
    const remat::hub::BatchInputs in = remat::hub::batch_inputs(batch);
    const bool chunked = trial % 4 < 2;
    INFO("trial " << trial << ": " << remat::to_string(config.attention) << ", heads "
                  << config.num_attention_heads << "/" << config.num_key_value_heads
                  << ", head_dim " << config.explicit_head_dim << ", qk_norm " << config.qk_norm
                  << ", bias " << config.attention_bias << config.o_proj_bias << ", window "
                  << config.sliding_window << " on " << config.sliding_layers.size() << " flags, "
                  << (chunked ? "chunked" : "plain") << " loss");
    Grads batch_grads, want_grads, unpacked_grads;
    const double batch_loss =
        loss_and_grads(model, in.ids, in.targets, chunked, batch_grads, in.starts);
    const double want_loss = one_by_one(model, examples, chunked, want_grads);
    check_same_step(batch_loss, batch_grads, want_loss, want_grads);
    // without its starts the packed batch is another computation: attention crosses examples
    const double unpacked = loss_and_grads(model, in.ids, in.targets, chunked, unpacked_grads);
    CHECK(std::abs(unpacked - want_loss) > 1e-9);
  }
}

TEST_CASE("batch_inputs: ids, targets and the starts of each example, padding its own",
          "[hub][chat][packed]") {
  std::vector<TokenizedExample> examples(3);
  examples[0] = {{1, 2, 3}, {0, 0, 1}};
  examples[1] = {{4, 5, 6}, {0, 1, 1}};
  examples[2] = {{7, 8, 9, 10}, {0, 1, 0, 1}};
  // packed into 5 columns: [1 2 | 4 5 | pad], [7 8 9 | pad pad]
  const remat::hub::TokenBatch packed = remat::hub::lay_out(examples, 5, Layout::pack, 0);
  const remat::hub::BatchInputs in = remat::hub::batch_inputs(packed);
  REQUIRE(in.starts.shape() == remat::Shape{2, 5});
  CHECK(in.starts.to_vector() == std::vector<std::int32_t>{0, 0, 2, 2, 4, 0, 0, 0, 3, 3});
  CHECK(in.ids.to_vector() == std::vector<std::int32_t>{1, 2, 4, 5, 0, 7, 8, 9, 0, 0});
  const std::int32_t x = remat::kIgnoreTarget;
  CHECK(in.targets.to_vector() == std::vector<std::int32_t>{x, 3, 5, 6, x, 8, x, 10, x, x});
  // a padded batch: its ids and targets are model_inputs', one example (and the padding) a row
  const remat::hub::TokenBatch padded = remat::hub::lay_out(examples, 5, Layout::pad, 0);
  const auto [ids, targets] = remat::hub::model_inputs(padded);
  const remat::hub::BatchInputs pin = remat::hub::batch_inputs(padded);
  CHECK(pin.ids.to_vector() == ids.to_vector());
  CHECK(pin.targets.to_vector() == targets.to_vector());
  CHECK(pin.starts.to_vector() ==
        std::vector<std::int32_t>{0, 0, 2, 2, 2, 0, 0, 2, 2, 2, 0, 0, 0, 3, 3});
  // positions that do not restart at each example's start cannot be told to the model
  remat::hub::TokenBatch bad = packed;
  bad.positions[3] = 0;
  CHECK_THROWS_WITH(remat::hub::batch_inputs(bad),
                    Catch::Contains("row 0 column 3") && Catch::Contains("position 0, not 1"));
  bad = packed;
  bad.loss.pop_back();
  CHECK_THROWS_AS(remat::hub::batch_inputs(bad), remat::ArgumentError);
}

TEST_CASE("model_inputs refuses packed rows, naming the row", "[hub][chat][errors]") {
  std::vector<TokenizedExample> examples(2);
  for (auto& e : examples) e = {{1, 2, 3}, {0, 0, 1}};
  CHECK_THROWS_WITH(remat::hub::model_inputs(remat::hub::lay_out(examples, 8, Layout::pack, 0)),
                    Catch::Contains("row 0 packs several examples") &&
                        Catch::Contains("hub::batch_inputs") && Catch::Contains("Layout::pad"));
  const auto [ids, targets] =
      remat::hub::model_inputs(remat::hub::lay_out(examples, 8, Layout::pad, 0));
  CHECK(ids.shape() == remat::Shape{2, 8});
  // the first target (the prompt's token 2) is masked; 3 counts; padding is ignored
  CHECK(targets[0] == remat::kIgnoreTarget);
  CHECK(targets[1] == 3);
  for (std::int64_t c = 2; c < 8; ++c) CHECK(targets[c] == remat::kIgnoreTarget);
}
