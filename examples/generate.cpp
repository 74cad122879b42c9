// generate: continues a text with a Hugging Face model folder (config.json, safetensors,
// tokenizer.json), optionally with PEFT LoRA adapters, through nn::generate's KV cache.
//
//   generate --base DIR [--adapters DIR] --prompt TEXT --max-new-tokens N
//            [--temperature T [--top-k K] [--top-p P] [--seed S]] [--stop STR]...
//            [--storage f32|bf16|int8|nf4] [--threads N] [--verify] [--json]
//
// Prints the continuation (greedy unless a temperature is given). It stops after N tokens, at
// the tokenizer's end-of-sequence id (and generation_config.json's eos_token_id, when the folder
// has one), or once the continuation contains a --stop string. --storage reads the decoder
// layers' projections straight into that frozen storage (QLoRA's NF4, say). --verify re-runs the
// model's full forward (the training path, no cache) on the prompt and the continuation and checks
// that every greedy token is its argmax; a disagreement is an error. --json ends the output with
// one object: prompt_ids, new_ids, text, stop_reason, seconds_per_token (the steps after the first
// token), prefill_seconds, cache_bytes (and full_forward_agrees under --verify).
//
// A bad flag or value is one line on standard error and exit status 1; --help exits 0.
#include <remat/hub/tokenizer.hpp>
#include <remat/hub/peft.hpp>
#include <remat/io/json.hpp>
#include <remat/nn/generate.hpp>
#include <remat/hub/llama_load.hpp>
#include <remat/nn/lora.hpp>

#include "flags.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string base, adapters, prompt, storage = "f32";
  std::int64_t max_new_tokens = 0;
  std::optional<double> temperature, top_p;
  std::optional<std::int64_t> top_k;
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;
  int threads = 0;
  bool verify = false, json = false;
};

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "generate: %s\n", message.c_str());
  std::exit(1);
}

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app(
      "Continues a text with a Hugging Face model folder (and PEFT adapters), with a KV "
      "cache; greedy unless --temperature is given.");
  app.add_option("--base", o.base, "model folder: config.json, safetensors, tokenizer.json")
      ->required();
  app.add_option("--adapters", o.adapters,
                 "PEFT LoRA folder: adapter_config.json and adapter_model.safetensors");
  app.add_option("--prompt", o.prompt, "the text to continue")->required();
  app.add_option("--max-new-tokens", o.max_new_tokens, "at most this many new tokens (>= 1)")
      ->required();
  app.add_option("--temperature", o.temperature, "sample at this temperature (> 0); none: greedy");
  app.add_option("--top-k", o.top_k, "sample among the K most likely tokens (>= 1)");
  app.add_option("--top-p", o.top_p, "sample among the most likely tokens holding P, in (0, 1]");
  app.add_option("--seed", o.seed, "seed of the draws");
  app.add_option("--stop", o.stop, "stop once the continuation contains this text (repeatable)");
  app.add_option("--storage", o.storage, "frozen storage of the decoder layers' weights")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "worker threads (0: the library's default)")
      ->capture_default_str();
  app.add_flag("--verify", o.verify,
               "check every greedy token against the full forward's argmax (no cache)");
  app.add_flag("--json", o.json, "end with one JSON object (ids, text, seconds_per_token)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::exit(app.exit(e));
  } catch (const CLI::ParseError& e) {
    fail(std::string(e.what()) + " (see --help)");
  }
  if (o.max_new_tokens < 1)
    fail("--max-new-tokens must be >= 1, got " + std::to_string(o.max_new_tokens));
  if (o.temperature && !(std::isfinite(*o.temperature) && *o.temperature > 0))
    fail("--temperature must be a finite number > 0, got " + std::to_string(*o.temperature));
  if (!o.temperature && (o.top_k || o.top_p || o.seed))
    fail("--top-k, --top-p and --seed choose how to sample: they need --temperature");
  if (o.top_k && *o.top_k < 1) fail("--top-k must be >= 1, got " + std::to_string(*o.top_k));
  if (o.top_p && !(*o.top_p > 0 && *o.top_p <= 1))
    fail("--top-p must be in (0, 1], got " + std::to_string(*o.top_p));
  if (o.temperature && o.verify)
    fail("--verify checks greedy tokens: it cannot be used with --temperature");
  for (const std::string& s : o.stop)
    if (s.empty()) fail("--stop must not be empty");
  if (o.storage != "f32" && o.storage != "bf16" && o.storage != "int8" && o.storage != "nf4")
    fail("--storage must be f32, bf16, int8 or nf4, got '" + o.storage + "'");
  if (o.threads < 0) fail("--threads must be >= 0, got " + std::to_string(o.threads));
  return o;
}

