// adapter_config.json's fields (nn/lora.hpp): adapters with rsLoRA, rank_pattern, alpha_pattern,
// target_modules as names or as a regex, exclude_modules and layers_to_transform give the logits
// of an independent double-precision reference (tests/reference/make_lora_reference.py, written
// from PEFT's rules); save_adapters() then load() round-trips every field; the fields remat does
// not implement, and unknown ones, are refused by name.
#include "support/gradcheck.hpp"
#include "support/reference.hpp"

#include <remat/nn/llama.hpp>
#include <remat/hub/llama_config.hpp>
#include <remat/hub/peft.hpp>
#include <remat/nn/lora.hpp>

#include <filesystem>
#include <fstream>
#include <map>

namespace {

using remat::Tensor;
namespace lora = remat::nn::lora;

/// The reference's base model (lora.json), in double.
std::unique_ptr<remat::nn::Llama<double>> lora_reference_base() {
  const nlohmann::json& ref = remat::test::reference("lora.json");
  auto model = std::make_unique<remat::nn::Llama<double>>(
      remat::hub::llama_config_from_json(ref.at("config"), "lora.json"));
  for (const auto& [name, p] : model->named_parameters()) {
    const Tensor<double> w = remat::test::json_tensor<double>(ref.at("params").at(name));
    REQUIRE(w.shape() == p.shape());
    std::copy(w.begin(), w.end(), remat::Parameter<double>(p).data().data());
  }
  model->eval();
  return model;
}

std::string lora_config_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("remat_lora_config_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

/// Writes `config` as `dir`/adapter_config.json.
void write_config(const std::string& dir, const nlohmann::ordered_json& config) {
  std::ofstream(dir + "/adapter_config.json") << config.dump(2) << "\n";
}

}  // namespace

TEST_CASE(
    "lora: PEFT adapters with rsLoRA, rank/alpha patterns, regex targets, exclusions and layer "
    "filters give the reference's logits",
    "[nn][lora][reference]") {
  const nlohmann::json& ref = remat::test::reference("lora.json");
  const Tensor<std::int32_t> ids = remat::test::json_tensor<std::int32_t>(ref.at("ids"));
  const Tensor<double> base_logits = remat::test::json_tensor<double>(ref.at("base_logits"));
  {
    const auto base = lora_reference_base();
    CHECK(remat::test::relative_difference(base->logits(ids).value(), base_logits) <= 1e-12);
  }
  for (const nlohmann::json& c : ref.at("cases")) {
    const std::string dir =
        std::string(REMAT_REFERENCE_DIR) + "/lora/" + c.at("folder").get<std::string>();
    INFO(dir);
    const auto model = lora_reference_base();
    const auto adapters = remat::hub::load_lora(*model, dir);
    // the layers PEFT's rules select, each with its rank and scale
    std::map<std::string, std::pair<std::int64_t, double>> got;
    for (const auto& a : adapters.adapters()) got[a.path] = {a.rank, a.scale};
    std::map<std::string, std::pair<std::int64_t, double>> want;
    for (const auto& [path, m] : c.at("modules").items())
      want[path] = {m.at("r").get<std::int64_t>(), m.at("scale").get<double>()};
    CHECK(got == want);
    const Tensor<double> logits = remat::test::json_tensor<double>(c.at("logits"));
    const double off = remat::test::relative_difference(model->logits(ids).value(), logits);
    CHECK(off <= 1e-12);
    // the adapters matter: the base model's logits are far from the adapted ones
    CHECK(remat::test::relative_difference(base_logits, logits) > 1e-3);
  }
}

TEST_CASE("lora: save_adapters then load round-trips every field of the options and the values",
          "[nn][lora][io]") {
  remat::Rng draw(26);
  for (int round = 0; round < 4; ++round) {
    const auto model = lora_reference_base();
    lora::Options o{.rank = 1 + draw.uniform_int(4),
                    .alpha = double(1 + draw.uniform_int(16)),
                    .dropout = draw.uniform() < 0.5 ? 0.0 : 0.1,
                    .seed = std::uint64_t(round),
                    .base_model_name_or_path = "tiny"};
    if (round % 2 == 0) {
      o.targets = {"q_proj", "up_proj", "model.layers.2.self_attn.v_proj"};
      o.layers_to_transform = {0, 3};
      if (round == 2) o.layers_pattern = {"layers"};
      o.exclude = {"model.layers.0.mlp.up_proj"};
    } else {
      o.target_regex = R"(.*\.(k_proj|down_proj))";
      o.exclude_regex = R"(.*\.1\..*)";
    }
    o.use_rslora = round >= 2;
    o.rank_pattern = {{"down_proj", 5}, {R"(layers\.3\..*)", 2}};
    o.alpha_pattern = {{".*_proj", 3.5}, {"q_proj", 64}};  // the first key wins: q_proj gets 3.5
    auto adapters = lora::apply(*model, o);
    for (const auto& a : adapters.adapters()) {
      remat::Parameter<double>(a.B.weight).data() =
          draw.uniform_tensor<double>(a.B.weight.shape(), -0.5, 0.5);
      CHECK(a.alpha == 3.5);
      CHECK(a.scale == (o.use_rslora ? 3.5 / std::sqrt(double(a.rank)) : 3.5 / double(a.rank)));
    }
    const std::string dir = lora_config_dir("roundtrip" + std::to_string(round));
    remat::hub::save_adapters(adapters, dir);
    const lora::Options back = remat::hub::read_lora_options(dir);
    CHECK(back.rank == o.rank);
    CHECK(back.alpha == o.alpha);
    CHECK(back.dropout == o.dropout);
    CHECK(back.targets == o.targets);
    CHECK(back.target_regex == o.target_regex);
    CHECK(back.exclude == o.exclude);
    CHECK(back.exclude_regex == o.exclude_regex);
    CHECK(back.layers_to_transform == o.layers_to_transform);
    CHECK(back.layers_pattern == o.layers_pattern);
    CHECK(back.use_rslora == o.use_rslora);
    CHECK(back.rank_pattern == o.rank_pattern);
    CHECK(back.alpha_pattern == o.alpha_pattern);
    CHECK(back.base_model_name_or_path == "tiny");

    const auto other = lora_reference_base();
    const auto loaded = remat::hub::load_lora(*other, dir);
    REQUIRE(loaded.adapters().size() == adapters.adapters().size());
    for (std::size_t i = 0; i < loaded.adapters().size(); ++i) {
      CHECK(loaded.adapters()[i].path == adapters.adapters()[i].path);
      CHECK(loaded.adapters()[i].rank == adapters.adapters()[i].rank);
      CHECK(loaded.adapters()[i].scale == adapters.adapters()[i].scale);
    }
    model->eval();
    const auto ids = remat::test::ids({2, 5}, 29, std::uint64_t(round));
    CHECK(other->logits(ids).value().to_vector() == model->logits(ids).value().to_vector());

    // adapters applied with other scaling refuse the file, naming the layer and both scales
    const auto third = lora_reference_base();
    lora::Options plain = o;
    plain.use_rslora = !o.use_rslora;
    auto mismatched = lora::apply(*third, plain);
    CHECK_THROWS_WITH(remat::hub::load_adapters(mismatched, dir),
                      Catch::Contains("use_rslora") && Catch::Contains("lora_alpha = 3.5"));
  }
}

TEST_CASE("lora: adapter_config.json fields that change the model are implemented or refused",
          "[nn][lora][io]") {
  using Catch::Matchers::Contains;
  const nlohmann::ordered_json good = {{"peft_type", "LORA"},
                                       {"r", 2},
                                       {"lora_alpha", 4},
                                       {"target_modules", {"q_proj"}},
                                       {"bias", "none"}};
  const std::string dir = lora_config_dir("fields");
  // the message of the error read_options() throws, "" when it accepts the config
  const auto read = [&](const nlohmann::ordered_json& config) -> std::string {
    write_config(dir, config);
    try {
      remat::hub::read_lora_options(dir);
    } catch (const remat::Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(read(good).empty());
  // refused when on, accepted when off (null, false, "", [] or {}), each named
  const std::vector<std::pair<const char*, nlohmann::ordered_json>> refused = {
      {"bias", "all"},
      {"bias", "lora_only"},
      {"fan_in_fan_out", true},
      {"modules_to_save", {"lm_head"}},
      {"use_dora", true},
      {"lora_bias", true},
      {"use_qalora", true},
      {"layer_replication", {{0, 2}}},
      {"megatron_config", {{"tensor_model_parallel_size", 2}}},
      {"enable_lora", {true, false, true}},
      {"trainable_token_indices", {1, 2}},
      {"alora_invocation_tokens", {5}},
      {"target_parameters", {"experts.weight"}},
      {"ensure_weight_tying", true},
      {"init_lora_weights", "pissa"},
      {"init_lora_weights", "olora"},
      {"init_lora_weights", "loftq"},
      {"init_lora_weights", "mica"},
      {"target_modules", "all-linear"},
      {"target_modules", nullptr},
      {"use_rslora", "yes"},
      {"rank_pattern", {{"q_proj", 0}}},
      {"alpha_pattern", {{"q_proj", "big"}}},
      {"rank_pattern", {{"(?P<x>q)_proj", 2}}},
      // anchors in Python's re, literal letters in ECMAScript: refused, not read otherwise
      {"alpha_pattern", {{"q_proj\\Z", 16}}},
      {"target_modules", "\\Amodel.*\\.(q|v)_proj"},
      {"exclude_modules", ".*\\.1\\..*\\Z"},
      {"rank_pattern", {{"\\d\\.self_attn\\.q_pr\\oj", 2}}},
      {"layers_pattern", "layers"},  // without layers_to_transform (PEFT refuses it too)
      {"lora_dropout", 1.0},
      {"something_new", 1},
      {"peft_type", "LOHA"},
  };
  for (const auto& [key, value] : refused) {
    nlohmann::ordered_json c = good;
    c[key] = value;
    const std::string message = read(c);
    INFO(key << " = " << value.dump() << ": " << message);
    CHECK_THAT(message, Contains(key) && Contains("adapter_config.json"));
  }
  // a regex target with layers_to_transform or layers_pattern is refused, as PEFT does, even
  // empty (PEFT tests them with `is None`)
  nlohmann::ordered_json c = good;
  c["target_modules"] = ".*q_proj";
  for (const auto& [key, value] : std::vector<std::pair<const char*, nlohmann::ordered_json>>{
           {"layers_to_transform", {0}},
           {"layers_to_transform", nlohmann::ordered_json::array()},
           {"layers_pattern", ""}}) {
    nlohmann::ordered_json d = c;
    d[key] = value;
    CHECK_THAT(read(d), Contains(key));
  }
  // PEFT's defaults and its tests by truth: r and lora_alpha absent are 8, use_rslora null is
  // false, an empty layers_to_transform is every layer (layers_pattern then qualifies nothing)
  c = good;
  c.erase("r");
  c.erase("lora_alpha");
  c["use_rslora"] = nullptr;
  c["layers_pattern"] = "layers";
  c["layers_to_transform"] = nlohmann::ordered_json::array();
  REQUIRE(read(c).empty());
  const remat::nn::lora::Options defaults = remat::hub::read_lora_options(dir);
  CHECK(defaults.rank == 8);
  CHECK(defaults.alpha == 8.0);
  CHECK(!defaults.use_rslora);
  CHECK(defaults.layers_to_transform.empty());
  CHECK(defaults.layers_pattern.empty());
  // off values and the harmless fields are accepted
  c = good;
  for (const char* key : {"fan_in_fan_out", "use_dora", "lora_bias", "use_qalora"}) c[key] = false;
  for (const char* key : {"modules_to_save", "layer_replication", "megatron_config",
                          "trainable_token_indices", "alora_invocation_tokens", "target_parameters",
                          "exclude_modules", "layers_to_transform", "layers_pattern"})
    c[key] = nullptr;
  c["enable_lora"] = nullptr;  // PEFT 0.2's fused-projection switch, off
  c["init_lora_weights"] = "gaussian";
  for (const auto& [key, why] : remat::hub::kHarmlessLoraFields) c[key] = "anything";
  c["runtime_config"] = {{"ephemeral_gpu_offload", false}};
  CHECK(read(c).empty());
  std::filesystem::remove_all(dir);
}
