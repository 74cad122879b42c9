#include "support/child.hpp"
#include "support/gradcheck.hpp"

#include <remat/io/safetensors.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

namespace {

namespace fs = std::filesystem;
using remat::IoError;
using remat::Rng;
using remat::Shape;
using remat::Tensor;
using remat::test::error_message;

/// A fresh directory for one test (names are unique per process and test).
std::string st_dir(const std::string& test) {
  const fs::path dir =
      fs::temp_directory_path() / ("remat_io_test_" + std::to_string(::getpid())) / test;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string st_bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void st_write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// A file with the given JSON header and data bytes.
std::string st_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

remat::io::File st_parse(const std::string& bytes) {
  return remat::io::File("in memory", std::vector<char>(bytes.begin(), bytes.end()));
}

/// What save() would write, without the file: the header and the data, in order.
template <class T>
std::string st_encode(const std::vector<remat::io::NamedTensor<T>>& tensors,
                      const remat::io::Metadata& metadata = {}) {
  std::vector<remat::io::detail::HeaderEntry> entries;
  std::string data;
  for (const auto& [name, t] : tensors) {
    entries.push_back({name, remat::io::detail::dtype_name<T>(), t.shape(), t.bytes()});
    data.append(reinterpret_cast<const char*>(t.data()), t.bytes());
  }
  return remat::io::detail::encode_header("in memory", entries, metadata) + data;
}

/// A random shape of rank 0-4; with probability `empty_odds` one axis is 0.
Shape st_random_shape(Rng& rng, double empty_odds) {
  const auto rank = rng.uniform_int(5);
  std::vector<std::int64_t> dims;
  for (std::int64_t i = 0; i < rank; ++i) dims.push_back(1 + rng.uniform_int(4));
  if (rank > 0 && rng.uniform() < empty_odds)
    dims[static_cast<std::size_t>(rng.uniform_int(rank))] = 0;
  return Shape(std::span<const std::int64_t>(dims));
}

/// Rejected with an IoError whose message holds `fragment` and stays short.
void st_rejects(const std::string& bytes, const std::string& fragment) {
  const std::string message = error_message([&] { st_parse(bytes); });
  INFO("expecting '" << fragment << "' in: " << message.substr(0, 400));
  CHECK_THAT(message, Catch::Contains(fragment));
  CHECK(message.size() < 400);
  CHECK(remat::io::detail::invalid_utf8_at(message) ==
        std::string_view::npos);  // quoted bytes are escaped
}

/// A valid entry for a tensor of 3 floats at [0, 12).
const std::string kEntry = R"({"dtype":"F32","shape":[3],"data_offsets":[0,12]})";

/// Every temporary file left in `dir` (save()'s temporaries hold ".tmp.").
std::vector<std::string> st_temporaries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos)
      out.push_back(e.path().string());
  }
  return out;
}

/// Runs `fn` in a child process as user nobody (root passes every permission check) and returns
/// its exit status: `fn` returns the status to exit with.
template <class Fn>
int st_as_nobody(Fn&& fn) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::getuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(90);
    int status = 91;
    try {
      status = fn();
    } catch (...) {
      status = 92;  // not an IoError
    }
    std::_Exit(status);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEMPLATE_TEST_CASE("safetensors round trip: names, shapes, values and metadata", "[io]", float,
                   double) {
  using T = TestType;
  Rng rng(1);
  const auto a = rng.normal_tensor<T>({3, 4});
  const auto b = rng.normal_tensor<T>({5});
  const auto empty = Tensor<T>::zeros({0, 2});
  const std::string path = st_dir("round_trip") + "/round_trip.safetensors";
  remat::io::save<T>(path, {{"layer.a", a}, {"b", b}, {"empty", empty}}, {{"step", "12"}});
  const remat::io::File f = remat::io::File::read(path);
  CHECK(f.metadata().at("step") == "12");
  CHECK(f.entries().size() == 3);
  CHECK(f.tensor<T>("layer.a").to_vector() == a.to_vector());
  CHECK(f.tensor<T>("b").shape() == Shape{5});
  CHECK(f.tensor<T>("empty").shape() == Shape{0, 2});
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, st_bytes_of(path).data(), 8);
  CHECK((8 + header_length) % 8 == 0);  // header padded: the data starts 8-byte aligned
  // F32 widens exactly into double; F64 does not narrow into float
  if constexpr (std::is_same_v<T, float>) {
    const auto wide = f.tensor<double>("layer.a").to_vector();
    const auto narrow = a.to_vector();
    CHECK(std::equal(wide.begin(), wide.end(), narrow.begin(), narrow.end()));
  } else {
    CHECK_THROWS_AS(f.tensor<float>("b"), IoError);
  }
}

