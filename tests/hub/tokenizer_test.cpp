// remat/hub's tokenizer on its own (the id-for-id comparison with Hugging Face's library is
// hub_oracle_test): BPE merging against a brute-force reference on generated vocabularies,
// the two merge formats, UTF-8 handling, the Oniguruma-to-PCRE2 rewriting, tokenizer_config.json,
// and every kind of bad input as an error naming the file, the field and the value.
#include <catch2/catch.hpp>

#include <remat/hub/tokenizer.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using nlohmann::json;
using remat::hub::Tokenizer;

/// A scratch folder for this test.
std::string tok_dir(const std::string& test) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("remat_tok_test_" + std::to_string(::getpid())) / test;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

/// A random BPE: an alphabet of single letters, then merges of random adjacent-able tokens.
struct RandomBpe {
  std::vector<std::string> tokens;                          // id -> token
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
};

RandomBpe random_bpe(std::mt19937& rng, int letters, int merge_count) {
  RandomBpe b;
  for (int i = 0; i < letters; ++i) b.tokens.push_back(std::string(1, static_cast<char>('a' + i)));
  while (static_cast<int>(b.merges.size()) < merge_count) {
    std::uniform_int_distribution<std::size_t> any(0, b.tokens.size() - 1);
    const std::string x = b.tokens[any(rng)], y = b.tokens[any(rng)];
    const bool known = std::any_of(b.merges.begin(), b.merges.end(),
                                   [&](const auto& m) { return m.first == x && m.second == y; });
    if (known) continue;
    b.merges.emplace_back(x, y);
    if (std::find(b.tokens.begin(), b.tokens.end(), x + y) == b.tokens.end())
      b.tokens.push_back(x + y);
  }
  return b;
}

json bpe_json(const RandomBpe& b, bool array_merges) {
  json vocab = json::object();
  for (std::size_t i = 0; i < b.tokens.size(); ++i) vocab[b.tokens[i]] = i;
  json merges = json::array();
  for (const auto& [x, y] : b.merges)
    merges.push_back(array_merges ? json::array({x, y}) : json(x + " " + y));
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", nullptr},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", merges}}}};
}

