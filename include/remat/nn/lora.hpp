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
/// policy like any parameter, and save_adapters() writes them under PEFT's names
/// "base_model.model.<path>.lora_A.weight".
///
/// adapter_config.json (read_options(), load()): every field is implemented, known not to change
/// the adapted model (listed in kHarmlessFields with the reason), or refused by name when it
/// would (bias other than "none", fan_in_fan_out, modules_to_save, use_dora, ...); an unknown
/// field is refused too. docs/guide.md has the table.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/io/folder.hpp"
#include "remat/io/json.hpp"
#include "remat/io/safetensors.hpp"
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

/// A regular expression from a config field, or a UsageError naming the field and the pattern.
inline std::regex compile(const std::string& pattern, const char* field) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw UsageError(
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

/// Checks `o` before anything changes: a UsageError naming the field and the value.
inline void check_options(const Options& o) {
  if (o.rank < 1)
    throw UsageError(remat::detail::cat("lora::apply: rank must be >= 1, got ", o.rank));
  if (!(std::isfinite(o.alpha) && o.alpha > 0)) {
    throw UsageError(
        remat::detail::cat("lora::apply: alpha must be positive and finite, got ", o.alpha));
  }
  if (!(o.dropout >= 0 && o.dropout < 1)) {
    throw UsageError(remat::detail::cat("lora::apply: dropout must be in [0, 1), got ", o.dropout));
  }
  for (const auto& [key, r] : o.rank_pattern) {
    if (r < 1)
      throw UsageError(remat::detail::cat("lora::apply: rank_pattern '", key, "' is ", r,
                                          "; a rank must be >= 1"));
    compile(key, "rank_pattern");
  }
  for (const auto& [key, a] : o.alpha_pattern) {
    if (!(std::isfinite(a) && a > 0))
      throw UsageError(remat::detail::cat("lora::apply: alpha_pattern '", key, "' is ", a,
                                          "; an alpha must be positive and finite"));
    compile(key, "alpha_pattern");
  }
  if (!o.target_regex.empty() && !o.targets.empty()) {
    throw UsageError(
        "lora::apply: give target_modules as names (targets) or as one regular expression "
        "(target_regex), not both");
  }
  if (!o.target_regex.empty() && (!o.layers_to_transform.empty() || !o.layers_pattern.empty())) {
    throw UsageError(
        "lora::apply: layers_to_transform and layers_pattern need target_modules as names, not "
        "as a regular expression (as PEFT)");
  }
  if (!o.layers_pattern.empty() && o.layers_to_transform.empty()) {
    throw UsageError("lora::apply: layers_pattern is given without layers_to_transform (as PEFT)");
  }
}

}  // namespace detail

/// adapter_config.json fields that cannot change the adapted model, with the reason (docs).
inline constexpr std::pair<const char*, const char*> kHarmlessFields[] = {
    {"task_type", "names the task the adapters were trained for"},
    {"base_model_name_or_path", "names the base model; the caller chooses it"},
    {"revision", "the base model's version on the Hub"},
    {"inference_mode", "whether PEFT freezes the adapters; training is the caller's choice"},
    {"auto_mapping", "which Python class PEFT builds"},
    {"peft_version", "the PEFT version that wrote the file"},
    {"runtime_config", "where PEFT runs (GPU offload), not what it computes"},
    {"megatron_core", "a module name, used only with megatron_config (refused)"},
    {"qalora_group_size", "used only with use_qalora (refused)"},
    {"eva_config", "EVA's initialization settings: the loaded tensors replace the initialization"},
    {"corda_config", "CorDA's initialization settings, used only with init_lora_weights corda"},
    {"lora_ga_config",
     "LoRA-GA's initialization settings, used only with init_lora_weights lora_ga"},
};

namespace detail {

using Json = nlohmann::ordered_json;

/// Whether `v` is what PEFT writes for a feature that is off: null, false, "", [] or {}.
inline bool off(const Json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.empty()) ||
         ((v.is_array() || v.is_object()) && v.empty());
}

/// adapter_config.json's JSON, read strictly (io/json.hpp): a regular file (a FIFO or a folder
/// is an IoError naming it), valid JSON with no repeated key, in the file's key order.
inline Json read_config_json(const std::string& path) {
  return io::read_json_file<Json>(path, "lora");
}

/// A list of names, or one string (`regex` gets it), from a target_modules-like field.
inline void names_or_regex(const Json& v, const std::string& path, const char* field,
                           std::vector<std::string>& names, std::string& regex) {
  const auto bad = [&] {
    return IoError(remat::detail::cat("lora: ", path, ": ", field, " is ", v.dump(),
                                      "; expected a list of module names or one regular "
                                      "expression"));
  };
  if (v.is_null()) return;
  if (v.is_string()) {
    regex = v.get<std::string>();
    return;
  }
  if (!v.is_array()) throw bad();
  for (const Json& n : v) {
    if (!n.is_string()) throw bad();
    names.push_back(n.get<std::string>());
  }
}

