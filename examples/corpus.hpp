#pragma once
// What the character-level examples (train_gpt, train_llama, finetune) share: a text read as
// token ids over its characters, random batches of windows with next-token targets, fixed
// validation batches and their mean loss, the checkpoint plan named by --checkpoint, sampling.
#include <remat/io/json.hpp>
#include <remat/remat.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flags.hpp"

namespace corpus {

/// The vocabulary train_llama --save-hf lists in `dir`/remat_eval.json: each character as its
/// byte value (written from a char, so -128 to 255). Read as every JSON file is
/// (io::read_json_file: a regular file, no repeated key); an IoError naming the file and the
/// entry that is not a byte.
inline std::string read_saved_vocab(const std::string& dir, const char* program) {
  const std::string path = dir + "/remat_eval.json";
  const nlohmann::json eval = remat::io::read_json_file(path, program);
  if (!eval.is_object() || !eval.contains("vocab") || !eval.at("vocab").is_array())
    throw remat::IoError(remat::detail::cat(program, ": ", path, " has no 'vocab' list"));
  std::string vocab;
  for (const nlohmann::json& ch : eval.at("vocab")) {
    if (!ch.is_number_integer() || ch.get<std::int64_t>() < -128 || ch.get<std::int64_t>() > 255) {
      throw remat::IoError(remat::detail::cat(program, ": ", path, ": vocab entry ", vocab.size(),
                                              " is ", ch.dump(), ", not a character's byte value"));
    }
    vocab.push_back(static_cast<char>(ch.get<int>()));
  }
  return vocab;
}

/// The text as token ids over a vocabulary of characters: its own sorted set of characters, or
/// a given one (a resumed or fine-tuned model's), which must then hold every character of the
/// text. The last tenth is for validation.
struct Corpus {
  std::string vocab;  // character of each id
  std::vector<std::int32_t> train, val;

  /// `program` prefixes the error messages ("train_gpt: cannot read ...").
  static Corpus load(const std::string& path, const std::string& known_vocab, const char* program) {
    // a FIFO would block open() until someone writes to it
    if (const std::string why = flags::input_file(std::string(path)); !why.empty())
      throw remat::IoError(std::string(program) + ": " + why);
    std::ifstream in(path, std::ios::binary);
    if (!in) throw remat::IoError(std::string(program) + ": cannot read " + path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Corpus c;
    if (known_vocab.empty()) {
      bool seen[256] = {};
      for (unsigned char ch : text) seen[ch] = true;
      for (int ch = 0; ch < 256; ++ch) {
        if (seen[ch]) c.vocab.push_back(static_cast<char>(ch));
      }
    } else {
      c.vocab = known_vocab;
    }
    std::int32_t index[256];
    std::fill(std::begin(index), std::end(index), -1);
    for (std::size_t i = 0; i < c.vocab.size(); ++i)
      index[static_cast<unsigned char>(c.vocab[i])] = static_cast<std::int32_t>(i);
    std::vector<std::int32_t> ids;
    ids.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
      const unsigned char ch = static_cast<unsigned char>(text[i]);
      if (index[ch] < 0) {
        throw remat::IoError(remat::detail::cat(
            program, ": ", path, " has the character ", int(ch), " ('", text[i], "') at byte ", i,
            ", which the model's vocabulary of ", c.vocab.size(), " characters does not hold"));
      }
      ids.push_back(index[ch]);
    }
    const std::size_t cut = ids.size() * 9 / 10;  // the last tenth is for validation
    c.train.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(cut));
    c.val.assign(ids.begin() + static_cast<std::ptrdiff_t>(cut), ids.end());
    return c;
  }
};

/// A batch of `batch` windows of `time` tokens at random offsets, with next-token targets.
inline void fill_batch(const std::vector<std::int32_t>& ids, std::int64_t batch, std::int64_t time,
                       remat::Rng& rng, remat::Tensor<std::int32_t>& x,
                       remat::Tensor<std::int32_t>& y, const char* program) {
  x = remat::Tensor<std::int32_t>({batch, time});
  y = remat::Tensor<std::int32_t>({batch, time});
  const std::int64_t span = static_cast<std::int64_t>(ids.size()) - time - 1;
  if (span < 1)
    throw remat::ArgumentError(std::string(program) +
                               ": the text is shorter than one context window");
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t at = rng.uniform_int(span);
    for (std::int64_t t = 0; t < time; ++t) {
      x.at({b, t}) = ids[static_cast<std::size_t>(at + t)];
      y.at({b, t}) = ids[static_cast<std::size_t>(at + t + 1)];
    }
  }
}

using Batches = std::vector<std::pair<remat::Tensor<std::int32_t>, remat::Tensor<std::int32_t>>>;