/// The definition of BPE, directly: merge the adjacent pair of lowest rank (leftmost on
/// ties) until no pair has a rank.
std::vector<std::int32_t> brute_force_bpe(const RandomBpe& b, const std::string& word) {
  std::vector<std::string> symbols;
  for (const char c : word) symbols.push_back(std::string(1, c));
  for (;;) {
    std::size_t best_rank = std::numeric_limits<std::size_t>::max(), best_at = 0;
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i)
      for (std::size_t r = 0; r < b.merges.size() && r < best_rank; ++r)
        if (b.merges[r].first == symbols[i] && b.merges[r].second == symbols[i + 1]) {
          best_rank = r;
          best_at = i;
        }
    if (best_rank == std::numeric_limits<std::size_t>::max()) break;
    symbols[best_at] += symbols[best_at + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  std::vector<std::int32_t> ids;
  for (const auto& s : symbols)
    ids.push_back(static_cast<std::int32_t>(std::find(b.tokens.begin(), b.tokens.end(), s) -
                                            b.tokens.begin()));
  return ids;
}

/// A small byte-level tokenizer (GPT-2 layout) over the 256-byte alphabet and a few merges.
json byte_level_json() {
  const auto& alphabet = remat::hub::ByteAlphabet::get();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[std::string(alphabet.encode(static_cast<unsigned char>(b)))] = b;
  const std::string g = std::string(alphabet.encode(' '));  // "Ġ"
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab[g + "w"] = 259;
  vocab["<|end|>"] = 260;
  return json{{"version", "1.0"},
              {"added_tokens", json::array({{{"id", 260},
                                             {"content", "<|end|>"},
                                             {"single_word", false},
                                             {"lstrip", false},
                                             {"rstrip", false},
                                             {"normalized", false},
                                             {"special", true}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "ByteLevel"},
                {"add_prefix_space", false},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"post_processor", nullptr},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"model",
               {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", json::array({"h e", "l l", "he ll", g + " w"})}}}};
}

/// An added_tokens entry: every flag false but those in `set`.
json added_token(int id, const std::string& content, std::initializer_list<const char*> set = {}) {
  json t = {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
            {"rstrip", false}, {"normalized", false}, {"special", false}};
  for (const char* flag : set) t[flag] = true;
  return t;
}

/// A TemplateProcessing post-processor putting `<|end|>` (260) before the text.
json end_first_processor() {
  return {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair", json::array()},
          {"special_tokens",
           {{"<|end|>", {{"id", "<|end|>"}, {"ids", {260}}, {"tokens", {"<|end|>"}}}}}}};
}

using Ids = std::vector<std::int32_t>;

/// The message of the remat error `build()` throws, of type E.
template <class E, class F>
std::string error_of(F&& build) {
  try {
    build();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no error thrown");
  return {};
}

}  // namespace

TEST_CASE("BPE merges as the brute-force definition does, in both merge formats", "[hub]") {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 30; ++trial) {
    const int letters = 2 + trial % 4;
    const RandomBpe b = random_bpe(rng, letters, 4 + trial);
    const auto as_strings = Tokenizer::from_json(bpe_json(b, false), "strings");
    const auto as_arrays = Tokenizer::from_json(bpe_json(b, true), "arrays");
    for (int w = 0; w < 40; ++w) {
      std::string word;
      const int length = 1 + static_cast<int>(rng() % 12);
      for (int i = 0; i < length; ++i) word += static_cast<char>('a' + rng() % letters);
      const auto expected = brute_force_bpe(b, word);
      INFO("trial " << trial << " word " << word);
      CHECK(as_strings.encode(word) == expected);
      CHECK(as_arrays.encode(word) == expected);
      // no decoder: the tokens joined by spaces, as Hugging Face does
      std::string joined;
      for (const auto id : expected) joined += (joined.empty() ? "" : " ") + b.tokens[id];
      CHECK(as_strings.decode(expected) == joined);
    }
  }
}

TEST_CASE("Byte-level BPE: GPT-2 pieces, added tokens before BPE, exact decode", "[hub]") {
  const auto tok = Tokenizer::from_json(byte_level_json(), "bytes");
  const auto& alphabet = remat::hub::ByteAlphabet::get();
  const auto id = [&](char c) { return static_cast<std::int32_t>(c); };
  // "hello world": pieces "hello" and " world"; "hell" + "o", then "Ġw" + "o" "r" "l" "d"
  CHECK(tok.encode("hello world") ==
        std::vector<std::int32_t>{258, id('o'), 259, id('o'), id('r'), id('l'), id('d')});
  CHECK(tok.encode("he<|end|>ll") == std::vector<std::int32_t>{256, 260, 257});
  // every byte round-trips, the special token is skipped unless asked for
  std::string all;
  for (int b = 1; b < 128; ++b) all += static_cast<char>(b);
  all += "é你🤗";
  CHECK(tok.decode(tok.encode(all)) == all);
  CHECK(tok.decode(tok.encode("a<|end|>b")) == "ab");
  CHECK(tok.decode(tok.encode("a<|end|>b"), false) == "a<|end|>b");
  // a lone byte that is not UTF-8 decodes to U+FFFD
  CHECK(tok.decode(std::vector<std::int32_t>{0xC3}) == "\xEF\xBF\xBD");
  CHECK(alphabet.decode(alphabet.code_point(' ')) == ' ');
  CHECK(tok.vocab_size() == 261);
  CHECK(tok.token_to_id("<|end|>") == 260);
  CHECK(tok.id_to_token(256) == "he");
}

TEST_CASE("UTF-8: invalid text is refused by encode, lossy decoding by maximal subparts", "[hub]") {
  using remat::hub::utf8::lossy;
  // Unicode's example of U+FFFD substitution (section 3.9): maximal subparts
  CHECK(lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64") ==
        "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
        "b\xEF\xBF\xBD"
        "c\xEF\xBF\xBD\xEF\xBF\xBD"
        "d");
  CHECK(lossy("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  CHECK(lossy("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  CHECK(lossy("ok \xF0\x9F\xA4\x97") == "ok \xF0\x9F\xA4\x97");
  const auto tok = Tokenizer::from_json(byte_level_json(), "bytes");
  const std::string message =
      error_of<remat::ArgumentError>([&] { tok.encode(std::string("caf\xC3(", 5)); });
  CHECK(message.find("not valid UTF-8 (byte 0xc3 at offset 3)") != std::string::npos);
}

TEST_CASE("Oniguruma patterns are rewritten where PCRE2 reads them otherwise", "[hub]") {
  using remat::hub::detail::onig_to_pcre2;
  const remat::hub::Regex space(R"(\s+)", false, "test");
  std::vector<std::pair<std::size_t, std::size_t>> found;
  // U+180E is not White_Space for Oniguruma (PCRE2's \s would take it); U+0085 is
  space.for_each_match(
      "a\xE1\xA0\x8E"
      "b\xC2\x85"
      "c",
      [&](std::size_t b, std::size_t e) { found.emplace_back(b, e); });
  CHECK(found == std::vector<std::pair<std::size_t, std::size_t>>{{5, 7}});
  CHECK(onig_to_pcre2(R"([^\s\p{L}])").find("\\x{3000}") != std::string::npos);
  CHECK_THROWS_AS(onig_to_pcre2(R"([\S])"), remat::IoError);
  // \h is a hexadecimal digit for Oniguruma
  found.clear();
  remat::hub::Regex(R"(\h+)", false, "test")
      .for_each_match("zz09af ", [&](std::size_t b, std::size_t e) { found.emplace_back(b, e); });
  CHECK(found == std::vector<std::pair<std::size_t, std::size_t>>{{2, 6}});
}

TEST_CASE("Oniguruma's \\w, and constructs PCRE2 reads otherwise are refused by name", "[hub]") {
  const auto matched = [](const char* pattern, std::string_view text) {
    std::string out;
    remat::hub::Regex(pattern, false, "test")
        .for_each_match(text, [&](std::size_t b, std::size_t e) {
          out += std::string(text.substr(b, e - b)) + "|";
        });
    return out;
  };
  // Oniguruma's word characters: ⓐ (Alphabetic, So) and ² (its Latin-1 table, outside a class
  // only) are, ① (No) and ZWJ (Join_Control) are not
  CHECK(matched(R"(\w+)", "x\u24D0\u00B2y \u2460\u200D") == "x\u24D0\u00B2y|");
  CHECK(matched(R"([\w]+)", "x\u24D0\u00B2y \u2460\u200D") == "x\u24D0|y|");
  CHECK(matched(R"(\W+)", "x\u24D0\u00B2y \u2460\u200D") == " \u2460\u200D|");
  // an isolated (?i) covers the rest of its group in Oniguruma: a(?i)b|c is a(?i:b|c)
  CHECK(matched("a(?i)b|c", "C aC AB aB") == "aC|aB|");
  // the contraction group of Llama 3, Qwen and GPT-4o loads and folds case
  CHECK(matched("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "it'S we'LL") == "'S|'LL|");
  for (const char* pattern :
       {R"(\b.)", R"(\B)",   "[[:alpha:]]+", "[a-z&&[^aeiou]]+", "[a[bc]]+",
        "(?m).+", "(?s).",   "(?x)a b",      R"(\pL+)",          R"(\pN)",
        "(?i)ss", "(?i:st)", "(?i)\u00DF",   "(?i)[a-z]",        R"((?i)\p{Lu})",
        "a{,3}",  "a{2}?",   "a{1,2}+",      R"(\xE9)",          R"(\K)",
        R"(\X)",  R"(\v)",   R"(\1)",        R"(\Qa\E)",         "(?~ab)"}) {
    INFO(pattern);
    const std::string message =
        error_of<remat::IoError>([&] { remat::hub::Regex(pattern, false, "file.json: p"); });
    CHECK(message.find("file.json: p: pattern '" + std::string(pattern) + "'") == 0);
    CHECK(message.find("is not supported") != std::string::npos);
  }
  // what the four real files' patterns and GPT-2's use still loads
  for (
      const char* pattern :
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?| ?[^\s\p{L}\p{N}]+[\r\n/]*)",
       R"(\p{N})",
       "(?<name>a)(?:b)(?=c)(?!d)(?<=e)(?<!f)(?>g)a{2}b{1,}?c{1,2}?[]x]\\.\\x41\\x{1F600}"})
    CHECK_NOTHROW(remat::hub::Regex(pattern, false, "test"));
}

TEST_CASE("Unicode properties, \\w and \\d match as Hugging Face's Unicode 16.0 data says",
          "[hub]") {
  const auto matched = [](const std::string& pattern, std::string_view text) {
    std::string out;
    remat::hub::Regex(pattern, false, "test")
        .for_each_match(text, [&](std::size_t b, std::size_t e) {
          out += std::string(text.substr(b, e - b)) + "|";
        });
    return out;
  };
  // characters assigned after Unicode 14.0 (PCRE2 10.42's data), their categories from the
  // Unicode 15.0, 15.1 and 16.0 standards: CJK Extension H U+31350 and I U+2EBF0 (Lo), Kawi
  // letter U+11F04 (Lo) and digit U+11F50 (Nd), Latin U+A7CB (Lu, 16.0) and U+A7CD (Ll), Garay
  // digit U+10D40 (Nd), a Symbols for Legacy Computing Supplement sign U+1CC00 (So), Tulu-Tigalari
  // vowel sign U+113B8 (Mc); and U+1171E, Ahom's medial ra, Mn until 15.1 and Mc in 16.0
  const std::string han = "\U00031350\U0002EBF0", kawi = "\U00011F04", latin = "\uA7CB\uA7CD";
  const std::string digits = "\U00011F50\U00010D40", symbol = "\U0001CC00", mark = "\U000113B8";
  const std::string text = "a" + han + kawi + latin + " 7" + digits + symbol + mark + "\U0001171E";
  CHECK(matched(R"(\p{L}+)", text) == "a" + han + kawi + latin + "|");
  CHECK(matched(R"(\p{Lo}+)", text) == han + kawi + "|");
  CHECK(matched(R"(\p{Lu}|\p{Ll})", latin) == "\uA7CB|\uA7CD|");
  CHECK(matched(R"(\p{N}+)", text) == "7" + digits + "|");
  CHECK(matched(R"(\d+)", text) == "7" + digits + "|");
  CHECK(matched(R"([\d]+)", text) == "7" + digits + "|");
  CHECK(matched(R"(\D+)", "7" + digits + symbol) == symbol + "|");
  CHECK(matched(R"(\p{So})", text) == symbol + "|");
  CHECK(matched(R"(\p{Mc}+)", text) == mark + "\U0001171E|");
  CHECK(matched(R"(\p{M}+)", text) == mark + "\U0001171E|");
  CHECK(matched(R"(\w+)", text) ==
        "a" + han + kawi + latin + "|7" + digits + "|" + mark + "\U0001171E|");
  // negated, inside a negated class, and under Oniguruma's other names for the same property
  CHECK(matched(R"(\P{L}+)", "a" + han + " 7") == " 7|");
  CHECK(matched(R"(\p{^L}+)", "a" + han + " 7") == " 7|");
  CHECK(matched(R"([^\s\p{L}\p{N}]+)", text) == symbol + mark + "\U0001171E|");
  CHECK(matched(R"(\p{Other_Letter}+)", text) == han + kawi + "|");
  CHECK(matched(R"(\p{decimal number}+)", text) == "7" + digits + "|");
  // what additions cannot express is refused by name: a property that lost code points (Mn
  // lost U+1171E), one without 16.0 data here (a script), a negated one inside a class
  for (const char* pattern : {R"(\p{Mn})", R"(\p{C})", R"(\p{Cn})", R"(\p{Han})", R"([\P{L}])",
                              R"([^\p{^N}])", R"([\Da])", R"(\p{Word})"}) {
    INFO(pattern);
    const std::string message =
        error_of<remat::IoError>([&] { remat::hub::Regex(pattern, false, "file.json: p"); });
    CHECK(message.find("file.json: p: pattern '" + std::string(pattern) + "'") == 0);
    CHECK(message.find("is not supported") != std::string::npos);
  }
  // a negated property nothing was added to is itself, inside a class too
  CHECK(matched(R"([\P{Zs}]+)", "a b") == "a|b|");
}

TEST_CASE("Unicode normalization uses Hugging Face's Unicode 9.0 data", "[hub]") {
  using remat::hub::normalize;
  using remat::hub::UnicodeForm;
  // U+08D4 (9.0, class 230) is reordered after U+0316 (class 220); U+1DF6 (10.0) and U+09FE
  // (11.0) are unassigned to Hugging Face: class 0, left where they are
  CHECK(normalize("a\u08D4\u0316", UnicodeForm::nfd) == "a\u0316\u08D4");
  CHECK(normalize("a\u1DF6\u0316", UnicodeForm::nfd) == "a\u1DF6\u0316");
  CHECK(normalize("a\u09FE\u0316", UnicodeForm::nfkc) == "a\u09FE\u0316");
  // a later mark does not block composition around it, nor compose itself
  CHECK(normalize("e\u0301\u1DFAe\u0301", UnicodeForm::nfc) == "\u00E9\u1DFA\u00E9");
  // compatibility characters: U+1F23B (9.0) decomposes, U+32FF (12.1) and U+1FBF0 (13.0) do not
  CHECK(normalize("\U0001F23B", UnicodeForm::nfkc) == "\u914D");
  CHECK(normalize("\u32FF\U0001FBF0", UnicodeForm::nfkd) == "\u32FF\U0001FBF0");
  // Dives Akuru vowel sign O (13.0) is not composed from its parts
  CHECK(normalize("\U00011935\U00011930", UnicodeForm::nfc) == "\U00011935\U00011930");
}

TEST_CASE("Empty pieces are dropped before pre-tokenizing, as Hugging Face does", "[hub]") {
  json j = byte_level_json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  j["added_tokens"] = json::array();
  // the empty text gives no piece, so no prefix space token
  CHECK(Tokenizer::from_json(j, "t").encode("").empty());
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}};
  const auto tok = Tokenizer::from_json(j, "t");
  CHECK(tok.encode("   ").empty());
  CHECK(tok.encode("\n\u00A0").empty());
  // Metaspace: a piece the normalizer emptied gets no "▁"
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\u2581"},
                        {"prepend_scheme", "always"},
                        {"split", true}};
  j["model"]["vocab"]["\u2581"] = 261;
  CHECK(Tokenizer::from_json(j, "t").encode(" ").empty());
}

TEST_CASE("Metaspace's \"first\" scheme is refused after a normalizer that moves the start",
          "[hub]") {
  json j = byte_level_json();
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\u2581"},
                        {"prepend_scheme", "first"},
                        {"split", true}};
  CHECK_NOTHROW(Tokenizer::from_json(j, "t"));  // no normalizer: Mistral's layout
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}};
  CHECK_NOTHROW(Tokenizer::from_json(j, "t"));
  for (const json& normalizer :
       {json{{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}},
        json{{"type", "NFKC"}},
        json{{"type", "Sequence"},
             {"normalizers",
              json::array(
                  {{{"type", "Replace"}, {"pattern", {{"String", "#"}}}, {"content", ""}}})}}}) {
    j["normalizer"] = normalizer;
    const std::string message = error_of<remat::IoError>([&] { Tokenizer::from_json(j, "t"); });
    CHECK(message.find("t: pre_tokenizer: Metaspace with prepend_scheme \"first\" is not "
                       "supported after normalizer {\"") == 0);
  }
}

