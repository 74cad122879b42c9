// generate: continues a text with a Hugging Face model folder (config.json, safetensors,
// tokenizer.json), optionally with PEFT LoRA adapters, through nn::generate's KV cache.
//
//   generate --base DIR [--adapters DIR] --prompt TEXT [--chat [--system TEXT] [--no-thinking]]
//            --max-new-tokens N [--greedy | --temperature T [--top-k K] [--top-p P]] [--seed S]
//            [--repetition-penalty R] [--stop STR]... [--storage f32|bf16|int8|nf4]
//            [--threads N] [--verify] [--json]
//
// As transformers' model.generate() with the folder's generation config: the prompt is
// tokenizer(text)'s ids (hub::Tokenizer::encode_for_model), or with --chat, the text as a user
// turn (after --system's) rendered by the folder's chat template with its generation prompt, the
// ids apply_chat_template(messages, add_generation_prompt=True) gives (--no-thinking: Qwen3's
// enable_thinking=False); the end-of-sequence ids are
// generation_config.json's eos_token_id, or config.json's when the folder has no
// generation_config.json (the tokenizer's eos is not one, as in transformers); with no sampling
// flag, generation_config.json's do_sample, temperature, top_k (50 when absent), top_p and
// repetition_penalty choose the tokens (greedy without the file). Flags override the file:
// --greedy, or --temperature with --top-k (50 unless given; 0: all) and --top-p, replace its
// sampling, --repetition-penalty its penalty. A field of the file that would change the tokens
// otherwise (min_p, num_beams > 1, no_repeat_ngram_size, ...) and any field remat does not know
// are refused by name, unless the flags override the choice they make.
//
// It stops after N tokens, at an end-of-sequence id, or at a --stop string, as transformers'
// StopStringCriteria (nn/generate.hpp: matched on the text of the prompt and the new tokens,
// special tokens kept, ending inside the last token). It prints the new tokens' text,
// tokenizer.decode(new_ids, skip_special_tokens=True), as a model card's
// decode(output[len(input):]) and TextStreamer print it (the text-generation pipeline instead
// cuts decode(prompt + new) after the prompt's text); an id past the tokenizer's vocabulary (a
// padded head's) decodes to nothing there, and here. --storage reads the decoder layers'
// projections straight into that frozen storage (QLoRA's NF4, say). --verify re-runs the model's
// full forward (the training path, no cache) on the prompt and the continuation and checks that
// every greedy token is its argmax (after the repetition penalty); a disagreement is an error.
// --json ends the output with one object: prompt_ids, new_ids, text, stop_reason, eos_ids,
// sampling (null when greedy), repetition_penalty, seconds_per_token (the steps after the first
// token), prefill_seconds, cache_bytes (and full_forward_agrees under --verify).
//
// A bad flag or value is one line on standard error and exit status 1; --help exits 0.
#include <remat/hub/chat_template.hpp>
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
  std::optional<std::string> system;
  std::int64_t max_new_tokens = 0;
  std::optional<double> temperature, top_p, repetition_penalty;
  std::optional<std::int64_t> top_k;
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;
  int threads = 0;
  bool chat = false, no_thinking = false, greedy = false, verify = false, json = false;
};

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "generate: %s\n", message.c_str());
  std::exit(1);
}

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app(
      "Continues a text with a Hugging Face model folder (and PEFT adapters), with a KV "
      "cache, as transformers' generate() with the folder's generation_config.json; greedy "
      "without that file or a sampling flag.");
  app.add_option("--base", o.base, "model folder: config.json, safetensors, tokenizer.json")
      ->required();
  app.add_option("--adapters", o.adapters,
                 "PEFT LoRA folder: adapter_config.json and adapter_model.safetensors");
  app.add_option("--prompt", o.prompt, "the text to continue")->required();
  app.add_flag("--chat", o.chat,
               "the prompt is a user turn: render it with the folder's chat template and its "
               "generation prompt");
  app.add_option("--system", o.system, "with --chat: a system turn before the user's");
  app.add_flag(
      "--no-thinking", o.no_thinking,
      "with --chat and a Qwen3 template: answer without reasoning (enable_thinking=False)");
  app.add_option("--max-new-tokens", o.max_new_tokens, "at most this many new tokens (>= 1)")
      ->required();
  app.add_flag("--greedy", o.greedy,
               "choose the most likely token, whatever generation_config.json says");
  app.add_option("--temperature", o.temperature,
                 "sample at this temperature (> 0), instead of generation_config.json's sampling");
  app.add_option("--top-k", o.top_k,
                 "with --temperature: sample among the K most likely tokens (default 50, "
                 "transformers' default; 0: all)");
  app.add_option("--top-p", o.top_p,
                 "with --temperature: sample among the most likely tokens holding P, in (0, 1]");
  app.add_option("--seed", o.seed, "seed of the draws (an integer in [0, 2^64 - 1])")
      ->check(flags::count);
  app.add_option("--repetition-penalty", o.repetition_penalty,
                 "divide the logits of the tokens seen so far by this (> 0; 1: none), "
                 "instead of generation_config.json's repetition_penalty");
  app.add_option("--stop", o.stop,
                 "stop once this text ends inside a new token's text, prompt included "
                 "(repeatable)");
  app.add_option("--storage", o.storage, "frozen storage of the decoder layers' weights")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "worker threads (0: the library's default)")
      ->check(flags::thread_count(true))
      ->capture_default_str();
  app.add_flag("--verify", o.verify,
               "check every greedy token against the full forward's argmax (no cache)");
  app.add_flag("--json", o.json,
               "end with one JSON object: prompt_ids, new_ids, text, stop_reason, eos_ids, "
               "sampling, repetition_penalty, seconds_per_token, prefill_seconds, cache_bytes "
               "(and full_forward_agrees with --verify)");
  flags::parse(app, argc, argv);
  if (o.max_new_tokens < 1)
    fail("--max-new-tokens must be >= 1, got " + std::to_string(o.max_new_tokens));
  if (o.temperature && !(std::isfinite(*o.temperature) && *o.temperature > 0))
    fail("--temperature must be a finite number > 0, got " + std::to_string(*o.temperature));
  if (!o.temperature && (o.top_k || o.top_p))
    fail("--top-k and --top-p choose how --temperature samples: they need --temperature");
  if (o.greedy && (o.temperature || o.seed))
    fail("--greedy draws nothing: it cannot be used with --temperature or --seed");
  if (o.top_k && *o.top_k < 0) fail("--top-k must be >= 0, got " + std::to_string(*o.top_k));
  if (o.top_p && !(*o.top_p > 0 && *o.top_p <= 1))
    fail("--top-p must be in (0, 1], got " + std::to_string(*o.top_p));
  if (o.repetition_penalty && !(std::isfinite(*o.repetition_penalty) && *o.repetition_penalty > 0))
    fail("--repetition-penalty must be a finite number > 0, got " +
         std::to_string(*o.repetition_penalty));
  if (o.temperature && o.verify)
    fail("--verify checks greedy tokens: it cannot be used with --temperature");
  for (const std::string& s : o.stop)
    if (s.empty()) fail("--stop must not be empty");
  if (o.system && !o.chat) fail("--system is a chat turn: it needs --chat");
  if (o.no_thinking && !o.chat) fail("--no-thinking renders a chat template: it needs --chat");
  if (o.storage != "f32" && o.storage != "bf16" && o.storage != "int8" && o.storage != "nf4")
    fail("--storage must be f32, bf16, int8 or nf4, got '" + o.storage + "'");
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

