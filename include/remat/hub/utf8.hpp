#pragma once
/// @file
/// UTF-8 as the tokenizers need it: validation that names the first bad byte, stepping over code
/// points, encoding one, and the lossy conversion that Rust's `String::from_utf8_lossy` (and so
/// Hugging Face's decoders) apply: each maximal invalid subpart becomes one U+FFFD.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace remat::hub::utf8 {

/// The replacement character U+FFFD, encoded.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

/// Length of the valid UTF-8 sequence starting at `at`, or 0 if the bytes there are not one
/// (truncated, overlong, surrogate, above U+10FFFF, stray continuation byte).
inline std::size_t valid_length(std::string_view s, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(at);
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (at + n > s.size()) return 0;
  if (byte(at + 1) < lo || byte(at + 1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i)
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
  return n;
}

/// Offset of the first byte that does not start a valid UTF-8 sequence, if any.
inline std::optional<std::size_t> first_invalid(std::string_view s) {
  for (std::size_t at = 0; at < s.size();) {
    const std::size_t n = valid_length(s, at);
    if (n == 0) return at;
    at += n;
  }
  return std::nullopt;
}

/// Length in bytes of the code point starting at `at` of valid UTF-8 text.
inline std::size_t char_length(std::string_view s, std::size_t at) {
  const unsigned char b = static_cast<unsigned char>(s[at]);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

/// The code point starting at `at` of valid UTF-8 text.
inline char32_t decode(std::string_view s, std::size_t at) {
  const auto byte = [&](std::size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[i]));
  };
  const std::size_t n = char_length(s, at);
  if (n == 1) return byte(at);
  if (n == 2) return ((byte(at) & 0x1F) << 6) | (byte(at + 1) & 0x3F);
  if (n == 3)
    return ((byte(at) & 0x0F) << 12) | ((byte(at + 1) & 0x3F) << 6) | (byte(at + 2) & 0x3F);
  return ((byte(at) & 0x07) << 18) | ((byte(at + 1) & 0x3F) << 12) | ((byte(at + 2) & 0x3F) << 6) |
         (byte(at + 3) & 0x3F);
}

/// Appends the UTF-8 encoding of `c` (a Unicode scalar value) to `out`.
inline void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

/// Length of the maximal subpart of an ill-formed sequence at `at` (at least 1): the longest
/// prefix of a valid sequence that the bytes there begin, as Unicode's "substitution of maximal
/// subparts" (and Rust's from_utf8_lossy) define it.
inline std::size_t invalid_length(std::string_view s, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(at);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  std::size_t len = 1;
  if (at + 1 >= s.size() || byte(at + 1) < lo || byte(at + 1) > hi) return len;
  ++len;
  for (std::size_t i = 2; i < n && at + i < s.size() && (byte(at + i) & 0xC0) == 0x80; ++i) ++len;
  return len;
}

/// `bytes` as valid UTF-8: each maximal invalid subpart replaced by U+FFFD.
inline std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t at = 0; at < bytes.size();) {
    if (const std::size_t n = valid_length(bytes, at); n != 0) {
      out.append(bytes.substr(at, n));
      at += n;
    } else {
      out.append(kReplacement);
      at += invalid_length(bytes, at);
    }
  }
  return out;
}

}  // namespace remat::hub::utf8
