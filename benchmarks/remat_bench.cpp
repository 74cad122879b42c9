// The memory/time trade-off of checkpointing, measured.
//
//   remat_bench --model {mlp,deep} --mode {none,every,sqrt,budget:<MiB>,optimal:<slots>}
//               [--steps N] [--threads T] [--print-plan FILE]
//
// Models (float): mlp = 32 x (Linear 1024->1024 + GELU), batch 256; deep = 1000 x (Linear
// 256->256 + tanh), batch 64; gpt = 8 blocks, width 256, 4 heads, context 256, batch 8,
// vocabulary 256 (the planners see its blocks). Loss: cross-entropy against random integer
// targets (the GPT's is chunked, ops/loss.hpp). One training
// step = forward, loss, backward, AdamW update. After one warm-up step (which allocates the
// gradient and optimizer buffers that every later step reuses), the chain is profiled and the
// plan made; then N steps are timed.
//
// --print-plan writes the plan's top-level segments as JSON (for benchmarks/torch_reference.py).
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
#include <memory>

namespace {

using remat::Parameter;
using remat::Tensor;
using remat::Var;
using Layer = std::function<Var<float>(const Var<float>&)>;

/// A benchmark model: a chain of layers for the planners, and one training step's loss.
struct Model {
  std::string name;
  std::vector<Layer> chain;
  std::vector<Parameter<float>> parameters;
  std::function<remat::plan::Chain()> profile;                  // measures the chain
  std::function<Var<float>(remat::Tape&, const remat::plan::Plan&)> loss;  // one step's loss
  double forward_flops = 0;                                     // GEMM FLOPs of one forward pass
};

/// n x (Linear width->width + activation) on a (batch, width) input, cross-entropy over width classes.
struct ChainModel {
  std::vector<Parameter<float>> weights, biases;
  Tensor<float> x;
  Tensor<std::int32_t> targets;

  Model make(const std::string& name, int layers, int width, int batch, bool gelu) {
    remat::Rng rng(1);
    const double bound = 1.0 / std::sqrt(double(width));  // PyTorch's Linear initialization
    for (int i = 0; i < layers; ++i) {
      weights.emplace_back(rng.uniform_tensor<float>({width, width}, -bound, bound));
      biases.emplace_back(rng.uniform_tensor<float>({width}, -bound, bound));
    }
    remat::Rng data(2);
    x = data.normal_tensor<float>({batch, width});
    targets = Tensor<std::int32_t>({batch});
    for (auto& t : targets) t = static_cast<std::int32_t>(data.uniform_int(width));
    Model m;
    m.name = name;
    for (int i = 0; i < layers; ++i) {
      m.chain.push_back([&w = weights[i], &b = biases[i], gelu](const Var<float>& h) {
        const Var<float> z = remat::linear(h, w, b);
        return gelu ? remat::gelu(z) : remat::tanh(z);
      });
    }
    m.parameters = weights;
    m.parameters.insert(m.parameters.end(), biases.begin(), biases.end());
    const auto head = [this](const Var<float>& y) { return remat::cross_entropy(y, targets); };
    m.profile = [this, chain = m.chain, head] { return remat::plan::profile(chain, x, head); };
    m.loss = [this, chain = m.chain, head](remat::Tape& tape, const remat::plan::Plan& p) {
      return head(remat::checkpoint_sequential(chain, p, tape.input(x)));
    };
    m.forward_flops = 2.0 * layers * double(batch) * width * width;
    return m;
  }
};

/// GPT: 8 blocks, width 256, 4 heads, context 256, batch 8, vocabulary 256; random tokens.
struct GptModel {
  static constexpr std::int64_t kBatch = 8, kContext = 256, kVocab = 256, kWidth = 256, kLayers = 8;
  std::unique_ptr<remat::nn::GPT<float>> gpt;
  Tensor<std::int32_t> ids, targets;

