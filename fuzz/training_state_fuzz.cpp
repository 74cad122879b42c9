// libFuzzer target: any bytes given as a training state file to train::load_training_state (a
// one-layer model, AdamW) either end in a remat::Error, leaving the model and the optimizer as
// they were, or load a state with a finite learning rate >= 0 and a step count >= 0 that remat
// saves and loads back to the same values. Anything else (a crash, a sanitizer report, another
// exception) is a bug.
#include <remat/nn/layers.hpp>
#include <remat/optim/adamw.hpp>
#include <remat/train/training_state.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

/// A (1 x 2) linear layer without bias (parameter "weight") and its AdamW, as fuzz/make_corpus.py
/// writes their seeds; a second pair to load a saved state back into.
struct Fixture {
  remat::Rng rng{1};
  remat::nn::Linear<float> model{2, 1, rng, false}, again{2, 1, rng, false};
  remat::optim::AdamW<float> opt{model.parameters()}, opt_again{again.parameters()};
  std::string dir;

  Fixture() {
    char pattern[] = "/tmp/remat_state_fuzz.XXXXXX";
    check(::mkdtemp(pattern) != nullptr);
    dir = pattern;
  }
  ~Fixture() {
    std::remove((dir + "/in.safetensors").c_str());
    std::remove((dir + "/out.safetensors").c_str());
    ::rmdir(dir.c_str());
  }
};

std::vector<float> weights(const remat::nn::Linear<float>& m) {
  return m.parameters()[0].value().to_vector();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture f;
  const std::string in = f.dir + "/in.safetensors";
  {
    std::ofstream out(in, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    check(static_cast<bool>(out));
  }
  const auto before = weights(f.model);
  const auto steps = f.opt.steps();
  const double lr = f.opt.lr();
  try {
    remat::train::load_training_state(in, f.model, f.opt);
  } catch (const remat::Error&) {
    // rejected with a clear error, and nothing changed
    check(weights(f.model) == before && f.opt.steps() == steps && f.opt.lr() == lr);
    return 0;
  }
  check(std::isfinite(f.opt.lr()) && f.opt.lr() >= 0 && f.opt.steps() >= 0);
  const std::string out = f.dir + "/out.safetensors";
  remat::train::save_training_state(out, f.model, f.opt);
  remat::train::load_training_state(out, f.again, f.opt_again);
  const auto a = weights(f.model), b = weights(f.again);
  check(a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
          return x == y || (std::isnan(x) && std::isnan(y));
        }));
  check(f.opt_again.steps() == f.opt.steps() && f.opt_again.lr() == f.opt.lr());
  return 0;
}
