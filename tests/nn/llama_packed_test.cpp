// nn::Llama over packed rows (several examples a row, told apart by their starts): logits equal to
// each example's alone; checkpointed gradients equal to plain ones bitwise, also when two
// forwards with different starts share a tape (each replay reads its own); the starts' errors.
// The loss against the examples run one by one: tests/hub/model_inputs_test.cpp.
#include "support/gradcheck.hpp"

#include <remat/nn/llama.hpp>

#include <map>
#include <string>
#include <vector>

namespace {

using remat::Tensor;

// Starts of rows cut into examples at random (a new one at each position with probability 0.3).
Tensor<std::int32_t> packed_starts(std::int64_t batch, std::int64_t time, std::uint64_t seed) {
  remat::Rng rng(seed);
  Tensor<std::int32_t> s({batch, time});
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < time; ++i) {
      const bool fresh = i == 0 || rng.uniform() < 0.3;
      s[b * time + i] = fresh ? static_cast<std::int32_t>(i) : s[b * time + i - 1];
    }
  }
  return s;
}

remat::nn::LlamaConfig packed_config(remat::AttentionKernel attention) {
  return {.vocab_size = 23,
          .hidden_size = 16,
          .intermediate_size = 24,
          .num_hidden_layers = 4,
          .num_attention_heads = 4,
          .num_key_value_heads = 2,
          .rms_norm_eps = 1e-5,
          .attention_bias = true,
          .max_position_embeddings = 32,
          .initializer_range = 0.2,
          .seed = 5,
          .attention = attention,
          .qk_norm = true,
          .sliding_window = 5,
          .sliding_layers = {true, false, true, false}};
}

std::map<std::string, Tensor<double>> grads_of(const remat::nn::Llama<double>& model) {
  std::map<std::string, Tensor<double>> out;
  for (const auto& [name, p] : model.named_parameters()) out[name] = p.grad().clone();
  return out;
}

}  // namespace

TEST_CASE("nn::Llama: logits of a packed row are each example's alone", "[nn][llama][packed]") {
  for (const auto attention : {remat::AttentionKernel::fused, remat::AttentionKernel::flash}) {
    const remat::nn::Llama<double> model(packed_config(attention));
    const std::int64_t batch = 2, time = 20, vocab = 23;
    const Tensor<std::int32_t> ids = remat::test::ids({batch, time}, 23, 3);
    const Tensor<std::int32_t> starts = packed_starts(batch, time, 4);
    const Tensor<double> packed = model.logits(ids, nullptr, starts).value();
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t begin = 0; begin < time;) {
        std::int64_t end = begin + 1;
        while (end < time && starts[b * time + end] == begin) ++end;
        INFO(remat::to_string(attention)
             << ": row " << b << ", example [" << begin << ", " << end << ")");
        Tensor<std::int32_t> one({1, end - begin});
        for (std::int64_t i = begin; i < end; ++i) one[i - begin] = ids[b * time + i];
        const Tensor<double> alone = model.logits(one).value();
        double worst = 0;
        for (std::int64_t k = 0; k < alone.numel(); ++k) {
          const double got = packed[(b * time + begin) * vocab + k];
          worst = std::max(worst, std::abs(got - alone[k]) / (1 + std::abs(alone[k])));
        }
        CHECK(worst < 1e-12);
        begin = end;
      }
    }
  }
}

TEST_CASE(
    "nn::Llama over packed rows: checkpointed gradients equal plain ones bitwise, each replay "
    "with its own starts",
    "[nn][llama][packed][checkpoint]") {
  for (const auto attention : {remat::AttentionKernel::fused, remat::AttentionKernel::flash}) {
    const remat::nn::Llama<double> model(packed_config(attention));
    const Tensor<std::int32_t> ids = remat::test::ids({3, 17}, 23, 7);
    const Tensor<std::int32_t> targets = remat::test::ids({3, 17}, 23, 8);
    const Tensor<std::int32_t> starts = packed_starts(3, 17, 9), other = packed_starts(3, 17, 10);
    REQUIRE(starts.to_vector() != other.to_vector());
    // one forward with `starts`, and two on one tape (starts, then other), plain or under `plan`
    const auto step = [&](const remat::plan::Plan* plan, bool twice) {
      for (auto& p : model.parameters()) p.zero_grad();
      remat::Tape tape;
      remat::Var<double> loss = model.loss(ids, targets, {.plan = plan, .starts = starts});
      if (twice)
        loss = loss + model.loss(ids, targets, {.plan = plan, .chunked = false, .starts = other});
      tape.backward(loss);
      return grads_of(model);
    };
    const auto plain = step(nullptr, false), plain_twice = step(nullptr, true);
    const remat::plan::Chain chain = model.profile(ids, targets, {.starts = starts});
    for (const remat::plan::Plan& p :
         {remat::plan::every(chain), remat::plan::sqrt(chain), remat::plan::optimal(chain, 2)}) {
      const auto once = step(&p, false), twice = step(&p, true);
      for (const auto& [name, g] : plain) {
        INFO(remat::to_string(attention) << ", " << p.describe() << ": " << name);
        CHECK(once.at(name).to_vector() == g.to_vector());
        CHECK(twice.at(name).to_vector() == plain_twice.at(name).to_vector());
      }
    }
    // the second forward's starts matter: without them the gradients differ
    CHECK(plain_twice.at("model.layers.0.self_attn.q_proj.weight").to_vector() !=
          plain.at("model.layers.0.self_attn.q_proj.weight").to_vector());
  }
}

TEST_CASE("nn::Llama: starts must be (B, T) like the ids and describe contiguous examples",
          "[nn][llama][packed][errors]") {
  const remat::nn::Llama<double> model(packed_config(remat::AttentionKernel::fused));
  const Tensor<std::int32_t> ids = remat::test::ids({2, 6}, 23, 1);
  CHECK_THAT(remat::test::error_message([&] {
               (void)model.loss(ids, ids, {.starts = Tensor<std::int32_t>::zeros({2, 5})});
             }),
             Catch::Contains("Llama: starts (2, 5)") && Catch::Contains("(2, 6)"));
  CHECK_THROWS_AS(model.profile(ids, ids, {.starts = Tensor<std::int32_t>::zeros({6, 2})}),
                  remat::ShapeError);
  Tensor<std::int32_t> bad = Tensor<std::int32_t>::zeros({2, 6});
  bad[8] = 1;  // row 1, position 2: neither 2 nor row 1's previous start 0
  CHECK_THAT(remat::test::error_message([&] { (void)model.logits(ids, nullptr, bad); }),
             Catch::Contains("attention: starts[1, 2] = 1"));
}
