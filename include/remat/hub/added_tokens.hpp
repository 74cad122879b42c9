#pragma once
/// @file
/// Added tokens (tokenizer.json's `added_tokens`: special tokens such as `<|im_start|>` and
/// user-added words), found in the text before any BPE, as Hugging Face's AddedVocabulary does:
/// tokens with `normalized: false` are matched in the raw text first, then each remaining piece
/// is normalized and tokens with `normalized: true` are matched (by their normalized form) in
/// it. Matching is leftmost-longest; `single_word` drops a match touching a word character,
/// `lstrip`/`rstrip` extend a match over the whitespace beside it (lstrip not over whitespace
/// the previous match took). An added token's id is the model's id for its content when the
/// vocabulary has it, else the next free id in file order; a file whose `id` disagrees is
/// refused, and so is one with two `normalized` tokens of the same normalized form (Hugging
/// Face would match either). Tokenizer::from_folder adds (adopt()) the vocabulary tokens that
/// tokenizer_config.json names special and tokenizer.json does not list, as transformers does.

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/hub/bpe.hpp"
#include "remat/hub/json_file.hpp"
#include "remat/hub/normalizers.hpp"
#include "remat/hub/piece.hpp"
#include "remat/hub/regex.hpp"
#include "remat/hub/utf8.hpp"

namespace remat::hub {

/// One entry of `added_tokens`.
struct AddedToken {
  std::int64_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

namespace detail {

/// A byte trie over a set of strings, for leftmost-longest matching.
class TokenTrie {
 public:
  void insert(std::string_view key, std::int64_t id) {
    std::size_t node = 0;
    for (const char c : key) {
      const auto b = static_cast<unsigned char>(c);
      auto& edges = nodes_[node].edges;
      auto it = edges.find(b);
      if (it == edges.end()) {
        nodes_.push_back(Node{});
        it = nodes_[node].edges.emplace(b, nodes_.size() - 1).first;
      }
      node = it->second;
    }
    nodes_[node].id = id;
    starts_[static_cast<unsigned char>(key.front())] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  /// Whether some key starts with byte `b` (a quick filter before walking the trie).
  bool may_start(unsigned char b) const { return starts_[b]; }
  /// The longest key starting at `at`: (id, length), or id -1.
  std::pair<std::int64_t, std::size_t> longest(std::string_view text, std::size_t at) const {
    std::pair<std::int64_t, std::size_t> best{-1, 0};
    std::size_t node = 0;
    for (std::size_t i = at; i < text.size(); ++i) {
      const auto& edges = nodes_[node].edges;
      const auto it = edges.find(static_cast<unsigned char>(text[i]));
      if (it == edges.end()) break;
      node = it->second;
      if (nodes_[node].id >= 0) best = {nodes_[node].id, i + 1 - at};
    }
    return best;
  }

 private:
  struct Node {
    std::unordered_map<unsigned char, std::size_t> edges;
    std::int64_t id = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> starts_{};
};

}  // namespace detail

/// The added tokens of a tokenizer and their matching.
class AddedVocabulary {
 public:
  AddedVocabulary() = default;

