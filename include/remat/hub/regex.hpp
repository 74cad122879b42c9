#pragma once
/// @file
/// The regular expressions of tokenizer.json files, run by PCRE2 (UTF and Unicode properties,
/// JIT-compiled when the platform allows) with Oniguruma's meaning, which is what Hugging Face's
/// library uses. Where the two engines read the same escape differently, the pattern is
/// rewritten before compiling (checked against Hugging Face's library by the tests):
///  - `\s` is Unicode's White_Space in Oniguruma; PCRE2 also counts U+180E, so `\s`/`\S` become
///    explicit classes of the White_Space code points;
///  - `\h` is a hexadecimal digit in Oniguruma and horizontal space in PCRE2;
///  - `\w` adds marks and connector punctuation in Oniguruma;
///  - `^` and `$` match at line ends in Oniguruma's Ruby syntax: PCRE2_MULTILINE.
/// Matches are enumerated as Oniguruma's iterator does: an empty match right after the previous
/// match is skipped and the search moves one character on.

#if !__has_include(<pcre2.h>)
#error "remat/hub/regex.hpp needs PCRE2 (Debian: libpcre2-dev; CMake target remat::hub)"
#endif

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "remat/core/error.hpp"
#include "remat/hub/utf8.hpp"

namespace remat::hub {

namespace detail {

/// Unicode's White_Space code points, as the inside of a character class.
inline constexpr std::string_view kWhiteSpaceClass =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
/// Oniguruma's word characters (letters, marks, numbers, connector punctuation).
inline constexpr std::string_view kWordClass = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
inline constexpr std::string_view kHexClass = "0-9a-fA-F";

/// `pattern` (Oniguruma syntax) rewritten so that PCRE2 matches the same strings; throws for an
/// escape this rewriting cannot express (a negated class escape inside a character class).
inline std::string onig_to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      const std::string_view cls = (e == 's' || e == 'S')   ? kWhiteSpaceClass
                                   : (e == 'w' || e == 'W') ? kWordClass
                                   : (e == 'h' || e == 'H') ? kHexClass
                                                            : std::string_view{};
      if (cls.empty()) {
        out += c;
        out += e;
      } else if (in_class) {
        if (e == 'S' || e == 'W' || e == 'H')
          throw IoError(remat::detail::cat("tokenizer regex '", pattern, "': \\", e,
                                           " inside a character class is not supported"));
        out += cls;
      } else {
        out += (e == 'S' || e == 'W' || e == 'H') ? "[^" : "[";
        out += cls;
        out += ']';
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // a ']' (or '^]') right after '[' is a literal, not the end of the class
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
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
    const std::string translated = literal ? std::string(pattern) : detail::onig_to_pcre2(pattern);
    // (PCRE2_LITERAL admits no UCP, which a literal does not need)
    const std::uint32_t options =
        PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    if (utf8::first_invalid(translated))
      throw IoError(remat::detail::cat(source, ": pattern is not valid UTF-8"));
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