TEST_CASE("An added token that normalizes to nothing is refused", "[hub]") {
  json j = byte_level_json();
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}};
  j["added_tokens"].push_back({{"id", 261},
                               {"content", "  "},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", true},
                               {"special", false}});
  const std::string message = error_of<remat::IoError>([&] { Tokenizer::from_json(j, "t"); });
  CHECK(message.find("t: added_tokens[1].content: added token '  ' is empty once normalized") == 0);
}

// The ids of the next three tests are those tokenizers 0.23 (its Node binding) gives for the same
// tokenizer.json.
TEST_CASE(
    "lstrip does not take back whitespace an rstrip took: a whitespace token matched there is "
    "no token, or an error where Hugging Face panics",
    "[hub]") {
  json j = byte_level_json();
  j["added_tokens"].push_back(added_token(261, " ", {"lstrip", "rstrip"}));
  const auto both = Tokenizer::from_json(j, "t");
  // the first " " takes the whole run; the next ones match inside it and are empty (were tokens)
  CHECK(both.encode("a   b") == Ids{97, 261, 98});
  CHECK(both.encode("a   b  c") == Ids{97, 261, 98, 261, 99});
  CHECK(both.encode("a \t\n b") == Ids{97, 261, 98});
  CHECK(both.encode("   ") == Ids{261});

  j = byte_level_json();
  j["added_tokens"].push_back(added_token(261, " ", {"rstrip"}));
  j["added_tokens"].push_back(added_token(262, "\t", {"lstrip"}));
  const auto apart = Tokenizer::from_json(j, "t");
  CHECK(apart.encode("\t \t") == Ids{262, 261});  // " " took the last tab, which is empty
  CHECK(apart.encode("a \tb") == Ids{97, 261, 98});
  // " " takes " \t\t": the first tab would start at byte 3, after its end (byte 2)
  CHECK(error_of<remat::ArgumentError>([&] { apart.encode(" \t\t"); }) ==
        "hub::Tokenizer::encode: added token \"\\t\" (id 262, lstrip) matched at bytes 1 to 2 of "
        "the text, inside the whitespace that added token \" \" (id 261) took with rstrip up to "
        "byte 3: Hugging Face's tokenizers fails on this text (it panics: \"AddedVocabulary bad "
        "split\")");
  CHECK(error_of<remat::ArgumentError>([&] {
          apart.encode("a\t \t\tb");
        }).find("matched at bytes 3 to 4 of the text") != std::string::npos);
  // the same in the normalized pass, after a token of the raw one
  j["added_tokens"][1]["normalized"] = true;
  j["added_tokens"][2]["normalized"] = true;
  CHECK(error_of<remat::ArgumentError>([&] {
          Tokenizer::from_json(j, "t").encode("x<|end|> \t\t");
        }).find("matched at bytes 1 to 2 of a normalized piece of the text") != std::string::npos);
}

TEST_CASE("Two normalized added tokens of one normalized form are refused", "[hub]") {
  json j = byte_level_json();
  j["normalizer"] = {{"type", "NFKC"}};
  j["added_tokens"].push_back(added_token(261, "\uFB01x", {"normalized"}));
  j["added_tokens"].push_back(added_token(262, "fix"));
  // apart, the raw "fix" first, then " ﬁx" normalized to " fix"
  CHECK(Tokenizer::from_json(j, "t").encode("fix \uFB01x") == Ids{262, 32, 261});
  // both normalized: tokenizers matches "fix" as 261 in one process and 262 in another
  j["added_tokens"][2]["normalized"] = true;
  CHECK(error_of<remat::IoError>([&] { Tokenizer::from_json(j, "t"); }) ==
        "t: added_tokens[2].content: added tokens '\uFB01x' (id 261) and 'fix' (id 262) both "
        "normalize to 'fix' (normalized: true): Hugging Face's tokenizers would match either one, "
        "a different one from process to process");
}

TEST_CASE("The empty text is no piece: a normalizer that would make something of it never runs",
          "[hub]") {
  json j = byte_level_json();
  // without raw added tokens, nothing else drops the empty text before the normalizer
  j["added_tokens"] = json::array();
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "x*"}}}, {"content", "Z"}};
  j["post_processor"] = end_first_processor();
  const auto tok = Tokenizer::from_json(j, "t");
  CHECK(tok.encode("") == Ids{260});  // was {260, 90}: "Z"
  CHECK(tok.encode("", false).empty());
  CHECK(tok.encode("xx") == Ids{260, 90});
  // empty matches elsewhere get the content, but not where a match just ended, as tokenizers
  // gives (its Node binding: "xab" -> "ZaZbZ")
  CHECK(tok.encode("xab") == Ids{260, 'Z', 'a', 'Z', 'b', 'Z'});
  // an empty match at the start of a non-empty piece: tokenizers panics
  CHECK(error_of<remat::ArgumentError>([&] { tok.encode("ab"); }) ==
        "hub::Tokenizer: the Replace normalizer's pattern 'x*' matches the empty string at the "
        "start of \"ab\": Hugging Face's tokenizers fails on this text (it panics: index out of "
        "bounds)");
}

