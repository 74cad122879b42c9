#pragma once
// `finetune --auto` and `will_it_fit --base DIR --data FILE`: the settings of a LoRA fine-tune of
// a Hugging Face folder chosen from its data and the memory there is, by one rule, in one place,
// so that will_it_fit prints (without reading the weights) the decision finetune makes. Each
// choice prints an "auto: ..." line saying what it chose and why; a flag the user gave wins over
// the rule for its setting, and its line says so.
//
// The rule, in the order it is applied:
//  1. Sequence length (--max-tokens): the smallest multiple of 64 that holds 95 % of the examples
//     whole (their token counts as written, nearest rank), at most the model's context
//     (max_position_embeddings) and at most --max-tokens when given (a ceiling then, not the
//     length). Why: the few longest examples would otherwise set the shape of every padded batch
//     (memory and time grow with it, attention's quadratically), while truncating only the
//     longest 5 % loses little (--truncate oldest keeps their latest exchanges); multiples of 64
//     keep the shape stable when the data changes a little. The examples longer than it are
//     counted and printed.
//  2. Memory for the step: --memory (GiB), default the memory available now (MemAvailable in
//     /proc/meminfo, or the room left under a cgroup limit when that is less). A step may use
//     (memory - 128 MiB - the tokenized data) / 1.10 of the estimate
//     (remat::train::estimate_memory, the figure finetune prints and counts): docs/benchmarks.md
//     measured the process's peak resident memory at 1.05 to 1.07 x the allocator's count plus 70
//     MiB (the program, the tokenizer's tables, the cache of freed buffers), so 10 % and 128 MiB
//     leave room to spare.
//  3. Checkpoint plan and micro-batch (--checkpoint, --batch): the plans finetune runs without
//     profiling, none, policy:save_matmuls (every layer in a segment of its own that keeps its
//     GEMMs' outputs and replays the rest: norms, rotary embeddings, attention, activations),
//     sqrt and every, taken in the order of the recompute they cost on a shape-only step (least
//     first: none recomputes nothing, save_matmuls what is not a GEMM, sqrt all but its last
//     segment, every all but its last layer). The first plan under which a useful micro-batch fits
//     is chosen, at the largest batch that fits under it, up to a cap; when none reaches a useful
//     batch, the plan that fits the largest one. Useful: 512 token positions (enough rows for the
//     GEMMs to run at speed on a CPU: on a Qwen2-0.5B shape, 1 x 512 ran at 45 tokens/s, 2 x 1,024
//     at 39, issue 23), or the cap if less. Cap: the training examples (a padded batch holds
//     distinct examples; packed, the rows they fill) and the rows of the effective batch below (a
//     larger micro-batch would only mean fewer accumulated ones). A budget:<MiB> plan is not chosen
//     (the rule has no budget to give it); given (--checkpoint budget:<MiB>), it is planned for
//     each batch tried on that step's shape-only chain, as finetune plans it for the batch chosen,
//     and the batch is the largest whose plan exists within the budget and fits the room.
//     Why recompute first: a plan that replays the layers costs about a forward pass more per
//     step whatever the batch (the 0.5B step at 1 x 512: 37 tokens/s without checkpoints, 27.5
//     with one per layer, docs/benchmarks.md), while a larger micro-batch gains little once the
//     GEMMs have 512 rows. Not even one sequence fitting under the plan needing the least
//     memory is an error with the figures.
//  4. Gradient accumulation (--accumulate): micro-batches per optimizer step so that a step
//     trains on about 8,192 tokens (QLoRA's Guanaco recipe: 16 sequences of at most 512 target
//     tokens, artidoro/qlora scripts/finetune_guanaco_7b.sh), or on an eighth of the training
//     tokens when the data is smaller, so that an epoch has at least 8 optimizer steps.
//  5. Learning rate (--lr): 2e-4 for a model of up to 13 B parameters, 1e-4 above (QLoRA's,
//     Dettmers et al. 2023: artidoro/qlora scripts/finetune_guanaco_7b.sh and _13b.sh use 2e-4,
//     _33b.sh and _65b.sh 1e-4). Not scaled with the rank: 2e-4 is used with alpha / r from 0.25
//     (QLoRA: r 64, alpha 16) to 2 (the common r 16, alpha 32), and AdamW's steps do not depend
//     on the gradients' scale.
//  6. Optimizer steps (--steps): 3 epochs below 1 M training tokens, 2 below 10 M, 1 from there
//     (small data is seen more often, and a large set once is long enough on a CPU; QLoRA's
//     OASST1 run is 1,875 steps of 16 sequences, a few epochs of that data set), each epoch the
//     training tokens over the tokens of an optimizer step.
#include <remat/checkpoint/plan.hpp>
#include <remat/train/estimate.hpp>
#include <remat/hub/llama_config.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat_data.hpp"
#include "corpus.hpp"
#include "flags.hpp"