[[noreturn]] void refuse_field(const std::string& path, const std::string& key,
                               const nlohmann::json& value, const std::string& why) {
  throw remat::IoError(
      remat::detail::cat(path, ": field '", key, "' is ", value.dump(), ": ", why));
}

/// An eos_token_id value (null, one id or a list) as token ids. An id must be an int32: a larger
/// one (or a negative one) would wrap to another token.
std::vector<std::int32_t> token_ids(const nlohmann::json& value, const std::string& path,
                                    const char* key) {
  std::vector<std::int32_t> out;
  if (value.is_null()) return out;
  for (const nlohmann::json& id : value.is_array() ? value : nlohmann::json::array({value})) {
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() > 0x7fffffffu)
      refuse_field(
          path, key, value,
          remat::detail::cat(id.dump(), " is not a token id (an integer in [0, 2^31 - 1])"));
    out.push_back(static_cast<std::int32_t>(id.get<std::uint64_t>()));
  }
  return out;
}

/// config.json's eos_token_id as transformers' config class reads it: the key's value, else the
/// class's default, 2 for LlamaConfig and MistralConfig and none for Qwen2Config and Qwen3Config.
std::vector<std::int32_t> config_eos_ids(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const nlohmann::json c = read_json(path);
  if (c.contains("eos_token_id")) return token_ids(c["eos_token_id"], path, "eos_token_id");
  remat::detail::ConfigFields fields(c, path);
  const std::string family = remat::detail::read_model_type(fields);
  return family == "llama" || family == "mistral" ? std::vector<std::int32_t>{2}
                                                  : std::vector<std::int32_t>{};
}

