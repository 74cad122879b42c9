#pragma once
/// @file
/// LoRA (Hu et al., 2021): low-rank adapters on frozen linear layers. apply() wraps every Linear
/// whose module path ends in one of the target names (as PEFT matches target_modules) so that
/// its forward becomes
///   base(x) + (alpha / rank) * B(A(dropout(x)))
/// with A (rank, in) Kaiming-uniform as PEFT initializes it (kaiming_uniform_(a = sqrt(5)), i.e.
/// uniform in +-1/sqrt(in)) and B (out, rank) zero, so the wrapped model starts as the base
/// model. Everything else is frozen: only the adapters get gradients and optimizer state.
///
/// The base layer's own forward runs unchanged (Note [forward hooks] in nn/module.hpp): the
/// adapters never read the base weight, however the base stores it; only merge() does. The
/// adapters are registered as children "lora_A" and "lora_B" of the layer they wrap, so they
/// appear in named_parameters() as "<path>.lora_A.weight", run under every checkpoint plan and
/// policy like any parameter, and save_adapters() writes them under PEFT's names
/// "base_model.model.<path>.lora_A.weight".

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/io/folder.hpp"
#include "remat/io/json.hpp"
#include "remat/io/safetensors.hpp"
#include "remat/nn/layers.hpp"
#include "remat/ops/arithmetic.hpp"
#include "remat/ops/dropout.hpp"

namespace remat::nn::lora {

/// PEFT's LoraConfig fields that remat supports (bias is always "none").
struct Options {
  std::int64_t rank = 8;             ///< r
  double alpha = 16.0;               ///< lora_alpha; the adapters' output is scaled by alpha / rank
  double dropout = 0.0;              ///< lora_dropout, on the adapters' input only
  std::vector<std::string> targets;  ///< target_modules: last components of module paths
  std::uint64_t seed = 0;            ///< initialization of the A matrices
  std::string base_model_name_or_path;  ///< written to adapter_config.json
};

/// One wrapped layer: its path in the model, the layer, and its adapters.
template <class T = float>
struct Adapter {
  std::string path;
  Module<T> layer;
  Linear<T> A, B;  // lora_A: in -> rank, lora_B: rank -> out, no biases
};

/// The adapters apply() added to a model: their parameters, PEFT files, and merge().
template <class T = float>
class Adapters {
 public:
  Adapters(Options options, std::vector<Adapter<T>> adapters)
      : options_(std::move(options)), adapters_(std::move(adapters)) {}

  const Options& options() const noexcept { return options_; }
  const std::vector<Adapter<T>>& adapters() const noexcept { return adapters_; }
  double scale() const noexcept { return options_.alpha / double(options_.rank); }

  /// The adapters' parameters (A then B, layer by layer) with PEFT's names.
  std::vector<std::pair<std::string, Parameter<T>>> named_parameters() const {
    std::vector<std::pair<std::string, Parameter<T>>> out;
    for (const Adapter<T>& a : adapters_) {
      out.emplace_back(peft_name(a.path, "lora_A"), a.A.weight);
      out.emplace_back(peft_name(a.path, "lora_B"), a.B.weight);
    }
    return out;
  }
  std::vector<Parameter<T>> parameters() const {
    std::vector<Parameter<T>> out;
    for (auto& [n, p] : named_parameters()) out.push_back(p);
    return out;
  }
  std::int64_t parameter_count() const {
    std::int64_t n = 0;
    for (const auto& [name, p] : named_parameters()) n += p.numel();
    return n;
  }

  /// "base_model.model.<path>.lora_A.weight", PEFT's name in adapter_model.safetensors.
  static std::string peft_name(const std::string& path, const char* which) {
    return remat::detail::cat("base_model.model.", path.empty() ? std::string() : path + ".", which,
                              ".weight");
  }

