#pragma once
/// @file
/// Saving and loading a model's parameters, and a whole training state (parameters, AdamW
/// moments and update counts, metadata), as safetensors files. Loading is all or nothing: the
/// file is read and every name, dtype and shape checked against the model before any
/// parameter changes.

#include <algorithm>
#include <string>
#include <vector>

#include "remat/io/safetensors.hpp"
#include "remat/nn/module.hpp"
#include "remat/optim/adamw.hpp"

namespace remat::io {
namespace detail {

/// Checks that `file` holds exactly `expected` (name -> shape) in dtype T, naming what is
/// missing, unexpected or of the wrong shape.
template <class T>
void check_names(const File& file, const std::string& path, const std::vector<std::pair<std::string, Shape>>& expected) {
  std::vector<std::string> missing, wrong;
  for (const auto& [name, shape] : expected) {
    if (!file.contains(name)) {
      missing.push_back(name);
      continue;
    }
    const File::Entry& e = file.entry(name);
    if (e.dtype != dtype_name<T>() || !(e.shape == shape)) {
      wrong.push_back(remat::detail::cat(name, " (file: ", e.dtype, " ", e.shape, ", model: ", dtype_name<T>(), " ", shape, ")"));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, e] : file.entries()) {
    const bool known = std::any_of(expected.begin(), expected.end(), [&](const auto& x) { return x.first == name; });
    if (!known) unexpected.push_back(name);
  }
  if (missing.empty() && wrong.empty() && unexpected.empty()) return;
  const auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (std::size_t i = 0; i < v.size() && i < 8; ++i) out += (i ? ", " : "") + v[i];
    if (v.size() > 8) out += remat::detail::cat(" and ", v.size() - 8, " more");
    return out;
  };
  std::string why;
  if (!missing.empty()) why += remat::detail::cat(" missing: ", list(missing), ";");
  if (!unexpected.empty()) why += remat::detail::cat(" unexpected: ", list(unexpected), ";");
  if (!wrong.empty()) why += remat::detail::cat(" wrong dtype or shape: ", list(wrong), ";");
  throw IoError(remat::detail::cat("safetensors: ", path, " does not match the model; nothing was loaded;", why));
}

template <class T>
std::vector<std::pair<std::string, Shape>> shapes_of(const nn::Module<T>& m, const std::string& prefix = "") {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [name, p] : m.named_parameters()) out.emplace_back(prefix + name, p.shape());
  return out;
}

/// The position of each of the module's parameters in the optimizer's list.
template <class T>
std::vector<std::size_t> optimizer_slots(const nn::Module<T>& m, const optim::Optimizer<T>& opt) {
  std::vector<std::size_t> slots;
  const auto& params = opt.parameters();
  for (const auto& [name, p] : m.named_parameters()) {
    const auto it = std::find_if(params.begin(), params.end(), [&](const auto& q) { return q.identity() == p.identity(); });
    if (it == params.end()) {
      throw UsageError(remat::detail::cat("io: parameter '", name, "' of the model is not among the optimizer's parameters"));
    }
    slots.push_back(static_cast<std::size_t>(it - params.begin()));
  }
  if (slots.size() != params.size()) {
    throw UsageError(remat::detail::cat("io: the optimizer holds ", params.size(), " parameters, the model ", slots.size()));
  }
  return slots;
}

}  // namespace detail

/// Writes the module's parameters under their dotted names.
template <class T>
void save_parameters(const std::string& path, const nn::Module<T>& m, const Metadata& metadata = {}) {
  std::vector<NamedTensor<T>> tensors;
  for (const auto& [name, p] : m.named_parameters()) tensors.emplace_back(name, p.value());
  save(path, tensors, metadata);
}

/// Loads every parameter of the module from `path`, which must hold exactly the module's names,
/// dtypes and shapes. Returns the file's metadata.
template <class T>
Metadata load_parameters(const std::string& path, nn::Module<T>& m) {
  const File file = File::read(path);
  detail::check_names<T>(file, path, detail::shapes_of(m));
  for (auto& [name, p] : m.named_parameters()) {
    Parameter<T> handle = p;
    const Tensor<T> loaded = file.tensor<T>(name);
    std::copy(loaded.begin(), loaded.end(), handle.data().begin());
  }
  return file.metadata();
}

/// Writes the parameters ("model.<name>"), the AdamW moments ("adamw.m.<name>", "adamw.v.<name>")
/// and update counts, the optimizer's step count, and `metadata`, to resume training exactly.
template <class T>
void save_training_state(const std::string& path, const nn::Module<T>& m, optim::AdamW<T>& opt, Metadata metadata = {}) {
  const auto slots = detail::optimizer_slots(m, opt);
  std::vector<NamedTensor<T>> tensors;
  std::size_t i = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    tensors.emplace_back("model." + name, p.value());
    const std::size_t k = slots[i++];
    if (opt.first_moment(k).defined()) {
      tensors.emplace_back("adamw.m." + name, opt.first_moment(k));
      tensors.emplace_back("adamw.v." + name, opt.second_moment(k));
    }
    metadata["adamw.updates." + name] = std::to_string(opt.updates(k));
  }
  metadata["adamw.steps"] = std::to_string(opt.steps());
  save(path, tensors, metadata);
}

/// Restores what save_training_state() wrote, all or nothing. Returns the metadata.
template <class T>
Metadata load_training_state(const std::string& path, nn::Module<T>& m, optim::AdamW<T>& opt) {
  const File file = File::read(path);
  const auto slots = detail::optimizer_slots(m, opt);
  std::vector<std::pair<std::string, Shape>> expected = detail::shapes_of(m, "model.");
  std::vector<std::int64_t> updates;
  for (const auto& [name, p] : m.named_parameters()) {
    const auto key = file.metadata().find("adamw.updates." + name);
    std::int64_t count = -1;
    if (key != file.metadata().end()) {
      try {
        std::size_t used = 0;
        count = std::stoll(key->second, &used);
        if (used != key->second.size()) count = -1;
      } catch (const std::exception&) {
      }
    }
    if (count < 0) throw IoError(remat::detail::cat("safetensors: ", path, " has no valid adamw.updates.", name, " metadata"));
    updates.push_back(count);
    if (count > 0) {
      expected.emplace_back("adamw.m." + name, p.shape());
      expected.emplace_back("adamw.v." + name, p.shape());
    }
  }
  detail::check_names<T>(file, path, expected);
  std::int64_t steps = -1;
  try {
    steps = std::stoll(file.metadata().at("adamw.steps"));
  } catch (const std::exception&) {
  }
  if (steps < 0) throw IoError(remat::detail::cat("safetensors: ", path, " has no valid adamw.steps metadata"));
  std::size_t i = 0;
  for (auto& [name, p] : m.named_parameters()) {
    Parameter<T> handle = p;
    const Tensor<T> value = file.tensor<T>("model." + name);
    std::copy(value.begin(), value.end(), handle.data().begin());
    const std::size_t k = slots[i];
    opt.updates(k) = updates[i];
    if (updates[i] > 0) {
      opt.first_moment(k) = file.tensor<T>("adamw.m." + name);
      opt.second_moment(k) = file.tensor<T>("adamw.v." + name);
    } else {
      opt.first_moment(k).reset();
      opt.second_moment(k).reset();
    }
    ++i;
  }
  opt.set_steps(steps);
  return file.metadata();
}

}  // namespace remat::io