/// generation_config.json's fields, by what remat does with them. `defaults` lists the values
/// (null always among them) with which a field changes nothing.
enum class FieldUse {
  harmless,  ///< never changes which token is chosen
  strategy,  ///< a search other than greedy or sampling: refused unless --greedy/--temperature
  warper,    ///< a sampling warper remat lacks: refused when the file's sampling is followed
  refused,   ///< a logits processor or stopping rule remat lacks: refused unless at its default
};
struct GenerationField {
  const char* name;
  FieldUse use;
  const char* defaults;  // a JSON array
  const char* why;
};
// transformers' GenerationConfig fields (4.4x to 5), read: do_sample, temperature, top_k, top_p,
// repetition_penalty and eos_token_id (generation_settings()).
constexpr GenerationField kGenerationFields[] = {
    {"transformers_version", FieldUse::harmless, "[]", "the writer's version"},
    {"_from_model_config", FieldUse::harmless, "[]", "where transformers took the values"},
    {"pad_token_id", FieldUse::harmless, "[]", "one sequence has no padding"},
    {"bos_token_id", FieldUse::harmless, "[]", "the tokenizer adds the prompt's bos"},
    {"decoder_start_token_id", FieldUse::harmless, "[]", "encoder-decoder models only"},
    {"max_length", FieldUse::harmless, "[]", "--max-new-tokens, required, sets the length"},
    {"max_new_tokens", FieldUse::harmless, "[]", "--max-new-tokens, required, sets the length"},
    {"use_cache", FieldUse::harmless, "[]", "remat always uses its KV cache"},
    // the caches that keep keys and values as computed (transformers' ALL_CACHE_IMPLEMENTATIONS
    // but "quantized"); cache_config sets up only a quantized or static one
    {"cache_implementation", FieldUse::refused,
     R"(["dynamic", "dynamic_full", "static", "offloaded", "offloaded_static", "sliding_window",
        "hybrid", "hybrid_chunked", "offloaded_hybrid", "offloaded_hybrid_chunked"])",
     "remat's KV cache keeps keys and values as computed: a quantized cache (or one transformers "
     "does not know) gives other logits"},
    {"cache_config", FieldUse::harmless, "[]", "the settings of a static or quantized cache"},
    {"return_legacy_cache", FieldUse::harmless, "[]", "what transformers returns"},
    {"prefill_chunk_size", FieldUse::harmless, "[]", "how transformers runs the prefill"},
    {"compile_config", FieldUse::harmless, "[]", "torch.compile's settings"},
    {"disable_compile", FieldUse::harmless, "[]", "torch.compile's settings"},
    {"output_attentions", FieldUse::harmless, "[]", "what transformers returns"},
    {"output_hidden_states", FieldUse::harmless, "[]", "what transformers returns"},
    {"output_scores", FieldUse::harmless, "[]", "what transformers returns"},
    {"output_logits", FieldUse::harmless, "[]", "what transformers returns"},
    {"return_dict_in_generate", FieldUse::harmless, "[]", "what transformers returns"},
    {"renormalize_logits", FieldUse::harmless, "[]", "a log-softmax: the same argmax and draw"},
    {"low_memory", FieldUse::harmless, "[]", "beam and contrastive search only"},
    {"early_stopping", FieldUse::harmless, "[]", "beam search only"},
    {"length_penalty", FieldUse::harmless, "[]", "beam search only"},
    {"diversity_penalty", FieldUse::harmless, "[]", "group beam search only"},
    {"is_assistant", FieldUse::harmless, "[]", "assisted generation only"},
    {"num_assistant_tokens", FieldUse::harmless, "[]", "assisted generation only"},
    {"num_assistant_tokens_schedule", FieldUse::harmless, "[]", "assisted generation only"},
    {"assistant_confidence_threshold", FieldUse::harmless, "[]", "assisted generation only"},
    {"assistant_lookbehind", FieldUse::harmless, "[]", "assisted generation only"},
    {"target_lookbehind", FieldUse::harmless, "[]", "assisted generation only"},
    {"max_matching_ngram_size", FieldUse::harmless, "[]", "prompt lookup only"},
    {"num_beams", FieldUse::strategy, "[1]", "beam search is not implemented"},
    {"num_beam_groups", FieldUse::strategy, "[1]", "group beam search is not implemented"},
    {"penalty_alpha", FieldUse::strategy, "[0]", "contrastive search is not implemented"},
    {"dola_layers", FieldUse::strategy, "[]", "DoLa decoding is not implemented"},
    {"prompt_lookup_num_tokens", FieldUse::strategy, "[]", "prompt lookup is not implemented"},
    {"assistant_early_exit", FieldUse::strategy, "[]", "assisted generation is not implemented"},
    {"min_p", FieldUse::warper, "[0]", "min-p sampling is not implemented"},
    {"typical_p", FieldUse::warper, "[1]", "typical sampling is not implemented"},
    {"epsilon_cutoff", FieldUse::warper, "[0]", "epsilon sampling is not implemented"},
    {"eta_cutoff", FieldUse::warper, "[0]", "eta sampling is not implemented"},
    {"min_length", FieldUse::refused, "[0]", "a minimum length is not implemented"},
    {"min_new_tokens", FieldUse::refused, "[0]", "a minimum length is not implemented"},
    {"max_time", FieldUse::refused, "[]", "a time limit is not implemented"},
    {"stop_strings", FieldUse::refused, "[]", "give them as --stop"},
    {"no_repeat_ngram_size", FieldUse::refused, "[0]", "not implemented"},
    {"encoder_no_repeat_ngram_size", FieldUse::refused, "[0]", "not implemented"},
    {"encoder_repetition_penalty", FieldUse::refused, "[1]", "not implemented"},
    {"bad_words_ids", FieldUse::refused, "[]", "not implemented"},
    {"force_words_ids", FieldUse::refused, "[]", "not implemented"},
    {"constraints", FieldUse::refused, "[]", "not implemented"},
    {"forced_bos_token_id", FieldUse::refused, "[]", "not implemented"},
    {"forced_eos_token_id", FieldUse::refused, "[]", "not implemented"},
    {"forced_decoder_ids", FieldUse::refused, "[]", "not implemented"},
    {"suppress_tokens", FieldUse::refused, "[]", "not implemented"},
    {"begin_suppress_tokens", FieldUse::refused, "[]", "not implemented"},
    {"sequence_bias", FieldUse::refused, "[]", "not implemented"},
    {"exponential_decay_length_penalty", FieldUse::refused, "[]", "not implemented"},
    {"guidance_scale", FieldUse::refused, "[1]", "classifier-free guidance is not implemented"},
    {"remove_invalid_values", FieldUse::refused, "[false]", "not implemented"},
    {"token_healing", FieldUse::refused, "[false]", "not implemented"},
    {"watermarking_config", FieldUse::refused, "[]", "not implemented"},
    {"num_return_sequences", FieldUse::refused, "[1]", "remat returns one sequence"},
};
constexpr const char* kReadGenerationFields[] = {"do_sample", "temperature",        "top_k",
                                                 "top_p",     "repetition_penalty", "eos_token_id"};

