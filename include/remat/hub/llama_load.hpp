#pragma once
/// @file
/// Loads a Hugging Face model folder (config.json and model.safetensors, or an index and its
/// shards; F32, BF16 or F16 weights, F64 too into double) into an nn::Llama. It sits above nn and
/// io: io knows tensors, nn::Llama knows its parameters' names, and this joins them.
///
/// Every tensor is accounted for: each parameter's name, shape and dtype is checked against the
/// files' headers (io::WeightFiles::load), and a tensor the files hold that the model does not
/// use is an IoError naming it and its file. Excepted by name: Hugging Face's rotary buffers
/// (`*.rotary_emb.inv_freq`, recomputed from the config), and a tied model's `lm_head.weight`
/// when it holds exactly the embedding's bytes (HF ties them when loading). A vocab_size that
/// does not match the embedding's rows is named as such.
///
/// Loading at size: load_llama() builds the model without drawing random values the files would
/// overwrite (Llama::uninitialized), and converts values from the files a slice at a time straight
/// into the parameters, so loading needs about the model's size in memory. With
/// LoadOptions::projections set to bf16, int8 or nf4, each decoder projection is read (one matrix
/// at a time) and stored frozen in that format as the model is built: the float matrices of the
/// whole model are never held (QLoRA's base model).

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "remat/core/memory.hpp"
#include "remat/io/weight_files.hpp"
#include "remat/nn/llama.hpp"
#include "remat/hub/llama_config.hpp"

namespace remat::hub {

/// How load_llama stores what it reads.
struct LoadOptions {
  /// The decoder layers' seven projections: f32 keeps them as float Parameters (trainable);
  /// bf16, int8 or nf4 freezes them in that storage (core/quantized.hpp), quantized one matrix at
  /// a time as they are read. Embeddings, norms, biases and the head stay float.
  WeightStorage projections = WeightStorage::f32;
  bool double_quant = true;  ///< NF4's absmax stored in 8 bits (QLoRA's double quantization)
};

/// Overwrites every parameter of `model` with the tensor of the same name in `files`, all or
/// nothing (see the file comment). Tensors the files hold beyond the model's are not looked at
/// here (load_llama refuses them).
template <class T>
void load_weights(nn::Module<T>& model, const io::WeightFiles& files) {
  std::vector<io::NamedTensor<T>> targets;
  for (auto& [name, p] : model.named_parameters())
    targets.emplace_back(name, p.data());  // shares the parameter's storage
  files.load(targets);
}

/// Throws an IoError naming `config_path`, the sizes and their values unless the weight files
/// can hold the model `c` describes, judged from the headers before anything is allocated: the
/// files hold at least
/// the embedding's and the MLPs' values (vocab_size x hidden_size + num_hidden_layers x 3 x
/// hidden_size x intermediate_size). A config.json that says vocab_size = 2^40 beside weights
/// of 32,000 rows is refused here, not by an allocation failure.
inline void check_config_fits_files(const nn::LlamaConfig& c, const io::WeightFiles& files,
                                    const std::string& config_path) {
  const std::string sizes = remat::detail::cat(
      "vocab_size = ", c.vocab_size, ", hidden_size = ", c.hidden_size,
      ", intermediate_size = ", c.intermediate_size, ", num_hidden_layers = ", c.num_hidden_layers);
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
    throw IoError(remat::detail::cat(
        config_path, " describes a model of more values than its weight files hold (", sizes,
        " need at least vocab_size x hidden_size + num_hidden_layers x 3 x hidden_size x "
        "intermediate_size; the files hold ",
        static_cast<std::uint64_t>(held), " values); nothing was allocated"));
  }
}

}  // namespace remat::hub

