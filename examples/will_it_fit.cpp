// Will it fit? Predicts the memory of one training step of a GPT before allocating anything:
// parameters, gradients, optimizer state, activations under each checkpoint plan, and logits.
//
//   will_it_fit [--layers N] [--width C] [--heads H] [--context T] [--vocab V] [--batch B]
//               [--time T] [--dtype float|double] [--optimizer adamw|momentum|sgd] [--tied]
//               [--plain-loss] [--memory GiB] [--budget MiB] [--json]          (--help)
//
// The defaults are GPT-2 small (12 layers, width 768, 12 heads, context 1024, vocabulary 50257)
// with a batch of 8. --memory is what you have (default: this machine's physical memory); the
// last lines give, for each plan, the largest batch that fits in it. --budget adds the plan with
// the least recompute whose activations fit in that many MiB. With --json the output is one
// JSON object instead.
#include <remat/checkpoint/plan.hpp>
#include <remat/nn/estimate.hpp>

#include <unistd.h>

#include "flags.hpp"

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

double physical_memory_gib() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 30);
}

/// The flags; `will_it_fit --help` lists them with their defaults, and an unknown flag or a
/// value out of range is an error that prints that list.
Options parse(int argc, char** argv) {
  Options o;
  std::string dtype = "float", optimizer = "adamw";
  bool plain_loss = false;
  CLI::App app("Will it fit? Predicts the memory of one GPT training step before allocating anything:\n"
               "parameters, gradients, optimizer state, activations under each checkpoint plan, logits,\n"
               "and the largest batch each plan allows in --memory.");
  const auto count = [&](const char* flag, std::int64_t& v, const char* what) {
    app.add_option(flag, v, what)->check(flags::non_negative)->capture_default_str();
  };
  count("--layers", o.config.layers, "transformer blocks");
  count("--width", o.config.width, "model width C");
  count("--heads", o.config.heads, "attention heads");
  count("--context", o.config.context, "context length (positions the model has)");
  count("--vocab", o.config.vocab, "vocabulary size V");
  count("--batch", o.step.batch, "sequences per step B");
  count("--time", o.step.time, "tokens per sequence T (0: the context length)");
  app.add_option("--dtype", dtype, "parameter and activation type")->check(CLI::IsMember({"float", "double"}))->capture_default_str();
  app.add_option("--optimizer", optimizer, "optimizer whose state is priced")
      ->check(CLI::IsMember({"adamw", "momentum", "sgd"}))
      ->capture_default_str();
  app.add_flag("--tied", o.config.tied, "the head shares the token embedding");
  app.add_flag("--plain-loss", plain_loss, "price the plain loss (full logits) instead of the chunked one");
  app.add_option("--memory", o.memory_gib, "memory you have, GiB (default: this machine's)")->check(flags::positive);
  app.add_option("--budget", o.budget_mib, "also price the least-recompute plan under this many MiB of activations")
      ->check(flags::positive);
  app.add_flag("--json", o.json, "print one JSON object instead of the table");
  flags::parse(app, argc, argv);
  o.double_precision = dtype == "double";
  o.step.optimizer = optimizer == "adamw"      ? remat::nn::OptimizerKind::adamw
                     : optimizer == "momentum" ? remat::nn::OptimizerKind::sgd_momentum
                                               : remat::nn::OptimizerKind::sgd;
  o.step.chunked_loss = !plain_loss;
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
