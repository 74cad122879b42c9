#pragma once
/// @file
/// Reads a Hugging Face config.json (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config) into
/// nn::LlamaConfig, and writes one back. Every field is implemented, known not to change the
/// maths, or refused by name (Note [config fields]). A missing file, malformed JSON, a missing
/// or mistyped field, an unsupported model_type or architecture, or a feature the model does not
/// implement (yarn rope, an activation other than silu, dropout) is an IoError naming the file,
/// the field and the value.
/// The file is read strictly (io/json.hpp: a regular file, no repeated key), and sizes whose
/// tensors could not exist (vocab_size 2^62) are refused by name.

#if !__has_include(<nlohmann/json.hpp>)
#error "remat/hub/llama_config.hpp needs nlohmann/json (Debian: nlohmann-json3-dev)"
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>

#include "remat/io/json.hpp"
#include "remat/nn/llama.hpp"

namespace remat::detail {

/// The field's value, or nullptr when it is absent (or null: callers that do not read null as
/// absent refuse it first, ConfigFields::take).
inline const nlohmann::json* config_field(const nlohmann::json& j, const char* name, bool required,
                                          const std::string& source) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    if (required) {
      throw IoError(cat(source, ": field '", name, "' is ", it == j.end() ? "missing" : "null",
                        "; it needs a value"));
    }
    return nullptr;
  }
  return &*it;
}

inline void read_int(const nlohmann::json& j, const char* name, bool required, std::int64_t& out,
                     const std::string& source) {
  const nlohmann::json* v = config_field(j, name, required, source);
  if (!v) return;
  if (!v->is_number_integer() || v->get<std::int64_t>() < 1) {
    throw IoError(cat(source, ": field '", name, "' must be a positive integer, got ", v->dump()));
  }
  out = v->get<std::int64_t>();
}

inline void read_double(const nlohmann::json& j, const char* name, double& out,
                        const std::string& source) {
  const nlohmann::json* v = config_field(j, name, false, source);
  if (!v) return;
  if (!v->is_number() || !(v->get<double>() > 0)) {
    throw IoError(cat(source, ": field '", name, "' must be a positive number, got ", v->dump()));
  }
  out = v->get<double>();
}

inline void read_bool(const nlohmann::json& j, const char* name, bool& out,
                      const std::string& source) {
  const nlohmann::json* v = config_field(j, name, false, source);
  if (!v) return;
  if (!v->is_boolean())
    throw IoError(cat(source, ": field '", name, "' must be true or false, got ", v->dump()));
  out = v->get<bool>();
}

}  // namespace remat::detail

