#include "support/gradcheck.hpp"

#include <remat/io/parameters.hpp>
#include <remat/nn/gpt.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sys/resource.h>
#include <sys/wait.h>

using namespace remat;
using remat::test::error_message;
namespace fs = std::filesystem;

namespace {

std::string temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("remat_io_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// A file with the given JSON header and data bytes.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

}  // namespace

TEMPLATE_TEST_CASE("safetensors round trip: names, shapes, values and metadata", "[io]", float, double) {
  using T = TestType;
  Rng rng(1);
  const auto a = rng.normal_tensor<T>({3, 4});
  const auto b = rng.normal_tensor<T>({5});
  const auto empty = Tensor<T>::zeros({0, 2});
  const std::string path = temp_path("round_trip.safetensors");
  io::save<T>(path, {{"layer.a", a}, {"b", b}, {"empty", empty}}, {{"step", "12"}});
  const io::File f = io::File::read(path);
  CHECK(f.metadata().at("step") == "12");
  CHECK(f.entries().size() == 3);
  CHECK(f.tensor<T>("layer.a").to_vector() == a.to_vector());
  CHECK(f.tensor<T>("b").shape() == Shape{5});
  CHECK(f.tensor<T>("empty").shape() == Shape{0, 2});
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, bytes_of(path).data(), 8);
  CHECK((8 + header_length) % 8 == 0);  // header padded: the data starts 8-byte aligned
  using Other = std::conditional_t<std::is_same_v<T, float>, double, float>;
  CHECK_THROWS_AS(f.tensor<Other>("b"), IoError);
}

TEST_CASE("safetensors files written by hand in the reference layout are read", "[io]") {
  // As Python's safetensors writes them: F32 little-endian, offsets relative to the data.
  const float values[3] = {1.5f, -2.0f, 0.25f};
  std::string data(reinterpret_cast<const char*>(values), sizeof values);
  const std::string path = temp_path("by_hand.safetensors");
  write_bytes(path, make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"__metadata__":{"format":"pt"}})", data));
  const io::File f = io::File::read(path);
  CHECK(f.tensor<float>("w").to_vector() == std::vector<float>{1.5f, -2.0f, 0.25f});
  CHECK(f.metadata().at("format") == "pt");
}

TEST_CASE("malformed safetensors files are rejected with a clear error", "[io][errors]") {
  const std::string path = temp_path("bad.safetensors");
  const std::string twelve(12, '\0');
  const auto rejects = [&](const std::string& bytes, const std::string& fragment) {
    write_bytes(path, bytes);
    INFO("expecting: " << fragment);
    CHECK_THAT(error_message([&] { io::File::read(path); }), Catch::Contains(fragment));
  };
  const auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
  };
  rejects("abc", "fewer than the 8");
  rejects(make_file(entry("F32", "[3]", "[0,12]"), twelve).substr(0, 30), "runs past the end");  // truncated header
  rejects(make_file(entry("F32", "[3]", "[0,12]"), twelve.substr(0, 8)), "fall outside");         // truncated data
  rejects(make_file("{not json", ""), "not valid JSON");
  rejects(make_file("[1,2]", ""), "not a JSON object");
  rejects(make_file(entry("I64", "[3]", "[0,24]"), std::string(24, '\0')), "dtype 'I64' is not supported");
  rejects(make_file(entry("F32", "[3]", "[0,8]"), std::string(8, '\0')), "needs 12");
  rejects(make_file(entry("F32", "[-3]", "[0,12]"), twelve), "not a non-negative integer");
  rejects(make_file(entry("F32", "[3]", "[4,16]"), twelve), "fall outside");
  rejects(make_file(entry("F32", "[3]", "[12,0]"), twelve), "fall outside");
  rejects(make_file(entry("F32", "[3]", "[0]"), twelve), "no data_offsets pair");
  rejects(make_file(R"({"w":{"shape":[3],"data_offsets":[0,12]}})", twelve), "no dtype");
  rejects(make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12],"extra":1}})", twelve), "unexpected field 'extra'");
  rejects(make_file(entry("F32", "[3]", "[0,12]"), std::string(16, '\0')), "cover 12 bytes of data but 16");
  rejects(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", twelve),
          "overlap");
  rejects(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", twelve),
          "a hole");
  rejects(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    std::string(8, '\0')),
          "appears twice");
  rejects(make_file(R"({"__metadata__":{"k":1}})", ""), "is not a string");
  std::string huge(8, '\0');
  const std::uint64_t big = 1ull << 40;
  std::memcpy(huge.data(), &big, 8);
  rejects(huge, "exceeds");
  CHECK_THROWS_AS(io::File::read(temp_path("does_not_exist")), IoError);
}