  Model make() {
    gpt = std::make_unique<remat::nn::GPT<float>>(
        remat::nn::GPTConfig{.vocab = kVocab, .context = kContext, .layers = kLayers, .heads = 4, .width = kWidth, .seed = 1});
    remat::Rng data(2);
    ids = Tensor<std::int32_t>({kBatch, kContext});
    targets = Tensor<std::int32_t>({kBatch, kContext});
    for (auto& t : ids) t = static_cast<std::int32_t>(data.uniform_int(kVocab));
    for (auto& t : targets) t = static_cast<std::int32_t>(data.uniform_int(kVocab));
    Model m;
    m.name = "gpt";
    m.chain = gpt->block_layers();
    m.parameters = gpt->parameters();
    m.profile = [this] { return gpt->profile(ids, targets); };
    m.loss = [this](remat::Tape&, const remat::plan::Plan& p) { return gpt->loss(ids, targets, &p); };
    const double tokens = double(kBatch * kContext);
    // per token and block: Q, K, V, output, two MLP projections (12 C^2 multiply-adds), and
    // attention scores and weighted values over the whole context (2 T C); plus the head.
    m.forward_flops = 2.0 * tokens * (kLayers * (12.0 * kWidth * kWidth + 2.0 * kContext * kWidth) + double(kWidth) * kVocab);
    return m;
  }
};

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

    ChainModel chain_model;
    GptModel gpt_model;
    Model model;
    if (model_name == "mlp") model = chain_model.make("mlp", 32, 1024, 256, true);
    else if (model_name == "deep") model = chain_model.make("deep", 1000, 256, 64, false);
    else if (model_name == "gpt") model = gpt_model.make();
    else throw remat::UsageError("remat_bench: --model must be mlp, deep or gpt, got " + model_name);
    remat::optim::AdamW<float> optimizer(model.parameters, {.lr = 1e-4, .weight_decay = 0.0});

    struct Timing {
      double step, fwd, fwd_bwd, replay, peak;
      float loss;
    };
    const auto train_step = [&](const remat::plan::Plan& p) {
      Timing t{};
      const double t0 = bench::now_seconds();
      {
        remat::memory::Probe probe;
        remat::Tape tape;
        const Var<float> loss = model.loss(tape, p);
        t.fwd = bench::now_seconds() - t0;
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

    train_step(remat::plan::none(model.chain.size()));  // warm-up: gradient and AdamW buffers
    const remat::plan::Chain chain = model.profile();
    optimizer.zero_grad();
    const remat::plan::Plan p = make_plan(mode, chain);
    if (const std::string file = bench::arg(argc, argv, "--print-plan", ""); !file.empty()) {
      std::FILE* out = std::fopen(file.c_str(), "w");
      if (!out) throw remat::IoError("remat_bench: cannot write " + file);
      std::fprintf(out, "{\"kind\": \"%s\", \"segments\": [", p.kind.c_str());
      for (std::size_t i = 0; i < p.segments.size(); ++i) {
        std::fprintf(out, "%s[%zu, %zu]", i ? ", " : "", p.segments[i].begin, p.segments[i].end);
      }
      std::fprintf(out, "], \"depth\": %d}\n", p.depth());
      std::fclose(out);
    }

    std::vector<double> step_s, fwd_s, fwd_bwd_s, replay_s;
    double peak = 0;
    float loss = 0;
    for (int i = 0; i < steps; ++i) {
      const Timing t = train_step(p);
      step_s.push_back(t.step);
      fwd_bwd_s.push_back(t.fwd_bwd);
      fwd_s.push_back(t.fwd);
      replay_s.push_back(t.replay);
      peak = std::max(peak, t.peak);
      loss = t.loss;
    }
    const double mib = 1024.0 * 1024.0;
    const double flops = (3 + p.recompute_fraction) * model.forward_flops;
    std::printf(
        "{\"model\": \"%s\", \"mode\": \"%s\", \"threads\": %d, \"steps\": %d, \"step_s\": %.4f, \"fwd_s\": %.4f, \"fwd_bwd_s\": %.4f, "
        "\"act_peak_mb\": %.2f, \"predicted_peak_mb\": %.2f, \"recompute\": %.3f, \"replay_s\": %.4f, "
        "\"segments\": %zu, \"depth\": %d, \"gflops\": %.1f, \"loss\": %.6f, \"gemm\": \"%s\"}\n",
        model.name.c_str(), mode.c_str(), threads, steps, bench::median(step_s), bench::median(fwd_s), bench::median(fwd_bwd_s),
        peak / mib,
        p.peak_bytes / mib, p.recompute_fraction, bench::median(replay_s), p.segment_count(), p.depth(),
        flops / bench::median(fwd_bwd_s) / 1e9, loss, remat::gemm_backend().c_str());
    return 0;
  } catch (const remat::Error& e) {
    std::fprintf(stderr, "remat_bench: %s\n", e.what());
    return 2;
  }
}