TEST_CASE(
    "What tokenizers refuses to load is refused: null in a Sequence, a pattern with both keys, "
    "an added token without a flag, merges in two formats",
    "[hub]") {
  const auto fails_with = [](const json& j, const std::string& expected) {
    const std::string message = error_of<remat::IoError>([&] { Tokenizer::from_json(j, "t"); });
    INFO(message);
    CHECK(message.find(expected) == 0);
  };
  const json good = byte_level_json();
  json j = good;
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({nullptr, {{"type", "NFC"}}})}};
  fails_with(j, "t: normalizer.normalizers[0]: expected a normalizer, found null");
  j = good;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({good["pre_tokenizer"], nullptr})}};
  fails_with(j, "t: pre_tokenizer.pretokenizers[1]: expected a pre-tokenizer, found null");
  j = good;
  j["post_processor"] = {{"type", "Sequence"}, {"processors", json::array({nullptr})}};
  fails_with(j, "t: post_processor.processors[0]: expected a post-processor, found null");

  const json both = {{"String", "a"}, {"Regex", "b"}};
  j = good;
  j["normalizer"] = {{"type", "Replace"}, {"pattern", both}, {"content", "c"}};
  fails_with(j,
             "t: normalizer.pattern: expected {\"String\": ...} or {\"Regex\": ...}, found "
             "both: {\"Regex\":\"b\",\"String\":\"a\"}");
  j = good;
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", both}, {"behavior", "Isolated"}, {"invert", false}};
  fails_with(
      j, "t: pre_tokenizer.pattern: expected {\"String\": ...} or {\"Regex\": ...}, found both");

  // tokenizers' serde gives no field of an added token a default (was: false, normalized !special)
  for (const char* field :
       {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}) {
    j = good;
    j["added_tokens"][0].erase(field);
    fails_with(j, std::string("t: added_tokens[0]: missing field '") + field + "'");
  }
  j = good;
  j["added_tokens"][0]["lstrip"] = nullptr;
  fails_with(j, "t: added_tokens[0].lstrip: expected true or false, found null");

  // tokenizers reads the merges as all strings or all pairs
  j = good;
  j["model"]["merges"].push_back(json::array({"h", "e"}));
  fails_with(j,
             "t: model.merges[4]: merge [\"h\",\"e\"] is a pair but merges[0] is a string: the "
             "list must be all \"a b\" strings or all [\"a\", \"b\"] pairs");
  j = good;
  j["model"]["merges"] = json::array({json::array({"h", "e"}), "l l"});
  fails_with(j, "t: model.merges[1]: merge \"l l\" is a string but merges[0] is a pair");
}

TEST_CASE("tokenizer_config.json: special tokens and the chat template", "[hub]") {
  const std::string dir = tok_dir("config");
  write_file(dir + "/tokenizer.json", byte_level_json().dump());
  write_file(dir + "/tokenizer_config.json",
             json{{"bos_token", {{"content", "he"}, {"__type", "AddedToken"}}},
                  {"eos_token", "<|end|>"},
                  {"pad_token", nullptr},
                  {"add_bos_token", true},
                  {"chat_template", json::array({{{"name", "default"}, {"template", "{{ x }}"}},
                                                 {{"name", "tool_use"}, {"template", "T"}}})},
                  {"tokenizer_class", "PreTrainedTokenizerFast"}}
                 .dump());
  const auto tok = Tokenizer::from_folder(dir);
  CHECK(tok.bos_id() == 256);
  CHECK(tok.eos_id() == 260);
  CHECK(!tok.pad_id());
  CHECK(tok.config().add_bos_token == true);
  CHECK(tok.config().chat_template == "{{ x }}");
  CHECK(tok.config().chat_templates.at("tool_use") == "T");

  // transformers 4.47 on saves the template as chat_template.jinja and reads it first
  const std::string jinja = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}";
  write_file(dir + "/chat_template.jinja", jinja);
  CHECK(Tokenizer::from_folder(dir).config().chat_template == jinja);
  std::filesystem::remove(dir + "/chat_template.jinja");

  // a special token outside the vocabulary: transformers would give it a new id, so a text
  // holding it is refused
  write_file(dir + "/tokenizer_config.json", json{{"eos_token", "<|nope|>"}}.dump());
  const auto nope = Tokenizer::from_folder(dir);
  CHECK(!nope.eos_id());
  CHECK(nope.encode("he<|nope") == Ids{256, '<', '|', 'n', 'o', 'p', 'e'});
  CHECK(error_of<remat::ArgumentError>([&] { nope.encode("he<|nope|>"); }) ==
        "hub::Tokenizer::encode: the text holds '<|nope|>' (" + dir +
            "/tokenizer_config.json: eos_token), a special token that tokenizer.json's "
            "vocabulary lacks: transformers would add it with a new id, past the model's "
            "embeddings");
}

/// A folder with byte_level_json()'s tokenizer.json (<|end|> an added special token, "he" a
/// vocabulary token only) and `config` as tokenizer_config.json; from_folder's error, or "" when
/// it loads.
struct ConfigFolder {
  std::string dir;
  explicit ConfigFolder(const std::string& name, const json& tokenizer = byte_level_json())
      : dir(tok_dir(name)) {
    write_file(dir + "/tokenizer.json", tokenizer.dump());
  }
  /// The folder's tokenizer with `config` as tokenizer_config.json.
  Tokenizer load(const json& config) const {
    write_file(dir + "/tokenizer_config.json", config.dump());
    return Tokenizer::from_folder(dir);
  }
  std::string load_error(const json& config) const {
    try {
      load(config);
    } catch (const remat::IoError& e) {
      return e.what();
    }
    return "";
  }
};

TEST_CASE("tokenizer_config.json: split_special_tokens true is refused", "[hub]") {
  const ConfigFolder folder("split");
  CHECK(folder.load_error({{"split_special_tokens", false}}).empty());
  CHECK(folder.load_error({{"split_special_tokens", true}}) ==
        folder.dir +
            "/tokenizer_config.json: split_special_tokens: true is not supported: transformers "
            "then encodes the special tokens' text as plain text, where remat matches it as the "
            "tokens (supported: false or absent)");
  // transformers hands it to tokenizers' encode_special_tokens, which takes no None
  CHECK(folder.load_error({{"split_special_tokens", nullptr}})
            .find("split_special_tokens: expected true or false, found null") != std::string::npos);
}

TEST_CASE(
    "tokenizer_config.json: tokens transformers would add or rewrite are refused unless "
    "tokenizer.json has them as they are",
    "[hub]") {
  const ConfigFolder folder("declared");
  const std::string config_file = folder.dir + "/tokenizer_config.json";
  const json end = {{"content", "<|end|>"}, {"single_word", false}, {"lstrip", false},
                    {"rstrip", false},      {"normalized", false},  {"special", true}};
  CHECK(folder.load_error({{"added_tokens_decoder", {{"260", end}}}}).empty());
  json typed = end;  // the "__type" key transformers before 4.34 wrote in AddedToken objects
  typed["__type"] = "AddedToken";
  CHECK(folder.load_error({{"added_tokens_decoder", {{"260", typed}}}}).empty());
  json other = end;
  other["lstrip"] = true;
  CHECK(folder.load_error({{"added_tokens_decoder", {{"260", other}}}}) ==
        config_file +
            ": added_tokens_decoder.260: added token '<|end|>' has {single_word: false, lstrip: "
            "true, rstrip: false, normalized: false, special: true} here but {single_word: false, "
            "lstrip: false, rstrip: false, normalized: false, special: true} in tokenizer.json: "
            "transformers would rewrite them, remat reads tokenizer.json's");
  // flags left out are Python's AddedToken defaults: special false, then normalized true
  CHECK(folder.load_error({{"added_tokens_decoder", {{"260", {{"content", "<|end|>"}}}}}})
            .find("has {single_word: false, lstrip: false, rstrip: false, normalized: true, "
                  "special: false} here") != std::string::npos);
  CHECK(folder.load_error({{"added_tokens_decoder", {{"261", end}}}}) ==
        config_file +
            ": added_tokens_decoder.261: token '<|end|>' has id 260 in tokenizer.json, not 261");
  other = end;
  other["content"] = "<|new|>";  // outside the vocabulary: a text holding it is refused
  CHECK(folder.load_error({{"added_tokens_decoder", {{"261", other}}}}).empty());
  CHECK(folder.load_error({{"added_tokens_decoder", {{"x", end}}}})
            .find("added_tokens_decoder.x: key 'x' is not an id") != std::string::npos);

  // the special-token lists: an added token, or a vocabulary token made one (the next test);
  // an object, with its flags
  CHECK(folder.load_error({{"additional_special_tokens", {"<|end|>"}}}).empty());
  CHECK(folder.load_error({{"additional_special_tokens", {"<|end|>", "<|new|>"}}}).empty());
  CHECK(error_of<remat::ArgumentError>([&] {
          Tokenizer::from_folder(folder.dir).encode("<|new|>");
        }).find("the text holds '<|new|>' (" + config_file + ": additional_special_tokens[1])") !=
        std::string::npos);
  CHECK(folder.load_error({{"additional_special_tokens", {{{"content", "<|end|>"}}}}}).empty());
  CHECK(
      folder
          .load_error({{"additional_special_tokens", {{{"content", "<|end|>"}, {"rstrip", true}}}}})
          .find("additional_special_tokens[0]: added token '<|end|>' has {single_word: false, "
                "lstrip: false, rstrip: true,") != std::string::npos);
  // extra_special_tokens: transformers 4's object of names, or 5's list
  CHECK(folder.load_error({{"extra_special_tokens", {{"end_token", "<|end|>"}}}}).empty());
  CHECK(folder.load_error({{"extra_special_tokens", {{"image_token", "<image>"}}}}).empty());
  CHECK(error_of<remat::ArgumentError>([&] {
          Tokenizer::from_folder(folder.dir).encode("a<image>");
        }).find("(" + config_file + ": extra_special_tokens.image_token)") != std::string::npos);
  CHECK(folder.load_error({{"extra_special_tokens", {"<|end|>", "<image>"}}}).empty());
  CHECK(folder.load_error({{"extra_special_tokens", 5}})
            .find("extra_special_tokens: expected a list of tokens or an object of name: token, "
                  "found 5") != std::string::npos);
}

