// Trains a small character-level Llama-style model (grouped-query attention, RoPE, RMSNorm,
// SwiGLU) on a text file, with any checkpoint plan.
//
//   train_llama [--data PATH] [--layers N] [--width C] [--heads H] [--kv-heads G] [--mlp F]
//               [--context T] [--batch B] [--steps S] [--lr LR] [--seed N] [--threads N]
//               [--dtype f32|bf16]
//               [--checkpoint none|every|sqrt|budget:<MiB>|policy:<policy>] [--eval-every N]
//               [--eval-batches N]
//               [--log FILE.csv] [--save-hf DIR] [--init-from DIR] [--save FILE]
//               [--resume FILE] [--stop-after N] [--sample N] [--json] [--zero]    (--help)
//
// Without --data it trains on examples/data/corpus.txt (original text shipped with remat). It
// prints a live progress line on a terminal (plain lines otherwise) and the validation loss every
// --eval-every steps, writes the loss curve to --log, and at the end prints a generated sample.
// --save-hf DIR writes a Hugging Face-layout folder: config.json, model.safetensors (float32,
// Hugging Face's tensor names) and remat_eval.json (the vocabulary, the validation batches and
// the loss remat computes on them), which tests/reference/score_llama.py scores with an
// independent PyTorch implementation. --init-from DIR continues training from such a folder (or
// any Hugging Face Llama/Qwen2 folder with a character vocabulary of this corpus' size: one
// model.safetensors or an index and shards, F32/BF16/F16): its config.json sets the model's shape
// (the shape flags are ignored), and a vocabulary saved in its remat_eval.json must be the
// corpus'. --save FILE writes the weights, the AdamW state and where the run is (as train_gpt
// --save does); --resume FILE continues from it exactly (bitwise: the same weights and losses as
// a run that never stopped), and --stop-after N stops (and saves) after step N of a run planned
// for --steps. With --json the last line is a JSON object:
// first_val_loss, final_val_loss (all 17 digits), tokens_per_s, act_peak_mb, seconds, steps,
// checkpoint, dtype, world_size. --dtype bf16 trains in BF16 (remat::PrecisionGuard).
//
// Built with MPI, it runs unchanged under `mpirun -np N train_llama ...` (ranks.hpp): --batch
// rows per rank, N ranks train as one process with --batch N x B would (to float rounding), only
// rank 0 evaluates, prints, logs and saves; tokens_per_s counts the whole job. --zero shards the
// AdamW state over the ranks (ZeRO-1): each keeps the moments of 1/N of the parameters.
#include <remat/hub/llama_config.hpp>
#include <remat/hub/llama_load.hpp>
#include <remat/remat.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "ranks.hpp"
#include "training_flags.hpp"

namespace {

struct Options : flags::Training {
  std::int64_t kv_heads = 2, mlp = 512, stop_after = 0;
  std::string save_hf, init_from, save, resume;
  bool zero = false;
};

Options parse(int argc, char** argv) {
  Options o;
  o.layers = 6, o.width = 256, o.steps = 300, o.eval_every = 50;  // train_llama's defaults
  CLI::App app(
      "Trains a small character-level Llama-style model (GQA, RoPE, RMSNorm, SwiGLU) with any "
      "checkpoint plan.");
  flags::add_training_flags(
      app, o, "decoder layers", "query heads (must divide --width into an even head size)",
      "end with one JSON object: first_val_loss, final_val_loss, "
      "tokens_per_s, act_peak_mb, seconds, steps, checkpoint, dtype, world_size");
  app.add_option("--kv-heads", o.kv_heads, "key/value heads (must divide --heads)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--mlp", o.mlp, "intermediate size of the SwiGLU MLP")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--save-hf", o.save_hf,
                 "folder to write config.json, model.safetensors and remat_eval.json to")
      ->check(flags::output_dir);
  app.add_option(
         "--init-from", o.init_from,
         "Hugging Face folder to start from (config.json + weights; sets the model's shape)")
      ->check(flags::input_dir);
  app.add_option("--save", o.save,
                 "file for the weights and optimizer state at the end, to --resume from")
      ->check(flags::output_file);
  app.add_option("--resume", o.resume,
                 "continue from a file written by --save (its model, step and data position)")
      ->check(flags::input_file);
  app.add_option("--stop-after", o.stop_after,
                 "stop (and save) after this step of the run (0: run all --steps)")
      ->check(flags::non_negative)
      ->capture_default_str();
  app.add_flag("--zero", o.zero,
               "under mpirun: each rank keeps the optimizer state of 1/N of the parameters "
               "(ZeRO-1)");
  flags::parse(app, argc, argv);
  return o;
}

