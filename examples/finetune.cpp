// Fine-tunes a Hugging Face model folder on conversations or text, or a model saved by
// train_llama (--save-hf DIR) or train_gpt (--save FILE) on a second text, with LoRA adapters
// over a frozen, quantized base, under a checkpoint plan, and prints where the memory went: each
// part counted by the library's allocator next to remat::train::estimate_memory's figure for it.
//
//   finetune --base DIR|FILE [--data PATH] [--storage nf4|bf16|int8|f32] [--no-double-quant]
//            [--rank R] [--alpha A] [--lora-dropout P] [--targets a,b,...] [--context T]
//            [--max-tokens N] [--truncate oldest|exclude] [--train-on assistant|all]
//            [--skip-bad] [--pack] [--chat-date DATE] [--prompt TEXT] [--auto [--memory GiB]]
//            [--batch B] [--accumulate K] [--steps S] [--lr LR] [--seed N] [--threads N]
//            [--checkpoint none|every|sqrt|budget:<MiB>|policy:<policy>] [--loss-chunk-rows N]
//            [--eval-every N] [--eval-batches N]
//            [--save-adapters DIR] [--save-every N] [--resume DIR] [--stop-after N] [--full]
//            [--sample N] [--json] [--trace FILE.json]   (--help)
//
// --base is one of:
//  - a Hugging Face folder (config.json, safetensors, tokenizer.json, tokenizer_config.json)
//    of a Llama, Mistral, Qwen2 or Qwen3 model. --data is a .jsonl file of conversations
//    ({"messages": [{"role": ..., "content": ...}]} a line), rendered with the folder's chat
//    template, the loss on the assistant's tokens (--train-on all: on every token), or a .txt
//    file of documents separated by blank lines, the loss on every token. An example longer
//    than --max-tokens (default: 1024, or the model's context if shorter) loses its oldest
//    exchanges, its system message kept (--truncate oldest), or is left out (exclude); a text
//    document is cut into windows. Every tenth example is kept for validation. A batch holds
//    --batch examples, one a row, padded to the longest, or (--pack) --batch rows of
//    --max-tokens - 1 positions into which examples are packed, attention kept within each
//    example. --chat-date sets the date a Llama 3.1+ template writes ("04 Dec 2026"; default:
//    the template's, today's for Llama 3.2). --prompt samples an answer before and after
//    training (--sample tokens, 48 by default). --auto chooses --max-tokens from the data's token
//    counts, then the checkpoint plan, --batch and --accumulate that fit --memory (GiB; default:
//    the memory available now),
//    --lr and --steps, by the rule written in auto_settings.hpp, and prints an "auto:" line for
//    each choice; a flag given wins for its setting (--max-tokens is then the length's
//    ceiling). `will_it_fit --base DIR --data FILE` prints the same decision without
//    reading the weights.
//  - a train_llama --save-hf folder (with its remat_eval.json vocabulary) or a train_gpt --save
//    file, fine-tuned on a text in the base corpus' characters (default
//    examples/data/finetune.txt, original text shipped with remat; its last tenth for
//    validation) in windows of --context characters; --sample N prints N characters at the end.
// The blocks' linear weights are frozen in --storage (NF4 with double quantization by default;
// f32 only freezes them); embeddings, norms and the head stay float and frozen; LoRA adapters
// of rank --rank on --targets (default: every linear of a block) are the only parameters
// trained, with AdamW, no weight decay. --full instead trains every parameter in float without
// checkpointing (AdamW, decay 0.1 except biases, norms and embeddings): the baseline the LoRA
// run is compared with, at the same batch.
//
// --save-adapters DIR writes PEFT's adapter files at the end; with --save-every N also every N
// steps, beside training_state.safetensors (the adapters, AdamW's moments and step counts, the
// step, and the flags the run's course depends on). --resume DIR continues such a run exactly:
// the same losses and adapters, bit for bit, as if it had not stopped, on the same number of
// threads (on another, a note says the last bits may differ); every flag it records must be
// given the same (a difference is an error naming the flag), and the date the template wrote is
// written again unless --chat-date is given. --stop-after N stops after
// step N of the --steps planned, as a kill would (the schedule still spans --steps).
//
// The loss of a step is the mean over the targets it counts (micro-batches weighted by their
// counted targets). Memory, in the table and the JSON:
//   weights      the base model as stored (counted: live bytes after loading and quantizing)
//   adapters     LoRA's A and B (live bytes lora::apply added)
//   gradients    the trainable parameters' gradient buffers
//   optimizer    AdamW's moments (live bytes the first optimizer step added, or --resume loaded)
//   logits       the loss head's peak alone: the chunked loss's tile of logits and its gradient
//                (counted on the step's final hidden states)
//   activations  the rest of a step's peak: what the blocks keep, the token ids
//   total        the counted peak of a whole training step (a step after the first)
// The estimate is printed before the first step for the largest batch the data can make, and
// beside the count at the end for the shape of the step that reached the peak. The last line
// gives the process's peak resident memory (getrusage) beside the allocator's peak of live bytes
// and the freed buffers its cache keeps. With --json the last line is one JSON object:
// first_val_loss, final_val_loss, seconds, tokens_per_second, peak_resident_mb, peak_live_mb,
// peak_held_mb (live plus the cache's freed buffers), cached_mb, and counted_mb / estimated_mb
// objects with those keys (MiB).
#include <remat/train/estimate.hpp>
#include <remat/nn/generate.hpp>
#include <remat/hub/llama_load.hpp>
#include <remat/hub/peft.hpp>
#include <remat/nn/lora.hpp>
#include <remat/nn/quantize_blocks.hpp>
#include <remat/remat.hpp>

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "auto_settings.hpp"
#include "chat_data.hpp"
#include "corpus.hpp"
#include "flags.hpp"
#include "training_flags.hpp"

#ifndef REMAT_FINETUNE_DATA
#define REMAT_FINETUNE_DATA "examples/data/finetune.txt"
#endif

