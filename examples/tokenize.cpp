// Tokenizes standard input with a Hugging Face tokenizer.json, as Hugging Face's
// `Tokenizer.encode(text).ids` does with its defaults (the post-processor's special tokens
// included), or decodes ids back to text.
//
//   tokenize --tokenizer tokenizer.json [--decode] [--no-special-tokens] [--keep-special-tokens]
//
// Encoding reads UTF-8 text from standard input (all of it, newlines included) and prints one
// JSON array of ids and a newline. --decode reads one JSON array of ids and prints their text
// (special tokens skipped, as Hugging Face's Python default; --keep-special-tokens keeps them),
// with no newline added. --no-special-tokens encodes without the post-processor's tokens.
// Errors (a missing or malformed file, text that is not UTF-8, an id out of range) are one line
// on standard error and exit status 1.
#include <remat/hub/tokenizer.hpp>

#include "flags.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string tokenizer;
  bool decode = false;
  bool no_special = false;
  bool keep_special = false;
};

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app{"Tokenize standard input with a Hugging Face tokenizer.json (or decode ids)",
               "tokenize"};
  // checked after parsing, not by CLI11, so that an unknown flag is reported as such first
  app.add_option("--tokenizer", o.tokenizer, "tokenizer.json file (required)");
  app.add_flag("--decode", o.decode, "read a JSON array of ids and print their text");
  app.add_flag("--no-special-tokens", o.no_special,
               "encode without the post-processor's special tokens");
  app.add_flag("--keep-special-tokens", o.keep_special, "decode special tokens too");
  flags::parse(app, argc, argv);
  if (o.tokenizer.empty()) {
    std::fprintf(stderr, "tokenize: --tokenizer FILE is required (see --help)\n");
    std::exit(1);
  }
  return o;
}

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::int32_t> parse_ids(const std::string& text) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw remat::ArgumentError(std::string("--decode: standard input is not JSON (") + e.what() +
                               ")");
  }
  if (!json.is_array()) throw remat::ArgumentError("--decode: expected a JSON array of ids");
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < json.size(); ++i) {
    if (!json[i].is_number_integer() || json[i].get<std::int64_t>() < 0 ||
        json[i].get<std::int64_t>() > INT32_MAX)
      throw remat::ArgumentError(
          remat::detail::cat("--decode: element ", i, " (", json[i].dump(), ") is not an id"));
    ids.push_back(json[i].get<std::int32_t>());
  }
  return ids;
}

}  // namespace

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::ios::sync_with_stdio(false);
  const auto tokenizer = remat::hub::Tokenizer::from_file(o.tokenizer);
  const std::string input = read_all(std::cin);
  if (o.decode) {
    const std::string text = tokenizer.decode(parse_ids(input), !o.keep_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    const auto ids = tokenizer.encode(input, !o.no_special);
    std::string out = "[";
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

// One error boundary (examples/flags.hpp): any failure is one line and exit status 1.
int main(int argc, char** argv) {
  return flags::run_main("tokenize", [&] { return run(argc, argv); });
}
