// Encoding speed of remat's tokenizer on one thread: the documents of a text file (separated
// by the byte 0x1E) encoded one call each, several runs after a warm-up (whose word cache then
// serves the later runs, as Hugging Face's does). benchmarks/tokenizer_bench.js runs it beside
// Hugging Face's library on the same documents and prints both.
//
//   tokenizer_bench --tokenizer tokenizer.json --text docs.txt [--runs N]
//
// Prints one JSON object: bytes, documents, tokens, and the median wall and process CPU
// seconds of a run.
#include <remat/hub/tokenizer.hpp>

#include "../examples/flags.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_file, text_file;
  int runs = 5;
  CLI::App app{"Encoding speed of remat's tokenizer (one thread)", "tokenizer_bench"};
  app.add_option("--tokenizer", tokenizer_file, "tokenizer.json file")->required();
  app.add_option("--text", text_file, "documents separated by the byte 0x1E")->required();
  app.add_option("--runs", runs, "timed runs after one warm-up")->check(CLI::PositiveNumber);
  flags::parse(app, argc, argv);
  try {
    const auto tok = remat::hub::Tokenizer::from_file(tokenizer_file);
    std::ifstream in(text_file, std::ios::binary);
    if (!in) throw remat::IoError(text_file + ": cannot open");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> docs;
    for (std::size_t at = 0; at <= text.size();) {
      const std::size_t end = std::min(text.find('\x1e', at), text.size());
      docs.push_back(text.substr(at, end - at));
      at = end + 1;
    }
    std::size_t tokens = 0;
    const auto run = [&] {
      tokens = 0;
      for (const std::string& d : docs) tokens += tok.encode(d).size();
    };
    run();  // warm-up
    std::vector<double> wall, cpu;
    for (int r = 0; r < runs; ++r) {
      const double w = wall_seconds(), c = cpu_seconds();
      run();
      wall.push_back(wall_seconds() - w);
      cpu.push_back(cpu_seconds() - c);
    }
    std::printf(
        "{\"bytes\": %zu, \"documents\": %zu, \"tokens\": %zu, \"wall_seconds\": %.6f, "
        "\"cpu_seconds\": %.6f}\n",
        text.size(), docs.size(), tokens, median(wall), median(cpu));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
