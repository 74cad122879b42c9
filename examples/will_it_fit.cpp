// Will it fit? Predicts the memory of one training or fine-tuning step of a GPT or a Llama before
// allocating anything: weights (in their storage), LoRA adapters, gradients, optimizer state,
// activations under each checkpoint plan, and logits.
//
//   will_it_fit [--model gpt|llama] [--config config.json] [--compare] [--layers N] [--width C]
//               [--heads H] [--kv-heads G] [--mlp F] [--context T] [--vocab V] [--tied]
//               [--batch B] [--time T] [--accumulate K] [--dtype float|double|bf16]
//               [--optimizer adamw|momentum|sgd] [--storage f32|bf16|int8|nf4] [--no-double-quant]
//               [--lora-rank R] [--lora-targets a,b,...] [--plain-loss | --loss-chunk-rows N]
//               [--save-matmuls]
//               [--policy save_matmuls|save_ops:a,b,...|recompute_ops:a,b,...]...
//               [--memory GiB] [--budget MiB] [--json]          (--help)
//   will_it_fit --base DIR [--data FILE [--max-tokens N] [--truncate oldest|exclude]
//               [--train-on assistant|all] [--skip-bad] [--pack] [--chat-date DATE]
//               [--lora-dropout P]] [...]
//
// The defaults are GPT-2 small (12 layers, width 768, 12 heads, context 1024, vocabulary 50257)
// with a batch of 8. --model llama prices a Llama (--kv-heads, --mlp; --width is the hidden
// size), --config a Hugging Face Llama/Qwen2 config.json (its shape; --time then defaults to
// --context or the file's max_position_embeddings). --compare prints, for the model and batch
// given, full fine-tuning, LoRA over 16-bit weights and QLoRA side by side, with and without
// checkpointing (LoRA rank --lora-rank, 16 by default, on every linear). A 2B-class Qwen-like
// model at batch 2 x 1,024:
//   will_it_fit --model llama --layers 28 --width 2048 --heads 16 --kv-heads 8 --mlp 6144
//               --vocab 248000 --tied --context 1024 --batch 2 --compare
// --storage freezes the blocks' linear weights in that format; --lora-rank > 0 adds adapters on
// --lora-targets (default: every linear of a block) and trains only them. --memory is what you
// have (default: this machine's physical memory); the last lines give, for each plan, the
// largest micro-batch that fits in it. --budget adds the plan with the least recompute whose
// activations fit in that many MiB. --policy prices layers under a save policy (each in a segment
// of its own): save_matmuls (the linears' outputs kept; --save-matmuls for short), save_ops:a,b
// (the ops named kept) or recompute_ops:a,b (the ops named recomputed, the rest kept), op names
// as the tape records them (layer_norm, linear, gelu_tanh, add, ...); each adds the plan with
// every layer so, and lets --budget choose such layers too; with any storage and LoRA. With
// --json the output is one JSON object instead.
//
// --base DIR prices a Hugging Face folder's model (its config.json, as --config does). With
// --data FILE it reads the data as `finetune --base DIR --data FILE` does (the folder's
// tokenizer.json and chat template, the same limits and validation split; the weights are not
// read) and prints the settings `finetune --auto` would choose and why: the same "auto:" lines,
// made by the same code (auto_settings.hpp), for the same flags: a LoRA fine-tune (rank 8 and NF4
// unless --lora-rank and --storage say otherwise, as finetune's defaults), within --memory
// (default here: the memory available now, as finetune --auto's). --batch and --accumulate, when
// given, win as they do in finetune; --json prints the decision as one JSON object.
#include <remat/checkpoint/plan.hpp>
#include <remat/train/estimate.hpp>
#include <remat/hub/llama_config.hpp>

#include <unistd.h>

#include "flags.hpp"
#ifdef REMAT_WILL_IT_FIT_HUB
#include "auto_settings.hpp"
#endif

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

using remat::nn::GPTConfig;
using remat::train::MemoryEstimate;
using remat::train::StepShape;
namespace plan = remat::plan;

