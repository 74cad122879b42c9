#pragma once
/// @file
/// tokenizer.json decoders: they turn the tokens of a list of ids back into text. Each step
/// rewrites the list of token strings, and the result is their concatenation. Supported:
/// `Sequence`, `ByteLevel` (byte alphabet back to bytes, invalid UTF-8 as U+FFFD), `Metaspace`,
/// `Replace`, `ByteFallback` (`<0xXX>` tokens back to bytes), `Fuse` and `Strip`; any other type
/// is an IoError naming it.

#include <memory>
#include <string>
#include <vector>

#include "remat/hub/byte_level.hpp"
#include "remat/hub/json_file.hpp"
#include "remat/hub/normalizers.hpp"
#include "remat/hub/pre_tokenizers.hpp"
#include "remat/hub/regex.hpp"
#include "remat/hub/utf8.hpp"

namespace remat::hub {

/// Rewrites the token strings of a decode.
class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Rewrites `tokens` in place (Hugging Face's decode_chain).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

namespace detail {

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    const ByteAlphabet& alphabet = ByteAlphabet::get();
    std::string bytes, token_bytes;
    for (const std::string& token : tokens) {
      // a token with a character outside the alphabet (an added token) is kept as it is
      token_bytes.clear();
      bool all = true;
      for (std::size_t at = 0; at < token.size() && all; at += utf8::char_length(token, at)) {
        const int b = alphabet.decode(utf8::decode(token, at));
        if (b < 0)
          all = false;
        else
          token_bytes += static_cast<char>(b);
      }
      bytes += all ? token_bytes : token;
    }
    tokens.assign(1, utf8::lossy(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (std::size_t at = 0; at < t.size();) {
        if (t.compare(at, replacement_.size(), replacement_) == 0) {
          if (i != 0 || scheme_ == PrependScheme::never) out += ' ';
          at += replacement_.size();
        } else {
          out += t[at++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    // an empty token stays empty: tokenizers' find_matches gives no match in an empty input,
    // even for a pattern that matches the empty string
    for (std::string& t : tokens)
      if (!t.empty()) t = ReplaceNormalizer::replace_all(pattern_, t, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;  // bytes of consecutive <0xXX> tokens
    const auto flush = [&] {
      if (pending.empty()) return;
      if (!utf8::first_invalid(pending)) {
        out.push_back(pending);
      } else {
        // Hugging Face: one U+FFFD per byte when the run is not valid UTF-8
        for (std::size_t i = 0; i < pending.size(); ++i) out.emplace_back(utf8::kReplacement);
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      if (const int b = byte_token(t); b >= 0) {
        pending += static_cast<char>(b);
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }

  /// The byte of a "<0xXX>" token, or -1. XX is read as tokenizers reads it, Rust's
  /// u8::from_str_radix(XX, 16): two hex digits, or '+' and one ("<0x+A>" is byte 0x0A; a '-'
  /// is no digit for an unsigned type).
  static int byte_token(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    const auto hex = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    const int hi = t[3] == '+' ? 0 : hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

/// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    const std::size_t n = content_.size();
    for (std::string& t : tokens) {
      std::size_t begin = 0, end = t.size();
      for (std::size_t i = 0; i < start_ && begin + n <= end && t.compare(begin, n, content_) == 0;
           ++i)
        begin += n;
      for (std::size_t i = 0; i < stop_ && end >= begin + n && t.compare(end - n, n, content_) == 0;
           ++i)
        end -= n;
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  std::size_t start_, stop_;
};

}  // namespace detail

/// The decoder a tokenizer.json `decoder` field describes (nullptr for null).
inline std::unique_ptr<Decoder> make_decoder(const JsonField& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j["type"].string();
  if (type == "Sequence") {
    j.require_keys({"type", "decoders"});
    std::vector<std::unique_ptr<Decoder>> steps;
    const JsonField list = j["decoders"];
    for (std::size_t i = 0; i < list.size(); ++i) {
      // tokenizers reads each member as a decoder: null is none of them
      if (list.at(i).is_null()) list.at(i).fail("expected a decoder, found null");
      steps.push_back(make_decoder(list.at(i)));
    }
    return std::make_unique<detail::SequenceDecoder>(std::move(steps));
  }
  if (type == "ByteLevel") {
    // its options only concern offsets: the decoder maps bytes back whatever they are. They are
    // read as tokenizers' serde reads them: add_prefix_space and trim_offsets booleans that must
    // be there, use_regex a boolean when there (true when absent)
    j.require_keys({"type", "add_prefix_space", "trim_offsets", "use_regex"});
    j["add_prefix_space"].boolean();
    j["trim_offsets"].boolean();
    if (j.has("use_regex")) j["use_regex"].boolean();
    return std::make_unique<detail::ByteLevelDecoder>();
  }
  if (type == "Metaspace") {
    const detail::MetaspaceOptions o = detail::read_metaspace(j);
    return std::make_unique<detail::MetaspaceDecoder>(o.replacement, o.scheme);
  }
  if (type == "Replace") {
    j.require_keys({"type", "pattern", "content"});
    return std::make_unique<detail::ReplaceDecoder>(detail::read_pattern(j["pattern"]),
                                                    j["content"].string());
  }
  if (type == "ByteFallback") {
    j.require_keys({"type"});
    return std::make_unique<detail::ByteFallbackDecoder>();
  }
  if (type == "Fuse") {
    j.require_keys({"type"});
    return std::make_unique<detail::FuseDecoder>();
  }
  if (type == "Strip") {
    j.require_keys({"type", "content", "start", "stop"});
    const std::string content = j["content"].string();
    if (content.empty() || utf8::first_invalid(content) ||
        utf8::char_length(content, 0) != content.size())
      j["content"].fail("expected one character");
    const std::int64_t start = j["start"].integer(), stop = j["stop"].integer();
    if (start < 0) j["start"].fail("expected a count >= 0");
    if (stop < 0) j["stop"].fail("expected a count >= 0");
    return std::make_unique<detail::StripDecoder>(content, static_cast<std::size_t>(start),
                                                  static_cast<std::size_t>(stop));
  }
  j["type"].fail(remat::detail::cat("decoder type '", type,
                                    "' is not supported (supported: Sequence, ByteLevel, "
                                    "Metaspace, Replace, ByteFallback, Fuse, Strip)"));
}

}  // namespace remat::hub
