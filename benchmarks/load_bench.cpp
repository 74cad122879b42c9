// Loading a Hugging Face checkpoint: how much memory and time converting a BF16 safetensors file
// into float tensors takes (io::WeightFiles::load reads a slice at a time with pread and converts
// it), against reading the file twice.
//
//   load_bench make PATH [GiB]   writes a BF16 file of GiB gibibytes (default 1): 8 tensors
//   load_bench load PATH         loads it into float tensors; prints seconds, the floats' size and
//                                this process's peak resident memory (getrusage)
//   load_bench read2 PATH        reads the file twice, each time into a buffer of its size; prints
//   seconds
//   load_bench llama DIR [STORAGE] [--random]
//                                hub::load_llama of a hub folder (benchmarks/make_hub_folder.py
//                                writes a Qwen2.5-0.5B-shaped one): STORAGE f32 (default) loads
//                                float parameters, bf16/int8/nf4 freezes the decoder projections
//                                in that storage as they are read; --random first builds the model
//                                with random values, as loading did before Llama::uninitialized.
//                                Prints wall and CPU seconds, the loaded model's bytes, the
//                                resident memory before loading (the fixed baseline: program,
//                                libraries) and the peak.
//
// Run `load` under /usr/bin/time -v for the kernel's own "Maximum resident set size".
#include <remat/core/rng.hpp>
#include <remat/io/weight_files.hpp>
#include <remat/hub/llama_load.hpp>
#include <remat/nn/quantize_blocks.hpp>

#include <sys/resource.h>
#include <sys/statvfs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "../examples/flags.hpp"

namespace {

double peak_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

/// The resident memory now (VmRSS), in MiB.
double rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  double kib = 0;
  while (status >> key) {
    if (key == "VmRSS:") {
      status >> kib;
      break;
    }
  }
  return kib / 1024.0;
}

/// User + system CPU seconds of this process so far.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void make(const std::string& path, double gib) {
  struct statvfs fs {};
  if (::statvfs(flags::detail::parent_of(path).c_str(), &fs) == 0) {
    const double free = double(fs.f_bavail) * double(fs.f_frsize);
    if (!(gib * double(1ull << 30) <= free)) {
      throw remat::ArgumentError(remat::detail::cat("load_bench: make ", path, " ", gib, " needs ",
                                                    flags::human_bytes(gib * double(1ull << 30)),
                                                    "; its file system has ",
                                                    flags::human_bytes(free), " free"));
    }
  }
  const int tensors = 8;
  const auto per = static_cast<std::int64_t>(gib * double(1ull << 30) / 2 / tensors / 1024) * 1024;
  std::vector<remat::io::detail::HeaderEntry> entries;
  for (int i = 0; i < tensors; ++i) {
    entries.push_back({"model.layers." + std::to_string(i) + ".weight", "BF16",
                       remat::Shape{per / 1024, 1024}, std::size_t(per) * 2});
  }
  std::ofstream out(path, std::ios::binary);
  out << remat::io::detail::encode_header(path, entries, {{"format", "pt"}});
  remat::Rng rng(1);
  std::vector<std::uint16_t> chunk(1 << 20);
  for (std::int64_t left = per * tensors; left > 0; left -= std::int64_t(chunk.size())) {
    for (auto& h : chunk) h = remat::io::float_to_bf16(static_cast<float>(rng.normal() * 0.02));
    out.write(reinterpret_cast<const char*>(chunk.data()),
              std::streamsize(std::min<std::int64_t>(left, std::int64_t(chunk.size())) * 2));
  }
  if (!out) throw remat::IoError("load_bench: cannot write " + path);
  std::printf("wrote %s: %d BF16 tensors, %.3f GiB of data\n", path.c_str(), tensors,
              double(per * tensors * 2) / double(1ull << 30));
}

void load(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto files = remat::io::WeightFiles::open(path);
  std::vector<remat::io::NamedTensor<float>> targets;
  double floats = 0;
  for (const std::string& name : files.names())
    floats += double(files.file_of(name).entry(name).shape.numel());
  flags::fits("load_bench", "loading " + path + " into floats", 4 * floats);
  std::size_t bytes = 0;
  for (const std::string& name : files.names()) {
    targets.emplace_back(name, remat::Tensor<float>(files.file_of(name).entry(name).shape));
    bytes += targets.back().second.bytes();
  }
  files.load(targets);
  const double s = seconds_since(t0);
  double check = 0;  // use the values, so that nothing is optimized away
  for (const auto& [name, t] : targets) check += double(t.data()[t.numel() - 1]);
  std::printf(
      "loaded %zu tensors, %.1f MiB of floats, in %.3f s; peak resident %.1f MiB = %.3fx the "
      "floats (check %g)\n",
      targets.size(), double(bytes) / 1048576.0, s, peak_rss_mib(),
      peak_rss_mib() / (double(bytes) / 1048576.0), check);
}

