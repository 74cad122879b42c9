#pragma once
/// @file
/// The safetensors format (readable by Python's `safetensors` and by PyTorch tooling): an 8-byte
/// little-endian header length N, N bytes of JSON mapping each tensor name to its dtype, shape
/// and [begin, end) byte offsets in the data section (plus an optional "__metadata__" object of
/// strings), then the data, row-major and little-endian. remat reads F64, F32, BF16, F16 and the
/// integer dtypes, and writes F32, F64 and BF16.
///
/// Reading validates the whole file before handing out anything, with the reference reader's
/// rules (Rust `safetensors`) and a few stricter ones: the header length within bounds, a header
/// that starts with '{' after JSON white space (no byte-order mark), holds no NUL byte, nests at
/// most kMaxHeaderDepth levels and is one JSON object with no repeated key at any level; entries
/// that are objects with exactly a known dtype (any of the crate's: a tensor remat cannot convert
/// is refused when read, not the file), a shape whose extents multiply left to right without
/// overflow (as the crate multiplies), and offsets that match the shape in bits; and offsets
/// that, taken in order, cover the data section exactly (no hole, no overlap, nothing after).
/// Each failure is an IoError naming the file and the entry; what it quotes from the file is cut
/// short (detail::brief), so a message stays short.
///
/// Only regular files are read (a FIFO or a device is refused before any read, so it cannot
/// hang the reader), and they are read with pread() rather than mapped (Note [no memory map]): a
/// file truncated while open is an IoError, never a SIGBUS.
///
/// Writing is atomic (detail::write_atomically, io/posix_file.hpp): a temporary file in the
/// target's directory is written (without a name where the file system allows, O_TMPFILE),
/// flushed to disk and renamed over the target, then the directory is flushed. A crash, a full
/// disk or a concurrent save never leaves a half-written file under the target's name, and the
/// next save to the same target removes what a killed one left behind. An
/// existing file keeps its permissions, and a symbolic link is written through (the link stays).

#if !__has_include(<nlohmann/json.hpp>)
#error "remat/io needs nlohmann/json (Debian: nlohmann-json3-dev)"
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "remat/core/error.hpp"
#include "remat/core/tensor.hpp"
#include "remat/io/half.hpp"
#include "remat/io/posix_file.hpp"

