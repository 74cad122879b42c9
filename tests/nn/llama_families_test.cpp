// nn::Llama's families and options against the independent PyTorch reference
// (tests/reference/llama_reference.py, data from make_reference.py's family_cases): one random
// config per (family, option): Llama with attention_bias (q, k, v and o), mlp_bias, an explicit
// head_dim and the rope types llama3, linear, dynamic and default; Qwen2 with and without sliding
// windows; Qwen3 (q_norm, k_norm, explicit head_dim) with and without windows; Mistral with and
// without its sliding window. Logits, loss and every gradient in double to 1e-12, with the fused
// and the flash attention, and gradients under checkpoint plans equal to plain ones.
#include "support/gradcheck.hpp"
#include "support/reference.hpp"

#include <remat/nn/llama.hpp>
#include <remat/hub/llama_config.hpp>

#include <algorithm>
#include <set>

namespace {

using remat::Tensor;

std::unique_ptr<remat::nn::Llama<double>> family_model(const nlohmann::json& c,
                                                       remat::AttentionKernel attention) {
  remat::nn::LlamaConfig config =
      remat::hub::llama_config_from_json(c.at("config"), "llama_families.json");
  config.attention = attention;
  auto model = std::make_unique<remat::nn::Llama<double>>(config);
  for (const auto& [name, p] : model->named_parameters()) {
    const Tensor<double> w = remat::test::json_tensor<double>(c.at("params").at(name));
    REQUIRE(w.shape() == p.shape());
    std::copy(w.begin(), w.end(), remat::Parameter<double>(p).data().data());
  }
  return model;
}

std::map<std::string, Tensor<double>> family_grads(const remat::nn::Llama<double>& model,
                                                   const Tensor<std::int32_t>& ids,
                                                   const Tensor<std::int32_t>& targets,
                                                   const remat::plan::Plan* plan, bool chunked,
                                                   double* loss) {
  for (auto& p : model.parameters()) p.zero_grad();
  remat::Tape tape;
  const remat::Var<double> l = model.loss(ids, targets, {.plan = plan, .chunked = chunked});
  tape.backward(l);
  *loss = l.item();
  std::map<std::string, Tensor<double>> out;
  for (const auto& [name, p] : model.named_parameters()) out[name] = p.grad().clone();
  return out;
}

}  // namespace

TEST_CASE(
    "nn::Llama families (Llama 2/3, Qwen2, Qwen3, Mistral) and options match the PyTorch "
    "reference to 1e-12, fused and flash, under checkpoint plans",
    "[nn][llama][reference][families]") {
  std::set<std::string> families;
  for (const nlohmann::json& c : remat::test::reference("llama_families.json").at("cases")) {
    families.insert(c.at("family").get<std::string>());
    for (const auto attention : {remat::AttentionKernel::fused, remat::AttentionKernel::flash}) {
      const auto model = family_model(c, attention);
      INFO(c.at("family").get<std::string>()
           << " / " << c.at("option").get<std::string>() << ", " << remat::to_string(attention)
           << ": config " << c.at("config").dump());
      // exactly Hugging Face's parameter names: none missing, none extra
      std::set<std::string> ours, theirs;
      for (const auto& [name, p] : model->named_parameters()) ours.insert(name);
      for (const auto& [name, value] : c.at("params").items()) theirs.insert(name);
      CHECK(ours == theirs);

      const auto ids = remat::test::json_tensor<std::int32_t>(c.at("ids"));
      const auto targets = remat::test::json_tensor<std::int32_t>(c.at("targets"));
      CHECK(remat::test::relative_difference(model->logits(ids).value(),
                                             remat::test::json_tensor<double>(c.at("logits"))) <=
            1e-12);
      std::map<std::string, Tensor<double>> plain;
      for (const bool chunked : {true, false}) {
        double loss = 0;
        const auto grads = family_grads(*model, ids, targets, nullptr, chunked, &loss);
        CHECK(std::abs(loss - c.at("loss").get<double>()) <= 1e-12 * std::abs(loss));
        for (const auto& [name, g] : grads) {
          INFO("gradient of " << name << (chunked ? " (chunked loss)" : " (plain loss)"));
          CHECK(remat::test::relative_difference(
                    g, remat::test::json_tensor<double>(c.at("grads").at(name))) <= 1e-12);
        }
        if (chunked) plain = grads;
      }
      // the same gradients, bit for bit, when the layers are checkpointed
      const remat::plan::Chain chain = model->profile(ids, targets);
      for (const remat::plan::Plan& p : {remat::plan::every(chain), remat::plan::sqrt(chain)}) {
        double loss = 0;
        const auto grads = family_grads(*model, ids, targets, &p, true, &loss);
        for (const auto& [name, g] : grads) {
          INFO(p.describe() << ": " << name);
          CHECK(g.to_vector() == plain.at(name).to_vector());
        }
      }
    }
  }
  CHECK(families == std::set<std::string>{"llama", "mistral", "qwen2", "qwen3"});
}