TEST_CASE(
    "tokenizer_config.json: a vocabulary token named special becomes an added token, as "
    "transformers adds it",
    "[hub]") {
  const ConfigFolder folder("adopted");
  using Ids = std::vector<std::int32_t>;
  // "hello": he + ll merge into hell (258), then o; "ll" (257) named special is matched first
  CHECK(folder.load(json::object()).encode("hello") == Ids{258, 'o'});
  const auto bos = folder.load({{"bos_token", "ll"}});
  CHECK(bos.encode("hello") == Ids{256, 257, 'o'});
  CHECK(bos.bos_id() == 257);
  CHECK(bos.decode(Ids{256, 257, 'o'}) == "heo");  // special: skipped
  CHECK(bos.decode(Ids{256, 257, 'o'}, false) == "hello");
  CHECK(bos.added_tokens().find(257)->normalized == false);
  // an added_tokens_decoder entry that is not special: matched, and kept by decode
  const json plain = {{"content", "ll"}, {"single_word", false}, {"lstrip", true},
                      {"rstrip", false}, {"normalized", false},  {"special", false}};
  const auto decoder = folder.load({{"added_tokens_decoder", {{"257", plain}}}});
  CHECK(decoder.encode("he ll") == Ids{256, 257});  // lstrip took the space
  CHECK(decoder.decode(Ids{256, 257}) == "hell");
  // ... unless a special-token field names it too
  CHECK(folder.load({{"added_tokens_decoder", {{"257", plain}}}, {"mask_token", "ll"}})
            .added_tokens()
            .find(257)
            ->special);
  CHECK(folder.load_error({{"added_tokens_decoder", {{"258", plain}}}}) ==
        folder.dir +
            "/tokenizer_config.json: added_tokens_decoder.258: token 'll' has id 257 in "
            "tokenizer.json, not 258");
  // given twice with other flags: which transformers keeps is not defined
  json lstrip = {{"content", "ll"}, {"lstrip", true}};
  CHECK(folder.load_error({{"additional_special_tokens", {lstrip, "ll"}}}).empty());
  CHECK(folder.load_error({{"additional_special_tokens", {lstrip, {{"content", "ll"}}}}}) ==
        folder.dir +
            "/tokenizer_config.json: additional_special_tokens[1]: 'll' is given {single_word: "
            "false, lstrip: false, rstrip: false, normalized: false, special: true} here and "
            "{single_word: false, lstrip: true, rstrip: false, normalized: false, special: true} "
            "before: which transformers keeps is not defined");
}

TEST_CASE(
    "tokenizer_config.json: a named special token of tokenizer.json's becomes special; flags "
    "transformers would rewrite are refused",
    "[hub]") {
  json tokenizer = byte_level_json();
  tokenizer["added_tokens"].push_back(added_token(261, "zz"));  // not special
  tokenizer["added_tokens"].push_back(added_token(262, "<|sp|>", {"lstrip", "special"}));
  const ConfigFolder folder("named_special", tokenizer);
  CHECK(folder.load(json::object()).decode(Ids{261, 'a'}) == "zza");
  // named: transformers adds it again as special, so decode skips it
  CHECK(folder.load({{"pad_token", "zz"}}).decode(Ids{261, 'a'}) == "a");
  // an object: its flags, special, normalized filled in last (not special: false)
  CHECK(
      folder.load({{"pad_token", {{"content", "zz"}, {"special", false}}}}).decode(Ids{261, 'a'}) ==
      "a");
  CHECK(folder.load_error({{"pad_token", {{"content", "zz"}, {"rstrip", true}}}}) ==
        folder.dir +
            "/tokenizer_config.json: pad_token: added token 'zz' has {single_word: false, lstrip: "
            "false, rstrip: true, normalized: false, special: true} here but {single_word: false, "
            "lstrip: false, rstrip: false, normalized: false, special: false} in tokenizer.json: "
            "transformers would rewrite them, remat reads tokenizer.json's");
  // ... unless added_tokens_decoder gives the token: transformers takes the decoder's
  const json zz = {{"content", "zz"}, {"single_word", false}, {"lstrip", false},
                   {"rstrip", false}, {"normalized", false},  {"special", false}};
  CHECK(folder
            .load_error({{"added_tokens_decoder", {{"261", zz}}},
                         {"pad_token", {{"content", "zz"}, {"rstrip", true}}}})
            .empty());
  // a listed string that is not special: transformers 4 keeps it so, 5 makes it special
  CHECK(folder.load_error({{"additional_special_tokens", {"zz"}}})
            .find("additional_special_tokens[0]: 'zz' is an added token that tokenizer.json does "
                  "not mark special: transformers 4 keeps it so, 5 makes it special") !=
        std::string::npos);
  // a named string with flags: transformers 5 rewrites them to false, 4 keeps them
  CHECK(folder.load_error({{"pad_token", "<|sp|>"}})
            .find("pad_token: added token '<|sp|>' has {single_word: false, lstrip: true, rstrip: "
                  "false, normalized: false, special: true} in tokenizer.json, which transformers "
                  "5 rewrites to false and 4 keeps") != std::string::npos);
}