namespace remat::detail {

/// Note [config fields]: every key of a config.json is accounted for. The reader consumes the
/// fields it implements (per family, as Hugging Face's config class of that model_type reads
/// them); the keys below are known not to change the forward pass's maths and are accepted
/// when their value has the kind HF's config classes give them (null too: their default); a
/// field with a value the model does not implement is refused by name; and any other key is
/// refused by name too, since nothing is ignored silently. A read field given as null is
/// refused unless HF gives null a meaning there (num_key_value_heads, sliding_window,
/// rope_scaling...): elsewhere HF's models fail on the None, or its versions read it differently.
enum class HarmlessKind { text, flag, token_ids, positive_int, object, dtype };
struct HarmlessField {
  const char* name;
  HarmlessKind kind;
  const char* reason;
};
inline constexpr HarmlessField kHarmlessConfigFields[] = {
    {"torch_dtype", HarmlessKind::dtype,
     "the dtype the weights were saved in; each tensor's own dtype is read"},
    {"dtype", HarmlessKind::dtype,
     "the dtype the weights were saved in (transformers v5's torch_dtype)"},
    {"transformers_version", HarmlessKind::text, "the version of the library that wrote the file"},
    {"_name_or_path", HarmlessKind::text, "where the config was loaded from"},
    {"bos_token_id", HarmlessKind::token_ids,
     "a token id for tokenization and generation, not the forward pass"},
    {"eos_token_id", HarmlessKind::token_ids,
     "a token id for tokenization and generation, not the forward pass"},
    {"use_cache", HarmlessKind::flag,
     "whether HF's forward returns a KV cache; no effect on the logits"},
    {"output_attentions", HarmlessKind::flag, "what HF's forward returns, not its values"},
    {"output_hidden_states", HarmlessKind::flag, "what HF's forward returns, not its values"},
    {"return_dict", HarmlessKind::flag, "what HF's forward returns, not its values"},
    {"pretraining_tp", HarmlessKind::positive_int,
     "current HF ignores it (versions before about 4.47 split each projection into slices)"},
    {"id2label", HarmlessKind::object,
     "labels of classification heads, which a causal LM does not have"},
    {"label2id", HarmlessKind::object,
     "labels of classification heads, which a causal LM does not have"},
    {"tokenizer_class", HarmlessKind::text, "which tokenizer to use (tokenizer side)"},
    {"is_llama_config", HarmlessKind::flag,
     "a flag of nanotron's exports (SmolLM) that HF's LlamaConfig does not read"},
    {"unsloth_version", HarmlessKind::text, "the version of the tool that wrote the file"},
    {"use_mrope", HarmlessKind::flag,
     "Qwen2-VL's multimodal RoPE switch, in Qwen2.5 and DeepSeek-R1-Distill-Qwen configs; "
     "HF's causal LMs do not read it"},
    {"_attn_implementation_autoset", HarmlessKind::flag,
     "that transformers (about 4.46 to 4.48) chose the attention kernel itself; the same maths"},
    {"transformers.js_config", HarmlessKind::object,
     "settings of transformers.js, the JavaScript library (SmolLM2)"},
};

/// What a harmless field's value must be, or nullptr when `v` is one (null always is).
inline const char* harmless_kind_mismatch(HarmlessKind kind, const nlohmann::json& v) {
  if (v.is_null()) return nullptr;
  const auto id = [](const nlohmann::json& x) {
    return x.is_number_integer() && x.get<std::int64_t>() >= 0;
  };
  switch (kind) {
    case HarmlessKind::text:
      return v.is_string() ? nullptr : "a string";
    case HarmlessKind::flag:
      return v.is_boolean() ? nullptr : "true or false";
    case HarmlessKind::token_ids:
      return id(v) || (v.is_array() && std::all_of(v.begin(), v.end(), id))
                 ? nullptr
                 : "a token id (an integer >= 0) or a list of them";
    case HarmlessKind::positive_int:
      return v.is_number_integer() && v.get<std::int64_t>() >= 1 ? nullptr : "a positive integer";
    case HarmlessKind::object:
      return v.is_object() ? nullptr : "an object";
    case HarmlessKind::dtype:
      // the names transformers writes for torch's floating dtypes; a quantized or float8
      // checkpoint names another and is refused here rather than read as float
      for (const char* name : {"float32", "float16", "bfloat16", "float64"})
        if (v == name) return nullptr;
      return "\"float32\", \"float16\", \"bfloat16\" or \"float64\"";
  }
  return "?";
}

/// The families a config.json may describe: model_type, its HF class, and what differs.
struct LlamaFamily {
  const char* model_type;
  const char* architecture;
};
inline constexpr LlamaFamily kLlamaFamilies[] = {{"llama", "LlamaForCausalLM"},
                                                 {"mistral", "MistralForCausalLM"},
                                                 {"qwen2", "Qwen2ForCausalLM"},
                                                 {"qwen3", "Qwen3ForCausalLM"}};

inline std::string supported_families() {
  std::string out;
  for (const LlamaFamily& f : kLlamaFamilies)
    out += cat(out.empty() ? "" : ", ", f.model_type, " (", f.architecture, ")");
  return out;
}

/// A config.json object and the keys read from it so far.
class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& j, std::string source) : j_(j), source_(std::move(source)) {}

  /// Whether the file gives `name` as null: HF's config classes tell that from an absent key
  /// where their default is not None (the default applies only when the key is absent).
  bool is_null(const char* name) const {
    const auto it = j_.find(name);
    return it != j_.end() && it->is_null();
  }

  /// Whether null is refused (Note [config fields]) or read as the key's absence.
  enum class Null { refused, absent };

  /// The field's value (nullptr when absent), marked as accounted for.
  const nlohmann::json* take(const char* name, Null null = Null::refused) {
    used_.insert(name);
    if (null == Null::refused && is_null(name)) {
      throw IoError(cat(source_, ": field '", name,
                        "' is null; give it a value or leave it out (Hugging Face's models "
                        "cannot use a null there)"));
    }
    return config_field(j_, name, false, source_);
  }
  void take_int(const char* name, bool required, std::int64_t& out, Null null = Null::refused) {
    if (!required) take(name, null);
    used_.insert(name);
    read_int(j_, name, required, out, source_);
  }
  void take_double(const char* name, double& out) {
    take(name);
    read_double(j_, name, out, source_);
  }
  void take_bool(const char* name, bool& out) {
    take(name);
    read_bool(j_, name, out, source_);
  }
  /// Refuses a value of `name` other than `expected` (absent passes): the model does not
  /// implement it.
  void take_only(const char* name, const nlohmann::json& expected, const std::string& why) {
    const nlohmann::json* v = take(name);
    if (v && *v != expected &&
        !(v->is_number() && expected.is_number() && v->get<double>() == expected.get<double>())) {
      throw IoError(cat(source_, ": field '", name, "' is ", v->dump(), "; only ", expected.dump(),
                        " is implemented (", why, ")"));
    }
  }

  /// Throws on the first key neither read nor known to be harmless.
  void refuse_the_rest(const std::string& model_type) const {
    for (const auto& [key, value] : j_.items()) {
      if (used_.count(key)) continue;
      const HarmlessField* harmless = nullptr;
      for (const HarmlessField& h : kHarmlessConfigFields)
        if (key == h.name) harmless = &h;
      if (harmless) {
        if (const char* expected = harmless_kind_mismatch(harmless->kind, value)) {
          throw IoError(
              cat(source_, ": field '", key, "' must be ", expected, ", got ", brief_value(value)));
        }
        continue;
      }
      throw IoError(cat(source_, ": field '", brief_key(key), "' (", brief_value(value),
                        ") is not implemented for model_type '", model_type,
                        "': remat refuses config fields it does not account for (docs/guide.md, "
                        "\"Model families and config fields\")"));
    }
  }

  const std::string& source() const noexcept { return source_; }

 private:
  static std::string brief_key(const std::string& key) {
    return key.size() <= 80 ? key : key.substr(0, 80) + "...";
  }
  static std::string brief_value(const nlohmann::json& v) {
    const std::string text = v.dump();
    return text.size() <= 80 ? text : text.substr(0, 80) + "...";
  }

  const nlohmann::json& j_;
  std::string source_;
  std::set<std::string> used_;
};