/// The options of one adapter_config.json (see read_options()).
inline Options options_from_json(const Json& c, const std::string& path) {
  const auto fail = [&](const std::string& key, const std::string& why) {
    return IoError(
        remat::detail::cat("lora: ", path, ": ", key, " = ", c.at(key).dump(), ": ", why));
  };
  if (!c.is_object()) throw IoError(remat::detail::cat("lora: ", path, " is not a JSON object"));
  Options o;
  const auto number = [&](const char* key, bool required) -> std::optional<double> {
    if (!c.contains(key) || c.at(key).is_null()) {
      if (required) throw IoError(remat::detail::cat("lora: ", path, " has no number '", key, "'"));
      return std::nullopt;
    }
    if (!c.at(key).is_number()) throw fail(key, "not a number");
    return c.at(key).get<double>();
  };
  for (const auto& [key, v] : c.items()) {
    if (key == "peft_type") {
      if (v != "LORA") throw fail(key, "remat reads LORA adapters only");
    } else if (key == "r" || key == "lora_alpha" || key == "lora_dropout") {
      // read below
    } else if (key == "target_modules") {
      if (v.is_null())
        throw fail(key, "PEFT then picks modules by model type; remat needs them named");
      names_or_regex(v, path, "target_modules", o.targets, o.target_regex);
      if (o.target_regex == "all-linear")
        throw fail(key, "the 'all-linear' shorthand is not supported: list the modules");
    } else if (key == "exclude_modules") {
      names_or_regex(v, path, "exclude_modules", o.exclude, o.exclude_regex);
    } else if (key == "layers_to_transform") {
      if (v.is_number_integer()) {
        o.layers_to_transform.push_back(v.get<std::int64_t>());
      } else if (v.is_array()) {
        for (const Json& i : v) {
          if (!i.is_number_integer()) throw fail(key, "expected a layer index or a list of them");
          o.layers_to_transform.push_back(i.get<std::int64_t>());
        }
      } else if (!v.is_null()) {
        throw fail(key, "expected a layer index or a list of them");
      }
    } else if (key == "layers_pattern") {
      std::string one;
      names_or_regex(v, path, "layers_pattern", o.layers_pattern, one);
      if (!one.empty()) o.layers_pattern.push_back(one);
    } else if (key == "use_rslora") {
      if (!v.is_boolean()) throw fail(key, "expected true or false");
      o.use_rslora = v.get<bool>();
    } else if (key == "rank_pattern" || key == "alpha_pattern") {
      if (v.is_null()) continue;
      if (!v.is_object()) throw fail(key, "expected an object of pattern: value");
      for (const auto& [pattern, value] : v.items()) {
        if (key == "rank_pattern") {
          if (!value.is_number_integer()) throw fail(key, "'" + pattern + "' is not an integer");
          o.rank_pattern.emplace_back(pattern, value.get<std::int64_t>());
        } else {
          if (!value.is_number()) throw fail(key, "'" + pattern + "' is not a number");
          o.alpha_pattern.emplace_back(pattern, value.get<double>());
        }
      }
    } else if (key == "bias") {
      if (v != "none")
        throw fail(key, "trained base biases are not supported (remat's adapters add no bias)");
    } else if (key == "fan_in_fan_out") {
      if (!off(v)) throw fail(key, "weights stored (in, out) (GPT-2's Conv1D) are not supported");
    } else if (key == "init_lora_weights") {
      // Only the starting values, which the loaded tensors replace; the variants that also
      // change the base weights or what trains are refused.
      const bool init_only = v.is_boolean() || v == "gaussian" || v == "orthogonal" || v == "eva";
      if (!init_only)
        throw fail(key,
                   "this initialization changes the base weights or what trains; "
                   "remat supports true, false, gaussian, orthogonal and eva");
    } else if (key == "modules_to_save" || key == "use_dora" || key == "lora_bias" ||
               key == "use_qalora" || key == "layer_replication" || key == "megatron_config" ||
               key == "loftq_config" || key == "trainable_token_indices" ||
               key == "alora_invocation_tokens" || key == "use_bdlora" || key == "velora_config" ||
               key == "monteclora_config" || key == "arrow_config" || key == "kasa_config" ||
               key == "target_parameters" || key == "ensure_weight_tying") {
      if (!off(v)) throw fail(key, "changes the adapted model in a way remat does not implement");
    } else if (std::none_of(std::begin(kHarmlessFields), std::end(kHarmlessFields),
                            // `name`, not `key`: clang before 16 cannot capture a binding
                            [&name = key](const auto& h) { return name == h.first; })) {
      throw IoError(remat::detail::cat("lora: ", path, ": unknown field '", key,
                                       "' (remat refuses what it cannot tell is harmless)"));
    }
  }
  if (c.contains("base_model_name_or_path") && c.at("base_model_name_or_path").is_string())
    o.base_model_name_or_path = c.at("base_model_name_or_path").get<std::string>();
  const double r = *number("r", true);
  if (!(r >= 1 && r == std::floor(r) && r < 1e9)) throw fail("r", "not a rank >= 1");
  o.rank = static_cast<std::int64_t>(r);
  o.alpha = *number("lora_alpha", true);
  o.dropout = number("lora_dropout", false).value_or(0.0);
  if (!(o.dropout >= 0 && o.dropout < 1)) throw fail("lora_dropout", "must be in [0, 1)");
  if (o.targets.empty() && o.target_regex.empty())
    throw IoError(remat::detail::cat("lora: ", path, " names no target_modules"));
  try {
    check_options(o);
  } catch (const UsageError& e) {
    throw IoError(remat::detail::cat(path, ": ", e.what()));
  }
  return o;
}