TEMPLATE_TEST_CASE("empty tensors anywhere, under any names, round trip", "[io]", float, double) {
  using T = TestType;
  // Names are random, so their order has nothing to do with the offsets; empty tensors fall at
  // the start, between others (at the same offset as the next one) and at the end.
  Rng rng(11);
  const std::string dir = st_dir("empty_tensors");
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<remat::io::NamedTensor<T>> tensors;
    const auto count = 1 + rng.uniform_int(6);
    for (std::int64_t i = 0; i < count; ++i) {
      std::string name = std::to_string(rng.uniform_int(1000000));
      name +=
          '_';  // built in steps: GCC 12 warns falsely (-Wrestrict) on "literal" + std::to_string()
      name += std::to_string(i);
      tensors.emplace_back(std::move(name), rng.normal_tensor<T>(st_random_shape(rng, 0.4)));
    }
    if (trial == 0) {  // the case first seen: a [3], m [0, 2], b [3]
      tensors = {{"a", rng.normal_tensor<T>({3})},
                 {"m", Tensor<T>::zeros({0, 2})},
                 {"b", rng.normal_tensor<T>({3})}};
    }
    const auto check = [&](const remat::io::File& f) {
      REQUIRE(f.entries().size() == tensors.size());
      for (const auto& [name, t] : tensors) {
        const Tensor<T> back = f.tensor<T>(name);
        CHECK(back.shape() == t.shape());
        CHECK(back.to_vector() == t.to_vector());
      }
    };
    check(st_parse(st_encode(tensors)));
    if (trial % 30 == 0) {  // and through a real file
      const std::string path = dir + "/empty.safetensors";
      remat::io::save(path, tensors);
      check(remat::io::File::read(path));
    }
  }
}

TEST_CASE("safetensors files written by hand in the reference layout are read", "[io]") {
  // As Python's safetensors writes them: F32 little-endian, offsets relative to the data; empty
  // tensors at the offset where they fall, in any key order.
  const float values[3] = {1.5f, -2.0f, 0.25f};
  std::string data(reinterpret_cast<const char*>(values), sizeof values);
  const std::string path = st_dir("by_hand") + "/by_hand.safetensors";
  st_write(
      path,
      st_file(
          R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"__metadata__":{"format":"pt"},)"
          R"("a":{"dtype":"F64","shape":[0],"data_offsets":[12,12]},"z":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]}})",
          data));
  const remat::io::File f = remat::io::File::read(path);
  CHECK(f.tensor<float>("w").to_vector() == std::vector<float>{1.5f, -2.0f, 0.25f});
  CHECK(f.tensor<double>("a").shape() == Shape{0});
  CHECK(f.tensor<float>("z").shape() == Shape{2, 0});
  CHECK(f.metadata().at("format") == "pt");
}

TEST_CASE("malformed safetensors files are rejected with a clear error", "[io][errors]") {
  const std::string twelve(12, '\0');
  const auto entry = [](const std::string& dtype, const std::string& shape,
                        const std::string& offsets) {
    return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" +
           offsets + "}}";
  };
  st_rejects("abc", "fewer than the 8");
  st_rejects(st_file(entry("F32", "[3]", "[0,12]"), twelve).substr(0, 30),
             "runs past the end");  // truncated header
  st_rejects(st_file(entry("F32", "[3]", "[0,12]"), twelve.substr(0, 8)),
             "fall outside");  // truncated data
  st_rejects(st_file("{not json", ""), "not valid JSON");
  st_rejects(st_file("[1,2]", ""), "starts with '[', not '{'");
  st_rejects(st_file(" \t[1,2]", ""), "starts with '[', not '{'");
  // JSON white space before '{' (the crate's own test: writers may align the data) and a null
  // __metadata__ (an absent map to the crate) are valid
  CHECK(st_parse(st_file("\t\n{}\r ", "")).entries().empty());
  CHECK(st_parse(st_file(R"({"__metadata__":null})", "")).metadata().empty());
  st_rejects(st_file("", ""), "the header is empty");
  st_rejects(st_file(entry("F32", "[3]", "[0,8]"), std::string(8, '\0')), "needs 12");
  st_rejects(st_file(entry("F32", "[3]", "[4,16]"), twelve), "fall outside");
  st_rejects(st_file(entry("F32", "[3]", "[12,0]"), twelve), "fall outside");
  st_rejects(st_file(entry("F32", "[3]", "[0]"), twelve), "no data_offsets pair");
  st_rejects(st_file(R"({"w":{"shape":[3],"data_offsets":[0,12]}})", twelve), "no dtype");
  st_rejects(st_file(R"({"w":{"dtype":"F32","data_offsets":[0,12]}})", twelve), "no shape");
  st_rejects(
      st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12],"extra":1}})", twelve),
      "unexpected field 'extra'");
  st_rejects(st_file(entry("F32", "[3]", "[0,12]"), std::string(16, '\0')),
             "cover 12 bytes of data but 16");  // trailing bytes
  st_rejects(st_file(entry("F32", "[3]", "[0,12]") + " x", twelve),
             "not valid JSON");  // trailing text
  st_rejects(
      st_file(
          R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          twelve),
      "overlap");
  st_rejects(
      st_file(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
          twelve),
      "a hole");
  // an empty tensor inside another's bytes
  st_rejects(
      st_file(
          R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
          twelve),
      "overlap");
  st_rejects(st_file(R"({"__metadata__":[1]})", ""), "\"__metadata__\" is not an object");
  std::string huge(8, '\0');
  const std::uint64_t big = remat::io::kMaxHeaderBytes + 1;
  std::memcpy(huge.data(), &big, 8);
  st_rejects(huge, "exceeds");
}

