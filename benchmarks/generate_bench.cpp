// Time per generated token with the KV cache (nn/generate.hpp) at two prompt lengths, and what a
// token costs without a cache (the full forward over the whole sequence, as sampling without a
// cache does), on a random Llama.
//
//   generate_bench [--hidden 512] [--layers 4] [--heads 8] [--kv-heads 2] [--mlp 1376]
//                  [--vocab 4096] [--short 32] [--long 512] [--new 64] [--repeat 5]
//                  [--storage f32|bf16|int8|nf4] [--threads 1]
//
// Prints one JSON object per prompt length: {"bench": "generate", "prompt": ..., "new_tokens":
// ..., "seconds_per_token": median over runs (decode steps after the first token, wall time),
// "cpu_seconds_per_token": the same steps in processor time,
// "prefill_seconds": ..., "no_cache_seconds_per_token": ...}, then {"bench": "generate_ratio",
// "long_over_short": ..., "rounds": [...]}: the median over rounds (each runs both prompts) of
// the long prompt's seconds per token over the short one's, and "cpu_long_over_short", the
// same in processor time.
#include "../examples/flags.hpp"
#include "bench_util.hpp"

#include <ctime>

#include <remat/nn/quantize_blocks.hpp>

namespace {

std::vector<std::int32_t> prompt_of(const remat::nn::Llama<float>& model, std::int64_t length) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(length));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 7919) % std::size_t(model.config().vocab_size));
  return ids;
}

/// Seconds per token without a cache: each token is then a full forward over the sequence so
/// far, timed at the sequence's middle length.
double no_cache_seconds(const remat::nn::Llama<float>& model, std::int64_t prompt,
                        std::int64_t new_tokens, int repeat) {
  const std::vector<std::int32_t> ids = prompt_of(model, prompt);
  remat::Tensor<std::int32_t> seq(remat::Shape{1, prompt + new_tokens / 2});
  for (std::int64_t t = 0; t < seq.numel(); ++t) seq[t] = ids[std::size_t(t % prompt)];
  return bench::time_median(repeat, [&] {
    const remat::NoGradGuard no_grad;
    (void)model.logits(seq);
  });
}

/// Processor seconds per decode step (std::clock: this process, whatever else the machine
/// runs), over the same steps generate() times: the prefill, then new_tokens - 1 greedy steps.
double cpu_seconds_per_step(const remat::nn::Llama<float>& model, std::int64_t prompt,
                            std::int64_t new_tokens) {
  const std::vector<std::int32_t> ids = prompt_of(model, prompt);
  remat::nn::KvCache<float> cache = remat::nn::make_kv_cache(model, 1, prompt + new_tokens);
  remat::Tensor<std::int32_t> in(remat::Shape{1, prompt});
  std::copy(ids.begin(), ids.end(), in.data());
  remat::Tensor<float> logits = remat::nn::forward_cached(model, in, cache);
  const std::clock_t start = std::clock();
  for (std::int64_t s = 1; s < new_tokens; ++s) {
    remat::Tensor<std::int32_t> next(remat::Shape{1, 1});
    next[0] = remat::nn::argmax(logits.data(), logits.dim(-1));
    logits = remat::nn::forward_cached(model, next, cache);
  }
  return double(std::clock() - start) / CLOCKS_PER_SEC / double(new_tokens - 1);
}

}  // namespace

int main(int argc, char** argv) {
  remat::nn::LlamaConfig c;
  c.hidden_size = 512;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.intermediate_size = 1376;
  c.vocab_size = 4096;
  std::int64_t short_prompt = 32, long_prompt = 512, new_tokens = 64;
  int repeat = 5, threads = 1;
  std::string storage = "f32";
  CLI::App app(
      "Seconds per generated token with the KV cache at two prompt lengths, and without "
      "a cache, on a random Llama.");
  app.add_option("--hidden", c.hidden_size, "hidden size")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--layers", c.num_hidden_layers, "decoder layers")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--heads", c.num_attention_heads, "attention heads")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--kv-heads", c.num_key_value_heads, "key/value heads")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--mlp", c.intermediate_size, "MLP width")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--vocab", c.vocab_size, "vocabulary")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--short", short_prompt, "short prompt length")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--long", long_prompt, "long prompt length")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--new", new_tokens, "tokens generated per run")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--repeat", repeat, "runs per prompt length (medians)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--storage", storage, "frozen weight storage of the decoder layers")
      ->check(CLI::IsMember({"f32", "bf16", "int8", "nf4"}))
      ->capture_default_str();
  app.add_option("--threads", threads, "worker threads")
      ->check(flags::positive)
      ->capture_default_str();
  flags::parse(app, argc, argv);
  remat::set_num_threads(threads);
  c.max_position_embeddings = std::max(short_prompt, long_prompt) + new_tokens;
  remat::nn::Llama<float> model(c);
  model.eval();
  if (storage != "f32") {
    remat::nn::quantize_blocks(model, storage == "bf16"   ? remat::WeightStorage::bf16
                                      : storage == "int8" ? remat::WeightStorage::int8
                                                          : remat::WeightStorage::nf4);
  }
  // Rounds alternate the two prompt lengths, so that a change in the machine's load (other
  // processes) reaches both alike; the ratio is taken within each round, then its median.
  const std::int64_t prompts[2] = {short_prompt, long_prompt};
  std::vector<double> per_token[2], prefill[2], cpu[2], ratios, cpu_ratios;
  for (int r = 0; r < repeat + 1; ++r) {  // round 0 warms up
    double round[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      const remat::nn::Generated g =
          remat::nn::generate(model, prompt_of(model, prompts[i]), {.max_new_tokens = new_tokens});
      round[i] = g.seconds_per_token();
      if (r > 0) {
        per_token[i].push_back(g.seconds_per_token());
        prefill[i].push_back(g.prefill_seconds);
      }
    }
    if (r > 0) ratios.push_back(round[1] / round[0]);
    double cpu_round[2] = {0, 0};
    for (int i = 0; i < 2; ++i) cpu_round[i] = cpu_seconds_per_step(model, prompts[i], new_tokens);
    if (r > 0) {
      for (int i = 0; i < 2; ++i) cpu[i].push_back(cpu_round[i]);
      cpu_ratios.push_back(cpu_round[1] / cpu_round[0]);
    }
  }
  for (int i = 0; i < 2; ++i) {
    std::printf(
        "{\"bench\": \"generate\", \"storage\": \"%s\", \"prompt\": %lld, \"new_tokens\": %lld, "
        "\"seconds_per_token\": %.6f, \"cpu_seconds_per_token\": %.6f, \"prefill_seconds\": %.6f, "
        "\"no_cache_seconds_per_token\": %.6f}\n",
        storage.c_str(), static_cast<long long>(prompts[i]), static_cast<long long>(new_tokens),
        bench::median(per_token[i]), bench::median(cpu[i]), bench::median(prefill[i]),
        no_cache_seconds(model, prompts[i], new_tokens, repeat));
  }
  std::printf("{\"bench\": \"generate_ratio\", \"long_over_short\": %.3f, \"rounds\": [",
              bench::median(ratios));
  for (std::size_t i = 0; i < ratios.size(); ++i) std::printf("%s%.3f", i ? ", " : "", ratios[i]);
  std::printf("], \"cpu_long_over_short\": %.3f}\n", bench::median(cpu_ratios));
  return 0;
}
