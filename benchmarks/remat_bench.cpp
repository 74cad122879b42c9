// The memory/time trade-off of checkpointing, measured.
//
//   remat_bench --model {mlp,deep,gpt} --mode
//   {none,every,sqrt,budget:<MiB>,budget_layers:<MiB>,optimal:<slots>}[,...]
//               [--policy {save_nothing,save_matmuls,save_ops:<op,...>,recompute_ops:<op,...>}]
//               [--attention {fused,flash}] [--context T] [--batch B] [--derived-policies N]
//               [--describe]
//               [--steps N] [--threads T] [--print-plan FILE] [--gemm-peak GFLOPS]
//               [--flush-denormals {on,off}] [--isa {baseline,avx2,avx512}] [--trace FILE]
//   remat_bench --sweep {mlp,deep,gpt} [--out DIR] [--steps N] [--threads T]
//
// Models (float): mlp = 32 x (Linear 1024->1024 + GELU), batch 256; deep = 1000 x (Linear
// 256->256 + tanh), batch 64; gpt = 8 blocks, width 256, 4 heads, context 256, batch 8,
// vocabulary 256 (the planners see its blocks); --context and --batch change its sequence length
// and batch, --attention its attention op (AttentionKernel). Loss: cross-entropy against random
// integer targets (the GPT's is chunked, ops/loss.hpp). One training step = forward, loss,
// backward, AdamW update. --policy puts a save policy (core/save_policy.hpp) on every segment of
// the plan (plan::with_policy).
//
// Only the plan asked for runs before the timed steps, so that the process's peak resident
// memory (process_peak_mb) is that plan's: for none, every and sqrt (whose segments depend on
// the layer count alone) the warm-up step (which allocates the gradient and optimizer buffers
// every later step reuses) and the timed steps run the plan, the process's peak is read, and
// only then is the chain profiled (plan::profile runs it without checkpoints) for the predicted
// figures. budget and optimal plans need the profile first; their process_peak_mb includes it
// ("profiled_first": true). N steps are timed after one untimed step of the plan.
//
// --trace FILE writes the memory timeline of one step of --mode (remat::Trace, Chrome trace event
// format) and prints to stderr the median step time with and without the trace. `--help` lists
// every flag with its default.
// budget:<MiB> chooses per block among keeping it, a save policy (the gpt is profiled with
// save_matmuls, save_ops(linear, attention) and recompute_ops(attention),
// which replays only the attention core as Korthikanti et al. (2022) do) and save_nothing segments;
// budget_layers:<MiB> only among keeping and save_nothing segments (the layer-level planner).
// The gpt is also profiled with up to --derived-policies N (default 6) recompute policies that
// plan::profile derives from the block: its op classes (op name, and output shape where one name
// makes several) taken in order of forward time per byte freed (Note [derived policies] in
// checkpoint/profile.hpp); stderr names every profiled policy. --describe writes each plan's
// Plan::describe() (per block: plain, which policy, or replayed) to stderr.
// --print-plan writes the plan's top-level segments and their save policies as JSON (for
// benchmarks/torch_reference.py, which runs plans whose segments keep nothing).
// --sweep runs none, every, sqrt, budgets and binomial plans in one process (one JSON line each)
// and writes DIR/sweep_MODEL.csv (measured and predicted step time and peak of each plan; default
// DIR docs/figures), which benchmarks/report.py draws with matplotlib.
// gflops counts the step's GEMM work over the forward + backward time; peak_share divides it by
// this machine's single-precision GEMM rate (n = 1024, measured at start unless --gemm-peak).
// Prints one JSON object:
//   step_s            median wall time of a training step (forward + backward + AdamW)
//   fwd_bwd_s         median wall time of forward + backward alone
//   act_peak_mb       counted peak during forward + backward minus live bytes before it (MiB)
//   predicted_peak_mb the plan's predicted peak (MiB); null when a policy keeps ops in segments
//                     the simulator does not model (over several layers, or a policy the
//                     profile did not measure), or when layers share a saved bfloat16 copy the
//                     profile could not price (Chain::unpriced_copies; stderr says so)
//   recompute         the plan's extra forward work, as a fraction of one forward pass
//   recompute_s       measured time spent replaying segments during one step's backward pass
//                     (median; the tape's replay clock, TapeState::stats().replay_seconds)
//   policy            the save policy on the plan's segments (--policy)
//   attention         gpt only: the attention op; context and batch: the gpt's T and B
//   process_peak_mb   the process's peak resident memory so far (getrusage ru_maxrss, MiB)
//   loss              the loss of the last step (equal across modes: gradients are exact)
//   cpu, isa          the CPU's name and the instruction set remat's dispatched kernels ran
//                     (the CPU's widest unless --isa forces a narrower one)
//   gemm, gemm_reason the GEMM backend remat chose and why (remat::gemm_backend())
//   flush_denormals   whether kernels flushed subnormal numbers (--flush-denormals, default on)
// The same machine description goes to stderr at start.
#include "../examples/flags.hpp"
#include "bench_util.hpp"

