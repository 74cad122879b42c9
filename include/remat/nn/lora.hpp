#pragma once
/// @file
/// LoRA (Hu et al., 2021): low-rank adapters on frozen linear layers. apply() wraps every Linear
/// that PEFT's rules select (target_modules as names a path equals or ends in, or as one regular
/// expression the whole path matches; minus exclude_modules; within layers_to_transform) so
/// that its forward becomes
///   base(x) + scale * B(A(dropout(x))),   scale = alpha / rank, or alpha / sqrt(rank) (rsLoRA)
/// where rank and alpha may differ per layer (rank_pattern, alpha_pattern: the first key, in
/// the file's order, that matches the end of the path as a regular expression, as PEFT's
/// get_pattern_key).
/// with A (rank, in) Kaiming-uniform as PEFT initializes it (kaiming_uniform_(a = sqrt(5)), i.e.
/// uniform in +-1/sqrt(in)) and B (out, rank) zero, so the wrapped model starts as the base
/// model. Everything else is frozen: only the adapters get gradients and optimizer state.
///
/// The base layer's own forward runs unchanged (Note [forward hooks] in nn/module.hpp): the
/// adapters never read the base weight, however the base stores it; only merge() does. The
/// adapters are registered as children "lora_A" and "lora_B" of the layer they wrap, so they
/// appear in named_parameters() as "<path>.lora_A.weight", run under every checkpoint plan and
/// policy like any parameter, and Adapters::named_parameters() gives them PEFT's names
/// "base_model.model.<path>.lora_A.weight". Their files (PEFT's adapter_config.json and
/// adapter_model.safetensors) are read and written above nn, by hub/peft.hpp.

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "remat/nn/layers.hpp"
#include "remat/ops/arithmetic.hpp"
#include "remat/ops/dropout.hpp"