/// Whether a value changes nothing: null or one of `defaults` (1 and 1.0 alike).
bool is_default(const nlohmann::json& value, const char* defaults) {
  if (value.is_null()) return true;
  for (const nlohmann::json& d : nlohmann::json::parse(defaults)) {
    if (value == d) return true;
  }
  return false;
}

/// Throws on a field of generation_config.json that would choose other tokens than remat does:
/// an unknown one, or one not at its default, unless the flags override its choice (a strategy
/// by --greedy or --temperature; a sampling warper by those, or when the file does not sample).
void check_generation_fields(const nlohmann::json& c, const std::string& path, const Options& o,
                             bool file_samples) {
  const bool flags_choose = o.greedy || o.temperature.has_value();
  for (const auto& [key, value] : c.items()) {
    if (std::find_if(std::begin(kReadGenerationFields), std::end(kReadGenerationFields),
                     [&](const char* k) { return key == k; }) != std::end(kReadGenerationFields))
      continue;
    const GenerationField* f = nullptr;
    for (const GenerationField& g : kGenerationFields)
      if (key == g.name) f = &g;
    if (f == nullptr)
      refuse_field(path, key, value,
                   "remat does not know this field, and refuses what it does not account for");
    if (f->use == FieldUse::harmless || is_default(value, f->defaults)) continue;
    if (f->use == FieldUse::strategy && flags_choose) continue;
    if (f->use == FieldUse::warper && (flags_choose || !file_samples)) continue;
    const char* overrides =
        f->use == FieldUse::refused ? "" : " (--greedy or --temperature overrides it)";
    refuse_field(path, key, value, remat::detail::cat(f->why, overrides));
  }
}