#include <algorithm>
#include <remat/optim/adamw.hpp>

#include <sys/resource.h>

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
  std::function<remat::plan::Chain()> profile;                             // measures the chain
  std::function<Var<float>(remat::Tape&, const remat::plan::Plan&)> loss;  // one step's loss
  std::function<double(double)> flops;  // GEMM FLOPs of forward + backward + recompute
};

/// n x (Linear width->width + activation) on a (batch, width) input, cross-entropy over width
/// classes.
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
        return gelu ? remat::gelu_tanh(z) : remat::tanh(z);
      });
    }
    m.parameters = weights;
    m.parameters.insert(m.parameters.end(), biases.begin(), biases.end());
    const auto head = [this](const Var<float>& y) { return remat::cross_entropy(y, targets); };
    m.profile = [this, chain = m.chain, head] {
      remat::plan::Chain c = remat::plan::profile(chain, x, head);
      c.output_held = false;  // the step keeps no Var of the output; cross_entropy saves it
      return c;
    };
    m.loss = [this, chain = m.chain, head](remat::Tape& tape, const remat::plan::Plan& p) {
      return head(remat::checkpoint_sequential(chain, p, tape.input(x)));
    };
    // forward F = 2 L B W^2; backward dW (F) and dx (F, minus layer 0's: its input needs none)
    const double forward = 2.0 * layers * double(batch) * width * width;
    m.flops = [forward, per_layer = forward / layers](double recompute) {
      return (3 + recompute) * forward - per_layer;
    };
    return m;
  }
};

/// GPT: 8 blocks, width 256, 4 heads, context 256, batch 8, vocabulary 256; random tokens.
struct GptModel {
  static constexpr std::int64_t kVocab = 256, kWidth = 256, kLayers = 8;
  std::unique_ptr<remat::nn::GPT<float>> gpt;
  Tensor<std::int32_t> ids, targets;