  /// Reads `added_tokens`, giving ids as Hugging Face does (see the file comment);
  /// `normalizer` (may be null) gives the matching form of `normalized` tokens.
  AddedVocabulary(const JsonField& list, const Bpe& model, const Normalizer* normalizer)
      : word_(kWordPattern, false, list.path()) {
    std::int64_t next_id = static_cast<std::int64_t>(model.vocab_size());
    for (std::size_t i = 0; i < list.size(); ++i) {
      const JsonField j = list.at(i);
      j.require_keys({"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
      AddedToken t = read_token(j);
      const std::int64_t file_id = j["id"].integer();
      if (t.content.empty()) continue;  // Hugging Face ignores an empty token
      if (const auto it = by_content_.find(t.content); it != by_content_.end()) {
        t.id = it->second;
      } else if (const std::int64_t model_id = model.token_to_id(t.content); model_id >= 0) {
        t.id = model_id;
      } else {
        t.id = next_id++;
      }
      if (t.id != file_id)
        j["id"].fail(remat::detail::cat("added token '", t.content, "' has id ", file_id,
                                        " but Hugging Face's rules give it id ", t.id,
                                        " (the model's id for that content, or the next free id)"));
      insert(std::move(t), normalizer, j["content"].path());
    }
    build_tries();
  }

  /// Adds `t`, a token of the model's vocabulary (t.id its id there) that is not an added token
  /// yet, as transformers adds a special token tokenizer_config.json names: matched in the text
  /// from now on. `where` names it in errors ("FILE: bos_token").
  void adopt(AddedToken t, const Normalizer* normalizer, const std::string& where) {
    insert(std::move(t), normalizer, where);
    build_tries();
  }

  /// Marks added token `id` special or not, as transformers does when it adds a token again
  /// with another `special` (matching does not depend on it; decode's skipping does).
  void set_special(std::int64_t id, bool special) {
    AddedToken& t = tokens_.at(id);
    t.special = special;
    if (special)
      special_.insert(t.content);
    else
      special_.erase(t.content);
  }

  bool empty() const { return tokens_.empty(); }
  std::size_t size() const { return tokens_.size(); }
  /// The token with this id, or nullptr.
  const AddedToken* find(std::int64_t id) const {
    const auto it = tokens_.find(id);
    return it == tokens_.end() ? nullptr : &it->second;
  }
  /// The id of the added token with this content, or -1.
  std::int64_t id_of(std::string_view content) const {
    const auto it = by_content_.find(std::string(content));
    return it == by_content_.end() ? -1 : it->second;
  }
  /// The text decoding gives for added token `id` (its normalized form when normalization
  /// changed it), or nullptr if `id` is not an added token.
  const std::string* decode_form(std::int64_t id) const {
    if (const auto it = decode_form_.find(id); it != decode_form_.end()) return &it->second;
    const auto it = tokens_.find(id);
    return it == tokens_.end() ? nullptr : &it->second.content;
  }
  /// Whether `content` is the content of a special token.
  bool is_special(std::string_view content) const {
    return special_.count(std::string(content)) != 0;
  }
  /// All added tokens by id.
  const std::unordered_map<std::int64_t, AddedToken>& tokens() const { return tokens_; }

  /// Cuts the open pieces at matches of the tokens with `normalized: false` (raw text).
  void split_raw(std::vector<Piece>& pieces) const { split(pieces, raw_trie_, "the text"); }
  /// Cuts the open pieces at matches of the tokens with `normalized: true`.
  void split_normalized(std::vector<Piece>& pieces) const {
    split(pieces, normalized_trie_, "a normalized piece of the text");
  }

 private:
  /// An entry of `added_tokens` but its id. tokenizers' serde gives none of its fields a
  /// default: a flag that is missing or null is an error there, so it is here.
  static AddedToken read_token(const JsonField& j) {
    AddedToken t;
    t.content = j["content"].string();
    t.single_word = j["single_word"].boolean();
    t.lstrip = j["lstrip"].boolean();
    t.rstrip = j["rstrip"].boolean();
    t.normalized = j["normalized"].boolean();
    t.special = j["special"].boolean();
    return t;
  }

  /// Records token `t` (id set, content not empty), read at `path`. Hugging Face cannot load a
  /// token empty once normalized (it panics): no ids to match, so it is refused.
  void insert(AddedToken t, const Normalizer* normalizer, const std::string& path) {
    std::string form = t.content;
    if (t.normalized && normalizer != nullptr) normalizer->normalize(form);
    if (form.empty())
      fail_at(path, remat::detail::cat("added token '", t.content,
                                       "' is empty once normalized (normalized: true)"));
    if (t.normalized) claim_normalized_form(t, form, path);
    if (form != t.content) decode_form_[t.id] = form;
    by_content_[t.content] = t.id;
    if (t.special) special_.insert(t.content);
    tokens_[t.id] = std::move(t);
  }

  void build_tries() {
    raw_trie_ = {};
    normalized_trie_ = {};
    for (const auto& [id, t] : tokens_) {
      const auto form = decode_form_.find(id);
      if (t.normalized) {
        normalized_trie_.insert(form == decode_form_.end() ? t.content : form->second, id);
      } else {
        raw_trie_.insert(t.content, id);
      }
    }
  }

  /// Throws an IoError "PATH: what", as JsonField::fail does.
  [[noreturn]] static void fail_at(const std::string& path, std::string_view what) {
    throw IoError(remat::detail::cat(path, ": ", what));
  }

  /// Records `form` as the matching form of normalized token `t`, refusing a second token with
  /// the same form: tokenizers' trie then holds both and matches the one its hash order puts
  /// first, which changes from process to process.
  void claim_normalized_form(const AddedToken& t, const std::string& form,
                             const std::string& path) {
    const auto [it, fresh] = owner_of_form_.emplace(form, t.id);
    if (fresh || it->second == t.id) return;
    fail_at(path, remat::detail::cat(
                      "added tokens '", tokens_.at(it->second).content, "' (id ", it->second,
                      ") and '", t.content, "' (id ", t.id, ") both normalize to '", form,
                      "' (normalized: true): Hugging Face's tokenizers would match either one, a "
                      "different one from process to process"));
  }

  /// `where` names the pieces in errors ("the text").
  void split(std::vector<Piece>& pieces, const detail::TokenTrie& trie,
             std::string_view where) const {
    if (trie.empty()) return;
    std::vector<Piece> out;
    out.reserve(pieces.size());
    for (Piece& piece : pieces) {
      if (!piece.open()) {
        out.push_back(std::move(piece));
        continue;
      }
      split_piece(piece, trie, where, out);
    }
    pieces = std::move(out);
  }

  /// Hugging Face's find_matches on one piece: pieces of text between matches, and the
  /// matches (widened by lstrip/rstrip) as token pieces. The matches are found in the text as
  /// it is (leftmost-longest, not overlapping); widening happens afterwards, so a widened match
  /// may overlap the next one, which Hugging Face then emits in full all the same. lstrip never
  /// takes back what the previous match took: a whitespace token matched inside the whitespace
  /// an rstrip took starts where that ended, which leaves it empty (no token: Hugging Face
  /// drops empty splits) or, past its own end, is an error (Hugging Face panics).
  void split_piece(const Piece& piece, const detail::TokenTrie& trie, std::string_view where,
                   std::vector<Piece>& out) const {
    const std::string_view text = piece.text;
    std::size_t done = 0;        // end of the last piece emitted (Hugging Face's start_offset)
    std::int64_t previous = -1;  // the last token matched, for an error
    for (std::size_t at = 0; at < text.size();) {
      if (!trie.may_start(static_cast<unsigned char>(text[at]))) {
        ++at;
        continue;
      }
      const auto [id, length] = trie.longest(text, at);
      if (id < 0) {
        ++at;
        continue;
      }
      std::size_t begin = at, end = at + length;
      at = end;  // the next match starts after this one, whatever becomes of it
      const AddedToken& t = tokens_.at(id);
      if (t.single_word &&
          (ends_with_word(text.substr(0, begin)) || starts_with_word(text.substr(end))))
        continue;  // not a whole word
      const std::size_t matched = begin;
      if (t.lstrip) begin = std::max(done, begin - trailing_space(text.substr(0, begin)));
      if (t.rstrip) end += leading_space(text.substr(end));
      if (begin > end) refuse_inside_previous(id, previous, matched, at, done, where);
      if (done < begin)
        out.push_back(
            Piece{std::string(text.substr(done, begin - done)), -1, piece.at_origin && done == 0});
      if (begin < end)
        out.push_back(
            Piece{std::string(text.substr(begin, end - begin)), id, piece.at_origin && begin == 0});
      done = end;
      previous = id;
    }
    if (done < text.size())
      out.push_back(Piece{std::string(text.substr(done)), -1, piece.at_origin && done == 0});
  }

  /// Throws for lstrip token `id` matched at [begin, end) inside the whitespace that token
  /// `previous` took with rstrip, up to `taken`: tokenizers would start this token's span at
  /// `taken`, past its end, and panic ("AddedVocabulary bad split").
  [[noreturn]] void refuse_inside_previous(std::int64_t id, std::int64_t previous,
                                           std::size_t begin, std::size_t end, std::size_t taken,
                                           std::string_view where) const {
    const auto shown = [&](std::int64_t token) {
      return nlohmann::json(tokens_.at(token).content).dump();  // escapes whitespace
    };
    throw ArgumentError(remat::detail::cat(
        "hub::Tokenizer::encode: added token ", shown(id), " (id ", id,
        ", lstrip) matched at bytes ", begin, " to ", end, " of ", where,
        ", inside the whitespace that added token ", shown(previous), " (id ", previous,
        ") took with rstrip up to byte ", taken,
        ": Hugging Face's tokenizers fails on this text (it panics: \"AddedVocabulary bad "
        "split\")"));
  }

  bool ends_with_word(std::string_view s) const {
    if (s.empty()) return false;
    std::size_t last = s.size() - 1;
    while ((static_cast<unsigned char>(s[last]) & 0xC0) == 0x80) --last;
    return matches_whole(word_, s.substr(last));
  }
  bool starts_with_word(std::string_view s) const {
    if (s.empty()) return false;
    return matches_whole(word_, s.substr(0, utf8::char_length(s, 0)));
  }
  /// Bytes of White_Space characters at the end of `s`.
  std::size_t trailing_space(std::string_view s) const {
    std::size_t end = s.size();
    while (end > 0) {
      std::size_t last = end - 1;
      while ((static_cast<unsigned char>(s[last]) & 0xC0) == 0x80) --last;
      if (!detail::is_white_space(utf8::decode(s, last))) break;
      end = last;
    }
    return s.size() - end;
  }
  /// Bytes of White_Space characters at the start of `s`.
  std::size_t leading_space(std::string_view s) const {
    std::size_t at = 0;
    while (at < s.size() && detail::is_white_space(utf8::decode(s, at)))
      at += utf8::char_length(s, at);
    return at;
  }
  static bool matches_whole(const Regex& r, std::string_view c) {
    bool whole = false;
    r.for_each_match(
        c, [&](std::size_t b, std::size_t e) { whole = whole || (b == 0 && e == c.size()); });
    return whole;
  }

  std::unordered_map<std::int64_t, AddedToken> tokens_;
  std::unordered_map<std::string, std::int64_t> by_content_;
  std::unordered_map<std::int64_t, std::string> decode_form_;
  std::unordered_map<std::string, std::int64_t> owner_of_form_;  // normalized tokens' forms
  std::unordered_set<std::string> special_;
  detail::TokenTrie raw_trie_, normalized_trie_;
  // Rust's regex crate's \w (Unicode word characters, Unicode 16.0 as Oniguruma's), for
  // single_word: Oniguruma's \w in a class and Join_Control (ZWNJ, ZWJ)
  static constexpr std::string_view kWordPattern = R"([\w\x{200C}\x{200D}])";
  Regex word_{kWordPattern, false, "added_tokens"};
};

}  // namespace remat::hub