struct Options {
  GPTConfig config{.vocab = 50257, .context = 1024, .layers = 12, .heads = 12, .width = 768};
  remat::nn::LlamaConfig llama;  // with --model llama or --config
  bool is_llama = false;
  StepShape step{.batch = 8};
  bool double_precision = false, json = false, compare = false;
  double memory_gib = 0, budget_mib = 0;
  // --base DIR --data FILE: finetune --auto's decision
  std::string base, data, truncate = "oldest", train_on = "assistant", chat_date;
  std::int64_t max_tokens = 0;
  bool skip_bad = false, pack = false, batch_given = false, accumulate_given = false,
       loss_chunk_rows_given = false;
  double lora_dropout = 0;
  std::vector<std::string> conversation_flags;  // given flags only conversations take
};

/// What --dtype priced, for the headers.
const char* value_type(const Options& o) {
  if (o.double_precision) return "double";
  return o.step.precision == remat::Precision::bf16 ? "bf16 activations, float weights" : "float";
}

/// The linear names a block has, LoRA's default targets.
std::vector<std::string> block_linears(bool llama) {
  if (llama) return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return {"qkv", "proj", "fc"};
}

double physical_memory_gib() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         (1 << 30);
}

/// Refuses the flags that do not go together: --base with --config, --data without --base, the
/// data's flags without --data, and with --data the flags finetune has no equivalent of.
template <std::size_t N>
void check_data_flags(const CLI::App& app, const Options& o,
                      const std::pair<CLI::Option*, const char*> (&data_only)[N], bool data,
                      bool config) {
  if (!o.base.empty() && config)
    throw remat::ArgumentError(
        "will_it_fit: --base DIR reads DIR/config.json; give it or --config");
  if (data && o.base.empty())
    throw remat::ArgumentError("will_it_fit: --data needs --base DIR (the folder's tokenizer)");
  for (const auto& [option, name] : data_only) {
    if (!data && option->count() > 0)
      throw remat::ArgumentError(remat::detail::cat("will_it_fit: ", name, " is for --data"));
  }
  if (!data) return;
  // finetune trains float weights with AdamW and the chunked loss, over --time chosen from the
  // data (in f32 or bf16: --dtype double is refused once parsed)
  for (const char* name : {"--compare", "--optimizer", "--plain-loss", "--policy", "--save-matmuls",
                           "--budget", "--time", "--model"}) {
    if (app.count(name) > 0) {
      throw remat::ArgumentError(remat::detail::cat(
          "will_it_fit: ", name, " does not apply with --data (finetune --auto's decision)"));
    }
  }
#ifndef REMAT_WILL_IT_FIT_HUB
  throw remat::ArgumentError(
      "will_it_fit: --data needs remat::hub's tokenizer (PCRE2 and ICU), not in this build");
#endif
}