namespace auto_settings {

namespace plan = remat::plan;
namespace hub = remat::hub;

inline constexpr double kShareWhole = 0.95;      ///< of the examples the length holds whole
inline constexpr std::size_t kLengthStep = 64;   ///< the length is a multiple of it
inline constexpr double kEstimateMargin = 1.10;  ///< the process's memory over the estimate
inline constexpr double kBaselineBytes = 128.0 * (1 << 20);  ///< the program, tokenizer, cache
inline constexpr double kDataBytesPerToken = 5;  ///< a tokenized example: int32 id, uint8 flag
inline constexpr double kUsefulPositions = 512;  ///< a micro-batch's positions worth the GEMMs
inline constexpr double kTargetTokens = 8192;    ///< tokens an optimizer step trains on
inline constexpr double kMinStepsPerEpoch = 8;
inline constexpr double kLargeModel = 13e9;  ///< parameters above which the rate is halved

/// A Llama block's linears: LoRA's default targets.
inline std::vector<std::string> llama_linears() {
  return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
}

/// What the decision is for: the model, the fine-tune's form, the memory, and the settings the
/// user gave (each one wins over the rule for its setting).
struct Request {
  remat::nn::LlamaConfig model;
  remat::WeightStorage storage = remat::WeightStorage::nf4;
  bool double_quant = true;
  remat::Precision precision = remat::Precision::f32;  ///< what steps compute in (--dtype)
  std::int64_t rank = 8;
  std::vector<std::string> targets;  ///< linear names adapted (never empty)
  double dropout = 0;
  bool pack = false;
  std::size_t max_tokens = 0;  ///< --max-tokens given: the length's ceiling (0: none)
  double memory = 0;           ///< bytes
  std::string memory_source;   ///< how `memory` was found, for the printed line
  std::optional<std::int64_t> batch, accumulate, steps;
  std::optional<double> lr;
  std::optional<std::string> checkpoint;  ///< none, every, sqrt, budget:<MiB> or policy:<policy>
  std::optional<std::int64_t> loss_chunk_rows;  ///< priced as given: no rule chooses it
};

/// What the rule chose, the printed lines that say why, and the figures behind them.
struct Decision {
  std::size_t max_tokens = 0;
  std::int64_t batch = 0, columns = 0, accumulate = 1, steps = 0;
  std::int64_t batch_cap = 0, useful_batch = 0;
  double lr = 0, epochs = 0;
  std::string checkpoint;
  double step_bytes = 0;  ///< the estimate of the chosen step
  double step_limit = 0;  ///< the most a step's estimate may be within the memory
  double memory = 0;      ///< the memory it is for (Request::memory)
  std::vector<std::string> lines;

  /// One JSON object with the choices and the figures (will_it_fit --json).
  std::string json() const {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"max_tokens\": %zu, \"batch\": %lld, \"columns\": %lld, \"checkpoint\": "
                  "\"%s\", \"accumulate\": %lld, \"steps\": %lld, \"lr\": %g, \"epochs\": %g, "
                  "\"batch_cap\": %lld, \"useful_batch\": %lld, \"step_bytes\": %.0f, "
                  "\"step_limit\": %.0f, \"memory\": %.0f}",
                  max_tokens, static_cast<long long>(batch), static_cast<long long>(columns),
                  checkpoint.c_str(), static_cast<long long>(accumulate),
                  static_cast<long long>(steps), lr, epochs, static_cast<long long>(batch_cap),
                  static_cast<long long>(useful_batch), step_bytes, step_limit, memory);
    return buf;
  }
};

/// The data read at the chosen length, and the decision.
struct Result {
  chat::Data data;
  Decision decision;
};

namespace detail {

/// A number read from a one-line file (cgroup's memory.max, memory.current), or none ("max").
inline std::optional<double> number_in(const char* path) {
  std::ifstream in(path);
  double v = 0;
  if (in >> v && v > 0) return v;
  return std::nullopt;
}

}  // namespace detail