namespace {

/// A config.json of `family` with the required sizes and `extra` fields merged in (two key/value
/// heads unless `extra` says: Qwen's default, 32, would not divide the two heads).
std::string family_json(const std::string& family, const std::string& extra = "") {
  const bool kv = extra.find("num_key_value_heads") == std::string::npos;
  return R"({"model_type": ")" + family +
         R"(", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
             "num_hidden_layers": 3, "num_attention_heads": 2)" +
         (kv ? R"(, "num_key_value_heads": 2)" : "") + (extra.empty() ? "" : ", " + extra) + "}";
}

std::string family_error(const std::string& text) {
  return remat::test::error_message(
      [&] { remat::hub::parse_llama_config(text, "hub/config.json"); });
}

}  // namespace

TEST_CASE("config.json families: Hugging Face's defaults and meanings per model_type",
          "[nn][llama][config][families]") {
  using remat::hub::parse_llama_config;
  const auto llama = parse_llama_config(family_json("llama", R"("attention_bias": true,
      "mlp_bias": true, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
      "torch_dtype": "bfloat16", "transformers_version": "4.45.0", "bos_token_id": 1,
      "eos_token_id": [2, 3], "use_cache": true, "pretraining_tp": 1, "attention_dropout": 0.0,
      "architectures": ["LlamaForCausalLM"])"));
  CHECK(llama.attention_bias);
  CHECK(llama.o_proj_bias);  // Llama's attention_bias: q, k, v and o
  CHECK(llama.mlp_bias);
  CHECK(!llama.qk_norm);
  CHECK(llama.rope_scaling.type == remat::RopeScalingType::llama3);
  CHECK(llama.rope_scaling.factor == 32.0);
  CHECK(llama.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(llama.max_position_embeddings == 2048);
  // "default" is no scaling, under either key; the legacy "type" key is read as HF reads it
  for (const char* r : {R"({"rope_type": "default"})", R"({"type": "default"})"}) {
    CHECK(parse_llama_config(family_json("llama", std::string("\"rope_scaling\": ") + r))
              .rope_scaling.type == remat::RopeScalingType::none);
  }
  CHECK(parse_llama_config(
            family_json("llama", R"("rope_scaling": {"type": "dynamic", "factor": 2})"))
            .rope_scaling.type == remat::RopeScalingType::dynamic);
  // transformers v5's rope_parameters, which carries rope_theta
  const auto v5 = parse_llama_config(family_json(
      "llama",
      R"("rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0})"));
  CHECK(v5.rope_theta == 500000.0);
  CHECK(v5.rope_scaling.type == remat::RopeScalingType::linear);

  const auto qwen2 = parse_llama_config(family_json("qwen2", R"("use_sliding_window": true,
      "sliding_window": 5, "max_window_layers": 1)"));
  CHECK(qwen2.attention_bias);
  CHECK(!qwen2.o_proj_bias);  // Qwen2: q, k and v only
  CHECK(qwen2.max_position_embeddings == 32768);
  CHECK(qwen2.window_of(0) == 0);  // layers below max_window_layers attend to everything
  CHECK(qwen2.window_of(1) == 5);
  CHECK(qwen2.window_of(2) == 5);
  // Qwen2.5's own config: a sliding_window that use_sliding_window turns off
  CHECK(parse_llama_config(family_json("qwen2", R"("use_sliding_window": false,
            "sliding_window": 131072, "max_window_layers": 21)"))
            .sliding_window == 0);

  const auto qwen3 = parse_llama_config(family_json("qwen3", R"("use_sliding_window": true,
      "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"])"));
  CHECK(qwen3.qk_norm);
  CHECK(qwen3.head_dim() == 128);  // Qwen3Config's default, not hidden_size / heads
  CHECK(qwen3.window_of(0) == 4);
  CHECK(qwen3.window_of(1) == 0);
  CHECK(qwen3.window_of(2) == 4);

  const auto mistral = parse_llama_config(family_json("mistral", R"("num_key_value_heads": 1)"));
  CHECK(mistral.sliding_window == 4096);  // MistralConfig's default when the field is absent
  CHECK(mistral.max_position_embeddings == 131072);
  CHECK(parse_llama_config(R"({"model_type": "mistral", "vocab_size": 10, "hidden_size": 32,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 16})")
            .num_key_value_heads == 8);  // MistralConfig's default, not num_attention_heads
  CHECK(parse_llama_config(
            family_json("mistral", R"("num_key_value_heads": 2, "sliding_window": null)"))
            .sliding_window == 0);
  CHECK(parse_llama_config(family_json("mistral", R"("num_key_value_heads": 2, "head_dim": 6)"))
            .head_dim() == 6);
  // architectures alone names the family
  CHECK(parse_llama_config(R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10,
            "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4})")
            .qk_norm);
}

TEST_CASE("config.json: unsupported families and unaccounted fields are errors naming them",
          "[nn][llama][config][families][errors]") {
  using Catch::Matchers::Contains;
  CHECK_THAT(family_error(family_json("gemma")),
             Contains("hub/config.json") && Contains("'gemma'") && Contains("not supported") &&
                 Contains("qwen3 (Qwen3ForCausalLM)") && Contains("mistral"));
  CHECK_THAT(
      family_error(family_json("llama", R"("architectures": ["LlamaForSequenceClassification"])")),
      Contains("LlamaForSequenceClassification") && Contains("LlamaForCausalLM"));
  CHECK_THAT(family_error(R"({"architectures": ["PhiForCausalLM"], "vocab_size": 10})"),
             Contains("PhiForCausalLM") && Contains("not supported"));
  // a field nothing reads is refused by name, with its value
  CHECK_THAT(family_error(family_json("llama", R"("num_experts": 8)")),
             Contains("'num_experts'") && Contains("8") && Contains("model_type 'llama'"));
  // fields of another family are not this one's: HF's Mistral has no mlp_bias
  CHECK_THAT(family_error(family_json("mistral", R"("mlp_bias": true)")), Contains("'mlp_bias'"));
  CHECK_THAT(family_error(family_json("llama", R"("sliding_window": 4)")),
             Contains("'sliding_window'"));
  CHECK_THAT(family_error(family_json("qwen2", R"("attention_bias": false)")),
             Contains("'attention_bias'") && Contains("false"));
  CHECK_THAT(family_error(family_json("llama", R"("attention_dropout": 0.1)")),
             Contains("'attention_dropout'") && Contains("0.1"));
  CHECK_THAT(family_error(family_json("llama", R"("partial_rotary_factor": 0.5)")),
             Contains("'partial_rotary_factor'"));
  CHECK_THAT(family_error(family_json("llama", R"("quantization_config": {"bits": 4})")),
             Contains("'quantization_config'"));
  CHECK_THAT(
      family_error(family_json("llama", R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})")),
      Contains("'yarn'") && Contains("llama3"));
  CHECK_THAT(family_error(
                 family_json("llama", R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})")),
             Contains("low_freq_factor"));
  CHECK_THAT(family_error(family_json(
                 "llama", R"("rope_scaling": {"type": "linear", "factor": 2.0, "beta": 1})")),
             Contains("'beta'"));
  CHECK_THAT(
      family_error(family_json("llama", R"("rope_scaling": {"type": "linear", "factor": 0.5})")),
      Contains("factor"));
  CHECK_THAT(family_error(family_json("qwen3", R"("use_sliding_window": true, "sliding_window": 4,
                 "layer_types": ["sliding_attention", "chunked_attention", "full_attention"])")),
             Contains("'layer_types'") && Contains("chunked_attention"));
  CHECK_THAT(family_error(family_json("qwen3", R"("use_sliding_window": true, "sliding_window": 4,
                 "layer_types": ["sliding_attention"])")),
             Contains("'layer_types'") && Contains("3 layer types"));
  CHECK_THAT(
      family_error(family_json(
          "qwen2", R"("layer_types": ["sliding_attention", "full_attention", "full_attention"])")),
      Contains("'layer_types'"));
  CHECK_THAT(family_error(family_json("llama", R"("head_dim": 3)")), Contains("head_dim 3"));
}

TEST_CASE(
    "config.json: absent and null fields, legacy keys and pad_token_id as transformers has them",
    "[nn][llama][config][families]") {
  using Catch::Matchers::Contains;
  using remat::hub::parse_llama_config;
  const auto sized = [](const std::string& family, const std::string& extra, int heads = 32) {
    return R"({"model_type": ")" + family +
           R"(", "vocab_size": 10, "hidden_size": 64, "intermediate_size": 16,
               "num_hidden_layers": 3, "num_attention_heads": )" +
           std::to_string(heads) + (extra.empty() ? "" : ", " + extra) + "}";
  };
  // num_key_value_heads: absent is 32 for Qwen2/3, 8 for Mistral, the heads for Llama; null is
  // the heads everywhere
  CHECK(parse_llama_config(sized("qwen2", "")).num_key_value_heads == 32);
  CHECK(parse_llama_config(sized("qwen3", R"("head_dim": 4)")).num_key_value_heads == 32);
  CHECK(parse_llama_config(sized("mistral", "")).num_key_value_heads == 8);
  CHECK(parse_llama_config(sized("llama", "")).num_key_value_heads == 32);
  for (const char* family : {"llama", "mistral", "qwen2"}) {
    INFO(family);
    CHECK(parse_llama_config(sized(family, R"("num_key_value_heads": null)")).num_key_value_heads ==
          32);
  }
  CHECK(parse_llama_config(sized("mistral", R"("num_key_value_heads": null)", 16))
            .num_key_value_heads == 16);
  // null where HF gives it no meaning: refused by name, in every family that reads the key
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) {
    for (const char* key : {"hidden_act", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                            "max_position_embeddings", "initializer_range", "attention_dropout",
                            "model_type", "vocab_size"}) {
      INFO(family << " " << key);
      std::string text = family_json(family, std::string("\"") + key + "\": null");
      if (std::string(key) == "model_type" || std::string(key) == "vocab_size") {
        // the key is in family_json already: its first value is replaced
        const std::size_t at = text.find(std::string("\"") + key + "\": ");
        const std::size_t end = text.find(',', at);
        text.erase(at, end + 1 - at);
      }
      CHECK_THAT(family_error(text),
                 Contains("hub/config.json") && Contains(std::string("'") + key + "' is null"));
    }
  }
  CHECK_THAT(family_error(family_json("qwen3", R"("head_dim": null)")),
             Contains("'head_dim' is null"));
  CHECK_THAT(family_error(family_json("qwen2", R"("head_dim": null)")),
             Contains("'head_dim' is null"));
  CHECK(parse_llama_config(family_json("llama", R"("head_dim": null)")).head_dim() == 4);
  CHECK(parse_llama_config(family_json("mistral", R"("head_dim": null)")).head_dim() == 4);
  CHECK_THAT(family_error(family_json("llama", R"("attention_bias": null)")),
             Contains("'attention_bias' is null"));
  CHECK_THAT(family_error(family_json("qwen2", R"("use_sliding_window": null)")),
             Contains("'use_sliding_window' is null"));
  CHECK_THAT(family_error(family_json("llama", R"("rope_scaling": {"rope_type": null})")),
             Contains("'rope_scaling' key 'rope_type' is null"));
  CHECK_THAT(family_error(family_json("llama", R"("rope_scaling": {"rope_type": "llama3",
                 "factor": 8.0, "low_freq_factor": null, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192})")),
             Contains("'low_freq_factor' is null"));
  // max_window_layers null: refused only where the layers read it (windows in use)
  CHECK_THAT(family_error(family_json("qwen2", R"("use_sliding_window": true,
                 "sliding_window": 4, "max_window_layers": null)")),
             Contains("'max_window_layers' is null"));
  CHECK(parse_llama_config(family_json("qwen2", R"("use_sliding_window": false,
            "max_window_layers": null)"))
            .sliding_window == 0);
  // the top-level rope_theta and rope_parameters' must agree (v4 reads the first, v5 the second)
  CHECK_THAT(family_error(family_json("llama", R"("rope_theta": 10000.0,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})")),
             Contains("'rope_theta' (10000)") && Contains("(500000)"));
  CHECK(parse_llama_config(family_json("llama", R"("rope_theta": 500000.0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})"))
            .rope_theta == 500000.0);
  // the fields that cannot change the maths are checked for their kind; null is their default
  for (const char* bad :
       {R"("torch_dtype": "int8")", R"("dtype": 42)", R"("pretraining_tp": "banana")",
        R"("pretraining_tp": 0)", R"("use_cache": "maybe")", R"("output_attentions": 7)",
        R"("return_dict": [1])", R"("bos_token_id": "abc")", R"("eos_token_id": [2, -1])",
        R"("id2label": [])", R"("transformers_version": 4)"}) {
    INFO(bad);
    const std::string text(bad), key = text.substr(0, text.find(':'));  // "name", quoted
    CHECK_THAT(family_error(family_json("llama", bad)),
               Contains("hub/config.json") &&
                   Contains("field '" + key.substr(1, key.size() - 2) + "' must be"));
  }
  CHECK_NOTHROW(parse_llama_config(
      family_json("llama", R"("torch_dtype": null, "dtype": "float16", "bos_token_id": null,
      "eos_token_id": [1, 2], "use_cache": false, "pretraining_tp": 2, "tokenizer_class": null,
      "id2label": {"0": "LABEL_0"})")));
  // keys of real configs HF's causal LMs do not read: Qwen2.5-0.5B's and
  // DeepSeek-R1-Distill-Qwen's use_mrope, SmolLM2's transformers.js_config
  CHECK(parse_llama_config(family_json("qwen2", R"("use_mrope": false,
            "_attn_implementation_autoset": true,
            "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16"}})"))
            .attention_bias);
  CHECK_THAT(family_error(family_json("qwen2", R"("use_mrope": "no")")),
             Contains("field 'use_mrope' must be true or false"));
  // Qwen's window: absent is 4096, null none
  const auto qwen = parse_llama_config(family_json("qwen2", R"("use_sliding_window": true,
      "max_window_layers": 1)"));
  CHECK(qwen.window_of(0) == 0);
  CHECK(qwen.window_of(1) == 4096);
  CHECK(parse_llama_config(family_json("qwen3", R"("use_sliding_window": true,
            "layer_types": ["full_attention", "sliding_attention", "full_attention"])"))
            .window_of(1) == 4096);
  CHECK(parse_llama_config(family_json("qwen2", R"("use_sliding_window": true,
            "sliding_window": null)"))
            .sliding_window == 0);
  // layer_types is checked with no window in use too
  CHECK_THAT(family_error(family_json("qwen2", R"("layer_types": "full_attention")")),
             Contains("'layer_types'"));
  CHECK_THAT(family_error(family_json("qwen3", R"("layer_types": ["full_attention"])")),
             Contains("3 layer types"));
  // keys transformers' versions read differently are refused, equal ones accepted
  CHECK_THAT(family_error(family_json("llama", R"("rope_scaling": {"rope_type": "linear",
                 "factor": 4.0}, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0})")),
             Contains("'rope_scaling'") && Contains("'rope_parameters'"));
  CHECK(parse_llama_config(family_json("llama", R"("rope_scaling": {"rope_type": "linear",
            "factor": 4.0}, "rope_parameters": {"rope_type": "linear", "factor": 4.0})"))
            .rope_scaling.factor == 4.0);
  CHECK_THAT(
      family_error(family_json(
          "llama", R"("rope_scaling": {"type": "linear", "rope_type": "dynamic", "factor": 2})")),
      Contains("\"linear\"") && Contains("\"dynamic\""));
  CHECK(
      parse_llama_config(
          family_json("llama",
                      R"("rope_scaling": {"type": "linear", "rope_type": "linear", "factor": 2})"))
          .rope_scaling.type == remat::RopeScalingType::linear);
  // "swish" is SiLU in transformers' ACT2FN
  CHECK_NOTHROW(parse_llama_config(family_json("llama", R"("hidden_act": "swish")")));
  CHECK_THAT(family_error(family_json("llama", R"("hidden_act": "gelu")")),
             Contains("'hidden_act'"));
  // pad_token_id: the embedding's padding_idx, a negative one counted from the end
  CHECK(parse_llama_config(family_json("llama", R"("pad_token_id": 3)")).pad_token_id == 3);
  CHECK(parse_llama_config(family_json("llama", R"("pad_token_id": -1)")).pad_token_id == 9);
  CHECK(parse_llama_config(family_json("llama", R"("pad_token_id": null)")).pad_token_id == -1);
  CHECK(parse_llama_config(family_json("llama")).pad_token_id == -1);
  for (const char* bad : {"10", "-11", "2.5", "[1]"}) {
    INFO(bad);
    CHECK_THAT(family_error(family_json("llama", std::string(R"("pad_token_id": )") + bad)),
               Contains("'pad_token_id'"));
  }
}

TEST_CASE("pad_token_id: its embedding row starts at zero and gets no gradient from the lookup",
          "[nn][llama][config]") {
  // HF's models build nn.Embedding(vocab, hidden, padding_idx=pad_token_id): the lookup gives
  // that row nothing; a tied head's gradient still reaches it
  for (const bool tied : {false, true}) {
    INFO("tied " << tied);
    remat::nn::LlamaConfig c{.vocab_size = 11,
                             .hidden_size = 8,
                             .intermediate_size = 12,
                             .num_hidden_layers = 2,
                             .num_attention_heads = 2,
                             .num_key_value_heads = 1,
                             .tie_word_embeddings = tied,
                             .max_position_embeddings = 16};
    remat::nn::Llama<double> plain(c);
    c.pad_token_id = 3;
    remat::nn::Llama<double> padded(c);
    const std::vector<double> start = padded.embed_tokens.weight.data().to_vector();
    for (std::size_t k = 0; k < 8; ++k) CHECK(start[3 * 8 + k] == 0.0);
    // the same weights in both (row 3 too, so that it could get a gradient)
    auto from = plain.named_parameters(), to = padded.named_parameters();
    REQUIRE(from.size() == to.size());
    for (std::size_t i = 0; i < from.size(); ++i) {
      const remat::Tensor<double>& v = from[i].second.data();
      std::copy(v.data(), v.data() + v.numel(), to[i].second.data().data());
    }
    remat::Tensor<std::int32_t> ids({2, 5}), targets({2, 5});
    const std::int32_t id_values[] = {1, 3, 5, 3, 7, 3, 2, 3, 9, 4};
    for (std::int64_t i = 0; i < 10; ++i) {
      ids[i] = id_values[i];
      targets[i] = id_values[(i + 3) % 10];
    }
    std::vector<std::vector<double>> grads;
    for (remat::nn::Llama<double>* m : {&plain, &padded}) {
      remat::Tape tape;
      tape.backward(m->loss(ids, targets));
      grads.push_back(m->embed_tokens.weight.grad().to_vector());
    }
    for (std::size_t row = 0; row < 11; ++row) {
      for (std::size_t k = 0; k < 8; ++k) {
        INFO("row " << row << " column " << k);
        const double a = grads[0][row * 8 + k], b = grads[1][row * 8 + k];
        if (row != 3) CHECK(a == b);
        if (row == 3) CHECK(a != b);             // the lookup's share is gone
        if (row == 3 && !tied) CHECK(b == 0.0);  // and nothing else reaches it
      }
    }
  }
}

TEST_CASE("config.json written by llama_config_json reads back to the same config, every family",
          "[nn][llama][config][families]") {
  remat::Rng rng(2212);
  const char* families[] = {"llama", "mistral", "qwen2", "qwen3"};
  for (int round = 0; round < 40; ++round) {
    remat::nn::LlamaConfig c{.vocab_size = 5 + rng.uniform_int(20),
                             .intermediate_size = 1 + rng.uniform_int(9),
                             .num_hidden_layers = 1 + rng.uniform_int(4),
                             .num_attention_heads = 2,
                             .num_key_value_heads = 1 + rng.uniform_int(2),
                             .rope_theta = rng.uniform_int(2) ? 1e4 : 5e5,
                             .tie_word_embeddings = rng.uniform_int(2) == 1,
                             .max_position_embeddings = 8 + rng.uniform_int(30)};
    c.hidden_size = 4 * (1 + rng.uniform_int(4));  // an even head size under 2 heads
    c.model_type = families[rng.uniform_int(4)];
    const bool bias = rng.uniform_int(2) == 1;
    if (rng.uniform_int(2)) c.explicit_head_dim = 2 * (1 + rng.uniform_int(3));
    if (c.model_type == "llama") {
      c.attention_bias = c.o_proj_bias = bias;
      c.mlp_bias = rng.uniform_int(2) == 1;
      const int r = static_cast<int>(rng.uniform_int(4));
      c.rope_scaling.type = static_cast<remat::RopeScalingType>(r);
      if (r > 0) c.rope_scaling.factor = 1.0 + static_cast<double>(rng.uniform_int(8));
      if (c.rope_scaling.type == remat::RopeScalingType::llama3)
        c.rope_scaling.original_max_position_embeddings = 1 + rng.uniform_int(1000);
    } else if (c.model_type == "qwen2") {
      c.attention_bias = true;
    } else if (c.model_type == "qwen3") {
      c.qk_norm = true;
      c.attention_bias = c.o_proj_bias = bias;
    }
    if (c.model_type != "llama" && rng.uniform_int(2)) {
      c.sliding_window = 1 + rng.uniform_int(6);
      if (c.model_type != "mistral") {
        for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
          c.sliding_layers.push_back(rng.uniform_int(2) == 1);
      }
    }
    INFO("round " << round << ": " << remat::hub::llama_config_json(c));
    const auto back = remat::hub::parse_llama_config(remat::hub::llama_config_json(c));
    CHECK(back.model_type == c.model_type);
    CHECK(back.head_dim() == c.head_dim());
    CHECK(back.attention_bias == c.attention_bias);
    CHECK(back.o_proj_bias == c.o_proj_bias);
    CHECK(back.mlp_bias == c.mlp_bias);
    CHECK(back.qk_norm == c.qk_norm);
    CHECK(back.rope_scaling.type == c.rope_scaling.type);
    CHECK(back.rope_scaling.factor == c.rope_scaling.factor);
    CHECK(back.tie_word_embeddings == c.tie_word_embeddings);
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
      CHECK(back.window_of(i) == c.window_of(i));
    // the model built from either has the same parameter names and shapes
    const remat::nn::Llama<float> a(c), b(back);
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      CHECK(pa[i].first == pb[i].first);
      CHECK(pa[i].second.shape() == pb[i].second.shape());
    }
  }
  // a Llama with q/k/v biases and none on o is written as Qwen2, as before
  remat::nn::LlamaConfig qkv_only{.vocab_size = 7,
                                  .hidden_size = 4,
                                  .intermediate_size = 3,
                                  .num_hidden_layers = 1,
                                  .num_attention_heads = 2,
                                  .num_key_value_heads = 1,
                                  .attention_bias = true};
  CHECK(remat::hub::llama_family_of(qkv_only) == "qwen2");
  qkv_only.mlp_bias = true;  // no family has q/k/v and MLP biases without an o bias
  CHECK_THROWS_WITH(remat::hub::llama_family_of(qkv_only), Catch::Contains("no supported family"));
}