  Model make(std::int64_t context, std::int64_t batch, remat::AttentionKernel attention,
             std::size_t derived) {
    gpt = std::make_unique<remat::nn::GPT<float>>(remat::nn::GPTConfig{.vocab = kVocab,
                                                                       .context = context,
                                                                       .layers = kLayers,
                                                                       .heads = 4,
                                                                       .width = kWidth,
                                                                       .seed = 1,
                                                                       .attention = attention});
    remat::Rng data(2);
    ids = Tensor<std::int32_t>({batch, context});
    targets = Tensor<std::int32_t>({batch, context});
    for (auto& t : ids) t = static_cast<std::int32_t>(data.uniform_int(kVocab));
    for (auto& t : targets) t = static_cast<std::int32_t>(data.uniform_int(kVocab));
    Model m;
    m.name = "gpt";
    m.chain = gpt->block_layers();
    m.parameters = gpt->parameters();
    // the op-level choices budget:<MiB> has per block besides keeping or replaying it whole:
    // three named policies and up to `derived` recompute policies plan::profile derives from
    // the block (Note [derived policies] in checkpoint/derive_policies.hpp)
    m.profile = [this, derived] {
      return gpt->profile(ids, targets, {},
                          {.policies = {remat::save_matmuls(),
                                        remat::save_ops({remat::op::linear, remat::op::attention}),
                                        remat::recompute_ops({remat::op::attention})},
                           .derived_policies = derived});
    };
    m.loss = [this](remat::Tape&, const remat::plan::Plan& p) {
      return gpt->loss(ids, targets, {.plan = &p});
    };
    const double tokens = double(batch * context);
    // per token and block: Q, K, V, output, two MLP projections (12 C^2 multiply-adds), and
    // attention scores and weighted values over the whole context (2 T C); plus the head.
    const double blocks =
        2.0 * tokens * kLayers * (12.0 * kWidth * kWidth + 2.0 * double(context) * kWidth);
    const double head = 2.0 * tokens * kWidth * kVocab;  // chunked: 1 GEMM forward, 3 backward
    m.flops = [blocks, head](double recompute) { return (3 + recompute) * blocks + 4 * head; };
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
    const std::string text = mode.substr(colon + 1);
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    const bool number = !text.empty() && *end == '\0' && std::isfinite(value) && value >= 0;
    // budget: per layer, plain, a save policy, or save_nothing segments; budget_layers: no policies
    if (number && kind == "budget") return plan::budget(chain, value * 1024 * 1024);
    if (number && kind == "budget_layers") {
      plan::Chain layers = chain;
      layers.policies.clear();
      return plan::budget(layers, value * 1024 * 1024);
    }
    if (number && kind == "optimal") return plan::optimal(chain, static_cast<std::size_t>(value));
  }
  throw remat::ArgumentError(
      "remat_bench: --mode must be none, every, sqrt, budget:<MiB>, budget_layers:<MiB> or "
      "optimal:<slots>, got " +
      mode);
}

/// Whether `mode`'s segments follow from the layer count alone (no profile needed to plan).
bool planned_from_layer_count(const std::string& mode) {
  return mode == "none" || mode == "every" || mode == "sqrt";
}

/// `mode`'s plan from the layer count alone (planned_from_layer_count()).
remat::plan::Plan make_unmeasured_plan(const std::string& mode, std::size_t layers) {
  namespace plan = remat::plan;
  if (mode == "none") return plan::none(layers);
  if (mode == "every") return plan::every(layers);
  return plan::sqrt(layers);
}

/// The save policy named on the command line.
remat::SavePolicy make_policy(const std::string& name) {
  if (name == "save_nothing") return remat::save_nothing();
  if (name == "save_matmuls") return remat::save_matmuls();
  const auto colon = name.find(':');
  if (colon != std::string::npos) {
    remat::OpTypes ops;
    std::string rest = name.substr(colon + 1);
    for (std::size_t at = 0; at <= rest.size();) {
      const std::size_t comma = std::min(rest.find(',', at), rest.size());
      if (comma > at) ops.push_back(remat::op_type_named(rest.substr(at, comma - at), "--policy"));
      at = comma + 1;
    }
    const std::string kind = name.substr(0, colon);
    if (kind == "save_ops" && !ops.empty()) return remat::save_ops(ops);
    if (kind == "recompute_ops" && !ops.empty()) return remat::recompute_ops(ops);
  }
  throw remat::ArgumentError(
      "remat_bench: --policy must be save_nothing, save_matmuls, save_ops:<op,...> or "
      "recompute_ops:<op,...>, got " +
      name);
}

/// The process's peak resident memory so far, in MiB (Linux reports ru_maxrss in KiB).
double process_peak_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

/// `p` with the --policy asked for on every segment; without one (save_nothing), `p` as planned,
/// so that the per-layer policies of an op-level budget plan stay. Given the profiled chain, a
/// plan of one-layer segments (every) under a policy the chain was profiled with is predicted
/// (Note [policy layers] and [chained policy layers] in plan/simulator.hpp).
remat::plan::Plan apply_policy(const remat::plan::Plan& p, const remat::SavePolicy& policy,
                               const remat::plan::Chain* chain = nullptr) {
  if (!policy.keeps_anything()) return p;
  remat::plan::Plan out = remat::plan::with_policy(p, policy);
  const bool one_layer_segments = std::all_of(
      out.segments.begin(), out.segments.end(),
      [](const remat::plan::Segment& s) { return s.end == s.begin + 1 && s.children.empty(); });
  if (chain && chain->policy_index(policy) >= 0 && one_layer_segments)
    return remat::plan::custom(*chain, out.segments, p.kind);
  return out;
}