/// model_type, checked against architectures: one of kLlamaFamilies. A config without a
/// model_type takes its architecture's, or "llama" when it names none either.
inline std::string read_model_type(ConfigFields& f) {
  const nlohmann::json* type = f.take("model_type");
  const nlohmann::json* arch = f.take("architectures", ConfigFields::Null::absent);
  if (type && !type->is_string())
    throw IoError(cat(f.source(), ": field 'model_type' must be a string, got ", type->dump()));
  if (arch && !(arch->is_array() && arch->size() == 1 && (*arch)[0].is_string())) {
    throw IoError(
        cat(f.source(), ": field 'architectures' must list one class name, got ", arch->dump()));
  }
  const std::string arch_name = arch ? (*arch)[0].get<std::string>() : "";
  std::string model_type = type ? type->get<std::string>() : "";
  const LlamaFamily* family = nullptr;
  for (const LlamaFamily& fam : kLlamaFamilies) {
    if (model_type.empty() ? arch_name == fam.architecture : model_type == fam.model_type)
      family = &fam;
  }
  if (!family && model_type.empty() && arch_name.empty()) family = &kLlamaFamilies[0];
  if (!family) {
    throw IoError(cat(f.source(), ": ",
                      model_type.empty() ? cat("architectures ", arch->dump())
                                         : cat("model_type '", model_type, "'"),
                      " is not supported; supported: ", supported_families()));
  }
  if (!arch_name.empty() && arch_name != family->architecture) {
    throw IoError(cat(f.source(), ": architectures ", arch->dump(),
                      " is not supported for model_type '", family->model_type, "' (only ",
                      family->architecture, "); supported: ", supported_families()));
  }
  return family->model_type;
}

