// Hugging Face weight files: the 16-bit float formats against PyTorch's bits, every dtype a file
// may hold (generated files, random shapes and shard splits), BF16 saving, and the errors of
// mismatched or malformed checkpoints (nothing half-loaded).
#include "support/child.hpp"

#include <catch2/catch.hpp>

#include <remat/core/rng.hpp>
#include <remat/io/weight_files.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace {

namespace hfs = std::filesystem;

std::string hf_dir(const std::string& test) {
  const hfs::path dir =
      hfs::temp_directory_path() / ("remat_hf_test_" + std::to_string(::getpid())) / test;
  hfs::remove_all(dir);
  hfs::create_directories(dir);
  return dir.string();
}

std::vector<char> hf_read_reference() {
  std::ifstream in(std::string(REMAT_REFERENCE_DIR) + "/half.bin", std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class U>
U hf_at(const std::vector<char>& bytes, std::size_t& at) {
  U u;
  REQUIRE(at + sizeof(U) <= bytes.size());
  std::memcpy(&u, bytes.data() + at, sizeof(U));
  at += sizeof(U);
  return u;
}

/// A tensor of a file under construction: its dtype, shape, raw bytes and what it reads as.
struct HfTensor {
  std::string name, dtype;
  remat::Shape shape;
  std::string bytes;
  std::vector<double> floats;      // for float dtypes: the exact values
  std::vector<std::int32_t> ints;  // for integer dtypes
};

const char* const kHfDtypes[] = {"F32", "F64", "BF16", "F16", "I64",
                                 "I32", "I16", "I8",   "U8",  "BOOL"};

template <class S>
void hf_put(std::string& bytes, S s) {
  bytes.append(reinterpret_cast<const char*>(&s), sizeof s);
}

/// A random tensor of `dtype` with a random shape (rank 0 to 3, some extents 0).
HfTensor hf_random_tensor(remat::Rng& rng, const std::string& name, const std::string& dtype) {
  HfTensor t{name, dtype, {}, {}, {}, {}};
  std::vector<std::int64_t> dims;
  for (auto r = rng.uniform_int(4); r > 0; --r) dims.push_back(rng.uniform_int(6));
  t.shape = remat::Shape(std::span<const std::int64_t>(dims));
  for (std::int64_t i = 0; i < t.shape.numel(); ++i) {
    const auto bits = rng.next_u64();
    if (dtype == "F32") {
      const float f = static_cast<float>(rng.normal() * std::exp2(rng.uniform_int(40) - 20));
      hf_put(t.bytes, f), t.floats.push_back(f);
    } else if (dtype == "F64") {
      const double d = rng.normal();
      hf_put(t.bytes, d), t.floats.push_back(d);
    } else if (dtype == "BF16" || dtype == "F16") {
      auto h = static_cast<std::uint16_t>(bits);
      // finite patterns only here (NaN != NaN); the reference test covers every pattern
      if (dtype == "BF16" && (h & 0x7f80) == 0x7f80) h &= 0xbfff;
      if (dtype == "F16" && (h & 0x7c00) == 0x7c00) h &= 0xbfff;
      hf_put(t.bytes, h);
      t.floats.push_back(dtype == "BF16" ? remat::io::bf16_to_float(h)
                                         : remat::io::f16_to_float(h));
    } else if (dtype == "I64") {
      const auto v = static_cast<std::int64_t>(static_cast<std::int32_t>(bits));
      hf_put(t.bytes, v), t.ints.push_back(static_cast<std::int32_t>(v));
    } else if (dtype == "I32") {
      hf_put(t.bytes, static_cast<std::int32_t>(bits)),
          t.ints.push_back(static_cast<std::int32_t>(bits));
    } else if (dtype == "I16") {
      hf_put(t.bytes, static_cast<std::int16_t>(bits)),
          t.ints.push_back(static_cast<std::int16_t>(bits));
    } else if (dtype == "I8") {
      hf_put(t.bytes, static_cast<std::int8_t>(bits)),
          t.ints.push_back(static_cast<std::int8_t>(bits));
    } else if (dtype == "U8") {
      hf_put(t.bytes, static_cast<std::uint8_t>(bits)),
          t.ints.push_back(static_cast<std::uint8_t>(bits));
    } else {  // BOOL
      hf_put(t.bytes, static_cast<std::uint8_t>(bits & 1)),
          t.ints.push_back(static_cast<std::int32_t>(bits & 1));
    }
  }
  return t;
}

/// Writes `tensors` as one safetensors file at `path` (the writer's header, the raw bytes).
void hf_write(const std::string& path, const std::vector<HfTensor>& tensors) {
  std::vector<remat::io::detail::HeaderEntry> entries;
  std::string data;
  for (const HfTensor& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
    data += t.bytes;
  }
  std::ofstream(path, std::ios::binary)
      << remat::io::detail::encode_header(path, entries, {}) << data;
}

/// Writes `tensors` into `dir` split into `shards` shard files at random points, with an index.
void hf_write_sharded(remat::Rng& rng, const std::string& dir, const std::vector<HfTensor>& tensors,
                      int shards) {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  std::vector<std::vector<HfTensor>> parts(static_cast<std::size_t>(shards));
  for (const HfTensor& t : tensors)
    parts[static_cast<std::size_t>(rng.uniform_int(shards))].push_back(t);
  for (int s = 0; s < shards; ++s) {
    const std::string name =
        "model-" + std::to_string(s + 1) + "-of-" + std::to_string(shards) + ".safetensors";
    hf_write(dir + "/" + name, parts[static_cast<std::size_t>(s)]);
    for (const HfTensor& t : parts[static_cast<std::size_t>(s)]) index["weight_map"][t.name] = name;
  }
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
}

void hf_write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

template <class T>
void hf_expect_error(const remat::io::WeightFiles& files,
                     std::vector<remat::io::NamedTensor<T>> targets,
                     const std::vector<std::string>& fragments) {
  for (auto& [name, t] : targets) t.fill(T(7));
  try {
    files.load(targets);
    FAIL("load did not throw");
  } catch (const remat::IoError& e) {
    for (const std::string& f : fragments) CHECK_THAT(e.what(), Catch::Contains(f));
  }
  for (const auto& [name, t] : targets) {
    for (std::int64_t i = 0; i < t.numel(); ++i)
      REQUIRE(t.data()[i] == T(7));  // nothing half-loaded
  }
}

void hf_open_rejects(const std::string& path, const std::vector<std::string>& fragments) {
  try {
    (void)remat::io::WeightFiles::open(path);
    FAIL("open did not throw for " << path);
  } catch (const remat::IoError& e) {
    for (const std::string& f : fragments) CHECK_THAT(e.what(), Catch::Contains(f));
  }
}

}  // namespace

TEST_CASE(
    "F16 and BF16 widen to float as PyTorch does for every bit pattern, and round to BF16 as it "
    "does",
    "[io][half]") {
  const std::vector<char> ref = hf_read_reference();
  std::size_t at = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = hf_at<std::uint32_t>(ref, at);
    INFO("F16 pattern " << h);
    REQUIRE(std::bit_cast<std::uint32_t>(remat::io::f16_to_float(static_cast<std::uint16_t>(h))) ==
            bits);
  }
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = hf_at<std::uint32_t>(ref, at);
    INFO("BF16 pattern " << h);
    REQUIRE(std::bit_cast<std::uint32_t>(remat::io::bf16_to_float(static_cast<std::uint16_t>(h))) ==
            bits);
  }
  const auto n = hf_at<std::uint32_t>(ref, at);
  REQUIRE(n >= 1000);
  std::vector<float> floats(n);
  for (auto& f : floats) f = std::bit_cast<float>(hf_at<std::uint32_t>(ref, at));
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto want = hf_at<std::uint32_t>(ref, at);
    INFO("float bits " << std::bit_cast<std::uint32_t>(floats[i]));
    REQUIRE(remat::io::float_to_bf16(floats[i]) == want);
  }
  std::vector<double> doubles(n);
  for (auto& d : doubles) d = std::bit_cast<double>(hf_at<std::uint64_t>(ref, at));
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto want = hf_at<std::uint32_t>(ref, at);
    INFO("double bits " << std::bit_cast<std::uint64_t>(doubles[i]));
    REQUIRE(remat::io::double_to_bf16(doubles[i]) == want);
  }
  REQUIRE(at == ref.size());

  SECTION("save(..., StoreAs::bf16) writes torch's bits, from float and from double") {
    const std::string dir = hf_dir("bf16_save");
    const auto f = remat::Tensor<float>::from(remat::Shape{static_cast<std::int64_t>(n)}, floats);
    const auto d = remat::Tensor<double>::from(remat::Shape{static_cast<std::int64_t>(n)}, doubles);
    remat::io::save<float>(dir + "/f.safetensors", {{"x", f}}, {}, remat::io::StoreAs::bf16);
    remat::io::save<double>(dir + "/d.safetensors", {{"x", d}}, {}, remat::io::StoreAs::bf16);
    std::size_t back = 2 * 65536 * 4 + 4 + n * 4;
    for (const char* file : {"/f.safetensors", "/d.safetensors"}) {
      const auto read = remat::io::File::read(dir + file);
      REQUIRE(read.entry("x").dtype == "BF16");
      const auto bytes = read.bytes("x");
      const auto loaded = read.tensor<float>("x");
      for (std::uint32_t i = 0; i < n; ++i) {
        std::uint16_t got;
        std::memcpy(&got, bytes.data() + 2 * i, 2);
        std::uint32_t want;
        std::memcpy(&want, ref.data() + back + 4 * i, 4);
        REQUIRE(got == want);
        REQUIRE(std::bit_cast<std::uint32_t>(loaded.data()[i]) == static_cast<std::uint32_t>(want)
                                                                      << 16);
      }
      back += n * 4 + n * 8;  // to the double section's bf16 bits
    }
  }
}