TEST_CASE(
    "tokenizer_config.json: add_bos_token and add_eos_token frame a text as transformers 4 and 5 "
    "agree, with LlamaTokenizer's defaults (bos <s>, eos </s>, unk <unk>, add_bos_token true)",
    "[hub]") {
  json with_bos = byte_level_json();
  with_bos["post_processor"] = end_first_processor();  // <|end|> (260) first
  const ConfigFolder folder("llama_class", with_bos);
  const json tokens = {{"bos_token", "<|end|>"}, {"eos_token", "<|end|>"}, {"unk_token", nullptr}};
  // another class: tokenizer.json's post-processor, rebuilt when either key is given (a null
  // is false), as transformers 5 does
  json other = tokens;
  other["tokenizer_class"] = "PreTrainedTokenizerFast";
  CHECK(folder.load(other).encode_for_model("he") == Ids{260, 256});
  other["add_eos_token"] = nullptr;
  CHECK(folder.load(other).encode_for_model("he") == Ids{256});
  other["add_eos_token"] = true;
  CHECK(folder.load(other).encode_for_model("he") == Ids{256, 260});
  other["eos_token"] = nullptr;  // 5 drops the flag whose token is null
  CHECK(folder.load(other).encode_for_model("he") == Ids{256});
  // LlamaTokenizerFast: 4 rebuilds it always, bos first by default; 5 as for any class. Where
  // both give the same ids, they are taken
  for (const char* name : {"LlamaTokenizer", "LlamaTokenizerFast"}) {
    json llama = tokens;
    llama["tokenizer_class"] = name;
    CHECK(folder.load(llama).encode_for_model("he") == Ids{260, 256});
    llama["add_bos_token"] = true;
    llama["add_eos_token"] = true;
    CHECK(folder.load(llama).encode_for_model("he") == Ids{260, 256, 260});
    llama["add_bos_token"] = nullptr;
    CHECK(folder.load(llama).encode_for_model("he") == Ids{256, 260});
  }
  json llama = tokens;
  llama["tokenizer_class"] = "LlamaTokenizerFast";
  llama["add_eos_token"] = true;  // 4: bos by default; 5: no bos, the key being absent
  CHECK(folder.load_error(llama) ==
        folder.dir +
            "/tokenizer_config.json: transformers 4 (LlamaTokenizerFast) and 5 frame a text with "
            "other special tokens here: 4 gives [260] text [260], 5 gives text [260]; set "
            "add_bos_token and add_eos_token, which both then follow");
  const ConfigFolder bare("llama_bare");  // no post-processor: 4 adds bos, 5 nothing
  CHECK(bare.load_error({{"tokenizer_class", "LlamaTokenizer"},
                         {"bos_token", "<|end|>"},
                         {"unk_token", nullptr}})
            .find("4 gives [260] text, 5 gives text;") != std::string::npos);
  // bos absent is "<s>", which this vocabulary lacks: transformers would give it a new id
  CHECK(folder.load_error({{"tokenizer_class", "LlamaTokenizer"}, {"unk_token", nullptr}}) ==
        folder.dir +
            "/tokenizer_config.json: transformers 4 frames a text with '<s>', which is not a "
            "token of tokenizer.json: it would add it with a new id, past the model's embeddings");
  // unk absent is "<unk>", also lacking: only a text holding it is refused
  const auto unk = folder.load({{"tokenizer_class", "LlamaTokenizer"}, {"bos_token", "<|end|>"}});
  CHECK(unk.encode_for_model("he") == Ids{260, 256});
  CHECK(error_of<remat::ArgumentError>([&] { unk.encode("<unk>"); })
            .find("the text holds '<unk>' (" + folder.dir +
                  "/tokenizer_config.json: unk_token (absent: LlamaTokenizerFast's default))") !=
        std::string::npos);
  // add_bos_token true (its default) without a bos token: transformers 4 raises
  CHECK(folder.load_error({{"tokenizer_class", "LlamaTokenizerFast"},
                           {"bos_token", nullptr},
                           {"eos_token", "<|end|>"},
                           {"unk_token", nullptr}}) ==
        folder.dir +
            "/tokenizer_config.json: add_bos_token is true (or absent: LlamaTokenizerFast's "
            "default) but bos_token is null: transformers 4 refuses this, 5 adds no bos; set "
            "add_bos_token to false");
}

TEST_CASE(
    "config.json: with no tokenizer_class in tokenizer_config.json, the class is config.json's, "
    "else its model_type's as transformers 4 takes it",
    "[hub]") {
  json with_bos = byte_level_json();
  with_bos["post_processor"] = end_first_processor();  // <|end|> (260) first
  const ConfigFolder folder("model_class", with_bos);
  const std::string model_config = folder.dir + "/config.json";
  const auto load = [&](const json& model, const json& config) {
    write_file(model_config, model.dump());
    return folder.load(config);
  };
  const json tokens = {{"bos_token", "<|end|>"}, {"eos_token", "<|end|>"}, {"unk_token", nullptr}};
  json eos = tokens;
  eos["add_eos_token"] = true;  // 4 frames as LlamaTokenizerFast (bos too), 5 eos only
  // llama and mistral: LlamaTokenizerFast in 4 (TokenizersBackend in 5), whose framings must
  // agree
  for (const char* type : {"llama", "mistral"}) {
    CHECK(load({{"model_type", type}}, tokens).encode_for_model("he") == Ids{260, 256});
    write_file(model_config, json{{"model_type", type}}.dump());
    CHECK(folder.load_error(eos).find("transformers 4 (LlamaTokenizerFast) and 5 frame a text "
                                      "with other special tokens here") != std::string::npos);
  }
  // qwen2, qwen3 and gpt2: classes that keep tokenizer.json's post-processor; so does a
  // config.json without model_type
  for (const json& model : {json{{"model_type", "qwen2"}}, json{{"model_type", "qwen3"}},
                            json{{"model_type", "gpt2"}}, json::object()})
    CHECK(load(model, eos).encode_for_model("he") == Ids{256, 260});
  // config.json's tokenizer_class comes first, tokenizer_config.json's before it
  CHECK(folder.load_error(eos).empty());
  write_file(model_config,
             json{{"model_type", "qwen2"}, {"tokenizer_class", "LlamaTokenizer"}}.dump());
  CHECK(!folder.load_error(eos).empty());
  json named = eos;
  named["tokenizer_class"] = "PreTrainedTokenizerFast";
  CHECK(folder.load_error(named).empty());
  // a model type whose tokenizer class remat does not know is refused
  write_file(model_config, json{{"model_type", "gemma"}}.dump());
  CHECK(folder.load_error(tokens) ==
        model_config +
            ": model_type: 'gemma': tokenizer_config.json names no tokenizer_class, so "
            "transformers takes this model type's, which remat does not know (known: llama, "
            "mistral, qwen2, qwen3, gpt2); name the class in tokenizer_config.json");
  CHECK(folder.load_error(named).empty());
  // without tokenizer_config.json: LlamaTokenizerFast with its defaults, bos '<s>', which this
  // vocabulary lacks (transformers would add it with a new id)
  std::filesystem::remove(folder.dir + "/tokenizer_config.json");
  write_file(model_config, json{{"model_type", "llama"}}.dump());
  CHECK(error_of<remat::IoError>([&] { Tokenizer::from_folder(folder.dir); }) ==
        folder.dir +
            "/tokenizer_config.json (absent; the class from config.json): transformers 4 "
            "frames a text with '<s>', which is "
            "not a token of tokenizer.json: it would add it with a new id, past the model's "
            "embeddings");
  write_file(model_config, json{{"model_type", "qwen3"}}.dump());
  CHECK(Tokenizer::from_folder(folder.dir).encode_for_model("he") == Ids{260, 256});
  std::filesystem::remove(model_config);
}

TEST_CASE(
    "tokenizer_class: each known class brings transformers 4's defaults; another class is "
    "refused",
    "[hub]") {
  json prefix_space = byte_level_json();
  prefix_space["pre_tokenizer"]["add_prefix_space"] = true;
  const ConfigFolder folder("classes", prefix_space);
  const std::string config_file = folder.dir + "/tokenizer_config.json";
  CHECK(folder.load_error({{"tokenizer_class", "GemmaTokenizerFast"}}) ==
        config_file +
            ": tokenizer_class: 'GemmaTokenizerFast' is a class whose rules remat does not know "
            "(known: PreTrainedTokenizerFast, TokenizersBackend, LlamaTokenizer, "
            "CodeLlamaTokenizer, Qwen2Tokenizer, GPT2Tokenizer, with or without Fast)");
  // ... also when config.json names it
  write_file(folder.dir + "/config.json", json{{"tokenizer_class", "GemmaTokenizer"}}.dump());
  CHECK(folder.load_error(json::object())
            .find(folder.dir + "/config.json: tokenizer_class: "
                               "'GemmaTokenizer' is a class") == 0);
  std::filesystem::remove(folder.dir + "/config.json");
  // GPT2Tokenizer: add_prefix_space absent is false, which would rebuild this ByteLevel
  for (const char* name : {"GPT2Tokenizer", "GPT2TokenizerFast"})
    CHECK(folder.load_error({{"tokenizer_class", name}}) ==
          config_file + ": add_prefix_space is absent, which " + name +
              " takes as false, but tokenizer.json's ByteLevel pre-tokenizer has true: "
              "transformers 4 would rebuild it with false, remat reads tokenizer.json's; set "
              "add_prefix_space to true");
  CHECK(folder.load_error({{"tokenizer_class", "GPT2Tokenizer"}, {"add_prefix_space", true}})
            .empty());
  CHECK(folder.load_error({{"tokenizer_class", "PreTrainedTokenizerFast"}}).empty());
  // its special tokens default to <|endoftext|>, and Qwen2Tokenizer's eos, unk and pad: absent
  // from this vocabulary, so a text holding it is refused
  const auto endoftext = [](const Tokenizer& tok) {
    return error_of<remat::ArgumentError>([&] { tok.encode("a<|endoftext|>"); });
  };
  CHECK(endoftext(folder.load({{"tokenizer_class", "GPT2Tokenizer"}, {"add_prefix_space", true}}))
            .find("(" + config_file + ": bos_token (absent: GPT2TokenizerFast's default))") !=
        std::string::npos);
  CHECK(endoftext(folder.load({{"tokenizer_class", "Qwen2Tokenizer"}}))
            .find("(" + config_file + ": eos_token (absent: Qwen2TokenizerFast's default))") !=
        std::string::npos);
  CHECK(folder
            .load({{"tokenizer_class", "Qwen2Tokenizer"},
                   {"eos_token", "<|end|>"},
                   {"unk_token", nullptr},
                   {"pad_token", "<|end|>"}})
            .encode("a<|endoftext|>")
            .size() == 15);  // the prefix space, then a byte each
  CHECK(folder.load({{"tokenizer_class", "TokenizersBackend"}}).encode("a<|endoftext|>").size() ==
        15);
}