/// rope_scaling (or transformers v5's rope_parameters, which may also hold rope_theta): the rope
/// type under "rope_type" or the legacy "type", and its parameters; "default" is no scaling.
/// yarn, longrope and any other type are refused by name, as is any key the type does not read.
inline void read_rope_scaling(const nlohmann::json& r, const char* field, nn::LlamaConfig& c,
                              const std::string& source) {
  if (!r.is_object())
    throw IoError(cat(source, ": field '", field, "' must be an object, got ", r.dump()));
  std::set<std::string> used;
  const auto get = [&](const char* key) -> const nlohmann::json* {
    used.insert(key);
    const auto it = r.find(key);
    if (it == r.end()) return nullptr;
    // transformers reads a null rope_type as a type it does not know, and a null parameter as
    // its absence only in some versions
    if (it->is_null())
      throw IoError(cat(source, ": field '", field, "' key '", key, "' is null; give it a value"));
    return &*it;
  };
  const auto number = [&](const char* key, bool required, double fallback) {
    const nlohmann::json* v = get(key);
    if (!v) {
      if (required)
        throw IoError(cat(source, ": field '", field, "' needs '", key, "' for its rope type"));
      return fallback;
    }
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() <= 0) {
      throw IoError(cat(source, ": field '", field, "' key '", key,
                        "' must be a positive number, got ", v->dump()));
    }
    return v->get<double>();
  };
  const nlohmann::json* type = get("rope_type");
  const nlohmann::json* legacy = get("type");
  // transformers v4 lets "type" overwrite "rope_type", v5 the other way round: refused
  if (type && legacy && *type != *legacy) {
    throw IoError(cat(source, ": field '", field, "' has rope_type ", type->dump(), " and type ",
                      legacy->dump(), ", which transformers' versions read differently"));
  }
  if (!type) type = legacy;
  if (type && !type->is_string())
    throw IoError(
        cat(source, ": field '", field, "' rope_type must be a string, got ", type->dump()));
  const std::string name = type ? type->get<std::string>() : "default";
  if (const nlohmann::json* theta = get("rope_theta")) {
    if (std::string(field) != "rope_parameters" || !theta->is_number() ||
        !(theta->get<double>() > 0)) {
      throw IoError(cat(source, ": field '", field, "' key 'rope_theta' is ", theta->dump(),
                        "; only a positive number inside rope_parameters is implemented"));
    }
    c.rope_theta = theta->get<double>();
  }
  RopeScaling s;
  if (name == "default") {
    s.type = RopeScalingType::none;
  } else if (name == "linear" || name == "dynamic") {
    s.type = name == "linear" ? RopeScalingType::linear : RopeScalingType::dynamic;
    s.factor = number("factor", true, 1.0);
  } else if (name == "llama3") {
    s.type = RopeScalingType::llama3;
    s.factor = number("factor", true, 1.0);
    s.low_freq_factor = number("low_freq_factor", true, 1.0);
    s.high_freq_factor = number("high_freq_factor", true, 4.0);
    const double original = number("original_max_position_embeddings", true, 1.0);
    if (original != std::floor(original) || original > 1e15) {
      throw IoError(cat(source, ": field '", field,
                        "' key 'original_max_position_embeddings' must be an integer, got ",
                        original));
    }
    s.original_max_position_embeddings = static_cast<std::int64_t>(original);
  } else {
    throw IoError(cat(source, ": field '", field, "' has rope type '", name,
                      "'; implemented: default, linear, dynamic, llama3"));
  }
  for (const auto& [key, value] : r.items()) {
    if (!used.count(key)) {
      throw IoError(cat(source, ": field '", field, "' key '", key, "' (", value.dump(),
                        ") is not implemented for rope type '", name, "'"));
    }
  }
  c.rope_scaling = s;
}

