// libFuzzer target: any bytes given as adapter_config.json to hub::load_adapters (beside
// a valid adapter_model.safetensors of a tiny model's rank-2 adapters) either end in a
// remat::Error, leaving the adapters as they were, or load them. Anything else (a crash, a
// sanitizer report, another exception such as nlohmann's) is a bug.
#include <remat/nn/llama.hpp>
#include <remat/nn/lora.hpp>
#include <remat/hub/peft.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

namespace lora = remat::nn::lora;

/// A tiny Llama with rank-2 adapters on q_proj, their files saved once in a folder of its own.
struct Fixture {
  remat::nn::Llama<float> model{remat::nn::LlamaConfig{.vocab_size = 5,
                                                       .hidden_size = 4,
                                                       .intermediate_size = 4,
                                                       .num_hidden_layers = 1,
                                                       .num_attention_heads = 2,
                                                       .num_key_value_heads = 2,
                                                       .max_position_embeddings = 4}};
  lora::Adapters<float> adapters =
      lora::apply(model, {.rank = 2, .alpha = 4, .targets = {"q_proj"}});
  std::string dir;

  Fixture() {
    char pattern[] = "/tmp/remat_adapter_fuzz.XXXXXX";
    check(::mkdtemp(pattern) != nullptr);
    dir = pattern;
    remat::hub::save_adapters(adapters, dir);
  }
  ~Fixture() {
    std::remove((dir + "/adapter_config.json").c_str());
    std::remove((dir + "/adapter_model.safetensors").c_str());
    ::rmdir(dir.c_str());
  }
};

std::vector<std::vector<float>> values(const lora::Adapters<float>& a) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : a.named_parameters()) out.push_back(p.value().to_vector());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture fixture;
  {
    std::ofstream out(fixture.dir + "/adapter_config.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    check(static_cast<bool>(out));
  }
  const auto before = values(fixture.adapters);
  try {
    remat::hub::load_adapters(fixture.adapters, fixture.dir);
  } catch (const remat::Error&) {
    check(values(fixture.adapters) == before);  // all or nothing
  }
  return 0;
}
