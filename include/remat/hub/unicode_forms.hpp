#pragma once
/// @file
/// Unicode normalization forms (NFC, NFD, NFKC, NFKD) of UTF-8 text, by ICU (Debian:
/// libicu-dev), as tokenizer.json normalizers ask for them (Qwen2/3 use NFC). ASCII text is left
/// as it is without calling ICU: it is invariant under all four forms.

#if !__has_include(<unicode/unorm2.h>)
#error "remat/hub/unicode_forms.hpp needs ICU (Debian: libicu-dev; CMake target remat::hub)"
#endif

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <string>
#include <string_view>
#include <vector>

#include "remat/core/error.hpp"

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

}  // namespace detail

/// `text` (valid UTF-8) in normalization form `form`.
inline std::string normalize(std::string_view text, UnicodeForm form) {
  bool ascii = true;
  for (const char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  const UNormalizer2* n = detail::icu_normalizer(form);
  UErrorCode status = U_ZERO_ERROR;
  // UTF-8 -> UTF-16: at most one UTF-16 unit per byte
  std::vector<UChar> wide(text.size() + 1);
  int32_t wide_size = 0;
  u_strFromUTF8(wide.data(), static_cast<int32_t>(wide.size()), &wide_size, text.data(),
                static_cast<int32_t>(text.size()), &status);
  detail::check_icu(status, "UTF-8 to UTF-16");
  // a decomposition grows text by at most 18 times (Unicode's stability bound for NFKD is 18)
  std::vector<UChar> normal(static_cast<std::size_t>(wide_size) * 18 + 16);
  const int32_t normal_size = unorm2_normalize(n, wide.data(), wide_size, normal.data(),
                                               static_cast<int32_t>(normal.size()), &status);
  detail::check_icu(status, "normalization");
  std::string out(static_cast<std::size_t>(normal_size) * 3, '\0');
  int32_t out_size = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_size, normal.data(), normal_size,
              &status);
  detail::check_icu(status, "UTF-16 to UTF-8");
  out.resize(static_cast<std::size_t>(out_size));
  return out;
}

}  // namespace remat::hub
