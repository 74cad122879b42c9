#pragma once
/// @file
/// Saving and loading a model's parameters as a safetensors file, under their dotted names.
/// Loading is all or nothing: the file is read and every name, dtype and shape checked against
/// the model before any parameter changes.
///
/// remat/train sits above nn and optim (it knows modules and optimizers); remat/io below it
/// knows only the file format and tensors.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "remat/io/safetensors.hpp"
#include "remat/nn/module.hpp"

namespace remat::train {

using io::Metadata;

namespace detail {

/// Checks that `file` holds exactly `expected` (name -> shape) in dtype T, naming what is
/// missing, unexpected or of the wrong shape.
template <class T>
void check_names(const io::File& file, const std::string& path,
                 const std::vector<std::pair<std::string, Shape>>& expected) {
  std::vector<std::string> missing, wrong;
  for (const auto& [name, shape] : expected) {
    if (!file.contains(name)) {
      missing.push_back(name);
      continue;
    }
    const io::File::Entry& e = file.entry(name);
    if (e.dtype != io::detail::dtype_name<T>() || !(e.shape == shape)) {
      wrong.push_back(remat::detail::cat(name, " (file: ", e.dtype, " ", e.shape, ", model: ",
                                         io::detail::dtype_name<T>(), " ", shape, ")"));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, e] : file.entries()) {
    // named capture: clang 14 cannot capture a structured binding (C++20, clang 16)
    const bool known = std::any_of(expected.begin(), expected.end(),
                                   [&key = name](const auto& x) { return x.first == key; });
    if (!known) unexpected.push_back(io::detail::brief(name));
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
  throw IoError(remat::detail::cat("safetensors: ", path,
                                   " does not match the model; nothing was loaded;", why));
}

/// The names and shapes of what `m` (an nn::Module, LoRA's Adapters: any owner of
/// named_parameters()) holds, each name after `prefix`.
template <class Owner>
std::vector<std::pair<std::string, Shape>> shapes_of(const Owner& m,
                                                     const std::string& prefix = "") {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [name, p] : m.named_parameters()) out.emplace_back(prefix + name, p.shape());
  return out;
}

/// Copies the tensor `name` of a checked file into parameter `p`.
template <class T>
void copy_into(const io::File& file, const std::string& name, const Parameter<T>& p) {
  Parameter<T> handle = p;
  const Tensor<T> loaded = file.tensor<T>(name);
  std::copy(loaded.begin(), loaded.end(), handle.data().begin());
}

}  // namespace detail

/// Writes the module's parameters under their dotted names.
template <class T>
void save_parameters(const std::string& path, const nn::Module<T>& m,
                     const Metadata& metadata = {}) {
  std::vector<io::NamedTensor<T>> tensors;
  for (const auto& [name, p] : m.named_parameters()) tensors.emplace_back(name, p.value());
  io::save(path, tensors, metadata);
}

/// Loads every parameter of the module from `path`, which must hold exactly the module's names,
/// dtypes and shapes. Returns the file's metadata.
template <class T>
Metadata load_parameters(const std::string& path, nn::Module<T>& m) {
  const io::File file = io::File::read(path);
  detail::check_names<T>(file, path, detail::shapes_of(m));
  for (const auto& [name, p] : m.named_parameters()) detail::copy_into(file, name, p);
  return file.metadata();
}

}  // namespace remat::train