namespace {

constexpr const char* kProgram = "finetune";

struct Options {
  std::string base, data = REMAT_FINETUNE_DATA;
  std::string storage = "nf4", dtype = "f32";
  bool no_double_quant = false;
  std::int64_t rank = 8;
  double alpha = 16, lora_dropout = 0;
  std::string targets;  // comma-separated; empty: every linear of a block
  std::int64_t context = 0, batch = 8, accumulate = 1, steps = 60;
  double lr = 2e-3;
  std::uint64_t seed = 1;
  int threads = 0;
  std::string checkpoint = "every";
  std::int64_t loss_chunk_rows = 0;  // 0: linear_cross_entropy's default
  std::int64_t eval_every = 20, eval_batches = 4, sample = 0;
  std::string save_adapters, trace, resume;
  std::int64_t save_every = 0, stop_after = 0;
  bool full = false, json = false;
  // a Hugging Face folder's data
  std::int64_t max_tokens = 0;
  std::string truncate = "oldest", train_on = "assistant", prompt;
  std::string chat_date;  // --chat-date; once the data is read, the date its template wrote
  bool skip_bad = false, pack = false;
  bool auto_settings = false;                   // --auto
  double memory_gib = 0;                        // --memory (0: the memory available)
  std::vector<std::string> hub_flags_given;     // flags only a Hugging Face folder takes
  std::vector<std::string> conversation_flags;  // given flags only conversations take
  bool data_given = false;  // a folder has no default data (the default is the char models')
  bool context_given = false;
  // the settings --auto chooses, when the user gave them (they win)
  bool batch_given = false, accumulate_given = false, steps_given = false, lr_given = false,
       checkpoint_given = false, loss_chunk_rows_given = false;
};

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app(
      "Fine-tunes a Hugging Face folder on conversations or text, or a model saved by "
      "train_llama or train_gpt on a\n"
      "second text, with LoRA over a frozen quantized base, and prints where the memory went, "
      "counted next to the\n"
      "estimate.");
  // checked after parsing rather than ->required(), so that an unknown flag is what gets reported
  app.add_option("--base", o.base,
                 "Hugging Face folder (config.json, safetensors, tokenizer.json), train_llama "
                 "--save-hf folder, or train_gpt --save file (required)")
      ->check(flags::input_file_or_dir);
  app.add_option("--data", o.data,
                 "conversations (.jsonl) or text (.txt) for a Hugging Face folder; text in the "
                 "base's characters otherwise")
      ->check(flags::input_file)
      ->capture_default_str();
  app.add_option("--dtype", o.dtype,
                 "what a step computes in: f32, or bf16 (bfloat16 GEMMs and saved activations; "
                 "adapters, losses and the optimizer in float32)")
      ->check(flags::precision_name)
      ->capture_default_str();
  app.add_option("--storage", o.storage,
                 "the frozen blocks' linear weights: nf4, bf16, int8 or f32")
      ->check(CLI::IsMember({"nf4", "bf16", "int8", "f32"}))
      ->capture_default_str();
  app.add_flag("--no-double-quant", o.no_double_quant,
               "NF4 without the second quantization of its scales");
  app.add_option("--rank", o.rank, "LoRA rank r")->check(flags::positive)->capture_default_str();
  app.add_option("--alpha", o.alpha, "LoRA alpha (the adapters' output is scaled by alpha / r)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--lora-dropout", o.lora_dropout, "dropout on the adapters' input, in [0, 1)")
      ->check(flags::probability)
      ->capture_default_str();
  app.add_option("--targets", o.targets,
                 "comma-separated linear names to adapt (default: every linear of a block)");
  app.add_option("--context", o.context,
                 "characters per window of a train_llama/train_gpt model's text (0: its context)")
      ->check(flags::non_negative)
      ->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per micro-batch")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--accumulate", o.accumulate, "micro-batches per optimizer step")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--lr", o.lr, "peak AdamW learning rate (warm-up, then cosine decay)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the adapters and the batches")
      ->check(flags::count)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "worker threads (0: the library's default)")
      ->check(flags::thread_count(true))
      ->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint,
                 "checkpoint plan: none, every, sqrt, budget:<MiB> or policy:<policy> (every layer "
                 "in a segment of its own under save_matmuls, save_ops:a,b,... or "
                 "recompute_ops:a,b,...; --full: none)")
      ->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "steps between validation losses")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches,
                 "validation steps of --batch x --accumulate examples (a character model: batches)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--save-adapters", o.save_adapters,
                 "folder for adapter_model.safetensors and adapter_config.json (PEFT's layout)")
      ->check(flags::output_dir);
  app.add_option("--save-every", o.save_every,
                 "also save the adapters and the training state to --save-adapters every N "
                 "steps (0: the adapters at the end only)")
      ->check(flags::non_negative)
      ->capture_default_str();
  app.add_option("--resume", o.resume,
                 "continue, exactly, the run whose --save-every saves are in this folder")
      ->check(flags::input_dir);
  app.add_option("--stop-after", o.stop_after,
                 "stop after this step of the run, as if killed (0: run all --steps)")
      ->check(flags::non_negative)
      ->capture_default_str();
  const std::pair<CLI::Option*, const char*> hub_only[] = {
      {app.add_option("--max-tokens", o.max_tokens,
                      "longest example in tokens (0: 1024, or the model's context if shorter)")
           ->check(flags::non_negative),
       "--max-tokens"},
      {app.add_option("--truncate", o.truncate,
                      "an example above --max-tokens: drop its oldest exchanges, or exclude it")
           ->check(CLI::IsMember({"oldest", "exclude"})),
       "--truncate"},
      {app.add_option("--train-on", o.train_on,
                      "the tokens the loss is on: the assistant's, or all of a conversation's")
           ->check(CLI::IsMember({"assistant", "all"})),
       "--train-on"},
      {app.add_flag(
           "--skip-bad", o.skip_bad,
           "skip and count malformed JSONL lines and the conversations the chat template refuses"),
       "--skip-bad"},
      {app.add_flag("--pack", o.pack,
                    "pack examples into rows of --max-tokens - 1 positions, attention kept within "
                    "each example (default: one example a row, padded)"),
       "--pack"},
      {app.add_option("--chat-date", o.chat_date,
                      "the date a Llama 3.1+ chat template writes in its system block, as \"04 "
                      "Dec 2026\" (default: the template's own, today's for Llama 3.2; a "
                      "resumed run: the date it was saved with)")
           ->check(flags::chat_date),
       "--chat-date"},
      {app.add_option("--prompt", o.prompt,
                      "a user message to answer before and after training (--sample tokens)")
           ->check(flags::non_empty),
       "--prompt"},
      {app.add_flag("--auto", o.auto_settings,
                    "choose --max-tokens, --checkpoint, --batch, --accumulate, --lr and --steps "
                    "from the data and --memory (flags given win), and say why"),
       "--auto"},
      {app.add_option("--memory", o.memory_gib,
                      "with --auto: the memory the run may take, GiB (default: the memory "
                      "available now, MemAvailable)")
           ->check(flags::positive),
       "--memory"}};
  app.add_option("--loss-chunk-rows", o.loss_chunk_rows,
                 "rows the loss head computes at a time, against 2,048 tokens of the vocabulary "
                 "(0: a tile of 8 MiB, 1,024 rows of floats); each chunk reads the head's weight "
                 "once")
      ->check(flags::non_negative)
      ->capture_default_str();
  app.add_flag("--full", o.full,
               "full fine-tuning in float without checkpointing instead (the baseline)");
  app.add_option("--sample", o.sample,
                 "characters to generate at the end; with --prompt, tokens (0: 48)")
      ->check(flags::non_negative)
      ->capture_default_str();
  app.add_flag("--json", o.json,
               "end with one JSON object: losses, seconds, counted_mb and estimated_mb");
  app.add_option("--trace", o.trace,
                 "write a memory timeline (Chrome trace JSON) of the second step")
      ->check(flags::output_file);
  flags::parse(app, argc, argv);
  for (const char* name : {"--truncate", "--train-on", "--skip-bad", "--chat-date"})
    if (app.count(name) > 0) o.conversation_flags.push_back(name);
  for (const auto& [option, name] : hub_only) {
    if (option->count() > 0) o.hub_flags_given.push_back(name);
  }
  o.data_given = app.count("--data") > 0;
  o.context_given = app.count("--context") > 0;
  o.batch_given = app.count("--batch") > 0;
  o.accumulate_given = app.count("--accumulate") > 0;
  o.steps_given = app.count("--steps") > 0;
  o.lr_given = app.count("--lr") > 0;
  o.checkpoint_given = app.count("--checkpoint") > 0;
  o.loss_chunk_rows_given = app.count("--loss-chunk-rows") > 0;
  if (o.memory_gib > 0 && !o.auto_settings)
    throw remat::ArgumentError("finetune: --memory is for --auto (the memory its choices fit in)");
  if (o.auto_settings && o.full)
    throw remat::ArgumentError(
        "finetune: --auto chooses a LoRA fine-tune's settings; --full trains every parameter");
  if (o.save_every > 0 && o.save_adapters.empty())
    throw remat::ArgumentError("finetune: --save-every needs --save-adapters DIR");
  if (o.full && !o.resume.empty())
    throw remat::ArgumentError("finetune: --resume continues a LoRA run; --full saves no state");
  if (o.base.empty())
    throw remat::ArgumentError(
        "finetune: --base is required (a Hugging Face folder, a train_llama --save-hf folder or a "
        "train_gpt --save file); see --help");
  if (o.full) o.checkpoint = "none";
  corpus::check_checkpoint_mode(o.checkpoint, kProgram);
  return o;
}

