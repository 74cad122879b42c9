// The memory/time trade-off of checkpointing, measured.
//
//   remat_bench --model {mlp,deep} --mode {none,every,sqrt,budget:<MiB>,optimal:<slots>}
//               [--steps N] [--threads T]
//
// Models (float): mlp = 32 x (Linear 1024->1024 + GELU), batch 256; deep = 1000 x (Linear
// 256->256 + tanh), batch 64. Loss: cross-entropy against random integer targets. One training
// step = forward, loss, backward, AdamW update. After one warm-up step (which allocates the
// gradient and optimizer buffers that every later step reuses), the chain is profiled and the
// plan made; then N steps are timed.
//
// Prints one JSON object:
//   step_s            median wall time of a training step (forward + backward + AdamW)
//   fwd_bwd_s         median wall time of forward + backward alone
//   act_peak_mb       counted peak during forward + backward minus live bytes before it (MiB)
//   predicted_peak_mb the plan's predicted peak (MiB)
//   recompute         the plan's extra forward work, as a fraction of one forward pass
//   replay_s          measured time spent replaying segments in one step
//   loss              the loss of the last step (equal across modes: gradients are exact)
#include "bench_util.hpp"

#include <remat/optim/adamw.hpp>

#include <cstring>
#include <functional>

namespace {

using remat::Parameter;
using remat::Tensor;
using remat::Var;
using Layer = std::function<Var<float>(const Var<float>&)>;

struct Model {
  std::string name;
  int layers = 0, width = 0, batch = 0;
  const char* activation = "";
  std::vector<Parameter<float>> weights, biases;
  std::vector<Layer> chain;

  std::vector<Parameter<float>> parameters() const {
    std::vector<Parameter<float>> p = weights;
    p.insert(p.end(), biases.begin(), biases.end());
    return p;
  }
  /// Multiply-adds of one forward pass, times 2: the FLOPs of the GEMMs.
  double forward_flops() const { return 2.0 * layers * double(batch) * width * width; }
};

Model make_model(const std::string& name) {
  Model m;
  m.name = name;
  if (name == "mlp") {
    m.layers = 32, m.width = 1024, m.batch = 256, m.activation = "gelu";
  } else if (name == "deep") {
    m.layers = 1000, m.width = 256, m.batch = 64, m.activation = "tanh";
  } else {
    throw remat::UsageError("remat_bench: --model must be mlp or deep, got " + name);
  }
  remat::Rng rng(1);
  const double bound = 1.0 / std::sqrt(double(m.width));  // PyTorch's Linear initialization
  for (int i = 0; i < m.layers; ++i) {
    m.weights.emplace_back(rng.uniform_tensor<float>({m.width, m.width}, -bound, bound));
    m.biases.emplace_back(rng.uniform_tensor<float>({m.width}, -bound, bound));
  }
  const bool gelu = std::strcmp(m.activation, "gelu") == 0;
  for (int i = 0; i < m.layers; ++i) {
    m.chain.push_back([&w = m.weights[i], &b = m.biases[i], gelu](const Var<float>& x) {
      const Var<float> z = remat::linear(x, w, b);
      return gelu ? remat::gelu(z) : remat::tanh(z);
    });
  }
  return m;
}

remat::plan::Plan make_plan(const std::string& mode, const remat::plan::Chain& chain) {
  namespace plan = remat::plan;
  if (mode == "none") return plan::none(chain);
  if (mode == "every") return plan::every(chain);
  if (mode == "sqrt") return plan::sqrt(chain);
  const auto colon = mode.find(':');
  if (colon != std::string::npos) {
    const std::string kind = mode.substr(0, colon);
    const double value = std::stod(mode.substr(colon + 1));
    if (kind == "budget") return plan::budget(chain, value * 1024 * 1024);
    if (kind == "optimal") return plan::optimal(chain, static_cast<std::size_t>(value));
  }
  throw remat::UsageError("remat_bench: --mode must be none, every, sqrt, budget:<MiB> or optimal:<slots>, got " + mode);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string model_name = bench::arg(argc, argv, "--model", "mlp");
    const std::string mode = bench::arg(argc, argv, "--mode", "none");
    const int steps = std::stoi(bench::arg(argc, argv, "--steps", "5"));
    const int threads = std::stoi(bench::arg(argc, argv, "--threads", "1"));
    remat::set_num_threads(threads);
    remat::manual_seed(1);

    Model model = make_model(model_name);
    remat::Rng rng(2);
    const Tensor<float> x = rng.normal_tensor<float>({model.batch, model.width});
    Tensor<std::int32_t> targets({model.batch});
    for (auto& t : targets) t = static_cast<std::int32_t>(rng.uniform_int(model.width));
    const auto loss_of = [&](const Var<float>& y) { return remat::cross_entropy(y, targets); };
    remat::optim::AdamW<float> optimizer(model.parameters(), {.lr = 1e-4, .weight_decay = 0.0});

    struct Timing {
      double step, fwd_bwd, replay, peak;
      float loss;
    };
    const auto train_step = [&](const remat::plan::Plan& p) {
      Timing t{};
      const double t0 = bench::now_seconds();
      {
        remat::memory::Probe probe;
        remat::Tape tape;
        const Var<float> loss = loss_of(remat::checkpoint_sequential(model.chain, p, tape.input(x)));
        tape.backward(loss);
        t.peak = static_cast<double>(probe.peak_above_start());
        t.replay = tape.state().stats().replay_seconds;
        t.loss = loss.item();
      }
      t.fwd_bwd = bench::now_seconds() - t0;
      optimizer.step();
      optimizer.zero_grad();
      t.step = bench::now_seconds() - t0;
      return t;
    };

    train_step(remat::plan::none(std::size_t(model.layers)));  // warm-up: gradient and AdamW buffers
    const remat::plan::Chain chain = remat::plan::profile(model.chain, x, loss_of);
    optimizer.zero_grad();
    const remat::plan::Plan p = make_plan(mode, chain);

    std::vector<double> step_s, fwd_bwd_s, replay_s;
    double peak = 0;
    float loss = 0;
    for (int i = 0; i < steps; ++i) {
      const Timing t = train_step(p);
      step_s.push_back(t.step);
      fwd_bwd_s.push_back(t.fwd_bwd);
      replay_s.push_back(t.replay);
      peak = std::max(peak, t.peak);
      loss = t.loss;
    }
    const double mib = 1024.0 * 1024.0;
    const double flops = 3 * model.forward_flops() + p.recompute_fraction * model.forward_flops();
    std::printf(
        "{\"model\": \"%s\", \"mode\": \"%s\", \"threads\": %d, \"steps\": %d, \"step_s\": %.4f, \"fwd_bwd_s\": %.4f, "
        "\"act_peak_mb\": %.2f, \"predicted_peak_mb\": %.2f, \"recompute\": %.3f, \"replay_s\": %.4f, "
        "\"segments\": %zu, \"depth\": %d, \"gflops\": %.1f, \"loss\": %.6f, \"gemm\": \"%s\"}\n",
        model.name.c_str(), mode.c_str(), threads, steps, bench::median(step_s), bench::median(fwd_bwd_s), peak / mib,
        p.peak_bytes / mib, p.recompute_fraction, bench::median(replay_s), p.segment_count(), p.depth(),
        flops / bench::median(fwd_bwd_s) / 1e9, loss, remat::gemm_backend().c_str());
    return 0;
  } catch (const remat::Error& e) {
    std::fprintf(stderr, "remat_bench: %s\n", e.what());
    return 2;
  }
}
