#pragma once
/// @file
/// Rendering a conversation with the model's chat template, byte for byte as the Jinja template
/// of its `tokenizer_config.json` renders it (tests/hub/chat compares with python3-jinja2), and
/// marking which bytes are assistant content, the part the loss is on. remat does not run Jinja:
/// it recognises the template's family from its text and renders that family's layout.
///  - ChatML (`<|im_start|>role\n...<|im_end|>\n`): Qwen2/2.5 (with the default system message
///    the template adds when the first message is not a system one, read from the template
///    itself) and Qwen3 (its `<think>` handling: an assistant turn after the last user turn is
///    rendered with its reasoning block, an empty one for the last turn).
///  - Llama 3 headers (`<|start_header_id|>role<|end_header_id|>\n\n` + trimmed content +
///    `<|eot_id|>`, bos first). A template with the Llama 3.1 date preamble ("Cutting Knowledge
///    Date") is not supported yet: it is refused as unknown.
///  - `[INST]`: Llama 2 chat (`<<SYS>>` folded into the first user turn) and Mistral Instruct
///    v0.1/v0.2, recognised by their exact text (their variants differ in details that change
///    the bytes).
///
/// An assistant span covers the turn's content and the end marker that follows it
/// (`<|im_end|>`, `<|eot_id|>`, eos), so the model learns to stop; for Qwen3 it includes the
/// reasoning block the template writes. Role headers and prompts are never in a span.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/hub/conversation.hpp"
#include "remat/hub/utf8.hpp"

namespace remat::hub {

/// A chat template remat cannot render exactly.
class ChatTemplateError : public Error {
 public:
  using Error::Error;
};

/// The template families remat renders.
enum class ChatFamily { chatml, qwen3, llama3, llama2, mistral };

/// The family's name in messages.
inline const char* family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::chatml:
      return "ChatML (Qwen2/2.5)";
    case ChatFamily::qwen3:
      return "ChatML (Qwen3)";
    case ChatFamily::llama3:
      return "Llama 3";
    case ChatFamily::llama2:
      return "Llama 2 [INST]";
    case ChatFamily::mistral:
      return "Mistral [INST]";
  }
  return "?";
}

/// A recognised template: its family and what the family's layout leaves to the template.
struct ChatTemplate {
  ChatFamily family = ChatFamily::chatml;
  /// ChatML: the system message written when the first message is not a system one (empty:
  /// none).
  std::string default_system;
  /// Llama 3: whether contents go through Jinja's `trim`.
  bool trim = true;
  /// Tokens the template writes itself.
  std::string bos, eos;
};

/// A rendered conversation: its text and the [begin, end) byte ranges of assistant content.
struct RenderedChat {
  std::string text;
  struct Span {
    std::size_t begin = 0, end = 0;
  };
  std::vector<Span> assistant;
};