TEST_CASE(
    "tokenizer_config.json: CodeLlamaTokenizer's infilling tokens are special tokens, and a text "
    "holding its fill token is refused",
    "[hub]") {
  json with_bos = byte_level_json();
  with_bos["post_processor"] = end_first_processor();  // as transformers 4 rebuilds it
  const ConfigFolder folder("code_llama", with_bos);
  const json none = nullptr;
  json config = {{"tokenizer_class", "CodeLlamaTokenizer"},
                 {"bos_token", "<|end|>"},
                 {"eos_token", "<|end|>"},
                 {"unk_token", none},
                 {"middle_token", none},
                 {"suffix_token", none},
                 {"eot_token", none}};
  // an absent infilling token is its default, which this vocabulary lacks
  write_file(folder.dir + "/tokenizer_config.json", config.dump());
  CHECK(error_of<remat::ArgumentError>(
            [&] { Tokenizer::from_folder(folder.dir).encode("\u2581<PRE>"); })
            .find("(" + folder.dir +
                  "/tokenizer_config.json: prefix_token (absent: CodeLlamaTokenizerFast's "
                  "default)), a special token") != std::string::npos);
  config["prefix_token"] = "ll";  // a vocabulary token: made special
  write_file(folder.dir + "/tokenizer_config.json", config.dump());
  const auto tok = Tokenizer::from_folder(folder.dir);
  CHECK(tok.encode_for_model("hello") == Ids{260, 256, 257, 'o'});  // bos by default
  CHECK(tok.added_tokens().find(257)->special);
  CHECK(error_of<remat::ArgumentError>([&] { tok.encode_for_model("def f(<FILL_ME>):"); }) ==
        "hub::Tokenizer::encode_for_model: the text holds the fill token '<FILL_ME>' of "
        "CodeLlamaTokenizer: transformers encodes it as an infilling prompt (the text before it, "
        "then after it), which remat does not; remove it, or set fill_token to null");
  CHECK(tok.encode("<FILL_ME>", false).size() == 9);  // the tokenizer itself has no such rule
  config["fill_token"] = none;
  write_file(folder.dir + "/tokenizer_config.json", config.dump());
  CHECK(Tokenizer::from_folder(folder.dir).encode_for_model("<FILL_ME>").size() == 10);
}

TEST_CASE("special_tokens_map.json must agree with tokenizer_config.json", "[hub]") {
  const ConfigFolder folder("special_map");
  const std::string map_file = folder.dir + "/special_tokens_map.json";
  const std::string config_file = folder.dir + "/tokenizer_config.json";
  const json config = {
      {"bos_token", "he"}, {"eos_token", "<|end|>"}, {"additional_special_tokens", {"<|end|>"}}};
  const auto with_map = [&](const json& map) {
    write_file(map_file, map.dump());
    return folder.load_error(config);
  };
  CHECK(with_map({{"bos_token", {{"content", "he"}, {"normalized", false}}},
                  {"eos_token", "<|end|>"},
                  {"additional_special_tokens", {"<|end|>"}}})
            .empty());
  CHECK(with_map(json::object()).empty());  // what it leaves out is tokenizer_config.json's
  CHECK(with_map({{"eos_token", "he"}}) ==
        map_file + ": eos_token: 'he' differs from " + config_file +
            "'s eos_token ('<|end|>'): transformers 4 would take this one, remat reads "
            "tokenizer_config.json's");
  CHECK(with_map({{"pad_token", "<|end|>"}}) ==
        map_file + ": pad_token: '<|end|>' differs from " + config_file +
            "'s pad_token (none): transformers 4 would take this one, remat reads "
            "tokenizer_config.json's");
  CHECK(with_map({{"bos_token", nullptr}}).find("bos_token: none differs from") !=
        std::string::npos);
  CHECK(with_map({{"additional_special_tokens", {"<|end|>", "he"}}}) ==
        map_file + ": additional_special_tokens[1]: 'he' is not in " + config_file +
            "'s additional_special_tokens: transformers 4 would add it, remat reads "
            "tokenizer_config.json's");
  CHECK(with_map({{"eos_token", "<|end|>"}, {"chat_template", "x"}})
            .find(map_file + ": field 'chat_template' (value \"x\") is not supported") == 0);
  write_file(map_file, "{\"bos_token\": ");
  CHECK(folder.load_error(config).find(map_file + ": malformed JSON") == 0);
  // a config with added_tokens_decoder (transformers 4.34 on): the map is not read, as in
  // transformers (Llama 2 chat's gives pad_token "<unk>", its config null)
  json with_decoder = config;
  with_decoder["added_tokens_decoder"] = {{"260",
                                           {{"content", "<|end|>"},
                                            {"single_word", false},
                                            {"lstrip", false},
                                            {"rstrip", false},
                                            {"normalized", false},
                                            {"special", true}}}};
  write_file(map_file, json{{"pad_token", "he"}, {"eos_token", "he"}}.dump());
  CHECK(folder.load_error(with_decoder).empty());
  CHECK(!folder.load_error(config).empty());
  // without tokenizer_config.json, every token it gives differs
  std::filesystem::remove(config_file);
  write_file(map_file, json{{"eos_token", "<|end|>"}}.dump());
  CHECK(error_of<remat::IoError>([&] { Tokenizer::from_folder(folder.dir); }) ==
        map_file + ": eos_token: '<|end|>' differs from " + config_file +
            " (absent)'s eos_token (none): transformers 4 would take this one, remat reads "
            "tokenizer_config.json's");
}

TEST_CASE("tokenizer_config.json: add_prefix_space must be tokenizer.json's ByteLevel one",
          "[hub]") {
  json tokenizer = byte_level_json();  // ByteLevel with add_prefix_space false
  const ConfigFolder byte_level("prefix_space", tokenizer);
  CHECK(byte_level.load_error({{"add_prefix_space", false}}).empty());
  CHECK(byte_level.load_error({{"add_prefix_space", nullptr}}).empty());
  CHECK(byte_level.load_error({{"add_prefix_space", true}}) ==
        byte_level.dir +
            "/tokenizer_config.json: add_prefix_space: true differs from tokenizer.json's "
            "ByteLevel pre-tokenizer's add_prefix_space false: transformers would rebuild the "
            "pre-tokenizer with this one, remat reads tokenizer.json's");
  CHECK(byte_level.load_error({{"add_prefix_space", "yes"}})
            .find("add_prefix_space: expected true or false, found \"yes\"") != std::string::npos);
  // inside a Sequence (Llama 3's and Qwen's layout)
  json in_sequence = tokenizer["pre_tokenizer"];
  in_sequence["add_prefix_space"] = true;
  tokenizer["pre_tokenizer"] = {{"type", "Sequence"},
                                {"pretokenizers", json::array({{{"type", "Split"},
                                                                {"pattern", {{"Regex", "\\s+"}}},
                                                                {"behavior", "Isolated"},
                                                                {"invert", false}},
                                                               in_sequence})}};
  const ConfigFolder sequence("prefix_space_sequence", tokenizer);
  CHECK(sequence.load_error({{"add_prefix_space", true}}).empty());
  CHECK(sequence.load_error({{"add_prefix_space", false}})
            .find("add_prefix_space: false differs from tokenizer.json's ByteLevel "
                  "pre-tokenizer's add_prefix_space true") != std::string::npos);
  // no ByteLevel to rebuild: transformers would convert the tokenizer anew
  tokenizer["pre_tokenizer"] = {{"type", "Metaspace"},
                                {"replacement", "\u2581"},
                                {"prepend_scheme", "always"},
                                {"split", true}};
  const ConfigFolder metaspace("prefix_space_metaspace", tokenizer);
  CHECK(metaspace.load_error({{"add_prefix_space", true}}) ==
        metaspace.dir +
            "/tokenizer_config.json: add_prefix_space: true is not supported with a "
            "tokenizer.json that has no ByteLevel pre-tokenizer: transformers would rebuild the "
            "tokenizer with it (supported: null, absent, or the ByteLevel pre-tokenizer's value)");
  CHECK(metaspace.load_error(json::object()).empty());
}