/// The memory a new process can take now: MemAvailable of /proc/meminfo, or less when a cgroup
/// limit leaves less room. An IoError (give --memory) when /proc/meminfo has no such number.
inline double available_memory() {
  std::ifstream in("/proc/meminfo");
  if (!in)
    throw remat::IoError(
        "cannot read /proc/meminfo to find the available memory: give --memory GiB");
  double available = -1;
  for (std::string key; in >> key;) {
    if (key == "MemAvailable:") {
      double kib = 0;
      if (!(in >> kib) || !std::isfinite(kib) || kib <= 0)
        throw remat::IoError(
            "/proc/meminfo's MemAvailable is not a number of kB > 0: give --memory GiB");
      available = kib * 1024;
      break;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (available < 0)
    throw remat::IoError("/proc/meminfo has no MemAvailable line: give --memory GiB");
  const std::optional<double> limit = detail::number_in("/sys/fs/cgroup/memory.max"),
                              used = detail::number_in("/sys/fs/cgroup/memory.current");
  if (limit && used) available = std::min(available, std::max(0.0, *limit - *used));
  return available;
}

/// Sets the request's memory from --memory (GiB; 0: not given, the memory available now).
inline void set_memory(Request& r, double memory_gib) {
  r.memory = memory_gib > 0 ? memory_gib * (1 << 30) : available_memory();
  r.memory_source = memory_gib > 0 ? "--memory" : "the memory available now, MemAvailable";
}

/// `v` with `significant` digits ("97", "0.00244").
inline std::string digits(double v, int significant = 3) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", significant, v);
  return buf;
}

/// A fraction as a percentage of 2 significant digits ("3.6", "79"), whole from 99.5 ("100").
inline std::string percent(double fraction) {
  return fraction * 100 >= 99.5 ? digits(fraction * 100, 3) : digits(fraction * 100, 2);
}

/// Step 1: the sequence length for these token counts (sorted), context and ceiling (0: none),
/// and the line that says why. `chat`: the examples are conversations (text documents are cut
/// into windows instead of truncated).
inline std::size_t choose_length(const hub::TokenReport& r, std::size_t context,
                                 std::size_t ceiling, hub::Truncate truncate, bool chat,
                                 std::vector<std::string>& lines) {
  const std::size_t rounded = (r.p95 + kLengthStep - 1) / kLengthStep * kLengthStep;
  const std::size_t most = ceiling > 0 ? std::min(ceiling, context) : context;
  const std::size_t length = std::max<std::size_t>(2, std::min(rounded, most));
  const auto longer = static_cast<std::size_t>(
      r.counts.end() - std::upper_bound(r.counts.begin(), r.counts.end(), length));
  std::string why = remat::detail::cat("the smallest multiple of ", kLengthStep, " holding ",
                                       kShareWhole * 100, " % of the ", r.counts.size(),
                                       " examples whole (their p95: ", r.p95, " tokens)");
  if (rounded > most) {
    why = remat::detail::cat(
        ceiling > 0 && ceiling < context ? "--max-tokens given" : "the model's context", "; ", why,
        ", ", rounded, ", is above it");
  }
  const char* fate = !chat ? "cut into windows of that length"
                     : truncate == hub::Truncate::exclude
                         ? "left out (--truncate exclude)"
                         : "truncated, oldest exchanges first (--truncate oldest)";
  lines.push_back(remat::detail::cat(
      "auto: sequence length ", length, " tokens (--max-tokens): ", why, "; ",
      longer == 0 ? std::string("no example is longer")
                  : remat::detail::cat(longer, longer == 1 ? " example is" : " examples are",
                                       " longer, ", fate)));
  return length;
}

/// A step of `rows` x `columns` positions of this fine-tune, as finetune shapes it.
inline remat::train::StepShape step_shape(const Request& r, std::int64_t rows,
                                          std::int64_t columns) {
  remat::train::StepShape shape{.batch = rows,
                                .time = columns,
                                .loss_chunk_rows = r.loss_chunk_rows.value_or(0),
                                .packed = r.pack,
                                .storage = r.storage,
                                .double_quant = r.double_quant,
                                .precision = r.precision};
  shape.lora = {.rank = r.rank, .targets = r.targets, .dropout = r.dropout};
  return shape;
}

/// The estimate of a step of `rows` x `columns` positions of this fine-tune under `p`.
inline double step_total(const Request& r, std::int64_t rows, std::int64_t columns,
                         const plan::Plan& p) {
  return remat::train::step_peak<float>(r.model, step_shape(r, rows, columns), p);
}

/// A plan finetune can run, by its --checkpoint name.
struct Candidate {
  std::string name;
  plan::Plan plan;  ///< a budget's: planned for one row (its recompute orders the candidates)
  std::optional<double> budget_bytes;  ///< budget:<MiB>: planned again for every batch
};

/// The budget plan of `bytes` for a step of rows x columns, made on that step's shape-only chain
/// as finetune makes it; a PlanError when nothing fits the budget there.
inline plan::Plan budget_plan(const Request& r, double bytes, std::int64_t rows,
                              std::int64_t columns) {
  return plan::budget(
      remat::train::estimate_memory<float>(r.model, step_shape(r, rows, columns)).chain, bytes);
}

/// `c`'s plan for a step of rows x columns (a budget's is made for it: a larger batch needs
/// other segments); none when nothing fits the budget there.
inline std::optional<plan::Plan> plan_at(const Request& r, const Candidate& c, std::int64_t rows,
                                         std::int64_t columns) {
  if (!c.budget_bytes) return c.plan;
  try {
    return budget_plan(r, *c.budget_bytes, rows, columns);
  } catch (const remat::PlanError&) {
    return std::nullopt;  // the budget is too small for this batch
  }
}

/// The estimate of a step of rows x columns under `c` (infinite when its budget has no plan).
inline double candidate_total(const Request& r, const Candidate& c, std::int64_t rows,
                              std::int64_t columns) {
  const std::optional<plan::Plan> p = plan_at(r, c, rows, columns);
  return p ? step_total(r, rows, columns, *p) : std::numeric_limits<double>::infinity();
}

/// none, every layer in a segment of its own under a save policy (--checkpoint policy:<policy>'s
/// when given, else save_matmuls), sqrt and every, and --checkpoint budget:<MiB>'s plan when
/// given, in the order of the recompute they cost, least first (a stable sort: ties keep that
/// order). Priced on a shape-only step, as finetune prices them.
inline std::vector<Candidate> candidates(const Request& r, std::int64_t columns) {
  const std::optional<remat::SavePolicy> given =
      r.checkpoint ? corpus::checkpoint_policy(*r.checkpoint) : std::nullopt;
  const remat::SavePolicy policy = given.value_or(remat::save_matmuls());
  remat::train::StepShape shape{.batch = 1,
                                .time = columns,
                                .packed = r.pack,
                                .storage = r.storage,
                                .double_quant = r.double_quant,
                                .precision = r.precision,
                                .policies = {policy}};
  shape.lora = {.rank = r.rank, .targets = r.targets, .dropout = r.dropout};
  const plan::Chain chain = remat::train::estimate_memory<float>(r.model, shape).chain;
  std::vector<Candidate> out = {
      {"none", plan::none(chain)},
      {given ? *r.checkpoint : "policy:save_matmuls",
       plan::custom(chain, corpus::policy_plan(policy, r.model.num_hidden_layers).segments)},
      {"sqrt", plan::sqrt(chain)},
      {"every", plan::every(chain)}};
  if (r.checkpoint && r.checkpoint->rfind("budget:", 0) == 0) {
    const double bytes = corpus::budget_mib(*r.checkpoint, "finetune") * (1 << 20);
    out.push_back({*r.checkpoint, budget_plan(r, bytes, 1, columns), bytes});
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return a.plan.recompute_fraction < b.plan.recompute_fraction;
  });
  return out;
}