  /// Writes `dir`/adapter_model.safetensors and `dir`/adapter_config.json (PEFT's layout), as a
  /// whole (io::save_folder): an earlier save in `dir` stays readable until the new one is
  /// complete, and a failed save leaves it as it was.
  void save_adapters(const std::string& dir) const {
    check_not_merged("save_adapters");
    std::vector<io::NamedTensor<T>> tensors;
    for (const auto& [name, p] : named_parameters()) tensors.emplace_back(name, p.value());
    nlohmann::json config = {
        {"peft_type", "LORA"},
        {"task_type", "CAUSAL_LM"},
        {"r", options_.rank},
        {"lora_alpha", options_.alpha},
        {"lora_dropout", options_.dropout},
        {"target_modules", options_.targets},
        {"bias", "none"},
        {"fan_in_fan_out", false},
        {"inference_mode", false},
        {"base_model_name_or_path", options_.base_model_name_or_path},
    };
    io::save_folder(dir, [&](const std::string& staging) {
      io::save<T>(staging + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
      io::save_text(staging + "/adapter_config.json", config.dump(2) + "\n");
    });
  }

  /// Reads adapters saved by save_adapters() (or by PEFT with the same rank and targets) into
  /// these, all or nothing: a config whose r or lora_alpha differs, a tensor missing, extra, of
  /// another shape or dtype is an IoError naming it, and nothing is changed.
  void load_adapters(const std::string& dir) {
    check_not_merged("load_adapters");
    const std::string config_path = dir + "/adapter_config.json";
    // strictly (io/json.hpp): a regular file (a FIFO or a folder is an IoError naming it), valid
    // JSON with no repeated key
    nlohmann::json config = io::read_json_file(config_path, "lora::load_adapters");
    const auto number = [&](const char* key) {
      if (!config.is_object() || !config.contains(key) || !config[key].is_number()) {
        throw IoError(
            remat::detail::cat("lora::load_adapters: ", config_path, " has no number '", key, "'"));
      }
      return config[key].get<double>();
    };
    if (config.contains("peft_type") && config["peft_type"] != "LORA") {
      throw IoError(remat::detail::cat("lora::load_adapters: ", config_path, " is for peft_type ",
                                       config["peft_type"].dump(), ", not LORA"));
    }
    if (number("r") != double(options_.rank)) {
      throw IoError(remat::detail::cat("lora::load_adapters: ", config_path, " has r = ",
                                       number("r"), ", these adapters have rank ", options_.rank));
    }
    if (number("lora_alpha") != options_.alpha) {
      throw IoError(remat::detail::cat("lora::load_adapters: ", config_path,
                                       " has lora_alpha = ", number("lora_alpha"),
                                       ", these adapters have alpha ", options_.alpha));
    }
    const std::string path = dir + "/adapter_model.safetensors";
    const io::File file = io::File::read(path);
    std::vector<std::pair<Parameter<T>, Tensor<T>>> loaded;
    std::set<std::string> expected;
    for (const auto& [name, p] : named_parameters()) {
      expected.insert(name);
      if (!file.contains(name))
        throw IoError(
            remat::detail::cat("lora::load_adapters: ", path, " has no tensor '", name, "'"));
      const Shape& shape = file.entry(name).shape;
      if (!(shape == p.shape())) {
        throw IoError(remat::detail::cat("lora::load_adapters: tensor '", name, "' in ", path,
                                         " has shape ", shape, ", the model's adapter ",
                                         p.shape()));
      }
      loaded.emplace_back(p, file.tensor<T>(name));
    }
    for (const auto& [name, e] : file.entries()) {
      if (!expected.count(name)) {
        throw IoError(remat::detail::cat("lora::load_adapters: ", path, " holds tensor '", name,
                                         "', which matches no adapter of the model (",
                                         expected.size(), " adapter tensors, the first '",
                                         expected.empty() ? std::string("none") : *expected.begin(),
                                         "')"));
      }
    }
    for (auto& [p, t] : loaded) p.data() = std::move(t);
  }

  /// Folds the adapters into the base weights, W += (alpha / rank) B A, and removes them: the
  /// layers' forwards are plain again and the adapter parameters leave the model. The base
  /// weights must be float parameters; a base stored otherwise (quantized) cannot take the
  /// merge: a UsageError, before anything changes.
  void merge() {
    check_not_merged("merge");
    std::vector<Parameter<T>> weights;
    for (const Adapter<T>& a : adapters_) {
      Parameter<T> w;
      for (const auto& [name, p] : a.layer.named_parameters()) {
        if (name == "weight") w = p;
      }
      const Shape want{a.layer.out_features(), a.layer.in_features()};
      if (!w.defined() || !(w.shape() == want)) {
        throw UsageError(remat::detail::cat(
            "lora::merge: the base weight of '", a.path, "' is not a float (", want[0], ", ",
            want[1], ") parameter; merging into a quantized base is not supported"));
      }
      weights.push_back(w);
    }
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < adapters_.size(); ++i) {
      Adapter<T>& a = adapters_[i];
      Tensor<T>& w = weights[i].data();
      const Tensor<T>& A = a.A.weight.data();
      const Tensor<T>& B = a.B.weight.data();
      const std::int64_t out = w.dim(0), in = w.dim(1), r = A.dim(0);
      // Accumulated in double, rounded once: the merged weight is W + s B A to rounding.
      const double s = scale();
      for (std::int64_t o = 0; o < out; ++o) {
        for (std::int64_t c = 0; c < in; ++c) {
          double acc = 0;
          for (std::int64_t k = 0; k < r; ++k)
            acc += double(B.data()[o * r + k]) * double(A.data()[k * in + c]);
          w.data()[o * in + c] = T(double(w.data()[o * in + c]) + s * acc);
        }
      }
      a.layer.set_forward_hook({});
      a.layer.detach("lora_A");
      a.layer.detach("lora_B");
    }
    merged_ = true;
  }
  bool merged() const noexcept { return merged_; }