/// adapter_config.json for `o` (PEFT's field names; the features remat lacks written as off).
inline Json config_json(const Options& o) {
  const auto names_or_regex_json = [](const std::vector<std::string>& names,
                                      const std::string& regex) {
    return regex.empty() ? (names.empty() ? Json(nullptr) : Json(names)) : Json(regex);
  };
  Json rank_pattern = Json::object(), alpha_pattern = Json::object();
  for (const auto& [k, v] : o.rank_pattern) rank_pattern[k] = v;
  for (const auto& [k, v] : o.alpha_pattern) alpha_pattern[k] = v;
  return Json{
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", o.rank},
      {"lora_alpha", o.alpha},
      {"lora_dropout", o.dropout},
      {"use_rslora", o.use_rslora},
      {"target_modules", names_or_regex_json(o.targets, o.target_regex)},
      {"exclude_modules", names_or_regex_json(o.exclude, o.exclude_regex)},
      {"layers_to_transform",
       o.layers_to_transform.empty() ? Json(nullptr) : Json(o.layers_to_transform)},
      {"layers_pattern", o.layers_pattern.empty() ? Json(nullptr) : Json(o.layers_pattern)},
      {"rank_pattern", rank_pattern},
      {"alpha_pattern", alpha_pattern},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"inference_mode", false},
      {"base_model_name_or_path", o.base_model_name_or_path},
  };
}

}  // namespace detail

/// The Options of `dir`/adapter_config.json, PEFT's LoraConfig: every field is read, listed in
/// kHarmlessFields, or refused by name with an IoError (also for an unknown field, a wrong
/// type, a pattern that is not a regular expression). `seed` stays 0.
inline Options read_options(const std::string& dir) {
  const std::string path = dir + "/adapter_config.json";
  return detail::options_from_json(detail::read_config_json(path), path);
}

