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
///    `<|eot_id|>`, bos first), and Meta's Llama 3.1/3.2/3.3 templates, which open with a system
///    block holding a date preamble ("Cutting Knowledge Date: December 2023", "Today Date: ...")
///    and the first system message's text: the date is the template's default ("26 Jul 2024"),
///    or today's, as transformers gives it, when the template calls strftime_now (Llama 3.2; a
///    caller may set ChatTemplate::date_string). Tools are not rendered (conversations have
///    none). Other templates with the preamble are refused.
///  - `[INST]`: Llama 2 chat (`<<SYS>>` folded into the first user turn) and Mistral Instruct
///    v0.1, recognised by their exact text (their variants differ in details that change the
///    bytes).
///
/// An assistant span covers the turn's content and the end marker that follows it
/// (`<|im_end|>`, `<|eot_id|>`, eos), so the model learns to stop; for Qwen3 it includes the
/// reasoning block the template writes. Role headers and prompts are never in a span.

#include <cctype>
#include <cstddef>
#include <cstdio>
#include <ctime>
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
  /// Llama 3.1+: the date of the system block's preamble ("04 Dec 2026"); empty: no preamble.
  std::string date_string;
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

/// Today's date as strftime's "%d %b %Y" writes it in the C locale ("04 Dec 2026"), in local
/// time: what transformers' strftime_now gives a template (datetime.now().strftime).
inline std::string today_date() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  static const char* const kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  char out[16];
  std::snprintf(out, sizeof out, "%02d %s %04d", local.tm_mday, kMonths[local.tm_mon],
                local.tm_year + 1900);
  return out;
}

/// The date of a Meta Llama 3.1+ template's preamble: today's when it calls strftime_now (Llama
/// 3.2), else its `set date_string = "..."` default (3.1, 3.3); empty when the template is not
/// Meta's layout (each piece the renderer writes must be there as Meta's templates write it).
inline std::string meta_template_date(std::string_view t) {
  for (std::string_view piece :
       {"{{- bos_token }}", "{%- set system_message = messages[0]['content']|trim %}",
        "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}",
        "{{- \"Cutting Knowledge Date: December 2023\\n\" }}",
        "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}", "{{- system_message }}",
        "{%- set messages = messages[1:] %}", "{%- set system_message = \"\" %}",
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
        "message['content'] | trim + '<|eot_id|>' }}"})
    if (t.find(piece) == std::string_view::npos) return {};
  // strftime_now in another format than Meta's would write another date: not Meta's layout
  const std::size_t strftime = t.find("strftime_now(");
  if (strftime != std::string_view::npos)
    return t.find("strftime_now(\"%d %b %Y\")") == strftime ? today_date() : std::string();
  constexpr std::string_view set = "{%- set date_string = \"";
  const std::size_t at = t.find(set);
  if (at == std::string_view::npos) return {};
  const std::size_t end = t.find('"', at + set.size());
  return end == std::string_view::npos
             ? std::string()
             : std::string(t.substr(at + set.size(), end - at - set.size()));
}

/// What a ChatML template holds that the ChatML renderer would not reproduce, or empty: the bos
/// or eos token written, a filter other than tojson (Qwen2.5 applies it to tools only), or a
/// string method such as .strip(). Such variants (a bos first, trimmed contents) exist on the
/// hub; recognised by their markers alone they would be rendered without those bytes, silently.
inline std::string chatml_unsupported(std::string_view t) {
  for (std::string_view token : {"bos_token", "eos_token"})
    if (t.find(token) != std::string_view::npos) return remat::detail::cat("it writes ", token);
  for (std::string_view method : {".strip(", ".lstrip(", ".rstrip(", ".split(", ".replace(",
                                  ".upper(", ".lower(", ".title(", ".capitalize("})
    if (t.find(method) != std::string_view::npos)
      return remat::detail::cat("it calls ", method.substr(1), ")");
  // filters: a '|' outside the markers <|im_start|> and <|im_end|>, then a name
  for (std::size_t at = t.find('|'); at != std::string_view::npos; at = t.find('|', at + 1)) {
    if (at > 0 && t[at - 1] == '<') {  // a marker's opening: skip to its closing "|>"
      at = t.find("|>", at + 1);
      if (at == std::string_view::npos) break;
      continue;
    }
    std::size_t name = at + 1;
    while (name < t.size() && (t[name] == ' ' || t[name] == '\t')) ++name;
    std::size_t end = name;
    while (end < t.size() && (std::isalnum(static_cast<unsigned char>(t[end])) || t[end] == '_'))
      ++end;
    const std::string_view filter = t.substr(name, end - name);
    if (filter != "tojson") return remat::detail::cat("it applies the filter '", filter, "'");
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
  std::size_t first = 0;
  w.prompt(t.bos);
  // Meta's 3.1+: the system block always, with the first system message's text
  if (!t.date_string.empty()) {
    const bool system = !c.messages.empty() && c.messages[0].role == Role::system;
    first = system ? 1 : 0;
    w.prompt(remat::detail::cat(
        "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: ",
        t.date_string, "\n\n", system ? python_strip(c.messages[0].content) : "", "<|eot_id|>"));
  }
  for (std::size_t i = first; i < c.messages.size(); ++i) {
    const Message& m = c.messages[i];
    const std::string_view content = t.trim ? python_strip(m.content) : m.content;
    w.prompt(remat::detail::cat("<|start_header_id|>", role_name(m.role), "<|end_header_id|>\n\n"));
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
    if (t.family == ChatFamily::qwen3 && has("bos_token"))
      refuse("a Qwen3-like template that writes bos_token is not supported");
    if (t.family == ChatFamily::chatml) {
      if (const std::string why = detail::chatml_unsupported(jinja); !why.empty())
        refuse("a ChatML template the ChatML renderer does not reproduce (" + why + ")");
      t.default_system = detail::chatml_default_system(jinja);
    }
    return t;
  }
  if (has("<|start_header_id|>") && has("<|end_header_id|>") && has("<|eot_id|>")) {
    if (has("Cutting Knowledge Date")) {
      t.date_string = detail::meta_template_date(jinja);
      if (t.date_string.empty())
        refuse(
            "a Llama 3.1+ template other than Meta's (its date preamble, system block and "
            "trimmed turns, as Llama 3.1/3.2/3.3 write them)");
    } else if (has("tools")) {
      refuse("a Llama 3 template with tools but no date preamble is not one of Meta's");
    }
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
