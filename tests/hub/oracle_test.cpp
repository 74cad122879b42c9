// Checks remat's tokenizers id for id against Hugging Face's `tokenizers` library: reads the
// cases that oracle/make_cases.js wrote with the library (a generated corpus encoded and
// decoded with real tokenizer.json files and variants of them) and compares, for every
// tokenizer and text:
//  - encode(text) with the library's ids (special tokens added as its defaults add them);
//  - decode(ids) (special tokens skipped) and decode(ids, false) with the library's text;
//  - for a text that is not valid UTF-8: encode throws an ArgumentError naming the offset of the
//    first bad byte, and encode(utf8::lossy(text)) gives the ids the library gives for the text
//    as Node decodes it (each maximal invalid subpart replaced by U+FFFD).
//
//   hub_oracle_test CASES.json
//
// Prints the first mismatches in full and "N passed, M failed"; exits 1 on any failure or if
// there are no cases.
#include <remat/hub/tokenizer.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

std::string base64_decode(const std::string& in) {
  static const std::string alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  unsigned value = 0;
  int bits = 0;
  for (const char c : in) {
    if (c == '=') break;
    const std::size_t v = alphabet.find(c);
    if (v == std::string::npos) throw std::runtime_error("bad base64 in cases file");
    value = (value << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((value >> bits) & 0xFF);
    }
  }
  return out;
}

std::string show_ids(const std::vector<std::int32_t>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';  // not "," + std::string: GCC 12's -O3 warning (derive_policies.hpp)
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

std::string as_json(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

struct Tally {
  long passed = 0, failed = 0;
  void check(bool ok, const std::string& what) {
    if (ok) {
      ++passed;
      return;
    }
    if (++failed <= 20) std::fprintf(stderr, "MISMATCH %s\n", what.c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hub_oracle_test CASES.json\n");
    return 2;
  }
  try {
    const nlohmann::json cases = remat::hub::read_json_file(argv[1]);
    std::vector<std::string> texts;
    std::vector<bool> valid;
    for (const auto& t : cases.at("texts")) {
      texts.push_back(base64_decode(t.at("bytes").get<std::string>()));
      valid.push_back(t.at("valid").get<bool>());
    }
    Tally tally;
    for (const auto& entry : cases.at("tokenizers")) {
      const std::string name = entry.at("name").get<std::string>();
      // a folder: with its tokenizer_config.json, whose special tokens transformers adds
      const auto tok =
          entry.contains("folder")
              ? remat::hub::Tokenizer::from_folder(entry.at("folder").get<std::string>())
              : remat::hub::Tokenizer::from_file(entry.at("file").get<std::string>());
      const auto& rows = cases.at("results").at(name);
      if (rows.size() != texts.size()) throw std::runtime_error("cases file: row count mismatch");
      long invalid = 0;
      for (std::size_t i = 0; i < texts.size(); ++i) {
        const auto expected = rows[i].at("ids").get<std::vector<std::int32_t>>();
        const std::string where = name + " text " + std::to_string(i) + " " + as_json(texts[i]);
        std::string text = texts[i];
        if (!valid[i]) {
          ++invalid;
          bool threw = false;
          try {
            tok.encode(text);
          } catch (const remat::ArgumentError& e) {
            threw = std::string(e.what()).find("not valid UTF-8") != std::string::npos;
          }
          tally.check(threw, where + ": invalid UTF-8 did not raise an ArgumentError");
          text = remat::hub::utf8::lossy(text);
        }
        const auto ids = tok.encode(text);
        tally.check(ids == expected,
                    where + "\n  remat: " + show_ids(ids) + "\n  HF:    " + show_ids(expected));
        const std::string decoded = tok.decode(expected);
        tally.check(decoded == rows[i].at("decoded").get<std::string>(),
                    where + " decode\n  remat: " + as_json(decoded) +
                        "\n  HF:    " + as_json(rows[i].at("decoded").get<std::string>()));
        const std::string kept = tok.decode(expected, false);
        tally.check(kept == rows[i].at("decoded_keep").get<std::string>(),
                    where + " decode keeping special tokens\n  remat: " + as_json(kept) +
                        "\n  HF:    " + as_json(rows[i].at("decoded_keep").get<std::string>()));
      }
      std::fprintf(stderr, "%s: %zu texts (%ld not UTF-8) checked\n", name.c_str(), texts.size(),
                   invalid);
    }
    std::printf("%ld passed, %ld failed\n", tally.passed, tally.failed);
    return tally.failed == 0 && tally.passed > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hub_oracle_test: %s\n", e.what());
    return 1;
  }
}