struct Result {
  remat::plan::Plan plan;
  std::string mode;
  double step_s = 0, fwd_s = 0, fwd_bwd_s = 0, recompute_s = 0, peak = 0;
  double process_peak_mb = 0;  // the process's peak resident memory after the timed steps
  bool profiled_first =
      false;  // the profile ran before the timed steps (it counts in process_peak_mb)
  float loss = 0;
};

/// Trains `steps` steps under each plan and returns the medians (and the worst peak).
class Bench {
 public:
  Bench(Model& model, int steps)
      : model_(model),
        steps_(steps),
        optimizer_(model.parameters, {.lr = 1e-4, .weight_decay = 0.0}) {}

  /// One warm-up step of `p` (it allocates the gradient and AdamW buffers), then the chain
  /// profiled; chain() before this is empty.
  void profile(const remat::plan::Plan& warm_up) {
    step(warm_up);
    chain_ = model_.profile();
    optimizer_.zero_grad();
    for (const remat::plan::PolicyCosts& q : chain_.policies)
      std::fprintf(stderr, "remat_bench: profiled policy %s\n", q.policy.name().c_str());
    if (chain_.unpriced_copies)
      std::fprintf(stderr,
                   "remat_bench: layers share a bfloat16 copy the profile cannot price "
                   "(Chain::unpriced_copies): peaks are counted, not predicted\n");
    // what each derived policy's last class adds (all layers), next to replaying whole layers
    const double mib = 1024.0 * 1024.0;
    double freed = 0, seconds = 0;
    for (const remat::plan::DerivedPolicy& d : chain_.derived) {
      const double more = (d.freed_bytes - freed) / mib, ms = (d.seconds - seconds) * 1e3;
      std::fprintf(stderr,
                   "remat_bench: derived %s: + %s frees %.2f MiB for %.2f ms of forward (%.3f "
                   "ms/MiB)\n",
                   d.policy.name().c_str(), d.classes.back().c_str(), more, ms, ms / more);
      freed = d.freed_bytes;
      seconds = d.seconds;
    }
    if (!chain_.derived.empty()) {
      double kept = 0;
      for (double a : chain_.activation_bytes) kept += a;
      const double ms = chain_.total_cost() * 1e3;
      std::fprintf(stderr,
                   "remat_bench: whole layers: %.2f MiB kept besides boundaries, %.2f ms of "
                   "replay (%.3f ms/MiB)\n",
                   kept / mib, ms, ms / (kept / mib));
    }
    profiled_ = true;
  }
  bool profiled() const noexcept { return profiled_; }

  const remat::plan::Chain& chain() const noexcept { return chain_; }

  /// Runs `steps` steps of plan p, each inside a remat::Trace, saves the last one's trace to
  /// `path` and returns the median step time.
  double traced(const remat::plan::Plan& p, int steps, const std::string& path) {
    std::vector<double> step_s;
    for (int i = 0; i < steps; ++i) {
      remat::Trace trace;
      step_s.push_back(step(p).step_s);
      trace.stop();
      if (i + 1 == steps) trace.save_chrome_json(path);
    }
    return bench::median(step_s);
  }

  Result measure(const std::string& mode, const remat::plan::Plan& p) {
    step(p);  // not counted: the first step of a plan fills the allocator's cache with its sizes
    Result r{p, mode};
    r.profiled_first = profiled_;
    std::vector<double> step_s, fwd_s, fwd_bwd_s, recompute_s;
    for (int i = 0; i < steps_; ++i) {
      const Result one = step(p);
      step_s.push_back(one.step_s);
      fwd_s.push_back(one.fwd_s);
      fwd_bwd_s.push_back(one.fwd_bwd_s);
      recompute_s.push_back(one.recompute_s);
      r.peak = std::max(r.peak, one.peak);
      r.loss = one.loss;
    }
    r.step_s = bench::median(step_s), r.fwd_s = bench::median(fwd_s),
    r.fwd_bwd_s = bench::median(fwd_bwd_s);
    r.recompute_s = bench::median(recompute_s);
    r.process_peak_mb = process_peak_mib();
    return r;
  }