namespace remat::detail {

/// Whether a tensor the model has no parameter for may stay unread: a rotary buffer, or a tied
/// head that duplicates the embedding byte for byte.
inline bool llama_tensor_known_unused(const std::string& name, const io::WeightFiles& files,
                                      const nn::LlamaConfig& c) {
  const std::string buffer = ".rotary_emb.inv_freq";
  if (name.size() > buffer.size() &&
      name.compare(name.size() - buffer.size(), buffer.size(), buffer) == 0)
    return true;
  if (name != "lm_head.weight" || !c.tie_word_embeddings ||
      !files.contains("model.embed_tokens.weight"))
    return false;
  const auto& head = files.file_of(name);
  const auto& embed = files.file_of("model.embed_tokens.weight");
  if (head.entry(name).dtype != embed.entry("model.embed_tokens.weight").dtype) return false;
  const auto a = head.bytes(name), b = embed.bytes("model.embed_tokens.weight");
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

/// Checks what the config says against the embedding's and the head's shapes in the files, so
/// that a vocab_size or hidden_size mismatch is named as such.
inline void check_llama_vocabulary(const nn::LlamaConfig& c, const io::WeightFiles& files,
                                   const std::string& config_path) {
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    if (!files.contains(name) || (c.tie_word_embeddings && std::string(name) == "lm_head.weight"))
      continue;
    const Shape& s = files.file_of(name).entry(name).shape;
    if (s.rank() == 2 && s[0] != c.vocab_size) {
      throw IoError(cat(config_path, ": vocab_size = ", c.vocab_size, ", but tensor '", name,
                        "' in ", files.file_of(name).path(), " has ", s[0], " rows (shape ", s,
                        ")"));
    }
    if (s.rank() == 2 && s[1] != c.hidden_size) {
      throw IoError(cat(config_path, ": hidden_size = ", c.hidden_size, ", but tensor '", name,
                        "' in ", files.file_of(name).path(), " has ", s[1], " columns (shape ", s,
                        ")"));
    }
  }
}

/// Throws on the first tensor of `files` that `used` does not name and that is not known to be
/// unused (llama_tensor_known_unused).
inline void refuse_unused_tensors(const std::set<std::string>& used, const io::WeightFiles& files,
                                  const nn::LlamaConfig& c) {
  for (const std::string& name : files.names()) {
    if (used.count(name) || llama_tensor_known_unused(name, files, c)) continue;
    throw IoError(cat("safetensors: tensor '", name, "' in ", files.file_of(name).path(),
                      " is not used by the ", c.model_type,
                      " model its config.json describes (no parameter of that name)",
                      name == "lm_head.weight" ? "; the config ties the head to the embedding, "
                                                 "and this tensor differs from it"
                                               : ""));
  }
}

/// Reads projection `name`'s weight into a frozen Linear of `storage`: one float matrix at a
/// time, freed once quantized. The bias, if any, is a float Parameter load_weights fills.
template <class T>
nn::Linear<T> load_frozen_projection(const io::WeightFiles& files, const std::string& name,
                                     std::int64_t in, std::int64_t out, bool bias,
                                     const hub::LoadOptions& options) {
  const std::string weight = name + ".weight";
  Tensor<T> w(Shape{out, in});
  files.load(std::vector<io::NamedTensor<T>>{{weight, w}});  // checks name, shape and dtype
  auto q = std::make_shared<const QuantizedWeight>(
      QuantizedWeight::quantize(w, options.projections, options.double_quant));
  return nn::Linear<T>::from_quantized(std::move(q), bias ? Tensor<T>(Shape{out}) : Tensor<T>());
}

}  // namespace remat::detail

namespace remat::hub {

/// The model a Hugging Face folder holds: `dir`/config.json, then its weights (one file or
/// shards), stored as `options` says. Errors are IoErrors naming the file, field or tensor.
template <class T = float>
nn::Llama<T> load_llama(const std::string& dir, const LoadOptions& options = {}) {
  const std::string config_path = dir + "/config.json";
  const nn::LlamaConfig config = load_llama_config(config_path);
  const io::WeightFiles files =
      io::WeightFiles::open(dir);  // before building: a bad folder fails fast
  remat::detail::check_llama_vocabulary(config, files, config_path);
  check_config_fits_files(config, files, config_path);
  std::set<std::string> used;
  nn::Llama<T> model = [&] {
    if (options.projections == WeightStorage::f32) return nn::Llama<T>::uninitialized(config);
    const nn::LinearMaker<T> make = [&](const std::string& name, std::int64_t in, std::int64_t out,
                                        bool bias) {
      used.insert(name + ".weight");
      return remat::detail::load_frozen_projection<T>(files, name, in, out, bias, options);
    };
    return nn::Llama<T>::with_projections(config, make);
  }();
  for (const auto& [name, p] : model.named_parameters()) used.insert(name);
  remat::detail::refuse_unused_tensors(used, files, config);
  load_weights(model, files);
  // each projection's float matrix was freed once quantized: back to the system, not cached
  if (options.projections != WeightStorage::f32) memory::release_cache();
  return model;
}

}  // namespace remat::hub
