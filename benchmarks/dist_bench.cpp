// Data-parallel step timing under mpirun: how long each step's backward pass takes, how long the
// step then still waits for its gradient reductions, and how long those reductions take with
// nothing else running. One JSON line from rank 0 (medians over the steps after the first two):
// wait_s is the least wait over the ranks (the rank that finished its sweep last waits for the
// reductions only), max_wait_s the most (which adds waiting for that straggler); last_bucket_mb
// is the size of the bucket that only starts when the sweep ends.
//
//   mpirun -np N dist_bench [--model gpt|llama] [--layers 4] [--width 128] [--heads 4]
//                           [--kv-heads 2] [--mlp 512] [--context 64] [--vocab 96] [--batch 16]
//                           [--steps 20] [--bucket-mb 25] [--first-bucket-mb 1] [--min-buckets 8]
//                           [--checkpoint none|every] [--threads 1]      (--help lists them)
//
// The defaults are train_gpt's model; train_llama's is --model llama --layers 6 --width 256
// (--kv-heads and --mlp are the Llama's only).
#include <remat/dist/data_parallel.hpp>
#include <remat/nn/llama.hpp>
#include <remat/remat.hpp>

#include "../examples/flags.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// Times --steps data-parallel steps of `model` and prints the JSON line (rank 0).
template <class Model>
void run(const remat::dist::Communicator& comm, Model& model, const char* name,
         std::map<std::string, double>& o, const std::string& checkpoint) {
  const auto n = [&](const char* k) { return static_cast<std::int64_t>(o[k]); };
  remat::dist::DataParallel<float> dp(
      comm, model.parameters(),
      {.bucket_bytes = std::size_t(o["--bucket-mb"] * 1048576),
       .first_bucket_bytes = std::size_t(o["--first-bucket-mb"] * 1048576),
       .min_buckets = std::size_t(o["--min-buckets"])});
  remat::optim::AdamW<float> opt(dp.optimizer_parameters());
  const auto layers = static_cast<std::size_t>(n("--layers"));
  const remat::plan::Plan plan =
      checkpoint == "every" ? remat::plan::every(layers) : remat::plan::none(layers);
  remat::Rng rng(1234 + std::uint64_t(comm.rank()));
  std::vector<double> step_s, forward_s, backward_s, wait_s, max_wait_s, update_s;
  for (int step = 0; step < n("--steps"); ++step) {
    remat::Tensor<std::int32_t> x({n("--batch"), n("--context")}),
        y({n("--batch"), n("--context")});
    for (std::int64_t i = 0; i < x.numel(); ++i)
      x[i] = std::int32_t(rng.uniform_int(n("--vocab"))),
      y[i] = std::int32_t(rng.uniform_int(n("--vocab")));
    const auto t0 = std::chrono::steady_clock::now();
    double forward = 0;
    {
      remat::Tape tape;
      const remat::Var<float> loss = model.loss(x, y, {.plan = &plan});
      forward = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      dp.backward(tape, loss);
    }
    const auto t1 = std::chrono::steady_clock::now();
    dp.step(opt);
    opt.zero_grad();
    if (step < 2) continue;  // warm-up: allocator cache, bucket layout
    const auto t2 = std::chrono::steady_clock::now();
    step_s.push_back(std::chrono::duration<double>(t2 - t0).count());
    forward_s.push_back(forward);
    update_s.push_back(std::chrono::duration<double>(t2 - t1).count());
    backward_s.push_back(dp.stats().backward_seconds);
    // The rank whose sweep ended last waits only for the reductions; the others also wait for
    // it (a straggler): the least wait over the ranks is the communication's share.
    wait_s.push_back(comm.all_reduce(dp.stats().wait_seconds, remat::dist::ReduceOp::min));
    max_wait_s.push_back(comm.all_reduce(dp.stats().wait_seconds, remat::dist::ReduceOp::max));
  }
  const double alone = dp.time_reduction_alone(9);
  const double step = median(step_s);
  // the bucket reduced after the sweep ends: what no overlap can hide (docs/distributed.md)
  const auto layout = dp.bucket_layout();
  const auto params = model.parameters();
  std::size_t last_bucket_bytes = 0;
  for (std::size_t p : layout.back()) last_bucket_bytes += params[p].value().bytes();
  if (comm.rank() == 0) {
    std::printf(
        "{\"world_size\": %d, \"parameters\": %lld, \"gradient_mb\": %.2f, \"buckets\": %zu, "
        "\"started_during_backward\": %zu, \"step_s\": %.5f, \"forward_s\": %.5f, "
        "\"backward_s\": %.5f, \"update_s\": %.5f, \"wait_s\": %.6f, \"max_wait_s\": %.6f, "
        "\"reduce_alone_s\": %.6f, \"last_bucket_mb\": %.3f, \"tokens_per_s\": %.0f, "
        "\"model\": \"%s\", \"checkpoint\": \"%s\"}\n",
        comm.size(), static_cast<long long>(model.parameter_count()),
        double(dp.stats().bytes) / 1048576.0, dp.stats().buckets,
        dp.stats().started_during_backward, step, median(forward_s), median(backward_s),
        median(update_s), median(wait_s), median(max_wait_s), alone,
        double(last_bucket_bytes) / 1048576.0,
        double(n("--batch") * n("--context") * comm.size()) / step, name, checkpoint.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  remat::dist::Environment mpi(argc, argv);
  const auto comm = remat::dist::Communicator::world();
  std::map<std::string, double> o = {
      {"--layers", 4},      {"--width", 128},    {"--heads", 4},
      {"--context", 64},    {"--vocab", 96},     {"--batch", 16},
      {"--steps", 20},      {"--bucket-mb", 25}, {"--first-bucket-mb", 1},
      {"--min-buckets", 8}, {"--threads", 1},    {"--kv-heads", 2},
      {"--mlp", 512}};
  const std::map<std::string, const char*> help = {
      {"--layers", "transformer blocks"},
      {"--width", "hidden size"},
      {"--heads", "attention heads"},
      {"--kv-heads", "key/value heads (llama)"},
      {"--mlp", "intermediate size of the SwiGLU MLP (llama)"},
      {"--context", "tokens per sequence"},
      {"--vocab", "vocabulary size"},
      {"--batch", "sequences per step and rank"},
      {"--steps", "steps timed (medians over those after the first two)"},
      {"--bucket-mb", "gradient bucket size (MiB)"},
      {"--first-bucket-mb", "size of the first bucket (the first reduced) (MiB)"},
      {"--min-buckets", "buckets at least (a bucket holds at most 1/N of the gradient)"},
      {"--threads", "worker threads per rank"}};
  std::string checkpoint = "none", model = "gpt";
  CLI::App app(
      "Data-parallel step timing (run under mpirun): backward, wait for reductions, reductions "
      "alone.");
  for (auto& [name, value] : o) {
    app.add_option(name, value, help.at(name))
        ->check(name == "--threads" ? flags::thread_count(false) : flags::positive)
        ->capture_default_str();
  }
  app.add_option("--model", model, "the model's architecture")
      ->check(CLI::IsMember({"gpt", "llama"}))
      ->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "checkpoint plan")
      ->check(CLI::IsMember({"none", "every"}))
      ->capture_default_str();
  if (const int code = flags::parse_or_exit_code(app, argc, argv, comm.rank() == 0); code >= 0)
    return code;
  return flags::run_main(
      "dist_bench",
      [&] {
        remat::set_num_threads(int(o["--threads"]));
        const auto n = [&](const char* k) { return static_cast<std::int64_t>(o[k]); };
        // the model's weights, gradients and moments, and one activation a layer
        flags::fits("dist_bench", "this model",
                    16 * (o["--layers"] * 12 * o["--width"] * o["--width"] +
                          (o["--vocab"] + o["--context"]) * o["--width"]) +
                        4 * o["--batch"] * o["--context"] * o["--width"] * o["--layers"]);
        if (model == "llama") {
          remat::nn::Llama<float> llama({.vocab_size = n("--vocab"),
                                         .hidden_size = n("--width"),
                                         .intermediate_size = n("--mlp"),
                                         .num_hidden_layers = n("--layers"),
                                         .num_attention_heads = n("--heads"),
                                         .num_key_value_heads = n("--kv-heads"),
                                         .max_position_embeddings = n("--context")});
          run(comm, llama, "llama", o, checkpoint);
        } else {
          remat::nn::GPT<float> gpt({.vocab = n("--vocab"),
                                     .context = n("--context"),
                                     .layers = n("--layers"),
                                     .heads = n("--heads"),
                                     .width = n("--width")});
          run(comm, gpt, "gpt", o, checkpoint);
        }
        return 0;
      },
      [&](const std::string& line) {  // the other ranks may wait in a reduction: end them all
        std::fprintf(stderr, "rank %d: %s\n", comm.rank(), line.c_str());
        remat::dist::abort(1);
        return 1;
      });
}
