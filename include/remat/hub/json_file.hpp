#pragma once
/// @file
/// Reading the JSON files of a Hugging Face folder (tokenizer.json, tokenizer_config.json) with
/// errors that name the file and the field: a `JsonField` is a value together with its path
/// ("FILE: model.merges[3]"), and every accessor throws an IoError quoting that path and the
/// offending value. Unknown keys are refused (`require_keys`), so a field remat does not
/// implement is never ignored silently.

#if !__has_include(<nlohmann/json.hpp>)
#error "remat/hub/json_file.hpp needs nlohmann/json (Debian: nlohmann-json3-dev)"
#endif

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>

#include "remat/core/error.hpp"
#include "remat/io/safetensors.hpp"

namespace remat::hub {

/// A JSON value and where it was read from, for error messages.
class JsonField {
 public:
  JsonField(const nlohmann::json& value, std::string path)
      : value_(&value), path_(std::move(path)) {}

  const nlohmann::json& value() const { return *value_; }
  /// "FILE: a.b[2]".
  const std::string& path() const { return path_; }

  /// Throws an IoError "PATH: what".
  [[noreturn]] void fail(std::string_view what) const {
    throw IoError(remat::detail::cat(path_, path_.back() == ':' ? " " : ": ", what));
  }
  /// The value, shortened for a message.
  std::string shown() const {
    std::string text = value_->dump();
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    return text;
  }

  bool is_null() const { return value_->is_null(); }
  bool has(const char* key) const { return value_->is_object() && value_->contains(key); }

  /// The member `key` (which must exist) of this object.
  JsonField operator[](const char* key) const {
    if (!value_->is_object()) fail(remat::detail::cat("expected an object, found ", shown()));
    const auto it = value_->find(key);
    if (it == value_->end()) fail(remat::detail::cat("missing field '", key, "'"));
    return JsonField(*it, child(key));
  }
  /// Element `i` of this array.
  JsonField at(std::size_t i) const {
    return JsonField((*value_)[i], remat::detail::cat(path_, "[", i, "]"));
  }
  std::size_t size() const {
    if (!value_->is_array()) fail(remat::detail::cat("expected an array, found ", shown()));
    return value_->size();
  }

  std::string string() const {
    if (!value_->is_string()) fail(remat::detail::cat("expected a string, found ", shown()));
    return value_->get<std::string>();
  }
  bool boolean() const {
    if (!value_->is_boolean()) fail(remat::detail::cat("expected true or false, found ", shown()));
    return value_->get<bool>();
  }
  std::int64_t integer() const {
    if (!value_->is_number_integer())
      fail(remat::detail::cat("expected an integer, found ", shown()));
    return value_->get<std::int64_t>();
  }
  /// The member `key` as a boolean, or `fallback` when it is absent or null.
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key) || (*value_)[key].is_null()) return fallback;
    return (*this)[key].boolean();
  }

  /// Throws unless every key of this object is one of `known`: a field remat does not read
  /// must not be dropped silently.
  void require_keys(std::initializer_list<std::string_view> known) const {
    if (!value_->is_object()) fail(remat::detail::cat("expected an object, found ", shown()));
    for (const auto& item : value_->items()) {
      bool found = false;
      for (const auto k : known) found = found || item.key() == k;
      if (!found) {
        std::string list;
        for (const auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
        fail(remat::detail::cat("field '", item.key(), "' (value ",
                                JsonField(item.value(), "").shown(),
                                ") is not supported (known fields: ", list, ")"));
      }
    }
  }

  /// The path of member `key`.
  std::string child(std::string_view key) const {
    return remat::detail::cat(path_, path_.back() == ':' ? " " : ".", key);
  }

 private:
  const nlohmann::json* value_;
  std::string path_;
};

namespace detail {

/// Deepest nesting accepted: nlohmann's parser recurses once per level, so a hostile file of a
/// million '[' would overflow the stack. tokenizer.json nests about 6 deep.
inline constexpr int kMaxJsonDepth = 64;

/// Throws unless `text` nests arrays/objects at most kMaxJsonDepth deep (strings skipped).
inline void check_depth(std::string_view text, const std::string& file) {
  if (const std::size_t i = io::detail::nesting_overflow(text, kMaxJsonDepth);
      i != std::string_view::npos)
    throw IoError(remat::detail::cat(file, ": JSON nests deeper than ", kMaxJsonDepth,
                                     " levels at byte ", i));
}

}  // namespace detail

/// The parsed contents of the JSON file at `file` (an IoError naming it if it cannot be read or
/// is not JSON).
inline nlohmann::json read_json_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IoError(remat::detail::cat(file, ": cannot open"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (!in.good() && !in.eof()) throw IoError(remat::detail::cat(file, ": cannot read"));
  const std::string text = buffer.str();
  detail::check_depth(text, file);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(remat::detail::cat(file, ": malformed JSON (", e.what(), ")"));
  }
}

}  // namespace remat::hub