TEST_CASE("every class of malformed entry is rejected, generated over its members",
          "[io][errors]") {
  const std::string twelve(12, '\0');
  const auto with_entry = [&](const std::string& value) {
    return st_file(R"({"w":)" + value + "}", twelve);
  };
  SECTION("entries that are not objects") {
    for (const char* value : {"1", "-2.5", "\"F32\"", "[1,2]", "null", "true", "false", "[]"}) {
      st_rejects(with_entry(value), "its entry is not an object");
    }
  }
  SECTION("metadata values that are not strings") {
    for (const char* value : {"1", "2.5", "[\"a\"]", "{\"a\":\"b\"}", "null", "true"}) {
      st_rejects(st_file(std::string(R"({"__metadata__":{"k":)") + value + "}}", ""),
                 "metadata 'k' is not a string");
    }
  }
  SECTION("dtypes the format knows but remat does not read, and names that are no dtype") {
    // the sub-byte dtypes and C64 are valid in a file (each element's bits as the crate's
    // bitsize), and refused when read
    for (const char* dtype : {"F4", "F6_E2M3", "F6_E3M2"}) {
      st_rejects(with_entry(std::string(R"({"dtype":")") + dtype +
                            R"(","shape":[3],"data_offsets":[0,12]})"),
                 "not whole bytes");
    }
    for (const auto& [dtype, bytes] : std::vector<std::pair<std::string, int>>{
             {"F4", 4}, {"F6_E2M3", 6}, {"C64", 64}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}}) {
      const std::string data(static_cast<std::size_t>(bytes), '\0');
      const auto file =
          st_parse(st_file(R"({"w":{"dtype":")" + dtype + R"(","shape":[8],"data_offsets":[0,)" +
                               std::to_string(bytes) + "]}}",
                           data));
      CHECK_THROWS_WITH(file.tensor<float>("w"), Catch::Contains("does not read into F32"));
    }
    Rng rng(5);
    for (int i = 0; i < 50; ++i) {
      std::string dtype;
      for (auto n = 1 + rng.uniform_int(6); n > 0; --n)
        dtype += static_cast<char>('A' + rng.uniform_int(26));
      if (dtype == "F32" || dtype == "F64" || remat::io::detail::is_safetensors_dtype(dtype))
        continue;
      st_rejects(with_entry(R"({"dtype":")" + dtype + R"(","shape":[3],"data_offsets":[0,12]})"),
                 "is not a safetensors dtype");
    }
    st_rejects(with_entry(R"({"dtype":"f32","shape":[3],"data_offsets":[0,12]})"),
               "is not a safetensors dtype");  // case matters
  }
  SECTION("extents that are not integers in [0, 2^63)") {
    for (const char* dim : {"-1", "3.0", "3.5", "\"3\"", "null", "[3]", "{}", "9223372036854775808",
                            "18446744073709551615", "1e3"}) {
      st_rejects(with_entry(std::string(R"({"dtype":"F32","shape":[)") + dim +
                            R"(],"data_offsets":[0,12]})"),
                 "not an integer in [0, 2^63)");
    }
    for (const char* offset : {"-1", "0.0", "\"0\"", "null", "18446744073709551615"}) {
      st_rejects(with_entry(std::string(R"({"dtype":"F32","shape":[3],"data_offsets":[)") + offset +
                            ",12]}"),
                 "are not integers");
    }
  }
  SECTION(
      "shapes whose extents multiply past 2^63 (left to right) are refused; with a zero extent "
      "before that they hold 0 bytes and are read") {
    Rng rng(6);
    for (int i = 0; i < 100; ++i) {
      // two or more extents of 2^20 .. 2^62 whose product exceeds 2^63
      std::vector<std::uint64_t> dims;
      double log2 = 0;
      while (log2 <= 64) {
        const int bits = 20 + static_cast<int>(rng.uniform_int(43));
        dims.push_back((std::uint64_t{1} << bits) +
                       static_cast<std::uint64_t>(rng.uniform_int(1000)));
        log2 += bits;
      }
      if (rng.uniform() < 0.5)
        dims.insert(dims.begin() + rng.uniform_int(static_cast<std::int64_t>(dims.size()) + 1), 0);
      if (dims.size() > 6) continue;
      std::string shape = "[";
      for (std::size_t k = 0; k < dims.size(); ++k) {
        if (k) shape += ",";
        shape += std::to_string(dims[k]);
      }
      // multiplied left to right, as the safetensors crate does: a zero after a product past
      // 2^63 does not save the shape
      bool overflows = false;
      std::uint64_t product = 1;
      for (const std::uint64_t d : dims) {
        overflows = overflows || (d != 0 && product > static_cast<std::uint64_t>(INT64_MAX) / d);
        product *= d;
      }
      if (overflows) {
        st_rejects(with_entry(R"({"dtype":"F32","shape":)" + shape + R"(],"data_offsets":[0,12]})"),
                   "overflows");
        continue;
      }
      // it holds nothing: read when its offsets say so, refused when they claim 12 bytes
      st_rejects(with_entry(R"({"dtype":"F32","shape":)" + shape + R"(],"data_offsets":[0,12]})"),
                 "hold 12 bytes but F32 " + shape + "] needs 0");
      const auto file = st_parse(
          st_file(R"({"w":{"dtype":"F32","shape":)" + shape + R"(],"data_offsets":[0,0]}})", ""));
      const Tensor<float> w = file.tensor<float>("w");
      CHECK(w.numel() == 0);
      CHECK(w.shape().rank() == static_cast<int>(dims.size()));
      for (std::size_t k = 0; k < dims.size(); ++k)
        CHECK(static_cast<std::uint64_t>(w.shape()[static_cast<int>(k)]) == dims[k]);
    }
    st_rejects(with_entry(R"({"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,12]})"),
               "needs 4000000000000");
    st_rejects(with_entry(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,12]})"),
               "bits are more than 2^64");
    st_rejects(with_entry(R"({"dtype":"F32","shape":[1,1,1,1,1,1,3],"data_offsets":[0,12]})"),
               "7 axes");
  }
  SECTION("offsets past the end of the data") {
    Rng rng(7);
    for (int i = 0; i < 50; ++i) {
      const auto begin = rng.uniform_int(40), end = begin + 1 + rng.uniform_int(1 << 20);
      if (end <= 12) continue;
      st_rejects(with_entry(R"({"dtype":"F32","shape":[3],"data_offsets":[)" +
                            std::to_string(begin) + "," + std::to_string(end) + "]}"),
                 "fall outside");
    }
  }
}

