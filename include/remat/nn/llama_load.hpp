#pragma once
/// @file
/// Loads a Hugging Face model folder (config.json and model.safetensors, or an index and its
/// shards; F32, BF16 or F16 weights, F64 too into double) into an nn::Llama. It sits above nn and
/// io: io knows tensors, nn::Llama knows its parameters' names, and this joins them.
///
/// Nothing is half-loaded: every parameter's name, shape and dtype is checked against the files'
/// headers before any value is written (io::WeightFiles::load), so a mismatch is an IoError
/// naming the tensor, the file and both shapes, and leaves the model as it was. Tensors the files
/// hold that the model has no parameter for (a tied model's lm_head.weight, rotary buffers) are
/// ignored. Values are converted from the files' memory maps straight into the parameters, so
/// loading needs about the model's size in memory, not twice it.

#include <string>
#include <vector>

#include "remat/io/weight_files.hpp"
#include "remat/nn/llama.hpp"
#include "remat/nn/llama_config.hpp"

namespace remat::nn {

/// Overwrites every parameter of `model` with the tensor of the same name in `files`, all or
/// nothing (see the file comment).
template <class T>
void load_weights(Module<T>& model, const io::WeightFiles& files) {
  std::vector<io::NamedTensor<T>> targets;
  for (auto& [name, p] : model.named_parameters())
    targets.emplace_back(name, p.data());  // shares the parameter's storage
  files.load(targets);
}

/// The model a Hugging Face folder holds: `dir`/config.json, then its weights (one file or
/// shards). Errors are IoErrors naming the file, field or tensor.
template <class T = float>
Llama<T> load_llama(const std::string& dir) {
  const LlamaConfig config = load_llama_config(dir + "/config.json");
  const io::WeightFiles files =
      io::WeightFiles::open(dir);  // before building: a bad folder fails fast
  Llama<T> model(config);
  load_weights(model, files);
  return model;
}

}  // namespace remat::nn
