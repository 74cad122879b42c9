#pragma once
/// @file
/// A Hugging Face tokenizer read from `tokenizer.json`, giving the ids that Hugging Face's
/// `tokenizers` library gives (checked id for id against it by the tests on the real Llama 2,
/// Llama 3.1, Qwen3 and GPT-4o files). `encode(text)` is `Tokenizer.encode(text).ids` with its
/// defaults: added tokens matched first, then normalizer, pre-tokenizer, BPE and the
/// post-processor's special tokens. `decode(ids)` is `Tokenizer.decode(ids)` with Python's
/// default `skip_special_tokens=True`.
///
///     auto tok = remat::hub::Tokenizer::from_folder("Qwen3-0.6B");   // or from_file(json)
///     std::vector<std::int32_t> ids = tok.encode("Hello world");
///     std::string text = tok.decode(ids);
///     tok.config().chat_template;                                     // tokenizer_config.json
///
/// Supported: the BPE model (byte-level or SentencePiece-style with byte fallback) and the
/// components listed in normalizers.hpp, pre_tokenizers.hpp, post_processors.hpp and
/// decoders.hpp. Anything else in the file (a WordPiece or Unigram model, an unknown
/// component, a field remat does not read, truncation or padding) is an IoError naming the
/// file, the field and the value. Needs PCRE2 and ICU: link the CMake target remat::hub.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/hub/added_tokens.hpp"
#include "remat/hub/bpe.hpp"
#include "remat/hub/decoders.hpp"
#include "remat/hub/json_file.hpp"
#include "remat/hub/normalizers.hpp"
#include "remat/hub/piece.hpp"
#include "remat/hub/post_processors.hpp"
#include "remat/hub/pre_tokenizers.hpp"
#include "remat/hub/tokenizer_config.hpp"
#include "remat/hub/utf8.hpp"
#include "remat/io/json.hpp"

namespace remat::hub {

/// A tokenizer: text to ids and back.
class Tokenizer {
 public:
  /// Reads `tokenizer.json` at `file`.
  static Tokenizer from_file(const std::string& file) {
    const nlohmann::json json = read_json_file(file);
    return Tokenizer(JsonField(json, file + ":"));
  }

  /// Reads `DIR/tokenizer.json` and, when present, `DIR/tokenizer_config.json` and
  /// `DIR/chat_template.jinja`. The last is where transformers (4.47 on) saves the chat
  /// template, and it reads that file in preference to the config's chat_template: so does this.
  /// The special tokens of tokenizer_config.json that are vocabulary tokens but not added
  /// tokens become added tokens, as transformers makes them (adopt_tokens). What else would
  /// make transformers change the tokenizer tokenizer.json describes is refused (an IoError
  /// naming the file and the field): such a token outside the vocabulary, another id or other
  /// flags for an added token, an add_prefix_space other than its ByteLevel pre-tokenizer's, a
  /// `DIR/special_tokens_map.json` that disagrees with a tokenizer_config.json without
  /// added_tokens_decoder.
  static Tokenizer from_folder(const std::string& dir) {
    const std::filesystem::path folder(dir);
    Tokenizer t = from_file((folder / "tokenizer.json").string());
    const std::string config = (folder / "tokenizer_config.json").string();
    if (std::filesystem::exists(config)) t.config_ = read_tokenizer_config(config);
    // transformers 4 reads special_tokens_map.json only for a config without
    // added_tokens_decoder (Llama 2 chat's map gives a pad token its config does not, unread)
    const std::string special_map = (folder / "special_tokens_map.json").string();
    if (std::filesystem::exists(special_map) && !t.config_.has_added_tokens_decoder)
      check_special_tokens_map(special_map, t.config_, config);
    const auto jinja = folder / "chat_template.jinja";
    if (std::filesystem::exists(jinja))
      t.config_.chat_template = io::read_text_file(jinja.string(), "hub::Tokenizer::from_folder");
    t.apply_config(config);
    return t;
  }

  /// Parses a tokenizer.json document already in memory (`source` names it in errors).
  static Tokenizer from_json(const nlohmann::json& json, const std::string& source) {
    return Tokenizer(JsonField(json, source + ":"));
  }