TEST_CASE("generated checkpoints of every dtype, one file or random shards, load exactly",
          "[io][hf]") {
  remat::Rng rng(1101);
  for (int round = 0; round < 40; ++round) {
    const std::string dir = hf_dir("generated_" + std::to_string(round));
    std::vector<HfTensor> tensors;
    const auto count = 1 + rng.uniform_int(12);
    for (std::int64_t i = 0; i < count; ++i) {
      tensors.push_back(hf_random_tensor(rng, "model.layers." + std::to_string(i) + ".w",
                                         kHfDtypes[rng.uniform_int(10)]));
    }
    const int shards = static_cast<int>(rng.uniform_int(4));  // 0: one model.safetensors
    if (shards == 0)
      hf_write(dir + "/model.safetensors", tensors);
    else
      hf_write_sharded(rng, dir, tensors, shards);
    const auto files = remat::io::WeightFiles::open(dir);
    REQUIRE(files.names().size() == tensors.size());
    std::vector<remat::io::NamedTensor<float>> as_float;
    std::vector<remat::io::NamedTensor<double>> as_double;
    std::vector<remat::io::NamedTensor<std::int32_t>> as_int;
    for (const HfTensor& t : tensors) {
      INFO(t.name << " " << t.dtype << " " << t.shape << " in " << shards << " shards");
      REQUIRE(files.file_of(t.name).entry(t.name).shape == t.shape);
      if (remat::io::detail::is_float_dtype(t.dtype)) {
        as_double.emplace_back(t.name, remat::Tensor<double>(t.shape));
        if (t.dtype != "F64") as_float.emplace_back(t.name, remat::Tensor<float>(t.shape));
      } else {
        as_int.emplace_back(t.name, remat::Tensor<std::int32_t>(t.shape));
      }
    }
    files.load(as_float);
    files.load(as_double);
    files.load(as_int);
    std::size_t fi = 0, di = 0, ii = 0;
    for (const HfTensor& t : tensors) {
      INFO(t.name << " " << t.dtype);
      if (remat::io::detail::is_float_dtype(t.dtype)) {
        const auto& d = as_double[di++].second;
        for (std::int64_t k = 0; k < d.numel(); ++k)
          REQUIRE(d.data()[k] == t.floats[static_cast<std::size_t>(k)]);
        if (t.dtype != "F64") {
          const auto& f = as_float[fi++].second;
          for (std::int64_t k = 0; k < f.numel(); ++k)
            REQUIRE(f.data()[k] == static_cast<float>(t.floats[static_cast<std::size_t>(k)]));
        }
      } else {
        const auto& v = as_int[ii++].second;
        for (std::int64_t k = 0; k < v.numel(); ++k)
          REQUIRE(v.data()[k] == t.ints[static_cast<std::size_t>(k)]);
      }
    }
  }
}

