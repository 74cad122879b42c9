#pragma once
// The flags train_gpt and train_llama share: the text, the sizes both models have, the run, the
// checkpoint plan, evaluation and output. Each program sets its own defaults before calling
// add_training_flags, then adds its own flags.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "flags.hpp"

#ifndef REMAT_EXAMPLE_DATA
#define REMAT_EXAMPLE_DATA "examples/data/corpus.txt"
#endif

namespace flags {

struct Training {
  std::string data = REMAT_EXAMPLE_DATA;
  std::int64_t layers = 4, width = 128, heads = 4, context = 64, batch = 16, steps = 600;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  int threads = 0;
  std::string checkpoint = "none";
  std::string dtype = "f32";
  std::int64_t eval_every = 100, eval_batches = 8, sample = 300;
  std::string log;
  bool json = false;
};

/// An integer >= 2 (attention needs a context of two tokens or more).
inline const CLI::Validator at_least_two(
    [](std::string& text) -> std::string {
      char* end = nullptr;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      return !text.empty() && *end == '\0' && v >= 2 ? "" : "'" + text + "' is not an integer >= 2";
    },
    ">=2");

/// Adds the shared flags, bound to `o`, with `o`'s values as their defaults. `layers` and `heads`
/// say what a layer and a head are in this model; `json_fields` lists what --json prints.
inline void add_training_flags(CLI::App& app, Training& o, const char* layers, const char* heads,
                               const char* json_fields) {
  app.add_option("--data", o.data, "UTF-8 text to train on (the last tenth is for validation)")
      ->check(input_file)
      ->capture_default_str();
  app.add_option("--layers", o.layers, layers)->check(positive)->capture_default_str();
  app.add_option("--width", o.width, "hidden size")->check(positive)->capture_default_str();
  app.add_option("--heads", o.heads, heads)->check(positive)->capture_default_str();
  app.add_option("--context", o.context, "tokens per sequence (>= 2)")
      ->check(at_least_two)
      ->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per step (per rank under mpirun)")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps of the run")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--lr", o.lr, "peak AdamW learning rate (warm-up, then cosine decay)")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of everything random: weights, batches, dropout")
      ->check(count)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "worker threads (0: the library's default)")
      ->check(flags::thread_count(true))
      ->capture_default_str();
  app.add_option("--dtype", o.dtype,
                 "what a step computes in: f32, or bf16 (bfloat16 GEMMs and saved activations; "
                 "weights, losses and the optimizer in float32)")
      ->check(precision_name)
      ->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint,
                 "checkpoint plan: none, every, sqrt, budget:<MiB> or policy:<policy> (every layer "
                 "in a segment of its own under save_matmuls, save_ops:a,b,... or "
                 "recompute_ops:a,b,...)")
      ->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "steps between validation losses")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "validation batches")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--log", o.log, "CSV file for the loss curve")->check(output_file);
  app.add_option("--sample", o.sample, "characters to generate at the end")
      ->check(non_negative)
      ->capture_default_str();
  app.add_flag("--json", o.json, json_fields);
}

/// What --dtype asks for.
inline remat::Precision precision(const Training& o) {
  return remat::parse_precision(o.dtype, "--dtype");
}

/// The step a run of `steps` steps ends at: `stop_after` when given (not 0), which past the
/// run's end is an error rather than a silent `steps`.
inline std::int64_t end_step(const char* program, std::int64_t steps, std::int64_t stop_after) {
  if (stop_after > steps) {
    throw remat::ArgumentError(remat::detail::cat(program, ": --stop-after ", stop_after,
                                                  " is past the run's last step, ", steps));
  }
  return stop_after > 0 ? stop_after : steps;
}

/// Throws unless a run of `steps` steps may resume at `start` from `file` and stop after
/// `stop_after` (0: never): a file saved at step 20 must hold step 20's weights, so neither a
/// step past the run's end nor stopping before the resumed step can be honoured.
inline void check_resume_step(const char* program, const std::string& file, std::int64_t start,
                              std::int64_t steps, std::int64_t stop_after) {
  if (start > steps) {
    throw remat::IoError(remat::detail::cat(program, ": ", file, " says step ", start,
                                            " of a run of ", steps, " steps"));
  }
  if (stop_after > 0 && stop_after < start) {
    throw remat::ArgumentError(remat::detail::cat(program, ": --stop-after ", stop_after,
                                                  " is before step ", start, ", where ", file,
                                                  " resumes"));
  }
}

}  // namespace flags