  /// The ids of `text` (valid UTF-8, else an ArgumentError naming the offset of the first bad
  /// byte), with the post-processor's special tokens when `add_special_tokens`.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const {
    if (const auto bad = utf8::first_invalid(text))
      throw ArgumentError(remat::detail::cat(
          "hub::Tokenizer::encode: the text is not valid UTF-8 (byte 0x", std::hex,
          static_cast<int>(static_cast<unsigned char>(text[*bad])), std::dec, " at offset ", *bad,
          "); decode it first, e.g. with hub::utf8::lossy"));
    std::vector<Piece> pieces;
    // the empty text is no piece at all: Hugging Face's added-token pass drops it before the
    // normalizer, which could otherwise make something of it (a Replace matching "")
    if (!text.empty()) pieces.push_back(Piece{std::string(text), -1, true});
    added_.split_raw(pieces);
    for (Piece& piece : pieces)
      if (piece.open() && normalizer_) normalizer_->normalize(piece.text);
    // Hugging Face drops every empty piece (the added-token pass splits even without added
    // tokens): a piece the normalizer emptied never reaches a pre-tokenizer that would give it
    // a prefix space or "▁"
    std::erase_if(pieces, [](const Piece& p) { return p.open() && p.text.empty(); });
    added_.split_normalized(pieces);
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
    std::vector<std::int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    for (const Piece& piece : pieces) {
      if (piece.open())
        model_->tokenize(piece.text, ids);
      else
        ids.push_back(static_cast<std::int32_t>(piece.token));
    }
    if (add_special_tokens && post_processor_) post_processor_->process(ids);
    return ids;
  }

  /// The ids transformers' tokenizer gives for `text` (`tokenizer(text)`, TRL's tokenization of
  /// text data, a prompt given to generate()): the post-processor's special tokens, unless
  /// tokenizer_config.json sets add_bos_token or add_eos_token, from which transformers rebuilds
  /// the post-processor (LlamaTokenizerFast in v4, which defaults them to true and false when
  /// absent; every fast tokenizer in v5): then bos first and eos last as those say.
  /// A text holding CodeLlama's fill token (TokenizerConfig::fill_token) is an ArgumentError:
  /// transformers splits it into an infilling prompt.
  std::vector<std::int32_t> encode_for_model(std::string_view text) const {
    if (config_.fill_token && !config_.fill_token->empty() &&
        text.find(*config_.fill_token) != std::string_view::npos)
      throw ArgumentError(remat::detail::cat(
          "hub::Tokenizer::encode_for_model: the text holds the fill token '", *config_.fill_token,
          "' of ", config_.tokenizer_class.value_or(""),
          ": transformers encodes it as an infilling prompt (the text before it, then after "
          "it), which remat does not; remove it, or set fill_token to null"));
    if (!config_.add_bos_token && !config_.add_eos_token) return encode(text, true);
    std::vector<std::int32_t> ids;
    if (config_.add_bos_token.value_or(false))
      if (const auto bos = bos_id()) ids.push_back(*bos);
    const std::vector<std::int32_t> body = encode(text, false);
    ids.insert(ids.end(), body.begin(), body.end());
    if (config_.add_eos_token.value_or(false))
      if (const auto eos = eos_id()) ids.push_back(*eos);
    return ids;
  }