namespace remat::io {

static_assert(std::endian::native == std::endian::little,
              "remat/io writes the host's bytes as little-endian safetensors data: add byte "
              "swapping for this host");

/// Free-form string metadata stored in the header's "__metadata__".
using Metadata = std::map<std::string, std::string>;

/// A tensor to write, with its name.
template <class T>
using NamedTensor = std::pair<std::string, Tensor<T>>;

/// Largest header accepted, as in the reference implementation.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

/// Deepest nesting of arrays and objects accepted in a header. A valid header nests three levels
/// (the header object, an entry object, its shape array); the bound keeps a hostile header (an
/// array nested 100,000 deep) from exhausting the stack of any code that walks the JSON.
inline constexpr int kMaxHeaderDepth = 64;

namespace detail {

/// The offset of the first bracket that opens a level deeper than `limit` in JSON `text`
/// (brackets inside strings do not count), or npos. Nesting is bounded before parsing because
/// nlohmann's parser recurses once per level.
inline std::size_t nesting_overflow(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return i;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return std::string_view::npos;
}

template <class T>
constexpr const char* dtype_name() {
  static_assert(
      std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t>,
      "remat/io reads float, double and int32 tensors");
  return std::is_same_v<T, float> ? "F32" : std::is_same_v<T, double> ? "F64" : "I32";
}

/// The bits of one element of `dtype`, or 0 for a name that is no dtype: the safetensors crate's
/// list, the sub-byte F4 and F6 formats and the complex C64 included (a file holding them is
/// valid; remat refuses to read those tensors, not the file).
inline std::size_t dtype_bits(std::string_view dtype) {
  static constexpr std::pair<std::string_view, std::size_t> bits[] = {
      {"F64", 64},    {"F32", 32},        {"BF16", 16},       {"F16", 16},    {"I64", 64},
      {"I32", 32},    {"I16", 16},        {"I8", 8},          {"U8", 8},      {"BOOL", 8},
      {"U16", 16},    {"U32", 32},        {"U64", 64},        {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"C64", 64},    {"F6_E2M3", 6},
      {"F6_E3M2", 6}, {"F4", 4}};
  for (const auto& [name, n] : bits) {
    if (name == dtype) return n;
  }
  return 0;
}

/// The bytes of one element of a dtype remat reads (whole bytes).
inline std::size_t dtype_size(std::string_view dtype) { return dtype_bits(dtype) / 8; }

/// Whether tensors of `dtype` read into float and double tensors (exactly, but F64 into float).
inline bool is_float_dtype(std::string_view dtype) {
  return dtype == "F64" || dtype == "F32" || dtype == "BF16" || dtype == "F16";
}

/// Whether tensors of `dtype` read into Tensor<std::int32_t>.
inline bool is_integer_dtype(std::string_view dtype) {
  return dtype == "I64" || dtype == "I32" || dtype == "I16" || dtype == "I8" || dtype == "U8" ||
         dtype == "BOOL" || dtype == "U16" || dtype == "U32" || dtype == "U64";
}

/// Whether `dtype` is one of the format's dtype names.
inline bool is_safetensors_dtype(std::string_view dtype) { return dtype_bits(dtype) != 0; }

/// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629: no overlong forms, no
/// surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
inline std::size_t utf8_sequence_at(std::string_view text, std::size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf)
    n = 1;
  else if (c >= 0xe0 && c <= 0xef)
    n = 2, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 3, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else
    return 0;
  if (n > text.size() - i - 1) return 0;
  for (std::size_t k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return 0;
  }
  return n + 1;
}

/// The position of the first byte of `text` that is not part of well-formed UTF-8, or npos.
inline std::size_t invalid_utf8_at(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence_at(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

/// `text` fit for a message: at most `limit` bytes of it, control bytes and bytes that are not
/// UTF-8 escaped (\xNN), and the length of what was cut. File contents and names are untrusted
/// and unbounded; messages stay short and readable.
inline std::string brief(std::string_view text, std::size_t limit = 64) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size() && i < limit) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_sequence_at(text, i);
    if (n == 0 || c < 0x20 || c == 0x7f) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  if (i < text.size()) out += remat::detail::cat("... (", text.size(), " bytes)");
  return out;
}

/// A JSON value fit for a message (see brief()).
inline std::string brief_json(const nlohmann::json& value) {
  return brief(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

/// One tensor of a header to write: its name, dtype, shape and size in bytes.
struct HeaderEntry {
  std::string name;
  std::string dtype;
  Shape shape;
  std::size_t bytes = 0;
};

/// The bytes before the data: the 8-byte length and the JSON header, padded with spaces so that
/// the data starts 8-byte aligned, as the reference writer does. Offsets follow `entries` in
/// order. Throws an IoError naming `path` for a name or metadata string that cannot be written.
inline std::string encode_header(const std::string& path, const std::vector<HeaderEntry>& entries,
                                 const Metadata& metadata) {
  const auto refuse = [&](const std::string& why) {
    throw IoError(remat::detail::cat("safetensors: cannot save ", path, ": ", why));
  };
  const auto check_utf8 = [&](std::string_view what, const std::string& text) {
    const std::size_t at = invalid_utf8_at(text);
    if (at != std::string_view::npos) {
      refuse(remat::detail::cat(what, " '", brief(text), "' is not valid UTF-8 (byte ", at,
                                "); JSON holds only UTF-8 text"));
    }
  };
  nlohmann::json header = nlohmann::json::object();
  for (const auto& [key, value] : metadata) {
    check_utf8("metadata key", key);
    check_utf8(remat::detail::cat("the value of metadata '", brief(key), "',"), value);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const HeaderEntry& e : entries) {
    check_utf8("tensor name", e.name);
    if (e.name.empty() || e.name == "__metadata__" || header.contains(e.name)) {
      refuse(
          remat::detail::cat("tensor name '", brief(e.name), "' is empty, reserved or repeated"));
    }
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", std::vector<std::int64_t>(e.shape.begin(), e.shape.end())},
                      {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (
      const nlohmann::json::exception& e) {  // checked above; kept so that no JSON error escapes
    refuse(brief(e.what(), 200));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t length = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &length, 8);
  return out + text;
}

}  // namespace detail

/// How save() stores float tensors: as their own type (F32 for float, F64 for double), or as
/// bfloat16 (BF16), rounded to nearest, ties to even, as torch's `.bfloat16()` does (a double
/// through float first, as torch does).
enum class StoreAs { native, bf16 };

/// Writes `tensors` (names unique, non-empty, UTF-8) and `metadata` (UTF-8) to `path`,
/// atomically, in `store` format. Every failure is an IoError naming the file (and strerror for
/// system errors).
template <class T>
void save(const std::string& path, const std::vector<NamedTensor<T>>& tensors,
          const Metadata& metadata = {}, StoreAs store = StoreAs::native) {
  static_assert(std::is_floating_point_v<T>, "remat/io saves float and double tensors");
  std::vector<detail::HeaderEntry> entries;
  std::vector<std::pair<const void*, std::size_t>> chunks(1);
  std::vector<std::vector<std::uint16_t>> narrowed;  // the BF16 copies, alive until written
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) {
      throw IoError(remat::detail::cat("safetensors: cannot save ", path, ": tensor '",
                                       detail::brief(name), "' is undefined"));
    }
    if (!t.has_data()) {
      throw IoError(remat::detail::cat("safetensors: cannot save ", path, ": tensor '",
                                       detail::brief(name), "' ", t.shape(),
                                       " was made in a shape-only run and has no values"));
    }
    if (store == StoreAs::bf16) {
      std::vector<std::uint16_t>& out = narrowed.emplace_back(static_cast<std::size_t>(t.numel()));
      for (std::size_t i = 0; i < out.size(); ++i) {
        out[i] = std::is_same_v<T, float> ? float_to_bf16(static_cast<float>(t.data()[i]))
                                          : double_to_bf16(static_cast<double>(t.data()[i]));
      }
      entries.push_back({name, "BF16", t.shape(), out.size() * 2});
      chunks.emplace_back(out.data(), out.size() * 2);
    } else {
      entries.push_back({name, detail::dtype_name<T>(), t.shape(), t.bytes()});
      chunks.emplace_back(t.data(), t.bytes());
    }
  }
  const std::string header = detail::encode_header(path, entries, metadata);
  chunks[0] = {header.data(), header.size()};
  detail::write_atomically(path, chunks);
}

namespace detail {

/// The bytes of a safetensors file: a buffer in memory, or an open file read with pread() as
/// needed. Note [no memory map]: a memory map would save one copy, but a file truncated while
/// mapped (another process rewriting it) turns a read of the lost pages into SIGBUS, which kills
/// the process; pread() reports the shorter file as a short read, which becomes an IoError.
class Bytes {
 public:
  explicit Bytes(std::vector<char> buffer) : buffer_(std::move(buffer)), size_(buffer_.size()) {}
  Bytes(Descriptor fd, std::size_t size, std::string path)
      : fd_(std::move(fd)), size_(size), path_(std::move(path)) {}
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;

  /// The size the file had when it was opened (the size validated against the header).
  std::size_t size() const noexcept { return size_; }

  /// The bytes [at, at + n) in memory, or null when they are read from the file (see read()).
  const char* memory(std::size_t at) const noexcept {
    return fd_.valid() ? nullptr : buffer_.data() + at;
  }

  /// Copies the bytes [at, at + n) (within size()) into `to`; an IoError naming the file when it
  /// has shrunk since it was opened, or on a read error.
  void read(std::size_t at, std::size_t n, char* to) const {
    if (!fd_.valid()) {
      if (n > 0) std::memcpy(to, buffer_.data() + at, n);  // a 0-element tensor has no buffer
      return;
    }
    while (n > 0) {
      const ssize_t got = ::pread(fd_.get(), to, n, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        throw IoError(
            remat::detail::cat("safetensors: reading ", path_, " failed: ", std::strerror(errno)));
      }
      if (got == 0) {
        throw IoError(remat::detail::cat("safetensors: ", path_, " shrank to ", at,
                                         " bytes while being read (it had ", size_,
                                         " when opened): was it truncated or rewritten?"));
      }
      at += static_cast<std::size_t>(got);
      to += got;
      n -= static_cast<std::size_t>(got);
    }
  }

 private:
  std::vector<char> buffer_;
  Descriptor fd_{-1};
  std::size_t size_ = 0;
  std::string path_;
};

/// Converts `n` elements of dtype `dtype` at `from` (little-endian, maybe unaligned) to T at
/// `to`. The dtype is one that reads into T (checked by the caller); an integer out of int32's
/// range returns false (the caller names it).
template <class T>
bool convert(std::string_view dtype, const char* from, std::size_t n, T* to) {
  // Floats never fail: plain loops the compiler vectorizes. Integers check int32's range.
  const auto widen = [&](auto tag, auto f) {
    using S = decltype(tag);
    for (std::size_t i = 0; i < n; ++i) {
      S s;
      std::memcpy(&s, from + i * sizeof(S), sizeof(S));
      to[i] = f(s);
    }
    return true;
  };
  const auto narrow = [&](auto tag) {
    using S = decltype(tag);
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) {
      S s;
      std::memcpy(&s, from + i * sizeof(S), sizeof(S));
      ok &= !(std::cmp_less(s, INT32_MIN) || std::cmp_greater(s, INT32_MAX));
      to[i] = static_cast<T>(s);
    }
    return ok;
  };
  if constexpr (std::is_floating_point_v<T>) {
    if (dtype == "F64") return widen(double{}, [](double s) { return static_cast<T>(s); });
    if (dtype == "F32") return widen(float{}, [](float s) { return static_cast<T>(s); });
    if (dtype == "BF16")
      return widen(std::uint16_t{},
                   [](std::uint16_t s) { return static_cast<T>(bf16_to_float(s)); });
    if (dtype == "F16")
      return widen(std::uint16_t{},
                   [](std::uint16_t s) { return static_cast<T>(f16_to_float(s)); });
  } else {
    if (dtype == "I64") return narrow(std::int64_t{});
    if (dtype == "I32") return narrow(std::int32_t{});
    if (dtype == "I16") return narrow(std::int16_t{});
    if (dtype == "I8") return narrow(std::int8_t{});
    if (dtype == "U8") return narrow(std::uint8_t{});
    if (dtype == "BOOL")
      return widen(std::uint8_t{}, [](std::uint8_t s) { return static_cast<T>(s != 0); });
    if (dtype == "U16") return narrow(std::uint16_t{});
    if (dtype == "U32") return narrow(std::uint32_t{});
    if (dtype == "U64") return narrow(std::uint64_t{});
  }
  return false;
}

}  // namespace detail

/// A safetensors file, validated, whose tensors are read when asked.
class File {
 public:
  struct Entry {
    std::string dtype;
    Shape shape;
    std::size_t begin = 0, end = 0;  // in the data section
  };