/// The facts of the data the rest of the rule reads.
struct DataFacts {
  double train_examples = 0, train_tokens = 0, data_bytes = 0;
  double row_tokens = 0;   ///< tokens a row holds on average (packed: full rows)
  double packed_rows = 0;  ///< packed: the rows one epoch of training examples fills
  std::int64_t columns = 0;
};

inline DataFacts facts_of(const chat::Data& d, std::size_t length, bool pack) {
  DataFacts f;
  f.train_examples = double(d.train.size());
  for (const hub::TokenizedExample& e : d.train) f.train_tokens += double(e.ids.size());
  double val_tokens = 0;
  for (const hub::TokenizedExample& e : d.val) val_tokens += double(e.ids.size());
  f.data_bytes = (f.train_tokens + val_tokens) * kDataBytesPerToken;
  // a row's positions: finetune's (HubSource::max_columns)
  f.columns = static_cast<std::int64_t>(pack ? length - 1 : d.longest - 1);
  f.row_tokens = pack ? double(f.columns) : f.train_tokens / f.train_examples;
  if (pack) f.packed_rows = double(hub::packed_rows(d.train, static_cast<std::size_t>(f.columns)));
  return f;
}

/// The clear error when not even `rows` sequences fit: the figures of the plan of `plans` needing
/// least.
[[noreturn]] inline void too_small(const Request& r, const std::vector<Candidate>& plans,
                                   std::int64_t rows, std::int64_t columns, double limit,
                                   const DataFacts& f) {
  std::string smallest;
  double need = std::numeric_limits<double>::infinity();
  for (const Candidate& c : plans) {
    const double t = candidate_total(r, c, rows, columns);
    if (t < need) need = t, smallest = c.name;
  }
  throw remat::ArgumentError(remat::detail::cat(
      "--memory: a step of ", rows, " x ", columns, " tokens under checkpoint ", smallest,
      plans.size() > 1 ? " (the plan needing least)" : "", " is estimated at ",
      flags::human_bytes(need), ", and the process needs that x ", kEstimateMargin, " + ",
      flags::human_bytes(kBaselineBytes), " + ", flags::human_bytes(f.data_bytes),
      " of data = ", flags::human_bytes(need * kEstimateMargin + kBaselineBytes + f.data_bytes),
      "; ", r.memory_source, " is ", flags::human_bytes(r.memory),
      limit > 0 ? remat::detail::cat(", room for a step of ", flags::human_bytes(limit))
                : std::string(", no room for a step at all")));
}

