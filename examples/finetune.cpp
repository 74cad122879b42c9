// Fine-tunes a model saved by train_llama (--save-hf DIR) or train_gpt (--save FILE) on a second
// text with LoRA adapters over a frozen, quantized base, under a checkpoint plan, and prints
// where the memory went: each part counted by the library's allocator next to
// nn::estimate_memory's figure for it.
//
//   finetune --base DIR|FILE [--data PATH] [--storage nf4|bf16|int8|f32] [--no-double-quant]
//            [--rank R] [--alpha A] [--lora-dropout P] [--targets a,b,...] [--context T]
//            [--batch B] [--accumulate K] [--steps S] [--lr LR] [--seed N] [--threads N]
//            [--checkpoint none|every|sqrt|budget:<MiB>] [--eval-every N] [--eval-batches N]
//            [--save-adapters DIR] [--full] [--sample N] [--json] [--trace FILE.json]   (--help)
//
// --base is a folder (a Hugging Face Llama folder as train_llama --save-hf writes it, with its
// remat_eval.json vocabulary) or a file (train_gpt --save's weights and metadata). The blocks'
// linear weights are frozen in --storage (NF4 with double quantization by default; f32 only
// freezes them); embeddings, norms and the head stay float and frozen; LoRA adapters of rank
// --rank on --targets (default: every linear of a block) are the only parameters trained, with
// AdamW, no weight decay. --full instead trains every parameter in float without checkpointing
// (AdamW, decay 0.1 except biases, norms and embeddings): the baseline the LoRA run is compared
// with, at the same batch.
//
// Without --data it fine-tunes on examples/data/finetune.txt (original text shipped with remat,
// written in the base corpus' characters). Memory, in the table and the JSON:
//   weights      the base model as stored (counted: live bytes after loading and quantizing)
//   adapters     LoRA's A and B (live bytes lora::apply added)
//   gradients    the trainable parameters' gradient buffers
//   optimizer    AdamW's moments (live bytes the first optimizer step added)
//   logits       the loss head's peak alone: the chunked loss's logits chunk and its gradient
//                (counted on the step's final hidden states)
//   activations  the rest of a step's peak: what the blocks keep, the token ids
//   total        the counted peak of a whole training step (a step after the first)
// With --json the last line is one JSON object: first_val_loss, final_val_loss, seconds, and
// counted_mb / estimated_mb objects with those keys (MiB).
#include <remat/nn/estimate.hpp>
#include <remat/nn/llama_load.hpp>
#include <remat/nn/lora.hpp>
#include <remat/nn/quantize_blocks.hpp>
#include <remat/remat.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "flags.hpp"

#ifndef REMAT_FINETUNE_DATA
#define REMAT_FINETUNE_DATA "examples/data/finetune.txt"
#endif

