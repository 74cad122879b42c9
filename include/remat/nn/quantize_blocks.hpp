#pragma once
/// @file
/// Freezes the linear weights of a GPT's blocks or a Llama's decoder layers in a low-precision
/// storage (nn::Linear::quantize), as QLoRA does: the embeddings, the norms, the biases and the
/// head stay float (the head's weight feeds the chunked loss, which reads a float Parameter).
/// The float matrices freed go back to the system, not to the allocator's cache
/// (Linear::quantize releases the cache): a run that quantizes once would otherwise keep them
/// resident.

#include "remat/nn/gpt.hpp"
#include "remat/nn/llama.hpp"

namespace remat::nn {

/// Quantizes qkv, the attention's proj, fc and the MLP's proj of every block.
template <class T>
void quantize_blocks(GPT<T>& model, WeightStorage storage, bool double_quant = true) {
  for (TransformerBlock<T>& b : model.blocks) {
    for (Linear<T>* l : {&b.attn.qkv, &b.attn.proj, &b.mlp.fc, &b.mlp.proj})
      l->quantize(storage, double_quant);
  }
}

/// Quantizes the seven projections of every decoder layer.
template <class T>
void quantize_blocks(Llama<T>& model, WeightStorage storage, bool double_quant = true) {
  for (LlamaDecoderLayer<T>& d : model.layers) {
    for (Linear<T>* l : {&d.self_attn.q_proj, &d.self_attn.k_proj, &d.self_attn.v_proj,
                         &d.self_attn.o_proj, &d.mlp.gate_proj, &d.mlp.up_proj, &d.mlp.down_proj}) {
      l->quantize(storage, double_quant);
    }
  }
}

}  // namespace remat::nn