namespace detail {

/// The two templates recognised by their exact text: Llama-2-7b-chat-hf's and
/// Mistral-7B-Instruct-v0.1's (tokenizer_config.json of those Hugging Face repositories).
inline constexpr std::string_view kLlama2Template =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% "
    "set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
    "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
    "roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == "
    "0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
    "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() "
    "+ ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
    "eos_token }}{% endif %}{% endfor %}";
inline constexpr std::string_view kMistralTemplate =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

/// The start of `text`, for a message.
inline std::string excerpt(std::string_view text) {
  std::string s(text.substr(0, 120));
  for (char& c : s)
    if (c == '\n') c = ' ';
  return utf8::lossy(s) + (text.size() > 120 ? "..." : "");
}

/// The default system message of a ChatML template: the literal between
/// `'<|im_start|>system\n` and `<|im_end|>\n'` (Jinja escapes undone), empty when the template
/// only writes the user's own system message there.
inline std::string chatml_default_system(std::string_view t) {
  constexpr std::string_view open = "'<|im_start|>system\\n", close = "<|im_end|>\\n'";
  for (std::size_t at = t.find(open); at != std::string_view::npos; at = t.find(open, at + 1)) {
    const std::size_t begin = at + open.size(), end = t.find(close, begin);
    if (end == std::string_view::npos) break;
    const std::string_view literal = t.substr(begin, end - begin);
    if (literal.empty() || literal.find('\'') != std::string_view::npos) continue;
    std::string out;
    for (std::size_t i = 0; i < literal.size(); ++i) {
      if (literal[i] == '\\' && i + 1 < literal.size()) {
        const char e = literal[++i];
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        out += literal[i];
      }
    }
    return out;
  }
  return {};
}

/// Whether code point `c` is whitespace for Python's str.strip (Jinja's trim).
inline bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

/// Python's str.strip() on UTF-8 text.
inline std::string_view python_strip(std::string_view s) {
  std::size_t begin = 0;
  while (begin < s.size() && python_space(utf8::decode(s, begin)))
    begin += utf8::char_length(s, begin);
  std::size_t end = s.size();
  while (end > begin) {
    std::size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (!python_space(utf8::decode(s, start))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

/// Python's s.strip('\n') family on one character.
inline std::string_view lstrip_nl(std::string_view s) {
  const std::size_t i = s.find_first_not_of('\n');
  return i == std::string_view::npos ? std::string_view() : s.substr(i);
}
inline std::string_view rstrip_nl(std::string_view s) {
  const std::size_t i = s.find_last_not_of('\n');
  return i == std::string_view::npos ? std::string_view() : s.substr(0, i + 1);
}

/// Appends text to a rendering, as prompt or as assistant content.
struct ChatWriter {
  RenderedChat out;
  void prompt(std::string_view s) { out.text += s; }
  void assistant(std::string_view s) {
    const std::size_t begin = out.text.size();
    out.text += s;
    if (!out.assistant.empty() && out.assistant.back().end == begin)
      out.assistant.back().end = out.text.size();
    else
      out.assistant.push_back({begin, out.text.size()});
  }
};

inline void render_chatml(const ChatTemplate& t, const Conversation& c, ChatWriter& w) {
  const auto& m = c.messages;
  if (!m.empty() && m[0].role == Role::system)
    w.prompt("<|im_start|>system\n" + m[0].content + "<|im_end|>\n");
  else if (!t.default_system.empty())
    w.prompt("<|im_start|>system\n" + t.default_system + "<|im_end|>\n");
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == Role::system && i == 0) continue;
    w.prompt(remat::detail::cat("<|im_start|>", role_name(m[i].role), "\n"));
    if (m[i].role == Role::assistant) {
      w.assistant(m[i].content + "<|im_end|>");
      w.prompt("\n");
    } else {
      w.prompt(m[i].content + "<|im_end|>\n");
    }
  }
}

/// Qwen3: reasoning split off at `</think>`, and a `<think>` block on the assistant turns after
/// the last user message (always on the last turn, elsewhere when it has reasoning).
inline void render_qwen3(const Conversation& c, ChatWriter& w) {
  const auto& m = c.messages;
  if (!m.empty() && m[0].role == Role::system)
    w.prompt("<|im_start|>system\n" + m[0].content + "<|im_end|>\n");
  std::size_t last_query = m.size() - 1;
  for (std::size_t k = m.size(); k-- > 0;) {
    const std::string& s = m[k].content;
    const bool tool_response = s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
    if (m[k].role == Role::user && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == Role::system && i == 0) continue;
    if (m[i].role != Role::assistant) {
      w.prompt(remat::detail::cat("<|im_start|>", role_name(m[i].role), "\n", m[i].content,
                                  "<|im_end|>\n"));
      continue;
    }
    std::string_view content = m[i].content, reasoning;
    if (const std::size_t close = content.find("</think>"); close != std::string_view::npos) {
      content = lstrip_nl(content.substr(content.rfind("</think>") + 8));
      std::string_view before = rstrip_nl(std::string_view(m[i].content).substr(0, close));
      if (const std::size_t open = before.rfind("<think>"); open != std::string_view::npos)
        before = before.substr(open + 7);
      reasoning = lstrip_nl(before);
    }
    w.prompt("<|im_start|>assistant\n");
    const bool last = i + 1 == m.size();
    if (i > last_query && (last || !reasoning.empty()))
      w.assistant(remat::detail::cat("<think>\n", rstrip_nl(lstrip_nl(reasoning)), "\n</think>\n\n",
                                     lstrip_nl(content), "<|im_end|>"));
    else
      w.assistant(remat::detail::cat(content, "<|im_end|>"));
    w.prompt("\n");
  }
}

inline void render_llama3(const ChatTemplate& t, const Conversation& c, ChatWriter& w) {
  for (std::size_t i = 0; i < c.messages.size(); ++i) {
    const Message& m = c.messages[i];
    const std::string_view content = t.trim ? python_strip(m.content) : m.content;
    w.prompt(remat::detail::cat(i == 0 ? t.bos : "", "<|start_header_id|>", role_name(m.role),
                                "<|end_header_id|>\n\n"));
    if (m.role == Role::assistant)
      w.assistant(remat::detail::cat(content, "<|eot_id|>"));
    else
      w.prompt(remat::detail::cat(content, "<|eot_id|>"));
  }
}

/// The templates' own check: after an optional leading system message (Llama 2 only), user and
/// assistant alternate, user first.
inline void check_alternation(const ChatTemplate& t, const Conversation& c, std::size_t first) {
  for (std::size_t i = first; i < c.messages.size(); ++i) {
    const Role expected = (i - first) % 2 == 0 ? Role::user : Role::assistant;
    if (c.messages[i].role == expected) continue;
    if (c.messages[i].role == Role::system)
      throw UnknownRoleError(
          remat::detail::cat(c.source, ": messages[", i, "]: the ", family_name(t.family),
                             " template accepts a system message only ",
                             t.family == ChatFamily::llama2 ? "first" : "nowhere"));
    throw UnknownRoleError(
        remat::detail::cat(c.source, ": messages[", i, "] is ", role_name(c.messages[i].role),
                           " where the ", family_name(t.family),
                           " template needs user and assistant to alternate, user first (it raises "
                           "'Conversation roles must alternate')"));
  }
}

inline void render_llama2(const ChatTemplate& t, const Conversation& c, ChatWriter& w) {
  const bool has_system = !c.messages.empty() && c.messages[0].role == Role::system;
  const std::size_t first = has_system ? 1 : 0;
  check_alternation(t, c, first);
  for (std::size_t i = first; i < c.messages.size(); ++i) {
    std::string content = c.messages[i].content;
    if (i == first && has_system)
      content = "<<SYS>>\n" + c.messages[0].content + "\n<</SYS>>\n\n" + content;
    if (c.messages[i].role == Role::user) {
      w.prompt(remat::detail::cat(t.bos, "[INST] ", python_strip(content), " [/INST]"));
    } else {
      w.prompt(" ");
      w.assistant(remat::detail::cat(python_strip(content), " ", t.eos));
    }
  }
}

inline void render_mistral(const ChatTemplate& t, const Conversation& c, ChatWriter& w) {
  check_alternation(t, c, 0);
  w.prompt(t.bos);
  for (const Message& m : c.messages) {
    if (m.role == Role::user)
      w.prompt("[INST] " + m.content + " [/INST]");
    else
      w.assistant(m.content + t.eos);
  }
}

}  // namespace detail

/// Recognises the family of `jinja` (the chat_template of tokenizer_config.json); `bos` and
/// `eos` are the tokens the template writes as bos_token/eos_token. An unknown template is a
/// ChatTemplateError quoting its start.
inline ChatTemplate recognise_chat_template(std::string_view jinja, std::string bos,
                                            std::string eos) {
  ChatTemplate t;
  t.bos = std::move(bos);
  t.eos = std::move(eos);
  const auto has = [&](std::string_view s) { return jinja.find(s) != std::string_view::npos; };
  const auto refuse = [&](std::string_view why) {
    throw ChatTemplateError(remat::detail::cat("hub::recognise_chat_template: ", why,
                                               ": template \"", detail::excerpt(jinja), "\""));
  };
  if (has("<|im_start|>") && has("<|im_end|>")) {
    t.family = has("reasoning_content") && has("<think>") ? ChatFamily::qwen3 : ChatFamily::chatml;
    if (t.family == ChatFamily::chatml) t.default_system = detail::chatml_default_system(jinja);
    return t;
  }
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>")) {
    if (has("Cutting Knowledge Date") || has("tools"))
      refuse("a Llama 3.1+ template (date preamble, tools) is not supported yet");
    t.family = ChatFamily::llama3;
    t.trim = has("| trim");
    if (!has("bos_token")) t.bos.clear();
    return t;
  }
  if (jinja == detail::kLlama2Template) {
    t.family = ChatFamily::llama2;
    return t;
  }
  if (jinja == detail::kMistralTemplate) {
    t.family = ChatFamily::mistral;
    return t;
  }
  refuse(has("[INST]") ? "an [INST] template that is neither Llama 2 chat's nor Mistral "
                         "Instruct v0.1's (their variants differ byte for byte)"
                       : "unknown chat template family (known: ChatML, Llama 3, [INST])");
  return t;  // not reached
}

/// Renders `c` with template `t` (no generation prompt: the conversation is a training
/// example), with the assistant spans. A role the family refuses is an UnknownRoleError naming
/// the conversation.
inline RenderedChat render_chat(const ChatTemplate& t, const Conversation& c) {
  if (c.messages.empty())
    throw NoAssistantError(remat::detail::cat(c.source, ": a conversation with no message"));
  detail::ChatWriter w;
  switch (t.family) {
    case ChatFamily::chatml:
      detail::render_chatml(t, c, w);
      break;
    case ChatFamily::qwen3:
      detail::render_qwen3(c, w);
      break;
    case ChatFamily::llama3:
      detail::render_llama3(t, c, w);
      break;
    case ChatFamily::llama2:
      detail::render_llama2(t, c, w);
      break;
    case ChatFamily::mistral:
      detail::render_mistral(t, c, w);
      break;
  }
  return std::move(w.out);
}

}  // namespace remat::hub