 private:
  void check_not_merged(const char* what) const {
    if (merged_)
      throw UsageError(
          remat::detail::cat("lora::", what, ": the adapters were merged into the base weights"));
  }

  Options options_;
  std::vector<Adapter<T>> adapters_;
  bool merged_ = false;
};

namespace detail {

/// Whether `path`'s last dotted component is one of `targets`.
inline bool targeted(const std::string& path, const std::vector<std::string>& targets) {
  const std::size_t dot = path.rfind('.');
  const std::string last = dot == std::string::npos ? path : path.substr(dot + 1);
  return std::find(targets.begin(), targets.end(), last) != targets.end();
}

/// Adds adapters to `layer` (a Linear) and hooks its forward.
template <class T>
Adapter<T> wrap(const std::string& path, Module<T> layer, const Options& o, Rng& rng) {
  const std::int64_t in = layer.in_features(), out = layer.out_features();
  // nn::Linear's default initialization is uniform in +-1/sqrt(in): kaiming_uniform_(a = sqrt(5)).
  Linear<T> A(in, o.rank, rng, false);
  Linear<T> B(o.rank, out, rng, false);
  B.weight.data().fill(T(0));
  layer.attach("lora_A", A);
  layer.attach("lora_B", B);
  const T scale = T(o.alpha / double(o.rank));
  const double p = o.dropout;
  layer.set_forward_hook([A, B, scale, p](const Var<T>& x, const Var<T>& y) {
    // A's mode is the layer's: train() and eval() reach it as the layer's child.
    return y + scale * B(A(dropout(x, p, A.training())));
  });
  return Adapter<T>{path, std::move(layer), std::move(A), std::move(B)};
}

}  // namespace detail

/// Wraps the Linear layers of `model` whose path ends in one of `options.targets` (or `model`
/// itself when it is a Linear) with adapters, freezes every other parameter, and returns the
/// adapters. Throws a UsageError for a rank < 1, a negative or non-finite alpha, a dropout
/// outside [0, 1), a target that names no Linear, or no layer wrapped at all.
template <class T>
Adapters<T> apply(Module<T>& model, Options options) {
  if (options.rank < 1)
    throw UsageError(remat::detail::cat("lora::apply: rank must be >= 1, got ", options.rank));
  if (!(std::isfinite(options.alpha) && options.alpha > 0)) {
    throw UsageError(
        remat::detail::cat("lora::apply: alpha must be positive and finite, got ", options.alpha));
  }
  if (!(options.dropout >= 0 && options.dropout < 1)) {
    throw UsageError(
        remat::detail::cat("lora::apply: dropout must be in [0, 1), got ", options.dropout));
  }
  // Matched and checked first: a bad target changes nothing.
  std::vector<std::pair<std::string, Module<T>>> matched;
  if (model.kind() == "Linear") {
    matched.emplace_back(std::string(), model);
  } else {
    std::unordered_set<const void*> seen;
    std::set<std::string> used;
    for (auto& [path, m] : model.named_modules()) {
      if (m.kind() != "Linear" || !detail::targeted(path, options.targets)) continue;
      if (!seen.insert(m.identity()).second) continue;  // one layer registered under two paths
      if (m.has_forward_hook()) {
        throw UsageError(remat::detail::cat(
            "lora::apply: '", path, "' already has a forward hook (adapters applied twice?)"));
      }
      used.insert(path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1));
      matched.emplace_back(path, m);
    }
    for (const std::string& t : options.targets) {
      if (!used.count(t)) {
        throw UsageError(remat::detail::cat("lora::apply: target '", t,
                                            "' names no Linear layer of the model (",
                                            matched.size(), " layers matched the other targets)"));
      }
    }
    if (matched.empty())
      throw UsageError("lora::apply: no target names given, and the model is not a Linear");
  }
  if (matched.front().second.has_forward_hook()) {
    throw UsageError("lora::apply: the model already has a forward hook (adapters applied twice?)");
  }
  Rng rng(options.seed);
  std::vector<Adapter<T>> adapters;
  for (auto& [path, m] : matched) adapters.push_back(detail::wrap<T>(path, m, options, rng));
  model.freeze();
  for (Adapter<T>& a : adapters) {
    a.A.weight.unfreeze();
    a.B.weight.unfreeze();
  }
  return Adapters<T>(std::move(options), std::move(adapters));
}

}  // namespace remat::nn::lora