  /// Opens and validates `path`: reads its header and keeps the file open, to read tensors from
  /// it when asked (Note [no memory map]). Throws an IoError naming the file and the problem
  /// (with strerror for system errors: missing, unreadable, a directory, ...); anything but a
  /// regular file (a FIFO, a device) is refused without being read.
  static File read(const std::string& path) {
    auto [fd, size] = detail::open_regular(path, "safetensors");
    return File(path, std::make_shared<const detail::Bytes>(std::move(fd), size, path));
  }

  /// Parses and validates a file's bytes (`where` names it in messages).
  File(std::string where, std::vector<char> bytes)
      : File(std::move(where), std::make_shared<const detail::Bytes>(std::move(bytes))) {}

  const Metadata& metadata() const noexcept { return metadata_; }
  const std::map<std::string, Entry>& entries() const noexcept { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }

  const Entry& entry(const std::string& name) const {
    const auto it = entries_.find(name);
    if (it == entries_.end())
      throw IoError(remat::detail::cat("safetensors: ", path_, " has no tensor named '",
                                       detail::brief(name), "'"));
    return it->second;
  }

  /// A copy of the raw bytes of tensor `name` (an IoError if the file has shrunk since it was
  /// opened).
  std::vector<char> bytes(const std::string& name) const {
    const Entry& e = entry(name);
    std::vector<char> out(e.end - e.begin);
    storage_->read(data_start_ + e.begin, out.size(), out.data());
    return out;
  }