/// How the tokens are chosen and when generation ends, from the flags and the folder's files.
struct GenerationSettings {
  std::optional<remat::nn::SamplingOptions> sampling;  ///< none: greedy
  double repetition_penalty = 1.0;
  std::vector<std::int32_t> eos_ids;
};

/// A number field of generation_config.json (null or absent: `fallback`).
double number_field(const nlohmann::json& c, const std::string& path, const char* key,
                    double fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_number()) refuse_field(path, key, c[key], "expected a number");
  return c[key].get<double>();
}

/// The file's sampling, as transformers' warpers read it: temperature (1 when unset), top_k (50
/// when absent, none when 0), top_p (1 when unset). A null top_k is refused: transformers v4
/// reads it as none, v5 as 50.
remat::nn::SamplingOptions file_sampling(const nlohmann::json& c, const std::string& path) {
  remat::nn::SamplingOptions s;
  s.temperature = number_field(c, path, "temperature", 1.0);
  if (!(std::isfinite(s.temperature) && s.temperature > 0))
    refuse_field(path, "temperature", c["temperature"], "sampling needs a temperature > 0");
  s.top_k = 50;
  if (c.contains("top_k")) {
    const nlohmann::json& k = c["top_k"];
    if (k.is_null()) {
      refuse_field(path, "top_k", k,
                   "transformers v4 samples from every token, v5 from the 50 likeliest; give 0 "
                   "or 50, or choose with --temperature and --top-k");
    }
    if (!(k.is_number_integer() && k.get<std::int64_t>() >= 0))
      refuse_field(path, "top_k", k, "expected an integer >= 0");
    s.top_k = k.get<std::int64_t>();
  }
  s.top_p = number_field(c, path, "top_p", 1.0);
  if (!(s.top_p > 0 && s.top_p <= 1))
    refuse_field(path, "top_p", c["top_p"], "expected a number in (0, 1]");
  return s;
}