namespace remat::nn::lora {

/// PEFT's LoraConfig fields that change the adapted model and that remat implements (bias is
/// always "none"; the fields remat refuses are listed in docs/guide.md).
struct Options {
  std::int64_t rank = 8;  ///< r
  double alpha = 16.0;    ///< lora_alpha; the adapters' output is scaled by alpha / rank
  double dropout = 0.0;   ///< lora_dropout, on the adapters' input only
  /// target_modules as a list: a layer is wrapped when its path equals a name or ends in "." and
  /// the name ("q_proj", "self_attn.q_proj", "model.layers.0.mlp.up_proj").
  std::vector<std::string> targets;
  std::uint64_t seed = 0;               ///< initialization of the A matrices
  std::string base_model_name_or_path;  ///< written to adapter_config.json
  /// target_modules as one string: a regular expression (ECMAScript) the whole path must match
  /// (PEFT's re.fullmatch); when set, `targets` must be empty.
  std::string target_regex;
  /// exclude_modules as a list (a path equal to a name or ending in "." + name is skipped) ...
  std::vector<std::string> exclude;
  std::string exclude_regex;  ///< ... or as one regular expression the whole path matches
  /// layers_to_transform: with list targets, only layers whose index (the number after
  /// "<layers_pattern>." in the path, or after the first "<anything>." when no pattern is
  /// given) is listed are wrapped. Empty: every layer.
  std::vector<std::int64_t> layers_to_transform;
  std::vector<std::string> layers_pattern;  ///< layers_pattern ("layers", "h", ...)
  bool use_rslora = false;  ///< rsLoRA (Kalajdzievski 2023): scale alpha / sqrt(rank)
  /// rank_pattern and alpha_pattern: (key, value) in the file's order; a layer takes the value
  /// of the first key matching the end of its path as a regular expression.
  std::vector<std::pair<std::string, std::int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
};

/// One wrapped layer: its path in the model, the layer, its adapters, and its own rank, alpha
/// and scale (the pattern's, or the options').
template <class T = float>
struct Adapter {
  std::string path;
  Module<T> layer;
  Linear<T> A, B;  // lora_A: in -> rank, lora_B: rank -> out, no biases
  std::int64_t rank = 0;
  double alpha = 0;
  double scale = 0;  // alpha / rank, or alpha / sqrt(rank) with use_rslora
};

namespace detail {

/// A regular expression from a config field, or an ArgumentError naming the field and the pattern.
/// PEFT matches with Python's re, remat with ECMAScript: a pattern is taken only where the two
/// read it alike. Python-only syntax ((?P<...>), (?i), lookbehind) does not compile; but an
/// escaped letter ECMAScript does not know is a literal letter there (\A, \Z: anchors in Python,
/// an error for most others), so only the escapes both read alike pass.
inline std::regex compile(const std::string& pattern, const char* field) {
  constexpr std::string_view kSharedEscapes = "dDwWsSbBfnrtvxu";
  for (std::size_t i = 0; i + 1 < pattern.size(); ++i) {
    if (pattern[i] != '\\') continue;
    const char next = pattern[++i];  // passed over: a letter after an escaped backslash is plain
    if (std::isalpha(static_cast<unsigned char>(next)) &&
        kSharedEscapes.find(next) == std::string_view::npos) {
      throw ArgumentError(remat::detail::cat(
          "lora: ", field, " '", pattern, "' has the escape \\", next,
          ", which Python's re (PEFT's) and ECMAScript (remat's) do not read alike"));
    }
  }
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ArgumentError(
        remat::detail::cat("lora: ", field, " '", pattern,
                           "' is not a regular expression remat reads (ECMAScript): ", e.what()));
  }
}

/// Whether `path` equals `name` or ends in "." + name (PEFT's list matching).
inline bool ends_with_module(const std::string& path, const std::string& name) {
  if (path == name) return true;
  return path.size() > name.size() &&
         path.compare(path.size() - name.size(), name.size(), name) == 0 &&
         path[path.size() - name.size() - 1] == '.';
}

/// The index of the first key of `keys` that matches the end of `path` after a "." (or all of
/// it) as a regular expression: PEFT's get_pattern_key, re.match(r"(.*\.)?(key)$", path).
template <class V>
std::optional<V> pattern_value(const std::vector<std::pair<std::string, V>>& keys,
                               const std::string& path, const char* field) {
  for (const auto& [key, value] : keys) {
    if (std::regex_match(path, compile("(.*\\.)?(" + key + ")", field))) return value;
  }
  return std::nullopt;
}

/// The layer index PEFT reads from `path` for layers_to_transform, or nullopt when it finds none:
/// the number after "<pattern>." (first pattern that matches), or after the first "<x>." when
/// no pattern is given; the number must be followed by ".".
inline std::optional<std::int64_t> layer_index(const std::string& path,
                                               const std::vector<std::string>& patterns) {
  std::vector<std::string> regexes;
  if (patterns.empty()) regexes.push_back(".*?\\.[^.]*\\.(\\d+)\\.");
  for (const std::string& p : patterns) regexes.push_back(".*?\\." + p + "\\.(\\d+)\\.");
  for (const std::string& r : regexes) {
    std::smatch m;  // re.match: anchored at the start only
    if (std::regex_search(path, m, compile(r, "layers_pattern"),
                          std::regex_constants::match_continuous)) {
      return std::stoll(m[1].str());
    }
  }
  return std::nullopt;
}

/// Whether PEFT's rules (check_target_module_exists) select `path` for an adapter.
inline bool selected(const std::string& path, const Options& o) {
  if (!o.exclude_regex.empty() &&
      std::regex_match(path, compile(o.exclude_regex, "exclude_modules")))
    return false;
  for (const std::string& e : o.exclude) {
    if (ends_with_module(path, e)) return false;
  }
  if (!o.target_regex.empty())
    return std::regex_match(path, compile(o.target_regex, "target_modules"));
  // A path listed in full is taken as it is; layers_to_transform filters the suffix matches.
  if (std::find(o.targets.begin(), o.targets.end(), path) != o.targets.end()) return true;
  for (const std::string& target : o.targets) {
    if (!ends_with_module(path, target)) continue;
    if (o.layers_to_transform.empty()) return true;
    const std::optional<std::int64_t> layer = layer_index(path, o.layers_pattern);
    return layer && std::find(o.layers_to_transform.begin(), o.layers_to_transform.end(), *layer) !=
                        o.layers_to_transform.end();
  }
  return false;
}

/// The rank, alpha and scale of the adapter on `path`.
inline void adapter_shape(const std::string& path, const Options& o, std::int64_t& rank,
                          double& alpha, double& scale) {
  rank = pattern_value(o.rank_pattern, path, "rank_pattern").value_or(o.rank);
  alpha = pattern_value(o.alpha_pattern, path, "alpha_pattern").value_or(o.alpha);
  scale = o.use_rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

/// Checks `o` before anything changes: an ArgumentError naming the field and the value.
inline void check_options(const Options& o) {
  if (o.rank < 1)
    throw ArgumentError(remat::detail::cat("lora::apply: rank must be >= 1, got ", o.rank));
  if (!(std::isfinite(o.alpha) && o.alpha > 0)) {
    throw ArgumentError(
        remat::detail::cat("lora::apply: alpha must be positive and finite, got ", o.alpha));
  }
  if (!(o.dropout >= 0 && o.dropout < 1)) {
    throw ArgumentError(
        remat::detail::cat("lora::apply: dropout must be in [0, 1), got ", o.dropout));
  }
  for (const auto& [key, r] : o.rank_pattern) {
    if (r < 1)
      throw ArgumentError(remat::detail::cat("lora::apply: rank_pattern '", key, "' is ", r,
                                             "; a rank must be >= 1"));
    compile(key, "rank_pattern");
  }
  for (const auto& [key, a] : o.alpha_pattern) {
    if (!(std::isfinite(a) && a > 0))
      throw ArgumentError(remat::detail::cat("lora::apply: alpha_pattern '", key, "' is ", a,
                                             "; an alpha must be positive and finite"));
    compile(key, "alpha_pattern");
  }
  if (!o.target_regex.empty()) compile(o.target_regex, "target_modules");
  if (!o.exclude_regex.empty()) compile(o.exclude_regex, "exclude_modules");
  for (const std::string& p : o.layers_pattern) compile(p, "layers_pattern");
  if (!o.target_regex.empty() && !o.targets.empty()) {
    throw ArgumentError(
        "lora::apply: give target_modules as names (targets) or as one regular expression "
        "(target_regex), not both");
  }
  if (!o.target_regex.empty() && (!o.layers_to_transform.empty() || !o.layers_pattern.empty())) {
    throw ArgumentError(
        "lora::apply: layers_to_transform and layers_pattern need target_modules as names, not "
        "as a regular expression (as PEFT)");
  }
  if (!o.layers_pattern.empty() && o.layers_to_transform.empty()) {
    throw ArgumentError(
        "lora::apply: layers_pattern is given without layers_to_transform (as PEFT)");
  }
}

}  // namespace detail

/// The adapters apply() added to a model: their parameters (with PEFT's names) and merge().
template <class T = float>
class Adapters {
 public:
  Adapters(Options options, std::vector<Adapter<T>> adapters)
      : options_(std::move(options)), adapters_(std::move(adapters)) {}

