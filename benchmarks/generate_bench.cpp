// Time per generated token with the KV cache (nn/generate.hpp) at two prompt lengths, and what a
// token costs without a cache (the full forward over the whole sequence, as sampling without a
// cache does), on a random Llama.
//
//   generate_bench [--hidden 512] [--layers 4] [--heads 8] [--kv-heads 2] [--mlp 1376]
//                  [--vocab 4096] [--short 32] [--long 512] [--new 64] [--repeat 5]
//                  [--storage f32|bf16|int8|nf4] [--threads 1]
//
// Prints one JSON object per prompt length: {"bench": "generate", "prompt": ..., "new_tokens":
// ..., "seconds_per_token": median over runs (decode steps after the first token),
// "prefill_seconds": ..., "no_cache_seconds_per_token": ...}, then {"bench": "generate_ratio",
// "long_over_short": ...}, the ratio of the two seconds_per_token medians.
#include "../examples/flags.hpp"
#include "bench_util.hpp"

#include <remat/nn/quantize_blocks.hpp>

namespace {

struct Result {
  double per_token, prefill, no_cache;
};

Result run(const remat::nn::Llama<float>& model, std::int64_t prompt, std::int64_t new_tokens,
           int repeat) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(prompt));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 7919) % std::size_t(model.config().vocab_size));
  std::vector<double> per_token, prefill;
  for (int r = 0; r < repeat + 1; ++r) {  // the first run warms up
    const remat::nn::Generated g = remat::nn::generate(model, ids, {.max_new_tokens = new_tokens});
    if (r == 0) continue;
    per_token.push_back(g.seconds_per_token());
    prefill.push_back(g.prefill_seconds);
  }
  // Without a cache, each token is a full forward over the sequence so far: timed at the
  // sequence's middle length.
  remat::Tensor<std::int32_t> seq(remat::Shape{1, prompt + new_tokens / 2});
  for (std::int64_t t = 0; t < seq.numel(); ++t) seq[t] = ids[std::size_t(t % prompt)];
  const double no_cache = bench::time_median(repeat, [&] {
    const remat::NoGradGuard no_grad;
    (void)model.logits(seq);
  });
  return {bench::median(per_token), bench::median(prefill), no_cache};
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
  double seconds[2] = {0, 0};
  int i = 0;
  for (std::int64_t prompt : {short_prompt, long_prompt}) {
    const Result r = run(model, prompt, new_tokens, repeat);
    seconds[i++] = r.per_token;
    std::printf(
        "{\"bench\": \"generate\", \"storage\": \"%s\", \"prompt\": %lld, \"new_tokens\": %lld, "
        "\"seconds_per_token\": %.6f, \"prefill_seconds\": %.6f, "
        "\"no_cache_seconds_per_token\": %.6f}\n",
        storage.c_str(), static_cast<long long>(prompt), static_cast<long long>(new_tokens),
        r.per_token, r.prefill, r.no_cache);
    std::fflush(stdout);
  }
  std::printf("{\"bench\": \"generate_ratio\", \"long_over_short\": %.3f}\n",
              seconds[1] / seconds[0]);
  return 0;
}