remat::WeightStorage storage_of(const std::string& s) {
  if (s == "bf16") return remat::WeightStorage::bf16;
  if (s == "int8") return remat::WeightStorage::int8;
  if (s == "f32") return remat::WeightStorage::f32;
  return remat::WeightStorage::nf4;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

/// A train_gpt --save file: the GPT its metadata describes with its "model.*" weights (the
/// optimizer state beside them is not read), and its vocabulary.
remat::nn::GPT<float> load_gpt(const std::string& path, std::string& vocab) {
  const remat::io::File file = remat::io::File::read(path);
  remat::io::Metadata meta = file.metadata();
  for (const char* key : {"layers", "width", "heads", "context", "vocab"}) {
    if (!meta.count(key)) {
      throw remat::IoError(remat::detail::cat(kProgram, ": ", path, " has no '", key,
                                              "' metadata (is it a train_gpt --save file?)"));
    }
  }
  vocab = meta["vocab"];
  const auto integer = [&](const char* key) {
    return corpus::metadata_integer(meta, key, path, kProgram);
  };
  const remat::nn::GPTConfig config{.vocab = static_cast<std::int64_t>(vocab.size()),
                                    .context = integer("context"),
                                    .layers = integer("layers"),
                                    .heads = integer("heads"),
                                    .width = integer("width")};
  // the sizes come from a file: the model they describe must fit before it is allocated
  flags::fits(kProgram, "the model in " + path,
              16.0 * double(config.layers) * double(config.width) * double(config.width) +
                  4.0 * double(config.vocab + config.context) * double(config.width));
  remat::nn::GPT<float> gpt(config);
  for (const auto& [name, p] : gpt.named_parameters()) {
    const std::string key = "model." + name;
    if (!file.contains(key))
      throw remat::IoError(remat::detail::cat(kProgram, ": ", path, " has no tensor '", key, "'"));
    if (!(file.entry(key).shape == p.shape())) {
      throw remat::IoError(remat::detail::cat(kProgram, ": tensor '", key, "' in ", path,
                                              " has shape ", file.entry(key).shape,
                                              " but the model expects ", p.shape()));
    }
    remat::Parameter<float>(p).data() = file.tensor<float>(key);
  }
  return gpt;
}

/// How the blocks' linears are stored for this run: --full trains them in float.
remat::hub::LoadOptions load_options(const Options& o) {
  return {.projections = o.full ? remat::WeightStorage::f32 : storage_of(o.storage),
          .double_quant = !o.no_double_quant};
}

/// A train_llama --save-hf folder: the model, its linears read into --storage, and the
/// vocabulary its remat_eval.json lists.
remat::nn::Llama<float> load_char_llama(const std::string& dir, const Options& o,
                                        std::string& vocab) {
  const std::string eval_path = dir + "/remat_eval.json";
  vocab = corpus::read_saved_vocab(dir, kProgram);
  remat::nn::Llama<float> model = remat::hub::load_llama<float>(dir, load_options(o));
  if (model.config().vocab_size != static_cast<std::int64_t>(vocab.size())) {
    throw remat::IoError(remat::detail::cat(kProgram, ": ", dir, "/config.json has vocab_size ",
                                            model.config().vocab_size, " but ", eval_path,
                                            " lists ", vocab.size(), " characters"));
  }
  return model;
}

std::int64_t context_of(const remat::nn::GPT<float>& m) { return m.config().context; }
std::int64_t context_of(const remat::nn::Llama<float>& m) {
  return m.config().max_position_embeddings;
}
std::int64_t layers_of(const remat::nn::GPT<float>& m) { return m.config().layers; }
std::int64_t layers_of(const remat::nn::Llama<float>& m) { return m.config().num_hidden_layers; }
std::int64_t vocab_of(const remat::nn::GPT<float>& m) { return m.config().vocab; }
std::int64_t vocab_of(const remat::nn::Llama<float>& m) { return m.config().vocab_size; }
std::int64_t width_of(const remat::nn::GPT<float>& m) { return m.config().width; }
std::int64_t width_of(const remat::nn::Llama<float>& m) { return m.config().hidden_size; }
std::vector<std::string> linears_of(const remat::nn::GPT<float>&) { return {"qkv", "proj", "fc"}; }
std::vector<std::string> linears_of(const remat::nn::Llama<float>&) {
  return auto_settings::llama_linears();
}
const remat::nn::GPTConfig& config_of(const remat::nn::GPT<float>& m) { return m.config(); }
const remat::nn::LlamaConfig& config_of(const remat::nn::Llama<float>& m) { return m.config(); }

/// A text in the base model's characters, in windows of --context characters at random
/// offsets: every batch has the same shape and counts every target.
class CharSource {
 public:
  CharSource(corpus::Corpus c, const Options& o)
      : corpus_(std::move(c)),
        rows_(o.batch),
        columns_(o.context),
        seed_(o.seed),
        data_rng_(o.seed * 7919 + 1) {}

  std::string describe() const {
    return remat::detail::cat(corpus_.train.size() + corpus_.val.size(), " characters of text");
  }
  std::int64_t rows() const { return rows_; }
  /// The most columns a batch has (every batch has them here).
  std::int64_t max_columns() const { return columns_; }
  chat::Batch next() { return window_batch(corpus_.train, data_rng_); }
  std::vector<chat::Batch> validation(std::int64_t count) const {
    remat::Rng val_rng(seed_ * 104729 + 3);
    std::vector<chat::Batch> val;
    for (std::int64_t i = 0; i < count; ++i) val.push_back(window_batch(corpus_.val, val_rng));
    return val;
  }
  /// `count` characters after the validation text's first 16 (none when count is 0), sampled.
  template <class Model>
  std::string sample(const Model& model, std::int64_t count) const {
    if (count == 0) return {};
    remat::Rng sample_rng(seed_ + 99);
    const std::vector<std::int32_t> prompt(corpus_.val.begin(), corpus_.val.begin() + 16);
    std::string text;
    for (std::int32_t id : prompt) text.push_back(corpus_.vocab[id]);
    return text + corpus::generate(model, corpus_, prompt, count, context_of(model),
                                   vocab_of(model), sample_rng);
  }
  bool samples_before() const { return false; }

 private:
  chat::Batch window_batch(const std::vector<std::int32_t>& ids, remat::Rng& rng) const {
    chat::Batch b;
    corpus::fill_batch(ids, rows_, columns_, rng, b.ids, b.targets, kProgram);
    b.counted = b.tokens = rows_ * columns_;
    return b;
  }
  corpus::Corpus corpus_;
  std::int64_t rows_, columns_;
  std::uint64_t seed_;
  remat::Rng data_rng_;
};

/// A Hugging Face folder's data: examples made of conversations or documents in a new order each
/// epoch; a batch is --batch rows, one example a row padded to the longest of them, or (--pack)
/// examples packed into rows of --max-tokens - 1 positions.
class HubSource {
 public:
  HubSource(const remat::hub::Tokenizer& tok, chat::Data data, std::size_t max_tokens,
            const Options& o)
      : tok_(tok),
        data_(std::move(data)),
        rows_(static_cast<std::size_t>(o.batch)),
        examples_per_step_(static_cast<std::size_t>(o.batch * o.accumulate)),
        packed_columns_(o.pack ? max_tokens - 1 : 0),
        sampler_(data_.train.size(), o.seed * 7919 + 1),
        prompt_(o.prompt),
        sample_tokens_(o.sample > 0 ? o.sample : 48) {
    if (!o.pack && rows_ > data_.train.size()) {
      throw remat::ArgumentError(remat::detail::cat(kProgram, ": --batch ", o.batch,
                                                    " is more than the ", data_.train.size(),
                                                    " training examples of ", o.data));
    }
    // a packed batch larger than an epoch would hold examples twice (TRL packs each once)
    if (o.pack) {
      const std::size_t epoch_rows = remat::hub::packed_rows(data_.train, packed_columns_);
      if (rows_ > epoch_rows)
        throw remat::ArgumentError(remat::detail::cat(
            kProgram, ": --batch ", o.batch, " with --pack is more than the ", epoch_rows,
            " rows of ", packed_columns_, " positions the training examples of ", o.data, " fill"));
    }
  }

  std::string describe() const {
    return remat::detail::cat(data_.train.size(), " training and ", data_.val.size(),
                              " validation examples (", data_.report, ")",
                              packed_columns_ ? "; packed" : "");
  }
  std::int64_t rows() const { return static_cast<std::int64_t>(rows_); }
  std::int64_t max_columns() const {
    return static_cast<std::int64_t>(packed_columns_ ? packed_columns_ : data_.longest - 1);
  }
  chat::Batch next() {
    if (!packed_columns_) return chat::make_batch(data_.train, sampler_.next(rows_), data_.pad);
    return chat::pack_batch(data_.train, rows_, packed_columns_, data_.pad, pending_,
                            [&] { return sampler_.next(1)[0]; });
  }
  /// The validation examples of `count` optimizer steps (--batch x --accumulate each, the first
  /// ones in order), in batches of --batch rows: the same examples whether packed or not, and
  /// for --batch 2 as for --batch 1 --accumulate 2.
  std::vector<chat::Batch> validation(std::int64_t count) const {
    return chat::validation_batches(data_, static_cast<std::size_t>(count) * examples_per_step_,
                                    rows_, packed_columns_);
  }
  /// The model's greedy answer to --prompt (empty without one).
  template <class Model>
  std::string sample(Model& model, std::int64_t) const {
    if (prompt_.empty()) return {};
    remat::nn::GenerateOptions g{.max_new_tokens = sample_tokens_};
    if (const std::optional<std::int32_t> eos = tok_.eos_id()) g.eos_ids.push_back(*eos);
    model.eval();
    const remat::nn::Generated out =
        remat::nn::generate(model, chat::prompt_ids(tok_, data_, prompt_), g);
    model.train();
    return prompt_ + " -> " + tok_.decode(out.ids);
  }
  bool samples_before() const { return !prompt_.empty(); }
  double epochs() const { return sampler_.epochs(); }

 private:
  const remat::hub::Tokenizer& tok_;
  chat::Data data_;
  std::size_t rows_, examples_per_step_, packed_columns_;  // packed_columns_: 0 unless --pack
  chat::Sampler sampler_;
  std::optional<std::size_t> pending_;  // the example the last packed batch had no room for
  std::string prompt_;
  std::int64_t sample_tokens_;
};

/// The memory split, in bytes.
struct Split {
  double weights = 0, adapters = 0, gradients = 0, optimizer = 0, activations = 0, logits = 0,
         total = 0;
  std::int64_t parameter_count = 0;  // the base model's (estimated)
};

/// The counted peak of the loss head alone (logits, or the chunked loss's chunk, and their
/// gradients) on a (rows, C) input, above that input.
template <class Model>
double head_peak(const Model& model, std::int64_t rows, std::int64_t chunk_rows) {
  const remat::Tensor<float> h = remat::Tensor<float>::zeros({rows, width_of(model)});
  const remat::Tensor<std::int32_t> targets = remat::Tensor<std::int32_t>::zeros({rows});
  remat::Tape tape;
  const remat::Var<float> x = tape.input(h, true);
  remat::memory::Probe probe;
  tape.backward(remat::linear_cross_entropy(x, model.head_weight(), targets, chunk_rows));
  return double(probe.peak_above_start());
}

std::string split_json(const Split& s) {
  const auto mb = [](double b) { return b / (1024.0 * 1024.0); };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"weights\": %.4f, \"adapters\": %.4f, \"gradients\": %.4f, \"optimizer\": %.4f, "
                "\"activations\": %.4f, "
                "\"logits\": %.4f, \"total\": %.4f}",
                mb(s.weights), mb(s.adapters), mb(s.gradients), mb(s.optimizer), mb(s.activations),
                mb(s.logits), mb(s.total));
  return buf;
}