TEST_CASE("a folder holding one file and an index loads the file, as transformers does",
          "[io][hf]") {
  // from_pretrained looks for model.safetensors before the index: a folder saved whole and then
  // in shards keeps both, and must load the same weights here as there
  remat::Rng rng(1109);
  const std::string dir = hf_dir("both");
  const auto nonempty = [&] {
    for (;;) {
      HfTensor t = hf_random_tensor(rng, "model.w", "F32");
      if (!t.floats.empty()) return t;
    }
  };
  const HfTensor whole = nonempty(), sharded = nonempty();
  hf_write(dir + "/model.safetensors", {whole});
  hf_write_sharded(rng, dir, {sharded}, 2);
  const auto values = [](const remat::io::WeightFiles& files) {
    std::vector<remat::io::NamedTensor<double>> t;
    t.emplace_back("model.w",
                   remat::Tensor<double>(files.file_of("model.w").entry("model.w").shape));
    files.load(t);
    return t[0].second.to_vector();
  };
  CHECK(values(remat::io::WeightFiles::open(dir)) == whole.floats);
  CHECK(values(remat::io::WeightFiles::open(dir + "/model.safetensors.index.json")) ==
        sharded.floats);
}

TEST_CASE("save_sharded splits at the size asked for and loads back, natively or as BF16",
          "[io][hf]") {
  remat::Rng rng(77);
  for (int round = 0; round < 12; ++round) {
    const std::string dir = hf_dir("save_sharded_" + std::to_string(round));
    std::vector<remat::io::NamedTensor<float>> tensors;
    std::size_t total = 0;
    for (auto i = 1 + rng.uniform_int(8); i > 0; --i) {
      remat::Tensor<float> t(remat::Shape{1 + rng.uniform_int(20), 1 + rng.uniform_int(20)});
      for (std::int64_t k = 0; k < t.numel(); ++k) t.data()[k] = static_cast<float>(rng.normal());
      total += t.bytes();
      tensors.emplace_back(remat::detail::cat("t", i), t);
    }
    const bool bf16 = round % 2 == 1;
    const std::size_t max_shard =
        64 + static_cast<std::size_t>(rng.uniform_int(static_cast<std::int64_t>(total)));
    remat::io::save_sharded(dir, tensors, max_shard, {},
                            bf16 ? remat::io::StoreAs::bf16 : remat::io::StoreAs::native);
    const auto files = remat::io::WeightFiles::open(dir);
    for (const auto& f : files.files()) {
      std::size_t data = 0;
      for (const auto& [name, e] : f.entries()) data += e.end - e.begin;
      REQUIRE((data <= max_shard || f.entries().size() == 1));
    }
    REQUIRE(hfs::exists(dir + "/model.safetensors.index.json") == (files.files().size() > 1));
    std::vector<remat::io::NamedTensor<float>> back;
    for (const auto& [name, t] : tensors) back.emplace_back(name, remat::Tensor<float>(t.shape()));
    files.load(back);
    for (std::size_t i = 0; i < back.size(); ++i) {
      for (std::int64_t k = 0; k < back[i].second.numel(); ++k) {
        const float x = tensors[i].second.data()[k];
        REQUIRE(back[i].second.data()[k] ==
                (bf16 ? remat::io::bf16_to_float(remat::io::float_to_bf16(x)) : x));
      }
    }
  }
}

