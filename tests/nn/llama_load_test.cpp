// hub::load_llama: a Llama saved as a Hugging Face folder (random configs of every family, one
// file or random shards, F32 or BF16) loads back to the same parameters and logits, and with
// frozen NF4/INT8/BF16 projections to what quantizing the loaded floats gives; mismatched
// folders, extra tensors and wrong vocab sizes are IoErrors naming them; a config.json read
// strictly (repeated keys, FIFOs, impossible sizes) is refused before anything is allocated.
#include "support/child.hpp"
#include <catch2/catch.hpp>

#include "support/gradcheck.hpp"

#include <remat/hub/llama_load.hpp>
#include <remat/nn/quantize_blocks.hpp>

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
  std::ofstream(dir + "/config.json") << remat::hub::llama_config_json(model.config());
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
    const remat::nn::Llama<float> loaded = remat::hub::load_llama<float>(dir);
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
    REQUIRE_THROWS_WITH(remat::hub::load_weights(model, remat::io::WeightFiles::open(dir)),
                        Catch::Contains("mlp.") && Catch::Contains("has shape") &&
                            Catch::Contains("but the model expects"));
    std::size_t i = 0;
    for (const auto& [name, p] : model.named_parameters())
      REQUIRE(p.value().to_vector() == before[i++]);
  }
  const std::string missing = ll_dir("missing_config");
  REQUIRE_THROWS_WITH(remat::hub::load_llama<float>(missing), Catch::Contains("config.json"));
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

/// A random tiny config of a random family, with its options drawn too.
remat::nn::LlamaConfig ll_family_config(remat::Rng& rng) {
  remat::nn::LlamaConfig c = ll_random_config(rng);
  const char* families[] = {"llama", "mistral", "qwen2", "qwen3"};
  c.model_type = families[rng.uniform_int(4)];
  c.attention_bias = c.o_proj_bias = c.mlp_bias = false;
  if (c.model_type == "llama") {
    c.attention_bias = c.o_proj_bias = rng.uniform_int(2) == 1;
    c.mlp_bias = rng.uniform_int(2) == 1;
  } else if (c.model_type == "qwen2") {
    c.attention_bias = true;
  } else if (c.model_type == "qwen3") {
    c.qk_norm = true;
    c.attention_bias = c.o_proj_bias = rng.uniform_int(2) == 1;
    c.explicit_head_dim = 2 * (1 + rng.uniform_int(3));
  }
  if (c.model_type != "llama" && rng.uniform_int(2)) c.sliding_window = 1 + rng.uniform_int(4);
  return c;
}

remat::Tensor<std::int32_t> ll_ids(remat::Rng& rng, std::int64_t vocab) {
  remat::Tensor<std::int32_t> ids(remat::Shape{2, 5});
  for (std::int64_t k = 0; k < ids.numel(); ++k)
    ids.data()[k] = static_cast<std::int32_t>(rng.uniform_int(vocab));
  return ids;
}

}  // namespace

