#pragma once
/// @file
/// The regular expressions of tokenizer.json files, run by PCRE2 (UTF and Unicode properties,
/// JIT-compiled when the platform allows) with Oniguruma's meaning, which is what Hugging Face's
/// library uses. Where the two engines read the same escape differently, the pattern is
/// rewritten before compiling (checked against Hugging Face's library by the tests), and a
/// construct without an exact rewriting is refused (see OnigRewriter):
///  - `\s` is Unicode's White_Space in Oniguruma; PCRE2 also counts U+180E, so `\s`/`\S` become
///    explicit classes of the White_Space code points;
///  - `\h` is a hexadecimal digit in Oniguruma and horizontal space in PCRE2;
///  - `\w` is Alphabetic, marks, decimal numbers and Pc in Oniguruma (outside a class, also
///    some Latin-1 numbers);
///  - `(?i)` covers the rest of its group as a group of its own in Oniguruma;
///  - `^` and `$` match at line ends in Oniguruma's Ruby syntax: PCRE2_MULTILINE;
///  - a Unicode property, `\w` and `\d` get the code points Unicode 16.0 added to them
///    (Note [Unicode versions]).
/// Matches are enumerated as Oniguruma's iterator does: an empty match right after the previous
/// match is skipped and the search moves one character on.

#if !__has_include(<pcre2.h>)
#error "remat/hub/regex.hpp needs PCRE2 (Debian: libpcre2-dev; CMake target remat::hub)"
#endif

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cctype>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/hub/unicode_properties.hpp"
#include "remat/hub/utf8.hpp"

