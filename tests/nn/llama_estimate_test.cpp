// remat::train::estimate_memory for Llama configs: the parameter count, the chain plan::profile
// measures on the real model (exactly, field by field), and a whole training step's counted peak.
#include "support/gradcheck.hpp"

#include <remat/train/estimate.hpp>
#include <remat/optim/adamw.hpp>

namespace {

struct LlamaEstimateCase {
  remat::nn::LlamaConfig config;
  std::int64_t batch, time;
  bool chunked;
};

// Varied to move every term: GQA and plain MHA, biases, tied heads, the plain loss, an MLP
// narrower and wider than the model, long sequences where attention's (T x T) scratch is the
// largest backward temporary, and a vocabulary whose logits need chunks.
const LlamaEstimateCase kLlamaCases[] = {
    {{.vocab_size = 64,
      .hidden_size = 32,
      .intermediate_size = 48,
      .num_hidden_layers = 3,
      .num_attention_heads = 4,
      .num_key_value_heads = 2,
      .max_position_embeddings = 32,
      .seed = 1},
     2,
     16,
     true},
    {{.vocab_size = 50,
      .hidden_size = 32,
      .intermediate_size = 96,
      .num_hidden_layers = 2,
      .num_attention_heads = 4,
      .num_key_value_heads = 1,
      .tie_word_embeddings = true,
      .attention_bias = true,
      .max_position_embeddings = 16,
      .seed = 2},
     3,
     8,
     false},
    {{.vocab_size = 12,
      .hidden_size = 16,
      .intermediate_size = 16,
      .num_hidden_layers = 2,
      .num_attention_heads = 2,
      .num_key_value_heads = 2,
      .max_position_embeddings = 128,
      .seed = 3},
     1,
     128,
     true},
    {{.vocab_size = 12,
      .hidden_size = 32,
      .intermediate_size = 8,
      .num_hidden_layers = 2,
      .num_attention_heads = 4,
      .num_key_value_heads = 1,
      .max_position_embeddings = 128,
      .seed = 4},
     1,
     96,
     false},
    {{.vocab_size = 16,
      .hidden_size = 64,
      .intermediate_size = 8,
      .num_hidden_layers = 2,
      .num_attention_heads = 4,
      .num_key_value_heads = 2,
      .max_position_embeddings = 16,
      .seed = 5},
     2,
     8,
     false},
    {{.vocab_size = 40000,
      .hidden_size = 32,
      .intermediate_size = 40,
      .num_hidden_layers = 2,
      .num_attention_heads = 2,
      .num_key_value_heads = 1,
      .max_position_embeddings = 64,
      .seed = 6},
     2,
     64,
     true},
};

// kLlamaCases with the fused attention, then with the flash one, plus flash cases whose length is
// not a multiple of its block of query rows and where its (rows x T) blocks are the largest
// temporaries.
std::vector<LlamaEstimateCase> llama_flash_cases() {
  std::vector<LlamaEstimateCase> out;
  for (const remat::AttentionKernel attention :
       {remat::AttentionKernel::fused, remat::AttentionKernel::flash}) {
    for (const LlamaEstimateCase& c : kLlamaCases) {
      out.push_back(c);
      out.back().config.attention = attention;
    }
  }
  out.push_back({{.vocab_size = 12,
                  .hidden_size = 8,
                  .intermediate_size = 8,
                  .num_hidden_layers = 2,
                  .num_attention_heads = 2,
                  .num_key_value_heads = 1,
                  .max_position_embeddings = 200,
                  .seed = 7,
                  .attention = remat::AttentionKernel::flash},
                 1,
                 150,
                 true});
  out.push_back({{.vocab_size = 12,
                  .hidden_size = 8,
                  .intermediate_size = 4,
                  .num_hidden_layers = 2,
                  .num_attention_heads = 1,
                  .num_key_value_heads = 1,
                  .max_position_embeddings = 200,
                  .seed = 8,
                  .attention = remat::AttentionKernel::flash},
                 2,
                 197,
                 false});
  // the families' options: an explicit head_dim wider and narrower than hidden / heads, Llama's
  // o and MLP biases, a Mistral sliding window (a mask: no byte and no FLOP changes)
  for (const remat::AttentionKernel attention :
       {remat::AttentionKernel::fused, remat::AttentionKernel::flash}) {
    remat::nn::LlamaConfig wide{.vocab_size = 20,
                                .hidden_size = 16,
                                .intermediate_size = 24,
                                .num_hidden_layers = 2,
                                .num_attention_heads = 4,
                                .num_key_value_heads = 2,
                                .attention_bias = true,
                                .max_position_embeddings = 32,
                                .seed = 9,
                                .attention = attention};
    wide.explicit_head_dim = 8;  // q is 32 wide, o 32 -> 16
    wide.o_proj_bias = wide.mlp_bias = true;
    out.push_back({wide, 2, 12, true});
    remat::nn::LlamaConfig narrow = wide;
    narrow.model_type = "mistral";
    narrow.explicit_head_dim = 2;  // q is 8 wide
    narrow.attention_bias = narrow.o_proj_bias = narrow.mlp_bias = false;
    narrow.sliding_window = 3;
    narrow.seed = 10;
    out.push_back({narrow, 1, 20, false});
    remat::nn::LlamaConfig qwen3 = wide;  // q_norm and k_norm over an explicit head_dim
    qwen3.model_type = "qwen3";
    qwen3.qk_norm = true;
    qwen3.mlp_bias = false;
    qwen3.seed = 11;
    out.push_back({qwen3, 2, 10, true});
  }
  return out;
}

template <class T>
remat::plan::Chain llama_profiled(const remat::nn::Llama<T>& model, const LlamaEstimateCase& c) {
  const auto ids =
      remat::test::ids({c.batch, c.time}, static_cast<std::int32_t>(c.config.vocab_size), 5);
  const auto targets =
      remat::test::ids({c.batch, c.time}, static_cast<std::int32_t>(c.config.vocab_size), 6);
  model.profile(
      ids, targets,
      {.chunked = c.chunked});  // the first backward allocates the gradients: profile once more
  return model.profile(ids, targets, {.chunked = c.chunked});
}

// Rows of a batch packed with examples of 1 to 5 tokens: their starts.
remat::Tensor<std::int32_t> llama_packed_starts(std::int64_t batch, std::int64_t time) {
  remat::Tensor<std::int32_t> s({batch, time});
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0, start = 0; i < time; ++i) {
      if (i - start == 1 + (b + start) % 5) start = i;
      s[b * time + i] = static_cast<std::int32_t>(start);
    }
  return s;
}