TEST_CASE("save_sharded replaces a folder's weights whole and keeps its other files", "[io][hf]") {
  const std::string dir = hf_dir("save_sharded_whole");
  const auto matrix = [](float v) { return remat::Tensor<float>::full({8, 8}, v); };  // 256 bytes
  using Named = std::vector<remat::io::NamedTensor<float>>;
  const auto save = [&](const Named& tensors) { remat::io::save_sharded(dir, tensors, 256); };
  // first save: 4 shards of one tensor each, beside a file of the user's
  save({{"a", matrix(1)}, {"b", matrix(2)}, {"c", matrix(3)}, {"d", matrix(4)}});
  std::ofstream(dir + "/tokenizer.json") << "{}";
  REQUIRE(hfs::exists(dir + "/model-00004-of-00004.safetensors"));
  // a save that fails in its second shard (an undefined tensor) leaves the first save readable
  CHECK_THROWS_AS(save({{"a", matrix(5)}, {"c", matrix(6)}, {"b", remat::Tensor<float>()}}),
                  remat::IoError);
  // a name twice is refused before anything is written
  CHECK_THROWS_WITH(save({{"a", matrix(5)}, {"a", matrix(6)}}),
                    Catch::Contains("'a' is named twice"));
  std::vector<remat::io::NamedTensor<float>> back{{"d", remat::Tensor<float>({8, 8})}};
  remat::io::WeightFiles::open(dir).load(back);
  CHECK(back[0].second[0] == 4.0f);
  // second save: 2 shards; the old third and fourth are gone, the user's file stays
  save({{"a", matrix(7)}, {"b", matrix(8)}});
  CHECK_FALSE(hfs::exists(dir + "/model-00003-of-00004.safetensors"));
  CHECK_FALSE(hfs::exists(dir + "/model-00001-of-00004.safetensors"));
  CHECK(hfs::exists(dir + "/model-00002-of-00002.safetensors"));
  CHECK(hfs::exists(dir + "/tokenizer.json"));
  back = {{"b", remat::Tensor<float>({8, 8})}};
  remat::io::WeightFiles::open(dir).load(back);
  CHECK(back[0].second[0] == 8.0f);
  // nothing left beside the folder by the saves (the failed one included)
  std::int64_t beside = 0;
  for (const auto& e : hfs::directory_iterator(hfs::path(dir).parent_path()))
    beside += e.path().filename().string().find("save_sharded_whole") != std::string::npos;
  CHECK(beside == 1);
}