TEST_CASE("loading parameters is all or nothing: missing, unexpected and wrong shapes are named", "[io][errors]") {
  const nn::GPTConfig c{.vocab = 7, .context = 4, .layers = 2, .heads = 1, .width = 4, .seed = 1};
  nn::GPT<float> a(c);
  const std::string path = temp_path("gpt.safetensors");
  io::save_parameters(path, a, {{"note", "hello"}});
  nn::GPT<float> b(nn::GPTConfig{.vocab = 7, .context = 4, .layers = 2, .heads = 1, .width = 4, .seed = 2});
  CHECK(io::load_parameters(path, b).at("note") == "hello");
  for (std::size_t i = 0; i < a.parameters().size(); ++i) CHECK(b.parameters()[i].value().to_vector() == a.parameters()[i].value().to_vector());

  nn::GPT<float> deeper(nn::GPTConfig{.vocab = 7, .context = 4, .layers = 3, .heads = 1, .width = 4, .seed = 3});
  const std::vector<float> before = deeper.wte.weight.value().to_vector();
  CHECK_THAT(error_message([&] { io::load_parameters(path, deeper); }),
             Catch::Contains("missing: blocks.2.") && Catch::Contains("nothing was loaded"));
  CHECK(deeper.wte.weight.value().to_vector() == before);  // untouched
  nn::GPT<float> shallower(nn::GPTConfig{.vocab = 7, .context = 4, .layers = 1, .heads = 1, .width = 4, .seed = 3});
  CHECK_THAT(error_message([&] { io::load_parameters(path, shallower); }), Catch::Contains("unexpected: blocks.1."));
  nn::GPT<float> wider(nn::GPTConfig{.vocab = 9, .context = 4, .layers = 2, .heads = 1, .width = 4, .seed = 3});
  CHECK_THAT(error_message([&] { io::load_parameters(path, wider); }), Catch::Contains("wte.weight (file: F32 (7, 4), model: F32 (9, 4))"));
  nn::GPT<double> doubled(c);
  CHECK_THAT(error_message([&] { io::load_parameters(path, doubled); }), Catch::Contains("model: F64"));
}

TEST_CASE("a failed save leaves the previous file intact", "[io]") {
  const std::string path = temp_path("atomic.safetensors");
  Rng rng(2);
  const auto small = rng.normal_tensor<float>({4});
  io::save<float>(path, {{"w", small}});
  const std::string before = bytes_of(path);
  // A child process saves something large under a file size limit: the write fails midway
  // (EFBIG), as on a full disk.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      io::save<float>(path, {{"w", Tensor<float>::zeros({100000})}});
    } catch (const IoError&) {
      std::_Exit(42);
    }
    std::_Exit(1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 42);
  CHECK(bytes_of(path) == before);
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    CHECK(e.path().string().find(".tmp.") == std::string::npos);  // no temporary left behind
  }
  CHECK(io::File::read(path).tensor<float>("w").to_vector() == small.to_vector());
}

TEST_CASE("training state round trip restores parameters, AdamW moments and counts", "[io]") {
  const nn::GPTConfig c{.vocab = 7, .context = 4, .layers = 1, .heads = 1, .width = 4, .seed = 1};
  nn::GPT<float> a(c);
  optim::AdamW<float> oa(a.parameters(), {.lr = 0.01});
  const auto ids = remat::test::ids({2, 4}, 7, 1);
  for (int step = 0; step < 2; ++step) {
    Tape tape;
    tape.backward(a.loss(ids, ids));
    oa.step();
    oa.zero_grad();
  }
  const std::string path = temp_path("state.safetensors");
  io::save_training_state(path, a, oa, {{"data.cursor", "5"}});
  nn::GPT<float> b(nn::GPTConfig{.vocab = 7, .context = 4, .layers = 1, .heads = 1, .width = 4, .seed = 9});
  optim::AdamW<float> ob(b.parameters(), {.lr = 0.01});
  CHECK(io::load_training_state(path, b, ob).at("data.cursor") == "5");
  CHECK(ob.steps() == 2);
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    CHECK(ob.first_moment(i).to_vector() == oa.first_moment(i).to_vector());
    CHECK(ob.updates(i) == oa.updates(i));
  }
  // one more step on each gives the same parameters
  for (auto* pair : {&a, &b}) {
    Tape tape;
    tape.backward(pair->loss(ids, ids));
  }
  oa.step();
  ob.step();
  for (std::size_t i = 0; i < a.parameters().size(); ++i) CHECK(b.parameters()[i].value().to_vector() == a.parameters()[i].value().to_vector());
}