// strictly (io/json.hpp): a regular file, no repeated key
nlohmann::json read_json(const std::string& path) {
  return remat::io::read_json_file(path, "generate");
}

/// Wraps the layers PEFT's adapter_config.json names (every field read or refused by
/// hub::read_lora_options) and loads adapter_model.safetensors.
remat::nn::lora::Adapters<float> load_adapters(remat::nn::Llama<float>& model,
                                               const std::string& dir) {
  // lora_dropout is read too: generate() runs the model in evaluation mode, where it is off
  remat::nn::lora::Adapters<float> adapters =
      remat::nn::lora::apply(model, remat::hub::read_lora_options(dir));
  remat::hub::load_adapters(adapters, dir);
  return adapters;
}

/// generation_config.json's eos_token_id (one id or a list), when the folder has the file.
std::vector<std::int32_t> generation_eos_ids(const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return {};
  const nlohmann::json c = read_json(path);
  std::vector<std::int32_t> out;
  if (!c.is_object() || !c.contains("eos_token_id") || c["eos_token_id"].is_null()) return out;
  const nlohmann::json& e = c["eos_token_id"];
  for (const nlohmann::json& id : e.is_array() ? e : nlohmann::json::array({e})) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0)
      throw remat::IoError(
          remat::detail::cat(path, ": field 'eos_token_id' holds ", id.dump(), ", not a token id"));
    out.push_back(id.get<std::int32_t>());
  }
  return out;
}

}  // namespace

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.threads > 0) remat::set_num_threads(o.threads);
  const remat::hub::Tokenizer tokenizer = remat::hub::Tokenizer::from_folder(o.base);
  // the decoder's projections read straight into their storage, one matrix at a time
  const remat::WeightStorage storage = o.storage == "bf16"   ? remat::WeightStorage::bf16
                                       : o.storage == "int8" ? remat::WeightStorage::int8
                                       : o.storage == "nf4"  ? remat::WeightStorage::nf4
                                                             : remat::WeightStorage::f32;
  remat::nn::Llama<float> model = remat::hub::load_llama<float>(o.base, {.projections = storage});
  std::optional<remat::nn::lora::Adapters<float>> adapters;
  if (!o.adapters.empty()) adapters.emplace(load_adapters(model, o.adapters));
  model.eval();

  const std::vector<std::int32_t> prompt = tokenizer.encode(o.prompt);
  if (prompt.empty()) fail("--prompt encodes to no tokens");
  remat::nn::GenerateOptions g{.max_new_tokens = o.max_new_tokens};
  if (o.temperature) {
    g.sampling = {.temperature = *o.temperature,
                  .top_k = o.top_k.value_or(0),
                  .top_p = o.top_p.value_or(1.0),
                  .seed = o.seed.value_or(0)};
  }
  g.eos_ids = generation_eos_ids(o.base);
  if (const std::optional<std::int32_t> eos = tokenizer.eos_id()) g.eos_ids.push_back(*eos);
  g.stop = o.stop;
  g.decode = [&](const std::vector<std::int32_t>& ids) { return tokenizer.decode(ids); };
  const remat::nn::Generated out = remat::nn::generate(model, prompt, g);
  const std::string text = tokenizer.decode(out.ids);
  std::printf("%s\n", text.c_str());

  std::optional<bool> agrees;
  if (o.verify) {
    std::vector<std::int32_t> seq = prompt;
    agrees = true;
    for (const std::int32_t id : out.ids) {
      const remat::NoGradGuard no_grad;
      remat::Tensor<std::int32_t> ids(remat::Shape{1, static_cast<std::int64_t>(seq.size())});
      std::copy(seq.begin(), seq.end(), ids.data());
      const remat::Tensor<float> logits = model.logits(ids).value();
      const std::int64_t vocab = logits.dim(-1);
      const std::int32_t best = remat::nn::argmax(logits.data() + (logits.numel() - vocab), vocab);
      if (best != id) {
        agrees = false;
        std::fprintf(stderr,
                     "generate: --verify: token %zu is %d, the full forward's argmax is %d\n",
                     seq.size() - prompt.size(), id, best);
        break;
      }
      seq.push_back(id);
    }
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["prompt_ids"] = prompt;
    j["new_ids"] = out.ids;
    j["text"] = text;
    j["stop_reason"] = remat::nn::to_string(out.reason);
    j["seconds_per_token"] = out.seconds_per_token();
    j["prefill_seconds"] = out.prefill_seconds;
    j["cache_bytes"] = out.cache_bytes;
    if (agrees) j["full_forward_agrees"] = *agrees;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return agrees.value_or(true) ? 0 : 1;
}

// One error boundary (examples/flags.hpp): any failure is one line and exit status 1.
int main(int argc, char** argv) {
  return flags::run_main("generate", [&] { return run(argc, argv); });
}
