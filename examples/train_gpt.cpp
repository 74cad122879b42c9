// Trains a character-level GPT on a text file, with any checkpoint plan.
//
//   train_gpt [--data PATH] [--layers N] [--width C] [--heads H] [--context T] [--batch B]
//             [--steps S] [--lr LR] [--seed N] [--dropout P] [--threads N] [--dtype f32|bf16]
//             [--checkpoint none|every|sqrt|budget:<MiB>|policy:<policy>] [--eval-every N]
//             [--eval-batches N]
//             [--log FILE.csv] [--save FILE] [--resume FILE] [--stop-after N] [--sample N] [--json]
//             [--trace FILE.json]     (train_gpt --help lists them with their defaults)
//
// Without --data it trains on examples/data/corpus.txt (original text shipped with remat). It
// prints a live progress line on a terminal (plain lines otherwise), the validation loss every
// --eval-every steps, writes the loss curve to --log, and at the end prints a generated sample and
// saves the weights and optimizer state to --save (default train_gpt.safetensors), which --resume
// continues from. --trace writes the memory timeline of one step (remat::Trace, Chrome trace
// format: open it in ui.perfetto.dev or plot it with benchmarks/plot_trace.py). --stop-after N
// stops (and saves) after step N of a run planned for --steps.
// With --json the last line is a JSON object: first_val_loss, final_val_loss, tokens_per_s,
// act_peak_mb, seconds, steps, checkpoint, dtype, world_size. --dtype bf16 trains in BF16
// (remat::PrecisionGuard): bfloat16 GEMMs and saved activations, float32 weights and optimizer.
//
// Built with MPI, it runs unchanged under `mpirun -np N train_gpt ...` (ranks.hpp): --batch rows
// per rank, N ranks train as one process with --batch N x B would (to float rounding), only
// rank 0 evaluates, prints, logs and saves; tokens_per_s counts the whole job.
#include <remat/remat.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "ranks.hpp"
#include "training_flags.hpp"

namespace {

struct Options : flags::Training {
  double dropout = 0.0;
  std::int64_t stop_after = 0;
  std::string save = "train_gpt.safetensors", resume, trace;
};

Options parse(int argc, char** argv) {
  Options o;  // flags::Training's defaults are train_gpt's
  CLI::App app("Trains a character-level GPT on a text file, with any checkpoint plan.");
  flags::add_training_flags(app, o, "transformer blocks", "attention heads (must divide --width)",
                            "print one JSON object at the end instead of progress");
  app.add_option("--dropout", o.dropout, "dropout probability, in [0, 1)")
      ->check(flags::probability)
      ->capture_default_str();
  app.add_option("--save", o.save,
                 "file for the weights and optimizer state at the end ('' for none)")
      ->check(flags::output_file)
      ->capture_default_str();
  app.add_option("--resume", o.resume, "continue from a file written by --save")
      ->check(flags::input_file);
  app.add_option("--stop-after", o.stop_after,
                 "stop (and save) after this step of the run (0: run all --steps)")
      ->check(flags::non_negative)
      ->capture_default_str();
  app.add_option("--trace", o.trace,
                 "write a memory timeline (Chrome trace JSON) of the first step after warm-up")
      ->check(flags::output_file);
  flags::parse(app, argc, argv);
  return o;
}

using corpus::Corpus;
constexpr const char* kProgram = "train_gpt";

}  // namespace