/// The estimate's split for a step of `rows` x `columns` tokens under `plan`.
/// The step of `rows` x `columns` tokens the flags describe, as the estimate takes it.
remat::train::StepShape step_shape(const Options& o, const std::vector<std::string>& targets,
                                   std::int64_t rows, std::int64_t columns) {
  remat::train::StepShape shape{
      .batch = rows,
      .time = columns,
      .loss_chunk_rows = o.loss_chunk_rows,
      .packed = o.pack,
      .accumulation = o.accumulate,
      .storage = o.full ? remat::WeightStorage::f32 : storage_of(o.storage),
      .double_quant = !o.no_double_quant,
      .precision = remat::parse_precision(o.dtype, "--dtype")};
  if (!o.full) shape.lora = {.rank = o.rank, .targets = targets, .dropout = o.lora_dropout};
  return shape;
}

/// The plan --checkpoint names for a step of rows x columns. policy:<policy> and budget:<MiB> are
/// made on the chain of a shape-only step of that shape (the estimate's) rather than profiled on
/// the weights: a budget plan's planner then weighs replays by their FLOPs, not measured times,
/// so that --auto and will_it_fit, which never read the weights, price the very plan this run
/// makes (auto_settings.hpp), and the figures it prints are the estimate's.
template <class Model>
remat::plan::Plan priced_plan(const Model& model, const Options& o,
                              const std::vector<std::string>& targets, std::int64_t rows,
                              std::int64_t columns) {
  const std::optional<remat::SavePolicy> policy = corpus::checkpoint_policy(o.checkpoint);
  if (!policy && o.checkpoint.rfind("budget:", 0) != 0)
    return corpus::smallest_plan(o.checkpoint, layers_of(model), kProgram);  // none, every, sqrt
  remat::train::StepShape shape = step_shape(o, targets, rows, columns);
  if (policy) shape.policies = {*policy};
  const remat::plan::Chain chain =
      remat::train::estimate_memory<float>(config_of(model), shape).chain;
  if (policy)
    return remat::plan::custom(chain, corpus::policy_plan(*policy, layers_of(model)).segments);
  return remat::plan::budget(chain, corpus::budget_mib(o.checkpoint, kProgram) * (1 << 20));
}

