// Saves as the user sees them: a folder saved as a whole (io::save_folder), a failed save that
// leaves the old version as it was, and saves killed at random instants that leave the old or the
// new version and nothing that a later save would not remove.
#include "support/gradcheck.hpp"

#include <remat/io/folder.hpp>
#include <remat/io/safetensors.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <sys/resource.h>
#include <sys/wait.h>

namespace {

namespace fs = std::filesystem;
using remat::IoError;
using remat::Rng;
using remat::Tensor;

/// A fresh directory for one test (names are unique per process and test).
std::string sf_dir(const std::string& test) {
  const fs::path dir =
      fs::temp_directory_path() / ("remat_folder_test_" + std::to_string(::getpid())) / test;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string sf_bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Every file under `dir` (relative name -> bytes).
std::map<std::string, std::string> sf_snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = sf_bytes_of(e.path());
  }
  return out;
}

/// The names in `dir`.
std::vector<std::string> sf_names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Version `v` of a model folder: weights full of v (`values` of them) and a config naming v.
void sf_fill(const std::string& dir, int v, std::int64_t values) {
  Tensor<float> w({values});
  for (float& x : w) x = static_cast<float>(v);
  remat::io::save_text(dir + "/config.json", "{\"version\": " + std::to_string(v) + "}\n");
  remat::io::save<float>(dir + "/model.safetensors", {{"w", w}}, {{"version", std::to_string(v)}});
}

/// The version a folder holds, checking that its files agree (-1 if they do not).
int sf_version(const std::string& dir) {
  const std::string config = sf_bytes_of(dir + "/config.json");
  const int v = std::stoi(config.substr(config.find(':') + 1));
  const remat::io::File f = remat::io::File::read(dir + "/model.safetensors");
  const std::vector<float> w = f.tensor<float>("w").to_vector();
  const bool same = f.metadata().at("version") == std::to_string(v) &&
                    std::all_of(w.begin(), w.end(), [&](float x) { return x == float(v); });
  return same ? v : -1;
}

}  // namespace

TEST_CASE("save_folder replaces a folder whole, keeps its other files, drops old weights",
          "[io][save]") {
  const std::string parent = sf_dir("replace");
  const std::string dir = parent + "/model";
  remat::io::save_folder(dir, [](const std::string& d) { sf_fill(d, 1, 10); });
  CHECK(sf_version(dir) == 1);
  // a tokenizer the user put there, a subfolder, and shards of an older save
  remat::io::save_text(dir + "/tokenizer.json", "{\"mine\": true}");
  fs::create_directory(dir + "/extra");
  remat::io::save_text(dir + "/extra/notes.txt", "kept");
  remat::io::save_text(dir + "/model-00001-of-00002.safetensors", "stale shard");
  remat::io::save_text(dir + "/model.safetensors.index.json", "{}");
  remat::io::save_folder(dir, [](const std::string& d) { sf_fill(d, 2, 20); });
  CHECK(sf_version(dir) == 2);
  CHECK(sf_bytes_of(dir + "/tokenizer.json") == "{\"mine\": true}");
  CHECK(sf_bytes_of(dir + "/extra/notes.txt") == "kept");
  CHECK_FALSE(fs::exists(dir + "/model-00001-of-00002.safetensors"));
  CHECK_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  CHECK(sf_names(parent) == std::vector<std::string>{"model"});
  // through a symbolic link: the link stays, its folder is replaced
  fs::create_directory_symlink("model", parent + "/link");
  remat::io::save_folder(parent + "/link", [](const std::string& d) { sf_fill(d, 3, 5); });
  CHECK(fs::is_symlink(parent + "/link"));
  CHECK(sf_version(dir) == 3);
  CHECK(sf_names(parent) == std::vector<std::string>{"link", "model"});
  // a file where the folder should be is an error naming it
  remat::io::save_text(parent + "/file", "x");
  CHECK_THROWS_AS(remat::io::save_folder(parent + "/file", [](const std::string&) {}), IoError);
}