TEST_CASE("repeated keys at any level are rejected, not resolved by the last one", "[io][errors]") {
  // Each field of an entry repeated, anywhere among the others; repeated names; repeated metadata
  // keys.
  const std::vector<std::string> fields = {R"("dtype":"F32")", R"("shape":[3])",
                                           R"("data_offsets":[0,12])"};
  const std::vector<std::string> names = {"dtype", "shape", "data_offsets"};
  for (std::size_t twin = 0; twin < fields.size(); ++twin) {
    for (std::size_t at = 0; at <= fields.size(); ++at) {
      std::vector<std::string> parts = fields;
      parts.insert(parts.begin() + static_cast<std::ptrdiff_t>(at), fields[twin]);
      std::string entry = "{";
      for (std::size_t k = 0; k < parts.size(); ++k) entry += (k ? "," : "") + parts[k];
      st_rejects(st_file(R"({"w":)" + entry + "}}", std::string(12, '\0')),
                 "the key '" + names[twin] + "' appears twice in the entry of 'w'");
    }
  }
  st_rejects(
      st_file(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          std::string(8, '\0')),
      "the name 'w' appears twice in the header");
  st_rejects(st_file(R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})", ""),
             "the name '__metadata__' appears twice");
  st_rejects(st_file(R"({"__metadata__":{"k":"1","j":"2","k":"3"}})", ""),
             "the key 'k' appears twice in the entry of '__metadata__'");
  // the same key in different objects is fine
  const auto f = st_parse(st_file(
      R"({"__metadata__":{"shape":"x"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      std::string(8, '\0')));
  CHECK(f.entries().size() == 2);
}

TEST_CASE(
    "a NUL byte anywhere in the header, a byte-order mark or anything but '{' first (after JSON "
    "white space) is rejected",
    "[io][errors]") {
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"__metadata__":{"k":"v"}})";
  const std::string twelve(12, '\0');
  REQUIRE(st_parse(st_file(header, twelve)).entries().size() == 1);
  for (std::size_t at = 1; at <= header.size(); ++at) {
    std::string bad = header;
    bad.insert(at, 1, '\0');
    st_rejects(st_file(bad, twelve), "the header holds a NUL byte at offset " + std::to_string(at));
  }
  // a NUL then garbage where the padding goes: what follows a NUL is not ignored
  st_rejects(st_file(header + std::string(1, '\0') + "garbage", twelve), "NUL byte");
  st_rejects(st_file("\xEF\xBB\xBF" + header, twelve), "byte-order mark");
  for (const char* start : {"\0", "x", "[", "\"", "1", " x", "\f", "\v"}) {
    st_rejects(st_file(std::string(start, start[0] ? std::strlen(start) : 1) + header, twelve),
               "not '{'");
  }
  // JSON white space before it is what the reference reader allows (to align the data)
  for (const char* start : {" ", "\n", "\t", "\r", " \t\r\n "})
    CHECK(st_parse(st_file(start + header, twelve)).entries().size() == 1);
  // spaces after the JSON are the padding the reference writer adds: accepted
  CHECK(st_parse(st_file(header + "       ", twelve)).entries().size() == 1);
}