/// pad_token_id: HF's models make it their embedding's padding_idx (a negative id counts from
/// the end, as torch.nn.Embedding has it), whose row the lookup gives no gradient.
inline void read_pad_token_id(ConfigFields& f, nn::LlamaConfig& c) {
  const nlohmann::json* v = f.take("pad_token_id", ConfigFields::Null::absent);
  if (!v) return;
  if (!v->is_number_integer() || v->get<std::int64_t>() >= c.vocab_size ||
      v->get<std::int64_t>() < -c.vocab_size) {
    throw IoError(cat(f.source(), ": field 'pad_token_id' must be an integer id in [-vocab_size, ",
                      "vocab_size) = [", -c.vocab_size, ", ", c.vocab_size, "), got ", v->dump()));
  }
  const std::int64_t id = v->get<std::int64_t>();
  c.pad_token_id = id < 0 ? c.vocab_size + id : id;
}

/// Qwen2/Qwen3's windows: sliding_window applies when use_sliding_window is true, on the layers
/// layer_types names "sliding_attention", or (without layer_types) on layers >= max_window_layers.
inline void read_qwen_windows(ConfigFields& f, nn::LlamaConfig& c) {
  bool use = false;
  f.take_bool("use_sliding_window", use);
  std::int64_t window = 4096, max_window_layers = 28;
  // HF's default window is 4096 when the key is absent; only null means none
  const bool no_window = f.is_null("sliding_window");
  f.take_int("sliding_window", false, window, ConfigFields::Null::absent);
  if (use && !no_window && f.is_null("max_window_layers")) {
    // HF's layers compare their index with it when windows are in use
    throw IoError(cat(f.source(),
                      ": field 'max_window_layers' is null while sliding windows are in use; "
                      "give it a value or leave it out (28)"));
  }
  if (const nlohmann::json* max = f.take("max_window_layers", ConfigFields::Null::absent)) {
    // 0 is valid here (every layer slides), unlike the sizes read_int reads
    if (!max->is_number_integer() || max->get<std::int64_t>() < 0) {
      throw IoError(cat(f.source(),
                        ": field 'max_window_layers' must be a non-negative integer, got ",
                        max->dump()));
    }
    max_window_layers = max->get<std::int64_t>();
  }
  const nlohmann::json* types = f.take("layer_types", ConfigFields::Null::absent);
  std::vector<bool> sliding(static_cast<std::size_t>(c.num_hidden_layers), false);
  if (types) {
    // checked whether or not a window is in use, as HF's layer_type_validation does
    if (!types->is_array() || static_cast<std::int64_t>(types->size()) != c.num_hidden_layers) {
      throw IoError(cat(f.source(), ": field 'layer_types' must list ", c.num_hidden_layers,
                        " layer types, got ", types->dump().substr(0, 200)));
    }
    for (std::size_t i = 0; i < types->size(); ++i) {
      const nlohmann::json& t = (*types)[i];
      if (t != "full_attention" && t != "sliding_attention") {
        throw IoError(cat(f.source(), ": field 'layer_types' entry ", i, " is ", t.dump(),
                          "; implemented: \"full_attention\", \"sliding_attention\""));
      }
      sliding[i] = t == "sliding_attention";
    }
  }
  if (!use || no_window) {
    for (std::size_t i = 0; i < sliding.size(); ++i) {
      if (sliding[i]) {
        throw IoError(cat(f.source(), ": field 'layer_types' makes layer ", i,
                          " \"sliding_attention\" but no sliding window is in use "
                          "(use_sliding_window false or sliding_window null)"));
      }
    }
    return;
  }
  c.sliding_window = window;
  c.sliding_layers = std::move(sliding);
  if (!types) {
    for (std::int64_t i = max_window_layers; i < c.num_hidden_layers; ++i)
      c.sliding_layers[static_cast<std::size_t>(i)] = true;
  }
}

}  // namespace remat::detail