using corpus::Batches;
using corpus::Corpus;
constexpr const char* kProgram = "train_llama";

/// Writes config.json, model.safetensors and remat_eval.json (see the file comment) into `dir`,
/// as a whole (io::save_folder): a folder saved there before stays readable until the new one is
/// complete, and a failed save (a full disk) leaves it as it was.
void save_hf_folder(const std::string& dir, const remat::nn::Llama<float>& model,
                    const Corpus& corpus, const Batches& val, double val_loss) {
  std::vector<remat::io::NamedTensor<float>> tensors;
  for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, p.value());
  nlohmann::json eval;
  eval["vocab"] = std::vector<int>(corpus.vocab.begin(), corpus.vocab.end());
  eval["loss"] = val_loss;
  for (const auto& [vx, vy] : val) {
    eval["batches"].push_back(
        {{"shape", {vx.dim(0), vx.dim(1)}}, {"ids", vx.to_vector()}, {"targets", vy.to_vector()}});
  }
  remat::io::save_folder(dir, [&](const std::string& staging) {
    remat::io::save_text(staging + "/config.json", remat::hub::llama_config_json(model.config()));
    remat::io::save(staging + "/model.safetensors", tensors, {{"format", "pt"}});
    remat::io::save_text(staging + "/remat_eval.json", eval.dump() + "\n");
  });
}

/// What --save writes beside the weights and the optimizer state: the model's configuration
/// (config.json's text), the vocabulary and where the run is, to resume it exactly.
remat::io::Metadata run_metadata(const remat::nn::LlamaConfig& config, const Options& o,
                                 const Corpus& corpus, std::int64_t step,
                                 std::uint64_t data_position, double first_val) {
  return {{"config", remat::hub::llama_config_json(config)},
          {"context", std::to_string(o.context)},
          {"batch", std::to_string(o.batch)},
          {"vocab", corpus.vocab},
          {"step", std::to_string(step)},
          {"steps", std::to_string(o.steps)},
          {"seed", std::to_string(o.seed)},
          {"lr", remat::train::detail::format_double(o.lr)},
          {"data_position", std::to_string(data_position)},
          {"first_val_loss", remat::train::detail::format_double(first_val)}};
}

/// The model saved in `dir` (hub::load_llama), checked against the corpus: the same vocabulary
/// size, and the same characters when the folder's remat_eval.json lists them.
remat::nn::Llama<float> load_folder(const std::string& dir, const Corpus& corpus) {
  remat::nn::Llama<float> model = remat::hub::load_llama<float>(dir);
  if (model.config().vocab_size != static_cast<std::int64_t>(corpus.vocab.size())) {
    throw remat::IoError(remat::detail::cat("train_llama: ", dir, "/config.json has vocab_size ",
                                            model.config().vocab_size, " but the corpus has ",
                                            corpus.vocab.size(), " characters"));
  }
  if (std::filesystem::exists(dir + "/remat_eval.json") &&
      corpus::read_saved_vocab(dir, "train_llama") != corpus.vocab) {
    throw remat::IoError(remat::detail::cat("train_llama: the vocabulary in ", dir,
                                            "/remat_eval.json is not this corpus' vocabulary"));
  }
  return model;
}

}  // namespace

