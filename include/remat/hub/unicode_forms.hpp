#pragma once
/// @file
/// Unicode normalization forms (NFC, NFD, NFKC, NFKD) of UTF-8 text, by ICU (Debian:
/// libicu-dev), as tokenizer.json normalizers ask for them (Qwen2/3 use NFC), with the Unicode
/// 9.0 data Hugging Face's library normalizes with (its crate unicode-normalization-alignments
/// ships Unicode 9.0 tables, checked against it by the tests): a character assigned after 9.0
/// is kept as it is, as an unassigned one would be. ASCII text is left as it is without calling
/// ICU: it is invariant under all four forms.

#if !__has_include(<unicode/unorm2.h>)
#error "remat/hub/unicode_forms.hpp needs ICU (Debian: libicu-dev; CMake target remat::hub)"
#endif

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/hub/utf8.hpp"

namespace remat::hub {

/// The four Unicode normalization forms.
enum class UnicodeForm { nfc, nfd, nfkc, nfkd };

namespace detail {

inline const UNormalizer2* icu_normalizer(UnicodeForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* n = nullptr;
  switch (form) {
    case UnicodeForm::nfc:
      n = unorm2_getNFCInstance(&status);
      break;
    case UnicodeForm::nfd:
      n = unorm2_getNFDInstance(&status);
      break;
    case UnicodeForm::nfkc:
      n = unorm2_getNFKCInstance(&status);
      break;
    case UnicodeForm::nfkd:
      n = unorm2_getNFKDInstance(&status);
      break;
  }
  if (U_FAILURE(status) || n == nullptr)
    throw Error(remat::detail::cat("ICU: no normalizer (", u_errorName(status), ")"));
  return n;
}

inline void check_icu(UErrorCode status, const char* what) {
  if (U_FAILURE(status))
    throw Error(remat::detail::cat("ICU: ", what, " failed (", u_errorName(status), ")"));
}

/// The Unicode version of Hugging Face's normalization tables.
inline constexpr UVersionInfo kHfUnicodeVersion = {9, 0, 0, 0};

/// Whether `c` was assigned after Hugging Face's Unicode version: its tables give such a
/// character combining class 0, no decomposition and no composition, as to an unassigned one.
inline bool newer_than_hf(char32_t c) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  return std::lexicographical_compare(std::begin(kHfUnicodeVersion), std::end(kHfUnicodeVersion),
                                      std::begin(age), std::end(age));
}

/// `text` (valid UTF-8) in form `form` by ICU's own (newer) Unicode data.
inline std::string icu_normalize(std::string_view text, UnicodeForm form) {
  if (text.empty()) return {};
  const UNormalizer2* n = icu_normalizer(form);
  UErrorCode status = U_ZERO_ERROR;
  // UTF-8 -> UTF-16: at most one UTF-16 unit per byte
  std::vector<UChar> wide(text.size() + 1);
  int32_t wide_size = 0;
  u_strFromUTF8(wide.data(), static_cast<int32_t>(wide.size()), &wide_size, text.data(),
                static_cast<int32_t>(text.size()), &status);
  check_icu(status, "UTF-8 to UTF-16");
  // a decomposition grows text by at most 18 times (Unicode's stability bound for NFKD is 18)
  std::vector<UChar> normal(static_cast<std::size_t>(wide_size) * 18 + 16);
  const int32_t normal_size = unorm2_normalize(n, wide.data(), wide_size, normal.data(),
                                               static_cast<int32_t>(normal.size()), &status);
  check_icu(status, "normalization");
  std::string out(static_cast<std::size_t>(normal_size) * 3, '\0');
  int32_t out_size = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_size, normal.data(), normal_size,
              &status);
  check_icu(status, "UTF-16 to UTF-8");
  out.resize(static_cast<std::size_t>(out_size));
  return out;
}

}  // namespace detail

/// `text` (valid UTF-8) in normalization form `form`, as Hugging Face normalizes it (Unicode
/// 9.0). The text is cut at each character assigned after 9.0, which is kept verbatim, and the
/// runs between are normalized by ICU separately. This is exact: under 9.0's data such a
/// character is a starter (class 0) that neither decomposes nor composes with anything, so no
/// normalization step reaches across it; and within a run of older characters ICU's newer data
/// gives 9.0's result, because Unicode's stability policy freezes the decompositions and
/// combining classes of assigned characters, and a precomposed character added later from
/// older characters is a composition exclusion, so NFC/NFKC never produce it.
inline std::string normalize(std::string_view text, UnicodeForm form) {
  bool ascii = true;
  for (const char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  std::size_t run = 0;  // start of the run of older characters being gathered
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = utf8::char_length(text, at);
    if (static_cast<unsigned char>(text[at]) >= 0x80 &&
        detail::newer_than_hf(utf8::decode(text, at))) {
      out += detail::icu_normalize(text.substr(run, at - run), form);
      out.append(text.substr(at, length));
      run = at + length;
    }
    at += length;
  }
  out += detail::icu_normalize(text.substr(run), form);
  return out;
}

}  // namespace remat::hub
