#pragma once
/// @file
/// The safetensors format (readable by Python's `safetensors` and by PyTorch tooling): an 8-byte
/// little-endian header length N, N bytes of JSON mapping each tensor name to its dtype, shape
/// and [begin, end) byte offsets in the data section (plus an optional "__metadata__" object of
/// strings), then the data, row-major and little-endian. remat reads and writes F32 and F64.
///
/// Reading validates the whole file before handing out anything: truncation, a header that is
/// not JSON or not of this shape, unknown dtypes, offsets out of range, overlapping or leaving
/// holes, sizes that disagree with shapes. Each is an IoError naming the file and the entry.
/// Writing is atomic: a temporary file in the same directory is written, flushed to disk and
/// renamed over the target, so a crash or a full disk never destroys the previous file.

#if !__has_include(<nlohmann/json.hpp>)
#error "remat/io needs nlohmann/json (Debian: nlohmann-json3-dev)"
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "remat/core/error.hpp"
#include "remat/core/tensor.hpp"

namespace remat::io {

static_assert(std::endian::native == std::endian::little,
              "remat/io writes the host's bytes as little-endian safetensors data: add byte swapping for this host");

/// Free-form string metadata stored in the header's "__metadata__".
using Metadata = std::map<std::string, std::string>;

/// A tensor to write, with its name.
template <class T>
using NamedTensor = std::pair<std::string, Tensor<T>>;

/// Largest header accepted, as in the reference implementation.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

namespace detail {

template <class T>
constexpr const char* dtype_name() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "remat/io reads and writes float and double tensors");
  return std::is_same_v<T, float> ? "F32" : "F64";
}

inline std::size_t dtype_size(const std::string& dtype) { return dtype == "F32" ? 4 : dtype == "F64" ? 8 : 0; }