TEST_CASE("config.json: a repeated key, at any level, is an IoError naming the file and the key",
          "[nn][llama][io][errors]") {
  remat::Rng rng(26);
  const remat::nn::LlamaConfig config = ll_random_config(rng);
  const std::string good = remat::hub::llama_config_json(config);
  REQUIRE_NOTHROW(remat::hub::parse_llama_config(good, "dir/config.json"));
  // every key of the written config, repeated with another value (the last one would win)
  const nlohmann::json parsed = nlohmann::json::parse(good);
  int checked = 0;
  for (const auto& [key, value] : parsed.items()) {
    const std::string other = value.is_number_integer()
                                  ? std::to_string(value.get<std::int64_t>() + 1)
                              : value.is_boolean() ? (value.get<bool>() ? "false" : "true")
                                                   : "\"other\"";
    const std::string message = remat::test::error_message([&] {
      remat::hub::parse_llama_config(ll_repeat_key(good, key, other), "dir/config.json");
    });
    INFO(key << ": " << message);
    CHECK_THAT(message, Catch::Contains("dir/config.json") &&
                            Catch::Contains("the key '" + key + "' appears twice"));
    ++checked;
  }
  CHECK(checked >= 14);
  // inside a nested object too, named by its path
  const std::string nested =
      good.substr(0, good.rfind('}')) + R"(, "quantization_config": {"bits": 4, "bits": 8}})";
  CHECK_THAT(remat::test::error_message(
                 [&] { remat::hub::parse_llama_config(nested, "dir/config.json"); }),
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
                    (void)remat::hub::load_llama<float>(dir);
                  else
                    (void)remat::hub::load_llama_config(config);
                },
                {config.c_str(), "a FIFO"});
          }) == 0);
  }
  REQUIRE(::unlink(config.c_str()) == 0);
  std::filesystem::create_directory(config);
  CHECK_THAT(remat::test::error_message([&] { (void)remat::hub::load_llama_config(config); }),
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
  const nlohmann::json good = nlohmann::json::parse(remat::hub::llama_config_json(config));
  REQUIRE_NOTHROW(remat::hub::load_llama<float>(dir));
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
              return remat::test::error_status([&] { (void)remat::hub::load_llama<float>(dir); },
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
      CHECK_NOTHROW(remat::hub::load_llama_config(e.path().string()));
      ++valid;
    } else {
      CHECK_THROWS_AS(remat::hub::load_llama_config(e.path().string()), remat::IoError);
      ++rejected;
    }
  }
  CHECK(valid >= 2);
  CHECK(rejected >= 12);
}

TEST_CASE(
    "load_llama: every family saved and loaded gives the same logits; frozen NF4/INT8/BF16 "
    "projections loaded from the files equal quantizing the loaded floats",
    "[nn][llama][io][families]") {
  remat::Rng rng(5151);
  const remat::WeightStorage storages[] = {remat::WeightStorage::nf4, remat::WeightStorage::int8,
                                           remat::WeightStorage::bf16};
  for (int round = 0; round < 12; ++round) {
    const remat::nn::LlamaConfig config = ll_family_config(rng);
    const remat::nn::Llama<float> saved(config);
    const std::string dir = ll_dir("family_" + std::to_string(round));
    ll_save(saved, dir, 64 + static_cast<std::size_t>(rng.uniform_int(3000)),
            remat::io::StoreAs::native);
    INFO("round " << round << ": " << remat::hub::llama_config_json(config));
    const auto ids = ll_ids(rng, config.vocab_size);
    remat::NoGradGuard no_grad;
    const remat::nn::Llama<float> loaded = remat::hub::load_llama<float>(dir);
    CHECK(loaded.config().model_type == remat::hub::llama_family_of(config));
    CHECK(loaded.logits(ids).value().to_vector() == saved.logits(ids).value().to_vector());

    const remat::WeightStorage storage = storages[round % 3];
    remat::nn::Llama<float> quantized = remat::hub::load_llama<float>(dir);
    remat::nn::quantize_blocks(quantized, storage);
    { const remat::Tensor<float> freed({1024}); }  // something in the allocator's cache
    const remat::nn::Llama<float> direct =
        remat::hub::load_llama<float>(dir, {.projections = storage});
    INFO(remat::to_string(storage));
    CHECK(remat::memory::cached_bytes() == 0);  // the float matrices went back to the system
    CHECK(direct.logits(ids).value().to_vector() == quantized.logits(ids).value().to_vector());
    const auto a = direct.named_parameters(), b = quantized.named_parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].first == b[i].first);
    for (const auto& layer : direct.layers) {
      CHECK(layer.self_attn.q_proj.storage() == storage);
      CHECK(layer.mlp.down_proj.storage() == storage);
      CHECK(!layer.self_attn.q_proj.weight.defined());
    }
  }
}