template <class Model>
Split estimated_split(const Model& model, const Options& o, const std::vector<std::string>& targets,
                      std::int64_t rows, std::int64_t columns, const remat::plan::Plan& plan) {
  const remat::train::MemoryEstimate e =
      remat::train::estimate_memory<float>(config_of(model), step_shape(o, targets, rows, columns));
  Split s;
  s.parameter_count = e.parameter_count;
  s.weights = e.parameters;
  s.adapters = e.adapters;
  s.gradients = e.gradients;
  s.optimizer = e.optimizer_state;
  // The head alone (Note [fused loss head] in ops/loss.hpp). Frozen: its input's unit gradient
  // beside the tile in forward, or beside the input's gradient in backward; trained (--full): a
  // log-sum-exp a row beside the tile and the input's gradient in backward.
  const double tokens = double(rows * columns), input = tokens * double(width_of(model)) * 4;
  s.logits = o.full ? tokens * sizeof(float) + e.chain.loss_backward_transient_bytes
                    : std::max(e.chain.loss_forward_transient_bytes,
                               input + e.chain.loss_backward_transient_bytes);
  s.total = e.total(plan);
  s.activations = s.total - s.weights - s.adapters - s.gradients - s.optimizer - s.logits;
  return s;
}

const std::pair<const char*, double Split::*> kSplitRows[] = {
    {"weights", &Split::weights},
    {"adapters", &Split::adapters},
    {"gradients", &Split::gradients},
    {"optimizer state", &Split::optimizer},
    {"activations", &Split::activations},
    {"logits", &Split::logits},
    {"total", &Split::total}};

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

double sum_of(const std::vector<double>& v) {
  double total = 0;
  for (double x : v) total += x;
  return total;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? 0
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// The process's peak resident memory so far (getrusage), in bytes.
double peak_resident_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) * 1024.0;  // KiB on Linux
}

/// The loss options of batch `b` (a Llama takes packed rows' starts; a GPT never has them).
remat::nn::LossOptions loss_options(const remat::nn::Llama<float>&, const chat::Batch& b,
                                    std::int64_t chunk_rows,
                                    const remat::plan::Plan* plan = nullptr) {
  return {.plan = plan, .chunk_rows = chunk_rows, .starts = b.starts};
}
remat::nn::LossOptions loss_options(const remat::nn::GPT<float>&, const chat::Batch&,
                                    std::int64_t chunk_rows,
                                    const remat::plan::Plan* plan = nullptr) {
  return {.plan = plan, .chunk_rows = chunk_rows};
}

/// The loss of batch `b`.
template <class Model>
remat::Var<float> batch_loss(const Model& model, const chat::Batch& b, std::int64_t chunk_rows,
                             const remat::plan::Plan* plan = nullptr) {
  return model.loss(b.ids, b.targets, loss_options(model, b, chunk_rows, plan));
}

/// The mean loss over `val` (weighted by the targets each batch counts), in evaluation mode and
/// without a tape.
template <class Model>
double mean_loss(Model& model, const std::vector<chat::Batch>& val, std::int64_t chunk_rows) {
  remat::NoGradGuard no_grad;
  model.eval();
  double total = 0, counted = 0;
  for (const chat::Batch& b : val) {
    total += double(batch_loss(model, b, chunk_rows).item()) * double(b.counted);
    counted += double(b.counted);
  }
  model.train();
  return counted > 0 ? total / counted : 0.0;
}

/// What --save-every writes into the --save-adapters folder beside the adapters, and --resume
/// reads: the adapters' values, AdamW's state, the step, and the settings the run's course
/// depends on.
constexpr const char* kTrainingState = "training_state.safetensors";

/// The flags a run's course depends on, with their values: a resumed run must give the same, or
/// it would continue another run than the one saved.
std::vector<std::pair<std::string, std::string>> course_settings(const Options& o) {
  const auto yes = [](bool b) { return std::string(b ? "yes" : "no"); };
  return {{"--base", o.base},
          {"--data", o.data},
          {"--storage", o.storage},
          {"--no-double-quant", yes(o.no_double_quant)},
          {"--rank", std::to_string(o.rank)},
          {"--alpha", flags::exact_text(o.alpha)},
          {"--lora-dropout", flags::exact_text(o.lora_dropout)},
          {"--targets", o.targets},
          {"--context", std::to_string(o.context)},
          {"--batch", std::to_string(o.batch)},
          {"--accumulate", std::to_string(o.accumulate)},
          {"--steps", std::to_string(o.steps)},
          {"--lr", flags::exact_text(o.lr)},
          {"--seed", std::to_string(o.seed)},
          {"--max-tokens", std::to_string(o.max_tokens)},
          {"--truncate", o.truncate},
          {"--train-on", o.train_on},
          {"--skip-bad", yes(o.skip_bad)},
          {"--pack", yes(o.pack)},
          {"--loss-chunk-rows", std::to_string(o.loss_chunk_rows)},
          {"--dtype", remat::to_string(remat::parse_precision(o.dtype, "--dtype"))},
          {"--chat-date", o.chat_date}};
}

/// Saves the adapters (PEFT's files) and the training state after `steps_done` steps into
/// --save-adapters as one whole: a kill mid-save leaves the previous save, both files of it.
void save_with_state(const Options& o, const remat::nn::lora::Adapters<float>& adapters,
                     const remat::optim::AdamW<float>& optimizer, std::int64_t steps_done,
                     double first_val) {
  remat::io::Metadata meta{{"finetune.step", std::to_string(steps_done)},
                           {"finetune.first_val_loss", flags::exact_text(first_val)},
                           {"finetune.threads", std::to_string(remat::num_threads())}};
  for (const auto& [flag, value] : course_settings(o)) meta.emplace("finetune" + flag, value);
  remat::io::save_folder(o.save_adapters, [&](const std::string& staging) {
    remat::hub::write_adapters(adapters, staging);
    remat::train::save_training_state(staging + "/" + kTrainingState, adapters, optimizer, meta);
  });
}

/// The training state's file in the folder --resume names.
std::string state_path(const Options& o) {
  const std::string path = (std::filesystem::path(o.resume) / kTrainingState).string();
  if (!std::filesystem::exists(path)) {
    throw remat::IoError(remat::detail::cat(kProgram, ": --resume ", o.resume, " holds no ",
                                            kTrainingState, " (written by --save-every)"));
  }
  return path;
}