namespace remat::hub {

namespace detail {

// Note [Unicode versions]: Hugging Face's tokenizers library (since 0.21.2) matches with
// Oniguruma 6.9.10, whose Unicode data is 16.0; Debian 12's PCRE2 10.42 has 14.0. On the
// code points assigned in between (9,272 letters, CJK Extensions H and I among them; 100 decimal
// digits; 771 symbols) `\p{L}`, `\w`, `\d` and the like answer differently, and a
// tokenizer.json pattern would split such text otherwise than the library. So each property,
// `\w` and `\d` is rewritten as itself plus the code points Unicode 16.0 adds to it
// (unicode_properties.hpp, written by tools/unicode_properties.py from Oniguruma's own tables).
// This is exact because PCRE2 10.42's properties equal Oniguruma's Unicode 14.0 tables code
// point for code point (checked for every property listed, and `\d`, over all code points), and
// every property listed only gains code points from 14.0 through 15.0 and 15.1 to 16.0, so the
// same additions are exact over a PCRE2 with any of those versions. Three properties lose code
// points (Mn: U+1171E became Mc in 16.0; C and Cn: assignments), which adding cannot express:
// they are refused, as are properties outside the list (scripts, blocks, other binary
// properties), and any pattern using Unicode data when PCRE2's version is another.
// Explicit classes of 16.0's whole ranges would not need PCRE2's data at all, but matched
// Llama 3's pattern over mixed text ten times slower than `\p{L}`; the additions, two times.

/// The Unicode version of PCRE2's data, as PCRE2 reports it ("14.0.0").
inline const std::string& pcre2_unicode_version() {
  static const std::string version = [] {
    char text[32] = {};
    return pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, text) < 0 ? std::string("unknown")
                                                                : std::string(text);
  }();
  return version;
}

/// The property Oniguruma names `name` (spaces, hyphens and underscores ignored, ASCII case
/// folded, as Oniguruma looks names up), or nullptr.
inline const UnicodeProperty* find_unicode_property(std::string_view name) {
  std::string key;
  for (const char c : name) {
    if (c == ' ' || c == '-' || c == '_') continue;
    key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  for (const UnicodePropertyName& n : kUnicodePropertyNames)
    if (n.name == key) return &kUnicodeProperties[n.property];
  return nullptr;
}

/// Unicode's White_Space code points, as the inside of a character class.
inline constexpr std::string_view kWhiteSpaceClass =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
/// Oniguruma's word characters in a class (`[\w]`): Alphabetic, marks, decimal numbers and
/// connector punctuation (not Join_Control, which Unicode's Word has). A `\w` outside a class
/// also takes ² ³ ¹ ¼ ½ ¾ (Oniguruma's Latin-1 table). Both checked code point by code point
/// against Hugging Face's library for every character PCRE2's Unicode data knows. PCRE2's \w
/// under UCP is letters, numbers and Pc.
inline constexpr std::string_view kWordClass = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
inline constexpr std::string_view kLatin1WordExtra = "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
inline constexpr std::string_view kHexClass = "0-9a-fA-F";

/// Rewrites an Oniguruma pattern (Hugging Face's engine, its default syntax) for PCRE2, one
/// construct at a time. What both engines read alike is copied; what PCRE2 reads otherwise and
/// has an exact spelling for is rewritten; anything else is refused (an IoError naming the
/// construct), so a pattern never loads with another meaning. Refused: \b \B \G \K \X \v \Q,
/// digit and other letter escapes, \xHH above 7F (a byte in Oniguruma), \pL without braces,
/// properties other than the general categories, Alphabetic, White_Space, Any and ASCII, and Mn, C
/// and Cn (Note [Unicode versions]), a negated property or \D inside a class, POSIX
/// brackets, nested classes and class intersection, inline flags other than i, `{,n}`, `{n}?` and
/// `{n,m}+` (not lazy or possessive in Oniguruma), and under case-insensitive matching any class,
/// property, non-ASCII character or letter pair that Oniguruma's multi-character case folding
/// reaches (ss, st, ff, fi, fl: ß, ﬅ, ﬀ, ﬁ, ﬂ) and PCRE2's simple folding does not.
class OnigRewriter {
 public:
  /// `source` names the file and field in error messages.
  OnigRewriter(std::string_view pattern, std::string_view source) : p_(pattern), source_(source) {
    out_.reserve(p_.size() + 64);
  }

  std::string run() {
    frames_.push_back(Frame{false, 0});
    while (i_ < p_.size()) step();
    // an unclosed group: PCRE2 refuses it, naming the offset
    if (frames_.size() == 1) close_isolated();
    return std::move(out_);
  }

 private:
  /// A group being read: whether its text matches case-insensitively, and how many groups
  /// `(?i:` opened for isolated flags `(?i)` end with it.
  struct Frame {
    bool caseless = false;
    int isolated = 0;
  };

  [[noreturn]] void refuse(std::string_view construct, std::string_view why) const {
    throw IoError(
        remat::detail::cat(source_, ": pattern '", p_, "': ", construct, " (", why,
                           ") is not supported: Oniguruma and PCRE2 read it differently"));
  }
  bool caseless() const { return frames_.back().caseless; }
  bool next_is(std::string_view s) const { return p_.substr(i_, s.size()) == s; }

  void step() {
    const char c = p_[i_];
    if (c == '\\') return escape(false);
    if (c == '[') return char_class();
    if (c == '(') return open_group();
    if (c == ')') return close_group();
    if (c == '{') return interval();
    if (c == '|') previous_ = 0;
    if (c == '|' || c == '.' || c == '^' || c == '$' || c == '*' || c == '+' || c == '?') {
      out_ += c;
      ++i_;
      return;
    }
    literal();
  }

  /// A literal character; under case-insensitive matching, only one that folds alike in both.
  void literal() {
    const std::size_t length = utf8::char_length(p_, i_);
    const char32_t c = utf8::decode(p_, i_);
    if (caseless()) check_fold(c);
    out_.append(p_.substr(i_, length));
    i_ += length;
  }

  void check_fold(char32_t c) {
    if (c >= 0x80)
      refuse(p_.substr(i_, utf8::char_length(p_, i_)), "a non-ASCII character under (?i)");
    const char lower = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    const std::string pair{previous_, lower};
    if (pair == "ss" || pair == "st" || pair == "ff" || pair == "fi" || pair == "fl")
      refuse(pair, "letters Oniguruma's case folding matches to one character under (?i)");
    previous_ = lower;
  }

  /// An escape outside (in_class false) or inside a character class.
  void escape(bool in_class) {
    if (i_ + 1 >= p_.size()) refuse("\\", "a trailing backslash");
    const char e = p_[i_ + 1];
    if (static_cast<unsigned char>(e) >= 0x80 || !std::isalnum(static_cast<unsigned char>(e))) {
      // an escaped punctuation or non-ASCII character: that character in both
      const std::size_t length = 1 + utf8::char_length(p_, i_ + 1);
      if (caseless() && static_cast<unsigned char>(e) >= 0x80)
        refuse(p_.substr(i_, length), "a non-ASCII character under (?i)");
      previous_ = 0;
      out_.append(p_.substr(i_, length));
      i_ += length;
      return;
    }
    previous_ = 0;
    const std::string_view cls = (e == 's' || e == 'S')   ? kWhiteSpaceClass
                                 : (e == 'w' || e == 'W') ? kWordClass
                                 : (e == 'h' || e == 'H') ? kHexClass
                                                          : std::string_view{};
    if (!cls.empty()) return class_escape(e, cls, in_class);
    if (e == 'p' || e == 'P') return property(in_class);
    if (e == 'd' || e == 'D') return digit_escape(e == 'D', in_class);
    if (e == 'x') return hex_escape();
    if (std::string_view("ntrfea").find(e) != std::string_view::npos ||
        (!in_class && std::string_view("AzZ").find(e) != std::string_view::npos)) {
      out_.append(p_.substr(i_, 2));
      i_ += 2;
      return;
    }
    refuse(p_.substr(i_, 2), "an escape not rewritten");
  }

  void class_escape(char e, std::string_view cls, bool in_class) {
    if (caseless()) refuse(p_.substr(i_, 2), "a class under (?i)");
    const bool negated = e == 'S' || e == 'W' || e == 'H';
    const bool word = cls == kWordClass;
    if (word) uses_unicode_data(p_.substr(i_, 2));
    const std::string inside = remat::detail::cat(cls, word ? kWordAdded : "");
    emit_class(p_.substr(i_, 2), inside, negated, in_class,
               word && !in_class ? kLatin1WordExtra : "");
    i_ += 2;
  }

  /// `\d` or `\D`: Unicode's decimal numbers in both, with those added since PCRE2's data.
  void digit_escape(bool negated, bool in_class) {
    uses_unicode_data(p_.substr(i_, 2));
    const UnicodeProperty* nd = find_unicode_property("Nd");
    emit_class(p_.substr(i_, 2), remat::detail::cat("\\d", nd->added), negated, in_class);
    i_ += 2;
  }

  /// \p{...}, \P{...} or \p{^...}: a property this rewriting knows (unicode_properties.hpp), as
  /// PCRE2 spells it, with the code points Unicode 16.0 added to it.
  void property(bool in_class) {
    if (i_ + 2 >= p_.size() || p_[i_ + 2] != '{')
      refuse(p_.substr(i_, 3), "a property without braces: not a property in Oniguruma");
    if (caseless()) refuse(p_.substr(i_, 2), "a property under (?i)");
    const std::size_t close = p_.find('}', i_);
    if (close == std::string_view::npos) refuse(p_.substr(i_), "an unclosed property");
    const std::string_view written = p_.substr(i_, close + 1 - i_);
    std::string_view name = p_.substr(i_ + 3, close - i_ - 3);
    bool negated = p_[i_ + 1] == 'P';
    if (!name.empty() && name.front() == '^') {
      negated = !negated;
      name.remove_prefix(1);
    }
    const UnicodeProperty* property = find_unicode_property(name);
    if (property == nullptr)
      refuse(written,
             "a property other than a general category, Alphabetic, White_Space, Any or ASCII, "
             "whose code points remat has no Unicode 16.0 data for");
    if (property->pcre2.empty())
      refuse(written,
             "a property that lost code points between PCRE2's Unicode 14.0 and "
             "Hugging Face's 16.0");
    uses_unicode_data(written);
    if (property->added.empty())  // nothing to add: itself, negated or not, anywhere
      out_ += remat::detail::cat(negated ? "\\P{" : "\\p{", property->pcre2, "}");
    else
      emit_class(written, remat::detail::cat("\\p{", property->pcre2, "}", property->added),
                 negated, in_class);
    i_ = close + 1;
  }

  /// Writes a class whose inside is `inside`: as part of the enclosing class, or as a class of
  /// its own (`extra` added there). A negated class inside a class has no spelling as a union.
  void emit_class(std::string_view written, std::string_view inside, bool negated, bool in_class,
                  std::string_view extra = "") {
    if (in_class && negated) refuse(written, "a negated class escape or property inside a class");
    if (in_class)
      out_ += inside;
    else
      out_ += remat::detail::cat(negated ? "[^" : "[", inside, extra, "]");
  }

  /// Refuses `construct` when PCRE2's Unicode data is not a version the additions are exact for.
  void uses_unicode_data(std::string_view construct) const {
    const std::string& v = pcre2_unicode_version();
    if (v != "14.0.0" && v != "15.0.0" && v != "15.1.0" && v != "16.0.0")
      refuse(construct, remat::detail::cat("this PCRE2's Unicode data is version ", v,
                                           "; remat's additions are exact over 14.0 to 16.0"));
  }

  /// \xHH or \x{H...}: the same code point in both.
  void hex_escape() {
    if (caseless()) refuse(p_.substr(i_, 2), "a character escape under (?i)");
    std::size_t end = i_ + 2;
    if (end < p_.size() && p_[end] == '{') {
      end = p_.find('}', end);
      if (end == std::string_view::npos) refuse(p_.substr(i_), "an unclosed \\x{");
      ++end;
    } else {
      while (end < i_ + 4 && end < p_.size() && std::isxdigit(static_cast<unsigned char>(p_[end])))
        ++end;
      // Oniguruma reads \xHH as a byte: above 7F, not a character of UTF-8 text
      if (end > i_ + 2 &&
          std::stoi(std::string(p_.substr(i_ + 2, end - i_ - 2)), nullptr, 16) >= 0x80)
        refuse(p_.substr(i_, end - i_), "a byte above 0x7F");
    }
    out_.append(p_.substr(i_, end - i_));
    i_ = end;
  }

  /// A bracketed class, up to its `]`; a `]` first (or after `^`) is a literal in both.
  void char_class() {
    if (caseless()) refuse("[", "a class under (?i)");
    previous_ = 0;
    out_ += '[';
    ++i_;
    if (next_is("^")) out_ += p_[i_++];
    if (next_is("]")) out_ += p_[i_++];
    while (i_ < p_.size() && p_[i_] != ']') {
      if (next_is("[")) refuse(p_.substr(i_, 2), "a nested class or POSIX bracket inside a class");
      if (next_is("&&")) refuse("&&", "class intersection");
      if (p_[i_] == '\\') {
        escape(true);
        continue;
      }
      const std::size_t length = utf8::char_length(p_, i_);
      out_.append(p_.substr(i_, length));
      i_ += length;
    }
    if (i_ >= p_.size()) refuse("[", "an unclosed class");
    out_ += p_[i_++];
  }

  /// `(`, `(?:`, lookarounds, atomic and named groups, and the inline flag i.
  void open_group() {
    const bool outer = caseless();
    if (!next_is("(?")) return push("(", outer);
    for (const std::string_view kind : {"(?:", "(?=", "(?!", "(?<=", "(?<!", "(?>"})
      if (next_is(kind)) return push(kind, outer);
    if (next_is("(?<") && i_ + 3 < p_.size() &&
        std::isalpha(static_cast<unsigned char>(p_[i_ + 3])))
      return push("(?<", outer);
    for (const bool on : {true, false}) {
      const std::string_view flag = on ? "(?i" : "(?-i";
      if (!next_is(flag) || i_ + flag.size() >= p_.size()) continue;
      const char after = p_[i_ + flag.size()];
      if (after == ':') return push(remat::detail::cat(flag, ":"), on);
      if (after == ')') return isolated_flag(flag, on);
    }
    const std::size_t close = p_.find_first_of(":)", i_);
    refuse(p_.substr(i_, close == std::string_view::npos ? 2 : close + 1 - i_),
           "a group kind or inline flag not rewritten");
  }

  void push(std::string_view opening, bool caseless_inside) {
    out_ += opening;
    i_ += opening.size();
    frames_.push_back(Frame{caseless_inside, 0});
  }

  /// `(?i)`: in Oniguruma it covers the rest of the enclosing group as a group of its own
  /// (`a(?i)b|c` is `a(?i:b|c)`), where PCRE2 would apply it to the later alternatives only:
  /// so it becomes `(?i:`, closed where the enclosing group ends.
  void isolated_flag(std::string_view flag, bool on) {
    out_ += remat::detail::cat(flag, ":");
    i_ += flag.size() + 1;
    frames_.back().caseless = on;
    ++frames_.back().isolated;
  }

  void close_isolated() {
    for (int k = 0; k < frames_.back().isolated; ++k) out_ += ')';
  }

  void close_group() {
    if (frames_.size() == 1) {  // unmatched: PCRE2 refuses it, naming the offset
      out_ += ')';
      ++i_;
      return;
    }
    close_isolated();
    frames_.pop_back();
    out_ += ')';
    ++i_;
  }

  /// `{n}`, `{n,}`, `{n,m}`: the same repetition, except `{,n}` (a literal in PCRE2), `{n}?`
  /// (optional in Oniguruma, lazy in PCRE2) and a `+` after one (possessive only in PCRE2).
  void interval() {
    const std::size_t close = p_.find('}', i_);
    const std::string_view body =
        close == std::string_view::npos ? std::string_view{} : p_.substr(i_ + 1, close - i_ - 1);
    const bool valid = !body.empty() && body.find_first_not_of("0123456789,") == body.npos &&
                       body.find(',') == body.rfind(',');
    if (!valid) return literal();  // not an interval: a literal `{` in both
    if (body.front() == ',') refuse(p_.substr(i_, close + 1 - i_), "an interval without a minimum");
    const char after = close + 1 < p_.size() ? p_[close + 1] : '\0';
    if (after == '+' || (after == '?' && body.find(',') == body.npos))
      refuse(p_.substr(i_, close + 2 - i_), "a quantifier after an interval");
    out_.append(p_.substr(i_, close + 1 - i_));
    i_ = close + 1;
  }

  std::string_view p_, source_;
  std::string out_;
  std::size_t i_ = 0;
  std::vector<Frame> frames_;
  char previous_ = 0;  // the last ASCII letter read under (?i), lower-cased (0 after others)
};

/// `pattern` (Oniguruma syntax) rewritten so that PCRE2 matches the same strings; an IoError
/// for a construct this rewriting does not express exactly (see OnigRewriter).
inline std::string onig_to_pcre2(std::string_view pattern,
                                 std::string_view source = "tokenizer regex") {
  return OnigRewriter(pattern, source).run();
}

/// A PCRE2 match context with a JIT stack, one per thread: JIT stacks must not be shared by
/// threads matching at the same time.
struct MatchContext {
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchContext() {
    context = pcre2_match_context_create(nullptr);
    // 32 KiB to start, up to 64 MiB: long runs of spaces backtrack deeply in `\s+(?!\S)`
    stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    if (context != nullptr && stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchContext() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
  }
  MatchContext(const MatchContext&) = delete;
  MatchContext& operator=(const MatchContext&) = delete;
  static pcre2_match_context* get() {
    thread_local MatchContext instance;
    return instance.context;
  }
};

}  // namespace detail

/// A compiled pattern. Copies share the compiled code (read-only after compiling).
class Regex {
 public:
  /// Compiles `pattern`; `literal` matches it as plain text (a tokenizer.json `String`
  /// pattern). `source` names the file and field in error messages.
  Regex(std::string_view pattern, bool literal, const std::string& source)
      : pattern_(pattern), literal_(literal && !pattern.empty()) {
    if (utf8::first_invalid(pattern))
      throw IoError(remat::detail::cat(source, ": pattern is not valid UTF-8"));
    const std::string translated =
        literal ? std::string(pattern) : detail::onig_to_pcre2(pattern, source);
    // (PCRE2_LITERAL admits no UCP, which a literal does not need)
    const std::uint32_t options =
        PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                     translated.size(), options, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw IoError(remat::detail::cat(source, ": pattern '", pattern, "' does not compile (",
                                       reinterpret_cast<const char*>(message), " at offset ",
                                       offset, ")"));
    }
    code_.reset(code, pcre2_code_free);
    // JIT is an optimisation: without it (an unsupported CPU, or a build without JIT) PCRE2's
    // interpreter gives the same matches.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }

  /// The pattern as written in the file.
  const std::string& pattern() const { return pattern_; }

  /// Calls `on_match(start, end)` for each match in `text` (valid UTF-8), left to right, as
  /// Oniguruma's iterator enumerates them.
  template <class OnMatch>
  void for_each_match(std::string_view text, OnMatch&& on_match) const {
    if (literal_) {
      // a plain string (Llama 2's " " -> "▁"): a substring search finds the same matches
      // without a call into PCRE2 per match
      for (std::size_t at = text.find(pattern_); at != std::string_view::npos;
           at = text.find(pattern_, at + pattern_.size()))
        on_match(at, at + pattern_.size());
      return;
    }
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    pcre2_match_context* context = detail::MatchContext::get();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t from = 0;
    std::size_t last_end = std::string_view::npos;  // end of the last match reported
    while (from <= text.size()) {
      const int rc = pcre2_match(code_.get(), subject, text.size(), from, PCRE2_NO_UTF_CHECK,
                                 data.get(), context);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        throw IoError(remat::detail::cat("tokenizer regex '", pattern_, "': matching failed (",
                                         reinterpret_cast<const char*>(message), ")"));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
      const std::size_t start = ovector[0], end = ovector[1];
      if (start == end && end == last_end) {
        // an empty match where the last one ended: not reported, the search moves one on
        if (from >= text.size()) return;
        from += utf8::char_length(text, from);
        continue;
      }
      on_match(start, end);
      from = last_end = end;
    }
  }

 private:
  std::string pattern_;
  bool literal_ = false;  // a non-empty plain string: matched without PCRE2
  std::shared_ptr<pcre2_code> code_;
};

}  // namespace remat::hub
