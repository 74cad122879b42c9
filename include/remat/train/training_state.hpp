#pragma once
/// @file
/// Saving and resuming a training run: the model's parameters and any optimizer's state (its
/// buffers, counters, step count and learning rate, through Optimizer::state()), in one
/// safetensors file, so that a resumed run continues bitwise as if it had never stopped.
///
/// Layout, for an optimizer named N (lower-cased: "sgd", "adamw") and a parameter p:
///   tensors   model.p, N.BUFFER.p         (AdamW: adamw.m.p, adamw.v.p; SGD: sgd.velocity.p)
///   metadata  optimizer = N as named ("AdamW"), N.steps, N.lr, N.COUNTER.p (adamw.updates.p)
/// and the caller's own metadata beside them. Loading refuses, by key and value, a learning rate
/// that is not a finite number >= 0 and a step count or counter below 0.

#include <cctype>
#include <charconv>
#include <cmath>
#include <type_traits>
#include <string>
#include <vector>

#include "remat/optim/optimizer.hpp"
#include "remat/train/parameters.hpp"

namespace remat::train {
namespace detail {

/// The position of each of the module's parameters in the optimizer's list.
template <class Owner, class T>
std::vector<std::size_t> optimizer_slots(const Owner& m, const optim::Optimizer<T>& opt) {
  std::vector<std::size_t> slots;
  const auto& params = opt.parameters();
  for (const auto& [name, p] : m.named_parameters()) {
    // named capture: clang 14 cannot capture a structured binding (C++20, clang 16)
    const auto it = std::find_if(params.begin(), params.end(), [&param = p](const auto& q) {
      return q.identity() == param.identity();
    });
    if (it == params.end()) {
      throw ArgumentError(remat::detail::cat("train: parameter '", name,
                                             "' of the model is not among the ", opt.name(),
                                             " optimizer's parameters"));
    }
    slots.push_back(static_cast<std::size_t>(it - params.begin()));
  }
  if (slots.size() != params.size()) {
    throw ArgumentError(remat::detail::cat("train: the ", opt.name(), " optimizer holds ",
                                           params.size(), " parameters, the model ", slots.size()));
  }
  return slots;
}

/// The optimizer's prefix in file names: its name in lower case.
inline std::string prefix_of(const char* optimizer) {
  std::string out(optimizer);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

inline std::string format_double(double x) {
  char buffer[64];
  const auto r =
      std::to_chars(buffer, buffer + sizeof buffer, x);  // shortest text that reads back exactly
  return std::string(buffer, r.ptr);
}

/// The metadata value `key` of `file` as an N (an integer or a double), all of it, or an IoError.
template <class N>
N metadata_number(const io::File& file, const std::string& path, const std::string& key) {
  const auto it = file.metadata().find(key);
  N value{};
  if (it != file.metadata().end()) {
    const std::string& text = it->second;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
    if (r.ec == std::errc() && r.ptr == text.data() + text.size()) return value;
  }
  if (it == file.metadata().end()) {
    throw IoError(remat::detail::cat("safetensors: ", path, " has no '", key,
                                     "' metadata; nothing was loaded"));
  }
  throw IoError(remat::detail::cat("safetensors: ", path, " has an invalid '", key,
                                   "' metadata value '", io::detail::brief(it->second),
                                   "'; nothing was loaded"));
}

/// The metadata value `key` as a count (an integer >= 0) or a learning rate (a finite number
/// >= 0), or an IoError naming the file, the key and the value: a resumed run would otherwise
/// take lr = inf or a negative step count as given.
template <class N>
N metadata_at_least_zero(const io::File& file, const std::string& path, const std::string& key) {
  const N value = metadata_number<N>(file, path, key);
  bool ok = value >= 0;
  if constexpr (std::is_floating_point_v<N>) ok = ok && std::isfinite(value);
  if (ok) return value;
  throw IoError(
      remat::detail::cat("safetensors: ", path, " has an invalid '", key, "' metadata value '",
                         io::detail::brief(file.metadata().at(key)), "': ",
                         std::is_floating_point_v<N> ? "a learning rate is a finite number >= 0"
                                                     : "a count is an integer >= 0",
                         "; nothing was loaded"));
}

}  // namespace detail

/// Writes the parameters of `m` and the optimizer's state (see the file comment) and `metadata`,
/// to resume training exactly. `m` is what the optimizer trains: an nn::Module, or LoRA's
/// Adapters over a frozen model (any owner of named_parameters()). `metadata` may not use the
/// keys the state takes.
template <class Owner, class T>
void save_training_state(const std::string& path, const Owner& m, const optim::Optimizer<T>& opt,
                         Metadata metadata = {}) {
  const auto slots = detail::optimizer_slots(m, opt);
  const optim::OptimizerState<T> state = opt.state();
  const std::string prefix = detail::prefix_of(opt.name());
  const auto put = [&](const std::string& key, std::string value) {
    if (!metadata.emplace(key, std::move(value)).second) {
      throw IoError(remat::detail::cat("safetensors: cannot save ", path, ": the metadata key '",
                                       io::detail::brief(key), "' is taken by the training state"));
    }
  };
  put("optimizer", state.optimizer);
  put(prefix + ".steps", std::to_string(state.steps));
  put(prefix + ".lr", detail::format_double(state.lr));
  std::vector<io::NamedTensor<T>> tensors;
  std::size_t i = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    tensors.emplace_back("model." + name, p.value());
    const std::size_t k = slots[i++];
    for (const auto& [buffer, t] : state.buffers[k])
      tensors.emplace_back(prefix + "." + buffer + "." + name, t);
    for (const auto& [counter, c] : state.counters[k])
      put(prefix + "." + counter + "." + name, std::to_string(c));
  }
  io::save(path, tensors, metadata);
}

/// Restores what save_training_state() wrote into a model of the same names and shapes and an
/// optimizer of the same kind, all or nothing: every name, shape, count and the optimizer's own
/// consistency rules are checked before anything changes. Returns the file's metadata.
template <class Owner, class T>
Metadata load_training_state(const std::string& path, Owner& m, optim::Optimizer<T>& opt) {
  const io::File file = io::File::read(path);
  const auto slots = detail::optimizer_slots(m, opt);
  const auto kind = file.metadata().find("optimizer");
  if (kind == file.metadata().end() || kind->second != opt.name()) {
    throw IoError(remat::detail::cat("safetensors: ", path, " holds the state of ",
                                     kind == file.metadata().end()
                                         ? "no optimizer"
                                         : "'" + io::detail::brief(kind->second) + "'",
                                     ", not of ", opt.name(), "; nothing was loaded"));
  }
  const std::string prefix = detail::prefix_of(opt.name());
  optim::OptimizerState<T> state;
  state.optimizer = opt.name();
  state.steps = detail::metadata_at_least_zero<std::int64_t>(file, path, prefix + ".steps");
  state.lr = detail::metadata_at_least_zero<double>(file, path, prefix + ".lr");
  state.buffers.resize(slots.size());
  state.counters.resize(slots.size());
  std::vector<std::pair<std::string, Shape>> expected = detail::shapes_of(m, "model.");
  std::size_t i = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    const std::size_t k = slots[i++];
    for (const std::string& buffer : opt.buffer_names()) {
      // A buffer is optional (not allocated before a parameter's first update); the optimizer's
      // check_state() decides whether its absence fits the counters.
      if (file.contains(prefix + "." + buffer + "." + name))
        expected.emplace_back(prefix + "." + buffer + "." + name, p.shape());
    }
    for (const std::string& counter : opt.counter_names()) {
      state.counters[k][counter] = detail::metadata_at_least_zero<std::int64_t>(
          file, path, prefix + "." + counter + "." + name);
    }
  }
  detail::check_names<T>(file, path, expected);
  i = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    const std::size_t k = slots[i++];
    for (const std::string& buffer : opt.buffer_names()) {
      const std::string key = prefix + "." + buffer + "." + name;
      if (file.contains(key)) state.buffers[k][buffer] = file.tensor<T>(key);
    }
  }
  try {
    opt.check_state(state);
  } catch (const ArgumentError& e) {
    throw IoError(remat::detail::cat("safetensors: ", path,
                                     " holds an optimizer state that does not fit: ", e.what(),
                                     "; nothing was loaded"));
  }
  for (const auto& [name, p] : m.named_parameters()) detail::copy_into(file, "model." + name, p);
  opt.load_state(state);
  return file.metadata();
}

}  // namespace remat::train