/// Says so when the saved run ran on another number of threads: a float GEMM's sums may be
/// grouped otherwise, so the continuation can differ in the last bits from the run that was
/// stopped. Not an error: a run may well be resumed on another machine.
void note_thread_change(const remat::io::Metadata& meta, const std::string& path) {
  const auto it = meta.find("finetune.threads");
  const std::string now = std::to_string(remat::num_threads());
  if (it == meta.end() || it->second == now) return;
  std::fprintf(stderr,
               "%s: note: %s was saved by a run on %s threads and this one runs on %s: the "
               "continuation may differ from an uninterrupted run in its last bits\n",
               kProgram, path.c_str(), it->second.c_str(), now.c_str());
}

/// The state --resume names, checked against this run's settings, loaded into the adapters and
/// the optimizer; returns the file's metadata.
remat::io::Metadata load_state(const Options& o, remat::nn::lora::Adapters<float>& adapters,
                               remat::optim::AdamW<float>& optimizer) {
  const std::string path = state_path(o);
  const remat::io::Metadata meta = remat::io::File::read(path).metadata();
  // flags added after saves were made: such a save ran with their default (--dtype and
  // --chat-date were flags or defaults before they were recorded, so a save without them may
  // have run with either: not checked)
  const std::map<std::string, std::string> added_later{{"--loss-chunk-rows", "0"}};
  const std::set<std::string> recorded_later{"--dtype", "--chat-date"};
  for (const auto& [flag, value] : course_settings(o)) {
    const auto it = meta.find("finetune" + flag);
    const auto later = added_later.find(flag);
    if (it == meta.end() && later != added_later.end() && later->second == value) continue;
    if (it == meta.end() && recorded_later.count(flag)) continue;
    if (it == meta.end() || it->second != value) {
      throw remat::ArgumentError(remat::detail::cat(
          kProgram, ": ", path, " was saved by a run with ", flag, " ",
          it == meta.end() ? std::string("(not recorded)") : "'" + it->second + "'",
          "; resume it with the same (this run has '", value, "')"));
    }
  }
  note_thread_change(meta, path);
  remat::train::load_training_state(path, adapters, optimizer);
  return meta;
}