namespace remat::hub {

/// The nn::LlamaConfig a parsed config.json describes; `source` names it in errors. The family
/// comes from model_type (and architectures must agree): llama, mistral, qwen2 or qwen3, anything
/// else an error that lists them. Fields absent from the file take Hugging Face's defaults for that
/// family (num_key_value_heads = num_attention_heads, 8 for Mistral; max_position_embeddings
/// 2048 for nn::Llama, 32768 for Qwen2/3, 131072 for Mistral; Mistral's sliding_window 4096;
/// Qwen3's head_dim 128). Per family (Hugging Face's modeling_*.py):
/// - llama: attention_bias puts biases on q, k, v and o; mlp_bias on gate, up and down;
/// - qwen2: q, k and v always biased, o never; sliding windows per use_sliding_window,
///   max_window_layers and layer_types;
/// - qwen3: q_norm and k_norm; attention_bias on q, k, v and o; windows as Qwen2;
/// - mistral: no biases; sliding_window on every layer (null: none).
/// Every other key is implemented, harmless (remat::detail::kHarmlessConfigFields) or refused by
/// name (Note [config fields]).
inline nn::LlamaConfig llama_config_from_json(const nlohmann::json& j,
                                              const std::string& source = "config.json") {
  namespace d = remat::detail;
  if (!j.is_object())
    throw IoError(remat::detail::cat(source, ": expected a JSON object, got ", j.type_name()));
  d::ConfigFields f(j, source);
  nn::LlamaConfig c;
  c.model_type = d::read_model_type(f);
  const std::string& type = c.model_type;
  const bool qwen = type == "qwen2" || type == "qwen3", mistral = type == "mistral";
  f.take_int("vocab_size", true, c.vocab_size);
  f.take_int("hidden_size", true, c.hidden_size);
  f.take_int("intermediate_size", true, c.intermediate_size);
  f.take_int("num_hidden_layers", true, c.num_hidden_layers);
  f.take_int("num_attention_heads", true, c.num_attention_heads);
  // HF's defaults when the key is absent: 32 for Qwen2/3, 8 for Mistral, the heads for Llama;
  // null gives the heads in every family
  c.num_key_value_heads = f.is_null("num_key_value_heads") || type == "llama"
                              ? c.num_attention_heads
                          : mistral ? 8
                                    : 32;
  f.take_int("num_key_value_heads", false, c.num_key_value_heads, d::ConfigFields::Null::absent);
  c.max_position_embeddings = qwen ? 32768 : mistral ? 131072 : 2048;
  f.take_int("max_position_embeddings", false, c.max_position_embeddings);
  c.explicit_head_dim = type == "qwen3" ? 128 : 0;
  // Llama's and Mistral's null is hidden_size / heads; Qwen2's and Qwen3's attention fails on it
  f.take_int("head_dim", false, c.explicit_head_dim,
             qwen ? d::ConfigFields::Null::refused : d::ConfigFields::Null::absent);
  f.take_double("rope_theta", c.rope_theta);
  const double top_level_theta = c.rope_theta;
  f.take_double("rms_norm_eps", c.rms_norm_eps);
  f.take_double("initializer_range", c.initializer_range);
  f.take_bool("tie_word_embeddings", c.tie_word_embeddings);
  if (const nlohmann::json* act = f.take("hidden_act"); act && *act != "swish") {
    // HF's ACT2FN maps both names to SiLU
    f.take_only("hidden_act", "silu", "the MLP is SwiGLU with silu (or \"swish\", the same)");
  }
  f.take_only("attention_dropout", 0.0, "no dropout in the attention");
  f.take_only("partial_rotary_factor", 1.0, "RoPE turns every dimension of a head");
  f.take_only("mlp_only_layers", nlohmann::json::array(), "no mixture of experts");
  f.take_only("rope_interleaved", false, "HF's models rotate halves, not interleaved pairs");
  const nlohmann::json* scaling = f.take("rope_scaling", d::ConfigFields::Null::absent);
  const nlohmann::json* parameters = f.take("rope_parameters", d::ConfigFields::Null::absent);
  if (scaling && parameters && *scaling != *parameters) {
    // transformers v4 reads only rope_scaling, v5 prefers it but takes rope_theta from either
    throw IoError(remat::detail::cat(source, ": fields 'rope_scaling' (", scaling->dump(),
                                     ") and 'rope_parameters' (", parameters->dump(),
                                     ") differ; transformers' versions read them differently"));
  }
  if (parameters) {
    d::read_rope_scaling(*parameters, "rope_parameters", c, source);
    if (j.contains("rope_theta") && c.rope_theta != top_level_theta) {
      // transformers v4 reads the top-level one, v5 the one in rope_parameters
      throw IoError(remat::detail::cat(source, ": fields 'rope_theta' (", top_level_theta,
                                       ") and 'rope_parameters' key ", "'rope_theta' (",
                                       c.rope_theta,
                                       ") differ; transformers' versions read them differently"));
    }
  } else if (scaling) {
    d::read_rope_scaling(*scaling, "rope_scaling", c, source);
  }
  d::read_pad_token_id(f, c);
  if (type == "llama") {
    f.take_bool("attention_bias", c.attention_bias);
    c.o_proj_bias = c.attention_bias;
    f.take_bool("mlp_bias", c.mlp_bias);
  } else if (type == "qwen2") {
    c.attention_bias = true;  // Qwen2's q/k/v always have biases, its o_proj never
    f.take_only("attention_bias", true, "Qwen2's q, k and v projections always have biases");
    d::read_qwen_windows(f, c);
  } else if (type == "qwen3") {
    c.qk_norm = true;
    f.take_bool("attention_bias", c.attention_bias);
    c.o_proj_bias = c.attention_bias;
    d::read_qwen_windows(f, c);
  } else if (mistral) {
    c.sliding_window = 4096;
    if (j.contains("sliding_window") && j.at("sliding_window").is_null()) c.sliding_window = 0;
    f.take_int("sliding_window", false, c.sliding_window, d::ConfigFields::Null::absent);
  }
  f.refuse_the_rest(type);
  try {
    c.validate();
  } catch (const ArgumentError& e) {
    throw IoError(remat::detail::cat(source, ": ", e.what()));
  }
  return c;
}

}  // namespace remat::hub