TEST_CASE("deeply nested headers are rejected early, whatever nests, without exhausting the stack",
          "[io][errors]") {
  // The reference shape nests 3 levels; arrays or objects nested 65 to 100,000 levels deep, in
  // the shape, the offsets, the metadata or at the top, end in the same clear error.
  const auto nested = [](std::size_t depth, bool objects) {
    std::string s;
    for (std::size_t i = 0; i < depth; ++i) s += objects ? "{\"k\":" : "[";
    s += "1";
    for (std::size_t i = 0; i < depth; ++i) s += objects ? "}" : "]";
    return s;
  };
  for (const std::size_t extra :
       {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{100000}}) {
    for (const bool objects : {false, true}) {
      // (header, the levels around the nested value)
      const std::vector<std::pair<std::string, std::size_t>> headers = {
          {R"({"w":{"dtype":"F32","shape":@,"data_offsets":[0,12]}})", 2},
          {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":@}})", 2},
          {R"({"__metadata__":{"k":@}})", 2},
          {R"({"w":@})", 1},
      };
      for (const auto& [pattern, around] : headers) {
        // extra = 0: exactly 64 levels in all, rejected for what it holds instead
        const std::size_t depth = 64 - around + extra;
        std::string header = pattern;
        header.replace(header.find('@'), 1, nested(depth, objects));
        INFO("depth " << depth << (objects ? " of objects" : " of arrays") << " in " << pattern);
        const std::string message =
            error_message([&] { st_parse(st_file(header, std::string(12, '\0'))); });
        if (extra > 0)
          CHECK_THAT(message, Catch::Contains("nests deeper than 64 levels"));
        else
          CHECK_THAT(message, !Catch::Contains("nests deeper"));
        CHECK(message.size() < 400);
      }
    }
  }
}

TEST_CASE("messages quote at most a short piece of what the file holds", "[io][errors]") {
  Rng rng(8);
  for (const std::size_t length : {std::size_t{100}, std::size_t{10000}, std::size_t{1000000}}) {
    std::string name(length, 'n');
    for (char& c : name) c = static_cast<char>('a' + rng.uniform_int(26));
    const std::string twelve(12, '\0');
    st_rejects(
        st_file(R"({")" + name + R"(":{"dtype":"I64","shape":[3],"data_offsets":[0,12]}})", twelve),
        "bytes)");
    st_rejects(
        st_file(R"({"w":{"dtype":")" + name + R"(","shape":[3],"data_offsets":[0,12]}})", twelve),
        "is not a safetensors dtype");
    st_rejects(st_file(R"({"__metadata__":{"k":[")" + name + R"("]}})", ""), "is not a string");
    st_rejects(
        st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12],")" + name + R"(":1}})",
                twelve),
        "unexpected field");
    st_rejects(st_file(R"({"w":")" + name, twelve),
               "not valid JSON");  // unterminated: the parser's message quotes it all
    st_rejects(st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},")" + name +
                           R"(":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                       twelve),
               "overlap");
  }
  // control bytes in a quoted name are escaped
  st_rejects(st_file("{\"a\\u0001b\":1}", ""), "'a\\x01b'");
  st_rejects(st_file("{\"a\xff\xfe\":1}", ""),
             "not valid JSON");  // bytes that are not UTF-8: the parser quotes them, escaped
}

