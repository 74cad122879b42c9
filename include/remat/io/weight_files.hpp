#pragma once
/// @file
/// A model's weights as Hugging Face stores them: one `model.safetensors`, or shards named by a
/// `model.safetensors.index.json` ({"metadata": {"total_size": N}, "weight_map": {tensor name:
/// shard file}}). WeightFiles opens either layout (a folder, a .safetensors file or an index)
/// and loads named tensors all or nothing: every name, shape and dtype is checked against the
/// headers first, and only then are values converted (read from the files) into the targets.
///
/// The index is untrusted: it must be one JSON object nesting at most kMaxHeaderDepth levels,
/// with no repeated key, a weight_map of strings naming files inside the folder (no absolute
/// path, no ".." component), each shard a valid safetensors file holding the tensors the index
/// places in it. Each failure is an IoError naming the index or shard and the tensor. The index
/// and the shards must be regular files (a FIFO is refused, never waited on). A shard's tensors
/// the index does not list are read too, as transformers does; a tensor two shards hold is refused.

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <sys/stat.h>

#include "remat/io/folder.hpp"
#include "remat/io/json.hpp"
#include "remat/io/safetensors.hpp"

namespace remat::io {

/// The index file's name inside a folder.
inline constexpr const char* kIndexName = "model.safetensors.index.json";
/// The single file's name inside a folder.
inline constexpr const char* kSingleName = "model.safetensors";

namespace detail {

/// What an index file says: which shard holds each tensor, and metadata.total_size if given.
struct Index {
  std::map<std::string, std::string> weight_map;
  std::optional<std::uint64_t> total_size;
};

/// Whether `shard` names a file inside the index's folder: relative, no ".." component, no empty
/// component, no NUL ("./a.safetensors" is "a.safetensors", as os.path.join reads it).
inline bool is_inside_folder(std::string_view shard) {
  if (shard.empty() || shard.front() == '/' || shard.find('\0') != std::string_view::npos)
    return false;
  std::size_t at = 0;
  while (at <= shard.size()) {
    const std::size_t slash = std::min(shard.find('/', at), shard.size());
    const std::string_view part = shard.substr(at, slash - at);
    if (part.empty() || part == "..") return false;
    at = slash + 1;
  }
  return true;
}

/// `shard` without its "." components, so that one file has one name.
inline std::string without_dot_parts(std::string_view shard) {
  std::string out;
  for (std::size_t at = 0; at <= shard.size();) {
    const std::size_t slash = std::min(shard.find('/', at), shard.size());
    const std::string_view part = shard.substr(at, slash - at);
    if (part != ".") {
      if (!out.empty()) out += '/';
      out.append(part);
    }
    at = slash + 1;
  }
  return out;
}

/// Parses and validates an index file's text (`source` names it in messages).
inline Index parse_index(std::string_view text, const std::string& source) {
  const auto fail = [&](const std::string& why) -> void {
    throw IoError(remat::detail::cat("safetensors index ", source, ": ", why));
  };
  const nlohmann::json j = parse_json(text, "safetensors index " + source);
  if (!j.is_object()) fail(remat::detail::cat("not a JSON object but ", brief_json(j)));
  Index index;
  if (const auto m = j.find("metadata"); m != j.end() && !m->is_null()) {
    if (!m->is_object())
      fail(remat::detail::cat("\"metadata\" is not an object but ", brief_json(*m)));
    if (const auto t = m->find("total_size"); t != m->end()) {
      if (!t->is_number_integer() || t->get<std::int64_t>() < 0)
        fail(remat::detail::cat("metadata.total_size ", brief_json(*t), " is not an integer >= 0"));
      index.total_size = t->get<std::uint64_t>();
    }
  }
  const auto w = j.find("weight_map");
  if (w == j.end() || !w->is_object()) fail("no \"weight_map\" object");
  for (const auto& [name, shard] : w->items()) {
    if (!shard.is_string())
      fail(remat::detail::cat("weight_map['", brief(name), "'] is not a file name but ",
                              brief_json(shard)));
    const auto& file = shard.get_ref<const std::string&>();
    if (!is_inside_folder(file) || without_dot_parts(file).empty()) {
      fail(remat::detail::cat(
          "weight_map['", brief(name), "'] = '", brief(file),
          "' is not a file inside the folder (absolute, empty, or with a '..' component)"));
    }
    index.weight_map.emplace(name, without_dot_parts(file));
  }
  return index;
}

/// The whole text of the regular file `path`, or an IoError naming it.
inline std::string read_text(const std::string& path) {
  return read_text_file(path, "safetensors index");
}

inline bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

inline bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace detail

/// The weight files of one model: a single safetensors file, or the shards of an index.
class WeightFiles {
 public:
  /// Opens `path`: a folder (its model.safetensors if there is one, else its
  /// model.safetensors.index.json: transformers' from_pretrained looks in this order, so a folder
  /// holding both, as one saved whole and then in shards is left, loads the same weights in
  /// both), an index file (a name ending in ".json") or a safetensors file. Every shard is mapped
  /// and validated; a missing or malformed one is an IoError naming it.
  static WeightFiles open(const std::string& path) {
    if (detail::is_directory(path)) {
      const std::string single = path + "/" + kSingleName;
      if (detail::exists(single)) return open(single);
      const std::string index = path + "/" + kIndexName;
      if (!detail::exists(index)) {
        throw IoError(remat::detail::cat("safetensors: the folder ", path, " holds neither ",
                                         kSingleName, " nor ", kIndexName));
      }
      return open_index(index);
    }
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return open_index(path);
    WeightFiles w;
    w.files_.push_back(File::read(path));
    for (const auto& [name, e] : w.files_[0].entries()) w.where_.emplace(name, 0);
    return w;
  }

