#pragma once
/// @file
/// tokenizer.json pre-tokenizers: they cut each open piece into the words that BPE then
/// tokenizes one by one. Supported: `Sequence`, `Split` (String or Regex pattern, every
/// behavior, `invert`), `ByteLevel` (GPT-2's regex when `use_regex`, the byte alphabet) and
/// `Metaspace` (SentencePiece's "▁", prepend schemes always/first/never, `split`); any other
/// type is an IoError naming it.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remat/hub/byte_level.hpp"
#include "remat/hub/json_file.hpp"
#include "remat/hub/normalizers.hpp"
#include "remat/hub/piece.hpp"
#include "remat/hub/regex.hpp"

namespace remat::hub {

/// Cuts the open pieces of a text into smaller ones.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Replaces the open pieces of `pieces` by their parts (token pieces stay as they are).
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
  /// Whether it looks at which pieces start at the original text's offset 0 (Metaspace's
  /// prepend_scheme "first").
  virtual bool uses_origin() const { return false; }
  /// Appends the add_prefix_space of each ByteLevel step, which tokenizer_config.json's
  /// add_prefix_space must agree with (transformers rebuilds the step with that value).
  virtual void byte_level_prefix_spaces(std::vector<bool>& /*out*/) const {}
};

/// What a split does with the matches of its pattern (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

namespace detail {

/// A part of a text and whether it matched the pattern.
struct Match {
  Range range;
  bool matched = false;
};

/// The text cut into matches and the gaps between them (one unmatched part for empty text).
inline void find_matches(const Regex& pattern, std::string_view text, std::vector<Match>& out) {
  out.clear();
  if (text.empty()) {
    out.push_back({{0, 0}, false});
    return;
  }
  std::size_t last = 0;
  pattern.for_each_match(text, [&](std::size_t begin, std::size_t end) {
    if (begin != last) out.push_back({{last, begin}, false});
    out.push_back({{begin, end}, true});
    last = end;
  });
  if (last != text.size()) out.push_back({{last, text.size()}, false});
}

/// Applies `behavior` to `matches` (flags already inverted if asked), appending parts to `out`.
inline void apply_behavior(const std::vector<Match>& matches, SplitBehavior behavior,
                           std::vector<Range>& out) {
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Match& m : matches) out.push_back(m.range);
      return;
    case SplitBehavior::removed:
      for (const Match& m : matches)
        if (!m.matched) out.push_back(m.range);
      return;
    case SplitBehavior::contiguous: {
      bool previous = false;
      for (const Match& m : matches) {
        if (m.matched == previous && !out.empty())
          out.back().end = m.range.end;
        else
          out.push_back(m.range);
        previous = m.matched;
      }
      return;
    }
    case SplitBehavior::merged_with_previous: {
      bool previous = false;
      for (const Match& m : matches) {
        if (m.matched && !previous && !out.empty())
          out.back().end = m.range.end;
        else
          out.push_back(m.range);
        previous = m.matched;
      }
      return;
    }
    case SplitBehavior::merged_with_next: {
      const std::size_t first = out.size();
      bool previous = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->matched && !previous && out.size() > first)
          out.back().begin = it->range.begin;
        else
          out.push_back(it->range);
        previous = it->matched;
      }
      std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
      return;
    }
  }
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }
  bool uses_origin() const override {
    for (const auto& step : steps_)
      if (step->uses_origin()) return true;
    return false;
  }
  void byte_level_prefix_spaces(std::vector<bool>& out) const override {
    for (const auto& step : steps_) step->byte_level_prefix_spaces(out);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Match> matches;
    split_open_pieces(pieces, [&](Piece& piece, std::vector<Range>& parts) {
      find_matches(pattern_, piece.text, matches);
      if (invert_)
        for (Match& m : matches) m.matched = !m.matched;
      apply_behavior(matches, behavior_, parts);
    });
  }

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