/// `count` validation batches drawn from `ids` with `rng`: the same for every run with its seed.
inline Batches validation_batches(const std::vector<std::int32_t>& ids, std::int64_t count,
                                  std::int64_t batch, std::int64_t time, remat::Rng& rng,
                                  const char* program) {
  Batches val(static_cast<std::size_t>(count));
  for (auto& [vx, vy] : val) fill_batch(ids, batch, time, rng, vx, vy, program);
  return val;
}

/// The mean loss over `val`, in evaluation mode (no dropout) and without a tape.
template <class Model>
double mean_loss(Model& model, const Batches& val) {
  remat::NoGradGuard no_grad;
  model.eval();
  double total = 0;
  for (const auto& [vx, vy] : val) total += model.loss(vx, vy).item();
  model.train();
  return total / double(val.size());
}

/// The MiB of a --checkpoint budget:<MiB>: a finite number > 0, or an ArgumentError.
inline double budget_mib(const std::string& mode, const char* program) {
  const std::string text = mode.substr(7);
  char* end = nullptr;
  const double mib = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(mib) || mib <= 0) {
    throw remat::ArgumentError(std::string(program) + ": --checkpoint " + mode +
                               ": the budget must be a finite number of MiB > 0");
  }
  return mib;
}

/// The policy of a --checkpoint policy:<policy> (flags::save_policy's text), or none.
inline std::optional<remat::SavePolicy> checkpoint_policy(const std::string& mode) {
  if (mode.rfind("policy:", 0) != 0) return std::nullopt;
  return flags::save_policy(mode.substr(7), "--checkpoint " + mode);
}

/// Every one of `layers` layers in a segment of its own under `policy`: the plan --checkpoint
/// policy:<policy> names, made from the layer count (a shape-only estimate prices it exactly).
inline remat::plan::Plan policy_plan(const remat::SavePolicy& policy, std::int64_t layers) {
  remat::plan::Plan p;
  p.layers = static_cast<std::size_t>(layers);
  p.predicted = false;
  for (std::size_t l = 0; l < p.layers; ++l) p.segments.push_back({l, l + 1, {}, policy});
  return p;
}

inline constexpr const char* kCheckpointModes =
    "none, every, sqrt, budget:<MiB> or policy:<save_matmuls|save_ops:a,b|recompute_ops:a,b>";

/// Checks --checkpoint names a plan (kCheckpointModes), at start-up.
inline void check_checkpoint_mode(const std::string& mode, const char* program) {
  if (mode == "none" || mode == "every" || mode == "sqrt" || checkpoint_policy(mode)) return;
  if (mode.rfind("budget:", 0) == 0) {
    budget_mib(mode, program);
    return;
  }
  throw remat::ArgumentError(std::string(program) + ": --checkpoint must be " + kCheckpointModes +
                             ", got " + mode);
}

/// The plan --checkpoint names: none, every, sqrt, budget:<MiB> or policy:<policy> (budget and
/// policy profiled on the batch x, y, so that the plan prints its predicted peak and recompute;
/// the profile's gradients are zeroed). train_gpt and train_llama's; finetune makes its plans
/// shape-only (priced_plan in finetune.cpp).
template <class Model>
remat::plan::Plan make_plan(const std::string& mode, const Model& model, std::int64_t layers,
                            const remat::Tensor<std::int32_t>& x,
                            const remat::Tensor<std::int32_t>& y, const char* program) {
  namespace plan = remat::plan;
  const auto n = static_cast<std::size_t>(layers);
  if (mode == "none") return plan::none(n);
  if (mode == "every") return plan::every(n);
  if (mode == "sqrt") return plan::sqrt(n);
  if (const std::optional<remat::SavePolicy> policy = checkpoint_policy(mode)) {
    const plan::Chain chain = model.profile(x, y, {}, {.policies = {*policy}});
    for (auto p : model.parameters()) p.zero_grad();
    return plan::custom(chain, policy_plan(*policy, layers).segments);
  }
  if (mode.rfind("budget:", 0) == 0) {
    const double mib = budget_mib(mode, program);
    const plan::Chain chain = model.profile(x, y);
    for (auto p : model.parameters()) p.zero_grad();
    return plan::budget(chain, mib * 1024 * 1024);
  }
  throw remat::ArgumentError(std::string(program) + ": --checkpoint must be " + kCheckpointModes +
                             ", got " + mode);
}

/// The plan --checkpoint names before any profile: none, every, sqrt and policy:<policy> as they
/// are, every for budget:<MiB> (the least memory any plan needs), to check a run fits before
/// allocating it.
inline remat::plan::Plan smallest_plan(const std::string& mode, std::int64_t layers,
                                       const char* program) {
  namespace plan = remat::plan;
  const auto n = static_cast<std::size_t>(layers);
  if (mode == "none") return plan::none(n);
  if (mode == "sqrt") return plan::sqrt(n);
  if (const std::optional<remat::SavePolicy> policy = checkpoint_policy(mode))
    return policy_plan(*policy, layers);
  check_checkpoint_mode(mode, program);
  return plan::every(n);  // every, or a budget
}