  /// The text of `ids`; special tokens are left out when `skip_special_tokens`. An id that is
  /// neither in the vocabulary nor an added token is an IndexError naming it.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = true) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::string* token = added_.decode_form(ids[i]);
      if (token == nullptr) token = model_->id_to_token(ids[i]);
      if (token == nullptr)
        throw IndexError(remat::detail::cat("hub::Tokenizer::decode: id ", ids[i], " at position ",
                                            i, " is not a token (vocabulary of ", id_limit(),
                                            " ids)"));
      if (skip_special_tokens && added_.is_special(*token)) continue;
      tokens.push_back(*token);
    }
    if (!decoder_) {
      std::string out;
      for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    decoder_->decode_chain(tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }

  /// The id of a token (added tokens first, then the vocabulary), if it has one.
  std::optional<std::int32_t> token_to_id(std::string_view token) const {
    if (const std::int64_t id = added_.id_of(token); id >= 0) return static_cast<std::int32_t>(id);
    if (const std::int64_t id = model_->token_to_id(token); id >= 0)
      return static_cast<std::int32_t>(id);
    return std::nullopt;
  }
  /// The token of an id, if it is one.
  std::optional<std::string> id_to_token(std::int32_t id) const {
    if (const AddedToken* t = added_.find(id)) return t->content;
    if (const std::string* t = model_->id_to_token(id)) return *t;
    return std::nullopt;
  }
  /// Number of ids: the vocabulary with the added tokens (Hugging Face's get_vocab_size(true)).
  std::size_t vocab_size() const {
    std::size_t n = model_->vocab_size();
    for (const auto& [id, t] : added_.tokens())
      if (!model_->id_to_token(id)) ++n;
    return n;
  }
  /// One past the largest id.
  std::size_t id_limit() const {
    std::size_t n = model_->id_limit();
    for (const auto& [id, t] : added_.tokens()) n = std::max(n, static_cast<std::size_t>(id) + 1);
    return n;
  }
  /// The added tokens (special tokens among them).
  const AddedVocabulary& added_tokens() const { return added_; }
  /// tokenizer_config.json's fields (empty when read with from_file).
  const TokenizerConfig& config() const { return config_; }

  /// The id of the config's bos/eos/pad token, if the config names one.
  std::optional<std::int32_t> bos_id() const { return config_id(config_.bos_token); }
  std::optional<std::int32_t> eos_id() const { return config_id(config_.eos_token); }
  std::optional<std::int32_t> pad_id() const { return config_id(config_.pad_token); }

 private:
  explicit Tokenizer(const JsonField& root) {
    root.require_keys({"version", "truncation", "padding", "added_tokens", "normalizer",
                       "pre_tokenizer", "post_processor", "decoder", "model"});
    if (root.has("version") && root["version"].string() != "1.0")
      root["version"].fail(remat::detail::cat("unknown tokenizer.json version ",
                                              root["version"].shown(), " (known: \"1.0\")"));
    for (const char* key : {"truncation", "padding"})
      if (root.has(key) && !root[key].is_null())
        root[key].fail(
            remat::detail::cat(key, " ", root[key].shown(), " is not supported (only null)"));
    model_ = std::make_unique<Bpe>(root["model"]);
    normalizer_ = root.has("normalizer") ? make_normalizer(root["normalizer"]) : nullptr;
    pre_tokenizer_ =
        root.has("pre_tokenizer") ? make_pre_tokenizer(root["pre_tokenizer"]) : nullptr;
    post_processor_ =
        root.has("post_processor") ? make_post_processor(root["post_processor"]) : nullptr;
    decoder_ = root.has("decoder") ? make_decoder(root["decoder"]) : nullptr;
    check_origin(root);
    if (root.has("added_tokens"))
      added_ = AddedVocabulary(root["added_tokens"], *model_, normalizer_.get());
  }

  /// Metaspace's "first" scheme prepends to a piece whose first character comes from the
  /// original text's offset 0. remat knows that only while the normalizer keeps the first
  /// character as it is (a piece starts there exactly when it starts at byte 0), so other
  /// normalizers are refused with it rather than give other ids than Hugging Face.
  void check_origin(const JsonField& root) const {
    if (!normalizer_ || !normalizer_->moves_origin() || !pre_tokenizer_ ||
        !pre_tokenizer_->uses_origin())
      return;
    root["pre_tokenizer"].fail(remat::detail::cat(
        "Metaspace with prepend_scheme \"first\" is not supported after normalizer ",
        root["normalizer"].shown(),
        ", which can delete or expand the text's first character (supported with no normalizer "
        "or Strip with strip_left false)"));
  }

  /// Takes in what tokenizer_config.json (at `file`) says beyond tokenizer.json: its special
  /// and declared tokens (adopt_tokens), and its add_prefix_space, which must be the
  /// pre-tokenizer's.
  void apply_config(const std::string& file) {
    adopt_tokens();
    check_prefix_space(file);
  }

  /// transformers adds to the tokenizer each token of added_tokens_decoder, then each special
  /// token (bos_token ... mask_token, additional_special_tokens, extra_special_tokens) that
  /// tokenizer.json's added tokens lack, and rewrites the flags of an added_tokens_decoder
  /// entry tokenizer.json has with other flags. So does this, for a token of the vocabulary:
  /// it keeps its id and is matched in the text from then on, special (skipped by decode) when
  /// named special or marked so. A token outside the vocabulary (transformers would give it a
  /// new id) and a rewrite of tokenizer.json's flags are refused.
  void adopt_tokens() {
    std::unordered_set<std::string> special;
    for (const DeclaredToken& d : config_.named_special_tokens) special.insert(d.content);
    for (const DeclaredToken& d : config_.declared_tokens)
      if (!d.id) special.insert(d.content);  // additional_ and extra_special_tokens
    std::unordered_map<std::string, TokenFlags> adopted;
    for (const DeclaredToken& d : config_.declared_tokens) adopt(d, special, adopted, true);
    for (const DeclaredToken& d : config_.named_special_tokens) adopt(d, special, adopted, false);
  }

  /// adopt_tokens for one token; `compare_flags`: the flags an added_tokens_decoder or list
  /// entry gives must be tokenizer.json's (transformers rewrites them; it leaves those of a
  /// named special token, bos_token ..., as they are).
  void adopt(const DeclaredToken& d, const std::unordered_set<std::string>& special,
             std::unordered_map<std::string, TokenFlags>& adopted, bool compare_flags) {
    TokenFlags flags = d.flags.value_or(TokenFlags{false, false, false, false, true});
    flags.special = flags.special || special.count(d.content) != 0;
    const std::int64_t added = added_.id_of(d.content);
    if (added >= 0 && !adopted.count(d.content)) {
      check_declared_id(d, added);
      if (compare_flags) check_declared_flags(d, flags_of(*added_.find(added)));
      return;
    }
    const std::int64_t id = added >= 0 ? added : model_->token_to_id(d.content);
    if (id < 0)
      throw IoError(remat::detail::cat(
          d.path, ": '", d.content,
          "' is not a token of tokenizer.json: transformers would add it with a new id, remat "
          "does not extend the vocabulary"));
    check_declared_id(d, id);
    if (const auto it = adopted.find(d.content); it != adopted.end()) {
      if (d.flags && flags != it->second)
        throw IoError(remat::detail::cat(d.path, ": '", d.content, "' is given ",
                                         shown_flags(flags), " here and ", shown_flags(it->second),
                                         " before: which transformers keeps is not defined"));
      return;
    }
    adopted.emplace(d.content, flags);
    added_.adopt(AddedToken{id, d.content, flags.single_word, flags.lstrip, flags.rstrip,
                            flags.normalized, flags.special},
                 normalizer_.get(), d.path);
  }

  static void check_declared_id(const DeclaredToken& d, std::int64_t id) {
    if (d.id && *d.id != id)
      throw IoError(remat::detail::cat(d.path, ": token '", d.content, "' has id ", id,
                                       " in tokenizer.json, not ", *d.id));
  }

  static void check_declared_flags(const DeclaredToken& d, const TokenFlags& in_json) {
    if (d.flags && *d.flags != in_json)
      throw IoError(remat::detail::cat(
          d.path, ": added token '", d.content, "' has ", shown_flags(*d.flags), " here but ",
          shown_flags(in_json),
          " in tokenizer.json: transformers would rewrite them, remat reads tokenizer.json's"));
  }

  static TokenFlags flags_of(const AddedToken& t) {
    return TokenFlags{t.single_word, t.lstrip, t.rstrip, t.normalized, t.special};
  }

  static std::string shown_flags(const TokenFlags& f) {
    const auto b = [](bool v) { return v ? "true" : "false"; };
    return remat::detail::cat("{single_word: ", b(f.single_word), ", lstrip: ", b(f.lstrip),
                              ", rstrip: ", b(f.rstrip), ", normalized: ", b(f.normalized),
                              ", special: ", b(f.special), "}");
  }

  /// transformers rebuilds the ByteLevel pre-tokenizer with tokenizer_config.json's
  /// add_prefix_space (GPT2TokenizerFast and others), or converts the tokenizer anew from the
  /// slow one (LlamaTokenizerFast): only a value tokenizer.json already has changes nothing.
  void check_prefix_space(const std::string& file) const {
    if (!config_.add_prefix_space) return;
    const bool wanted = *config_.add_prefix_space;
    std::vector<bool> in_json;
    if (pre_tokenizer_) pre_tokenizer_->byte_level_prefix_spaces(in_json);
    if (in_json.empty())
      throw IoError(remat::detail::cat(
          file, ": add_prefix_space: ", wanted ? "true" : "false",
          " is not supported with a tokenizer.json that has no ByteLevel pre-tokenizer: "
          "transformers would rebuild the tokenizer with it (supported: null, absent, or the "
          "ByteLevel pre-tokenizer's value)"));
    for (const bool value : in_json)
      if (value != wanted)
        throw IoError(remat::detail::cat(
            file, ": add_prefix_space: ", wanted ? "true" : "false",
            " differs from tokenizer.json's ByteLevel pre-tokenizer's add_prefix_space ",
            value ? "true" : "false",
            ": transformers would rebuild the pre-tokenizer with this one, remat reads "
            "tokenizer.json's"));
  }

  std::optional<std::int32_t> config_id(const std::optional<std::string>& token) const {
    return token ? token_to_id(*token) : std::nullopt;
  }

  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
  TokenizerConfig config_;
};

}  // namespace remat::hub