/// The flags' choices over generation_config.json's (or config.json's eos ids without it).
GenerationSettings generation_settings(const Options& o) {
  GenerationSettings g;
  const std::string path = o.base + "/generation_config.json";
  nlohmann::json c = nlohmann::json::object();
  if (std::filesystem::exists(path)) {
    c = read_json(path);
    if (!c.is_object()) throw remat::IoError(path + ": expected a JSON object");
    g.eos_ids = c.contains("eos_token_id") ? token_ids(c["eos_token_id"], path, "eos_token_id")
                                           : std::vector<std::int32_t>{};
  } else {
    // transformers then builds the generation config from config.json
    g.eos_ids = config_eos_ids(o.base);
  }
  const nlohmann::json do_sample = c.value("do_sample", nlohmann::json());
  if (!do_sample.is_null() && !do_sample.is_boolean())
    refuse_field(path, "do_sample", do_sample, "expected true or false");
  const bool file_samples = do_sample.is_boolean() && do_sample.get<bool>();
  check_generation_fields(c, path, o, file_samples);
  if (o.temperature) {
    g.sampling = remat::nn::SamplingOptions{.temperature = *o.temperature,
                                            .top_k = o.top_k.value_or(50),
                                            .top_p = o.top_p.value_or(1.0)};
  } else if (!o.greedy && file_samples) {
    g.sampling = file_sampling(c, path);
  }
  if (g.sampling) g.sampling->seed = o.seed.value_or(0);
  g.repetition_penalty = number_field(c, path, "repetition_penalty", 1.0);
  if (!(std::isfinite(g.repetition_penalty) && g.repetition_penalty > 0))
    refuse_field(path, "repetition_penalty", c["repetition_penalty"], "expected a number > 0");
  if (o.repetition_penalty) g.repetition_penalty = *o.repetition_penalty;
  return g;
}

/// The options' sampling as JSON (null: greedy).
nlohmann::ordered_json sampling_json(const std::optional<remat::nn::SamplingOptions>& s) {
  if (!s) return nullptr;
  return {
      {"temperature", s->temperature}, {"top_k", s->top_k}, {"top_p", s->top_p}, {"seed", s->seed}};
}

// The ids the tokenizer has a token for: a model's vocabulary is often padded past its
// tokenizer's (Qwen2.5: 151,936 rows, 151,665 tokens), a sampled id may fall there, and
// tokenizers' decode leaves such ids out (remat's refuses them: an id a user wrote is a mistake).
std::vector<std::int32_t> token_ids_only(const remat::hub::Tokenizer& tokenizer,
                                         std::vector<std::int32_t> ids) {
  std::erase_if(ids, [&](std::int32_t id) { return !tokenizer.id_to_token(id); });
  return ids;
}

/// Whether every greedy token of `ids` is the full forward's argmax (no cache) after the
/// repetition penalty; says which one is not on standard error.
bool full_forward_agrees(const remat::nn::Llama<float>& model,
                         const std::vector<std::int32_t>& prompt,
                         const std::vector<std::int32_t>& ids, double penalty) {
  std::vector<std::int32_t> seq = prompt;
  for (const std::int32_t id : ids) {
    const remat::NoGradGuard no_grad;
    remat::Tensor<std::int32_t> in(remat::Shape{1, static_cast<std::int64_t>(seq.size())});
    std::copy(seq.begin(), seq.end(), in.data());
    const remat::Tensor<float> logits = model.logits(in).value();
    const std::int64_t vocab = logits.dim(-1);
    std::vector<float> last(logits.data() + (logits.numel() - vocab),
                            logits.data() + logits.numel());
    remat::nn::apply_repetition_penalty(last.data(), vocab, seq, penalty);
    const std::int32_t best = remat::nn::argmax(last.data(), vocab);
    if (best != id) {
      std::fprintf(stderr, "generate: --verify: token %zu is %d, the full forward's argmax is %d\n",
                   seq.size() - prompt.size(), id, best);
      return false;
    }
    seq.push_back(id);
  }
  return true;
}