TEST_CASE(
    "a missing tensor, another shape or a dtype that does not read is an IoError naming both, "
    "nothing half-loaded",
    "[io][hf][errors]") {
  remat::Rng rng(5);
  for (int round = 0; round < 20; ++round) {
    const std::string dir = hf_dir("mismatch_" + std::to_string(round));
    std::vector<HfTensor> tensors;
    for (int i = 0; i < 6; ++i)
      tensors.push_back(hf_random_tensor(rng, remat::detail::cat("w", i), "F32"));
    const auto bad = static_cast<std::size_t>(rng.uniform_int(6));
    const int kind = static_cast<int>(rng.uniform_int(3));
    std::vector<remat::io::NamedTensor<float>> targets;
    for (const HfTensor& t : tensors) targets.emplace_back(t.name, remat::Tensor<float>(t.shape));
    std::vector<std::string> fragments;
    if (kind == 0) {  // the files lack a tensor the model expects
      targets.emplace_back("model.extra", remat::Tensor<float>(remat::Shape{2, 3}));
      fragments = {"'model.extra'", "(2, 3)", "does not hold"};
    } else if (kind == 1) {  // another shape
      std::vector<std::int64_t> dims(tensors[bad].shape.begin(), tensors[bad].shape.end());
      dims.push_back(2);
      targets[bad].second = remat::Tensor<float>(remat::Shape(std::span<const std::int64_t>(dims)));
      std::ostringstream file_shape, want;
      file_shape << tensors[bad].shape, want << targets[bad].second.shape();
      fragments = {"'" + tensors[bad].name + "'", file_shape.str(), want.str(), "model-"};
    } else {  // a dtype that does not read into float
      const char* dtype = rng.uniform_int(2) ? "I64" : "F64";
      tensors[bad] = hf_random_tensor(rng, tensors[bad].name, dtype);
      targets[bad].second = remat::Tensor<float>(tensors[bad].shape);
      fragments = {"'" + tensors[bad].name + "'", std::string(" is ") + dtype, "F32", "model-"};
    }
    hf_write_sharded(rng, dir, tensors, 2 + static_cast<int>(rng.uniform_int(2)));
    INFO("kind " << kind);
    hf_expect_error(remat::io::WeightFiles::open(dir), targets, fragments);
  }
}

