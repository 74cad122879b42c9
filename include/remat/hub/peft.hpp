#pragma once
/// @file
/// PEFT's adapter files for nn::lora's adapters (nn/lora.hpp builds them; this reads and writes
/// their files): adapter_config.json read into lora::Options, where every field is implemented,
/// known not to change the adapted model (kHarmlessLoraFields, with the reason), or refused by
/// name when it would (bias other than "none", fan_in_fan_out, modules_to_save, use_dora, ...);
/// an unknown field is refused too (docs/guide.md has the table). Adapters are saved in PEFT's
/// layout (adapter_model.safetensors under "base_model.model.<path>.lora_A.weight", and
/// adapter_config.json) and loaded back all or nothing.

#if !__has_include(<nlohmann/json.hpp>)
#error "remat/hub/peft.hpp needs nlohmann/json (Debian: nlohmann-json3-dev)"
#endif

#include <nlohmann/json.hpp>

#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "remat/io/folder.hpp"
#include "remat/io/json.hpp"
#include "remat/io/safetensors.hpp"
#include "remat/nn/lora.hpp"

namespace remat::hub {

/// adapter_config.json fields that cannot change the adapted model, with the reason (docs).
inline constexpr std::pair<const char*, const char*> kHarmlessLoraFields[] = {
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
    {"loftq_config",
     "LoftQ's settings, used only with init_lora_weights loftq (refused); PEFT drops them else"},
    {"merge_weights", "PEFT 0.2's merging at evaluation: the same model, merged or not"},
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

/// layers_to_transform and layers_pattern as PEFT tests them: by `is None` for a regex
/// target_modules (which takes neither, so even [] or "" is refused), by truth for the layers
/// (an empty list is every layer, and layers_pattern then qualifies nothing).
inline void layer_fields_as_peft(const Json& c, nn::lora::Options& o, const std::string& path) {
  const auto given = [&](const char* key) { return c.contains(key) && !c.at(key).is_null(); };
  if (!o.target_regex.empty() && (given("layers_to_transform") || given("layers_pattern"))) {
    throw IoError(
        remat::detail::cat("lora: ", path,
                           ": layers_to_transform and layers_pattern need target_modules as names, "
                           "not as a regular expression (PEFT refuses them even empty)"));
  }
  if (given("layers_to_transform") && o.layers_to_transform.empty()) o.layers_pattern.clear();
}

/// The options of one adapter_config.json (see read_lora_options()).
inline nn::lora::Options options_from_json(const Json& c, const std::string& path) {
  const auto fail = [&](const std::string& key, const std::string& why) {
    return IoError(
        remat::detail::cat("lora: ", path, ": ", key, " = ", c.at(key).dump(), ": ", why));
  };
  if (!c.is_object()) throw IoError(remat::detail::cat("lora: ", path, " is not a JSON object"));
  nn::lora::Options o;
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
      if (!v.is_boolean() && !v.is_null()) throw fail(key, "expected true or false");
      o.use_rslora = v.is_boolean() && v.get<bool>();  // null is false in PEFT's test
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
               key == "enable_lora" || key == "trainable_token_indices" ||
               key == "alora_invocation_tokens" || key == "use_bdlora" || key == "velora_config" ||
               key == "monteclora_config" || key == "arrow_config" || key == "kasa_config" ||
               key == "target_parameters" || key == "ensure_weight_tying") {
      if (!off(v)) throw fail(key, "changes the adapted model in a way remat does not implement");
    } else if (std::none_of(std::begin(kHarmlessLoraFields), std::end(kHarmlessLoraFields),
                            // `name`, not `key`: clang before 16 cannot capture a binding
                            [&name = key](const auto& h) { return name == h.first; })) {
      throw IoError(remat::detail::cat("lora: ", path, ": unknown field '", key,
                                       "' (remat refuses what it cannot tell is harmless)"));
    }
  }
  if (c.contains("base_model_name_or_path") && c.at("base_model_name_or_path").is_string())
    o.base_model_name_or_path = c.at("base_model_name_or_path").get<std::string>();
  // absent (or null): LoraConfig's defaults, r = 8 and lora_alpha = 8
  const double r = number("r", false).value_or(8.0);
  if (!(r >= 1 && r == std::floor(r) && r < 1e9)) throw fail("r", "not a rank >= 1");
  o.rank = static_cast<std::int64_t>(r);
  o.alpha = number("lora_alpha", false).value_or(8.0);
  o.dropout = number("lora_dropout", false).value_or(0.0);
  if (!(o.dropout >= 0 && o.dropout < 1)) throw fail("lora_dropout", "must be in [0, 1)");
  if (o.targets.empty() && o.target_regex.empty())
    throw IoError(remat::detail::cat("lora: ", path, " names no target_modules"));
  layer_fields_as_peft(c, o, path);
  try {
    nn::lora::detail::check_options(o);
  } catch (const ArgumentError& e) {
    throw IoError(remat::detail::cat(path, ": ", e.what()));
  }
  return o;
}

