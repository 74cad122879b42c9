// nn::load_llama: a Llama saved as a Hugging Face folder (random configs, one file or random
// shards, F32 or BF16) loads back to the same parameters and logits; mismatched folders are
// IoErrors that leave a model untouched.
#include "support/child.hpp"
#include "support/gradcheck.hpp"

#include <catch2/catch.hpp>

#include <remat/nn/llama_load.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace {

std::string ll_dir(const std::string& test) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("remat_llama_load_" + std::to_string(::getpid())) / test;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

/// A random tiny config: GQA or not, tied or not, biases or not.
remat::nn::LlamaConfig ll_random_config(remat::Rng& rng) {
  const std::int64_t kv = 1 + rng.uniform_int(2), heads = kv * (1 + rng.uniform_int(2)),
                     head_dim = 2 * (1 + rng.uniform_int(3));
  return {.vocab_size = 5 + rng.uniform_int(20),
          .hidden_size = heads * head_dim,
          .intermediate_size = 1 + rng.uniform_int(24),
          .num_hidden_layers = 1 + rng.uniform_int(3),
          .num_attention_heads = heads,
          .num_key_value_heads = kv,
          .tie_word_embeddings = rng.uniform_int(2) == 1,
          .attention_bias = rng.uniform_int(2) == 1,
          .max_position_embeddings = 16,
          .seed = rng.next_u64()};
}

/// Saves `model` into `dir` as train_llama's --save-hf does, sharded at `max_shard` bytes.
void ll_save(const remat::nn::Llama<float>& model, const std::string& dir, std::size_t max_shard,
             remat::io::StoreAs store) {
  std::ofstream(dir + "/config.json") << remat::nn::llama_config_json(model.config());
  std::vector<remat::io::NamedTensor<float>> tensors;
  for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, p.value());
  remat::io::save_sharded(dir, tensors, max_shard, {{"format", "pt"}}, store);
}

}  // namespace

TEST_CASE("load_llama reads back what was saved: random configs, one file or shards, F32 or BF16",
          "[nn][llama][io]") {
  remat::Rng rng(4242);
  for (int round = 0; round < 16; ++round) {
    const remat::nn::LlamaConfig config = ll_random_config(rng);
    const remat::nn::Llama<float> saved(config);
    const std::string dir = ll_dir("round_" + std::to_string(round));
    const bool bf16 = round % 3 == 2;
    const std::size_t max_shard =
        rng.uniform_int(2) ? (1u << 30) : 64 + static_cast<std::size_t>(rng.uniform_int(2000));
    ll_save(saved, dir, max_shard, bf16 ? remat::io::StoreAs::bf16 : remat::io::StoreAs::native);
    INFO("round " << round << " bf16 " << bf16 << " shard bytes " << max_shard);
    const remat::nn::Llama<float> loaded = remat::nn::load_llama<float>(dir);
    const auto a = saved.named_parameters(), b = loaded.named_parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      REQUIRE(a[i].first == b[i].first);
      const auto& x = a[i].second.value();
      const auto& y = b[i].second.value();
      REQUIRE(x.shape() == y.shape());
      for (std::int64_t k = 0; k < x.numel(); ++k) {
        REQUIRE(
            y.data()[k] ==
            (bf16 ? remat::io::bf16_to_float(remat::io::float_to_bf16(x.data()[k])) : x.data()[k]));
      }
    }
    if (!bf16) {
      remat::Tensor<std::int32_t> ids(remat::Shape{2, 5});
      for (std::int64_t k = 0; k < ids.numel(); ++k)
        ids.data()[k] = static_cast<std::int32_t>(rng.uniform_int(config.vocab_size));
      remat::NoGradGuard no_grad;
      const auto la = saved.logits(ids).value(), lb = loaded.logits(ids).value();
      for (std::int64_t k = 0; k < la.numel(); ++k) REQUIRE(la.data()[k] == lb.data()[k]);
    }
  }
}

TEST_CASE(
    "a folder that does not match the model is an IoError naming the tensor, and the model is "
    "untouched",
    "[nn][llama][io][errors]") {
  remat::Rng rng(99);
  for (int round = 0; round < 8; ++round) {
    const remat::nn::LlamaConfig config = ll_random_config(rng);
    const remat::nn::Llama<float> saved(config);
    const std::string dir = ll_dir("mismatch_" + std::to_string(round));
    ll_save(saved, dir, 64 + static_cast<std::size_t>(rng.uniform_int(500)),
            remat::io::StoreAs::native);
    remat::nn::LlamaConfig other = config;
    other.intermediate_size += 1;  // every layer's MLP weights now differ in shape
    other.seed += 1;
    remat::nn::Llama<float> model(other);
    std::vector<std::vector<float>> before;
    for (const auto& [name, p] : model.named_parameters()) before.push_back(p.value().to_vector());
    REQUIRE_THROWS_WITH(remat::nn::load_weights(model, remat::io::WeightFiles::open(dir)),
                        Catch::Contains("mlp.") && Catch::Contains("has shape") &&
                            Catch::Contains("but the model expects"));
    std::size_t i = 0;
    for (const auto& [name, p] : model.named_parameters())
      REQUIRE(p.value().to_vector() == before[i++]);
  }
  const std::string missing = ll_dir("missing_config");
  REQUIRE_THROWS_WITH(remat::nn::load_llama<float>(missing), Catch::Contains("config.json"));
}

