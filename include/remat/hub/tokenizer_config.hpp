#pragma once
/// @file
/// What a Hugging Face folder's `tokenizer_config.json` says beyond tokenizer.json: the bos,
/// eos, pad and unk tokens, `add_bos_token`/`add_eos_token`, `model_max_length` and the chat
/// template (exposed as text: rendering it is the chat-template layer's job). A token may be
/// written as a string or as an AddedToken object ({"content": ..., ...}); a chat template as a
/// string or as a list of named templates ({"name": "default", "template": ...}).
///
/// Fields with which transformers changes the tokenizer.json it loads are read so that
/// Tokenizer::from_folder can do the same or refuse: the special tokens (bos_token ...
/// mask_token, `additional_special_tokens`, `extra_special_tokens`) and the tokens of
/// `added_tokens_decoder` (added when tokenizer.json's added tokens lack them, their flags
/// rewritten when they differ), `add_prefix_space` (the ByteLevel pre-tokenizer rebuilt with
/// it) and `split_special_tokens: true` (refused here).
/// `special_tokens_map.json`, from which transformers 4 takes the special tokens when
/// tokenizer_config.json has no added_tokens_decoder (files written before 4.34), must then
/// agree with tokenizer_config.json (check_special_tokens_map). `tokenizer_class` (or, when it
/// names none, the class transformers takes from config.json: detail::model_tokenizer_class)
/// brings that class's defaults (detail::kTokenizerClasses): special tokens, whether it rebuilds
/// the post-processor, add_prefix_space; a class remat does not know is refused. Other fields
/// (clean_up_tokenization_spaces, ...) concern Python classes and are not read.

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "remat/hub/json_file.hpp"

namespace remat::hub {

/// The flags of an added token, as Python's AddedToken defaults them.
struct TokenFlags {
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
  bool operator==(const TokenFlags&) const = default;
};

/// A token tokenizer_config.json declares in added_tokens_decoder, additional_special_tokens or
/// extra_special_tokens.
struct DeclaredToken {
  /// Where it is written ("FILE: added_tokens_decoder.151643"), for errors.
  std::string path;
  /// added_tokens_decoder's key.
  std::optional<std::int64_t> id;
  std::string content;
  /// The flags, when written as an object (a plain string gives none).
  std::optional<TokenFlags> flags;
  /// Whether the object gives normalized (else tokenizers fills it in when the token is added,
  /// as not special).
  bool normalized_given = false;
};

/// The fields of tokenizer_config.json that remat reads.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<std::string> sep_token, cls_token, mask_token;
  /// bos_token, eos_token, unk_token, sep_token, pad_token, cls_token and mask_token, those
  /// given, in this order (transformers' special tokens with the lists').
  std::vector<DeclaredToken> named_special_tokens;
  /// The contents of additional_special_tokens, in order.
  std::vector<std::string> additional_special_tokens;
  /// Every token of added_tokens_decoder, additional_special_tokens and extra_special_tokens.
  std::vector<DeclaredToken> declared_tokens;
  /// Whether the file has added_tokens_decoder: transformers 4 then leaves
  /// special_tokens_map.json unread (its loader's legacy branch is the one without it).
  bool has_added_tokens_decoder = false;
  /// add_prefix_space (none when null or absent), with which transformers rebuilds the
  /// ByteLevel pre-tokenizer.
  std::optional<bool> add_prefix_space;
  /// add_bos_token and add_eos_token as given (a null is false; none: absent), from which
  /// transformers rebuilds the post-processor with bos first and eos last
  /// (Tokenizer::encode_for_model says when).
  std::optional<bool> add_bos_token, add_eos_token;
  /// tokenizer_class is (Code)LlamaTokenizer(Fast), which in transformers 4 rebuilds the
  /// post-processor always, add_bos_token and add_eos_token defaulting to true and false.
  bool llama_class = false;
  /// tokenizer_class is GPT2Tokenizer(Fast), which in transformers 4 takes an absent
  /// add_prefix_space as false.
  bool prefix_space_false = false;
  /// tokenizer_class, when given; else the class transformers takes from the folder's
  /// config.json (detail::model_tokenizer_class), when read_tokenizer_config is told of one.
  std::optional<std::string> tokenizer_class;
  /// CodeLlama's fill token (read_infilling_tokens): transformers encodes a text holding it as
  /// an infilling prompt, which remat does not.
  std::optional<std::string> fill_token;
  std::optional<std::int64_t> model_max_length;
  /// The chat template: the only one, or the one named "default".
  std::optional<std::string> chat_template;
  /// Every named template when the file gives a list (tool_use, rag, ...).
  std::map<std::string, std::string> chat_templates;
};

