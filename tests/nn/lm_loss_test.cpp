// nn::LossOptions: what GPT::loss() and Llama::loss() are told reaches the head (the chunk rows,
// seen in the step's counted peak), and the options each refuses, named.
#include "support/gradcheck.hpp"

#include <remat/nn/gpt.hpp>
#include <remat/nn/llama.hpp>

#include <cstdint>
#include <string>

namespace {

using remat::Tensor;

/// A step's counted peak above what was live before it: forward and backward of `loss`.
template <class Loss>
std::size_t lm_step_peak(const Loss& loss) {
  const remat::memory::Probe probe;
  remat::Tape tape;
  tape.backward(loss());
  return probe.peak_above_start();
}

/// For chunks of 1, 5 and all rows: loss() with that chunk_rows costs what the head's op with
/// that chunk costs, to the byte, and gives the same value; one row a chunk costs less than all
/// rows at once (so a chunk_rows loss() ignored would fail).
template <class Model>
void check_chunk_rows(const Model& model, const Tensor<std::int32_t>& ids, std::int64_t width) {
  const Tensor<std::int32_t> targets = ids;
  const Tensor<std::int32_t> flat = targets.reshape(remat::Shape{targets.numel()});
  std::size_t one_row = 0, all_rows = 0;
  (void)lm_step_peak([&] { return model.loss(ids, targets); });  // allocates the gradients
  for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{5}, ids.numel()}) {
    INFO("chunk_rows " << rows);
    double by_option = 0, by_hand = 0;
    const std::size_t option_peak = lm_step_peak([&] {
      const remat::Var<double> l = model.loss(ids, targets, {.chunk_rows = rows});
      by_option = l.item();
      return l;
    });
    const std::size_t hand_peak = lm_step_peak([&] {
      const remat::Var<double> h = remat::reshape(model.hidden(ids), {-1, width});
      const remat::Var<double> l = remat::linear_cross_entropy(h, model.head_weight(), flat, rows);
      by_hand = l.item();
      return l;
    });
    CHECK(option_peak == hand_peak);
    CHECK(by_option == by_hand);
    (rows == 1 ? one_row : all_rows) = option_peak;
  }
  CHECK(one_row < all_rows);
}

/// One-layer models of `vocab` tokens and width `width` (a context of `width` positions).
remat::nn::GPT<double> lm_gpt(std::int64_t vocab, std::int64_t width) {
  return remat::nn::GPT<double>(
      {.vocab = vocab, .context = width, .layers = 1, .heads = 2, .width = width});
}
remat::nn::Llama<double> lm_llama(std::int64_t vocab, std::int64_t width) {
  return remat::nn::Llama<double>({.vocab_size = vocab,
                                   .hidden_size = width,
                                   .intermediate_size = width + width / 2,
                                   .num_hidden_layers = 1,
                                   .num_attention_heads = 2,
                                   .num_key_value_heads = 1});
}

}  // namespace

TEST_CASE("LossOptions::chunk_rows reaches the head of GPT and Llama", "[nn][loss]") {
  check_chunk_rows(lm_gpt(97, 8), remat::test::ids({2, 8}, 97, 1), 8);
  check_chunk_rows(lm_llama(97, 8), remat::test::ids({2, 8}, 97, 2), 8);
}

TEST_CASE("loss() and profile() refuse the options they cannot honour, naming them", "[nn][loss]") {
  const remat::nn::GPT<double> gpt = lm_gpt(11, 4);
  const remat::nn::Llama<double> llama = lm_llama(11, 4);
  const Tensor<std::int32_t> ids = remat::test::ids({1, 4}, 11, 3);
  const remat::plan::Plan every = remat::plan::every(1);
  const auto message = [](const auto& call) { return remat::test::error_message(call); };
  remat::Tape tape;
  CHECK_THROWS_AS(gpt.loss(ids, ids, {.chunk_rows = -2}), remat::ArgumentError);
  CHECK_THAT(message([&] { (void)gpt.loss(ids, ids, {.chunk_rows = -2}); }),
             Catch::Contains("GPT::loss") && Catch::Contains("chunk_rows -2"));
  CHECK_THAT(message([&] { (void)llama.loss(ids, ids, {.chunked = false, .chunk_rows = 3}); }),
             Catch::Contains("Llama::loss") && Catch::Contains("chunk_rows 3") &&
                 Catch::Contains("not chunked"));
  CHECK_THAT(message([&] {
               (void)gpt.loss(ids, ids, {.starts = Tensor<std::int32_t>::zeros({1, 4})});
             }),
             Catch::Contains("GPT::loss") && Catch::Contains("starts (1, 4)"));
  CHECK_THAT(message([&] { (void)gpt.profile(ids, ids, {.plan = &every}); }),
             Catch::Contains("GPT::profile") && Catch::Contains("LossOptions::plan"));
  CHECK_THAT(message([&] { (void)llama.profile(ids, ids, {.plan = &every}); }),
             Catch::Contains("Llama::profile") && Catch::Contains("LossOptions::plan"));
}
