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
/// ignored. Values are converted from the files, a slice at a time, straight into the
/// parameters, so loading needs about the model's size in memory, not twice it.

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

/// Throws an IoError naming `config_path`, the sizes and their values unless the weight files
/// can hold the model `c` describes, judged from the headers before anything is allocated: the
/// embedding is model.embed_tokens.weight (vocab_size, hidden_size), and the files hold at least
/// the embedding's and the MLPs' values (vocab_size x hidden_size + num_hidden_layers x 3 x
/// hidden_size x intermediate_size). A config.json that says vocab_size = 2^40 beside weights
/// of 32,000 rows is refused here, not by an allocation failure.
inline void check_config_fits_files(const LlamaConfig& c, const io::WeightFiles& files,
                                    const std::string& config_path) {
  const std::string sizes = detail::cat(
      "vocab_size = ", c.vocab_size, ", hidden_size = ", c.hidden_size,
      ", intermediate_size = ", c.intermediate_size, ", num_hidden_layers = ", c.num_hidden_layers);
  const char* embedding = "model.embed_tokens.weight";
  if (files.contains(embedding)) {
    const Shape& s = files.file_of(embedding).entry(embedding).shape;
    if (!(s == Shape{c.vocab_size, c.hidden_size})) {
      throw IoError(detail::cat(config_path, " says vocab_size = ", c.vocab_size,
                                " and hidden_size = ", c.hidden_size, ", but ", embedding, " in ",
                                files.file_of(embedding).path(), " is ", s,
                                "; nothing was allocated"));
    }
  }
  // values the files hold, and the fewest the model needs: in long double, exact below 2^64
  // (any real model), and without overflow for any config
  long double held = 0;
  for (const io::File& f : files.files()) {
    for (const auto& [name, e] : f.entries()) held += static_cast<long double>(e.shape.numel());
  }
  const auto w = static_cast<long double>(c.hidden_size);
  const long double needed = static_cast<long double>(c.vocab_size) * w +
                             static_cast<long double>(c.num_hidden_layers) * 3 * w *
                                 static_cast<long double>(c.intermediate_size);
  if (needed > held) {
    throw IoError(detail::cat(
        config_path, " describes a model of more values than its weight files hold (", sizes,
        " need at least vocab_size x hidden_size + num_hidden_layers x 3 x hidden_size x "
        "intermediate_size; the files hold ",
        static_cast<std::uint64_t>(held), " values); nothing was allocated"));
  }
}

/// The model a Hugging Face folder holds: `dir`/config.json, then its weights (one file or
/// shards). Errors are IoErrors naming the file, field or tensor; the config's sizes are
/// checked against the weight files' headers (check_config_fits_files) before the model is
/// allocated.
template <class T = float>
Llama<T> load_llama(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  const LlamaConfig config = load_llama_config(config_path);
  const io::WeightFiles files =
      io::WeightFiles::open(dir);  // before building: a bad folder fails fast
  check_config_fits_files(config, files, config_path);
  Llama<T> model(config);
  load_weights(model, files);
  return model;
}

}  // namespace remat::nn
