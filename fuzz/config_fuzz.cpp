// libFuzzer target: any bytes given to the config.json reader (hub::parse_llama_config) either end
// in a remat::Error or give a config that validates, whose sizes make tensors that can exist,
// and that remat's writer writes back into a config.json read as the same config. Anything else
// (a crash, a sanitizer report, another exception such as nlohmann's or std::bad_alloc) is a bug.
#include <remat/hub/llama_config.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool same(const remat::nn::LlamaConfig& a, const remat::nn::LlamaConfig& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size && a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads &&
         a.max_position_embeddings == b.max_position_embeddings && a.rope_theta == b.rope_theta &&
         a.rms_norm_eps == b.rms_norm_eps && a.tie_word_embeddings == b.tie_word_embeddings &&
         a.attention_bias == b.attention_bias && a.initializer_range == b.initializer_range;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const remat::nn::LlamaConfig c = remat::hub::parse_llama_config(text, "fuzz input");
    c.validate();
    // the embedding's shape exists (the reader refuses sizes whose tensors overflow)
    (void)remat::Shape{c.vocab_size, c.hidden_size};
    (void)remat::Shape{c.intermediate_size, c.hidden_size};
    const remat::nn::LlamaConfig back =
        remat::hub::parse_llama_config(remat::hub::llama_config_json(c), "fuzz output");
    check(same(c, back));
  } catch (const remat::Error&) {
    // rejected with a clear error: what we want for bad input
  }
  return 0;
}