template <class Model, class Source>
int run(Model& model, Source& source, const Options& o, std::size_t live0) {
  const std::vector<std::string> targets = o.targets.empty() ? linears_of(model) : split(o.targets);
  const std::int64_t rows = source.rows(), longest = source.max_columns();
  // the adapters (rank x (in + out) values per linear, with gradients and AdamW moments) and a
  // batch's activations, bounded below before the estimate prices them exactly
  flags::fits(
      kProgram, "this run",
      16.0 * double(o.rank) * 2 * double(width_of(model)) * double(layers_of(model)) *
              double(targets.size()) +
          4.0 * double(rows) * double(longest) * double(width_of(model)) *
              double(layers_of(model)) +
          8.0 * double(o.eval_batches) * double(o.accumulate) * double(rows) * double(longest));
  // Weights as stored (read into --storage by the loader, or quantized after a GPT's loading);
  // lora::apply freezes them all.
  Split counted;
  counted.weights = double(remat::memory::live_bytes() - live0);
  std::optional<remat::nn::lora::Adapters<float>> adapters;
  if (!o.full) {
    adapters.emplace(remat::nn::lora::apply(model, {.rank = o.rank,
                                                    .alpha = o.alpha,
                                                    .dropout = o.lora_dropout,
                                                    .targets = targets,
                                                    .seed = o.seed,
                                                    .base_model_name_or_path = o.base}));
  }
  counted.adapters = double(remat::memory::live_bytes() - live0) - counted.weights;

  remat::optim::AdamW<float> optimizer =
      o.full ? remat::optim::AdamW<float>(
                   remat::optim::param_groups(
                       model.named_parameters(),
                       {.weight_decay = 0.1, .no_decay = remat::optim::biases_norms_embeddings}),
                   {.lr = o.lr})
             : remat::optim::AdamW<float>(adapters->parameters(), {.lr = o.lr, .weight_decay = 0});
  const remat::optim::CosineSchedule schedule(o.lr, std::max<std::int64_t>(1, o.steps / 20),
                                              o.steps, o.lr / 10);
  // A resumed run: the adapters and AdamW's moments as saved (the moments counted here, as the
  // first step would), and the data drawn up to the saved step, so that it goes on exactly.
  const std::int64_t end = flags::end_step(kProgram, o.steps, o.stop_after);
  std::int64_t start = 0;
  std::optional<double> saved_first_val;
  if (!o.resume.empty()) {
    const double before = double(remat::memory::live_bytes());
    const remat::io::Metadata meta = load_state(o, *adapters, optimizer);
    counted.optimizer = double(remat::memory::live_bytes()) - before;
    start = corpus::metadata_integer(meta, "finetune.step", o.resume, kProgram);
    saved_first_val = corpus::metadata_number(meta, "finetune.first_val_loss", o.resume, kProgram);
    flags::check_resume_step(kProgram, o.resume, start, o.steps, o.stop_after);
    if (start == end) {
      throw remat::ArgumentError(remat::detail::cat(
          kProgram, ": ", o.resume, " was saved after step ", start, ", the last this run has"));
    }
    for (std::int64_t i = 0; i < start * o.accumulate; ++i) (void)source.next();
  }

  // The estimate, from the configuration alone, for the largest batch the data can make;
  // what the step and the validation batches need must fit before they are allocated.
  const remat::plan::Plan smallest =
      corpus::smallest_plan(o.checkpoint, layers_of(model), kProgram);
  flags::fits(
      kProgram, "this run",
      estimated_split(model, o, targets, rows, longest, smallest).total +
          8.0 * double(o.eval_batches) * double(o.accumulate) * double(rows) * double(longest));
  const std::vector<chat::Batch> val = source.validation(o.eval_batches);
  double val_bytes = 0;  // held through the run, but no part of a training step
  for (const chat::Batch& b : val) {
    val_bytes += double(b.ids.bytes() + b.targets.bytes());
    if (b.starts.defined()) val_bytes += double(b.starts.bytes());
  }
  const remat::plan::Plan plan = priced_plan(model, o, targets, rows, longest);
  const Split planned = estimated_split(model, o, targets, rows, longest, plan);

  const double first_val =
      saved_first_val ? *saved_first_val : mean_loss(model, val, o.loss_chunk_rows);
  double last_val = first_val;
  std::string sample_before;
  if (source.samples_before() && !o.json && start == 0)
    sample_before = source.sample(model, o.sample);
  if (!o.json) {
    std::printf(
        "%s\nbase: %lld parameters, blocks' linears stored as %s; %s; checkpoint %s (%s)\n",
        source.describe().c_str(), static_cast<long long>(planned.parameter_count),
        remat::to_string(load_options(o).projections),
        o.full ? "full fine-tuning"
               : remat::detail::cat("LoRA rank ", o.rank, " on ", targets.size(), " linear names, ",
                                    adapters->parameter_count(), " adapter parameters")
                     .c_str(),
        o.checkpoint.c_str(), plan.describe().c_str());
    std::printf("estimated memory of a step of %lld x %lld tokens (MiB):",
                static_cast<long long>(rows), static_cast<long long>(longest));
    for (const auto& [name, field] : kSplitRows)
      std::printf(" %s %.1f;", name, mib(planned.*field));
    std::printf("\n");
    if (!sample_before.empty()) std::printf("before: %s\n", sample_before.c_str());
    if (start > 0)
      std::printf("resumed after step %lld of %s\n", (long long)start, o.resume.c_str());
    std::printf("step %5d  val loss %.4f\n", 0, first_val);
  }

  // the allocator's peak of live bytes through loading, the set-up and the steps (each step
  // resets the peak to measure itself)
  double live_peak = double(remat::memory::peak_bytes());
  double held_peak = double(remat::memory::peak_held_bytes());  // live + the cache's
  double step_peak = 0;           // the largest counted peak of a whole step after the first
  std::int64_t peak_columns = 0;  // the longest micro-batch of that step
  double tokens = 0;              // positions trained on, padding left out
  const auto now = [] { return std::chrono::steady_clock::now(); };
  const auto t0 = now();
  std::vector<double> step_seconds;  // each step's, validation left out
  for (std::int64_t step = start; step < end; ++step) {
    const auto step_start = now();
    optimizer.set_lr(schedule(step));
    std::optional<remat::Trace> trace;
    if (!o.trace.empty() && step == std::min<std::int64_t>(1, o.steps - 1)) trace.emplace();
    remat::memory::reset_peak();
    std::vector<chat::Batch> micro(static_cast<std::size_t>(o.accumulate));
    std::int64_t step_counted = 0, step_columns = 0;
    for (chat::Batch& b : micro) {
      b = source.next();
      step_counted += b.counted;
      step_columns = std::max(step_columns, b.ids.dim(1));
    }
    float loss = 0;
    for (std::size_t k = 0; k < micro.size(); ++k) {
      remat::Tape tape(remat::TapeOptions{
          .seed = remat::detail::mix64(
              o.seed ^ remat::detail::mix64(std::uint64_t(step * o.accumulate) + k))});
      const remat::Var<float> l = batch_loss(model, micro[k], o.loss_chunk_rows, &plan);
      // the step's loss is the mean over its counted targets: each micro-batch's mean weighted
      // by its share of them
      const float share =
          step_counted > 0 ? float(double(micro[k].counted) / double(step_counted)) : 0.0f;
      tape.backward(micro.size() > 1 ? l * share : l);
      loss += l.item() * share;
      tokens += double(micro[k].tokens);
    }
    if (step == start) {
      for (const auto& p : model.parameters()) {
        if (!p.frozen() && p.grad().defined()) counted.gradients += double(p.grad().bytes());
      }
    }
    remat::optim::clip_grad_norm(o.full ? model.parameters() : adapters->parameters(), 1.0);
    const double before_step = double(remat::memory::live_bytes());
    optimizer.step();
    if (step == 0) counted.optimizer = double(remat::memory::live_bytes()) - before_step;
    optimizer.zero_grad();
    live_peak = std::max(live_peak, double(remat::memory::peak_bytes()));
    held_peak = std::max(held_peak, double(remat::memory::peak_held_bytes()));
    const double peak = double(remat::memory::peak_bytes() - live0) - val_bytes;
    if ((step > start || end - start == 1) && peak > step_peak) {
      step_peak = peak;
      peak_columns = step_columns;
    }
    if (trace) {
      trace->stop();
      trace->save_chrome_json(o.trace);
    }
    if (o.save_every > 0 && ((step + 1) % o.save_every == 0 || step + 1 == end) && adapters)
      save_with_state(o, *adapters, optimizer, step + 1, first_val);
    const bool evaluate = (step + 1) % o.eval_every == 0 || step + 1 == end;
    step_seconds.push_back(std::chrono::duration<double>(now() - step_start).count());
    if (evaluate) last_val = mean_loss(model, val, o.loss_chunk_rows);
    if (!o.json && evaluate) {
      const double elapsed = std::chrono::duration<double>(now() - t0).count();
      std::printf(
          "step %5lld  loss %.4f  val loss %.4f  %.0f tokens/s  %s left\n",
          static_cast<long long>(step + 1), loss, last_val, tokens / sum_of(step_seconds),
          corpus::format_duration(elapsed / double(step + 1 - start) * double(end - step - 1))
              .c_str());
      std::fflush(stdout);
    }
  }
  const double seconds = std::chrono::duration<double>(now() - t0).count();
  // tokens/s of training alone; the median step leaves the first out (it allocates the
  // gradients and moments) when there are others
  const double train_seconds = sum_of(step_seconds);
  const double median_step = median_of(
      step_seconds.size() > 1 ? std::vector<double>(step_seconds.begin() + 1, step_seconds.end())
                              : step_seconds);

  // The split: bytes live before the model was loaded and the validation batches are left out;
  // the estimate for the shape of the step that reached the peak.
  counted.total = step_peak;
  counted.logits = head_peak(model, rows * peak_columns, o.loss_chunk_rows);
  counted.activations = counted.total - counted.weights - counted.adapters - counted.gradients -
                        counted.optimizer - counted.logits;
  const Split estimated = estimated_split(model, o, targets, rows, peak_columns, plan);

  // (with --save-every, the last step saved them with the training state)
  if (!o.save_adapters.empty() && adapters && o.save_every == 0)
    remat::hub::save_adapters(*adapters, o.save_adapters);
  const std::string sample_after = o.json ? std::string() : source.sample(model, o.sample);
  if (!sample_after.empty()) {
    std::printf("\n--- sample ---\n%s%s\n--------------\n",
                source.samples_before() ? "after: " : "", sample_after.c_str());
  }
  // the process: its peak resident memory, the allocator's peak of live tensor bytes (all of
  // them, the validation batches and what was live before loading included), its peak of live
  // bytes plus the freed buffers it kept for reuse (core/memory.hpp bounds them), and
  // what the cache holds at the end
  const double rss = peak_resident_bytes(), live = live_peak,
               cached = double(remat::memory::cached_bytes());
  if (o.json) {
    std::printf(
        "{\"first_val_loss\": %.17g, \"final_val_loss\": %.17g, \"seconds\": %.2f, "
        "\"tokens_per_second\": %.1f, \"median_step_seconds\": %.3f, \"peak_resident_mb\": "
        "%.1f, \"peak_live_mb\": %.1f, \"peak_held_mb\": %.1f, \"cached_mb\": %.1f, "
        "\"counted_mb\": %s, \"estimated_mb\": %s}\n",
        first_val, last_val, seconds, tokens / train_seconds, median_step, mib(rss), mib(live),
        mib(held_peak), mib(cached), split_json(counted).c_str(), split_json(estimated).c_str());
    return 0;
  }
  std::printf(
      "\nvalidation loss %.4f -> %.4f in %.1f s (training %.0f tokens/s, median step %.2f s)\n\n"
      "memory of a step of %lld x %lld tokens (MiB)   counted   estimated\n",
      first_val, last_val, seconds, tokens / train_seconds, median_step,
      static_cast<long long>(rows), static_cast<long long>(peak_columns));
  for (const auto& [name, field] : kSplitRows)
    std::printf("  %-20s %10.3f %11.3f\n", name, mib(counted.*field), mib(estimated.*field));
  std::printf(
      "process: peak resident %.1f MiB; allocator: peak live %.1f MiB, peak live + cached "
      "%.1f MiB, cache of freed buffers %.1f MiB at the end\n",
      mib(rss), mib(live), mib(held_peak), mib(cached));
  if (!o.save_adapters.empty() && adapters)
    std::printf("adapters saved in %s\n", o.save_adapters.c_str());
  return 0;
}

