#pragma once
/// @file
/// Reads a Hugging Face config.json (LlamaConfig, Qwen2Config, MistralConfig without sliding
/// windows) into nn::LlamaConfig. A missing file, malformed JSON, a missing or mistyped field, or
/// a feature the model does not implement (rope_scaling, a head_dim other than hidden_size /
/// num_attention_heads, an activation other than silu) is an IoError naming the file and field.
/// The file is read strictly (io/json.hpp: a regular file, no repeated key), and sizes whose
/// tensors could not exist (vocab_size 2^62) are refused by name.

#if !__has_include(<nlohmann/json.hpp>)
#error "remat/nn/llama_config.hpp needs nlohmann/json (Debian: nlohmann-json3-dev)"
#endif

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "remat/io/json.hpp"
#include "remat/nn/llama.hpp"

namespace remat::detail {

/// Deepest nesting of arrays and objects accepted: nlohmann's parser recurses once per level,
/// so a hostile file of a million '[' would overflow the stack. Real configs nest 3 deep.
inline constexpr int kMaxConfigDepth = 64;

/// Throws unless `text` nests arrays/objects at most kMaxConfigDepth deep (strings skipped).
inline void check_json_depth(const std::string& text, const std::string& source) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\')
        ++i;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxConfigDepth) {
        throw IoError(
            cat(source, ": JSON nested more than ", kMaxConfigDepth, " levels deep at byte ", i));
      }
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
}

inline const nlohmann::json* config_field(const nlohmann::json& j, const char* name, bool required,
                                          const std::string& source) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    if (required) throw IoError(cat(source, ": field '", name, "' is missing"));
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

namespace remat::nn {

/// The LlamaConfig a parsed config.json describes; `source` names it in errors. Fields absent
/// from the file take Hugging Face's defaults (num_key_value_heads = num_attention_heads;
/// Qwen2's q/k/v projections always have biases).
inline LlamaConfig llama_config_from_json(const nlohmann::json& j,
                                          const std::string& source = "config.json") {
  namespace d = remat::detail;
  if (!j.is_object())
    throw IoError(detail::cat(source, ": expected a JSON object, got ", j.type_name()));
  LlamaConfig c;
  const nlohmann::json* type = d::config_field(j, "model_type", false, source);
  const bool qwen2 = type && type->is_string() && type->get<std::string>() == "qwen2";
  d::read_int(j, "vocab_size", true, c.vocab_size, source);
  d::read_int(j, "hidden_size", true, c.hidden_size, source);
  d::read_int(j, "intermediate_size", true, c.intermediate_size, source);
  d::read_int(j, "num_hidden_layers", true, c.num_hidden_layers, source);
  d::read_int(j, "num_attention_heads", true, c.num_attention_heads, source);
  c.num_key_value_heads = c.num_attention_heads;
  d::read_int(j, "num_key_value_heads", false, c.num_key_value_heads, source);
  c.max_position_embeddings = qwen2 ? 32768 : 2048;
  d::read_int(j, "max_position_embeddings", false, c.max_position_embeddings, source);
  d::read_double(j, "rope_theta", c.rope_theta, source);
  d::read_double(j, "rms_norm_eps", c.rms_norm_eps, source);
  d::read_double(j, "initializer_range", c.initializer_range, source);
  d::read_bool(j, "tie_word_embeddings", c.tie_word_embeddings, source);
  c.attention_bias = qwen2;
  d::read_bool(j, "attention_bias", c.attention_bias, source);
  if (const nlohmann::json* act = d::config_field(j, "hidden_act", false, source);
      act && *act != "silu") {
    throw IoError(detail::cat(source, ": field 'hidden_act' is ", act->dump(),
                              "; only \"silu\" is implemented"));
  }
  if (d::config_field(j, "rope_scaling", false, source)) {
    throw IoError(detail::cat(
        source, ": field 'rope_scaling' is set; scaled rotary embeddings are not implemented"));
  }
  if (const nlohmann::json* hd = d::config_field(j, "head_dim", false, source);
      hd && !(hd->is_number_integer() &&
              hd->get<std::int64_t>() == c.hidden_size / c.num_attention_heads)) {
    throw IoError(detail::cat(source, ": field 'head_dim' is ", hd->dump(),
                              "; only hidden_size / num_attention_heads = ",
                              c.hidden_size / c.num_attention_heads, " is implemented"));
  }
  try {
    c.validate();
  } catch (const UsageError& e) {
    throw IoError(detail::cat(source, ": ", e.what()));
  }
  return c;
}

}  // namespace remat::nn

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

namespace remat::nn {

/// Parses config.json text; `source` names it in errors.
inline LlamaConfig parse_llama_config(const std::string& text,
                                      const std::string& source = "config.json") {
  remat::detail::check_json_depth(text, source);
  // strict: a repeated key is an IoError naming it (io/json.hpp)
  const LlamaConfig c = llama_config_from_json(io::parse_json(text, source), source);
  remat::detail::check_llama_sizes(c, source);
  return c;
}

/// Reads a config.json file (or the config.json inside a model folder's path given as a file).
/// Only a regular file is read: a FIFO, a device or a folder is an IoError naming it.
inline LlamaConfig load_llama_config(const std::string& path) {
  std::string text;
  try {
    text = io::read_text_file(path, "config.json reader");
  } catch (const IoError& e) {
    throw IoError(detail::cat(path, ": cannot open the config file (", e.what(), ")"));
  }
  return parse_llama_config(text, path);
}

/// The config.json text of `c`, with Hugging Face's field names (model_type "llama", or
/// "qwen2" when the q/k/v projections have biases).
inline std::string llama_config_json(const LlamaConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {c.attention_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = c.attention_bias ? "qwen2" : "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["initializer_range"] = c.initializer_range;
  j["hidden_act"] = "silu";
  return j.dump(2) + "\n";
}

}  // namespace remat::nn