/// The flags; `will_it_fit --help` lists them with their defaults, and an unknown flag or a
/// value out of range is an error that prints that list.
Options parse(int argc, char** argv) {
  Options o;
  std::string dtype = "float", optimizer = "adamw", model = "gpt", config_path, storage = "f32",
              targets;
  std::int64_t kv_heads = 0, mlp = 0, lora_rank = 0;
  bool no_double_quant = false;
  bool plain_loss = false, save_matmuls = false;
  std::vector<std::string> policies;
  CLI::App app(
      "Will it fit? Predicts the memory of one GPT training step before allocating anything:\n"
      "parameters, gradients, optimizer state, activations under each checkpoint plan, logits,\n"
      "and the largest batch each plan allows in --memory.");
  const auto count = [&](const char* flag, std::int64_t& v, const char* what) {
    app.add_option(flag, v, what)->check(flags::non_negative)->capture_default_str();
  };
  count("--layers", o.config.layers, "transformer blocks");
  count("--width", o.config.width, "model width C");
  count("--heads", o.config.heads, "attention heads");
  count("--context", o.config.context, "context length (positions the model has)");
  count("--vocab", o.config.vocab, "vocabulary size V");
  count("--kv-heads", kv_heads, "Llama: key/value heads (0: --heads)");
  count("--mlp", mlp, "Llama: intermediate size of the SwiGLU MLP (0: 4 x --width)");
  count("--batch", o.step.batch, "sequences per micro-batch B");
  count("--time", o.step.time, "tokens per sequence T (0: the context length)");
  count("--loss-chunk-rows", o.step.loss_chunk_rows,
        "rows the chunked loss computes at a time, against 2,048 tokens of the vocabulary (0: a "
        "tile of 8 MiB, 1,024 rows of floats)");
  app.add_option("--accumulate", o.step.accumulation,
                 "micro-batches per optimizer step (memory does not depend on it)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--model", model, "architecture")
      ->check(CLI::IsMember({"gpt", "llama"}))
      ->capture_default_str();
  app.add_option("--config", config_path,
                 "a Hugging Face Llama/Qwen2 config.json (sets the Llama's shape)")
      ->check(flags::input_file);
  app.add_flag("--compare", o.compare,
               "print full fine-tuning, LoRA (bf16) and QLoRA (nf4) side by side for this model "
               "and batch, and exit");
  app.add_option("--storage", storage,
                 "the blocks' linear weights: f32 (trained unless LoRA), or frozen bf16, int8, nf4")
      ->check(CLI::IsMember({"f32", "bf16", "int8", "nf4"}))
      ->capture_default_str();
  app.add_flag("--no-double-quant", no_double_quant,
               "NF4 without the second quantization of its scales");
  count("--lora-rank", lora_rank, "LoRA rank (0: no adapters)");
  app.add_option("--lora-targets", targets,
                 "comma-separated linear names to adapt (default: every linear of a block)");
  app.add_option("--dtype", dtype,
                 "what a step computes in: float, double, or bf16 (float weights and optimizer, "
                 "bfloat16 GEMMs and saved activations)")
      ->check(CLI::IsMember({"float", "double", "bf16"}))
      ->capture_default_str();
  app.add_option("--optimizer", optimizer, "optimizer whose state is priced")
      ->check(CLI::IsMember({"adamw", "momentum", "sgd"}))
      ->capture_default_str();
  app.add_flag("--tied", o.config.tied, "the head shares the token embedding");
  app.add_flag("--plain-loss", plain_loss,
               "price the plain loss (full logits) instead of the chunked one");
  app.add_flag("--save-matmuls", save_matmuls,
               "also price every layer under the save_matmuls policy (--policy save_matmuls)");
  app.add_option("--policy", policies,
                 "also price every layer under this save policy (in a segment of its own), and let "
                 "--budget choose it per layer: save_matmuls, save_ops:a,b,... or "
                 "recompute_ops:a,b,... (op names as the tape records them); repeatable");
  app.add_option("--memory", o.memory_gib, "memory you have, GiB (default: this machine's)")
      ->check(flags::positive);
  app.add_option("--budget", o.budget_mib,
                 "also price the least-recompute plan under this many MiB of activations")
      ->check(flags::positive);
  app.add_flag("--json", o.json, "print one JSON object instead of the table");
  app.add_option("--base", o.base,
                 "a Hugging Face folder: its config.json (as --config); with --data, finetune "
                 "--auto's decision")
      ->check(flags::input_dir);
  // the data's flags, as finetune reads them (only with --data)
  const std::pair<CLI::Option*, const char*> data_only[] = {
      {app.add_option("--max-tokens", o.max_tokens,
                      "the sequence length's ceiling (finetune --auto --max-tokens)")
           ->check(flags::positive),
       "--max-tokens"},
      {app.add_option("--truncate", o.truncate, "finetune's --truncate")
           ->check(CLI::IsMember({"oldest", "exclude"})),
       "--truncate"},
      {app.add_option("--train-on", o.train_on, "finetune's --train-on")
           ->check(CLI::IsMember({"assistant", "all"})),
       "--train-on"},
      {app.add_flag("--skip-bad", o.skip_bad, "finetune's --skip-bad"), "--skip-bad"},
      {app.add_flag("--pack", o.pack, "finetune's --pack"), "--pack"},
      {app.add_option("--chat-date", o.chat_date,
                      "finetune's --chat-date (the date a Llama 3.1+ template writes changes the "
                      "token counts)")
           ->check(flags::chat_date),
       "--chat-date"},
      {app.add_option("--lora-dropout", o.lora_dropout, "finetune's --lora-dropout")
           ->check(flags::probability),
       "--lora-dropout"}};
  CLI::Option* data_option =
      app.add_option("--data", o.data,
                     "with --base: conversations (.jsonl) or text (.txt); print the settings "
                     "finetune --auto would choose")
          ->check(flags::input_file);
  flags::parse(app, argc, argv);
  for (const char* name : {"--truncate", "--train-on", "--skip-bad", "--chat-date"})
    if (app.count(name) > 0) o.conversation_flags.push_back(name);
  check_data_flags(app, o, data_only, data_option->count() > 0, !config_path.empty());
  // a config.json gives the shape: a shape flag beside it would be ignored
  if (!config_path.empty() || !o.base.empty()) {
    for (const char* name : {"--layers", "--width", "--heads", "--context", "--vocab", "--kv-heads",
                             "--mlp", "--tied"})
      if (app.count(name) > 0)
        throw remat::ArgumentError(
            remat::detail::cat("will_it_fit: ", name, " sets a shape that ",
                               o.base.empty() ? config_path : o.base + "/config.json", " gives"));
  }
  if (!o.base.empty()) config_path = o.base + "/config.json";
  if (!o.data.empty()) {
    // finetune's defaults: NF4 and rank 8 unless given
    if (app.count("--storage") == 0) storage = "nf4";
    if (app.count("--lora-rank") == 0) lora_rank = 8;
    o.batch_given = app.count("--batch") > 0;
    o.accumulate_given = app.count("--accumulate") > 0;
    o.loss_chunk_rows_given = app.count("--loss-chunk-rows") > 0;
  }
  o.double_precision = dtype == "double";
  if (dtype == "bf16") o.step.precision = remat::Precision::bf16;
  if (o.double_precision && !o.data.empty())
    throw remat::ArgumentError(
        "will_it_fit: --dtype double does not apply with --data (finetune computes in f32 or "
        "bf16)");
  o.step.optimizer = optimizer == "adamw"      ? remat::train::OptimizerKind::adamw
                     : optimizer == "momentum" ? remat::train::OptimizerKind::sgd_momentum
                                               : remat::train::OptimizerKind::sgd;
  o.step.chunked_loss = !plain_loss;
  if (plain_loss && o.step.loss_chunk_rows > 0)
    throw remat::ArgumentError(
        "will_it_fit: --loss-chunk-rows is for the chunked loss; --plain-loss prices the whole "
        "logits");
  if (save_matmuls) o.step.policies.push_back(remat::save_matmuls());
  for (const std::string& spec : policies)
    o.step.policies.push_back(flags::save_policy(spec, "--policy"));
  o.step.storage = storage == "bf16"   ? remat::WeightStorage::bf16
                   : storage == "int8" ? remat::WeightStorage::int8
                   : storage == "nf4"  ? remat::WeightStorage::nf4
                                       : remat::WeightStorage::f32;
  o.step.double_quant = !no_double_quant;
  o.is_llama = model == "llama" || !config_path.empty();
  if (lora_rank > 0) {
    o.step.lora.rank = lora_rank;
    std::stringstream in(targets);
    for (std::string t; std::getline(in, t, ',');) {
      if (!t.empty()) o.step.lora.targets.push_back(t);
    }
    if (o.step.lora.targets.empty()) o.step.lora.targets = block_linears(o.is_llama);
  }
  if (o.is_llama) {
    if (!config_path.empty()) {
      o.llama = remat::hub::load_llama_config(config_path);  // throws an IoError naming the file
    } else {
      o.llama = {.vocab_size = o.config.vocab,
                 .hidden_size = o.config.width,
                 .intermediate_size = mlp ? mlp : 4 * o.config.width,
                 .num_hidden_layers = o.config.layers,
                 .num_attention_heads = o.config.heads,
                 .num_key_value_heads = kv_heads ? kv_heads : o.config.heads,
                 .tie_word_embeddings = o.config.tied,
                 .max_position_embeddings = o.config.context};
    }
  }
  if (o.memory_gib == 0 && o.data.empty()) o.memory_gib = physical_memory_gib();
  return o;
}