void read_twice(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t total = 0;
  for (int pass = 0; pass < 2;
       ++pass) {  // as a reader that holds the file does: into a buffer of its size
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw remat::IoError("load_bench: cannot read " + path);
    std::fseek(f, 0, SEEK_END);
    std::vector<char> buffer(static_cast<std::size_t>(std::ftell(f)));
    std::fseek(f, 0, SEEK_SET);
    total += std::fread(buffer.data(), 1, buffer.size(), f);
    std::fclose(f);
  }
  std::printf("read %s twice (%.1f MiB) in %.3f s\n", path.c_str(), double(total) / 1048576.0,
              seconds_since(t0));
}

remat::WeightStorage storage_named(const std::string& name) {
  for (const auto s : {remat::WeightStorage::f32, remat::WeightStorage::bf16,
                       remat::WeightStorage::int8, remat::WeightStorage::nf4}) {
    if (name == remat::to_string(s)) return s;
  }
  throw remat::ArgumentError("load_bench: storage must be f32, bf16, int8 or nf4, got " + name);
}

void load_llama_folder(const std::string& dir, remat::WeightStorage storage, bool random_first) {
  const double baseline = rss_mib(), cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  remat::nn::Llama<float> model = [&] {
    if (!random_first) return remat::hub::load_llama<float>(dir, {.projections = storage});
    // the former path: a randomly initialized model, then the files' values over it
    remat::nn::Llama<float> m(remat::hub::load_llama_config(dir + "/config.json"));
    remat::hub::load_weights(m, remat::io::WeightFiles::open(dir));
    if (storage != remat::WeightStorage::f32) remat::nn::quantize_blocks(m, storage);
    return m;
  }();
  const double wall = seconds_since(t0), cpu = cpu_seconds() - cpu0;
  double bytes = 0, check = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    bytes += double(p.value().bytes());
    check += double(p.value().data()[p.numel() - 1]);  // use the values
  }
  for (const auto& layer : model.layers) {
    for (const remat::nn::Linear<float>* l :
         {&layer.self_attn.q_proj, &layer.self_attn.k_proj, &layer.self_attn.v_proj,
          &layer.self_attn.o_proj, &layer.mlp.gate_proj, &layer.mlp.up_proj,
          &layer.mlp.down_proj}) {
      if (l->quantized_weight()) bytes += double(l->quantized_weight()->bytes());
    }
  }
  const double model_mib = bytes / 1048576.0, peak = peak_rss_mib();
  std::printf(
      "load_llama %s, projections %s%s: %.3f s wall, %.3f s CPU; model %.1f MiB; resident before "
      "%.1f MiB, peak %.1f MiB = baseline + %.3fx the model (check %g)\n",
      dir.c_str(), remat::to_string(storage), random_first ? " (random init first)" : "", wall, cpu,
      model_mib, baseline, peak, (peak - baseline) / model_mib, check);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Loading a BF16 safetensors checkpoint into floats: memory and time, against reading the "
      "file twice.");
  app.require_subcommand(1);
  std::string path;
  double gib = 1;
  CLI::App* make_cmd = app.add_subcommand("make", "write a BF16 file of GIB gibibytes: 8 tensors");
  make_cmd->add_option("PATH", path, "the file to write")->required()->check(flags::output_file);
  make_cmd->add_option("GIB", gib, "gibibytes of data")
      ->check(flags::positive)
      ->capture_default_str();
  CLI::App* load_cmd = app.add_subcommand(
      "load",
      "load it into float tensors; print seconds, the floats' size and the peak resident memory");
  load_cmd->add_option("PATH", path, "the file to load")->required()->check(flags::input_file);
  CLI::App* read_cmd =
      app.add_subcommand("read2", "read the file twice, each time into a buffer of its size");
  read_cmd->add_option("PATH", path, "the file to read")->required()->check(flags::input_file);
  std::string storage = "f32";
  bool random_first = false;
  CLI::App* llama_cmd = app.add_subcommand(
      "llama", "load a Hugging Face folder with hub::load_llama; print seconds and memory");
  llama_cmd->add_option("DIR", path, "the model folder")->required()->check(CLI::ExistingDirectory);
  llama_cmd->add_option("STORAGE", storage, "the projections' storage")
      ->check(CLI::IsMember({"f32", "bf16", "int8", "nf4"}))
      ->capture_default_str();
  llama_cmd->add_flag("--random", random_first,
                      "build the model with random values first (the former path)");
  flags::parse(app, argc, argv);
  return flags::run_main("load_bench", [&] {
    if (*make_cmd) make(path, gib);
    if (*load_cmd) load(path);
    if (*read_cmd) read_twice(path);
    if (*llama_cmd) load_llama_folder(path, storage_named(storage), random_first);
    return 0;
  });
}
