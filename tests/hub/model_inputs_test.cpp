// A padded batch of conversations with loss masks, as a model's ids and targets
// (hub::model_inputs): its loss and gradients equal those of the examples run one by one.

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

/// The loss and every parameter's gradient of one step of `model` on (ids, targets).
double loss_and_grads(const remat::nn::Llama<double>& model, const Tensor<std::int32_t>& ids,
                      const Tensor<std::int32_t>& targets, bool chunked,
                      std::map<std::string, Tensor<double>>& grads) {
  for (auto& p : model.parameters()) p.zero_grad();
  remat::Tape tape;
  const remat::Var<double> loss = model.loss(ids, targets, nullptr, chunked);
  tape.backward(loss);
  for (const auto& [name, p] : model.named_parameters()) grads[name] = p.grad().clone();
  return loss.item();
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
    // 5 examples of 2 to 12 tokens, random masks with at least one target counted
    std::vector<TokenizedExample> examples(5);
    for (auto& e : examples) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(2, 12)(rng);
      for (std::size_t i = 0; i < n; ++i) {
        e.ids.push_back(static_cast<std::int32_t>(rng() % 31));
        e.loss.push_back(static_cast<std::uint8_t>(i > 0 && rng() % 3 != 0));
      }
      e.loss.back() = 1;
    }
    const auto [ids, targets] =
        remat::hub::model_inputs(remat::hub::lay_out(examples, 11, Layout::pad, 3));
    for (const bool chunked : {true, false}) {
      std::map<std::string, Tensor<double>> batch_grads, one_grads;
      const double batch_loss = loss_and_grads(model, ids, targets, chunked, batch_grads);
      // expected: the examples' losses and gradients weighted by their counted targets
      double want_loss = 0, counted = 0;
      std::map<std::string, Tensor<double>> want_grads;
      for (const auto& [name, g] : batch_grads) want_grads[name] = Tensor<double>::zeros(g.shape());
      for (const TokenizedExample& e : examples) {
        const auto t = static_cast<std::int64_t>(e.ids.size()) - 1;
        Tensor<std::int32_t> one_ids({1, t}), one_targets({1, t});
        double n = 0;
        for (std::int64_t i = 0; i < t; ++i) {
          one_ids[i] = e.ids[std::size_t(i)];
          const bool on = e.loss[std::size_t(i + 1)] != 0;
          one_targets[i] = on ? e.ids[std::size_t(i + 1)] : remat::kIgnoreTarget;
          n += on;
        }
        want_loss += n * loss_and_grads(model, one_ids, one_targets, chunked, one_grads);
        for (auto& [name, g] : want_grads)
          for (std::int64_t k = 0; k < g.numel(); ++k) g[k] += n * one_grads.at(name)[k];
        counted += n;
      }
      INFO("trial " << trial << (chunked ? ", chunked loss" : ", plain loss"));
      CHECK(batch_loss == Approx(want_loss / counted).epsilon(1e-12).margin(0));
      for (const auto& [name, g] : batch_grads) {
        INFO(name);
        double worst = 0, scale = 0;
        for (std::int64_t k = 0; k < g.numel(); ++k) {
          worst = std::max(worst, std::abs(g[k] - want_grads.at(name)[k] / counted));
          scale = std::max(scale, std::abs(g[k]));
        }
        CHECK(worst <= 1e-12 * std::max(scale, 1e-300));
      }
    }
  }
}

TEST_CASE("model_inputs refuses packed rows, naming the row", "[hub][chat][errors]") {
  std::vector<TokenizedExample> examples(2);
  for (auto& e : examples) e = {{1, 2, 3}, {0, 0, 1}};
  CHECK_THROWS_WITH(
      remat::hub::model_inputs(remat::hub::lay_out(examples, 8, Layout::pack, 0)),
      Catch::Contains("row 0 packs several examples") && Catch::Contains("Layout::pad"));
  const auto [ids, targets] =
      remat::hub::model_inputs(remat::hub::lay_out(examples, 8, Layout::pad, 0));
  CHECK(ids.shape() == remat::Shape{2, 8});
  // the first target (the prompt's token 2) is masked; 3 counts; padding is ignored
  CHECK(targets[0] == remat::kIgnoreTarget);
  CHECK(targets[1] == 3);
  for (std::int64_t c = 2; c < 8; ++c) CHECK(targets[c] == remat::kIgnoreTarget);
}