  /// The file's name as messages give it.
  const std::string& path() const noexcept { return path_; }

  /// Whether tensor `name` reads into a Tensor<T>: F64, F32, BF16 and F16 into double, the
  /// last three into float, the integer dtypes into std::int32_t.
  template <class T>
  bool reads_as(const std::string& name) const {
    const std::string& dtype = entry(name).dtype;
    if constexpr (std::is_same_v<T, std::int32_t>)
      return detail::is_integer_dtype(dtype);
    else if constexpr (std::is_same_v<T, float>)
      return detail::is_float_dtype(dtype) && dtype != "F64";
    else
      return detail::is_float_dtype(dtype);
  }

  /// The tensor called `name`, converted to T (see reads_as(); any other dtype is an IoError
  /// naming the tensor, the file and both dtypes).
  template <class T>
  Tensor<T> tensor(const std::string& name) const {
    Tensor<T> t(entry(name).shape);
    read_into(name, t);
    return t;
  }

  /// Converts tensor `name` into `out`, whose shape must be the tensor's, slice by slice (one
  /// slice of the file in memory at a time). Throws an IoError naming the tensor, the file and
  /// both shapes or dtypes on a mismatch, before writing anything; an integer out of int32's
  /// range, or a file that shrank since it was opened, is an IoError too (`out` then holds part
  /// of the values).
  template <class T>
  void read_into(const std::string& name, Tensor<T>& out) const {
    const Entry& e = entry(name);
    check_readable<T>(name);
    if (!out.defined() || !(out.shape() == e.shape)) {
      throw IoError(remat::detail::cat("safetensors: tensor '", detail::brief(name), "' in ", path_,
                                       " has shape ", e.shape, ", not the ",
                                       out.defined() ? out.shape() : Shape{}, " expected"));
    }
    const std::size_t size = detail::dtype_size(e.dtype), n = static_cast<std::size_t>(out.numel());
    constexpr std::size_t kSlice = std::size_t{1}
                                   << 22;  // elements per slice: 8-32 MiB of the file
    std::vector<char> slice;
    for (std::size_t done = 0; done < n; done += kSlice) {
      const std::size_t count = std::min(kSlice, n - done),
                        at = data_start_ + e.begin + done * size;
      const char* from = storage_->memory(at);
      if (!from) {
        slice.resize(count * size);
        storage_->read(at, slice.size(), slice.data());
        from = slice.data();
      }
      if (!detail::convert<T>(e.dtype, from, count, out.data() + done)) {
        throw IoError(remat::detail::cat("safetensors: tensor '", detail::brief(name), "' in ",
                                         path_, " is ", e.dtype,
                                         " and holds a value outside int32's range"));
      }
    }
  }