/// --chat: the prompt as a user turn (after --system's) rendered by the folder's chat template
/// with its generation prompt, and encoded as apply_chat_template(..., tokenize=True) encodes it:
/// without the special tokens the tokenizer adds, since the template writes them.
std::vector<std::int32_t> chat_prompt_ids(const remat::hub::Tokenizer& tokenizer,
                                          const Options& o) {
  const remat::hub::TokenizerConfig& c = tokenizer.config();
  if (!c.chat_template)
    fail("--chat: " + o.base +
         " has no chat template (tokenizer_config.json's chat_template, or chat_template.jinja)");
  remat::hub::ChatTemplate t;
  try {
    t = remat::hub::recognise_chat_template(*c.chat_template, c.bos_token.value_or(""),
                                            c.eos_token.value_or(""));
  } catch (const remat::hub::ChatTemplateError& e) {
    fail(std::string("--chat: ") + e.what());
  }
  // the flags the template cannot take, named before render_generation_prompt would
  if (o.no_thinking && !remat::hub::reads_enable_thinking(t))
    fail("--no-thinking: the chat template of " + o.base + " (" + t.name +
         ") does not read enable_thinking; only Qwen3's do");
  if (o.system && t.family == remat::hub::ChatFamily::mistral)
    fail("--system: the chat template of " + o.base + " (" + t.name +
         ") accepts no system message");
  remat::hub::Conversation conversation{.source = "--prompt"};
  if (o.system) conversation.messages.push_back({remat::hub::Role::system, *o.system});
  conversation.messages.push_back({remat::hub::Role::user, o.prompt});
  return tokenizer.encode(
      remat::hub::render_generation_prompt(t, conversation, {.enable_thinking = !o.no_thinking}),
      false);
}

}  // namespace

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.threads > 0) remat::set_num_threads(o.threads);
  const remat::hub::Tokenizer tokenizer = remat::hub::Tokenizer::from_folder(o.base);
  const GenerationSettings settings = generation_settings(o);
  if (o.seed && !settings.sampling)
    fail(
        "--seed seeds the draws, and nothing is drawn: give --temperature (or use a folder "
        "whose generation_config.json sets do_sample true)");
  if (o.verify && settings.sampling)
    fail(
        "--verify checks greedy tokens, and generation_config.json's do_sample is true: add "
        "--greedy");
  // the ids transformers' tokenizer(prompt) gives, as a model card passes them to generate();
  // made before the weights are read, so that a bad --chat flag costs no load
  const std::vector<std::int32_t> prompt =
      o.chat ? chat_prompt_ids(tokenizer, o) : tokenizer.encode_for_model(o.prompt);
  if (prompt.empty()) fail("--prompt encodes to no tokens");
  // the decoder's projections read straight into their storage, one matrix at a time
  const remat::WeightStorage storage = o.storage == "bf16"   ? remat::WeightStorage::bf16
                                       : o.storage == "int8" ? remat::WeightStorage::int8
                                       : o.storage == "nf4"  ? remat::WeightStorage::nf4
                                                             : remat::WeightStorage::f32;
  remat::nn::Llama<float> model = remat::hub::load_llama<float>(o.base, {.projections = storage});
  std::optional<remat::nn::lora::Adapters<float>> adapters;
  if (!o.adapters.empty()) adapters.emplace(load_adapters(model, o.adapters));
  model.eval();

  remat::nn::GenerateOptions g{.max_new_tokens = o.max_new_tokens};
  if (settings.sampling) g.sampling = *settings.sampling;
  g.repetition_penalty = settings.repetition_penalty;
  g.eos_ids = settings.eos_ids;
  g.stop = o.stop;
  // StopStringCriteria matches the tokens' text with the special tokens in it
  g.decode = [&](const std::vector<std::int32_t>& ids) {
    return tokenizer.decode(token_ids_only(tokenizer, ids), false);
  };
  const remat::nn::Generated out = remat::nn::generate(model, prompt, g);
  const std::string text = tokenizer.decode(token_ids_only(tokenizer, out.ids));
  // fwrite: the text may hold a NUL, which printf("%s") would cut it at
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);

  std::optional<bool> agrees;
  if (o.verify) agrees = full_forward_agrees(model, prompt, out.ids, settings.repetition_penalty);
  if (o.json) {
    nlohmann::ordered_json j;
    j["prompt_ids"] = prompt;
    j["new_ids"] = out.ids;
    j["text"] = text;
    j["stop_reason"] = remat::nn::to_string(out.reason);
    j["eos_ids"] = settings.eos_ids;
    j["sampling"] = sampling_json(settings.sampling);
    j["repetition_penalty"] = settings.repetition_penalty;
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