/// Refuses the flags that do not apply to the kind of --base given.
void check_flags_apply(const Options& o, bool hub) {
  if (hub && o.context_given) {
    throw remat::ArgumentError(remat::detail::cat(
        kProgram, ": --context is for a train_llama/train_gpt model's text; ", o.base,
        " is a Hugging Face folder, whose examples are limited by --max-tokens"));
  }
  if (!hub && !o.hub_flags_given.empty()) {
    throw remat::ArgumentError(remat::detail::cat(
        kProgram, ": ", o.hub_flags_given.front(), " is for a Hugging Face folder's data; ", o.base,
        " is a train_llama/train_gpt model (fine-tuned on text in its characters)"));
  }
}

/// What --auto decides for, from the flags and the folder's config.json.
auto_settings::Request auto_request(const Options& o) {
  auto_settings::Request r{
      .model = remat::hub::load_llama_config(o.base + "/config.json"),
      .storage = storage_of(o.storage),
      .double_quant = !o.no_double_quant,
      .precision = remat::parse_precision(o.dtype, "--dtype"),
      .rank = o.rank,
      .targets = o.targets.empty() ? auto_settings::llama_linears() : split(o.targets),
      .dropout = o.lora_dropout,
      .pack = o.pack,
      .max_tokens = static_cast<std::size_t>(o.max_tokens)};
  auto_settings::set_memory(r, o.memory_gib);
  if (o.batch_given) r.batch = o.batch;
  if (o.accumulate_given) r.accumulate = o.accumulate;
  if (o.steps_given) r.steps = o.steps;
  if (o.lr_given) r.lr = o.lr;
  if (o.checkpoint_given) r.checkpoint = o.checkpoint;
  if (o.loss_chunk_rows_given) r.loss_chunk_rows = o.loss_chunk_rows;
  return r;
}

/// The date a resumed run's template wrote (empty: none, or a save from before it was recorded):
/// a Llama 3.2 run resumed on another day renders its conversations as it did.
std::string saved_chat_date(const Options& o) {
  const remat::io::Metadata meta = remat::io::File::read(state_path(o)).metadata();
  const auto it = meta.find("finetune--chat-date");
  return it == meta.end() ? std::string() : it->second;
}

/// The date the data's template wrote in its system blocks (empty: none).
std::string date_written(const chat::Data& d) { return d.chat ? d.chat->date_string : ""; }

/// A Hugging Face folder: its tokenizer, the model read into --storage, the data; with --auto,
/// the data and the settings first (auto_settings.hpp), the weights read after.
int run_hub(Options& o, std::size_t live0) {
  const remat::hub::Tokenizer tok = remat::hub::Tokenizer::from_folder(o.base);
  if (!o.data_given) {
    throw remat::ArgumentError(remat::detail::cat(
        kProgram, ": a Hugging Face folder needs --data FILE.jsonl (conversations) or FILE.txt"));
  }
  const auto context = static_cast<std::size_t>(
      remat::hub::load_llama_config(o.base + "/config.json").max_position_embeddings);
  chat::DataOptions data{
      .path = o.data,
      .max_tokens = o.max_tokens > 0 ? static_cast<std::size_t>(o.max_tokens)
                                     : std::min<std::size_t>(1024, context),
      .truncate =
          o.truncate == "exclude" ? remat::hub::Truncate::exclude : remat::hub::Truncate::oldest,
      .train_on = o.train_on == "all" ? remat::hub::TrainOn::all : remat::hub::TrainOn::assistant,
      .skip_bad = o.skip_bad,
      .chat_date = o.chat_date.empty() && !o.resume.empty() ? saved_chat_date(o) : o.chat_date,
      .conversation_flags = o.conversation_flags};
  if (o.auto_settings) {
    auto_settings::Result chosen = auto_settings::decide(tok, o.base, data, auto_request(o));
    for (const std::string& line : chosen.decision.lines) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    data.max_tokens = chosen.decision.max_tokens;
    o.max_tokens = static_cast<std::int64_t>(data.max_tokens);  // as --save-every records it
    o.batch = chosen.decision.batch;
    o.accumulate = chosen.decision.accumulate;
    o.steps = chosen.decision.steps;
    o.lr = chosen.decision.lr;
    o.checkpoint = chosen.decision.checkpoint;
    o.chat_date = date_written(chosen.data);
    remat::nn::Llama<float> model = remat::hub::load_llama<float>(o.base, load_options(o));
    HubSource source(tok, std::move(chosen.data), data.max_tokens, o);
    return run(model, source, o, live0);
  }
  chat::Data examples = chat::load(tok, o.base, data, context);
  o.chat_date = date_written(examples);
  remat::nn::Llama<float> model = remat::hub::load_llama<float>(o.base, load_options(o));
  HubSource source(tok, std::move(examples), data.max_tokens, o);
  return run(model, source, o, live0);
}

/// A train_llama folder or a train_gpt file and a text in its characters.
template <class Model>
int run_char(Model& model, const std::string& vocab, Options& o, std::size_t live0) {
  if (o.context == 0) o.context = context_of(model);
  if (o.context < 2 || o.context > context_of(model)) {
    throw remat::ArgumentError(remat::detail::cat(kProgram, ": --context ", o.context,
                                                  " must be in [2, ", context_of(model),
                                                  "], the base model's context"));
  }
  CharSource source(corpus::Corpus::load(o.data, vocab, kProgram), o);
  return run(model, source, o, live0);
}

}  // namespace

int main(int argc, char** argv) {
  return flags::run_main(kProgram, [&] {
    Options o = parse(argc, argv);
    if (o.threads > 0) remat::set_num_threads(o.threads);
    // everything below computes in --dtype: steps, the plan's profile, evaluation, generation
    const remat::PrecisionGuard precision(remat::parse_precision(o.dtype, "--dtype"));
    const std::size_t live0 = remat::memory::live_bytes();
    const bool folder = std::filesystem::is_directory(o.base);
    // a train_llama folder lists its characters in remat_eval.json; a hub folder has none
    const bool hub = folder && !std::filesystem::exists(o.base + "/remat_eval.json");
    check_flags_apply(o, hub);
    if (hub) return run_hub(o, live0);
    std::string vocab;
    if (folder) {
      remat::nn::Llama<float> model = load_char_llama(o.base, o, vocab);
      return run_char(model, vocab, o, live0);
    }
    remat::nn::GPT<float> model = load_gpt(o.base, vocab);
    if (!o.full && o.storage != "f32")
      remat::nn::quantize_blocks(model, storage_of(o.storage), !o.no_double_quant);
    return run_char(model, vocab, o, live0);
  });
}