int train(ranks::Job& job, int argc, char** argv) {
  const int ranks = job.size();
  const bool root = job.root();  // the rank that evaluates, prints, logs and saves
  {
    Options o = parse(argc, argv);
    corpus::check_checkpoint_mode(o.checkpoint, kProgram);
    // everything below computes in --dtype: training steps, the plan's profile, evaluation
    const remat::PrecisionGuard precision(flags::precision(o));
    if (o.threads > 0) remat::set_num_threads(o.threads);
    const bool tty = root && ::isatty(STDOUT_FILENO);

    // A resumed run takes its sizes and vocabulary from the file, and checks the rest agree.
    remat::io::Metadata resumed;
    std::int64_t start = 0;
    if (!o.resume.empty()) {
      resumed = remat::io::File::read(o.resume).metadata();
      const auto integer = [&](const char* key) {
        return corpus::metadata_integer(resumed, key, o.resume, kProgram);
      };
      if (!resumed.count("vocab"))
        throw remat::IoError("train_gpt: " + o.resume + " has no 'vocab' metadata");
      o.layers = integer("layers"), o.width = integer("width");
      o.heads = integer("heads"), o.context = integer("context");
      start = integer("step");
      integer("data_position");
      if (integer("steps") != o.steps || resumed["seed"] != std::to_string(o.seed)) {
        throw remat::ArgumentError(
            "train_gpt: resume with the --steps and --seed the run was started with (" +
            resumed["steps"] + ", " + resumed["seed"] + ")");
      }
      flags::check_resume_step("train_gpt", o.resume, start, o.steps, o.stop_after);
    }
    const Corpus corpus =
        Corpus::load(o.data, resumed.count("vocab") ? resumed["vocab"] : "", kProgram);
    const remat::nn::GPTConfig config{.vocab = static_cast<std::int64_t>(corpus.vocab.size()),
                                      .context = o.context,
                                      .layers = o.layers,
                                      .heads = o.heads,
                                      .width = o.width,
                                      .dropout = o.dropout,
                                      .seed = o.seed};
    // the validation batches (the job's: ids and targets) are held through the run
    const double held = 8.0 * double(o.eval_batches) * double(o.batch) * ranks * double(o.context);
    corpus::check_fits(
        kProgram, double(config.vocab), double(o.width), double(o.layers), double(o.context),
        double(o.batch), held, [&] {
          return remat::train::estimate_memory<float>(
                     config,
                     {.batch = o.batch, .time = o.context, .precision = flags::precision(o)})
              .total(corpus::smallest_plan(o.checkpoint, o.layers, kProgram));
        });
    remat::nn::GPT<float> gpt(config);
    remat::optim::AdamW<float> optimizer(gpt.parameters(), {.lr = o.lr, .weight_decay = 0.1});
    // warm-up over the first 5 % of steps, then cosine decay to a tenth
    const remat::optim::CosineSchedule schedule(o.lr, std::max<std::int64_t>(1, o.steps / 20),
                                                o.steps, o.lr / 10);
    remat::Rng data_rng(o.seed * 7919 + 1);
    if (!o.resume.empty()) {
      remat::train::load_training_state(o.resume, gpt, optimizer);
      data_rng.seek(static_cast<std::uint64_t>(
          corpus::metadata_integer(resumed, "data_position", o.resume, kProgram)));
    }
    // every rank started alike, before the first collective (whose sizes depend on it)
    job.agree(kProgram, ranks::settings(o,
                                        {{"--dropout", flags::exact_text(o.dropout)},
                                         {"--stop-after", std::to_string(o.stop_after)}},
                                        corpus, data_rng.position(), start));
    job.replicate(gpt.parameters());  // rank 0's weights everywhere; the optimizer holds all

    // Fixed validation batches, the same for every run with this seed.
    remat::Rng val_rng(o.seed * 104729 + 3);
    // the job's batch
    const corpus::Batches val = corpus::validation_batches(
        corpus.val, o.eval_batches, o.batch * ranks, o.context, val_rng, kProgram);
    const auto validation_loss = [&] { return corpus::mean_loss(gpt, val); };

    remat::Tensor<std::int32_t> x, y;
    remat::Rng plan_rng(o.seed);
    corpus::fill_batch(corpus.train, o.batch, o.context, plan_rng, x, y, kProgram);
    const remat::plan::Plan plan = corpus::make_plan(o.checkpoint, gpt, o.layers, x, y, kProgram);

    std::FILE* log = corpus::open_log(o.log, start, root, kProgram);
    const double first_val =
        start == 0 && root ? validation_loss()
        : resumed.count("first_val_loss")
            ? corpus::metadata_number(resumed, "first_val_loss", o.resume, kProgram)
            : 0.0;
    double last_val = first_val, peak_mb = 0, tokens_per_s = 0;
    if (!o.json && root)
      std::printf("%zu characters of text, vocabulary %zu, %lld parameters, checkpoint %s (%s)\n",
                  corpus.train.size() + corpus.val.size(), corpus.vocab.size(),
                  static_cast<long long>(gpt.parameter_count()), o.checkpoint.c_str(),
                  plan.describe().c_str());
    if (!o.json && root && start == 0) std::printf("step %5d  val loss %.4f\n", 0, first_val);

    const std::int64_t end = flags::end_step("train_gpt", o.steps, o.stop_after);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t step = start; step < end; ++step) {
      // the job's batch, the same on every rank; this rank trains on its slice of it
      corpus::fill_batch(corpus.train, o.batch * ranks, o.context, data_rng, x, y, kProgram);
      x = job.slice(x), y = job.slice(y);
      optimizer.set_lr(schedule(step));
      const auto s0 = std::chrono::steady_clock::now();
      float loss = 0;
      // --trace records the second step this process runs (the first allocates the gradient and
      // optimizer buffers every later step reuses), or the only one
      const bool traced = !o.trace.empty() && root && step == std::min(start + 1, end - 1);
      std::optional<remat::Trace> trace;
      if (traced) trace.emplace();
      {
        remat::memory::Probe probe;
        remat::Tape tape(remat::TapeOptions{
            .seed = remat::detail::mix64(o.seed ^ remat::detail::mix64(std::uint64_t(step)))});
        const remat::Var<float> l = gpt.loss(x, y, {.plan = &plan});
        job.backward(tape, l);
        loss = l.item();
        peak_mb = std::max(peak_mb, double(probe.peak_above_start()) / (1024.0 * 1024.0));
      }
      if (trace) {
        trace->stop();
        trace->save_chrome_json(o.trace);
        trace.reset();
      }
      job.clip_grad_norm(gpt.parameters(), 1.0);
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

    if (!o.save.empty() && root) {
      remat::train::save_training_state(o.save, gpt, optimizer,
                                        {{"layers", std::to_string(o.layers)},
                                         {"width", std::to_string(o.width)},
                                         {"heads", std::to_string(o.heads)},
                                         {"context", std::to_string(o.context)},
                                         {"vocab", corpus.vocab},
                                         {"step", std::to_string(end)},
                                         {"steps", std::to_string(o.steps)},
                                         {"seed", std::to_string(o.seed)},
                                         {"data_position", std::to_string(data_rng.position())},
                                         {"first_val_loss", std::to_string(first_val)}});
    }
    if (o.sample > 0 && !o.json && root) {
      remat::Rng sample_rng(o.seed + 99);
      gpt.eval();
      const std::vector<std::int32_t> prompt(corpus.val.begin(), corpus.val.begin() + 16);
      std::string text;
      for (std::int32_t id : prompt) text.push_back(corpus.vocab[id]);
      const std::string sample = corpus::generate(
          gpt, corpus, prompt, o.sample, gpt.config().context, gpt.config().vocab, sample_rng);
      std::printf("\n--- sample ---\n%s%s\n--------------\n", text.c_str(), sample.c_str());
    }
    if (!root) return 0;
    if (o.json) {
      std::printf(
          "{\"first_val_loss\": %.6f, \"final_val_loss\": %.6f, \"tokens_per_s\": %.0f, "
          "\"act_peak_mb\": %.2f, "
          "\"seconds\": %.2f, \"steps\": %lld, \"checkpoint\": \"%s\", \"dtype\": \"%s\", "
          "\"world_size\": %d}\n",
          first_val, last_val, tokens_per_s, peak_mb, seconds, static_cast<long long>(end),
          o.checkpoint.c_str(), o.dtype.c_str(), ranks);
    } else {
      std::printf("validation loss %.4f -> %.4f in %.1f s (%.0f tokens/s), weights in %s\n",
                  first_val, last_val, seconds, tokens_per_s, o.save.c_str());
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