  /// Throws the IoError read_into() would for a tensor that does not read into T; nothing else.
  template <class T>
  void check_readable(const std::string& name) const {
    if (reads_as<T>(name)) return;
    const Entry& e = entry(name);
    throw IoError(remat::detail::cat(
        "safetensors: tensor '", detail::brief(name), "' in ", path_, " is ", e.dtype, " ", e.shape,
        ", which does not read into ", detail::dtype_name<T>(),
        std::is_same_v<T, std::int32_t> ? " (integer dtypes do)"
                                        : " (F64, F32, BF16 and F16 do; F64 only into double)"));
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw IoError(remat::detail::cat("safetensors: ", path_, " is malformed: ", why));
  }

  /// Checks what a JSON parser would let through or choke on, before parsing: the header starts
  /// with '{' after JSON white space, which the safetensors crate allows so that writers can
  /// align the data (a byte-order mark is named), holds no NUL byte (a parser may stop at it and
  /// ignore the rest) and nests at most kMaxHeaderDepth levels.
  void scan(std::string_view header) const {
    if (header.empty()) fail("the header is empty (its length is 0)");
    if (header.substr(0, 3) == "\xEF\xBB\xBF")
      fail("the header starts with a UTF-8 byte-order mark; it must start with '{'");
    const std::size_t first = header.find_first_not_of(" \t\n\r");
    if (first == std::string_view::npos || header[first] != '{')
      fail(remat::detail::cat("the header starts with '",
                              detail::brief(header.substr(std::min(first, header.size() - 1), 1)),
                              "', not '{'"));
    if (const std::size_t nul = header.find('\0'); nul != std::string_view::npos) {
      fail(remat::detail::cat("the header holds a NUL byte at offset ", nul));
    }
    if (const std::size_t i = detail::nesting_overflow(header, kMaxHeaderDepth);
        i != std::string_view::npos) {
      fail(remat::detail::cat("the header nests deeper than ", kMaxHeaderDepth,
                              " levels (at offset ", i, ")"));
    }
  }

