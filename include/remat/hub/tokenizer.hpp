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

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
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
  /// When tokenizer_config.json names no tokenizer_class (or is absent), the class is the one
  /// transformers takes from `DIR/config.json` (detail::model_tokenizer_class).
  /// tokenizer_config.json's special tokens are taken in as transformers takes them (Note
  /// [special tokens in tokenizer_config.json]), and its add_bos_token and add_eos_token frame
  /// a text for encode_for_model (Note [framing]). What else would make transformers change the
  /// tokenizer tokenizer.json describes, or what its versions 4 and 5 do differently, is refused
  /// (an IoError naming the file and the field): other flags for an added token, an
  /// add_prefix_space other than its ByteLevel pre-tokenizer's, a
  /// `DIR/special_tokens_map.json` that disagrees with a tokenizer_config.json without
  /// added_tokens_decoder.
  static Tokenizer from_folder(const std::string& dir) {
    const std::filesystem::path folder(dir);
    Tokenizer t = from_file((folder / "tokenizer.json").string());
    std::string config = (folder / "tokenizer_config.json").string();
    // transformers takes the tokenizer class from config.json when tokenizer_config.json names
    // none, or when there is no tokenizer_config.json (a LlamaTokenizerFast then frames texts
    // with its defaults)
    const std::string model = (folder / "config.json").string();
    const std::string model_config = std::filesystem::exists(model) ? model : "";
    if (std::filesystem::exists(config)) {
      t.config_ = read_tokenizer_config(config, model_config);
    } else if (!model_config.empty()) {
      config += " (absent; the class from config.json)";
      t.config_ = detail::parse_tokenizer_config(nlohmann::json::object(), config, model_config);
    } else {
      config += " (absent)";
    }
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
    for (const auto& [token, where] : phantoms_)
      if (text.find(token) != std::string_view::npos)
        throw ArgumentError(remat::detail::cat(
            "hub::Tokenizer::encode: the text holds '", token, "' (", where,
            "), a special token that tokenizer.json's vocabulary lacks: transformers would add "
            "it with a new id, past the model's embeddings"));
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
  /// text data, a prompt given to generate()): the post-processor's special tokens, or bos first
  /// and eos last as tokenizer_config.json's add_bos_token and add_eos_token rebuild it (Note
  /// [framing]). A text holding CodeLlama's fill token (TokenizerConfig::fill_token) is an
  /// ArgumentError: transformers splits it into an infilling prompt.
  std::vector<std::int32_t> encode_for_model(std::string_view text) const {
    if (config_.fill_token && !config_.fill_token->empty() &&
        text.find(*config_.fill_token) != std::string_view::npos)
      throw ArgumentError(remat::detail::cat(
          "hub::Tokenizer::encode_for_model: the text holds the fill token '", *config_.fill_token,
          "' of ", config_.tokenizer_class.value_or(""),
          ": transformers encodes it as an infilling prompt (the text before it, then after "
          "it), which remat does not; remove it, or set fill_token to null"));
    if (!framing_.rebuilt) return encode(text, true);
    std::vector<std::int32_t> ids;
    if (framing_.bos) ids.push_back(*bos_id());
    const std::vector<std::int32_t> body = encode(text, false);
    ids.insert(ids.end(), body.begin(), body.end());
    if (framing_.eos) ids.push_back(*eos_id());
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
  /// and declared tokens (adopt_tokens), how a text is framed (settle_framing), and its
  /// add_prefix_space, which must be the pre-tokenizer's.
  void apply_config(const std::string& file) {
    adopt_tokens();
    settle_framing(file);
    check_prefix_space(file);
  }

  /// What adopt_tokens knows of the whole file.
  struct Declared {
    std::unordered_set<std::string> special;  // named and listed special tokens
    std::unordered_map<std::string, const DeclaredToken*> decoder;  // added_tokens_decoder's
    std::unordered_map<std::string, TokenFlags> adopted;            // the tokens added here
  };

  /// Note [special tokens in tokenizer_config.json]: transformers adds to the tokenizer each
  /// token of added_tokens_decoder, then each special token (bos_token ... mask_token,
  /// additional_special_tokens, extra_special_tokens), with the flags the file gives (a named
  /// or listed token that added_tokens_decoder also has takes the decoder's), special when named
  /// so, and `normalized` filled in last as not special. So does this:
  /// - a token tokenizer.json's added tokens lack but its vocabulary has keeps its id and is
  ///   matched in the text from then on (a string gets tokenizers' add_special_tokens flags:
  ///   special, nothing else);
  /// - one tokenizer.json has gets the `special` transformers gives it; other flags that differ
  ///   are refused (transformers would rewrite them), and so are a named string whose flags
  ///   transformers 5 rewrites to false and a listed string that is not special (4 keeps it so,
  ///   5 makes it special);
  /// - one outside the vocabulary (transformers would give it a new id, past the model's
  ///   embeddings) is recorded: a text holding it is refused (encode), and so is a framing that
  ///   needs it (settle_framing).
  void adopt_tokens() {
    Declared declared;
    for (const DeclaredToken& d : config_.named_special_tokens) declared.special.insert(d.content);
    for (const DeclaredToken& d : config_.declared_tokens) {
      if (d.id)
        declared.decoder.emplace(d.content, &d);
      else
        declared.special.insert(d.content);  // additional_ and extra_special_tokens
    }
    for (const DeclaredToken& d : config_.declared_tokens) adopt(d, declared, false);
    for (const DeclaredToken& d : config_.named_special_tokens) adopt(d, declared, true);
  }

  /// The flags transformers adds token `d` with, or none for a string it leaves as it is
  /// (Note [special tokens in tokenizer_config.json]).
  static std::optional<TokenFlags> wanted_flags(const DeclaredToken& d, const Declared& declared) {
    const DeclaredToken* source = &d;
    if (const auto it = declared.decoder.find(d.content); !d.id && it != declared.decoder.end())
      source = it->second;
    if (!source->flags) return std::nullopt;
    TokenFlags f = *source->flags;
    f.special = f.special || declared.special.count(d.content) != 0;
    if (!source->normalized_given) f.normalized = !f.special;
    return f;
  }

  /// adopt_tokens for token `d`; `named`: a bos_token ... mask_token field.
  void adopt(const DeclaredToken& d, Declared& declared, bool named) {
    if (d.content.empty()) return;  // tokenizers ignores an empty token
    const std::optional<TokenFlags> wanted = wanted_flags(d, declared);
    const std::int64_t added = added_.id_of(d.content);
    if (added >= 0 && !declared.adopted.count(d.content)) {
      check_declared_id(d, added);
      take_special(d, wanted, *added_.find(added), declared, named);
      return;
    }
    const std::int64_t id = added >= 0 ? added : model_->token_to_id(d.content);
    if (id < 0) {
      phantoms_.emplace_back(d.content, d.path);
      return;
    }
    check_declared_id(d, id);
    const TokenFlags flags = wanted.value_or(TokenFlags{false, false, false, false, true});
    if (const auto it = declared.adopted.find(d.content); it != declared.adopted.end()) {
      if (wanted && flags != it->second)
        throw IoError(remat::detail::cat(d.path, ": '", d.content, "' is given ",
                                         shown_flags(flags), " here and ", shown_flags(it->second),
                                         " before: which transformers keeps is not defined"));
      return;
    }
    declared.adopted.emplace(d.content, flags);
    added_.adopt(AddedToken{id, d.content, flags.single_word, flags.lstrip, flags.rstrip,
                            flags.normalized, flags.special},
                 normalizer_.get(), d.path);
  }

  /// A token of tokenizer.json's added tokens that the config names (Note [special tokens in
  /// tokenizer_config.json]): its `special` becomes transformers', other flags must stay.
  void take_special(const DeclaredToken& d, const std::optional<TokenFlags>& wanted,
                    const AddedToken& t, const Declared& declared, bool named) {
    const TokenFlags in_json = flags_of(t);
    if (wanted) {
      TokenFlags same = *wanted;
      same.special = in_json.special;
      if (same != in_json)
        throw IoError(remat::detail::cat(
            d.path, ": added token '", d.content, "' has ", shown_flags(*wanted), " here but ",
            shown_flags(in_json),
            " in tokenizer.json: transformers would rewrite them, remat reads tokenizer.json's"));
      added_.set_special(t.id, wanted->special);
      return;
    }
    if (!named && !in_json.special)
      throw IoError(remat::detail::cat(
          d.path, ": '", d.content,
          "' is an added token that tokenizer.json does not mark special: transformers 4 keeps "
          "it so, 5 makes it special (give it as an object with \"special\", or mark it in "
          "tokenizer.json)"));
    if (named && (in_json.single_word || in_json.lstrip || in_json.rstrip || in_json.normalized) &&
        !declared.decoder.count(d.content))
      throw IoError(remat::detail::cat(
          d.path, ": added token '", d.content, "' has ", shown_flags(in_json),
          " in tokenizer.json, which transformers 5 rewrites to false and 4 keeps (list it in "
          "added_tokens_decoder with its flags)"));
    added_.set_special(t.id, true);
  }

  static void check_declared_id(const DeclaredToken& d, std::int64_t id) {
    if (d.id && *d.id != id)
      throw IoError(remat::detail::cat(d.path, ": token '", d.content, "' has id ", id,
                                       " in tokenizer.json, not ", *d.id));
  }

  static TokenFlags flags_of(const AddedToken& t) {
    return TokenFlags{t.single_word, t.lstrip, t.rstrip, t.normalized, t.special};
  }

  /// The special tokens a text gets around it: the post-processor's (not rebuilt), or bos
  /// first and eos last as transformers rebuilds it.
  struct Framing {
    bool rebuilt = false, bos = false, eos = false;
  };

  /// Note [framing]: transformers 5 rebuilds the post-processor (bos first, eos last) when
  /// tokenizer_config.json has add_bos_token or add_eos_token (null: false), dropping a flag
  /// whose token is null; transformers 4 does so only for (Code)LlamaTokenizer(Fast), always,
  /// with the defaults true and false, and refuses a flag whose token is null. remat follows 5
  /// for the other classes (4 keeps tokenizer.json's post-processor there whatever they say),
  /// and for the Llama classes takes 4's framing where 5's gives the same ids, refusing the
  /// folder where they differ or where 4 refuses. A framing that needs a token the vocabulary
  /// lacks (transformers would give it a new id) is refused.
  void settle_framing(const std::string& file) {
    const TokenizerConfig& c = config_;
    const bool given = c.add_bos_token || c.add_eos_token;
    const Framing v5{given, c.add_bos_token.value_or(false) && c.bos_token.has_value(),
                     c.add_eos_token.value_or(false) && c.eos_token.has_value()};
    if (!c.llama_class) {
      framing_ = usable(v5, file, "5");
      return;
    }
    const Framing v4{true, c.add_bos_token.value_or(true), c.add_eos_token.value_or(false)};
    for (const auto& [wanted, token, key] :
         {std::tuple{v4.bos, c.bos_token, "bos"}, std::tuple{v4.eos, c.eos_token, "eos"}})
      if (wanted && !token)
        throw IoError(remat::detail::cat(
            file, ": add_", key, "_token is true (or absent: ", c.tokenizer_class.value_or(""),
            "'s default) but ", key, "_token is null: transformers 4 refuses this, 5 adds no ", key,
            "; set add_", key, "_token to false"));
    const Framing v4_ids = usable(v4, file, "4");
    if (shown(v4_ids) != shown(usable(v5, file, "5")))
      throw IoError(
          remat::detail::cat(file, ": transformers 4 (", c.tokenizer_class.value_or(""),
                             ") and 5 frame a text with other special tokens here: 4 gives ",
                             shown(v4_ids), ", 5 gives ", shown(v5),
                             "; set add_bos_token and add_eos_token, which both then follow"));
    framing_ = v4_ids;
  }

  /// `f`, refused when it needs a token the vocabulary lacks (`version` says whose it is).
  Framing usable(const Framing& f, const std::string& file, const char* version) const {
    for (const auto& [wanted, token] :
         {std::pair{f.bos, &config_.bos_token}, std::pair{f.eos, &config_.eos_token}})
      if (wanted && !token_to_id(**token))
        throw IoError(remat::detail::cat(
            file, ": transformers ", version, " frames a text with '", **token,
            "', which is not a token of tokenizer.json: it would add it with a new id, past the "
            "model's embeddings"));
    return f;
  }

  /// The ids `f` puts around a text: "[1] text [2]".
  std::string shown(const Framing& f) const {
    std::vector<std::int32_t> ids{-1};  // the text
    if (!f.rebuilt) {
      if (post_processor_) post_processor_->process(ids);
    } else {
      if (f.bos) ids.insert(ids.begin(), *bos_id());
      if (f.eos) ids.push_back(*eos_id());
    }
    std::string out;
    for (const std::int32_t id : ids) {
      if (!out.empty()) out += ' ';  // not "" + std::string: GCC 12's -O3 warning
      out += id == -1 ? std::string("text") : remat::detail::cat("[", id, "]");
    }
    return out;
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
    std::vector<bool> in_json;
    if (pre_tokenizer_) pre_tokenizer_->byte_level_prefix_spaces(in_json);
    if (!config_.add_prefix_space) {
      // GPT2TokenizerFast takes it as false, and rebuilds a top-level ByteLevel that says true
      // (one inside a Sequence it leaves: refused too, the simpler rule, which the key lifts)
      if (config_.prefix_space_false &&
          std::find(in_json.begin(), in_json.end(), true) != in_json.end())
        throw IoError(remat::detail::cat(
            file, ": add_prefix_space is absent, which ", config_.tokenizer_class.value_or(""),
            " takes as false, but tokenizer.json's ByteLevel pre-tokenizer has true: "
            "transformers 4 would rebuild it with false, remat reads tokenizer.json's; set "
            "add_prefix_space to true"));
      return;
    }
    const bool wanted = *config_.add_prefix_space;
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
  Framing framing_;  // encode_for_model's (Note [framing])
  /// Special tokens tokenizer_config.json names that the vocabulary lacks, and where it names
  /// them (Note [special tokens in tokenizer_config.json]).
  std::vector<std::pair<std::string, std::string>> phantoms_;
};

}  // namespace remat::hub