  const Options& options() const noexcept { return options_; }
  const std::vector<Adapter<T>>& adapters() const noexcept { return adapters_; }

  /// The adapters' parameters (A then B, layer by layer) with PEFT's names.
  std::vector<std::pair<std::string, Parameter<T>>> named_parameters() const {
    std::vector<std::pair<std::string, Parameter<T>>> out;
    for (const Adapter<T>& a : adapters_) {
      out.emplace_back(peft_name(a.path, "lora_A"), a.A.weight);
      out.emplace_back(peft_name(a.path, "lora_B"), a.B.weight);
    }
    return out;
  }
  std::vector<Parameter<T>> parameters() const {
    std::vector<Parameter<T>> out;
    for (auto& [n, p] : named_parameters()) out.push_back(p);
    return out;
  }
  std::int64_t parameter_count() const {
    std::int64_t n = 0;
    for (const auto& [name, p] : named_parameters()) n += p.numel();
    return n;
  }

  /// "base_model.model.<path>.lora_A.weight", PEFT's name in adapter_model.safetensors.
  static std::string peft_name(const std::string& path, const char* which) {
    return remat::detail::cat("base_model.model.", path.empty() ? std::string() : path + ".", which,
                              ".weight");
  }

  /// Folds the adapters into the base weights, W += scale B A, and removes them: the
  /// layers' forwards are plain again and the adapter parameters leave the model. The base
  /// weights must be float parameters; a base stored otherwise (quantized) cannot take the
  /// merge: an ArgumentError, before anything changes.
  void merge() {
    check_not_merged("merge");
    std::vector<Parameter<T>> weights;
    for (const Adapter<T>& a : adapters_) {
      Parameter<T> w;
      for (const auto& [name, p] : a.layer.named_parameters()) {
        if (name == "weight") w = p;
      }
      const Shape want{a.layer.out_features(), a.layer.in_features()};
      if (!w.defined() || !(w.shape() == want)) {
        throw ArgumentError(remat::detail::cat(
            "lora::merge: the base weight of '", a.path, "' is not a float (", want[0], ", ",
            want[1], ") parameter; merging into a quantized base is not supported"));
      }
      weights.push_back(w);
    }
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < adapters_.size(); ++i) {
      Adapter<T>& a = adapters_[i];
      Tensor<T>& w = weights[i].data();
      const Tensor<T>& A = a.A.weight.data();
      const Tensor<T>& B = a.B.weight.data();
      const std::int64_t out = w.dim(0), in = w.dim(1), r = A.dim(0);
      if (!w.has_data()) throw UsageError("lora::merge: the weights were made in a shape-only run");
      // Accumulated in double, rounded once: the merged weight is W + s B A to rounding.
      const double s = a.scale;
      for (std::int64_t o = 0; o < out; ++o) {
        for (std::int64_t c = 0; c < in; ++c) {
          double acc = 0;
          for (std::int64_t k = 0; k < r; ++k)
            acc += double(B.data()[o * r + k]) * double(A.data()[k * in + c]);
          w.data()[o * in + c] = T(double(w.data()[o * in + c]) + s * acc);
        }
      }
      a.layer.set_forward_hook({});
      a.layer.detach("lora_A");
      a.layer.detach("lora_B");
    }
    merged_ = true;
  }
  bool merged() const noexcept { return merged_; }