TEST_CASE("a failed folder save leaves the old folder as it was and nothing beside it",
          "[io][save]") {
  const std::string parent = sf_dir("failed");
  const std::string dir = parent + "/model";
  remat::io::save_folder(dir, [](const std::string& d) { sf_fill(d, 1, 100); });
  const auto before = sf_snapshot(dir);
  // the writer throws after a first file
  CHECK_THROWS_AS(remat::io::save_folder(dir,
                                         [](const std::string& d) {
                                           remat::io::save_text(d + "/config.json", "{}");
                                           throw IoError("disk full (simulated)");
                                         }),
                  IoError);
  CHECK(sf_snapshot(dir) == before);
  CHECK(sf_names(parent) == std::vector<std::string>{"model"});
  // a write fails midway (a file size limit: EFBIG, as a full disk's ENOSPC), at sizes that fail
  // in the config, in the weights' header or in their data
  Rng rng(26);
  for (int trial = 0; trial < 6; ++trial) {
    const rlim_t limit = 16 + static_cast<rlim_t>(rng.uniform_int(6000));
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      std::signal(SIGXFSZ, SIG_IGN);
      const rlimit r{limit, limit};
      ::setrlimit(RLIMIT_FSIZE, &r);
      try {
        remat::io::save_folder(dir, [](const std::string& d) { sf_fill(d, 2, 4000); });
      } catch (const IoError& e) {
        std::_Exit(std::string(e.what()).find(std::strerror(EFBIG)) != std::string::npos ? 42 : 43);
      }
      std::_Exit(1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 42);
    CHECK(sf_snapshot(dir) == before);
    CHECK(sf_names(parent) == std::vector<std::string>{"model"});
  }
  CHECK(sf_version(dir) == 1);
}

TEST_CASE("a save removes what saves killed earlier left, not what running ones write",
          "[io][save]") {
  const std::string dir = sf_dir("stale");
  const pid_t dead = ::fork();  // a process that has ended: its id names no running process
  REQUIRE(dead >= 0);
  if (dead == 0) std::_Exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string prefix = dir + "/.w.safetensors.tmp.";
  remat::io::save_text(prefix + std::to_string(dead) + ".7", "left by a killed save");
  fs::create_directory(dir + "/.model.tmp." + std::to_string(dead) + ".3");
  remat::io::save_text(prefix + std::to_string(::getpid()) + ".999", "a save of this process");
  remat::io::save_text(dir + "/.w.safetensors.tmp.notapid", "not ours");
  remat::io::save<float>(dir + "/w.safetensors", {{"w", Tensor<float>::ones({2})}});
  remat::io::save_folder(dir + "/model", [](const std::string& d) { sf_fill(d, 1, 3); });
  CHECK(sf_names(dir) ==
        std::vector<std::string>{".w.safetensors.tmp." + std::to_string(::getpid()) + ".999",
                                 ".w.safetensors.tmp.notapid", "model", "w.safetensors"});
}

TEST_CASE("saves killed at random instants leave the old or the new version, then nothing",
          "[io][save]") {
  const std::string parent = sf_dir("killed");
  const std::string dir = parent + "/model", file = parent + "/state.safetensors";
  remat::io::save_folder(dir, [](const std::string& d) { sf_fill(d, 0, 1); });
  remat::io::save<float>(file, {{"w", Tensor<float>::zeros({1})}}, {{"version", "0"}});
  // How long one save takes here, to spread the kills over it.
  const auto t0 = std::chrono::steady_clock::now();
  remat::io::save_folder(dir, [](const std::string& d) { sf_fill(d, 0, 1 << 16); });
  const double save_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  Rng rng(2026);
  int versions_seen = 0;
  // 12 kills spread over about three saves; if none came after a whole save (a loaded machine
  // can keep the child waiting that long), later kills wait longer, 20 ms more each time
  for (int trial = 0; trial < 12 || (versions_seen == 0 && trial < 24); ++trial) {
    const int last = sf_version(dir);
    REQUIRE(last >= 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // saves new versions of both until killed
      for (int v = last + 1;; ++v) {
        remat::io::save_folder(dir, [&](const std::string& d) { sf_fill(d, v, 1 << 16); });
        remat::io::save<float>(file, {{"w", Tensor<float>::full({1 << 14}, float(v))}},
                               {{"version", std::to_string(v)}});
      }
    }
    const double late_us = trial < 12 ? 0 : (trial - 11) * 20000.0;
    std::this_thread::sleep_for(
        std::chrono::microseconds(static_cast<long>(rng.uniform() * 3 * save_us + late_us)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    // whole versions under the target names: the folder's files agree, the file reads
    const int v = sf_version(dir);
    CHECK(v >= last);
    versions_seen += v > last;
    const remat::io::File f = remat::io::File::read(file);
    const std::vector<float> w = f.tensor<float>("w").to_vector();
    CHECK(std::all_of(w.begin(), w.end(),
                      [&](float x) { return x == std::stof(f.metadata().at("version")); }));
    // the next saves remove whatever the killed one left
    remat::io::save_folder(dir, [&](const std::string& d) { sf_fill(d, v, 1); });
    remat::io::save<float>(file, {{"w", Tensor<float>::zeros({1})}}, {{"version", "0"}});
    CHECK(sf_names(parent) == std::vector<std::string>{"model", "state.safetensors"});
  }
  CHECK(versions_seen > 0);  // some kills came after a whole save
}