namespace {

using corpus::Corpus;
constexpr const char* kProgram = "finetune";

struct Options {
  std::string base, data = REMAT_FINETUNE_DATA;
  std::string storage = "nf4";
  bool no_double_quant = false;
  std::int64_t rank = 8;
  double alpha = 16, lora_dropout = 0;
  std::string targets;  // comma-separated; empty: every linear of a block
  std::int64_t context = 0, batch = 8, accumulate = 1, steps = 60;
  double lr = 2e-3;
  std::uint64_t seed = 1;
  int threads = 0;
  std::string checkpoint = "every";
  std::int64_t eval_every = 20, eval_batches = 4, sample = 0;
  std::string save_adapters, trace;
  bool full = false, json = false;
};

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app(
      "Fine-tunes a model saved by train_llama or train_gpt with LoRA over a frozen quantized "
      "base, and prints where\n"
      "the memory went, counted next to the estimate.");
  // checked after parsing rather than ->required(), so that an unknown flag is what gets reported
  app.add_option("--base", o.base,
                 "train_llama --save-hf folder, or train_gpt --save file (required)")
      ->check(flags::input_file_or_dir);
  app.add_option("--data", o.data, "text to fine-tune on (the last tenth is for validation)")
      ->check(flags::input_file)
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
  app.add_option("--context", o.context, "tokens per sequence (0: the base model's context)")
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
                 "checkpoint plan: none, every, sqrt or budget:<MiB> (--full: none)")
      ->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "steps between validation losses")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "validation batches")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--save-adapters", o.save_adapters,
                 "folder for adapter_model.safetensors and adapter_config.json (PEFT's layout)")
      ->check(flags::output_dir);
  app.add_flag("--full", o.full,
               "full fine-tuning in float without checkpointing instead (the baseline)");
  app.add_option("--sample", o.sample, "characters to generate at the end")
      ->check(flags::non_negative)
      ->capture_default_str();
  app.add_flag("--json", o.json,
               "end with one JSON object: losses, seconds, counted_mb and estimated_mb");
  app.add_option("--trace", o.trace,
                 "write a memory timeline (Chrome trace JSON) of the second step")
      ->check(flags::output_file);
  flags::parse(app, argc, argv);
  if (o.base.empty()) {
    std::fprintf(stderr,
                 "finetune: --base is required (a train_llama --save-hf folder or a train_gpt "
                 "--save file); see --help\n");
    std::exit(2);
  }
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

/// A train_llama --save-hf folder: the model, and the vocabulary its remat_eval.json lists.
remat::nn::Llama<float> load_llama(const std::string& dir, std::string& vocab) {
  const std::string eval_path = dir + "/remat_eval.json";
  vocab = corpus::read_saved_vocab(dir, kProgram);
  remat::nn::Llama<float> model = remat::nn::load_llama<float>(dir);
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
  return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
}
const remat::nn::GPTConfig& config_of(const remat::nn::GPT<float>& m) { return m.config(); }
const remat::nn::LlamaConfig& config_of(const remat::nn::Llama<float>& m) { return m.config(); }

/// The memory split, in bytes.
struct Split {
  double weights = 0, adapters = 0, gradients = 0, optimizer = 0, activations = 0, logits = 0,
         total = 0;
};