MemoryEstimate estimate(const Options& o, std::int64_t batch) {
  StepShape step = o.step;
  step.batch = batch;
  if (o.is_llama) {
    return o.double_precision ? remat::train::estimate_memory<double>(o.llama, step)
                              : remat::train::estimate_memory<float>(o.llama, step);
  }
  return o.double_precision ? remat::train::estimate_memory<double>(o.config, step)
                            : remat::train::estimate_memory<float>(o.config, step);
}

/// The plans priced: none, every, sqrt, two- and one-slot optimal, for each --policy every
/// layer under that policy, and --budget's.
std::vector<plan::Plan> plans(const Options& o, const MemoryEstimate& e) {
  std::vector<plan::Plan> out = {plan::none(e.chain), plan::every(e.chain), plan::sqrt(e.chain),
                                 plan::optimal(e.chain, 2), plan::optimal(e.chain, 1)};
  for (const remat::plan::PolicyCosts& q : e.chain.policies) {
    std::vector<plan::Segment> layers;
    for (std::size_t l = 0; l < e.chain.layers(); ++l) layers.push_back({l, l + 1, {}, q.policy});
    out.push_back(plan::custom(e.chain, std::move(layers)));
  }
  if (o.budget_mib > 0) out.push_back(plan::budget(e.chain, o.budget_mib * (1 << 20)));
  return out;
}

