// Will it fit? Predicts the memory of one training step of a GPT before allocating anything:
// parameters, gradients, optimizer state, activations under each checkpoint plan, and logits.
//
//   will_it_fit [--layers N] [--width C] [--heads H] [--context T] [--vocab V] [--batch B]
//               [--time T] [--dtype float|double] [--optimizer adamw|momentum|sgd] [--tied]
//               [--plain-loss] [--memory GiB] [--budget MiB] [--json]
//
// The defaults are GPT-2 small (12 layers, width 768, 12 heads, context 1024, vocabulary 50257)
// with a batch of 8. --memory is what you have (default: this machine's physical memory); the
// last lines give, for each plan, the largest batch that fits in it. --budget adds the plan with
// the least recompute whose activations fit in that many MiB. With --json the output is one
// JSON object instead.
#include <remat/checkpoint/plan.hpp>
#include <remat/nn/estimate.hpp>

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <vector>

namespace {

using remat::nn::GPTConfig;
using remat::nn::MemoryEstimate;
using remat::nn::StepShape;
namespace plan = remat::plan;

struct Options {
  GPTConfig config{.vocab = 50257, .context = 1024, .layers = 12, .heads = 12, .width = 768};
  StepShape step{.batch = 8};
  bool double_precision = false, json = false;
  double memory_gib = 0, budget_mib = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "will_it_fit: %s\n(see the comment at the top of examples/will_it_fit.cpp for the flags)\n", why.c_str());
  std::exit(2);
}

double physical_memory_gib() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 30);
}

Options parse(int argc, char** argv) {
  Options o;
  const std::map<std::string, std::int64_t*> ints = {{"--layers", &o.config.layers}, {"--width", &o.config.width},
                                                     {"--heads", &o.config.heads},   {"--context", &o.config.context},
                                                     {"--vocab", &o.config.vocab},   {"--batch", &o.step.batch},
                                                     {"--time", &o.step.time}};
  const std::map<std::string, double*> reals = {{"--memory", &o.memory_gib}, {"--budget", &o.budget_mib}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("flags");
    if (flag == "--json" || flag == "--tied" || flag == "--plain-loss") {
      (flag == "--json" ? o.json : flag == "--tied" ? o.config.tied : o.step.chunked_loss) = flag != "--plain-loss";
      continue;
    }
    if (i + 1 >= argc) usage("missing value after " + flag);
    const std::string value = argv[++i];
    char* end = nullptr;
    errno = 0;
    if (auto it = ints.find(flag); it != ints.end()) {
      *it->second = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end || errno || *it->second < 0) usage("bad value for " + flag + ": '" + value + "'");
    } else if (auto r = reals.find(flag); r != reals.end()) {
      *r->second = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || errno || !std::isfinite(*r->second) || !(*r->second > 0)) {
        usage("bad value for " + flag + ": '" + value + "' (a positive number)");
      }
    } else if (flag == "--dtype" && (value == "float" || value == "double")) {
      o.double_precision = value == "double";
    } else if (flag == "--optimizer" && (value == "adamw" || value == "momentum" || value == "sgd")) {
      o.step.optimizer = value == "adamw"      ? remat::nn::OptimizerKind::adamw
                         : value == "momentum" ? remat::nn::OptimizerKind::sgd_momentum
                                               : remat::nn::OptimizerKind::sgd;
    } else {
      usage("unknown flag or value: " + flag + " " + value);
    }
  }
  if (o.memory_gib == 0) o.memory_gib = physical_memory_gib();
  return o;
}

MemoryEstimate estimate(const Options& o, std::int64_t batch) {
  StepShape step = o.step;
  step.batch = batch;
  return o.double_precision ? remat::nn::estimate_memory<double>(o.config, step)
                            : remat::nn::estimate_memory<float>(o.config, step);
}

/// The plans priced: none, every, sqrt, two- and one-slot optimal, and --budget's.
std::vector<plan::Plan> plans(const Options& o, const MemoryEstimate& e) {
  std::vector<plan::Plan> out = {plan::none(e.chain), plan::every(e.chain), plan::sqrt(e.chain), plan::optimal(e.chain, 2),
                                 plan::optimal(e.chain, 1)};
  if (o.budget_mib > 0) out.push_back(plan::budget(e.chain, o.budget_mib * (1 << 20)));
  return out;
}