/// Refuses a run that cannot fit in this machine's memory, before anything is allocated: first
/// a lower bound from the sizes alone (weights, gradients and AdamW's two moments of the
/// embedding and one width x width matrix a layer, one activation a layer; in doubles, so that
/// no size overflows and the estimate below is never asked about absurd sizes), then
/// `estimate()`, the library's figure for a step under the plan --checkpoint names (smallest_plan)
/// plus `held` bytes the run keeps besides (validation batches).
template <class Estimate>
void check_fits(const char* program, double vocab, double width, double layers, double context,
                double batch, double held, Estimate&& estimate) {
  const double floor = 4 * 4 * (vocab * width + context * width + layers * width * width) +
                       4 * batch * context * width * layers + held;
  flags::fits(program, "this run", floor);
  flags::fits(program, "this run", estimate() + held);
}

/// The integer metadata value `key` of the saved run `path`, all of it and >= 0, or an IoError
/// naming the file, the key and the value.
inline std::int64_t metadata_integer(const remat::io::Metadata& meta, const std::string& key,
                                     const std::string& path, const char* program) {
  const auto it = meta.find(key);
  if (it == meta.end()) {
    throw remat::IoError(remat::detail::cat(program, ": ", path, " has no '", key,
                                            "' metadata (is it a ", program, " --save file?)"));
  }
  std::int64_t value = -1;
  const std::string& text = it->second;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || value < 0) {
    throw remat::IoError(remat::detail::cat(program, ": ", path, " has an invalid '", key,
                                            "' metadata value '", text.substr(0, 40),
                                            "' (expected an integer >= 0)"));
  }
  return value;
}

/// The finite number metadata value `key` of the saved run `path`, or an IoError naming it.
inline double metadata_number(const remat::io::Metadata& meta, const std::string& key,
                              const std::string& path, const char* program) {
  const auto it = meta.find(key);
  double value = 0;
  const std::string text = it == meta.end() ? std::string() : it->second;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (it == meta.end() || r.ec != std::errc() || r.ptr != text.data() + text.size() ||
      !std::isfinite(value)) {
    throw remat::IoError(remat::detail::cat(
        program, ": ", path, " has ",
        it == meta.end() ? "no '" + key + "' metadata"
                         : "an invalid '" + key + "' metadata value '" + text.substr(0, 40) + "'"));
  }
  return value;
}

/// m:ss
inline std::string format_duration(double seconds) {
  const auto s = static_cast<long>(std::max(0.0, seconds));
  char out[32];
  std::snprintf(out, sizeof out, "%ld:%02ld", s / 60, s % 60);
  return out;
}

/// Generates `count` characters after `tokens`, sampling at temperature 0.8 from the last
/// `context` tokens' logits over `vocab` ids.
template <class Model>
std::string generate(const Model& model, const Corpus& corpus, std::vector<std::int32_t> tokens,
                     std::int64_t count, std::int64_t context, std::int64_t vocab,
                     remat::Rng& rng) {
  remat::NoGradGuard no_grad;
  std::string out;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t time =
        std::min<std::int64_t>(context, static_cast<std::int64_t>(tokens.size()));
    remat::Tensor<std::int32_t> ids({1, time});
    for (std::int64_t t = 0; t < time; ++t)
      ids[t] = tokens[tokens.size() - static_cast<std::size_t>(time - t)];
    const remat::Tensor<float> logits = model.logits(ids).value();
    std::vector<double> p(static_cast<std::size_t>(vocab));
    double m = -1e300, total = 0;
    for (std::int64_t v = 0; v < vocab; ++v)
      m = std::max(m, double(logits[(time - 1) * vocab + v]) / 0.8);
    for (std::int64_t v = 0; v < vocab; ++v)
      total += p[v] = std::exp(double(logits[(time - 1) * vocab + v]) / 0.8 - m);
    double u = rng.uniform() * total;
    std::int32_t next = static_cast<std::int32_t>(vocab - 1);
    for (std::int64_t v = 0; v < vocab; ++v) {
      if ((u -= p[v]) < 0) {
        next = static_cast<std::int32_t>(v);
        break;
      }
    }
    tokens.push_back(next);
    out.push_back(corpus.vocab[next]);
  }
  return out;
}

/// The CSV loss log at `path` on the root rank (null elsewhere or with no path): a new file with
/// its header for a run from step 0, appended to by a resumed run.
inline std::FILE* open_log(const std::string& path, std::int64_t start, bool root,
                           const char* program) {
  if (path.empty() || !root) return nullptr;
  std::FILE* log = std::fopen(path.c_str(), start > 0 ? "a" : "w");
  if (!log) throw remat::IoError(std::string(program) + ": cannot write " + path);
  if (start == 0) std::fprintf(log, "step,train_loss,val_loss,lr,tokens_per_s,act_peak_mb\n");
  return log;
}

}  // namespace corpus