 private:
  Result step(const remat::plan::Plan& p) {
    Result t;
    const double t0 = bench::now_seconds();
    {
      remat::memory::Probe probe;
      remat::Tape tape;
      const Var<float> loss = model_.loss(tape, p);
      t.fwd_s = bench::now_seconds() - t0;
      tape.backward(loss);
      t.peak = static_cast<double>(probe.peak_above_start());
      t.recompute_s = tape.replay_stats().replay_seconds;
      t.loss = loss.item();
    }
    t.fwd_bwd_s = bench::now_seconds() - t0;
    optimizer_.step();
    optimizer_.zero_grad();
    t.step_s = bench::now_seconds() - t0;
    return t;
  }

  Model& model_;
  int steps_;
  remat::optim::AdamW<float> optimizer_;
  remat::plan::Chain chain_;
  bool profiled_ = false;
};

/// What print_json() says about the run besides the result.
struct RunInfo {
  int threads = 1, steps = 5;
  double gemm_peak = 0;
  std::string policy = "save_nothing";
  std::string dtype = "f32";
  std::string gpt_fields;  // ", \"attention\": ..., \"context\": ..., \"batch\": ..." for gpt
};

void print_json(const Model& model, const Result& r, const RunInfo& run) {
  const double mib = 1024.0 * 1024.0;
  const double gflops = model.flops(r.plan.recompute_fraction) / r.fwd_bwd_s / 1e9;
  char predicted[32] = "null";
  if (r.plan.predicted) std::snprintf(predicted, sizeof predicted, "%.2f", r.plan.peak_bytes / mib);
  std::printf(
      "{\"model\": \"%s\", \"mode\": \"%s\", \"policy\": \"%s\", \"dtype\": \"%s\"%s, \"threads\": "
      "%d, \"steps\": %d, "
      "\"step_s\": %.4f, "
      "\"fwd_s\": %.4f, \"fwd_bwd_s\": %.4f, \"act_peak_mb\": %.2f, \"predicted_peak_mb\": %s, "
      "\"recompute\": %.3f, "
      "\"recompute_s\": %.4f, \"process_peak_mb\": %.1f, \"profiled_first\": %s, "
      "\"segments\": %zu, \"depth\": %d, \"gflops\": %.1f, \"gemm_peak_gflops\": %.1f, "
      "\"peak_share\": %.3f, \"loss\": %.6f, "
      "\"cpu\": \"%s\", \"isa\": \"%s\", \"gemm\": \"%s\", \"gemm_reason\": \"%s\", "
      "\"flush_denormals\": %s}\n",
      model.name.c_str(), r.mode.c_str(), run.policy.c_str(), run.dtype.c_str(),
      run.gpt_fields.c_str(), run.threads, run.steps, r.step_s, r.fwd_s, r.fwd_bwd_s, r.peak / mib,
      predicted, r.plan.recompute_fraction, r.recompute_s, r.process_peak_mb,
      r.profiled_first ? "true" : "false", r.plan.segment_count(), r.plan.depth(), gflops,
      run.gemm_peak, gflops / run.gemm_peak, r.loss, remat::cpu_name().c_str(),
      remat::to_string(remat::active_isa()), remat::gemm_backend().name.c_str(),
      remat::gemm_backend().reason.c_str(), remat::flush_denormals() ? "true" : "false");
  std::fflush(stdout);
}