/// The name a plan goes by on remat_bench's --mode (train_gpt's --checkpoint takes the first four).
std::string name(const plan::Plan& p, const Options& o) {
  char buf[64];
  if (p.kind == remat::plan::Kind::budget)
    std::snprintf(buf, sizeof buf, "budget:%g", o.budget_mib);
  else if (p.kind == remat::plan::Kind::custom)  // the custom plans priced: every layer under one
    return p.segments.empty() ? std::string("custom") : p.segments[0].policy.name();
  else if (p.kind == remat::plan::Kind::optimal)
    std::snprintf(buf, sizeof buf, "optimal:%d", p.slots);
  else
    return remat::plan::to_string(p.kind);
  return buf;
}

/// The peak of a step of `batch` sequences under `p` (estimate(o, batch).total(p), without the
/// profile a search does not need).
double step_peak(const Options& o, std::int64_t batch, const plan::Plan& p) {
  StepShape step = o.step;
  step.batch = batch;
  if (o.is_llama) {
    return o.double_precision ? remat::train::step_peak<double>(o.llama, step, p)
                              : remat::train::step_peak<float>(o.llama, step, p);
  }
  return o.double_precision ? remat::train::step_peak<double>(o.config, step, p)
                            : remat::train::step_peak<float>(o.config, step, p);
}