TEST_CASE("names and metadata that are not UTF-8 are refused on save, valid UTF-8 round trips",
          "[io][errors]") {
  Rng rng(9);
  // Generated ill-formed sequences: lone continuation bytes, overlong forms, surrogates, code
  // points above U+10FFFF, bytes that never occur, and sequences cut short.
  const std::vector<std::string> bad = {"\x80",
                                        "\xbf",
                                        "\xc0\xaf",
                                        "\xc1\xbf",
                                        "\xe0\x80\xaf",
                                        "\xed\xa0\x80",
                                        "\xed\xbf\xbf",
                                        "\xf0\x80\x80\xaf",
                                        "\xf4\x90\x80\x80",
                                        "\xf5\x80\x80\x80",
                                        "\xfe",
                                        "\xff",
                                        "\xc3",
                                        "\xe2\x82",
                                        "\xf0\x9f\x98"};
  const std::vector<std::string> good = {"\xc3\xa9",
                                         "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80",
                                         "\xef\xbf\xbf",
                                         "\xf4\x8f\xbf\xbf",
                                         "\xed\x9f\xbf",
                                         "a"};
  const std::string path = st_dir("utf8") + "/utf8.safetensors";
  const auto w = rng.normal_tensor<float>({2});
  remat::io::save<float>(path, {{"old", w}});
  const std::string before = st_bytes_of(path);
  const auto surround = [&](const std::string& piece) {
    std::string s;
    for (auto n = rng.uniform_int(4); n > 0; --n)
      s += good[static_cast<std::size_t>(rng.uniform_int(static_cast<std::int64_t>(good.size())))];
    s += piece;
    for (auto n = rng.uniform_int(4); n > 0; --n)
      s += good[static_cast<std::size_t>(rng.uniform_int(static_cast<std::int64_t>(good.size())))];
    return s;
  };
  for (const std::string& piece : bad) {
    const std::string text = surround(piece);
    INFO("bytes: " << remat::io::detail::brief(text));
    CHECK(remat::io::detail::invalid_utf8_at(text) != std::string_view::npos);
    const auto refused = [&](auto&& save) {
      const std::string message = error_message(save);
      CHECK_THAT(message, Catch::Contains("is not valid UTF-8") && Catch::Contains(path));
      CHECK(remat::io::detail::invalid_utf8_at(message) ==
            std::string_view::npos);  // the message itself is text
    };
    refused([&] { remat::io::save<float>(path, {{text, w}}); });
    refused([&] { remat::io::save<float>(path, {{"w", w}}, {{text, "v"}}); });
    refused([&] { remat::io::save<float>(path, {{"w", w}}, {{"k", text}}); });
  }
  CHECK(st_bytes_of(path) == before);  // each refusal left the file as it was
  CHECK(st_temporaries(fs::path(path).parent_path()).empty());
  for (int i = 0; i < 20; ++i) {
    const std::string name = surround("") + "x", value = surround("");
    CHECK(remat::io::detail::invalid_utf8_at(name) == std::string_view::npos);
    remat::io::save<float>(path, {{name, w}}, {{name, value}});
    const remat::io::File f = remat::io::File::read(path);
    CHECK(f.tensor<float>(name).to_vector() == w.to_vector());
    CHECK(f.metadata().at(name) == value);
  }
}

TEST_CASE("reading and saving report system errors as IoError with the file and strerror",
          "[io][errors]") {
  const std::string dir = st_dir("system_errors");
  const auto names = [](const std::string& message, const std::string& path, int err) {
    INFO(message);
    CHECK_THAT(message, Catch::Contains(path) && Catch::Contains(std::strerror(err)));
  };
  names(error_message([&] { remat::io::File::read(dir + "/missing.safetensors"); }),
        dir + "/missing.safetensors", ENOENT);
  names(error_message([&] { remat::io::File::read(dir); }), dir, EISDIR);
  names(error_message([&] { remat::io::File::read(dir + "/missing/x.safetensors"); }),
        dir + "/missing/x.safetensors", ENOENT);
  const auto w = Tensor<float>::zeros({2});
  names(error_message([&] {
          remat::io::save<float>(dir + "/missing/x.safetensors", {{"w", w}});
        }),
        dir + "/missing", ENOENT);
  names(error_message([&] { remat::io::save<float>(dir, {{"w", w}}); }), dir, EISDIR);
  fs::create_directory(dir + "/sub");
  names(error_message([&] {
          remat::io::save<float>(dir + "/sub/", {{"w", w}});
        }),
        dir + "/sub/", EISDIR);
  CHECK_THAT(error_message([&] { remat::io::File::read("/dev/null"); }),
             Catch::Contains("/dev/null: a character device, not a regular file"));
  CHECK_THAT(error_message([&] {
               remat::io::save<float>(dir + "/u.safetensors", {{"w", Tensor<float>()}});
             }),
             Catch::Contains("undefined"));

  // Permission denied, for a user other than root (the test may run as root, who passes every
  // permission check): an unreadable file, and a directory the user cannot write into.
  const std::string secret = dir + "/secret.safetensors";
  remat::io::save<float>(secret, {{"w", w}});
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(dir, fs::perms::all);  // so that nobody can reach the files in it
  const std::string locked = dir + "/locked";
  fs::create_directory(locked);
  fs::permissions(locked, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
  for (const fs::path& p :
       {fs::path(dir).parent_path(), fs::path(dir).parent_path().parent_path()}) {
    fs::permissions(p, fs::perms::others_exec, fs::perm_options::add);
  }
  const auto denied = [&](auto&& fn, const std::string& path) {
    return st_as_nobody([&] {
      try {
        fn();
      } catch (const IoError& e) {
        const std::string m = e.what();
        return m.find(path) != std::string::npos &&
                       m.find(std::strerror(EACCES)) != std::string::npos
                   ? 0
                   : 2;
      }
      return 1;  // no error at all
    });
  };
  CHECK(denied([&] { remat::io::File::read(secret); }, secret) == 0);
  CHECK(denied(
            [&] {
              remat::io::save<float>(locked + "/x.safetensors", {{"w", w}});
            },
            locked) == 0);
  CHECK(fs::is_empty(locked));
}

TEST_CASE("a failed save leaves the previous file intact and no temporary behind", "[io]") {
  const std::string dir = st_dir("atomic");
  const std::string path = dir + "/atomic.safetensors";
  Rng rng(2);
  const auto small = rng.normal_tensor<float>({4});
  remat::io::save<float>(path, {{"w", small}});
  const std::string before = st_bytes_of(path);
  // A child process saves something large under a file size limit: the write fails midway
  // (EFBIG), as on a full disk; at several sizes, so that it fails in the first or the second
  // tensor.
  for (const std::int64_t size : {std::int64_t{100000}, std::int64_t{1030}, std::int64_t{600}}) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      std::signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{4096, 4096};
      ::setrlimit(RLIMIT_FSIZE, &limit);
      try {
        remat::io::save<float>(
            path, {{"w", Tensor<float>::zeros({size})}, {"name", Tensor<float>::zeros({size})}});
      } catch (const IoError& e) {
        std::_Exit(std::string(e.what()).find(std::strerror(EFBIG)) != std::string::npos ? 42 : 43);
      }
      std::_Exit(1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 42);
    CHECK(st_bytes_of(path) == before);
    CHECK(st_temporaries(dir).empty());
  }
  CHECK(remat::io::File::read(path).tensor<float>("w").to_vector() == small.to_vector());
}