TEST_CASE("Bad tokenizer.json files are errors naming the file, the field and the value", "[hub]") {
  const std::string dir = tok_dir("bad");
  const auto fails_with = [&](const json& j, const std::string& expected) {
    write_file(dir + "/tokenizer.json", j.dump());
    const std::string message =
        error_of<remat::IoError>([&] { Tokenizer::from_file(dir + "/tokenizer.json"); });
    INFO(message);
    CHECK(message.find(dir + "/tokenizer.json:") == 0);
    CHECK(message.find(expected) != std::string::npos);
  };
  const json good = byte_level_json();
  json j = good;
  j["model"]["type"] = "WordPiece";
  fails_with(j, "model.type: model type 'WordPiece' is not supported (supported: BPE)");
  j = good;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  fails_with(j, "pre_tokenizer.type: pre-tokenizer type 'Whitespace' is not supported");
  j = good;
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "Lowercase"}}})}};
  fails_with(j, "normalizer.normalizers[0].type: normalizer type 'Lowercase' is not supported");
  j = good;
  j["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
  fails_with(j, "decoder.type: decoder type 'WordPiece' is not supported");
  j = good;
  j["post_processor"] = {{"type", "BertProcessing"}};
  fails_with(j, "post_processor.type: post-processor type 'BertProcessing' is not supported");
  j = good;
  j["model"]["continuing_subword_suffix"] = "x";
  fails_with(j, "model: field 'continuing_subword_suffix' (value \"x\") is not supported");
  j = good;
  j["truncation"] = {{"max_length", 8}};
  fails_with(j, "truncation: truncation {\"max_length\":8} is not supported (only null)");
  j = good;
  j["model"]["dropout"] = 0.1;
  fails_with(j, "model.dropout: BPE dropout 0.1 is not supported");
  j = good;
  j["model"]["merges"].push_back("zz q");
  fails_with(j, "model.merges[4]: merge token 'zz' is not in the vocabulary");
  j = good;
  j["model"]["merges"].push_back("a b c");
  fails_with(j, "model.merges[4]: merge 'a b c' is not two tokens separated by one space");
  j = good;
  j["model"]["vocab"]["x"] = "seven";
  fails_with(j, "model.vocab.x: expected an id (an integer from 0 to 2^31 - 1), found \"seven\"");
  j = good;
  j["added_tokens"][0]["id"] = 300;
  fails_with(j, "added_tokens[0].id: added token '<|end|>' has id 300");
  j = good;
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  fails_with(j, "pre_tokenizer.pattern: pattern '(unclosed' does not compile");
  j = good;
  j["version"] = "2.0";
  fails_with(j, "version: unknown tokenizer.json version \"2.0\"");
  j = good;
  j.erase("model");
  fails_with(j, "missing field 'model'");

  write_file(dir + "/deep.json", std::string(100000, '[') + std::string(100000, ']'));
  CHECK(error_of<remat::IoError>([&] {
          Tokenizer::from_file(dir + "/deep.json");
        }).find("nests deeper than 64") != std::string::npos);
  write_file(dir + "/broken.json", "{\"model\": ");
  CHECK(error_of<remat::IoError>([&] {
          Tokenizer::from_file(dir + "/broken.json");
        }).find("broken.json: malformed JSON") != std::string::npos);
  CHECK(error_of<remat::IoError>([&] {
          Tokenizer::from_file(dir + "/none.json");
        }).find("none.json: cannot open") != std::string::npos);

  const auto tok = Tokenizer::from_json(good, "good");
  CHECK(error_of<remat::IndexError>([&] {
          tok.decode(std::vector<std::int32_t>{5, 261});
        }).find("id 261 at position 1 is not a token (vocabulary of 261 ids)") !=
        std::string::npos);
  CHECK(error_of<remat::IndexError>([&] {
          tok.decode(std::vector<std::int32_t>{-1});
        }).find("id -1 at position 0") != std::string::npos);
}

TEST_CASE("Encoding from several threads at once gives the one-thread ids", "[hub]") {
  std::mt19937 rng(7);
  const RandomBpe b = random_bpe(rng, 4, 40);
  const auto tok = Tokenizer::from_json(bpe_json(b, false), "threads");
  std::vector<std::string> words;
  for (int w = 0; w < 400; ++w) {
    std::string word;
    for (int i = 0; i < 1 + w % 30; ++i) word += static_cast<char>('a' + rng() % 4);
    words.push_back(word);
  }
  std::vector<std::vector<std::int32_t>> expected;
  for (const auto& w : words) expected.push_back(tok.encode(w));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (std::size_t i = 0; i < words.size(); ++i)
          if (tok.encode(words[(i + static_cast<std::size_t>(t) * 97) % words.size()]) !=
              expected[(i + static_cast<std::size_t>(t) * 97) % words.size()])
            ++mismatches[static_cast<std::size_t>(t)];
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE(
    "Decoders on edge tokens: Replace keeps an empty token empty, ByteFallback reads "
    "'<0x+A>' as tokenizers' u8::from_str_radix does",
    "[hub]") {
  const auto chain = [](const json& decoder, std::vector<std::string> tokens) {
    const auto d = remat::hub::make_decoder(remat::hub::JsonField(decoder, "decoder:"));
    d->decode_chain(tokens);
    return tokens;
  };
  // a pattern matching the empty string: tokenizers' find_matches finds nothing in "", so an
  // empty token is not replaced; a non-empty one gets the content at every empty match
  const json empty_match = {{"type", "Replace"}, {"pattern", {{"Regex", "x*"}}}, {"content", "-"}};
  CHECK(chain(empty_match, {"", "ab", ""}) == std::vector<std::string>{"", "-a-b-", ""});
  // from_str_radix takes one leading '+' (then one hex digit here), never '-' for a u8
  const json byte_fallback = {{"type", "ByteFallback"}};
  CHECK(chain(byte_fallback, {"<0x+A>", "<0x41>", "<0x-A>", "<0x++>", "<0xA+>"}) ==
        std::vector<std::string>{"\nA", "<0x-A>", "<0x++>", "<0xA+>"});
  CHECK(remat::hub::detail::ByteFallbackDecoder::byte_token("<0x+f>") == 15);
  CHECK(remat::hub::detail::ByteFallbackDecoder::byte_token("<0x+g>") == -1);
}

TEST_CASE(
    "Decoders tokenizers refuses to load are refused: ByteLevel without its fields, a "
    "Sequence holding null",
    "[hub]") {
  const auto load_error = [](const json& decoder) {
    return error_of<remat::IoError>(
        [&] { remat::hub::make_decoder(remat::hub::JsonField(decoder, "decoder:")); });
  };
  // serde: add_prefix_space and trim_offsets have no default; use_regex defaults to true
  CHECK(load_error({{"type", "ByteLevel"}}).find("missing field 'add_prefix_space'") !=
        std::string::npos);
  CHECK(load_error({{"type", "ByteLevel"}, {"add_prefix_space", true}})
            .find("missing field 'trim_offsets'") != std::string::npos);
  CHECK(load_error({{"type", "ByteLevel"}, {"add_prefix_space", nullptr}, {"trim_offsets", true}})
            .find("add_prefix_space: expected true or false, found null") != std::string::npos);
  CHECK(load_error({{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", nullptr}})
            .find("use_regex: expected true or false, found null") != std::string::npos);
  CHECK(remat::hub::make_decoder(remat::hub::JsonField(
            json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}},
            "decoder:")) != nullptr);
  // a Sequence's members are decoders: null is not one (a top-level null decoder is none)
  const json with_null = {{"type", "Sequence"},
                          {"decoders", json::array({{{"type", "Fuse"}}, nullptr})}};
  CHECK(load_error(with_null).find("decoder: decoders[1]: expected a decoder, found null") !=
        std::string::npos);
  CHECK(remat::hub::make_decoder(remat::hub::JsonField(json(nullptr), "decoder:")) == nullptr);
}