/// Writes `bytes` to `fd` entirely or throws.
inline void write_all(int fd, const void* data, std::size_t bytes, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IoError(remat::detail::cat("safetensors: writing ", path, " failed: ", std::strerror(errno)));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace detail

/// Writes `tensors` (names unique, non-empty) and `metadata` to `path`, atomically.
template <class T>
void save(const std::string& path, const std::vector<NamedTensor<T>>& tensors, const Metadata& metadata = {}) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__" || header.contains(name)) {
      throw IoError(remat::detail::cat("safetensors: cannot save ", path, ": tensor name '", name,
                                       "' is empty, reserved or repeated"));
    }
    if (!t.defined()) throw IoError(remat::detail::cat("safetensors: cannot save ", path, ": tensor '", name, "' is undefined"));
    header[name] = {{"dtype", detail::dtype_name<T>()},
                    {"shape", std::vector<std::int64_t>(t.shape().begin(), t.shape().end())},
                    {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the reference writer does
  const std::uint64_t length = text.size();

  const std::string temporary = remat::detail::cat(path, ".tmp.", ::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(remat::detail::cat("safetensors: cannot create ", temporary, ": ", std::strerror(errno)));
  try {
    detail::write_all(fd, &length, sizeof length, temporary);
    detail::write_all(fd, text.data(), text.size(), temporary);
    for (const auto& [name, t] : tensors) detail::write_all(fd, t.data(), t.bytes(), temporary);
    if (::fsync(fd) != 0) throw IoError(remat::detail::cat("safetensors: flushing ", temporary, " failed: ", std::strerror(errno)));
    if (::close(fd) != 0) throw IoError(remat::detail::cat("safetensors: closing ", temporary, " failed: ", std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    throw IoError(remat::detail::cat("safetensors: cannot replace ", path, ": ", std::strerror(err)));
  }
}

/// A safetensors file read whole and validated.
class File {
 public:
  struct Entry {
    std::string dtype;
    Shape shape;
    std::size_t begin = 0, end = 0;  // in the data section
  };

  /// Reads and validates `path`; throws an IoError naming the problem and the entry.
  static File read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(remat::detail::cat("safetensors: cannot open ", path));
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw IoError(remat::detail::cat("safetensors: reading ", path, " failed"));
    return File(path, std::move(bytes));
  }

  /// Parses and validates a file's bytes (`where` names it in messages).
  File(std::string where, std::vector<char> bytes) : path_(std::move(where)), bytes_(std::move(bytes)) { parse(); }

  const Metadata& metadata() const noexcept { return metadata_; }
  const std::map<std::string, Entry>& entries() const noexcept { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }

  const Entry& entry(const std::string& name) const {
    const auto it = entries_.find(name);
    if (it == entries_.end()) throw IoError(remat::detail::cat("safetensors: ", path_, " has no tensor named '", name, "'"));
    return it->second;
  }

  /// The tensor called `name`, copied out; its dtype must be T's.
  template <class T>
  Tensor<T> tensor(const std::string& name) const {
    const Entry& e = entry(name);
    if (e.dtype != io::detail::dtype_name<T>()) {
      throw IoError(remat::detail::cat("safetensors: tensor '", name, "' in ", path_, " is ", e.dtype, ", not the ",
                                       io::detail::dtype_name<T>(), " asked for"));
    }
    Tensor<T> t(e.shape);
    if (t.bytes() > 0) std::memcpy(t.data(), bytes_.data() + data_start_ + e.begin, t.bytes());
    return t;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw IoError(remat::detail::cat("safetensors: ", path_, " is malformed: ", why));
  }

  void parse() {
    if (bytes_.size() < 8) fail(remat::detail::cat("it has ", bytes_.size(), " bytes, fewer than the 8 of the header length"));
    std::uint64_t length = 0;
    std::memcpy(&length, bytes_.data(), 8);
    if (length > kMaxHeaderBytes) fail(remat::detail::cat("the header length ", length, " exceeds the ", kMaxHeaderBytes, " allowed"));
    if (length > bytes_.size() - 8) {
      fail(remat::detail::cat("the header length ", length, " runs past the end of the file (", bytes_.size() - 8,
                              " bytes follow it): truncated?"));
    }
    data_start_ = 8 + length;
    const std::size_t data_size = bytes_.size() - data_start_;
    nlohmann::json header;
    std::vector<std::string> top_keys;  // JSON parsers keep the last of repeated keys; we refuse them
    const auto watch_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1) top_keys.push_back(parsed.get<std::string>());
      return true;
    };
    try {
      header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + static_cast<std::ptrdiff_t>(data_start_), watch_keys);
    } catch (const nlohmann::json::exception& e) {
      fail(remat::detail::cat("the header is not valid JSON (", e.what(), ")"));
    }
    std::sort(top_keys.begin(), top_keys.end());
    if (const auto twin = std::adjacent_find(top_keys.begin(), top_keys.end()); twin != top_keys.end()) {
      fail(remat::detail::cat("the name '", *twin, "' appears twice in the header"));
    }
    if (!header.is_object()) fail("the header is not a JSON object");
    std::vector<std::pair<std::size_t, std::string>> starts;
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        parse_metadata(value);
        continue;
      }
      entries_.emplace(name, parse_entry(name, value, data_size));
      starts.emplace_back(entries_.at(name).begin, name);
    }
    // The data must be covered exactly, in some order: no overlaps, no holes, nothing after.
    std::sort(starts.begin(), starts.end());
    std::size_t at = 0;
    for (const auto& [begin, name] : starts) {
      const Entry& e = entries_.at(name);
      if (begin != at) {
        fail(remat::detail::cat("tensor '", name, "' starts at byte ", begin, " of the data, but the previous tensor ends at ", at,
                                begin < at ? " (they overlap)" : " (a hole)"));
      }
      at = e.end;
    }
    if (at != data_size) fail(remat::detail::cat("the tensors cover ", at, " bytes of data but ", data_size, " follow the header"));
  }

  void parse_metadata(const nlohmann::json& value) {
    if (!value.is_object()) fail("\"__metadata__\" is not an object");
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) fail(remat::detail::cat("metadata '", key, "' is not a string"));
      metadata_[key] = v.get<std::string>();
    }
  }

  Entry parse_entry(const std::string& name, const nlohmann::json& value, std::size_t data_size) const {
    const auto bad = [&](const std::string& why) { fail(remat::detail::cat("tensor '", name, "': ", why)); };
    if (!value.is_object()) bad("its entry is not an object");
    for (const auto& [key, v] : value.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") bad(remat::detail::cat("unexpected field '", key, "'"));
    }
    if (!value.contains("dtype") || !value["dtype"].is_string()) bad("no dtype string");
    if (!value.contains("shape") || !value["shape"].is_array()) bad("no shape array");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() || value["data_offsets"].size() != 2) {
      bad("no data_offsets pair");
    }
    Entry e;
    e.dtype = value["dtype"].get<std::string>();
    const std::size_t size = io::detail::dtype_size(e.dtype);
    if (size == 0) bad(remat::detail::cat("dtype '", e.dtype, "' is not supported (remat reads F32 and F64)"));
    const auto& shape = value["shape"];
    if (shape.size() > static_cast<std::size_t>(Shape::kMaxRank)) bad(remat::detail::cat("it has ", shape.size(), " axes, more than ", Shape::kMaxRank));
    std::vector<std::int64_t> dims;
    std::uint64_t count = 1;
    for (const auto& d : shape) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) bad(remat::detail::cat("shape ", shape.dump(), " holds a value that is not a non-negative integer"));
      const auto extent = d.get<std::uint64_t>();
      if (extent != 0 && count > data_size / extent) bad(remat::detail::cat("shape ", shape.dump(), " is larger than the file"));
      count *= extent;
      dims.push_back(static_cast<std::int64_t>(extent));
    }
    e.shape = Shape(std::span<const std::int64_t>(dims));
    const auto& offsets = value["data_offsets"];
    for (const auto& o : offsets) {
      if (!o.is_number_integer() || o.get<std::int64_t>() < 0) bad(remat::detail::cat("data_offsets ", offsets.dump(), " are not non-negative integers"));
    }
    const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > data_size) {
      bad(remat::detail::cat("data_offsets [", begin, ", ", end, ") fall outside the ", data_size, " bytes of data"));
    }
    if (end - begin != count * size) {
      bad(remat::detail::cat("data_offsets [", begin, ", ", end, ") hold ", end - begin, " bytes but ", e.dtype, " ", shape.dump(),
                             " needs ", count * size));
    }
    e.begin = static_cast<std::size_t>(begin);
    e.end = static_cast<std::size_t>(end);
    return e;
  }

  std::string path_;
  std::vector<char> bytes_;
  std::size_t data_start_ = 0;
  Metadata metadata_;
  std::map<std::string, Entry> entries_;
};

}  // namespace remat::io