TEST_CASE("80 concurrent saves to one path all succeed and leave one whole version", "[io]") {
  const std::string dir = st_dir("concurrent");
  const std::string path = dir + "/shared.safetensors";
  constexpr int kThreads = 80;
  std::vector<std::string> versions(kThreads);
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    // each version differs in size and values, so that a mix of two is not a valid file of either
    threads.emplace_back([&, i] {
      Tensor<float> t({1 + 97 * i});
      for (float& x : t) x = static_cast<float>(i);
      try {
        remat::io::save<float>(path, {{"w", t}}, {{"version", std::to_string(i)}});
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(i)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) CHECK(failures[static_cast<std::size_t>(i)] == "");
  const remat::io::File f = remat::io::File::read(path);
  const int version = std::stoi(f.metadata().at("version"));
  const std::vector<float> w = f.tensor<float>("w").to_vector();
  CHECK(w.size() == static_cast<std::size_t>(1 + 97 * version));
  CHECK(std::all_of(w.begin(), w.end(), [&](float x) { return x == static_cast<float>(version); }));
  CHECK(st_temporaries(dir).empty());
}

TEST_CASE("a save keeps the file's permissions and writes through a symbolic link", "[io]") {
  const std::string dir = st_dir("keeps");
  const auto w = Tensor<float>::ones({3});
  Rng rng(10);
  for (int i = 0; i < 8; ++i) {
    const std::string path = dir + "/perm" + std::to_string(i) + ".safetensors";
    remat::io::save<float>(path, {{"w", w}});
    const auto mode = static_cast<fs::perms>(0400 | (rng.uniform_int(8) << 6 & 0300) |
                                             rng.uniform_int(0100));  // owner can read
    fs::permissions(path, mode);
    remat::io::save<float>(path, {{"w", w}, {"v", w}});
    CHECK(fs::status(path).permissions() == mode);
    CHECK(remat::io::File::read(path).entries().size() == 2);
  }
  // a new file gets 0666 less the umask, as any file the process creates
  const mode_t mask = ::umask(0);
  ::umask(mask);
  remat::io::save<float>(dir + "/new.safetensors", {{"w", w}});
  CHECK(fs::status(dir + "/new.safetensors").permissions() == static_cast<fs::perms>(0666 & ~mask));

  // links: absolute, relative, into another directory, a chain of two, and a dangling one
  fs::create_directory(dir + "/real");
  remat::io::save<float>(dir + "/real/target.safetensors", {{"old", w}});
  fs::create_symlink(dir + "/real/target.safetensors", dir + "/absolute");
  fs::create_symlink("real/target.safetensors", dir + "/relative");
  fs::create_symlink("relative", dir + "/chain");
  fs::create_symlink("real/later.safetensors", dir + "/dangling");
  int n = 0;
  for (const char* link : {"absolute", "relative", "chain"}) {
    const auto t = Tensor<float>::full({2}, static_cast<float>(++n));
    remat::io::save<float>(dir + "/" + link, {{"w", t}});
    CHECK(fs::is_symlink(dir + "/" + link));
    CHECK(remat::io::File::read(dir + "/real/target.safetensors").tensor<float>("w").to_vector() ==
          t.to_vector());
  }
  remat::io::save<float>(dir + "/dangling", {{"w", w}});
  CHECK(fs::is_symlink(dir + "/dangling"));
  CHECK(remat::io::File::read(dir + "/real/later.safetensors").contains("w"));
  CHECK(st_temporaries(dir).empty());
  CHECK(st_temporaries(dir + "/real").empty());
  fs::create_symlink("loop2", dir + "/loop1");
  fs::create_symlink("loop1", dir + "/loop2");
  CHECK_THAT(error_message([&] {
               remat::io::save<float>(dir + "/loop1", {{"w", w}});
             }),
             Catch::Contains(std::strerror(ELOOP)));
}

TEST_CASE(
    "the fuzzer's seed corpus holds what its names say: valid files read, every other one rejected",
    "[io][errors]") {
  // fuzz/make_corpus.py writes one seed per rejected class; a seed that stopped being rejected
  // (or a valid one that stopped being read) would leave a class unseeded.
  const fs::path corpus = fs::path(__FILE__).parent_path().parent_path().parent_path() / "fuzz" /
                          "corpus" / "safetensors";
  REQUIRE(fs::is_directory(corpus));
  int valid = 0, rejected = 0;
  for (const auto& e : fs::directory_iterator(corpus)) {
    const std::string name = e.path().filename().string();
    INFO(name);
    if (name.rfind("valid_", 0) == 0) {
      CHECK_NOTHROW(remat::io::File::read(e.path().string()));
      ++valid;
    } else {
      CHECK_THROWS_AS(remat::io::File::read(e.path().string()), IoError);
      ++rejected;
    }
  }
  CHECK(valid >= 4);
  CHECK(rejected >= 30);
}

TEST_CASE(
    "a FIFO, a directory or a device as a safetensors file is an IoError naming it, never a "
    "hang",
    "[io][errors]") {
  const std::string dir = st_dir("not_regular");
  const std::string fifo = dir + "/fifo.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // a blocking open of a FIFO waits for a writer forever: the child's alarm ends that
  CHECK(remat::test::run_in_child([&] {
          return remat::test::error_status([&] { remat::io::File::read(fifo); },
                                           {fifo.c_str(), "a FIFO", "not a regular file"});
        }) == 0);
  CHECK_THAT(error_message([&] { remat::io::File::read("/dev/zero"); }),
             Catch::Contains("/dev/zero") && Catch::Contains("a character device"));
  CHECK_THAT(error_message([&] { remat::io::File::read(dir); }),
             Catch::Contains(dir) && Catch::Contains(std::strerror(EISDIR)));
}

TEST_CASE("a file truncated after it was opened reads as an IoError or as its data, never a signal",
          "[io][errors]") {
  const std::string dir = st_dir("truncated_after_open");
  Rng rng(26);
  for (int trial = 0; trial < 12; ++trial) {
    // tensors of 1-3 pages each, so that truncation lands in, between and before them
    std::vector<remat::io::NamedTensor<float>> tensors;
    const int count = 1 + static_cast<int>(rng.uniform_int(4));
    for (int k = 0; k < count; ++k) {
      tensors.emplace_back(remat::detail::cat("t", k),
                           rng.normal_tensor<float>({1 + rng.uniform_int(3), 1024}));
    }
    const std::string path = dir + "/t" + std::to_string(trial) + ".safetensors";
    remat::io::save<float>(path, tensors);
    const auto size = static_cast<std::int64_t>(fs::file_size(path));
    const std::int64_t cut = rng.uniform_int(size);
    INFO("trial " << trial << ": " << count << " tensors, " << size << " bytes cut to " << cut);
    // in a child: a SIGBUS (a mapping read past the new end of the file) would end the test
    const int status = remat::test::run_in_child([&] {
      const remat::io::File file = remat::io::File::read(path);
      REQUIRE(::truncate(path.c_str(), cut) == 0);
      int read = 0;
      for (const auto& [name, t] : tensors) {
        try {
          const Tensor<float> back = file.tensor<float>(name);
          if (back.to_vector() != t.to_vector()) return 3;  // silently wrong data
          ++read;
        } catch (const IoError& e) {
          const std::string m = e.what();
          if (m.find(path) == std::string::npos || m.find("shrank") == std::string::npos) return 2;
        }
      }
      return read == count ? 4 : 0;  // at least the last tensor lies past the cut
    });
    CHECK(status == 0);
  }
}