/// The largest batch in [1, cap] whose step's estimate under `c` is within `limit` (0: none).
inline std::int64_t largest_batch(const Request& r, const Candidate& c, std::int64_t columns,
                                  std::int64_t cap, double limit) {
  const auto fits = [&](std::int64_t b) { return candidate_total(r, c, b, columns) <= limit; };
  if (cap < 1 || !fits(1)) return 0;
  std::int64_t lo = 1, hi = cap + 1;  // fits(lo), and hi is past the last that may
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

/// The plans the rule may choose from: all of them but a budget's, or the one --checkpoint names.
inline std::vector<Candidate> allowed(const std::vector<Candidate>& plans, const Request& r) {
  std::vector<Candidate> out;
  for (const Candidate& c : plans)
    if (r.checkpoint ? c.name == *r.checkpoint : !c.budget_bytes) out.push_back(c);
  return out;
}

/// A plan and a batch, and why.
struct Choice {
  Candidate plan;
  std::int64_t batch = 0;
  std::string why;
};

/// --batch given: the first of `plans` (least recompute first) under which it fits.
inline Choice plan_for_batch(const Request& r, const std::vector<Candidate>& plans,
                             const DataFacts& f, double limit) {
  for (const Candidate& c : plans) {
    if (candidate_total(r, c, *r.batch, f.columns) <= limit) {
      return {c, *r.batch,
              r.checkpoint ? "--batch and --checkpoint given; they fit"
                           : "--batch given; the plan with the least recompute it fits under"};
    }
  }
  too_small(r, plans, *r.batch, f.columns, limit, f);
}

/// No --batch: the first of `plans` (least recompute first) under which `useful` rows fit, at
/// the largest batch up to `cap` that fits under it; when none fits `useful`, the plan fitting
/// the largest batch.
inline Choice search(const Request& r, const std::vector<Candidate>& plans, const DataFacts& f,
                     double limit, std::int64_t useful, std::int64_t cap) {
  std::string tried;  // "none (0 % recompute) fits 2 rows, sqrt (79 % recompute) fits 5 rows"
  std::optional<Choice> best;
  for (const Candidate& c : plans) {
    const std::int64_t b = largest_batch(r, c, f.columns, cap, limit);
    // a budget's recompute is its plan's at that batch
    const double recompute = b > 1 && c.budget_bytes
                                 ? plan_at(r, c, b, f.columns)->recompute_fraction
                                 : c.plan.recompute_fraction;
    tried += remat::detail::cat(tried.empty() ? "" : ", ", c.name, " (", percent(recompute),
                                " % recompute) fits ", b, b == 1 ? " row" : " rows");
    if (b > 0 && (!best || b > best->batch)) best = Choice{c, b, ""};
    if (b >= useful) break;
  }
  if (!best) too_small(r, plans, 1, f.columns, limit, f);
  const char* capped_by =
      double(cap) == (r.pack ? f.packed_rows : f.train_examples)
          ? (r.pack ? "the rows the training examples fill packed" : "the training examples")
          : "the rows of an optimizer step";
  best->why = remat::detail::cat(
      r.checkpoint ? "--checkpoint given; " : "least recompute first: ", tried, " (of at most ",
      cap, ": ", capped_by, ")",
      r.checkpoint ? std::string()
      : best->batch >= useful
          ? remat::detail::cat("; the first to fit a useful batch (", useful,
                               " rows: 512 positions, at most the cap), at its largest")
          : std::string("; no plan fits a useful batch: the one fitting the largest"));
  return *best;
}

/// Step 3: the plan and the micro-batch, into `d`.
inline void choose_plan_and_batch(const Request& r, const DataFacts& f, double target_tokens,
                                  Decision& d) {
  const std::vector<Candidate> plans = allowed(candidates(r, f.columns), r);
  const double target_rows = std::max(1.0, std::ceil(target_tokens / f.row_tokens));
  d.batch_cap =
      static_cast<std::int64_t>(std::min(r.pack ? f.packed_rows : f.train_examples, target_rows));
  d.useful_batch = std::min<std::int64_t>(
      d.batch_cap,
      static_cast<std::int64_t>(std::max(1.0, std::ceil(kUsefulPositions / double(f.columns)))));
  const Choice c = r.batch ? plan_for_batch(r, plans, f, d.step_limit)
                           : search(r, plans, f, d.step_limit, d.useful_batch, d.batch_cap);
  d.batch = c.batch;
  d.checkpoint = r.checkpoint ? *r.checkpoint : c.plan.name;
  d.columns = f.columns;
  d.step_bytes = candidate_total(r, c.plan, d.batch, f.columns);
  d.lines.push_back(remat::detail::cat("auto: checkpoint ", d.checkpoint, ", batch ", d.batch,
                                       " x ", f.columns,
                                       " tokens (--checkpoint, --batch), a step estimated at ",
                                       flags::human_bytes(d.step_bytes), ": ", c.why));
}

/// Step 2: the room for a step's estimate in `r.memory`, into `d`.
inline void set_room(const Request& r, const DataFacts& f, Decision& d) {
  d.memory = r.memory;
  d.step_limit = (r.memory - kBaselineBytes - f.data_bytes) / kEstimateMargin;
  d.lines.push_back(remat::detail::cat(
      "auto: memory ", flags::human_bytes(r.memory), " (", r.memory_source, "), less ",
      flags::human_bytes(kBaselineBytes), " for the process and ", flags::human_bytes(f.data_bytes),
      " of tokenized data, divided by ", kEstimateMargin,
      " for what the estimate leaves out: a step's estimate may reach ",
      d.step_limit > 0 ? flags::human_bytes(d.step_limit) : std::string("nothing")));
  if (d.step_limit <= 0) too_small(r, allowed(candidates(r, f.columns), r), 1, f.columns, 0, f);
}

/// Step 4: micro-batches an optimizer step, into `d`.
inline void set_accumulation(const Request& r, const DataFacts& f, double target_tokens,
                             Decision& d) {
  const double micro_tokens = double(d.batch) * f.row_tokens;
  d.accumulate = r.accumulate
                     ? *r.accumulate
                     : std::max<std::int64_t>(1, std::llround(target_tokens / micro_tokens));
  d.lines.push_back(remat::detail::cat(
      "auto: accumulate ", d.accumulate, " (--accumulate): about ",
      std::llround(micro_tokens * double(d.accumulate)), " tokens an optimizer step",
      r.accumulate ? " (--accumulate given)"
                   : remat::detail::cat(", the target being ", std::llround(target_tokens),
                                        " (8,192, or an eighth of the ",
                                        std::llround(f.train_tokens), " training tokens)")));
}

/// Step 5: the learning rate, into `d`.
inline void set_learning_rate(const Request& r, Decision& d) {
  const std::int64_t parameters =
      remat::train::estimate_memory<float>(r.model, {.batch = 1, .time = 1}).parameter_count;
  d.lr = r.lr ? *r.lr : double(parameters) <= kLargeModel ? 2e-4 : 1e-4;
  d.lines.push_back(remat::detail::cat(
      "auto: lr ", d.lr, " (--lr): ",
      r.lr ? std::string("--lr given")
           : remat::detail::cat("QLoRA's for a model of ", digits(double(parameters) / 1e9),
                                " B parameters (2e-4 up to 13 B, 1e-4 above)")));
}

/// Step 6: the optimizer steps, into `d`.
inline void set_steps(const Request& r, const DataFacts& f, Decision& d) {
  d.epochs = f.train_tokens < 1e6 ? 3 : f.train_tokens < 1e7 ? 2 : 1;
  const double step_tokens = double(d.batch) * f.row_tokens * double(d.accumulate);
  const double rule_steps = std::max(1.0, std::ceil(d.epochs * f.train_tokens / step_tokens));
  d.steps = r.steps ? *r.steps : static_cast<std::int64_t>(rule_steps);
  d.lines.push_back(remat::detail::cat(
      "auto: steps ", d.steps, r.steps ? " (--steps given; the rule: " : " (--steps: ", d.epochs,
      " epochs of ", std::llround(f.train_tokens), " training tokens, ",
      static_cast<long long>(rule_steps),
      " steps; 3 epochs below 1 M tokens, 2 below 10 M, 1 above)"));
}

/// Steps 2 to 6 for data read at `length` tokens an example, and the flags that would make the
/// same run without --auto.
/// Refuses a --batch given that finetune would refuse with these data: more rows than training
/// examples (padded) or than the rows they fill (packed), so that no decision names it.
inline void check_batch_given(const Request& r, const DataFacts& f) {
  const double most = r.pack ? f.packed_rows : f.train_examples;
  if (r.batch && double(*r.batch) > most) {
    throw remat::ArgumentError(remat::detail::cat(
        "finetune: --batch ", *r.batch, " is more than the ", most,
        r.pack ? " rows the training examples fill packed" : " training examples"));
  }
}

inline Decision decide_for(const Request& r, const chat::Data& data, std::size_t length,
                           std::vector<std::string> lines) {
  Decision d;
  d.max_tokens = length;
  d.lines = std::move(lines);
  const DataFacts f = facts_of(data, length, r.pack);
  check_batch_given(r, f);
  set_room(r, f, d);
  const double target_tokens = std::min(kTargetTokens, f.train_tokens / kMinStepsPerEpoch);
  choose_plan_and_batch(r, f, target_tokens, d);
  set_accumulation(r, f, target_tokens, d);
  set_learning_rate(r, d);
  set_steps(r, f, d);
  // a --loss-chunk-rows given was priced, so the same run needs it too
  const std::string chunk =
      r.loss_chunk_rows ? remat::detail::cat(" --loss-chunk-rows ", *r.loss_chunk_rows) : "";
  d.lines.push_back(remat::detail::cat(
      "auto: as flags: --max-tokens ", d.max_tokens, " --checkpoint ", d.checkpoint, " --batch ",
      d.batch, chunk, " --accumulate ", d.accumulate, " --lr ", d.lr, " --steps ", d.steps));
  return d;
}

/// Reads the data as finetune does (`o`: its flags; o.max_tokens is chosen here), chooses the
/// length from its token counts, reads it again at that length when it differs, and decides the
/// rest. `context`: the model's.
inline Result decide(const hub::Tokenizer& tok, const std::string& base, chat::DataOptions o,
                     const Request& r) {
  const auto context = static_cast<std::size_t>(r.model.max_position_embeddings);
  o.max_tokens = r.max_tokens > 0 ? r.max_tokens : context;  // the counts do not depend on it
  chat::Data first = chat::load(tok, base, o, context);
  std::vector<std::string> lines;
  const std::size_t length =
      choose_length(first.tokens, context, r.max_tokens, o.truncate, first.chat.has_value(), lines);
  if (length != o.max_tokens) {
    o.max_tokens = length;
    first = chat::load(tok, base, o, context);
  }
  Decision d = decide_for(r, first, length, std::move(lines));
  return {std::move(first), std::move(d)};
}

}  // namespace auto_settings