double llama_counted_step_peak(const LlamaEstimateCase& c, const remat::plan::Plan* p,
                               std::size_t base, bool packed = false) {
  remat::nn::Llama<float> model(c.config);
  const auto ids =
      remat::test::ids({c.batch, c.time}, static_cast<std::int32_t>(c.config.vocab_size), 5);
  const auto targets =
      remat::test::ids({c.batch, c.time}, static_cast<std::int32_t>(c.config.vocab_size), 6);
  const auto starts = packed ? llama_packed_starts(c.batch, c.time) : remat::Tensor<std::int32_t>();
  remat::optim::AdamW<float> adam(model.parameters());
  for (int step = 0; step < 2; ++step) {
    if (step == 1) remat::memory::reset_peak();
    remat::Tape tape;
    tape.backward(model.loss(ids, targets, {.plan = p, .chunked = c.chunked, .starts = starts}));
    adam.step();
    adam.zero_grad();
  }
  return static_cast<double>(remat::memory::peak_bytes() - base);
}

}  // namespace

TEST_CASE("estimate_memory counts a Llama's parameters exactly", "[nn][estimate][llama]") {
  for (const LlamaEstimateCase& c : llama_flash_cases()) {
    const remat::nn::Llama<float> model(c.config);
    const auto e =
        remat::train::estimate_memory<float>(c.config, {.batch = c.batch, .time = c.time});
    CHECK(e.parameter_count == model.parameter_count());
    CHECK(e.parameters == 4.0 * static_cast<double>(model.parameter_count()));
  }
  CHECK_THROWS_AS(remat::train::estimate_memory<float>(kLlamaCases[0].config, {.time = 33}),
                  remat::ArgumentError);
}

