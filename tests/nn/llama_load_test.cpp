// nn::load_llama: a Llama saved as a Hugging Face folder (random configs, one file or random
// shards, F32 or BF16) loads back to the same parameters and logits; mismatched folders are
// IoErrors that leave a model untouched.
#include <catch2/catch.hpp>

#include <remat/nn/llama_load.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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