TEST_CASE(
    "an integer outside int32's range is an IoError; integers do not read as floats nor floats as "
    "integers",
    "[io][hf][errors]") {
  const std::string dir = hf_dir("int_range");
  HfTensor t{"big", "I64", remat::Shape{2}, {}, {}, {}};
  hf_put(t.bytes, std::int64_t{5});
  hf_put(t.bytes, std::int64_t{1} << 40);
  hf_write(dir + "/model.safetensors", {t});
  const auto file = remat::io::File::read(dir + "/model.safetensors");
  REQUIRE_THROWS_WITH(file.tensor<std::int32_t>("big"),
                      Catch::Contains("'big'") && Catch::Contains("outside int32's range"));
  REQUIRE_THROWS_WITH(file.tensor<float>("big"),
                      Catch::Contains("I64") && Catch::Contains("does not read into F32"));
  REQUIRE_THROWS_WITH(file.tensor<double>("big"), Catch::Contains("does not read into F64"));
}

TEST_CASE("bad index files and shards are IoErrors naming the index, the shard and the tensor",
          "[io][hf][errors]") {
  const std::string dir = hf_dir("bad_index");
  hf_write(dir + "/a.safetensors",
           {HfTensor{"x", "F32", remat::Shape{1}, std::string(4, '\0'), {0.0}, {}}});
  const std::string index = dir + "/model.safetensors.index.json";
  const auto rejects = [&](const std::string& text, std::vector<std::string> fragments) {
    hf_write_text(index, text);
    INFO(text.substr(0, 100));
    fragments.push_back("model.safetensors.index.json");
    hf_open_rejects(dir, fragments);
  };
  rejects("{\"weight_map\": {\"x\": \"a.safetensors\"", {"not valid JSON"});
  rejects("", {"not valid JSON"});
  rejects("[1]", {"not a JSON object"});
  rejects(std::string(100000, '[') + std::string(100000, ']'), {"nests deeper than 64"});
  rejects("{\"weight_map\":" + std::string(65, '[') + std::string(65, ']') + "}",
          {"nests deeper than 64"});
  rejects("{\"metadata\": {}}", {"no \"weight_map\""});
  rejects("{\"weight_map\": [\"a.safetensors\"]}", {"no \"weight_map\""});
  rejects("{\"weight_map\": {\"x\": 3}}", {"weight_map['x'] is not a file name"});
  rejects("{\"weight_map\": {\"x\": \"a.safetensors\", \"x\": \"a.safetensors\"}}",
          {"'x' appears twice"});
  rejects("{\"metadata\": {\"total_size\": -1}, \"weight_map\": {\"x\": \"a.safetensors\"}}",
          {"total_size"});
  rejects("{\"metadata\": 5, \"weight_map\": {\"x\": \"a.safetensors\"}}",
          {"\"metadata\" is not an object"});
  for (const char* outside : {"../a.safetensors", "/etc/passwd", "sub/../../a.safetensors", "",
                              "sub//a.safetensors", ".", "./."}) {
    rejects(std::string("{\"weight_map\": {\"x\": \"") + outside + "\"}}",
            {"weight_map['x']", "not a file inside the folder"});
  }
  rejects("{\"weight_map\": {\"x\": \"missing.safetensors\"}}",
          {"shard 'missing.safetensors'", "of tensor 'x'", "No such file"});
  rejects("{\"weight_map\": {\"y\": \"a.safetensors\"}}",
          {"tensor 'y'", "a.safetensors", "does not hold it"});
  hf_write_text(dir + "/broken.safetensors", "\x08\0\0\0\0\0\0\0{}");
  rejects("{\"weight_map\": {\"x\": \"broken.safetensors\"}}",
          {"shard 'broken.safetensors'", "malformed"});
  hf_write_text(index,
                "{\"metadata\": {\"total_size\": 4}, \"weight_map\": {\"x\": \"a.safetensors\"}}");
  REQUIRE(remat::io::WeightFiles::open(dir).names() == std::vector<std::string>{"x"});
  hf_write_text(index, "{\"weight_map\": {\"x\": \"./a.safetensors\"}}");  // the same file
  REQUIRE(remat::io::WeightFiles::open(dir).names() == std::vector<std::string>{"x"});
  // a shard's tensors the index leaves out are read, as transformers reads them; one in two
  // shards is refused (which copy transformers keeps depends on its reading order)
  hf_write(dir + "/b.safetensors",
           {HfTensor{"x", "F32", remat::Shape{1}, std::string(4, '\0'), {0.0}, {}},
            HfTensor{"z", "F32", remat::Shape{1}, std::string(4, '\0'), {0.0}, {}}});
  hf_write_text(index, "{\"weight_map\": {\"z\": \"b.safetensors\"}}");
  REQUIRE(remat::io::WeightFiles::open(dir).names() == std::vector<std::string>{"x", "z"});
  rejects("{\"weight_map\": {\"x\": \"a.safetensors\", \"z\": \"b.safetensors\"}}",
          {"tensor 'x' is in both", "a.safetensors", "b.safetensors"});
  const std::string empty = hf_dir("empty_folder");
  hf_open_rejects(empty, {"holds neither", "model.safetensors"});
}