namespace detail {

/// An AddedToken object: its content, and its flags with Python's AddedToken defaults for those
/// left out (special `special_by_default`, normalized when not special).
inline DeclaredToken read_declared_object(const JsonField& f, bool special_by_default) {
  f.require_keys({"__type", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
  if (f.has("__type") && f["__type"].string() != "AddedToken")
    f["__type"].fail(remat::detail::cat("expected \"AddedToken\", found ", f["__type"].shown()));
  // a flag given as null is refused, as AddedToken(lstrip=None) is
  const auto flag = [&](const char* key, bool fallback) {
    return f.has(key) ? f[key].boolean() : fallback;
  };
  TokenFlags flags;
  flags.special = flag("special", special_by_default);
  flags.single_word = flag("single_word", false);
  flags.lstrip = flag("lstrip", false);
  flags.rstrip = flag("rstrip", false);
  flags.normalized = flag("normalized", !flags.special);
  return DeclaredToken{f.path(), std::nullopt, f["content"].string(), flags, f.has("normalized")};
}

/// A special token (bos_token, ..., an entry of additional_special_tokens): a string (no flags)
/// or an AddedToken object (special when it does not say: transformers makes these special).
inline DeclaredToken read_listed_token(const JsonField& f) {
  if (f.value().is_string()) return DeclaredToken{f.path(), std::nullopt, f.string(), std::nullopt};
  if (f.value().is_object()) return read_declared_object(f, true);
  f.fail(
      remat::detail::cat("expected a token (a string or {\"content\": ...}), found ", f.shown()));
}

/// A named special token field (bos_token, ...): null or absent (none), or a listed token.
inline std::optional<DeclaredToken> read_token_field(const JsonField& root, const char* key) {
  if (!root.has(key) || root[key].is_null()) return std::nullopt;
  return read_listed_token(root[key]);
}

/// The content of read_token_field's token.
inline std::optional<std::string> read_token_content(const JsonField& root, const char* key) {
  const std::optional<DeclaredToken> token = read_token_field(root, key);
  return token ? std::optional(token->content) : std::nullopt;
}

/// added_tokens_decoder: {"ID": {"content": ..., flags}, ...}.
inline void read_added_tokens_decoder(const JsonField& decoder, TokenizerConfig& c) {
  if (!decoder.value().is_object()) decoder.fail("expected an object of id: token");
  for (const auto& item : decoder.value().items()) {
    const JsonField entry(item.value(), decoder.child(item.key()));
    const std::string& key = item.key();
    // an id in decimal; 18 digits at most, which std::stoll always reads
    const bool digits = !key.empty() && key.size() <= 18 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) entry.fail(remat::detail::cat("key '", key, "' is not an id"));
    DeclaredToken d = read_declared_object(entry, false);
    d.id = std::stoll(key);
    c.declared_tokens.push_back(std::move(d));
  }
}

/// additional_special_tokens (a list) and extra_special_tokens (a list, or transformers 4's
/// object of name: token).
inline void read_special_token_lists(const JsonField& root, TokenizerConfig& c) {
  if (root.has("additional_special_tokens") && !root["additional_special_tokens"].is_null()) {
    const JsonField list = root["additional_special_tokens"];
    for (std::size_t i = 0; i < list.size(); ++i) {
      c.declared_tokens.push_back(read_listed_token(list.at(i)));
      c.additional_special_tokens.push_back(c.declared_tokens.back().content);
    }
  }
  if (!root.has("extra_special_tokens") || root["extra_special_tokens"].is_null()) return;
  const JsonField extra = root["extra_special_tokens"];
  if (extra.value().is_object()) {
    for (const auto& item : extra.value().items())
      c.declared_tokens.push_back(
          read_listed_token(JsonField(item.value(), extra.child(item.key()))));
  } else if (extra.value().is_array()) {
    for (std::size_t i = 0; i < extra.size(); ++i)
      c.declared_tokens.push_back(read_listed_token(extra.at(i)));
  } else {
    extra.fail(remat::detail::cat("expected a list of tokens or an object of name: token, found ",
                                  extra.shown()));
  }
}

/// The named special-token fields of `c` (a TokenizerConfig, const or not) by key, in
/// transformers' order.
template <class Config>
auto named_token_fields(Config& c) {
  return std::array{std::pair{"bos_token", &c.bos_token},  std::pair{"eos_token", &c.eos_token},
                    std::pair{"unk_token", &c.unk_token},  std::pair{"sep_token", &c.sep_token},
                    std::pair{"pad_token", &c.pad_token},  std::pair{"cls_token", &c.cls_token},
                    std::pair{"mask_token", &c.mask_token}};
}

/// The fields with which transformers changes the tokenizer tokenizer.json describes (see the
/// file comment), and the special tokens special_tokens_map.json is compared with.
inline void read_tokenizer_changes(const JsonField& root, TokenizerConfig& c) {
  for (const auto& [key, field] : named_token_fields(c)) {
    if (std::optional<DeclaredToken> token = read_token_field(root, key)) {
      *field = token->content;
      c.named_special_tokens.push_back(std::move(*token));
    }
  }
  c.has_added_tokens_decoder = root.has("added_tokens_decoder");
  if (c.has_added_tokens_decoder) read_added_tokens_decoder(root["added_tokens_decoder"], c);
  read_special_token_lists(root, c);
  if (root.has("add_prefix_space") && !root["add_prefix_space"].is_null())
    c.add_prefix_space = root["add_prefix_space"].boolean();
  // transformers passes it to tokenizers' encode_special_tokens, which takes no null
  if (root.has("split_special_tokens") && root["split_special_tokens"].boolean())
    root["split_special_tokens"].fail(
        "true is not supported: transformers then encodes the special tokens' text as plain "
        "text, where remat matches it as the tokens (supported: false or absent)");
}

/// CodeLlamaTokenizerFast's infilling tokens: prefix_token, middle_token, suffix_token and
/// eot_token (defaults ▁<PRE>, ▁<MID>, ▁<SUF>, ▁<EOT>; null: none), which it makes additional
/// special tokens, and fill_token (default <FILL_ME>), at which it splits a text into the
/// prefix and suffix of an infilling prompt. `why` tells a default from the file's value.
inline void read_infilling_tokens(const JsonField& root, TokenizerConfig& c,
                                  const std::string& why) {
  const std::pair<const char*, const char*> tokens[] = {{"prefix_token", "\u2581<PRE>"},
                                                        {"middle_token", "\u2581<MID>"},
                                                        {"suffix_token", "\u2581<SUF>"},
                                                        {"eot_token", "\u2581<EOT>"}};
  for (const auto& [key, fallback] : tokens) {
    const std::optional<DeclaredToken> token =
        root.has(key) ? read_token_field(root, key)
                      : DeclaredToken{root.child(key) + why, std::nullopt, fallback, std::nullopt};
    if (!token) continue;
    c.declared_tokens.push_back(*token);
    c.additional_special_tokens.push_back(token->content);
  }
  c.fill_token = root.has("fill_token") ? read_token_content(root, "fill_token")
                                        : std::optional<std::string>("<FILL_ME>");
}

/// What a tokenizer class of transformers 4 does beyond tokenizer.json, for the keys
/// tokenizer_config.json lacks: its constructor's special tokens, whether it rebuilds the
/// post-processor always (Note [framing]; add_bos_token true, add_eos_token false), CodeLlama's
/// infilling tokens, and GPT-2's add_prefix_space false (its ByteLevel pre-tokenizer rebuilt
/// when tokenizer.json's says true). A "...Fast" class is also its slow twin (the name
/// without "Fast").
struct TokenizerClass {
  const char* name;
  const char *bos, *eos, *unk, *pad;  // nullptr: none
  bool rebuilds_framing = false, infilling = false, prefix_space_false = false;
};
inline constexpr TokenizerClass kTokenizerClasses[] = {
    {"PreTrainedTokenizerFast", nullptr, nullptr, nullptr, nullptr},
    {"TokenizersBackend", nullptr, nullptr, nullptr, nullptr},  // transformers 5's name for it
    {"LlamaTokenizerFast", "<s>", "</s>", "<unk>", nullptr, true},
    {"CodeLlamaTokenizerFast", "<s>", "</s>", "<unk>", nullptr, true, true},
    {"Qwen2TokenizerFast", nullptr, "<|endoftext|>", "<|endoftext|>", "<|endoftext|>"},
    {"GPT2TokenizerFast", "<|endoftext|>", "<|endoftext|>", "<|endoftext|>", nullptr, false, false,
     true},
};

/// The class named `name` (with or without "Fast"); `field` fails naming it when remat does
/// not know it (its rules may change what tokenizer.json does).
inline const TokenizerClass& tokenizer_class(const JsonField& field, const std::string& name) {
  for (const TokenizerClass& k : kTokenizerClasses) {
    const std::string_view fast = k.name;
    const bool slow_twin = fast.ends_with("Fast") && name == fast.substr(0, fast.size() - 4);
    if (name == fast || slow_twin) return k;
  }
  field.fail(remat::detail::cat(
      "'", name,
      "' is a class whose rules remat does not know (known: PreTrainedTokenizerFast, "
      "TokenizersBackend, LlamaTokenizer, CodeLlamaTokenizer, Qwen2Tokenizer, GPT2Tokenizer, "
      "with or without Fast)"));
}

/// `k`'s defaults for the keys the file (`root`) lacks.
inline void apply_class_defaults(const JsonField& root, const TokenizerClass& k,
                                 TokenizerConfig& c) {
  const std::string why = remat::detail::cat(" (absent: ", k.name, "'s default)");
  const std::tuple<const char*, std::optional<std::string>*, const char*> tokens[] = {
      {"bos_token", &c.bos_token, k.bos},
      {"eos_token", &c.eos_token, k.eos},
      {"unk_token", &c.unk_token, k.unk},
      {"pad_token", &c.pad_token, k.pad}};
  for (const auto& [key, field, fallback] : tokens) {
    if (root.has(key) || !fallback) continue;
    *field = fallback;
    c.named_special_tokens.push_back(
        DeclaredToken{root.child(key) + why, std::nullopt, fallback, std::nullopt});
  }
  c.llama_class = k.rebuilds_framing;
  c.prefix_space_false = k.prefix_space_false;
  if (k.infilling) read_infilling_tokens(root, c, why);
}

/// A token for a message: 'content', or "none".
inline std::string shown_token(const std::optional<std::string>& token) {
  return token ? "'" + *token + "'" : std::string("none");
}

/// The tokenizer class transformers takes for a folder whose tokenizer_config.json names none,
/// from the folder's config.json at `file`: its tokenizer_class, else its model_type's class
/// in transformers 4 (llama and mistral: LlamaTokenizerFast, with the framing Note [framing]
/// says; qwen2 and qwen3: Qwen2TokenizerFast; gpt2: GPT2TokenizerFast). transformers 5 maps
/// llama and mistral to its plain TokenizersBackend (or mistral-common's), whose framing Note
/// [framing] compares with 4's. A class or model_type remat does not know is an IoError. A
/// config.json without model_type gives none (transformers 4 would guess the type from the
/// folder's name, or refuse): tokenizer.json is read as it is.
inline const TokenizerClass* model_tokenizer_class(const std::string& file) {
  const nlohmann::json json = read_json_file(file);
  const JsonField root(json, file + ":");
  if (!json.is_object()) root.fail("expected a JSON object");
  if (root.has("tokenizer_class") && !root["tokenizer_class"].is_null())
    return &tokenizer_class(root["tokenizer_class"], root["tokenizer_class"].string());
  if (!root.has("model_type")) return nullptr;
  const std::string type = root["model_type"].string();
  static constexpr std::pair<const char*, const char*> kClasses[] = {
      {"llama", "LlamaTokenizerFast"},
      {"mistral", "LlamaTokenizerFast"},
      {"qwen2", "Qwen2TokenizerFast"},
      {"qwen3", "Qwen2TokenizerFast"},
      {"gpt2", "GPT2TokenizerFast"}};
  for (const auto& [model, tokenizer] : kClasses)
    if (type == model) return &tokenizer_class(root["model_type"], tokenizer);
  root["model_type"].fail(remat::detail::cat(
      "'", type,
      "': tokenizer_config.json names no tokenizer_class, so transformers takes this model "
      "type's, which remat does not know (known: llama, mistral, qwen2, qwen3, gpt2); name the "
      "class in tokenizer_config.json"));
}

/// tokenizer_config.json's fields from `json` (read from `source`); `model_config`: the
/// folder's config.json, from which transformers takes the tokenizer class when `json` names
/// none (empty: there is none).
inline TokenizerConfig parse_tokenizer_config(const nlohmann::json& json, const std::string& source,
                                              const std::string& model_config) {
  const JsonField root(json, source + ":");
  if (!json.is_object()) root.fail("expected a JSON object");
  TokenizerConfig c;
  read_tokenizer_changes(root, c);
  for (const auto& [key, field] :
       {std::pair{"add_bos_token", &c.add_bos_token}, std::pair{"add_eos_token", &c.add_eos_token}})
    if (root.has(key)) *field = !root[key].is_null() && root[key].boolean();
  const TokenizerClass* k = nullptr;
  if (root.has("tokenizer_class") && !root["tokenizer_class"].is_null()) {
    c.tokenizer_class = root["tokenizer_class"].string();
    k = &tokenizer_class(root["tokenizer_class"], *c.tokenizer_class);
  } else if (!model_config.empty()) {
    k = model_tokenizer_class(model_config);
    if (k) c.tokenizer_class = k->name;
  }
  if (k) apply_class_defaults(root, *k, c);
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

}  // namespace detail

/// Reads tokenizer_config.json at `file` (an IoError naming the file and field when it is
/// malformed). `model_config`: the folder's config.json, from which transformers takes the
/// tokenizer class when the file names none (detail::model_tokenizer_class); empty: there is
/// none.
inline TokenizerConfig read_tokenizer_config(const std::string& file,
                                             const std::string& model_config = "") {
  return detail::parse_tokenizer_config(read_json_file(file), file, model_config);
}

/// Reads special_tokens_map.json at `file` and throws an IoError naming both files unless it
/// agrees with `config` (read from `config_file`, empty when there is none): transformers 4
/// takes the special tokens from it over tokenizer_config.json's (when that has no
/// added_tokens_decoder), and adds its additional_special_tokens to the config's, where remat
/// reads tokenizer_config.json only. A token it leaves out is tokenizer_config.json's.
inline void check_special_tokens_map(const std::string& file, const TokenizerConfig& config,
                                     const std::string& config_file) {
  const nlohmann::json json = read_json_file(file);
  const JsonField root(json, file + ":");
  if (!json.is_object()) root.fail("expected a JSON object");
  root.require_keys({"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                     "mask_token", "additional_special_tokens"});
  for (const auto& [key, configured] : detail::named_token_fields(config)) {
    if (!root.has(key)) continue;
    const std::optional<std::string> mapped = detail::read_token_content(root, key);
    if (mapped != *configured)
      root[key].fail(remat::detail::cat(
          detail::shown_token(mapped), " differs from ", config_file, "'s ", key, " (",
          detail::shown_token(*configured),
          "): transformers 4 would take this one, remat reads tokenizer_config.json's"));
  }
  if (!root.has("additional_special_tokens")) return;
  const JsonField list = root["additional_special_tokens"];
  const std::vector<std::string>& configured = config.additional_special_tokens;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string token = detail::read_listed_token(list.at(i)).content;
    if (std::find(configured.begin(), configured.end(), token) == configured.end())
      list.at(i).fail(remat::detail::cat(
          "'", token, "' is not in ", config_file,
          "'s additional_special_tokens: transformers 4 would add it, remat reads "
          "tokenizer_config.json's"));
  }
}

}  // namespace remat::hub