namespace {

/// `text` with `"key": value` put back in as a second member of the object that holds `key`
/// first (its first occurrence), so that the object repeats it.
std::string ll_repeat_key(const std::string& text, const std::string& key,
                          const std::string& value) {
  const std::size_t at = text.find("\"" + key + "\"");
  REQUIRE(at != std::string::npos);
  return text.substr(0, at) + "\"" + key + "\": " + value + ", " + text.substr(at);
}

}  // namespace

TEST_CASE("config.json: a repeated key, at any level, is an IoError naming the file and the key",
          "[nn][llama][io][errors]") {
  remat::Rng rng(26);
  const remat::nn::LlamaConfig config = ll_random_config(rng);
  const std::string good = remat::nn::llama_config_json(config);
  REQUIRE_NOTHROW(remat::nn::parse_llama_config(good, "dir/config.json"));
  // every key of the written config, repeated with another value (the last one would win)
  const nlohmann::json parsed = nlohmann::json::parse(good);
  int checked = 0;
  for (const auto& [key, value] : parsed.items()) {
    const std::string other = value.is_number_integer()
                                  ? std::to_string(value.get<std::int64_t>() + 1)
                              : value.is_boolean() ? (value.get<bool>() ? "false" : "true")
                                                   : "\"other\"";
    const std::string message = remat::test::error_message(
        [&] { remat::nn::parse_llama_config(ll_repeat_key(good, key, other), "dir/config.json"); });
    INFO(key << ": " << message);
    CHECK_THAT(message, Catch::Contains("dir/config.json") &&
                            Catch::Contains("the key '" + key + "' appears twice"));
    ++checked;
  }
  CHECK(checked >= 14);
  // inside a nested object too, named by its path
  const std::string nested =
      good.substr(0, good.rfind('}')) + R"(, "quantization_config": {"bits": 4, "bits": 8}})";
  CHECK_THAT(
      remat::test::error_message([&] { remat::nn::parse_llama_config(nested, "dir/config.json"); }),
      Catch::Contains("'bits' appears twice in the object 'quantization_config'"));
}

TEST_CASE("config.json as a FIFO or a folder is an IoError naming it, never a hang",
          "[nn][llama][io][errors]") {
  const std::string dir = ll_dir("config_not_regular");
  const std::string config = dir + "/config.json";
  REQUIRE(::mkfifo(config.c_str(), 0600) == 0);
  for (const bool folder : {false, true}) {
    CHECK(remat::test::run_in_child([&] {
            return remat::test::error_status(
                [&] {
                  if (folder)
                    (void)remat::nn::load_llama<float>(dir);
                  else
                    (void)remat::nn::load_llama_config(config);
                },
                {config.c_str(), "a FIFO"});
          }) == 0);
  }
  REQUIRE(::unlink(config.c_str()) == 0);
  std::filesystem::create_directory(config);
  CHECK_THAT(remat::test::error_message([&] { (void)remat::nn::load_llama_config(config); }),
             Catch::Contains(config) && Catch::Contains(std::strerror(EISDIR)));
}

TEST_CASE(
    "config.json sizes the tensors cannot have, or the weight files do not hold, are IoErrors "
    "naming the key and value before anything is allocated",
    "[nn][llama][io][errors]") {
  remat::Rng rng(2640);
  const remat::nn::LlamaConfig config = ll_random_config(rng);
  const remat::nn::Llama<float> saved(config);
  const std::string dir = ll_dir("huge_sizes");
  ll_save(saved, dir, 1 << 20, remat::io::StoreAs::native);
  const nlohmann::json good = nlohmann::json::parse(remat::nn::llama_config_json(config));
  REQUIRE_NOTHROW(remat::nn::load_llama<float>(dir));
  // each size set to a value whose tensors overflow (2^62, 2^59 + 1: refused when parsed) or
  // exist in no memory (2^40, 2^36: refused against the files); all in a forked child, so that a
  // regression that allocates cannot take this process's memory
  for (const char* key : {"vocab_size", "intermediate_size", "num_hidden_layers"}) {
    for (const int bits : {36, 40, 59, 62}) {
      nlohmann::json j = good;
      const std::int64_t value = (std::int64_t{1} << bits) + (bits == 59 ? 1 : 0);
      j[key] = value;
      std::ofstream(dir + "/config.json") << j.dump(2);
      INFO(key << " = " << value);
      const std::string named = std::string(key) + " = " + std::to_string(value);
      CHECK(remat::test::run_in_child([&] {
              return remat::test::error_status([&] { (void)remat::nn::load_llama<float>(dir); },
                                               {"config.json", named.c_str()});
            }) == 0);
    }
  }
}

TEST_CASE("the config fuzzer's seed corpus holds what its names say", "[nn][llama][io][errors]") {
  const auto corpus = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() /
                      "fuzz" / "corpus" / "config";
  REQUIRE(std::filesystem::is_directory(corpus));
  int valid = 0, rejected = 0;
  for (const auto& e : std::filesystem::directory_iterator(corpus)) {
    const std::string name = e.path().filename().string();
    INFO(name);
    if (name.rfind("valid_", 0) == 0) {
      CHECK_NOTHROW(remat::nn::load_llama_config(e.path().string()));
      ++valid;
    } else {
      CHECK_THROWS_AS(remat::nn::load_llama_config(e.path().string()), remat::IoError);
      ++rejected;
    }
  }
  CHECK(valid >= 2);
  CHECK(rejected >= 12);
}