 private:
  void check_not_merged(const char* what) const {
    if (merged_)
      throw UsageError(
          remat::detail::cat("lora::", what, ": the adapters were merged into the base weights"));
  }

  Options options_;
  std::vector<Adapter<T>> adapters_;
  bool merged_ = false;
};

namespace detail {

/// Adds adapters of `rank` to `layer` (a Linear) and hooks its forward.
template <class T>
Adapter<T> wrap(const std::string& path, Module<T> layer, const Options& o, Rng& rng) {
  std::int64_t rank = 0;
  double alpha = 0, scale = 0;
  adapter_shape(path, o, rank, alpha, scale);
  const std::int64_t in = layer.in_features(), out = layer.out_features();
  // nn::Linear's default initialization is uniform in +-1/sqrt(in): kaiming_uniform_(a = sqrt(5)).
  Linear<T> A(in, rank, rng, false);
  Linear<T> B(rank, out, rng, false);
  B.weight.data().fill(T(0));
  layer.attach("lora_A", A);
  layer.attach("lora_B", B);
  const T s = T(scale);
  const double p = o.dropout;
  layer.set_forward_hook([A, B, s, p](const Var<T>& x, const Var<T>& y) {
    // A's mode is the layer's: train() and eval() reach it as the layer's child.
    return y + s * B(A(dropout(x, p, A.training())));
  });
  return Adapter<T>{path, std::move(layer), std::move(A), std::move(B), rank, alpha, scale};
}

}  // namespace detail

