// nn::Llama against an independent PyTorch implementation (tests/reference/llama_reference.py):
// logits, loss and every parameter's gradient in double, on tiny configs with grouped-query
// attention, tied and untied heads, with and without q/k/v biases; Hugging Face's parameter
// names; checkpointed gradients equal to plain ones; config.json reading and its errors.
#include "support/gradcheck.hpp"
#include "support/reference.hpp"

#include <remat/nn/llama.hpp>
#include <remat/hub/llama_config.hpp>

#include <fstream>
#include <set>

namespace {

using remat::Tensor;

/// The model a reference case describes, holding the case's weights.
std::unique_ptr<remat::nn::Llama<double>> llama_from_reference(
    const nlohmann::json& c, remat::AttentionKernel attention = remat::AttentionKernel::fused) {
  remat::nn::LlamaConfig config = remat::hub::llama_config_from_json(c.at("config"), "llama.json");
  config.attention = attention;
  auto model = std::make_unique<remat::nn::Llama<double>>(config);
  for (const auto& [name, p] : model->named_parameters()) {
    const Tensor<double> w = remat::test::json_tensor<double>(c.at("params").at(name));
    REQUIRE(w.shape() == p.shape());
    std::copy(w.begin(), w.end(), remat::Parameter<double>(p).data().data());
  }
  return model;
}

std::map<std::string, Tensor<double>> llama_grads(const remat::nn::Llama<double>& model,
                                                  const Tensor<std::int32_t>& ids,
                                                  const Tensor<std::int32_t>& targets,
                                                  const remat::plan::Plan* plan, bool chunked,
                                                  double* loss = nullptr) {
  for (auto& p : model.parameters()) p.zero_grad();
  remat::Tape tape;
  const remat::Var<double> l = model.loss(ids, targets, {.plan = plan, .chunked = chunked});
  tape.backward(l);
  if (loss) *loss = l.item();
  std::map<std::string, Tensor<double>> out;
  for (const auto& [name, p] : model.named_parameters()) out[name] = p.grad().clone();
  return out;
}

}  // namespace

TEST_CASE("nn::Llama matches the PyTorch reference in logits and every gradient to 1e-12",
          "[nn][llama][reference]") {
  for (const nlohmann::json& c : remat::test::reference("llama.json").at("cases")) {
    const auto model = llama_from_reference(c);
    INFO("config " << c.at("config").dump());
    // Hugging Face's names, exactly, in the same set (the tied head has no lm_head.weight)
    std::set<std::string> ours, theirs;
    for (const auto& [name, p] : model->named_parameters()) ours.insert(name);
    for (const auto& [name, value] : c.at("params").items()) theirs.insert(name);
    CHECK(ours == theirs);
    CHECK(ours.count("model.layers.0.self_attn.q_proj.weight") == 1);
    CHECK(ours.count("model.layers.1.mlp.gate_proj.weight") == 1);
    CHECK(ours.count("lm_head.weight") == (model->config().tie_word_embeddings ? 0 : 1));
    CHECK(ours.count("model.layers.0.self_attn.k_proj.bias") ==
          (model->config().attention_bias ? 1 : 0));

    const auto ids = remat::test::json_tensor<std::int32_t>(c.at("ids"));
    const auto targets = remat::test::json_tensor<std::int32_t>(c.at("targets"));
    const Tensor<double> logits = model->logits(ids).value();
    CHECK(remat::test::relative_difference(
              logits, remat::test::json_tensor<double>(c.at("logits"))) <= 1e-12);
    for (const bool chunked : {true, false}) {
      double loss = 0;
      const auto grads = llama_grads(*model, ids, targets, nullptr, chunked, &loss);
      CHECK(std::abs(loss - c.at("loss").get<double>()) <= 1e-12 * std::abs(loss));
      for (const auto& [name, g] : grads) {
        INFO("gradient of " << name << (chunked ? " (chunked loss)" : " (plain loss)"));
        CHECK(remat::test::relative_difference(
                  g, remat::test::json_tensor<double>(c.at("grads").at(name))) <= 1e-12);
      }
    }
  }
}

TEST_CASE(
    "nn::Llama with flash attention matches the PyTorch reference in logits, loss and gradients to "
    "1e-12",
    "[nn][llama][reference][flash]") {
  for (const nlohmann::json& c : remat::test::reference("llama.json").at("cases")) {
    const auto model = llama_from_reference(c, remat::AttentionKernel::flash);
    INFO("config " << c.at("config").dump());
    const auto ids = remat::test::json_tensor<std::int32_t>(c.at("ids"));
    const auto targets = remat::test::json_tensor<std::int32_t>(c.at("targets"));
    CHECK(remat::test::relative_difference(model->logits(ids).value(),
                                           remat::test::json_tensor<double>(c.at("logits"))) <=
          1e-12);
    double loss = 0;
    const auto grads = llama_grads(*model, ids, targets, nullptr, true, &loss);
    CHECK(std::abs(loss - c.at("loss").get<double>()) <= 1e-12 * std::abs(loss));
    for (const auto& [name, g] : grads) {
      INFO("gradient of " << name);
      CHECK(remat::test::relative_difference(
                g, remat::test::json_tensor<double>(c.at("grads").at(name))) <= 1e-12);
    }
  }
}