  /// Every tensor's name, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, at] : where_) out.push_back(name);
    return out;
  }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// The file holding tensor `name` (an IoError if none does).
  const File& file_of(const std::string& name) const {
    const auto it = where_.find(name);
    if (it == where_.end())
      throw IoError(remat::detail::cat("safetensors: no tensor named '", detail::brief(name),
                                       "' in ", describe()));
    return files_[it->second];
  }
  /// The files opened, in shard order.
  const std::vector<File>& files() const noexcept { return files_; }

  /// Loads every target (name, tensor of the expected shape) all or nothing: first checks that
  /// each name is present with the target's shape and a dtype that reads into T (an IoError
  /// naming the tensor, the file and both shapes or dtypes), then converts the values into the
  /// targets' storage. Names the files hold but the targets do not are ignored.
  template <class T>
  void load(const std::vector<NamedTensor<T>>& targets) const {
    for (const auto& [name, t] : targets) {
      if (!contains(name)) {
        throw IoError(remat::detail::cat("safetensors: the model expects a tensor '",
                                         detail::brief(name), "' ", t.shape(), " that ", describe(),
                                         " does not hold"));
      }
      const File& f = file_of(name);
      const File::Entry& e = f.entry(name);
      if (!(e.shape == t.shape())) {
        throw IoError(remat::detail::cat("safetensors: tensor '", detail::brief(name), "' in ",
                                         f.path(), " has shape ", e.shape,
                                         " but the model expects ", t.shape()));
      }
      f.check_readable<T>(name);
    }
    for (const auto& [name, t] : targets) {
      Tensor<T> target = t;  // shares the storage
      file_of(name).read_into(name, target);
    }
  }

 private:
  static WeightFiles open_index(const std::string& index_path) {
    const detail::Index index = detail::parse_index(detail::read_text(index_path), index_path);
    const auto slash = index_path.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : index_path.substr(0, slash + 1);
    WeightFiles w;
    w.index_ = index_path;
    std::map<std::string, std::size_t> shard_at;
    for (const auto& [name, shard] : index.weight_map) {
      auto it = shard_at.find(shard);
      if (it == shard_at.end()) {
        try {
          w.files_.push_back(File::read(dir + shard));
        } catch (const IoError& e) {
          throw IoError(remat::detail::cat("safetensors index ", index_path, ": shard '",
                                           detail::brief(shard), "' (of tensor '",
                                           detail::brief(name), "'): ", e.what()));
        }
        it = shard_at.emplace(shard, w.files_.size() - 1).first;
      }
      if (!w.files_[it->second].contains(name)) {
        throw IoError(remat::detail::cat("safetensors index ", index_path, " places tensor '",
                                         detail::brief(name), "' in ", dir + shard,
                                         ", which does not hold it"));
      }
      w.where_.emplace(name, it->second);
    }
    w.add_unlisted_tensors(index_path);
    return w;
  }