/// GPT-2's pre-tokenizer regex (ByteLevel with use_regex).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& source)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, false, source) : nullptr) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Match> matches;
    split_open_pieces(pieces, [&](Piece& piece, std::vector<Range>& parts) {
      if (add_prefix_space_ && (piece.text.empty() || piece.text.front() != ' '))
        piece.text.insert(0, " ");
      if (!regex_) {
        parts.push_back({0, piece.text.size()});
        return;
      }
      find_matches(*regex_, piece.text, matches);
      for (const Match& m : matches) parts.push_back(m.range);
    });
    const ByteAlphabet& alphabet = ByteAlphabet::get();
    for (Piece& piece : pieces)
      if (piece.open()) piece.text = alphabet.encode(piece.text);
  }
  void byte_level_prefix_spaces(std::vector<bool>& out) const override {
    out.push_back(add_prefix_space_);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

/// Metaspace's prepend schemes.
enum class PrependScheme { always, first, never };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_open_pieces(pieces, [&](Piece& piece, std::vector<Range>& parts) {
      std::string replaced;
      replaced.reserve(piece.text.size() + 8);
      for (const char c : piece.text) {
        if (c == ' ')
          replaced += replacement_;
        else
          replaced += c;
      }
      piece.text = std::move(replaced);
      const bool starts = piece.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::always ||
                      (scheme_ == PrependScheme::first && piece.at_origin)))
        piece.text.insert(0, replacement_);
      if (!split_) {
        parts.push_back({0, piece.text.size()});
        return;
      }
      // merged with next: each replacement character starts a new part
      std::size_t begin = 0;
      for (std::size_t at = piece.text.find(replacement_, 1); at != std::string::npos;
           at = piece.text.find(replacement_, at + replacement_.size())) {
        parts.push_back({begin, at});
        begin = at;
      }
      parts.push_back({begin, piece.text.size()});
    });
  }
  bool uses_origin() const override { return scheme_ == PrependScheme::first; }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

inline SplitBehavior read_behavior(const JsonField& j) {
  const std::string b = j.string();
  if (b == "Removed") return SplitBehavior::removed;
  if (b == "Isolated") return SplitBehavior::isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (b == "Contiguous") return SplitBehavior::contiguous;
  j.fail(remat::detail::cat("unknown split behavior '", b,
                            "' (known: Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                            "Contiguous)"));
}

/// Metaspace's replacement, prepend scheme and split flag (shared by its decoder).
struct MetaspaceOptions {
  std::string replacement;
  PrependScheme scheme = PrependScheme::always;
  bool split = true;
};

inline MetaspaceOptions read_metaspace(const JsonField& j) {
  j.require_keys({"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
  MetaspaceOptions o;
  o.replacement = j["replacement"].string();
  if (o.replacement.empty() || utf8::first_invalid(o.replacement) ||
      utf8::char_length(o.replacement, 0) != o.replacement.size())
    j["replacement"].fail("expected one character");
  if (j.has("prepend_scheme")) {
    const std::string s = j["prepend_scheme"].string();
    if (s == "always")
      o.scheme = PrependScheme::always;
    else if (s == "first")
      o.scheme = PrependScheme::first;
    else if (s == "never")
      o.scheme = PrependScheme::never;
    else
      j["prepend_scheme"].fail(remat::detail::cat("unknown prepend scheme '", s, "'"));
  }
  if (!j.boolean_or("add_prefix_space", true)) {
    if (o.scheme != PrependScheme::never)
      j["add_prefix_space"].fail("false does not match the prepend_scheme");
    o.scheme = PrependScheme::never;
  }
  o.split = j.boolean_or("split", true);
  return o;
}

}  // namespace detail

/// The pre-tokenizer a tokenizer.json `pre_tokenizer` field describes (nullptr for null).
inline std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonField& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j["type"].string();
  if (type == "Sequence") {
    j.require_keys({"type", "pretokenizers"});
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    const JsonField list = j["pretokenizers"];
    for (std::size_t i = 0; i < list.size(); ++i) {
      // tokenizers reads each member as a pre-tokenizer: null is none of them
      if (list.at(i).is_null()) list.at(i).fail("expected a pre-tokenizer, found null");
      steps.push_back(make_pre_tokenizer(list.at(i)));
    }
    return std::make_unique<detail::SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    j.require_keys({"type", "pattern", "behavior", "invert"});
    return std::make_unique<detail::SplitPreTokenizer>(detail::read_pattern(j["pattern"]),
                                                       detail::read_behavior(j["behavior"]),
                                                       j["invert"].boolean());
  }
  if (type == "ByteLevel") {
    // trim_offsets changes offsets only, never ids
    j.require_keys({"type", "add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<detail::ByteLevelPreTokenizer>(
        j["add_prefix_space"].boolean(), j.boolean_or("use_regex", true), j.path());
  }
  if (type == "Metaspace") {
    const detail::MetaspaceOptions o = detail::read_metaspace(j);
    return std::make_unique<detail::MetaspacePreTokenizer>(o.replacement, o.scheme, o.split);
  }
  j["type"].fail(remat::detail::cat("pre-tokenizer type '", type,
                                    "' is not supported (supported: Sequence, Split, ByteLevel, "
                                    "Metaspace)"));
}

}  // namespace remat::hub