/// The largest batch whose step fits in `bytes` with `p`'s segments (0: not even one sequence;
/// the search stops at 2^30 sequences).
std::int64_t largest_batch(const Options& o, const plan::Plan& p, double bytes) {
  const auto fits = [&](std::int64_t b) { return step_peak(o, b, p) <= bytes; };
  constexpr std::int64_t kMost = std::int64_t{1} << 30;
  if (!fits(1)) return 0;
  std::int64_t lo = 1, hi = 2;
  while (hi <= kMost && fits(hi)) lo = hi, hi *= 2;
  if (hi > kMost) return lo;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

/// "3 x 1.2 M linears" and the like: what the step trains and how the weights are stored.
std::string training_line(const Options& o, const MemoryEstimate& e) {
  char buf[256];
  if (o.step.lora.rank > 0) {
    std::string targets;
    for (const std::string& t : o.step.lora.targets) targets += (targets.empty() ? "" : ",") + t;
    std::snprintf(
        buf, sizeof buf,
        "LoRA rank %lld on %s (%.2f M adapter parameters), blocks' linears stored as %s%s",
        static_cast<long long>(o.step.lora.rank), targets.c_str(),
        static_cast<double>(e.adapter_count) / 1e6, remat::to_string(o.step.storage),
        o.step.storage == remat::WeightStorage::nf4 && !o.step.double_quant ? " (no double quant)"
                                                                            : "");
  } else if (o.step.storage != remat::WeightStorage::f32) {
    std::snprintf(buf, sizeof buf, "blocks' linears frozen as %s, %.1f M parameters trained",
                  remat::to_string(o.step.storage), static_cast<double>(e.trainable_count) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "every parameter trained");
  }
  return buf;
}

void print_table(const Options& o, const MemoryEstimate& e, const std::vector<plan::Plan>& ps) {
  const GPTConfig& c = o.config;
  const remat::nn::LlamaConfig& l = o.llama;
  const std::int64_t time = o.step.time != 0 ? o.step.time
                            : o.is_llama     ? l.max_position_embeddings
                                             : c.context;
  const double memory = o.memory_gib * (1 << 30);
  if (o.is_llama) {
    std::printf(
        "Llama: %lld layers, hidden %lld, %lld/%lld query/key-value heads, MLP %lld, context %lld, "
        "vocabulary %lld%s (%s): "
        "%.1f M parameters\n",
        static_cast<long long>(l.num_hidden_layers), static_cast<long long>(l.hidden_size),
        static_cast<long long>(l.num_attention_heads),
        static_cast<long long>(l.num_key_value_heads), static_cast<long long>(l.intermediate_size),
        static_cast<long long>(l.max_position_embeddings), static_cast<long long>(l.vocab_size),
        l.tie_word_embeddings ? ", tied head" : "", value_type(o),
        static_cast<double>(e.parameter_count) / 1e6);
  } else {
    std::printf(
        "GPT: %lld layers, width %lld, %lld heads, context %lld, vocabulary %lld%s (%s): %.1f M "
        "parameters\n",
        static_cast<long long>(c.layers), static_cast<long long>(c.width),
        static_cast<long long>(c.heads), static_cast<long long>(c.context),
        static_cast<long long>(c.vocab), c.tied ? ", tied head" : "", value_type(o),
        static_cast<double>(e.parameter_count) / 1e6);
  }
  std::printf(
      "step: micro-batch %lld x %lld tokens%s, %s loss; %s\n\n",
      static_cast<long long>(o.step.batch), static_cast<long long>(time),
      o.step.accumulation > 1
          ? remat::detail::cat(", accumulated over ", o.step.accumulation, " micro-batches").c_str()
          : "",
      o.step.chunked_loss ? "chunked" : "plain", training_line(o, e).c_str());
  std::printf("held between steps\n");
  std::printf("  %-28s %12s\n", "weights", human(e.parameters).c_str());
  if (o.step.lora.rank > 0) std::printf("  %-28s %12s\n", "adapters", human(e.adapters).c_str());
  std::printf("  %-28s %12s\n", "gradients", human(e.gradients).c_str());
  std::printf("  %-28s %12s\n", "optimizer state", human(e.optimizer_state).c_str());
  std::printf("  %-28s %12s\n", "token ids and targets", human(e.data).c_str());
  std::printf(
      "logits (B T x V): %s, and as much again for their gradient; the chunked loss holds %s at a "
      "time\n\n",
      human(e.logits).c_str(), human(e.loss_chunk).c_str());
  int wide = 14;  // a policy's name may be longer than the plans'
  for (const plan::Plan& p : ps) wide = std::max(wide, static_cast<int>(name(p, o).size()));
  std::printf("  %-*s %14s %14s %11s %10s %12s\n", wide, "plan", "activations", "step total",
              "recompute", "fits?", "max batch");
  for (const plan::Plan& p : ps) {
    const double total = e.total(p);
    std::printf("  %-*s %14s %14s %10.0f%% %10s %12lld\n", wide, name(p, o).c_str(),
                human(e.activations(p)).c_str(), human(total).c_str(), 100 * p.recompute_fraction,
                total <= memory ? "yes" : "no",
                static_cast<long long>(largest_batch(o, p, memory)));
  }
  std::printf(
      "\n(fits? and max batch: within %s; max batch is the largest micro-batch, --time fixed)\n",
      human(memory).c_str());
}

/// The model and batch given under full fine-tuning, LoRA (rank --lora-rank, 16 by default, on
/// every linear of a block) over 16-bit (bf16) weights, and QLoRA (NF4), each without
/// checkpointing and with one checkpoint per layer, plain and chunked loss.
void print_compare(const Options& given) {
  Options o = given;
  const std::int64_t rank = given.step.lora.rank > 0 ? given.step.lora.rank : 16;
  const auto layers =
      static_cast<std::size_t>(o.is_llama ? o.llama.num_hidden_layers : o.config.layers);
  if (o.step.time == 0)
    o.step.time = o.is_llama ? o.llama.max_position_embeddings : o.config.context;
  const double memory = o.memory_gib * (1 << 30);
  struct Scenario {
    const char* name;
    remat::WeightStorage storage;
    std::int64_t rank;
  };
  const Scenario scenarios[] = {{"full (f32)", remat::WeightStorage::f32, 0},
                                {"LoRA (bf16)", remat::WeightStorage::bf16, 16},
                                {"QLoRA (nf4)", remat::WeightStorage::nf4, 16}};
  std::vector<MemoryEstimate> plain, chunked;
  const std::int64_t chunk_rows = o.step.loss_chunk_rows;  // the chunked loss's alone
  const auto set_loss = [&](bool chunked_loss) {
    o.step.chunked_loss = chunked_loss;
    o.step.loss_chunk_rows = chunked_loss ? chunk_rows : 0;
  };
  for (const Scenario& s : scenarios) {
    o.step.storage = s.storage;
    o.step.lora = {.rank = s.rank ? rank : 0,
                   .targets = s.rank ? block_linears(o.is_llama) : std::vector<std::string>{}};
    set_loss(false);
    plain.push_back(estimate(o, 2));
    set_loss(true);
    chunked.push_back(estimate(o, 2));
  }
  if (o.is_llama) {
    const remat::nn::LlamaConfig& c = o.llama;
    std::printf("Llama: hidden %lld, %lld layers, %lld/%lld heads, MLP %lld, vocabulary %lld%s",
                static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_hidden_layers),
                static_cast<long long>(c.num_attention_heads),
                static_cast<long long>(c.num_key_value_heads),
                static_cast<long long>(c.intermediate_size), static_cast<long long>(c.vocab_size),
                c.tie_word_embeddings ? ", tied head" : "");
  } else {
    std::printf("GPT: width %lld, %lld layers, %lld heads, vocabulary %lld%s",
                static_cast<long long>(o.config.width), static_cast<long long>(o.config.layers),
                static_cast<long long>(o.config.heads), static_cast<long long>(o.config.vocab),
                o.config.tied ? ", tied head" : "");
  }
  std::printf(
      " (%.2f B parameters); batch %lld x %lld tokens; AdamW; activations in %s; LoRA rank %lld "
      "on every linear\n\n",
      static_cast<double>(plain[0].parameter_count) / 1e9, static_cast<long long>(o.step.batch),
      static_cast<long long>(o.step.time), value_type(o), static_cast<long long>(rank));
  std::printf("  %-40s %14s %14s %14s\n", "", scenarios[0].name, scenarios[1].name,
              scenarios[2].name);
  const auto row = [&](const char* label, auto&& value) {
    std::printf("  %-40s", label);
    for (std::size_t i = 0; i < 3; ++i) std::printf(" %14s", human(value(i)).c_str());
    std::printf("\n");
  };
  const plan::Plan none = plan::none(layers), every = plan::every(layers);
  row("weights", [&](std::size_t i) { return plain[i].parameters; });
  row("adapters", [&](std::size_t i) { return plain[i].adapters; });
  row("gradients", [&](std::size_t i) { return plain[i].gradients; });
  row("optimizer state (AdamW)", [&](std::size_t i) { return plain[i].optimizer_state; });
  // the layers' own peak: the chain without the loss (which keeps and makes the logits)
  const auto layers_peak = [&](std::size_t i, const plan::Plan& p) {
    return plan::predict(plain[i].chain.without_loss(), p.segments).peak_bytes;
  };
  row("layers' activations, all kept", [&](std::size_t i) { return layers_peak(i, none); });
  row("layers' activations, checkpoint per layer",
      [&](std::size_t i) { return layers_peak(i, every); });
  row("logits (B T x V; their gradient as much)", [&](std::size_t i) { return plain[i].logits; });
  row("chunked loss: logits held at a time", [&](std::size_t i) { return chunked[i].loss_chunk; });
  row("step total: no checkpoint, plain loss", [&](std::size_t i) { return plain[i].total(none); });
  row("step total: every layer, plain loss", [&](std::size_t i) { return plain[i].total(every); });
  row("step total: every layer, chunked loss",
      [&](std::size_t i) { return chunked[i].total(every); });
  std::printf("\n  largest micro-batch (x %lld tokens) within %s:\n",
              static_cast<long long>(o.step.time), human(memory).c_str());
  for (const auto& [label, p, loss] : {std::tuple{"no checkpoint, plain loss", none, false},
                                       std::tuple{"every layer, plain loss", every, false},
                                       std::tuple{"every layer, chunked loss", every, true}}) {
    std::printf("  %-40s", label);
    for (const Scenario& s : scenarios) {
      o.step.storage = s.storage;
      o.step.lora = {.rank = s.rank ? rank : 0,
                     .targets = s.rank ? block_linears(o.is_llama) : std::vector<std::string>{}};
      set_loss(loss);
      std::printf(" %14lld", static_cast<long long>(largest_batch(o, p, memory)));
    }
    std::printf("\n");
  }
  std::printf(
      "\n(the layers' activations are their peak without the loss, in float: 16-bit activations "
      "would halve them.\n"
      "Totals include the loss: with the plain loss its logits and their gradient.)\n");
}

