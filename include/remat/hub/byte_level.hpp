#pragma once
/// @file
/// GPT-2's byte-to-character table, used by byte-level BPE (GPT-2, Llama 3, Qwen): every byte
/// is shown as one printable code point (the printable Latin-1 bytes as themselves, the other 68
/// bytes as U+0100 onwards), so that any byte string is a string of "characters" that BPE can
/// merge. The pre-tokenizer maps bytes to characters; the decoder maps them back.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "remat/hub/utf8.hpp"

namespace remat::hub {

/// The two directions of the byte-level alphabet.
class ByteAlphabet {
 public:
  /// The shared table.
  static const ByteAlphabet& get() {
    static const ByteAlphabet table;
    return table;
  }

  /// The UTF-8 encoding of the character that stands for `byte`.
  std::string_view encode(unsigned char byte) const { return {chars_[byte].data(), sizes_[byte]}; }
  /// The code point that stands for `byte`.
  char32_t code_point(unsigned char byte) const { return points_[byte]; }
  /// The byte that code point `c` stands for, or -1 if `c` is not in the alphabet.
  int decode(char32_t c) const { return c < bytes_.size() ? bytes_[c] : -1; }

  /// `text`'s bytes, each replaced by its character.
  std::string encode(std::string_view text) const {
    std::string out;
    out.reserve(text.size() * 2);
    for (const char b : text) out.append(encode(static_cast<unsigned char>(b)));
    return out;
  }

 private:
  ByteAlphabet() {
    bytes_.fill(-1);
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : next++;
      points_[b] = c;
      bytes_[c] = b;
      std::string s;
      utf8::append(s, c);
      sizes_[b] = static_cast<std::uint8_t>(s.size());
      for (std::size_t i = 0; i < s.size(); ++i) chars_[b][i] = s[i];
    }
  }

  std::array<std::array<char, 4>, 256> chars_{};
  std::array<std::uint8_t, 256> sizes_{};
  std::array<char32_t, 256> points_{};
  std::array<int, 324> bytes_{};  // code points 0..323 cover the whole alphabet
};

}  // namespace remat::hub