  void parse() {
    const std::size_t file_size = storage_->size();
    if (file_size < 8)
      fail(remat::detail::cat("it has ", file_size,
                              " bytes, fewer than the 8 of the header length"));
    std::uint64_t length = 0;
    storage_->read(0, 8, reinterpret_cast<char*>(&length));
    if (length > kMaxHeaderBytes)
      fail(remat::detail::cat("the header length ", length, " exceeds the ", kMaxHeaderBytes,
                              " allowed"));
    if (length > file_size - 8) {
      fail(remat::detail::cat("the header length ", length, " runs past the end of the file (",
                              file_size - 8, " bytes follow it): truncated?"));
    }
    data_start_ = 8 + length;
    const std::size_t data_size = file_size - data_start_;
    std::string text(length, '\0');  // bounded by the file's size, checked above
    storage_->read(8, text.size(), text.data());
    scan(text);
    // JSON parsers keep the last of repeated keys; we refuse them, at every level: each open
    // object's keys so far (the scan bounded how many objects can be open).
    std::vector<std::set<std::string>> open;
    std::string entry_name;
    const auto no_repeats = [&](int depth, nlohmann::json::parse_event_t event,
                                nlohmann::json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if (event == E::object_start) open.emplace_back();
      if (event == E::object_end) open.pop_back();
      if (event != E::key) return true;
      const auto& key = parsed.get_ref<const std::string&>();
      if (depth == 1) entry_name = key;
      if (!open.back().insert(key).second) {
        if (depth == 1)
          fail(remat::detail::cat("the name '", detail::brief(key),
                                  "' appears twice in the header"));
        fail(remat::detail::cat("the key '", detail::brief(key),
                                "' appears twice in the entry of '", detail::brief(entry_name),
                                "'"));
      }
      return true;
    };
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text.begin(), text.end(), no_repeats);
    } catch (const nlohmann::json::exception& e) {
      fail(remat::detail::cat("the header is not valid JSON (", detail::brief(e.what(), 160), ")"));
    }
    if (!header.is_object()) fail("the header is not a JSON object");
    std::vector<std::tuple<std::size_t, std::size_t, std::string>> spans;
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        parse_metadata(value);
        continue;
      }
      const Entry& e = entries_.emplace(name, parse_entry(name, value, data_size)).first->second;
      spans.emplace_back(e.begin, e.end, name);
    }
    // The data must be covered exactly: no overlaps, no holes, nothing after. Ordered by offsets
    // (begin, then end), so that an empty tensor [b, b) comes before one starting at b.
    std::sort(spans.begin(), spans.end());
    std::size_t at = 0;
    for (const auto& [begin, end, name] : spans) {
      if (begin != at) {
        fail(remat::detail::cat("tensor '", detail::brief(name), "' starts at byte ", begin,
                                " of the data, but the previous tensor ends at ", at,
                                begin < at ? " (they overlap)" : " (a hole)"));
      }
      at = end;
    }
    if (at != data_size)
      fail(remat::detail::cat("the tensors cover ", at, " bytes of data but ", data_size,
                              " follow the header"));
  }

  void parse_metadata(const nlohmann::json& value) {
    if (value.is_null()) return;  // an absent map to the safetensors crate
    if (!value.is_object()) fail("\"__metadata__\" is not an object");
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string())
        fail(remat::detail::cat("metadata '", detail::brief(key), "' is not a string but ",
                                detail::brief_json(v)));
      metadata_[key] = v.get<std::string>();
    }
  }

  Entry parse_entry(const std::string& name, const nlohmann::json& value,
                    std::size_t data_size) const {
    const auto bad = [&](const std::string& why) {
      fail(remat::detail::cat("tensor '", detail::brief(name), "': ", why));
    };
    if (!value.is_object())
      bad(remat::detail::cat("its entry is not an object but ", detail::brief_json(value)));
    for (const auto& [key, v] : value.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        bad(remat::detail::cat("unexpected field '", detail::brief(key), "'"));
    }
    if (!value.contains("dtype") || !value["dtype"].is_string()) bad("no dtype string");
    if (!value.contains("shape") || !value["shape"].is_array()) bad("no shape array");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2) {
      bad("no data_offsets pair");
    }
    Entry e;
    e.dtype = value["dtype"].get<std::string>();
    const std::size_t bits = io::detail::dtype_bits(e.dtype);
    if (bits == 0)
      bad(remat::detail::cat("dtype '", detail::brief(e.dtype), "' is not a safetensors dtype"));
    const auto& shape = value["shape"];
    if (shape.size() > static_cast<std::size_t>(Shape::kMaxRank)) {
      bad(remat::detail::cat("its shape has ", shape.size(), " axes, more than the ",
                             Shape::kMaxRank, " remat supports"));
    }
    std::vector<std::int64_t> dims;
    for (const auto& d : shape) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
        bad(remat::detail::cat("shape ", detail::brief_json(shape),
                               " holds a value that is not an integer in [0, 2^63)"));
      }
      dims.push_back(d.get<std::int64_t>());
    }
    // The extents must multiply without overflow, left to right as the safetensors crate
    // multiplies them: a zero after extents whose product overflows does not save the shape.
    std::uint64_t count = 1;
    for (const std::int64_t d : dims) {
      const auto extent = static_cast<std::uint64_t>(d);
      if (extent != 0 && count > static_cast<std::uint64_t>(INT64_MAX) / extent) {
        bad(remat::detail::cat("shape ", detail::brief_json(shape),
                               " overflows: its extents multiply to more than 2^63"));
      }
      count *= extent;
    }
    e.shape = Shape(std::span<const std::int64_t>(dims));
    const auto& offsets = value["data_offsets"];
    for (const auto& o : offsets) {
      if (!o.is_number_integer() || o.get<std::int64_t>() < 0) {
        bad(remat::detail::cat("data_offsets ", detail::brief_json(offsets),
                               " are not integers in [0, 2^63)"));
      }
    }
    const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > data_size) {
      bad(remat::detail::cat("data_offsets [", begin, ", ", end, ") fall outside the ", data_size,
                             " bytes of data"));
    }
    // count * bits may not fit in 64 bits (count < 2^63): compare without multiplying; a
    // sub-byte dtype's elements must fill whole bytes (the crate's rule)
    if (count > UINT64_MAX / bits)
      bad(remat::detail::cat("shape ", detail::brief_json(shape), " of ", e.dtype,
                             " overflows: its bits are more than 2^64"));
    if (count * bits % 8 != 0)
      bad(remat::detail::cat("shape ", detail::brief_json(shape), " of ", e.dtype, " holds ",
                             count * bits, " bits, not whole bytes"));
    if (end - begin != count * bits / 8) {
      bad(remat::detail::cat("data_offsets [", begin, ", ", end, ") hold ", end - begin,
                             " bytes but ", e.dtype, " ", detail::brief_json(shape), " needs ",
                             count * bits / 8));
    }
    e.begin = static_cast<std::size_t>(begin);
    e.end = static_cast<std::size_t>(end);
    return e;
  }

  File(std::string where, std::shared_ptr<const detail::Bytes> storage)
      : path_(std::move(where)), storage_(std::move(storage)) {
    parse();
  }

  std::string path_;
  std::shared_ptr<const detail::Bytes> storage_;  // shared by copies of the File
  std::size_t data_start_ = 0;
  Metadata metadata_;
  std::map<std::string, Entry> entries_;
};

}  // namespace remat::io
