#pragma once
/// @file
/// What a Hugging Face folder's `tokenizer_config.json` says beyond tokenizer.json: the bos,
/// eos, pad and unk tokens, `add_bos_token`/`add_eos_token`, `model_max_length` and the chat
/// template (exposed as text: rendering it is the chat-template layer's job). A token may be
/// written as a string or as an AddedToken object ({"content": ..., ...}); a chat template as a
/// string or as a list of named templates ({"name": "default", "template": ...}). Other fields
/// (tokenizer_class, clean_up_tokenization_spaces, added_tokens_decoder, ...) concern Python
/// classes and are not read.

#include <map>
#include <optional>
#include <string>

#include "remat/hub/json_file.hpp"

namespace remat::hub {

/// The fields of tokenizer_config.json that remat reads.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;
  std::optional<std::int64_t> model_max_length;
  /// The chat template: the only one, or the one named "default".
  std::optional<std::string> chat_template;
  /// Every named template when the file gives a list (tool_use, rag, ...).
  std::map<std::string, std::string> chat_templates;
};

namespace detail {

/// A token field: null, a string, or an object with "content".
inline std::optional<std::string> read_token_field(const JsonField& root, const char* key) {
  if (!root.has(key) || root[key].is_null()) return std::nullopt;
  const JsonField f = root[key];
  if (f.value().is_string()) return f.string();
  if (f.value().is_object()) return f["content"].string();
  f.fail(
      remat::detail::cat("expected a token (a string or {\"content\": ...}), found ", f.shown()));
}

}  // namespace detail

/// Reads tokenizer_config.json at `file` (an IoError naming the file and field when it is
/// malformed).
inline TokenizerConfig read_tokenizer_config(const std::string& file) {
  const nlohmann::json json = read_json_file(file);
  const JsonField root(json, file + ":");
  if (!json.is_object()) root.fail("expected a JSON object");
  TokenizerConfig c;
  c.bos_token = detail::read_token_field(root, "bos_token");
  c.eos_token = detail::read_token_field(root, "eos_token");
  c.pad_token = detail::read_token_field(root, "pad_token");
  c.unk_token = detail::read_token_field(root, "unk_token");
  if (root.has("add_bos_token") && !root["add_bos_token"].is_null())
    c.add_bos_token = root["add_bos_token"].boolean();
  if (root.has("add_eos_token") && !root["add_eos_token"].is_null())
    c.add_eos_token = root["add_eos_token"].boolean();
  if (root.has("model_max_length") && !root["model_max_length"].is_null()) {
    // transformers writes 1e30 ("no limit") as a huge integer or a float
    const auto& v = root["model_max_length"].value();
    if (v.is_number_integer())
      c.model_max_length = v.get<std::int64_t>();
    else if (!v.is_number())
      root["model_max_length"].fail("expected a number");
  }
  if (root.has("chat_template") && !root["chat_template"].is_null()) {
    const JsonField t = root["chat_template"];
    if (t.value().is_string()) {
      c.chat_template = t.string();
    } else {
      for (std::size_t i = 0; i < t.size(); ++i) {
        const JsonField named = t.at(i);
        c.chat_templates[named["name"].string()] = named["template"].string();
      }
      if (const auto it = c.chat_templates.find("default"); it != c.chat_templates.end())
        c.chat_template = it->second;
    }
  }
  return c;
}

}  // namespace remat::hub