void print_json(const Options& o, const MemoryEstimate& e, const std::vector<plan::Plan>& ps) {
  std::printf(
      "{\"parameter_count\": %lld, \"parameters\": %.0f, \"gradients\": %.0f, \"optimizer_state\": "
      "%.0f, "
      "\"data\": %.0f, \"logits\": %.0f, \"loss_chunk\": %.0f, \"memory\": %.0f, \"adapters\": "
      "%.0f, "
      "\"trainable_count\": %lld, \"accumulation\": %lld, \"plans\": [",
      static_cast<long long>(e.parameter_count), e.parameters, e.gradients, e.optimizer_state,
      e.data, e.logits, e.loss_chunk, o.memory_gib * (1 << 30), e.adapters,
      static_cast<long long>(e.trainable_count), static_cast<long long>(o.step.accumulation));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    std::printf(
        "%s{\"plan\": \"%s\", \"activations\": %.0f, \"total\": %.0f, \"recompute\": %.4f, "
        "\"max_batch\": %lld}",
        i ? ", " : "", name(ps[i], o).c_str(), e.activations(ps[i]), e.total(ps[i]),
        ps[i].recompute_fraction,
        static_cast<long long>(largest_batch(o, ps[i], o.memory_gib * (1 << 30))));
  }
  std::printf("]}\n");
}