/// The counted peak of the loss head alone (logits, or the chunked loss's chunk, and their
/// gradients) on a (B T, C) input, above that input.
template <class Model>
double head_peak(const Model& model, std::int64_t rows,
                 const remat::Tensor<std::int32_t>& targets) {
  const remat::Tensor<float> h = remat::Tensor<float>::zeros({rows, width_of(model)});
  const remat::Tensor<std::int32_t> flat = targets.reshape(remat::Shape{targets.numel()});
  remat::Tape tape;
  const remat::Var<float> x = tape.input(h, true);
  remat::memory::Probe probe;
  tape.backward(remat::linear_cross_entropy(x, model.head_weight(), flat));
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

template <class Model>
int run(Model& model, const std::string& vocab, Options& o, std::size_t live0) {
  const Corpus corpus = Corpus::load(o.data, vocab, kProgram);
  if (o.context == 0) o.context = context_of(model);
  if (o.context < 2 || o.context > context_of(model)) {
    throw remat::UsageError(remat::detail::cat(kProgram, ": --context ", o.context,
                                               " must be in [2, ", context_of(model),
                                               "], the base model's context"));
  }
  const remat::WeightStorage storage = o.full ? remat::WeightStorage::f32 : storage_of(o.storage);
  const std::vector<std::string> targets = o.targets.empty() ? linears_of(model) : split(o.targets);
  // the adapters (rank x (in + out) values per linear, with gradients and AdamW moments) and a
  // batch's activations, bounded below before the estimate prices them exactly
  flags::fits(kProgram, "this run",
              16.0 * double(o.rank) * 2 * double(width_of(model)) * double(layers_of(model)) *
                      double(targets.size()) +
                  4.0 * double(o.batch) * double(o.context) * double(width_of(model)) *
                      double(layers_of(model)) +
                  8.0 * double(o.eval_batches) * double(o.batch) * double(o.context));
  // Weights as stored: quantize (f32: only freeze) the blocks' linears.
  Split counted;
  if (!o.full) remat::nn::quantize_blocks(model, storage, !o.no_double_quant);
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

  // The estimate, from the configuration alone.
  remat::nn::StepShape shape{.batch = o.batch,
                             .time = o.context,
                             .accumulation = o.accumulate,
                             .storage = storage,
                             .double_quant = !o.no_double_quant};
  if (!o.full) shape.lora = {.rank = o.rank, .targets = targets};
  const remat::nn::MemoryEstimate e = remat::nn::estimate_memory<float>(config_of(model), shape);
  // what the step and the validation batches need, before they are allocated
  flags::fits(kProgram, "this run",
              e.total(corpus::smallest_plan(o.checkpoint, layers_of(model), kProgram)) +
                  8.0 * double(o.eval_batches) * double(o.batch) * double(o.context));

  remat::Rng data_rng(o.seed * 7919 + 1), val_rng(o.seed * 104729 + 3), plan_rng(o.seed);
  const corpus::Batches val =
      corpus::validation_batches(corpus.val, o.eval_batches, o.batch, o.context, val_rng, kProgram);
  double val_bytes = 0;  // held through the run, but no part of a training step
  for (const auto& [vx, vy] : val) val_bytes += double(vx.bytes() + vy.bytes());
  remat::Tensor<std::int32_t> x, y;
  corpus::fill_batch(corpus.train, o.batch, o.context, plan_rng, x, y, kProgram);
  const remat::plan::Plan plan =
      corpus::make_plan(o.checkpoint, model, layers_of(model), x, y, kProgram);

  const double first_val = corpus::mean_loss(model, val);
  double last_val = first_val;
  if (!o.json) {
    std::printf(
        "%zu characters of text; base: %lld parameters, blocks' linears stored as %s; %s; "
        "checkpoint %s (%s)\n",
        corpus.train.size() + corpus.val.size(), static_cast<long long>(e.parameter_count),
        remat::to_string(storage),
        o.full ? "full fine-tuning"
               : remat::detail::cat("LoRA rank ", o.rank, " on ", targets.size(), " linear names, ",
                                    adapters->parameter_count(), " adapter parameters")
                     .c_str(),
        o.checkpoint.c_str(), plan.describe().c_str());
    std::printf("step %5d  val loss %.4f\n", 0, first_val);
  }

  double step_peak = 0;  // the largest counted peak of a whole step after the first
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; step < o.steps; ++step) {
    optimizer.set_lr(schedule(step));
    std::optional<remat::Trace> trace;
    if (!o.trace.empty() && step == std::min<std::int64_t>(1, o.steps - 1)) trace.emplace();
    remat::memory::reset_peak();
    float loss = 0;
    for (std::int64_t micro = 0; micro < o.accumulate; ++micro) {
      corpus::fill_batch(corpus.train, o.batch, o.context, data_rng, x, y, kProgram);
      remat::Tape tape(remat::TapeOptions{
          .seed = remat::detail::mix64(
              o.seed ^ remat::detail::mix64(std::uint64_t(step * o.accumulate + micro)))});
      const remat::Var<float> l = model.loss(x, y, &plan);
      // a mean over the micro-batches: each one's loss scaled by 1/k (equal sizes)
      tape.backward(o.accumulate > 1 ? l * (1.0f / float(o.accumulate)) : l);
      loss += l.item() / float(o.accumulate);
    }
    if (step == 0) {
      for (const auto& p : model.parameters()) {
        if (!p.frozen() && p.grad().defined()) counted.gradients += double(p.grad().bytes());
      }
    }
    remat::optim::clip_grad_norm(o.full ? model.parameters() : adapters->parameters(), 1.0);
    const double before_step = double(remat::memory::live_bytes());
    optimizer.step();
    if (step == 0) counted.optimizer = double(remat::memory::live_bytes()) - before_step;
    optimizer.zero_grad();
    if (step > 0 || o.steps == 1)
      step_peak = std::max(step_peak, double(remat::memory::peak_bytes() - live0) - val_bytes);
    if (trace) {
      trace->stop();
      trace->save_chrome_json(o.trace);
    }
    const bool evaluate = (step + 1) % o.eval_every == 0 || step + 1 == o.steps;
    if (evaluate) last_val = corpus::mean_loss(model, val);
    if (!o.json && evaluate) {
      std::printf("step %5lld  loss %.4f  val loss %.4f\n", static_cast<long long>(step + 1), loss,
                  last_val);
      std::fflush(stdout);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The split: bytes live before the model was loaded and the validation batches are left out.
  counted.total = step_peak;
  counted.logits = head_peak(model, o.batch * o.context, y);
  counted.activations = counted.total - counted.weights - counted.adapters - counted.gradients -
                        counted.optimizer - counted.logits;
  Split estimated;
  estimated.weights = e.parameters;
  estimated.adapters = e.adapters;
  estimated.gradients = e.gradients;
  estimated.optimizer = e.optimizer_state;
  // the head alone: a log-sum-exp a row, the chunk and the input's gradient
  estimated.logits =
      double(o.batch * o.context) * sizeof(float) + e.chain.loss_backward_transient_bytes;
  estimated.total = e.total(plan);
  estimated.activations = estimated.total - estimated.weights - estimated.adapters -
                          estimated.gradients - estimated.optimizer - estimated.logits;

  if (!o.save_adapters.empty() && adapters) adapters->save_adapters(o.save_adapters);
  if (o.sample > 0 && !o.json) {
    remat::Rng sample_rng(o.seed + 99);
    const std::vector<std::int32_t> prompt(corpus.val.begin(), corpus.val.begin() + 16);
    std::string text;
    for (std::int32_t id : prompt) text.push_back(corpus.vocab[id]);
    const std::string sample = corpus::generate(model, corpus, prompt, o.sample, context_of(model),
                                                vocab_of(model), sample_rng);
    std::printf("\n--- sample ---\n%s%s\n--------------\n", text.c_str(), sample.c_str());
  }
  if (o.json) {
    std::printf(
        "{\"first_val_loss\": %.17g, \"final_val_loss\": %.17g, \"seconds\": %.2f, \"counted_mb\": "
        "%s, \"estimated_mb\": %s}\n",
        first_val, last_val, seconds, split_json(counted).c_str(), split_json(estimated).c_str());
    return 0;
  }
  const auto mib = [](double b) { return b / (1024.0 * 1024.0); };
  std::printf(
      "\nvalidation loss %.4f -> %.4f in %.1f s\n\nmemory of a step (MiB)   counted   estimated\n",
      first_val, last_val, seconds);
  const std::pair<const char*, double Split::*> rows[] = {{"weights", &Split::weights},
                                                          {"adapters", &Split::adapters},
                                                          {"gradients", &Split::gradients},
                                                          {"optimizer state", &Split::optimizer},
                                                          {"activations", &Split::activations},
                                                          {"logits", &Split::logits},
                                                          {"total", &Split::total}};
  for (const auto& [name, field] : rows)
    std::printf("  %-20s %10.3f %11.3f\n", name, mib(counted.*field), mib(estimated.*field));
  if (!o.save_adapters.empty() && adapters)
    std::printf("adapters saved in %s\n", o.save_adapters.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return flags::run_main(kProgram, [&] {
    Options o = parse(argc, argv);
    if (o.threads > 0) remat::set_num_threads(o.threads);
    std::string vocab;
    const std::size_t live0 = remat::memory::live_bytes();
    if (std::filesystem::is_directory(o.base)) {
      remat::nn::Llama<float> model = load_llama(o.base, vocab);
      return run(model, vocab, o, live0);
    }
    remat::nn::GPT<float> model = load_gpt(o.base, vocab);
    return run(model, vocab, o, live0);
  });
}