TEST_CASE("the index fuzzer's seed corpus holds what its names say", "[io][errors]") {
  const hfs::path corpus =
      hfs::path(__FILE__).parent_path().parent_path().parent_path() / "fuzz" / "corpus" / "index";
  REQUIRE(hfs::is_directory(corpus));
  int valid = 0, rejected = 0;
  for (const auto& e : hfs::directory_iterator(corpus)) {
    const std::string name = e.path().filename().string();
    INFO(name);
    std::ifstream in(e.path(), std::ios::binary);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (name.rfind("valid_", 0) == 0) {
      CHECK_NOTHROW(remat::io::detail::parse_index(text, name));
      ++valid;
    } else {
      CHECK_THROWS_AS(remat::io::detail::parse_index(text, name), remat::IoError);
      ++rejected;
    }
  }
  CHECK(valid >= 3);
  CHECK(rejected >= 9);
}

TEST_CASE("a FIFO or a folder as an index or a shard is an IoError naming it, never a hang",
          "[io][hf][errors]") {
  const std::string dir = hf_dir("not_regular");
  const std::string index = dir + "/model.safetensors.index.json";
  // the index itself a FIFO (a blocking open would wait forever: the child's alarm ends it)
  REQUIRE(::mkfifo(index.c_str(), 0600) == 0);
  CHECK(remat::test::run_in_child([&] {
          return remat::test::error_status([&] { (void)remat::io::WeightFiles::open(dir); },
                                           {index.c_str(), "a FIFO", "not a regular file"});
        }) == 0);
  REQUIRE(::unlink(index.c_str()) == 0);
  // a shard that is a FIFO, or a folder
  const std::string fifo = dir + "/pipe.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  hfs::create_directory(dir + "/folder.safetensors");
  for (const char* shard : {"pipe.safetensors", "folder.safetensors"}) {
    INFO(shard);
    hf_write_text(index, std::string("{\"weight_map\": {\"x\": \"") + shard + "\"}}");
    CHECK(remat::test::run_in_child([&] {
            return remat::test::error_status([&] { (void)remat::io::WeightFiles::open(dir); },
                                             {index.c_str(), shard, "of tensor 'x'"});
          }) == 0);
  }
  // model.safetensors a FIFO, given as the folder's single file or by its own name
  REQUIRE(::unlink(index.c_str()) == 0);
  REQUIRE(::mkfifo((dir + "/model.safetensors").c_str(), 0600) == 0);
  for (const std::string& path : {dir, dir + "/model.safetensors"}) {
    CHECK(remat::test::run_in_child([&] {
            return remat::test::error_status([&] { (void)remat::io::WeightFiles::open(path); },
                                             {"model.safetensors", "a FIFO"});
          }) == 0);
  }
}
