#pragma once
/// @file
/// Strict JSON, for every JSON file remat reads (a model's config.json, adapter_config.json,
/// model.safetensors.index.json): a regular file (a FIFO or a device is refused before it is
/// read, so it cannot hang the reader) of at most kMaxJsonBytes, nesting at most
/// kMaxHeaderDepth levels, holding one JSON text in which no object repeats a key. JSON parsers
/// keep the last of repeated keys, so a file that says two things would be read as the second:
/// it is refused instead. Every failure is an IoError whose message starts with what the caller
/// names (the file, and the reader), and quotes the file only briefly (detail::brief).

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "remat/io/posix_file.hpp"
#include "remat/io/safetensors.hpp"

namespace remat::io {

/// Largest JSON file read (as large as the largest safetensors header).
inline constexpr std::uint64_t kMaxJsonBytes = kMaxHeaderBytes;

/// Parses `text` strictly (see the file comment); `who` starts every message ("config.json",
/// "safetensors index m/model.safetensors.index.json"). `Json` may be nlohmann::ordered_json
/// where the file's key order means something (PEFT's patterns: the first key that matches).
template <class Json = nlohmann::json>
Json parse_json(std::string_view text, const std::string& who) {
  const auto fail = [&](const std::string& why) {
    throw IoError(remat::detail::cat(who, ": ", why));
  };
  // Bounded nesting, checked before parsing: nlohmann's parser recurses once per level.
  if (const std::size_t i = detail::nesting_overflow(text, kMaxHeaderDepth);
      i != std::string_view::npos) {
    fail(remat::detail::cat("JSON nests deeper than ", kMaxHeaderDepth, " levels (at byte ", i,
                            ")"));
  }
  // Each open object's keys so far, and the key that holds it (for the message).
  struct Open {
    std::set<std::string> keys;
    std::string name;
    std::string last;
  };
  std::vector<Open> open;
  const auto no_repeats = [&](int, typename Json::parse_event_t event, Json& parsed) {
    using E = typename Json::parse_event_t;
    if (event == E::object_start)
      open.push_back({{}, open.empty() ? std::string() : open.back().last, {}});
    if (event == E::object_end) open.pop_back();
    if (event != E::key) return true;
    const auto& key = parsed.template get_ref<const std::string&>();
    open.back().last = key;
    if (!open.back().keys.insert(key).second) {
      std::string where;
      for (std::size_t k = 1; k < open.size(); ++k) where += (k > 1 ? "." : "") + open[k].name;
      fail(remat::detail::cat("the key '", detail::brief(key), "' appears twice",
                              where.empty() ? std::string(" in the top-level object")
                                            : " in the object '" + detail::brief(where) + "'",
                              "; JSON readers would keep the last one silently"));
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), no_repeats);
  } catch (const nlohmann::json::exception& e) {
    fail(remat::detail::cat("not valid JSON (", detail::brief(e.what(), 160), ")"));
  }
  return {};  // not reached
}

/// The whole text of the regular file `path`, at most `limit` bytes; an IoError naming it
/// otherwise (`who` starts the message).
inline std::string read_text_file(const std::string& path, std::string_view who,
                                  std::uint64_t limit = kMaxJsonBytes) {
  auto [fd, size] = detail::open_regular(path, who);
  if (size > limit)
    throw IoError(remat::detail::cat(who, ": ", path, " holds ", size, " bytes, more than the ",
                                     limit, " read"));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw IoError(remat::detail::cat(who, ": reading ", path, " failed: ", std::strerror(errno)));
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > limit)  // it grew while being read
      throw IoError(
          remat::detail::cat(who, ": ", path, " holds more than the ", limit, " bytes read"));
  }
  return text;
}

/// read_text_file() then parse_json(): the JSON value of the regular file `path`; every failure
/// is an IoError starting with `who` and naming the file.
template <class Json = nlohmann::json>
Json read_json_file(const std::string& path, std::string_view who) {
  return parse_json<Json>(read_text_file(path, who), remat::detail::cat(who, ": ", path));
}

}  // namespace remat::io
