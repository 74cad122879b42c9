#pragma once
/// @file
/// Fine-tuning data as people already have it: conversations in JSONL, one
/// `{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}]}` per line (the
/// layout common fine-tuning services accept), and plain text files. Every line is parsed
/// strictly (`io/json.hpp`: repeated keys refused, unknown keys refused here); a malformed line
/// is a MalformedDataError naming the file, the line number and what is wrong, unless
/// `skip_bad` asks to skip and count it. An empty file, a role other than the three, and a
/// conversation without an assistant turn are errors of their own, never a silent empty run.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/hub/utf8.hpp"
#include "remat/io/json.hpp"

namespace remat::hub {

/// Bad fine-tuning data (the base of the errors below).
class DataError : public IoError {
 public:
  using IoError::IoError;
};
/// A line that is not a valid conversation: its file, line number and what is wrong.
class MalformedDataError : public DataError {
 public:
  using DataError::DataError;
};
/// A data file with no example in it.
class EmptyDataError : public DataError {
 public:
  using DataError::DataError;
};
/// A role outside system/user/assistant, or one the model's chat template refuses.
class UnknownRoleError : public DataError {
 public:
  using DataError::DataError;
};
/// A conversation with no assistant turn: nothing to learn from.
class NoAssistantError : public DataError {
 public:
  using DataError::DataError;
};

/// Largest data file read at once (it is held in memory whole).
inline constexpr std::uint64_t kMaxDataBytes = std::uint64_t{1} << 36;

/// Who speaks a message.
enum class Role { system, user, assistant };

/// The name a chat template uses for `role`.
inline const char* role_name(Role role) {
  switch (role) {
    case Role::system:
      return "system";
    case Role::user:
      return "user";
    case Role::assistant:
      return "assistant";
  }
  return "?";
}

/// One message of a conversation.
struct Message {
  Role role = Role::user;
  std::string content;
};

/// One training example in the chat layout; `source` is "FILE:LINE" for error messages.
struct Conversation {
  std::vector<Message> messages;
  std::string source;
};

/// How to read a data file.
struct ReadOptions {
  /// Skip (and count) malformed lines instead of throwing.
  bool skip_bad = false;
};

/// The conversations of a file and how many lines were skipped.
struct ConversationFile {
  std::vector<Conversation> conversations;
  std::size_t skipped = 0;
  /// The first skipped line's error, to show the user what was skipped.
  std::string first_skipped;
};

namespace detail {

/// The message at `where` of one JSON line, or a MalformedDataError / UnknownRoleError.
inline Message read_message(const nlohmann::json& m, const std::string& where) {
  if (!m.is_object())
    throw MalformedDataError(
        remat::detail::cat(where, ": expected an object, found ", m.type_name()));
  for (const auto& [key, value] : m.items())
    if (key != "role" && key != "content")
      throw MalformedDataError(remat::detail::cat(where, ": unknown key '", key,
                                                  "' (a message has \"role\" and \"content\")"));
  if (!m.contains("role") || !m["role"].is_string())
    throw MalformedDataError(remat::detail::cat(where, ": \"role\" is missing or not a string"));
  if (!m.contains("content") || !m["content"].is_string())
    throw MalformedDataError(remat::detail::cat(where, ": \"content\" is missing or not a string"));
  const auto& role = m["role"].get_ref<const std::string&>();
  Message out;
  if (role == "system")
    out.role = Role::system;
  else if (role == "user")
    out.role = Role::user;
  else if (role == "assistant")
    out.role = Role::assistant;
  else
    throw UnknownRoleError(remat::detail::cat(where, ": unknown role '", role,
                                              "' (expected system, user or assistant)"));
  out.content = m["content"].get<std::string>();
  return out;
}

}  // namespace detail

/// Parses one JSONL line (`source` is "FILE:LINE"): a MalformedDataError, UnknownRoleError or
/// NoAssistantError naming `source` when it is not a conversation worth training on.
inline Conversation parse_conversation(std::string_view line, const std::string& source) {
  nlohmann::json json;
  try {
    json = io::parse_json(line, source);
  } catch (const IoError& e) {
    throw MalformedDataError(e.what());
  }
  if (!json.is_object())
    throw MalformedDataError(
        remat::detail::cat(source, ": expected a JSON object, found ", json.type_name()));
  for (const auto& [key, value] : json.items())
    if (key != "messages")
      throw MalformedDataError(remat::detail::cat(source, ": unknown key '", key,
                                                  "' (a line is {\"messages\": [...]})"));
  if (!json.contains("messages") || !json["messages"].is_array())
    throw MalformedDataError(
        remat::detail::cat(source, ": \"messages\" is missing or not an array"));
  Conversation c;
  c.source = source;
  const auto& messages = json["messages"];
  for (std::size_t i = 0; i < messages.size(); ++i)
    c.messages.push_back(
        detail::read_message(messages[i], remat::detail::cat(source, ": messages[", i, "]")));
  bool has_assistant = false;
  for (const Message& m : c.messages) has_assistant |= m.role == Role::assistant;
  if (!has_assistant)
    throw NoAssistantError(remat::detail::cat(
        source, ": no assistant message (", c.messages.size(),
        " messages): the loss is on assistant turns, so there is nothing to learn"));
  return c;
}

/// Reads a JSONL file of conversations (blank lines allowed). Malformed lines throw, or are
/// skipped and counted with `options.skip_bad`; a file with no conversation at all is an
/// EmptyDataError.
inline ConversationFile read_conversations(const std::string& file,
                                           const ReadOptions& options = {}) {
  const std::string text = io::read_text_file(file, "hub::read_conversations", kMaxDataBytes);
  ConversationFile out;
  std::size_t line_no = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string source = remat::detail::cat(file, ":", line_no);
    try {
      out.conversations.push_back(parse_conversation(line, source));
    } catch (const DataError& e) {
      if (!options.skip_bad) throw;
      if (out.skipped++ == 0) out.first_skipped = e.what();
    }
  }
  if (out.conversations.empty())
    throw EmptyDataError(remat::detail::cat("hub::read_conversations: ", file,
                                            " has no conversation (", line_no, " lines, ",
                                            out.skipped, " skipped as malformed)"));
  return out;
}

/// Reads a plain text file as documents separated by empty lines (each trained on in full).
/// Invalid UTF-8 is a MalformedDataError naming the line; a file with no text an
/// EmptyDataError.
inline std::vector<std::string> read_text_documents(const std::string& file) {
  const std::string text = io::read_text_file(file, "hub::read_text_documents", kMaxDataBytes);
  if (const auto bad = utf8::first_invalid(text)) {
    const std::size_t line =
        1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + *bad, '\n'));
    throw MalformedDataError(remat::detail::cat(file, ":", line, ": invalid UTF-8 at byte ", *bad));
  }
  std::vector<std::string> docs;
  std::string current;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      if (!current.empty()) docs.push_back(std::move(current));
      current.clear();
    } else {
      if (!current.empty()) current += '\n';
      current += line;
    }
    begin = end + 1;
  }
  if (!current.empty()) docs.push_back(std::move(current));
  if (docs.empty())
    throw EmptyDataError(remat::detail::cat("hub::read_text_documents: ", file, " has no text"));
  return docs;
}

}  // namespace remat::hub