TEMPLATE_TEST_CASE("estimate_memory's Llama chain is the one plan::profile measures on the model",
                   "[nn][estimate][llama]", float, double) {
  for (const LlamaEstimateCase& c : llama_flash_cases()) {
    const remat::nn::Llama<TestType> model(c.config);
    const remat::plan::Chain measured = llama_profiled(model, c);
    const remat::plan::Chain& predicted =
        remat::train::estimate_memory<TestType>(
            c.config, {.batch = c.batch, .time = c.time, .chunked_loss = c.chunked})
            .chain;
    INFO(remat::to_string(c.config.attention)
         << ", hidden " << c.config.hidden_size << ", intermediate " << c.config.intermediate_size
         << ", batch " << c.batch << ", time " << c.time << ", chunked " << c.chunked);
    CHECK(predicted.boundary_bytes == measured.boundary_bytes);
    CHECK(predicted.activation_bytes == measured.activation_bytes);
    CHECK(predicted.forward_transient_bytes == measured.forward_transient_bytes);
    // The profile's first layer computes no input gradient (its input is detached); in a step
    // the embedding needs it, and the estimate prices it for every layer.
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

TEST_CASE("estimate_memory predicts a Llama training step's counted peak",
          "[nn][estimate][llama]") {
  for (const LlamaEstimateCase& c : llama_flash_cases()) {
    const auto e = remat::train::estimate_memory<float>(
        c.config, {.batch = c.batch, .time = c.time, .chunked_loss = c.chunked});
    for (const remat::plan::Plan& p :
         {remat::plan::none(e.chain), remat::plan::every(e.chain), remat::plan::sqrt(e.chain),
          remat::plan::optimal(e.chain, 1)}) {
      const std::size_t base = remat::memory::live_bytes();
      const double counted = llama_counted_step_peak(c, &p, base);
      INFO(remat::to_string(c.config.attention)
           << ", hidden " << c.config.hidden_size << ", " << p.describe() << ": estimated "
           << e.total(p) << " B, counted " << counted << " B");
      CHECK(e.total(p) == counted);
      CHECK(e.activations(p) == counted - e.persistent());
      CHECK(remat::train::step_peak<float>(
                c.config, {.batch = c.batch, .time = c.time, .chunked_loss = c.chunked}, p) ==
            counted);
    }
  }
}

TEST_CASE(
    "estimate_memory prices packed rows' starts as data: the profiled chain is the same and the "
    "counted step grows by their bytes exactly",
    "[nn][estimate][llama][packed]") {
  const std::vector<LlamaEstimateCase> cases = llama_flash_cases();
  for (const std::size_t i : {std::size_t(0), std::size_t(1), std::size_t(6), std::size_t(7)}) {
    const LlamaEstimateCase& c = cases[i];
    const remat::train::StepShape step{.batch = c.batch, .time = c.time, .chunked_loss = c.chunked};
    remat::train::StepShape packed_step = step;
    packed_step.packed = true;
    const auto e = remat::train::estimate_memory<float>(c.config, step);
    const auto packed = remat::train::estimate_memory<float>(c.config, packed_step);
    const double starts_bytes = 4.0 * static_cast<double>(c.batch * c.time);
    INFO(remat::to_string(c.config.attention) << ", case " << i);
    CHECK(packed.data == e.data + starts_bytes);
    // what the layers keep and allocate does not depend on the starts
    const remat::nn::Llama<float> model(c.config);
    const auto ids =
        remat::test::ids({c.batch, c.time}, static_cast<std::int32_t>(c.config.vocab_size), 5);
    const auto starts = llama_packed_starts(c.batch, c.time);
    (void)model.profile(
        ids, ids, {.chunked = c.chunked, .starts = starts});  // the first allocates the gradients
    const remat::plan::Chain measured =
        model.profile(ids, ids, {.chunked = c.chunked, .starts = starts});
    CHECK(measured.boundary_bytes == packed.chain.boundary_bytes);
    CHECK(measured.activation_bytes == packed.chain.activation_bytes);
    CHECK(measured.forward_transient_bytes == packed.chain.forward_transient_bytes);
    for (const remat::plan::Plan& p : {remat::plan::none(e.chain), remat::plan::every(e.chain)}) {
      INFO(p.describe());
      const std::size_t base = remat::memory::live_bytes();
      const double counted = llama_counted_step_peak(c, &p, base);
      const double counted_packed = llama_counted_step_peak(c, &p, base, true);
      CHECK(counted_packed - counted == packed.total(p) - e.total(p));
      CHECK(packed.total(p) - e.total(p) == starts_bytes);
    }
  }
}