  /// Adds the tensors a shard holds that the index does not list: transformers reads every
  /// tensor of every shard, not only the listed ones, so such a tensor is part of the model (a
  /// tied model's head that differs from its embedding, say). A tensor in two shards is refused:
  /// which copy transformers keeps depends on the order it reads them in.
  void add_unlisted_tensors(const std::string& index_path) {
    for (std::size_t i = 0; i < files_.size(); ++i) {
      for (const auto& [name, e] : files_[i].entries()) {
        const auto [it, added] = where_.emplace(name, i);
        if (!added && it->second != i) {
          throw IoError(remat::detail::cat("safetensors index ", index_path, ": tensor '",
                                           detail::brief(name), "' is in both ",
                                           files_[it->second].path(), " and ", files_[i].path()));
        }
      }
    }
  }

  std::string describe() const {
    return index_.empty() ? (files_.empty() ? std::string("no file") : files_[0].path()) : index_;
  }

  std::vector<File> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> its file in files_
  std::string index_;                         // the index's path, or empty for one file
};

/// Writes `tensors` into the folder `dir` being filled (by a caller's io::save_folder, with
/// other files beside them) as Hugging Face does for a large model: shards of at most
/// `max_shard_bytes` of data each (a larger tensor gets a shard of its own), named
/// model-0000i-of-0000n.safetensors, and model.safetensors.index.json with the weight map and
/// metadata.total_size; one shard is written as model.safetensors with no index. Names must be
/// unique (an index maps each to one shard).
template <class T>
void write_sharded(const std::string& dir, const std::vector<NamedTensor<T>>& tensors,
                   std::size_t max_shard_bytes, const Metadata& metadata = {},
                   StoreAs store = StoreAs::native) {
  std::set<std::string_view> names;
  for (const auto& nt : tensors) {
    if (!names.insert(nt.first).second)
      throw IoError(remat::detail::cat("safetensors: cannot save ", dir, ": tensor '",
                                       detail::brief(nt.first), "' is named twice"));
  }
  const std::size_t element = store == StoreAs::bf16 ? 2 : sizeof(T);
  std::vector<std::vector<NamedTensor<T>>> shards(1);
  std::size_t in_last = 0, total = 0;
  for (const auto& nt : tensors) {
    const std::size_t bytes =
        nt.second.defined() ? static_cast<std::size_t>(nt.second.numel()) * element : 0;
    if (!shards.back().empty() && in_last + bytes > max_shard_bytes)
      shards.emplace_back(), in_last = 0;
    shards.back().push_back(nt);
    in_last += bytes;
    total += bytes;
  }
  if (shards.size() == 1) return save(dir + "/" + kSingleName, tensors, metadata, store);
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    save(dir + "/" + name, shards[i], metadata, store);
    for (const auto& [tensor, t] : shards[i]) index["weight_map"][tensor] = name;
  }
  save_text(dir + "/" + kIndexName, index.dump(2) + "\n");
}

/// Saves `tensors` as the weights of the folder `dir` (write_sharded's layout), as a whole
/// (io::save_folder): a model saved there before stays readable, shards and index, until the new
/// one is complete; its other files (a config, a tokenizer) are kept and its weight files
/// replaced, so no shard of an earlier save with more shards stays behind.
template <class T>
void save_sharded(const std::string& dir, const std::vector<NamedTensor<T>>& tensors,
                  std::size_t max_shard_bytes, const Metadata& metadata = {},
                  StoreAs store = StoreAs::native) {
  save_folder(dir, [&](const std::string& staging) {
    write_sharded(staging, tensors, max_shard_bytes, metadata, store);
  });
}

}  // namespace remat::io