namespace remat::detail {

/// `a` times `b`, or nullopt past INT64_MAX (both positive).
inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) noexcept {
  if (a > INT64_MAX / b) return std::nullopt;
  return a * b;
}

/// Throws an IoError naming `source`, the keys and their values unless every tensor of the model
/// `c` describes has a number of bytes that fits in an int64_t (so that no size computed from
/// the config overflows: vocab_size 2^62 would). Whether the memory exists is for the caller to
/// judge (load_llama checks the sizes against the weight files before allocating anything).
inline void check_llama_sizes(const nn::LlamaConfig& c, const std::string& source) {
  const auto check = [&](const char* what, std::int64_t a, const char* a_name, std::int64_t b,
                         const char* b_name) {
    const auto n = checked_mul(a, b);
    if (!n || *n > static_cast<std::int64_t>(Tensor<double>::kMaxBytes / sizeof(double))) {
      throw IoError(cat(source, ": ", a_name, " = ", a, " times ", b_name, " = ", b, " (", what,
                        ") is more elements than a tensor may hold (2^59 of 8 bytes)"));
    }
  };
  check("the embedding", c.vocab_size, "vocab_size", c.hidden_size, "hidden_size");
  check("an MLP matrix", c.intermediate_size, "intermediate_size", c.hidden_size, "hidden_size");
  check("an attention matrix", c.hidden_size, "hidden_size", c.hidden_size, "hidden_size");
}

}  // namespace remat::detail