/// The plans of a sweep: none, every, sqrt, budgets between sqrt's and none's peaks and below,
/// and binomial plans with a few checkpoint counts; each once. With op-level choices (a chain
/// profiled under policies) every budget is planned twice, op-level (budget:) and layer-level
/// (budget_layers:), so the figure shows both frontiers.
std::vector<std::pair<std::string, remat::plan::Plan>> sweep_plans(
    const remat::plan::Chain& chain) {
  namespace plan = remat::plan;
  std::vector<std::pair<std::string, plan::Plan>> out = {
      {"none", plan::none(chain)}, {"every", plan::every(chain)}, {"sqrt", plan::sqrt(chain)}};
  const double none_peak = plan::none(chain).peak_bytes, least = plan::optimal(chain, 0).peak_bytes;
  for (double fraction : {0.75, 0.5, 0.3, 0.2, 0.1, 0.05}) {
    const double bytes = fraction * none_peak;
    if (bytes < least) continue;
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.1f", bytes / (1024.0 * 1024.0));
    out.emplace_back(std::string("budget:") + mib, make_plan(std::string("budget:") + mib, chain));
    if (!chain.policies.empty()) {
      const std::string layers = std::string("budget_layers:") + mib;
      out.emplace_back(layers, make_plan(layers, chain));
    }
  }
  // binomial plans recomputing at most four forward passes (fewer slots cost more)
  for (std::size_t slots : {16, 8, 4, 2, 1}) {
    if (slots >= chain.layers()) continue;
    plan::Plan p = plan::optimal(chain, slots);
    if (p.recompute_fraction > 4) break;
    out.emplace_back("optimal:" + std::to_string(slots), std::move(p));
  }
  return out;
}