int train(ranks::Job& job, int argc, char** argv) {
  const std::int64_t ranks = job.size();
  const bool root = job.root();  // the rank that evaluates, prints, logs and saves
  {
    Options o = parse(argc, argv);
    corpus::check_checkpoint_mode(o.checkpoint, kProgram);
    // everything below computes in --dtype: training steps, the plan's profile, evaluation
    const remat::PrecisionGuard precision(flags::precision(o));
    if (!o.resume.empty() && !o.init_from.empty())
      throw remat::ArgumentError(
          "train_llama: --resume and --init-from both set the model; give one");
    // the optimizer state is saved and restored whole: under ZeRO-1 each rank holds a part
    if (o.zero && ranks > 1 && (!o.save.empty() || !o.resume.empty()))
      throw remat::ArgumentError("train_llama: --save and --resume do not work with --zero yet");
    if (o.threads > 0) remat::set_num_threads(o.threads);
    const bool tty = root && ::isatty(STDOUT_FILENO);

    // A resumed run takes its model and vocabulary from the file, and checks the rest agree.
    remat::io::Metadata resumed;
    std::int64_t start = 0;
    std::optional<remat::nn::LlamaConfig> resumed_config;
    if (!o.resume.empty()) {
      resumed = remat::io::File::read(o.resume).metadata();
      const auto integer = [&](const char* key) {
        return corpus::metadata_integer(resumed, key, o.resume, kProgram);
      };
      for (const char* key : {"config", "vocab", "seed", "lr"}) {
        if (!resumed.count(key)) {
          throw remat::IoError(remat::detail::cat("train_llama: ", o.resume, " has no '", key,
                                                  "' metadata (is it a train_llama --save file?)"));
        }
      }
      resumed_config =
          remat::hub::parse_llama_config(resumed["config"], o.resume + " (metadata 'config')");
      o.context = integer("context");
      start = integer("step");
      integer("data_position");
      if (integer("steps") != o.steps || resumed["seed"] != std::to_string(o.seed) ||
          integer("batch") != o.batch ||
          resumed["lr"] != remat::train::detail::format_double(o.lr)) {
        throw remat::ArgumentError(remat::detail::cat(
            "train_llama: resume with the --steps, --seed, --batch and --lr the run was started "
            "with (",
            resumed["steps"], ", ", resumed["seed"], ", ", resumed["batch"], ", ", resumed["lr"],
            ")"));
      }
      flags::check_resume_step("train_llama", o.resume, start, o.steps, o.stop_after);
    }
    const Corpus corpus =
        Corpus::load(o.data, resumed.count("vocab") ? resumed["vocab"] : "", kProgram);
    const remat::nn::LlamaConfig config =
        resumed_config
            ? *resumed_config
            : remat::nn::LlamaConfig{.vocab_size = static_cast<std::int64_t>(corpus.vocab.size()),
                                     .hidden_size = o.width,
                                     .intermediate_size = o.mlp,
                                     .num_hidden_layers = o.layers,
                                     .num_attention_heads = o.heads,
                                     .num_key_value_heads = o.kv_heads,
                                     .rms_norm_eps = 1e-5,
                                     .max_position_embeddings = o.context,
                                     .seed = o.seed};
    if (config.vocab_size != static_cast<std::int64_t>(corpus.vocab.size())) {
      throw remat::IoError(remat::detail::cat("train_llama: ", o.resume, " has vocab_size ",
                                              config.vocab_size, " but its vocabulary ",
                                              corpus.vocab.size(), " characters"));
    }
    if (o.init_from.empty()) {  // a folder's model is checked once its config is read
      // the validation batches (the job's: ids and targets) are held through the run
      const double held =
          8.0 * double(o.eval_batches) * double(o.batch) * double(ranks) * double(o.context);
      corpus::check_fits(
          kProgram, double(config.vocab_size), double(config.hidden_size),
          double(config.num_hidden_layers), double(o.context), double(o.batch), held, [&] {
            return remat::train::estimate_memory<float>(
                       config,
                       {.batch = o.batch, .time = o.context, .precision = flags::precision(o)})
                .total(corpus::smallest_plan(o.checkpoint, config.num_hidden_layers, kProgram));
          });
    }
    remat::nn::Llama<float> model =
        o.init_from.empty() ? remat::nn::Llama<float>(config) : load_folder(o.init_from, corpus);
    {  // the model's shape (a folder's or a file's), for the plan and the messages
      const remat::nn::LlamaConfig& c = model.config();
      o.layers = c.num_hidden_layers, o.width = c.hidden_size, o.heads = c.num_attention_heads,
      o.kv_heads = c.num_key_value_heads;
      o.mlp = c.intermediate_size;
      if (o.context > c.max_position_embeddings) {
        throw remat::ArgumentError(remat::detail::cat(
            "train_llama: --context ", o.context, " exceeds the max_position_embeddings ",
            c.max_position_embeddings, " of ",
            o.init_from.empty() ? o.resume : o.init_from + "/config.json"));
      }
    }
    if (!o.init_from.empty()) {  // the folder's model is allocated; a step on it must fit too
      flags::fits(kProgram, "this run",
                  remat::train::estimate_memory<float>(
                      model.config(),
                      {.batch = o.batch, .time = o.context, .precision = flags::precision(o)})
                      .total(corpus::smallest_plan(o.checkpoint, o.layers, kProgram)));
    }
    // every rank started alike, before the first collective (whose sizes depend on it)
    job.agree(kProgram, ranks::settings(o,
                                        {{"--kv-heads", std::to_string(o.kv_heads)},
                                         {"--mlp", std::to_string(o.mlp)},
                                         {"--zero", o.zero ? "on" : "off"}},
                                        corpus, 0, 0));
    // rank 0's weights on every rank; with --zero this rank's optimizer holds its range only
    remat::optim::AdamW<float> optimizer(job.replicate(model.parameters(), o.zero),
                                         {.lr = o.lr, .weight_decay = 0.1});
    // warm-up over the first 5 % of steps, then cosine decay to a tenth
    const remat::optim::CosineSchedule schedule(o.lr, std::max<std::int64_t>(1, o.steps / 20),
                                                o.steps, o.lr / 10);
    remat::Rng data_rng(o.seed * 7919 + 1);
    if (!o.resume.empty()) {
      remat::train::load_training_state(o.resume, model, optimizer);
      data_rng.seek(static_cast<std::uint64_t>(
          corpus::metadata_integer(resumed, "data_position", o.resume, kProgram)));
    }

    // Fixed validation batches, the same for every run with this seed.
    remat::Rng val_rng(o.seed * 104729 + 3);
    const Batches val = corpus::validation_batches(corpus.val, o.eval_batches, o.batch * ranks,
                                                   o.context, val_rng, kProgram);  // the job's
    const auto validation_loss = [&] { return corpus::mean_loss(model, val); };

    remat::Tensor<std::int32_t> x, y;
    remat::Rng plan_rng(o.seed);
    corpus::fill_batch(corpus.train, o.batch, o.context, plan_rng, x, y, kProgram);
    const remat::plan::Plan plan = corpus::make_plan(o.checkpoint, model, o.layers, x, y, kProgram);

    std::FILE* log = corpus::open_log(o.log, start, root, kProgram);
    // a resumed run keeps the first validation loss of the run it continues
    const double first_val =
        start == 0 && root ? validation_loss()
        : resumed.count("first_val_loss")
            ? corpus::metadata_number(resumed, "first_val_loss", o.resume, kProgram)
            : 0.0;
    double last_val = first_val, peak_mb = 0, tokens_per_s = 0;
    if (!o.json && root) {
      std::printf(
          "%zu characters of text, vocabulary %zu, %lld parameters (%lld query heads, %lld "
          "key/value heads), checkpoint %s (%s)\n",
          corpus.train.size() + corpus.val.size(), corpus.vocab.size(),
          static_cast<long long>(model.parameter_count()), static_cast<long long>(o.heads),
          static_cast<long long>(o.kv_heads), o.checkpoint.c_str(), plan.describe().c_str());
      if (start == 0) std::printf("step %5d  val loss %.4f\n", 0, first_val);
    }

    const std::int64_t end = flags::end_step("train_llama", o.steps, o.stop_after);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t step = start; step < end; ++step) {
      // the job's batch, the same on every rank; this rank trains on its slice of it
      corpus::fill_batch(corpus.train, o.batch * ranks, o.context, data_rng, x, y, kProgram);
      x = job.slice(x), y = job.slice(y);
      optimizer.set_lr(schedule(step));
      const auto s0 = std::chrono::steady_clock::now();
      float loss = 0;
      {
        remat::memory::Probe probe;
        remat::Tape tape;
        const remat::Var<float> l = model.loss(x, y, {.plan = &plan});
        job.backward(tape, l);
        loss = l.item();
        peak_mb = std::max(peak_mb, double(probe.peak_above_start()) / (1024.0 * 1024.0));
      }
      job.clip_grad_norm(model.parameters(), 1.0);
      job.step(optimizer);
      optimizer.zero_grad();
      loss = float(job.mean(loss));  // the job's batch's loss
      const double step_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tokens_per_s = double((step - start + 1) * o.batch * ranks * o.context) / elapsed;
      const bool evaluate = root && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps);
      if (evaluate) last_val = validation_loss();
      if (log) {
        std::fprintf(log, "%lld,%.9g,%s,%.6g,%.0f,%.2f\n", static_cast<long long>(step + 1), loss,
                     evaluate ? std::to_string(last_val).c_str() : "", schedule(step),
                     double(o.batch * ranks * o.context) / step_s, peak_mb);
      }
      if (o.json || !root) continue;
      const double eta = elapsed / double(step - start + 1) * double(end - step - 1);
      if (tty) {
        std::printf("\r\033[Kstep %5lld/%lld  loss %.4f  %7.0f tok/s  peak %.1f MiB  ETA %s",
                    static_cast<long long>(step + 1), static_cast<long long>(o.steps), loss,
                    tokens_per_s, peak_mb, corpus::format_duration(eta).c_str());
        if (evaluate) std::printf("  val loss %.4f\n", last_val);
      } else if (evaluate) {
        std::printf("step %5lld  loss %.4f  val loss %.4f  %.0f tok/s  peak %.1f MiB  ETA %s\n",
                    static_cast<long long>(step + 1), loss, last_val, tokens_per_s, peak_mb,
                    corpus::format_duration(eta).c_str());
      }
      std::fflush(stdout);
    }
    if (log) std::fclose(log);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    if (!root) return 0;
    if (!o.save.empty()) {
      remat::train::save_training_state(
          o.save, model, optimizer,
          run_metadata(model.config(), o, corpus, end, data_rng.position(), first_val));
    }
    if (!o.save_hf.empty()) save_hf_folder(o.save_hf, model, corpus, val, last_val);
    if (o.sample > 0 && !o.json) {
      remat::Rng sample_rng(o.seed + 99);
      const std::vector<std::int32_t> prompt(corpus.val.begin(), corpus.val.begin() + 16);
      std::string text;
      for (std::int32_t id : prompt) text.push_back(corpus.vocab[id]);
      const std::string sample =
          corpus::generate(model, corpus, prompt, o.sample, model.config().max_position_embeddings,
                           model.config().vocab_size, sample_rng);
      std::printf("\n--- sample ---\n%s%s\n--------------\n", text.c_str(), sample.c_str());
    }
    if (o.json) {
      std::printf(
          "{\"first_val_loss\": %.17g, \"final_val_loss\": %.17g, \"tokens_per_s\": %.0f, "
          "\"act_peak_mb\": %.2f, "
          "\"seconds\": %.2f, \"steps\": %lld, \"checkpoint\": \"%s\", \"dtype\": \"%s\", "
          "\"world_size\": %lld}\n",
          first_val, last_val, tokens_per_s, peak_mb, seconds, static_cast<long long>(end),
          o.checkpoint.c_str(), o.dtype.c_str(), static_cast<long long>(ranks));
    } else {
      std::printf("validation loss %.4f -> %.4f in %.1f s (%.0f tokens/s)%s%s\n", first_val,
                  last_val, seconds, tokens_per_s, o.save_hf.empty() ? "" : ", saved in ",
                  o.save_hf.c_str());
    }
    return 0;
  }
}

int main(int argc, char** argv) {
  ranks::Job job(argc, argv);
  return flags::run_main(
      kProgram, [&] { return train(job, argc, argv); },
      [&](const std::string& line) { return job.fail(line.c_str()); });
}