#ifdef REMAT_WILL_IT_FIT_HUB
/// finetune --auto's decision for --base and --data (auto_settings.hpp): the data's report and
/// the "auto:" lines, or one JSON object.
int print_decision(const Options& o) {
  const remat::hub::Tokenizer tok = remat::hub::Tokenizer::from_folder(o.base);
  auto_settings::Request r{.model = o.llama,
                           .storage = o.step.storage,
                           .double_quant = o.step.double_quant,
                           .precision = o.step.precision,
                           .rank = o.step.lora.rank,
                           .targets = o.step.lora.targets,
                           .dropout = o.lora_dropout,
                           .pack = o.pack,
                           .max_tokens = static_cast<std::size_t>(o.max_tokens)};
  auto_settings::set_memory(r, o.memory_gib);
  if (r.rank <= 0)
    throw remat::ArgumentError(
        "will_it_fit: --data prices a LoRA fine-tune: --lora-rank must be > 0");
  if (o.batch_given) r.batch = o.step.batch;
  if (o.accumulate_given) r.accumulate = o.step.accumulation;
  if (o.loss_chunk_rows_given) r.loss_chunk_rows = o.step.loss_chunk_rows;
  const chat::DataOptions data{
      .path = o.data,
      .truncate =
          o.truncate == "exclude" ? remat::hub::Truncate::exclude : remat::hub::Truncate::oldest,
      .train_on = o.train_on == "all" ? remat::hub::TrainOn::all : remat::hub::TrainOn::assistant,
      .skip_bad = o.skip_bad,
      .chat_date = o.chat_date,
      .conversation_flags = o.conversation_flags};
  const auto_settings::Result chosen = auto_settings::decide(tok, o.base, data, r);
  if (o.json) {
    std::printf("%s\n", chosen.decision.json().c_str());
    return 0;
  }
  std::printf("%zu training and %zu validation examples (%s)\n", chosen.data.train.size(),
              chosen.data.val.size(), chosen.data.report.c_str());
  for (const std::string& line : chosen.decision.lines) std::printf("%s\n", line.c_str());
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  return flags::run_main("will_it_fit", [&] {
    const Options o = parse(argc, argv);  // --config's file is read here
#ifdef REMAT_WILL_IT_FIT_HUB
    if (!o.data.empty()) return print_decision(o);
#endif
    if (o.compare) {
      print_compare(o);
      return 0;
    }
    const MemoryEstimate e = estimate(o, o.step.batch);
    const std::vector<plan::Plan> ps = plans(o, e);  // before printing: a budget too small throws
    o.json ? print_json(o, e, ps) : print_table(o, e, ps);
    return 0;
  });
}