/// The adapters apply() added to a model: their parameters, PEFT files, and merge().
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

  /// Writes `dir`/adapter_model.safetensors and `dir`/adapter_config.json (PEFT's layout), as a
  /// whole (io::save_folder): an earlier save in `dir` stays readable until the new one is
  /// complete, and a failed save leaves it as it was.
  void save_adapters(const std::string& dir) const {
    check_not_merged("save_adapters");
    io::save_folder(dir, [&](const std::string& staging) { write_adapters(staging); });
  }

  /// Writes the two files of save_adapters() into `folder`, the one a caller's own
  /// io::save_folder is filling (to save other files with them as one whole).
  void write_adapters(const std::string& folder) const {
    check_not_merged("write_adapters");
    std::vector<io::NamedTensor<T>> tensors;
    for (const auto& [name, p] : named_parameters()) tensors.emplace_back(name, p.value());
    io::save<T>(folder + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
    io::save_text(folder + "/adapter_config.json", detail::config_json(options_).dump(2) + "\n");
  }

  /// Reads adapters saved by save_adapters() (or by PEFT) into these, all or nothing: a config
  /// with a field remat refuses, a layer whose rank or scale under the file's config differs
  /// from this adapter's (r, lora_alpha, use_rslora, rank_pattern, alpha_pattern), a tensor
  /// missing, extra, of another shape or dtype is an IoError naming it, and nothing is changed.
  void load_adapters(const std::string& dir) {
    check_not_merged("load_adapters");
    check_config(dir);
    const std::string path = dir + "/adapter_model.safetensors";
    const io::File file = io::File::read(path);
    std::vector<std::pair<Parameter<T>, Tensor<T>>> loaded;
    std::set<std::string> expected;
    for (const auto& [name, p] : named_parameters()) {
      expected.insert(name);
      if (!file.contains(name))
        throw IoError(
            remat::detail::cat("lora::load_adapters: ", path, " has no tensor '", name, "'"));
      const Shape& shape = file.entry(name).shape;
      if (!(shape == p.shape())) {
        throw IoError(remat::detail::cat("lora::load_adapters: tensor '", name, "' in ", path,
                                         " has shape ", shape, ", the model's adapter ",
                                         p.shape()));
      }
      loaded.emplace_back(p, file.tensor<T>(name));
    }
    for (const auto& [name, e] : file.entries()) {
      if (!expected.count(name)) {
        throw IoError(remat::detail::cat("lora::load_adapters: ", path, " holds tensor '", name,
                                         "', which matches no adapter of the model (",
                                         expected.size(), " adapter tensors, the first '",
                                         expected.empty() ? std::string("none") : *expected.begin(),
                                         "')"));
      }
    }
    for (auto& [p, t] : loaded) p.data() = std::move(t);
  }

  /// Folds the adapters into the base weights, W += scale B A, and removes them: the
  /// layers' forwards are plain again and the adapter parameters leave the model. The base
  /// weights must be float parameters; a base stored otherwise (quantized) cannot take the
  /// merge: a UsageError, before anything changes.
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
        throw UsageError(remat::detail::cat(
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

  /// The config in `dir` against these adapters: each layer's rank and scale under the file's
  /// options must be this adapter's (so the loaded tensors mean what they meant when saved).
  void check_config(const std::string& dir) const {
    const Options file = read_options(dir);
    const std::string where = dir + "/adapter_config.json";
    for (const Adapter<T>& a : adapters_) {
      std::int64_t rank = 0;
      double alpha = 0, scale = 0;
      detail::adapter_shape(a.path, file, rank, alpha, scale);
      if (rank != a.rank) {
        throw IoError(remat::detail::cat("lora::load_adapters: ", where, " gives '", a.path,
                                         "' r = ", rank, ", this adapter has rank ", a.rank));
      }
      if (scale != a.scale) {
        throw IoError(remat::detail::cat(
            "lora::load_adapters: ", where, " gives '", a.path, "' lora_alpha = ", alpha,
            file.use_rslora ? " with use_rslora (scale alpha / sqrt(r) = " : " (scale alpha / r = ",
            scale, "), this adapter has alpha ", a.alpha,
            options_.use_rslora ? " with use_rslora (scale " : " (scale ", a.scale, ")"));
      }
    }
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

/// Wraps the Linear layers of `model` that `options` selects (PEFT's rules, see the file
/// comment; or `model` itself when it is a Linear) with adapters, freezes every other parameter,
/// and returns the adapters. Throws a UsageError for a rank < 1, a non-positive or non-finite
/// alpha, a dropout outside [0, 1), a pattern that is not a regular expression, a target name
/// that selects no Linear (or a regex that selects none), or no layer wrapped at all.
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
      for (std::size_t i = 0; i < options.targets.size(); ++i)
        used[i] = used[i] || detail::ends_with_module(path, options.targets[i]);
      matched.emplace_back(path, m);
    }
    if (!options.target_regex.empty() && matched.empty()) {
      throw UsageError(remat::detail::cat("lora::apply: target_modules '", options.target_regex,
                                          "' matches the path of no Linear layer of the model"));
    }
    for (std::size_t i = 0; i < options.targets.size(); ++i) {
      if (!used[i]) {
        throw UsageError(remat::detail::cat(
            "lora::apply: target '", options.targets[i], "' names no Linear layer of the model",
            options.exclude.empty() && options.exclude_regex.empty() &&
                    options.layers_to_transform.empty()
                ? ""
                : " that exclude_modules and layers_to_transform leave",
            " (", matched.size(), " layers matched the other targets)"));
      }
    }
    if (matched.empty())
      throw UsageError("lora::apply: no target names given, and the model is not a Linear");
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

/// Adapters saved in `dir` (by save_adapters() or by PEFT) added to `model`: apply() with the
/// options of `dir`/adapter_config.json (read_options()), then load_adapters(). `seed` only sets
/// the values the file then replaces.
template <class T>
Adapters<T> load(Module<T>& model, const std::string& dir) {
  Adapters<T> adapters = apply(model, read_options(dir));
  adapters.load_adapters(dir);
  return adapters;
}

}  // namespace remat::nn::lora
