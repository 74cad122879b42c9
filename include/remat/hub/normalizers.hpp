#pragma once
/// @file
/// tokenizer.json normalizers: the text rewriting applied to each open piece before
/// pre-tokenization. Supported: `Sequence`, `NFC`, `NFD`, `NFKC`, `NFKD`, `Prepend`, `Replace`
/// (String or Regex pattern) and `Strip`; any other type is an IoError naming it.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/hub/json_file.hpp"
#include "remat/hub/regex.hpp"
#include "remat/hub/unicode_forms.hpp"

namespace remat::hub {

/// Rewrites a piece of text.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  /// Normalizes `text` (valid UTF-8) in place.
  virtual void normalize(std::string& text) const = 0;
  /// Whether it can delete or expand the text's first character: then the normalized text's
  /// byte 0 may not come from the original's offset 0, or a later byte may, which is what
  /// Metaspace's prepend_scheme "first" looks at (remat tracks no offsets).
  virtual bool moves_origin() const { return true; }
};

namespace detail {

/// Whether `c` has Unicode's White_Space property (Rust's char::is_whitespace).
inline bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }
  bool moves_origin() const override {
    for (const auto& step : steps_)
      if (step->moves_origin()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = hub::normalize(text, form_); }

 private:
  UnicodeForm form_;
};

/// Prepends a string to non-empty text (Llama 2's "▁").
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

/// Replaces every match of a pattern (Llama 2: " " by "▁").
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    text = replace_all(pattern_, text, content_, [&](std::size_t, std::size_t end) {
      if (end == 0 && !text.empty()) refuse_empty_match_at_start(text);
    });
  }

  /// `text` with every match of `pattern` replaced by `content`; `on_match(begin, end)` sees
  /// each match first.
  template <class OnMatch = void (*)(std::size_t, std::size_t)>
  static std::string replace_all(
      const Regex& pattern, std::string_view text, std::string_view content,
      OnMatch on_match = [](std::size_t, std::size_t) {}) {
    std::string out;
    out.reserve(text.size() + text.size() / 2);
    std::size_t last = 0;
    pattern.for_each_match(text, [&](std::size_t begin, std::size_t end) {
      on_match(begin, end);
      out.append(text.substr(last, begin - last));
      out.append(content);
      last = end;
    });
    out.append(text.substr(last));
    return out;
  }

 private:
  /// tokenizers' NormalizedString::replace fails (it panics, an index out of bounds) on an
  /// empty match at the start of a string that is not empty: there are no ids to match.
  [[noreturn]] void refuse_empty_match_at_start(std::string_view text) const {
    const std::string shown = nlohmann::json(std::string(text.substr(0, 40)))
                                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    throw ArgumentError(remat::detail::cat(
        "hub::Tokenizer: the Replace normalizer's pattern '", pattern_.pattern(),
        "' matches the empty string at the start of ", shown, text.size() > 40 ? "..." : "",
        ": Hugging Face's tokenizers fails on this text (it panics: index out of bounds)"));
  }

  Regex pattern_;
  std::string content_;
};

/// Removes White_Space characters at the start and/or the end.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    std::size_t begin = 0, end = text.size();
    if (left_)
      while (begin < end && is_white_space(utf8::decode(text, begin)))
        begin += utf8::char_length(text, begin);
    if (right_)
      while (end > begin) {
        std::size_t last = end - 1;
        while ((static_cast<unsigned char>(text[last]) & 0xC0) == 0x80) --last;
        if (!is_white_space(utf8::decode(text, last))) break;
        end = last;
      }
    text = text.substr(begin, end - begin);
  }
  // only stripping at the left deletes the first character
  bool moves_origin() const override { return left_; }

 private:
  bool left_, right_;
};

/// A `{"String": s}` or `{"Regex": r}` pattern of tokenizer.json.
inline Regex read_pattern(const JsonField& j) {
  j.require_keys({"String", "Regex"});
  // tokenizers reads the pattern as a map with a single key, and refuses one with both
  if (j.has("String") && j.has("Regex"))
    j.fail(remat::detail::cat("expected {\"String\": ...} or {\"Regex\": ...}, found both: ",
                              j.shown()));
  if (j.has("String")) return Regex(j["String"].string(), true, j.path());
  if (j.has("Regex")) return Regex(j["Regex"].string(), false, j.path());
  j.fail("expected {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace detail

/// The normalizer a tokenizer.json `normalizer` field describes (nullptr for null).
inline std::unique_ptr<Normalizer> make_normalizer(const JsonField& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j["type"].string();
  if (type == "Sequence") {
    j.require_keys({"type", "normalizers"});
    std::vector<std::unique_ptr<Normalizer>> steps;
    const JsonField list = j["normalizers"];
    for (std::size_t i = 0; i < list.size(); ++i) {
      // tokenizers reads each member as a normalizer: null is none of them
      if (list.at(i).is_null()) list.at(i).fail("expected a normalizer, found null");
      steps.push_back(make_normalizer(list.at(i)));
    }
    return std::make_unique<detail::SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    j.require_keys({"type"});
    const UnicodeForm form = type == "NFC"    ? UnicodeForm::nfc
                             : type == "NFD"  ? UnicodeForm::nfd
                             : type == "NFKC" ? UnicodeForm::nfkc
                                              : UnicodeForm::nfkd;
    return std::make_unique<detail::UnicodeNormalizer>(form);
  }
  if (type == "Prepend") {
    j.require_keys({"type", "prepend"});
    return std::make_unique<detail::PrependNormalizer>(j["prepend"].string());
  }
  if (type == "Replace") {
    j.require_keys({"type", "pattern", "content"});
    return std::make_unique<detail::ReplaceNormalizer>(detail::read_pattern(j["pattern"]),
                                                       j["content"].string());
  }
  if (type == "Strip") {
    j.require_keys({"type", "strip_left", "strip_right"});
    return std::make_unique<detail::StripNormalizer>(j["strip_left"].boolean(),
                                                     j["strip_right"].boolean());
  }
  j["type"].fail(remat::detail::cat(
      "normalizer type '", type,
      "' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip)"));
}

}  // namespace remat::hub