/// adapter_config.json for `o` (PEFT's field names; the features remat lacks written as off).
inline Json config_json(const nn::lora::Options& o) {
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
inline nn::lora::Options read_lora_options(const std::string& dir) {
  const std::string path = dir + "/adapter_config.json";
  return detail::options_from_json(detail::read_config_json(path), path);
}

namespace detail {

/// Refuses a file operation on adapters merged into their base weights (they have no files).
template <class T>
void check_not_merged(const nn::lora::Adapters<T>& adapters, const char* what) {
  if (adapters.merged())
    throw UsageError(
        remat::detail::cat("hub::", what, ": the adapters were merged into the base weights"));
}

/// The config in `dir` against `adapters`: each layer's rank and scale under the file's options
/// must be the adapter's (so the loaded tensors mean what they meant when saved).
template <class T>
void check_adapter_config(const nn::lora::Adapters<T>& adapters, const std::string& dir) {
  const nn::lora::Options file = read_lora_options(dir);
  const std::string where = dir + "/adapter_config.json";
  for (const nn::lora::Adapter<T>& a : adapters.adapters()) {
    std::int64_t rank = 0;
    double alpha = 0, scale = 0;
    nn::lora::detail::adapter_shape(a.path, file, rank, alpha, scale);
    if (rank != a.rank) {
      throw IoError(remat::detail::cat("hub::load_adapters: ", where, " gives '", a.path,
                                       "' r = ", rank, ", this adapter has rank ", a.rank));
    }
    if (scale != a.scale) {
      throw IoError(remat::detail::cat(
          "hub::load_adapters: ", where, " gives '", a.path, "' lora_alpha = ", alpha,
          file.use_rslora ? " with use_rslora (scale alpha / sqrt(r) = " : " (scale alpha / r = ",
          scale, "), this adapter has alpha ", a.alpha,
          adapters.options().use_rslora ? " with use_rslora (scale " : " (scale ", a.scale, ")"));
    }
  }
}

}  // namespace detail

/// Writes the two files of save_adapters() into `folder`, the one a caller's own io::save_folder
/// is filling (to save other files with them as one whole).
template <class T>
void write_adapters(const nn::lora::Adapters<T>& adapters, const std::string& folder) {
  detail::check_not_merged(adapters, "write_adapters");
  std::vector<io::NamedTensor<T>> tensors;
  for (const auto& [name, p] : adapters.named_parameters()) tensors.emplace_back(name, p.value());
  io::save<T>(folder + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  io::save_text(folder + "/adapter_config.json",
                detail::config_json(adapters.options()).dump(2) + "\n");
}

/// Writes `dir`/adapter_model.safetensors and `dir`/adapter_config.json (PEFT's layout), as a
/// whole (io::save_folder): an earlier save in `dir` stays readable until the new one is
/// complete, and a failed save leaves it as it was.
template <class T>
void save_adapters(const nn::lora::Adapters<T>& adapters, const std::string& dir) {
  detail::check_not_merged(adapters, "save_adapters");
  io::save_folder(dir, [&](const std::string& staging) { write_adapters(adapters, staging); });
}

/// Reads adapters saved by save_adapters() (or by PEFT) into `adapters`, all or nothing: a
/// config with a field remat refuses, a layer whose rank or scale under the file's config
/// differs from the adapter's (r, lora_alpha, use_rslora, rank_pattern, alpha_pattern), a
/// tensor missing, extra, of another shape or dtype is an IoError naming it, and nothing is
/// changed.
template <class T>
void load_adapters(nn::lora::Adapters<T>& adapters, const std::string& dir) {
  detail::check_not_merged(adapters, "load_adapters");
  detail::check_adapter_config(adapters, dir);
  const std::string path = dir + "/adapter_model.safetensors";
  const io::File file = io::File::read(path);
  std::vector<std::pair<Parameter<T>, Tensor<T>>> loaded;
  std::set<std::string> expected;
  for (const auto& [name, p] : adapters.named_parameters()) {
    expected.insert(name);
    if (!file.contains(name))
      throw IoError(
          remat::detail::cat("hub::load_adapters: ", path, " has no tensor '", name, "'"));
    const Shape& shape = file.entry(name).shape;
    if (!(shape == p.shape())) {
      throw IoError(remat::detail::cat("hub::load_adapters: tensor '", name, "' in ", path,
                                       " has shape ", shape, ", the model's adapter ", p.shape()));
    }
    loaded.emplace_back(p, file.tensor<T>(name));
  }
  for (const auto& [name, e] : file.entries()) {
    if (!expected.count(name)) {
      throw IoError(remat::detail::cat("hub::load_adapters: ", path, " holds tensor '", name,
                                       "', which matches no adapter of the model (",
                                       expected.size(), " adapter tensors, the first '",
                                       expected.empty() ? std::string("none") : *expected.begin(),
                                       "')"));
    }
  }
  for (auto& [p, t] : loaded) p.data() = std::move(t);
}

/// Adapters saved in `dir` (by save_adapters() or by PEFT) added to `model`: lora::apply() with
/// the options of `dir`/adapter_config.json (read_lora_options()), then load_adapters().
template <class T>
nn::lora::Adapters<T> load_lora(nn::Module<T>& model, const std::string& dir) {
  nn::lora::Adapters<T> adapters = nn::lora::apply(model, read_lora_options(dir));
  load_adapters(adapters, dir);
  return adapters;
}

}  // namespace remat::hub