TEST_CASE("nn::Llama: checkpointed gradients equal plain ones under every plan",
          "[nn][llama][checkpoint]") {
  for (const bool tied : {false, true}) {
    const remat::nn::LlamaConfig config{
        .vocab_size = 23,
        .hidden_size = 16,
        .intermediate_size = 40,
        .num_hidden_layers = 5,
        .num_attention_heads = 4,
        .num_key_value_heads = 2,
        .rms_norm_eps = 1e-5,
        .tie_word_embeddings = tied,
        .attention_bias = tied,
        .max_position_embeddings = 16,
        .seed = 9,
        .attention = tied ? remat::AttentionKernel::flash : remat::AttentionKernel::fused};
    const remat::nn::Llama<float> model(config);
    const auto ids = remat::test::ids({3, 9}, 23, 1), targets = remat::test::ids({3, 9}, 23, 2);
    std::map<std::string, Tensor<float>> plain;
    {
      remat::Tape tape;
      tape.backward(model.loss(ids, targets));
      for (const auto& [name, p] : model.named_parameters()) plain[name] = p.grad().clone();
    }
    const remat::plan::Chain chain = model.profile(ids, targets);
    for (const remat::plan::Plan& p :
         {remat::plan::every(chain), remat::plan::sqrt(chain), remat::plan::optimal(chain, 2)}) {
      for (auto& param : model.parameters()) param.zero_grad();
      remat::Tape tape;
      tape.backward(model.loss(ids, targets, {.plan = &p}));
      for (const auto& [name, param] : model.named_parameters()) {
        INFO(remat::to_string(config.attention) << ", " << p.describe() << ": " << name);
        CHECK(param.grad().to_vector() == plain[name].to_vector());
      }
    }
  }
}

TEST_CASE("nn::Llama: a finite-difference check of a tiny model's gradients",
          "[nn][llama][gradcheck]") {
  const remat::nn::LlamaConfig config{.vocab_size = 7,
                                      .hidden_size = 8,
                                      .intermediate_size = 6,
                                      .num_hidden_layers = 1,
                                      .num_attention_heads = 2,
                                      .num_key_value_heads = 1,
                                      .attention_bias = true,
                                      .max_position_embeddings = 8,
                                      .initializer_range = 0.5,
                                      .seed = 3};
  const remat::nn::Llama<double> model(config);
  const auto ids = remat::test::ids({2, 3}, 7, 4);
  // the embedding's output is the input here: every layer parameter is reached through it
  const auto& layer = model.layers[0];
  remat::test::gradcheck([&](const remat::test::VarList& v) { return model.norm(layer(v[0])); },
                         {remat::test::randn({2, 3, 8}, 5)});
}

TEST_CASE("Llama configs: config.json fields, Hugging Face defaults, and clear errors",
          "[nn][llama][config]") {
  using Catch::Matchers::Contains;
  const std::string good =
      R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": true, "hidden_act": "silu", "rope_scaling": null, "torch_dtype": "bfloat16"})";
  const auto c = remat::hub::parse_llama_config(good, "good.json");
  CHECK(c.vocab_size == 100);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.attention_bias);  // Qwen2 always has q/k/v biases
  CHECK(c.tie_word_embeddings);
  CHECK(c.max_position_embeddings == 32768);
  // written back and read again: the same config
  const auto again = remat::hub::parse_llama_config(remat::hub::llama_config_json(c));
  CHECK(again.hidden_size == c.hidden_size);
  CHECK(again.attention_bias == c.attention_bias);
  CHECK(again.rope_theta == c.rope_theta);
  const auto llama = remat::hub::parse_llama_config(
      R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2})");
  CHECK(llama.num_key_value_heads == 2);
  CHECK(!llama.attention_bias);

  const auto error = [](const std::string& text) {
    return remat::test::error_message(
        [&] { remat::hub::parse_llama_config(text, "model/config.json"); });
  };
  CHECK_THAT(error(R"({"vocab_size": 10})"),
             Contains("model/config.json") && Contains("'hidden_size' is missing"));
  CHECK_THAT(error(R"({"vocab_size": "10", "hidden_size": 8})"),
             Contains("'vocab_size' must be a positive integer"));
  CHECK_THAT(
      error(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                       "num_attention_heads": 3})"),
      Contains("model/config.json") && Contains("num_attention_heads 3"));
  CHECK_THAT(
      error(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "rope_scaling": {"type": "yarn", "factor": 2.0}})"),
      Contains("rope_scaling") && Contains("yarn"));
  CHECK_THAT(
      error(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "tie_word_embeddings": 1})"),
      Contains("'tie_word_embeddings' must be true or false"));
  CHECK_THAT(
      error(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "hidden_act": "gelu"})"),
      Contains("hidden_act"));
  CHECK_THAT(error("[1, 2]"), Contains("expected a JSON object"));
  CHECK_THAT(error("{\"vocab_size\": 10,"), Contains("not valid JSON"));
  // deep nesting is refused before the recursive parser sees it; a string full of brackets is not
  // nesting
  CHECK_THAT(error(std::string(100000, '[') + std::string(100000, ']')),
             Contains("nests deeper than 64"));
  CHECK_THAT(error("{\"x\": \"" + std::string(1000, '[') + "\"}"),
             Contains("'vocab_size' is missing"));
  CHECK_THAT(
      remat::test::error_message([] { remat::hub::load_llama_config("/nonexistent/config.json"); }),
      Contains("/nonexistent/config.json") && Contains("cannot open"));
  // fuzzed truncations of a good file: each an IoError or a config, never a crash
  for (std::size_t n = 0; n < good.size(); n += 7) {
    try {
      remat::hub::parse_llama_config(good.substr(0, n));
    } catch (const remat::IoError&) {
    }
  }
}