/// The name a plan goes by on remat_bench's --mode (train_gpt's --checkpoint takes the first four).
std::string name(const plan::Plan& p, const Options& o) {
  char buf[64];
  if (p.kind == remat::plan::Kind::budget) std::snprintf(buf, sizeof buf, "budget:%g", o.budget_mib);
  else if (p.kind == remat::plan::Kind::optimal) std::snprintf(buf, sizeof buf, "optimal:%d", p.slots);
  else return remat::plan::to_string(p.kind);
  return buf;
}

/// The largest batch whose step fits in `bytes` with `p`'s segments (0: not even one sequence;
/// the search stops at 2^30 sequences).
std::int64_t largest_batch(const Options& o, const plan::Plan& p, double bytes) {
  const auto fits = [&](std::int64_t b) { return estimate(o, b).total(p) <= bytes; };
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

void print_table(const Options& o, const MemoryEstimate& e, const std::vector<plan::Plan>& ps) {
  const GPTConfig& c = o.config;
  const std::int64_t time = o.step.time == 0 ? c.context : o.step.time;
  const double memory = o.memory_gib * (1 << 30);
  std::printf("GPT: %lld layers, width %lld, %lld heads, context %lld, vocabulary %lld%s (%s): %.1f M parameters\n",
              static_cast<long long>(c.layers), static_cast<long long>(c.width), static_cast<long long>(c.heads),
              static_cast<long long>(c.context), static_cast<long long>(c.vocab), c.tied ? ", tied head" : "",
              o.double_precision ? "double" : "float", static_cast<double>(e.parameter_count) / 1e6);
  std::printf("step: batch %lld x %lld tokens, %s loss\n\n", static_cast<long long>(o.step.batch),
              static_cast<long long>(time), o.step.chunked_loss ? "chunked" : "plain");
  std::printf("held between steps\n");
  std::printf("  %-28s %12s\n", "parameters", human(e.parameters).c_str());
  std::printf("  %-28s %12s\n", "gradients", human(e.gradients).c_str());
  std::printf("  %-28s %12s\n", "optimizer state", human(e.optimizer_state).c_str());
  std::printf("  %-28s %12s\n", "token ids and targets", human(e.data).c_str());
  std::printf("logits (B T x V): %s, and as much again for their gradient; the chunked loss holds %s at a time\n\n",
              human(e.logits).c_str(), human(e.loss_chunk).c_str());
  std::printf("  %-14s %14s %14s %11s %10s %12s\n", "plan", "activations", "step total", "recompute", "fits?", "max batch");
  for (const plan::Plan& p : ps) {
    const double total = e.total(p);
    std::printf("  %-14s %14s %14s %10.0f%% %10s %12lld\n", name(p, o).c_str(), human(e.activations(p)).c_str(),
                human(total).c_str(), 100 * p.recompute_fraction, total <= memory ? "yes" : "no",
                static_cast<long long>(largest_batch(o, p, memory)));
  }
  std::printf("\n(fits? and max batch: within %s; max batch keeps --time fixed)\n", human(memory).c_str());
}

void print_json(const Options& o, const MemoryEstimate& e, const std::vector<plan::Plan>& ps) {
  std::printf("{\"parameter_count\": %lld, \"parameters\": %.0f, \"gradients\": %.0f, \"optimizer_state\": %.0f, "
              "\"data\": %.0f, \"logits\": %.0f, \"loss_chunk\": %.0f, \"memory\": %.0f, \"plans\": [",
              static_cast<long long>(e.parameter_count), e.parameters, e.gradients, e.optimizer_state, e.data, e.logits,
              e.loss_chunk, o.memory_gib * (1 << 30));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    std::printf("%s{\"plan\": \"%s\", \"activations\": %.0f, \"total\": %.0f, \"recompute\": %.4f, \"max_batch\": %lld}",
                i ? ", " : "", name(ps[i], o).c_str(), e.activations(ps[i]), e.total(ps[i]), ps[i].recompute_fraction,
                static_cast<long long>(largest_batch(o, ps[i], o.memory_gib * (1 << 30))));
  }
  std::printf("]}\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    const MemoryEstimate e = estimate(o, o.step.batch);
    const std::vector<plan::Plan> ps = plans(o, e);  // before printing: a budget too small throws
    o.json ? print_json(o, e, ps) : print_table(o, e, ps);
  } catch (const std::exception& err) {  // remat::Error for what it rejects; bad_alloc, say, for the rest
    std::fprintf(stderr, "will_it_fit: %s\n", err.what());
    return 1;
  }
  return 0;
}