void write_sweep(const Model& model, const std::vector<Result>& results, const std::string& dir,
                 double none_step) {
  const std::string csv = dir + "/sweep_" + model.name + ".csv";
  std::FILE* f = std::fopen(csv.c_str(), "w");
  if (!f) throw remat::IoError("remat_bench: cannot write " + csv);
  std::fprintf(
      f, "mode,step_s,predicted_step_s,act_peak_mb,predicted_peak_mb,recompute,segments,depth\n");
  for (const Result& r : results) {
    // predicted step: the none step plus the profiled seconds of forward work the plan replays
    const double predicted_step = none_step + r.plan.recompute;
    std::fprintf(f, "%s,%.4f,%.4f,%.3f,%.3f,%.4f,%zu,%d\n", r.mode.c_str(), r.step_s,
                 predicted_step, r.peak / 1048576.0, r.plan.peak_bytes / 1048576.0,
                 r.plan.recompute_fraction, r.plan.segment_count(), r.plan.depth());
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "mlp", mode = "none", sweep, flush = "on", isa, out_dir = "docs/figures",
              print_plan, trace_file;
  std::string policy_name = "save_nothing", attention = "fused", dtype = "f32", bf16_kernel;
  int steps = 5, threads = 1;
  std::size_t derived = 6;
  bool describe = false;
  std::int64_t context = 256, batch = 8;
  double gemm_peak = 0;
  CLI::App app("The memory/time trade-off of checkpointing, measured: one JSON line per plan.");
  app.add_option("--model", model_name, "model: mlp, deep or gpt")
      ->check(CLI::IsMember({"mlp", "deep", "gpt"}))
      ->capture_default_str();
  app.add_option("--mode", mode,
                 "plan: none, every, sqrt, budget:<MiB> (op-level), budget_layers:<MiB> or "
                 "optimal:<slots>; "
                 "a comma-separated list runs each on one profile")
      ->capture_default_str();
  app.add_option("--policy", policy_name,
                 "save policy on every segment: save_nothing, save_matmuls, save_ops:<op,...> or "
                 "recompute_ops:<op,...>")
      ->capture_default_str();
  app.add_option("--dtype", dtype,
                 "what steps compute in: f32, or bf16 (bfloat16 GEMMs and saved activations)")
      ->check(flags::precision_name)
      ->capture_default_str();
  app.add_option("--bf16-kernel", bf16_kernel,
                 "force gemm_bf16's kernel (convert: a CPU without BF16 instructions)")
      ->check(CLI::IsMember({"convert", "avx512_bf16", "amx"}));
  app.add_option("--attention", attention, "gpt's attention op")
      ->check(CLI::IsMember({"fused", "flash"}))
      ->capture_default_str();
  app.add_option("--context", context, "gpt's sequence length (and context)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--batch", batch, "gpt's batch (sequences per step)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--derived-policies", derived,
                 "gpt: recompute policies plan::profile derives from the block for budget:<MiB> "
                 "(besides save_matmuls, save_ops:linear,attention and "
                 "recompute_ops:attention)")
      ->capture_default_str();
  app.add_flag("--describe", describe, "write each plan's Plan::describe() to stderr");
  app.add_option("--sweep", sweep,
                 "run every plan of a sweep on this model and write DIR/sweep_MODEL.csv")
      ->check(CLI::IsMember({"mlp", "deep", "gpt"}));
  app.add_option("--out", out_dir, "directory of --sweep's CSV")->capture_default_str();
  app.add_option("--steps", steps, "timed steps per plan (medians)")
      ->check(flags::positive)
      ->capture_default_str();
  app.add_option("--threads", threads, "worker threads")
      ->check(flags::thread_count(false))
      ->capture_default_str();
  app.add_option("--print-plan", print_plan,
                 "write the plan's top-level segments as JSON to this file");
  app.add_option("--gemm-peak", gemm_peak,
                 "this machine's GEMM GFLOP/s (default: measured at start)")
      ->check(flags::positive);
  app.add_option("--flush-denormals", flush, "flush subnormal numbers in kernels")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--isa", isa, "force the dispatched kernels' instruction set")
      ->check(CLI::IsMember({"baseline", "avx2", "avx512"}));
  app.add_option(
      "--trace", trace_file,
      "write the memory timeline of one step of --mode (Chrome trace JSON) to this file");
  app.get_option("--out")->check(flags::output_dir);
  app.get_option("--print-plan")->check(flags::output_file);
  app.get_option("--trace")->check(flags::output_file);
  app.get_option("--derived-policies")->check(flags::count);
  flags::parse(app, argc, argv);
  return flags::run_main("remat_bench", [&] {
    if (!sweep.empty()) model_name = sweep;
    if (model_name == "gpt") {  // its weights, gradients and moments, and what a step keeps
      const double w = GptModel::kWidth, layers = GptModel::kLayers,
                   tokens = double(batch) * double(context);
      flags::fits(
          "remat_bench",
          "gpt with --context " + std::to_string(context) + " --batch " + std::to_string(batch),
          16 * (layers * 12 * w * w + double(context) * w) + 4 * tokens * w * layers * 2 +
              4 * double(batch) * double(context) * 2);
    }
    remat::set_num_threads(threads);
    remat::set_flush_denormals(flush == "on");
    if (isa == "baseline")
      remat::set_isa(remat::Isa::baseline);
    else if (isa == "avx2")
      remat::set_isa(remat::Isa::avx2);
    else if (isa == "avx512")
      remat::set_isa(remat::Isa::avx512);
    // the machine and what remat chose on it, for a reader of the terminal (JSON carries the same)
    std::fprintf(stderr, "remat_bench: %s (%s); GEMM: %s: %s; flush denormals: %s\n",
                 remat::cpu_name().c_str(), remat::to_string(remat::active_isa()),
                 remat::gemm_backend().name.c_str(), remat::gemm_backend().reason.c_str(),
                 flush.c_str());
    remat::manual_seed(1);
    if (gemm_peak == 0) gemm_peak = bench::gemm_gflops(1024, 5);
    // the profile, the plans' search and every timed step compute in --dtype
    const remat::PrecisionGuard precision(remat::parse_precision(dtype, "--dtype"));
    for (const remat::Bf16Kernel k :
         {remat::Bf16Kernel::convert, remat::Bf16Kernel::avx512_bf16, remat::Bf16Kernel::amx})
      if (bf16_kernel == remat::to_string(k)) remat::set_bf16_kernel(k);
    if (remat::current_precision() == remat::Precision::bf16)
      std::fprintf(stderr, "remat_bench: BF16 GEMM kernel: %s\n",
                   remat::to_string(remat::bf16_kernel()));

    ChainModel chain_model;
    GptModel gpt_model;
    Model model;
    const remat::AttentionKernel attention_kind =
        attention == "flash" ? remat::AttentionKernel::flash : remat::AttentionKernel::fused;
    if (model_name == "mlp")
      model = chain_model.make("mlp", 32, 1024, 256, true);
    else if (model_name == "deep")
      model = chain_model.make("deep", 1000, 256, 64, false);
    else
      model = gpt_model.make(context, batch, attention_kind, derived);
    const remat::SavePolicy policy = make_policy(policy_name);
    RunInfo run{threads, steps, gemm_peak, policy.name(), dtype, ""};
    if (model_name == "gpt") {
      run.gpt_fields = remat::detail::cat(", \"attention\": \"", attention,
                                          "\", \"context\": ", context, ", \"batch\": ", batch);
    }
    Bench bench_(model, steps);

    if (!sweep.empty()) {
      bench_.profile(remat::plan::none(model.chain.size()));
      std::vector<Result> results;
      for (const auto& [name, p] : sweep_plans(bench_.chain())) {
        results.push_back(bench_.measure(name, apply_policy(p, policy)));
        print_json(model, results.back(), run);
      }
      write_sweep(model, results, out_dir, results.front().step_s);
      return 0;
    }
    if (mode.find(',') != std::string::npos) {  // several modes, one profile: one JSON line each
      bench_.profile(apply_policy(make_unmeasured_plan("none", model.chain.size()), policy));
      for (std::size_t at = 0; at <= mode.size();) {
        const std::size_t comma = std::min(mode.find(',', at), mode.size());
        const std::string one = mode.substr(at, comma - at);
        const remat::plan::Plan p =
            apply_policy(make_plan(one, bench_.chain()), policy, &bench_.chain());
        if (describe) std::fprintf(stderr, "%s: %s\n", one.c_str(), p.describe().c_str());
        print_json(model, bench_.measure(one, p), run);
        at = comma + 1;
      }
      return 0;
    }
    // Only the plan asked for runs before the timed steps (see the file comment).
    const bool early = planned_from_layer_count(mode);
    if (!early)
      bench_.profile(apply_policy(make_unmeasured_plan("none", model.chain.size()), policy));
    const remat::plan::Plan p = apply_policy(
        early ? make_unmeasured_plan(mode, model.chain.size()) : make_plan(mode, bench_.chain()),
        policy, early ? nullptr : &bench_.chain());
    if (!print_plan.empty()) {
      std::FILE* out = std::fopen(print_plan.c_str(), "w");
      if (!out) throw remat::IoError("remat_bench: cannot write " + print_plan);
      std::fprintf(out, "{\"kind\": \"%s\", \"segments\": [", remat::plan::to_string(p.kind));
      for (std::size_t i = 0; i < p.segments.size(); ++i) {
        std::fprintf(out, "%s[%zu, %zu]", i ? ", " : "", p.segments[i].begin, p.segments[i].end);
      }
      std::fprintf(out, "], \"policies\": [");
      for (std::size_t i = 0; i < p.segments.size(); ++i) {
        // built-in policy names hold no quote or backslash
        std::fprintf(out, "%s\"%s\"", i ? ", " : "", p.segments[i].policy.name().c_str());
      }
      std::fprintf(out, "], \"depth\": %d}\n", p.depth());
      std::fclose(out);
    }
    Result r = bench_.measure(mode, p);
    if (early) {
      // the prediction, now that the process's peak is read: the same segments priced on the
      // profile
      bench_.profile(p);
      r.plan = apply_policy(make_plan(mode, bench_.chain()), policy, &bench_.chain());
      if (r.plan.segments.size() != p.segments.size())
        throw remat::Error("remat_bench: internal error: the profiled plan differs");
    }
    print_json(model, r, run);
    if (!trace_file.empty()) {
      // as many traced steps as timed ones: the overhead of tracing is the difference of medians
      const double traced_s = bench_.traced(p, steps, trace_file);
      std::fprintf(stderr,
                   "remat_bench: trace of one %s step in %s; step %.4f s traced, %.4f s untraced "
                   "(medians of %d)\n",
                   mode.c_str(), trace_file.c_str(), traced_s, r.step_s, steps);
    }
    return 0;
  });
}