namespace remat::hub {

/// Parses config.json text; `source` names it in errors.
inline nn::LlamaConfig parse_llama_config(const std::string& text,
                                          const std::string& source = "config.json") {
  // strict: nesting bounded before parsing, a repeated key an IoError naming it (io/json.hpp)
  const nn::LlamaConfig c = llama_config_from_json(io::parse_json(text, source), source);
  remat::detail::check_llama_sizes(c, source);
  return c;
}

/// Reads a config.json file (or the config.json inside a model folder's path given as a file).
/// Only a regular file is read: a FIFO, a device or a folder is an IoError naming it.
inline nn::LlamaConfig load_llama_config(const std::string& path) {
  std::string text;
  try {
    text = io::read_text_file(path, "config.json reader");
  } catch (const IoError& e) {
    throw IoError(remat::detail::cat(path, ": cannot open the config file (", e.what(), ")"));
  }
  return parse_llama_config(text, path);
}

/// The model_type whose Hugging Face class computes what `c` does: c.model_type when its flags
/// fit that family, else "qwen2" for a nn::Llama with q/k/v biases only (as earlier versions wrote
/// it); an ArgumentError naming the flags when no family fits.
inline std::string llama_family_of(const nn::LlamaConfig& c) {
  const bool plain = !c.qk_norm && !c.mlp_bias;
  const bool every_layer =
      c.sliding_window == 0 || c.sliding_layers.empty() ||
      std::all_of(c.sliding_layers.begin(), c.sliding_layers.end(), [](bool b) { return b; });
  const auto fits = [&](const std::string& t) {
    if (t == "llama")
      return c.o_proj_bias == c.attention_bias && !c.qk_norm && c.sliding_window == 0;
    if (t == "mistral") return !c.attention_bias && !c.o_proj_bias && plain && every_layer;
    if (t == "qwen2") return c.attention_bias && !c.o_proj_bias && plain;
    if (t == "qwen3") return c.o_proj_bias == c.attention_bias && c.qk_norm && !c.mlp_bias;
    return false;
  };
  if (fits(c.model_type)) return c.model_type;
  if (c.model_type == "llama" && fits("qwen2")) return "qwen2";
  throw ArgumentError(remat::detail::cat(
      "llama_config_json: no supported family has model_type '", c.model_type,
      "' with attention_bias ", c.attention_bias, ", o_proj_bias ", c.o_proj_bias, ", mlp_bias ",
      c.mlp_bias, ", qk_norm ", c.qk_norm, ", sliding_window ", c.sliding_window, " on ",
      c.sliding_layers.empty() ? std::string("every layer")
                               : remat::detail::cat(c.sliding_layers.size(), " flagged layers"),
      "; supported: ", remat::detail::supported_families()));
}

}  // namespace remat::hub

namespace remat::detail {

/// The first layer of `c` that slides when the sliding layers are the last ones (all of them
/// included), or -1: what transformers' max_window_layers can say.
inline std::int64_t first_of_sliding_suffix(const nn::LlamaConfig& c) {
  std::int64_t first = c.num_hidden_layers;
  while (first > 0 && c.window_of(first - 1) > 0) --first;
  for (std::int64_t i = 0; i < first; ++i)
    if (c.window_of(i) > 0) return -1;
  return first;
}

}  // namespace remat::detail

namespace remat::hub {

/// The config.json text of `c`, with Hugging Face's field names, in the family
/// llama_family_of(c) names; read back by llama_config_from_json to the same config.
inline std::string llama_config_json(const nn::LlamaConfig& c) {
  const std::string type = llama_family_of(c);
  nlohmann::ordered_json j;
  for (const auto& f : remat::detail::kLlamaFamilies)
    if (type == f.model_type) j["architectures"] = {f.architecture};
  j["model_type"] = type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim();
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (type == "llama" || type == "qwen3") j["attention_bias"] = c.attention_bias;
  if (type == "llama") j["mlp_bias"] = c.mlp_bias;
  j["initializer_range"] = c.initializer_range;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  // the config carries no special tokens (the tokenizer's files do); written as null, since an
  // absent key is 1 and 2 in transformers' Llama and Mistral configs, and its generate() would
  // stop at token 2
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  const RopeScaling& r = c.rope_scaling;
  if (r.type == RopeScalingType::none) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", to_string(r.type)}, {"factor", r.factor}};
    if (r.type == RopeScalingType::llama3) {
      j["rope_scaling"]["low_freq_factor"] = r.low_freq_factor;
      j["rope_scaling"]["high_freq_factor"] = r.high_freq_factor;
      j["rope_scaling"]["original_max_position_embeddings"] = r.original_max_position_embeddings;
    }
  }
  if (type == "mistral") {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window)
                                               : nlohmann::ordered_json(nullptr);
  } else if (type == "qwen2" || type == "qwen3") {
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window)
                                               : nlohmann::ordered_json(nullptr);
    if (c.sliding_window > 0) {
      nlohmann::ordered_json types = nlohmann::ordered_json::array();
      for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
        types.push_back(c.window_of(i) > 0 ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
      // transformers before layer_types (about 4.53) slides the layers from max_window_layers on
      const std::int64_t first = remat::detail::first_of_sliding_suffix(c);
      if (first >= 0) j["max_window_layers"] = first;
    }
  }
  return j.dump(2) + "\n";
}

}  // namespace remat::hub