TEST_CASE(
    "load_llama: extra or missing tensors, a vocab_size that is not the embedding's, an unknown "
    "model_type: IoErrors naming the file, the tensor or field and the value",
    "[nn][llama][io][errors][families]") {
  using Catch::Matchers::Contains;
  remat::Rng rng(6161);
  remat::nn::LlamaConfig config = ll_random_config(rng);
  config.tie_word_embeddings = true;
  const remat::nn::Llama<float> saved(config);
  const auto write = [&](const std::string& name, const remat::nn::LlamaConfig& c,
                         const std::vector<std::pair<std::string, remat::Tensor<float>>>& extra,
                         const std::string& drop = "") {
    const std::string dir = ll_dir(name);
    std::ofstream(dir + "/config.json") << remat::hub::llama_config_json(c);
    std::vector<remat::io::NamedTensor<float>> tensors;
    for (const auto& [n, p] : saved.named_parameters())
      if (n != drop) tensors.emplace_back(n, p.value());
    for (const auto& [n, t] : extra) tensors.emplace_back(n, t);
    remat::io::save_sharded(dir, tensors, 1u << 30, {{"format", "pt"}});
    return dir;
  };
  const auto error = [](const std::string& dir, remat::WeightStorage s) {
    return remat::test::error_message(
        [&] { remat::hub::load_llama<float>(dir, {.projections = s}); });
  };
  const remat::Tensor<float> embed = saved.embed_tokens.weight.value();
  for (const auto storage : {remat::WeightStorage::f32, remat::WeightStorage::nf4}) {
    // an extra tensor the model does not use
    const std::string extra =
        write("extra", config, {{"model.layers.0.mlp.experts.0.weight", embed}});
    CHECK_THAT(error(extra, storage), Contains("'model.layers.0.mlp.experts.0.weight'") &&
                                          Contains("model.safetensors") && Contains("not used"));
    // a tied model's lm_head.weight that differs from the embedding
    const std::string head =
        write("head", config, {{"lm_head.weight", remat::Tensor<float>::zeros(embed.shape())}});
    CHECK_THAT(error(head, storage), Contains("'lm_head.weight'") && Contains("ties"));
    // a missing projection
    const std::string missing =
        write("missing", config, {}, "model.layers.0.self_attn.k_proj.weight");
    CHECK_THAT(error(missing, storage),
               Contains("'model.layers.0.self_attn.k_proj.weight'") && Contains("does not hold"));
  }
  // known unused: rotary buffers, and a tied head equal to the embedding
  const std::string known =
      write("known", config,
            {{"model.layers.0.self_attn.rotary_emb.inv_freq", remat::Tensor<float>::ones({2})},
             {"lm_head.weight", embed.clone()}});
  CHECK_NOTHROW(remat::hub::load_llama<float>(known));
  // vocab_size in config.json not the embedding's rows
  remat::nn::LlamaConfig wrong_vocab = config;
  wrong_vocab.vocab_size += 3;
  const std::string vocab = write("vocab", wrong_vocab, {});
  CHECK_THAT(error(vocab, remat::WeightStorage::f32),
             Contains("config.json") &&
                 Contains("vocab_size = " + std::to_string(wrong_vocab.vocab_size)) &&
                 Contains("'model.embed_tokens.weight'") &&
                 Contains(std::to_string(config.vocab_size) + " rows"));
  // a wrong shape deeper in: the tensor, the file and both shapes
  remat::nn::LlamaConfig wider = config;
  wider.intermediate_size += 2;
  const std::string shape = write("shape", wider, {});
  for (const auto storage : {remat::WeightStorage::f32, remat::WeightStorage::nf4}) {
    CHECK_THAT(error(shape, storage),
               Contains("mlp.") && Contains("has shape") && Contains("but the model expects"));
  }
  // an unknown model_type in the folder's config
  const std::string gemma = write("gemma", config, {});
  std::ofstream(gemma + "/config.json") << R"({"model_type": "gemma2", "vocab_size": 10})";
  CHECK_THAT(error(gemma, remat::WeightStorage::f32),
             Contains(gemma + "/config.json") && Contains("'gemma2'") && Contains("supported"));
}