namespace detail {

/// The last components of the paths of `model`'s Linear layers, each once, in order ("qkv, proj,
/// fc"): what a target may name.
template <class T>
std::string linear_names(Module<T>& model) {
  std::vector<std::string> names;
  for (auto& [path, m] : model.named_modules()) {
    if (m.kind() != "Linear") continue;
    const std::string name = path.substr(path.rfind('.') + 1);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace detail

/// Wraps the Linear layers of `model` that `options` selects (PEFT's rules, see the file
/// comment; or `model` itself when it is a Linear) with adapters, freezes every other parameter,
/// and returns the adapters. Throws an ArgumentError for a rank < 1, a non-positive or non-finite
/// alpha, a dropout outside [0, 1), a pattern that is not a regular expression, a target name
/// that selects no Linear (or a regex that selects none), a selected layer whose weight its model
/// reads directly (a language model's head: Module::weight_read_by), or no layer wrapped at all.
template <class T>
Adapters<T> apply(Module<T>& model, Options options) {
  detail::check_options(options);
  // Matched and checked first: a bad target changes nothing.
  std::vector<std::pair<std::string, Module<T>>> matched;
  if (model.kind() == "Linear") {
    matched.emplace_back(std::string(), model);
  } else {
    std::unordered_set<const void*> seen;
    std::vector<bool> used(std::max<std::size_t>(1, options.targets.size()), false);
    for (auto& [path, m] : model.named_modules()) {
      if (m.kind() != "Linear" || !detail::selected(path, options)) continue;
      if (!seen.insert(m.identity()).second) continue;  // one layer registered under two paths
      if (m.has_forward_hook()) {
        throw UsageError(remat::detail::cat(
            "lora::apply: '", path, "' already has a forward hook (adapters applied twice?)"));
      }
      if (!m.weight_read_by().empty()) {
        // PEFT would adapt it; skipping it would drop part of the adapter without a word
        throw ArgumentError(remat::detail::cat(
            "lora::apply: the targets select '", path, "', whose weight ", m.weight_read_by(),
            " reads directly: LoRA on a model's head is not implemented"));
      }
      for (std::size_t i = 0; i < options.targets.size(); ++i)
        used[i] = used[i] || detail::ends_with_module(path, options.targets[i]);
      matched.emplace_back(path, m);
    }
    if (!options.target_regex.empty() && matched.empty()) {
      throw ArgumentError(remat::detail::cat("lora::apply: target_modules '", options.target_regex,
                                             "' matches the path of no Linear layer of the model"));
    }
    for (std::size_t i = 0; i < options.targets.size(); ++i) {
      if (!used[i]) {
        throw ArgumentError(remat::detail::cat(
            "lora::apply: target '", options.targets[i], "' names no Linear layer of the model",
            options.exclude.empty() && options.exclude_regex.empty() &&
                    options.layers_to_transform.empty()
                ? ""
                : " that exclude_modules and layers_to_transform leave",
            " (", matched.size(), " layers matched the other targets; the model's Linear layers ",
            "are named ", detail::linear_names(model), ")"));
      }
    }
    if (matched.empty())
      throw ArgumentError("lora::apply: no target names given, and the model is not a Linear");
  }
  if (matched.front().second.has_forward_hook()) {
    throw UsageError("lora::apply: the model already has a forward hook (adapters applied twice?)");
  }
  Rng rng(options.seed);
  std::vector<Adapter<T>> adapters;
  for (auto& [path, m] : matched) adapters.push_back(detail::wrap<T>(path, m, options, rng));
  model.freeze();
  for (Adapter<T>& a : adapters) {
    a.A.weight.unfreeze();
    a.B.weight.unfreeze();
  }
  return Adapters<T>(std::move(options), std::move(adapters));
}

}  // namespace remat::nn::lora
