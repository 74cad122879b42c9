#pragma once
/// @file
/// Rendering a conversation with the model's chat template, byte for byte as the Jinja template
/// of its `tokenizer_config.json` renders it (tests/hub/chat compares with python3-jinja2), and
/// marking which bytes are assistant content, the part the loss is on. remat does not run Jinja:
/// it recognises the template and renders its family's layout.
///
/// Note: recognition is by the template's exact text (a fingerprint of it, detail::
/// kKnownTemplates), once the parts remat reads from it are cut out: ChatML's default system
/// message and Llama 3.1's default date, and the newlines Jinja's lexer drops or rewrites. A
/// family's markers alone are not enough: templates that look alike render other bytes (Qwen1.5's
/// drops the last `<|im_end|>`, TRL's Qwen3 training template writes every think block, a `|trim`
/// or a default system turn in other quotes changes the bytes), and which edits change no byte is
/// Jinja's to know. So any other text, a space included, is a ChatTemplateError that quotes the
/// template's start, gives its fingerprint and lists the known templates; one that renders as a
/// known layout is added by its fingerprint, with its text in tests/hub/chat/templates.json.
/// The layouts:
///  - ChatML (`<|im_start|>role\n...<|im_end|>\n`): Qwen2/2.5, Qwen3-Instruct-2507, SmolLM2 and
///    transformers' former default (with the default system message the template adds when the
///    first message is not a system one), and Qwen3 (its `<think>` handling: an assistant turn
///    after the last user turn is rendered with its reasoning block, an empty one for the last).
///  - Llama 3 headers (`<|start_header_id|>role<|end_header_id|>\n\n` + trimmed content +
///    `<|eot_id|>`, bos first), and Meta's Llama 3.1/3.2 templates, which open with a system
///    block holding a date preamble ("Cutting Knowledge Date: December 2023", "Today Date: ...")
///    and the first system message's text: the date is the template's default ("26 Jul 2024"),
///    or today's, as transformers gives it, when the template calls strftime_now (Llama 3.2; a
///    caller may set ChatTemplate::date_string). Tools are not rendered (conversations have
///    none).
///  - `[INST]`: Llama 2 chat (`<<SYS>>` folded into the first user turn) and Mistral Instruct
///    v0.1.
///
/// An assistant span covers the turn's content and the end marker that follows it
/// (`<|im_end|>`, `<|eot_id|>`, eos), so the model learns to stop; for Qwen3 it includes the
/// reasoning block the template writes. Role headers and prompts are never in a span. TRL's
/// training templates mark the assistant turns with `{% generation %}` themselves, a newline
/// before or after included for some: the spans are then the bytes they mark.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <optional>
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
  /// Llama 3.1+: the date of the system block's preamble ("04 Dec 2026"); empty: no preamble.
  std::string date_string;
  /// Tokens the template writes itself.
  std::string bos, eos;
  /// The recognised template's name ("Qwen2.5 Instruct").
  std::string name;
  /// ChatML templates that mark assistant turns with `{% generation %}` (TRL's training
  /// variants, for transformers' assistant mask): whether the mark also covers the newline
  /// before the content, and the one after `<|im_end|>`. The spans then cover them too.
  bool span_newline_before = false, span_newline_after = false;
  /// Llama 3: the template writes the assistant's header after the conversation whether or not
  /// a generation prompt is asked for (Meta-Llama-3-Instruct's first release).
  bool ends_with_assistant_header = false;
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

/// The start of `text`, for a message.
inline std::string excerpt(std::string_view text) {
  std::string s(text.substr(0, 120));
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';  // one line
  return utf8::lossy(s) + (text.size() > 120 ? "..." : "");
}

/// The text Jinja's lexer reads, as transformers sets it up: every newline ("\r\n", "\r") read
/// as "\n", and one trailing newline dropped (keep_trailing_newline is off). Templates that
/// differ only there render the same.
inline std::string jinja_source(std::string_view t) {
  std::string s;
  s.reserve(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    s += t[i] == '\r' ? '\n' : t[i];
    if (t[i] == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
  }
  if (s.ends_with('\n')) s.pop_back();
  return s;
}

/// The text of a single-quoted Jinja string literal's body, escapes undone; nullopt when it
/// holds a single quote (then it is not one literal) or an escape other than \n, \t, \\ and \"
/// (Jinja undoes escapes as Python's unicode-escape does, \x41 and \u00e9 included, and keeps
/// unknown ones: not worth copying).
inline std::optional<std::string> jinja_literal(std::string_view body) {
  std::string out;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\'') return std::nullopt;
    if (body[i] != '\\') {
      out += body[i];
      continue;
    }
    const char e = ++i < body.size() ? body[i] : '\0';
    if (e != 'n' && e != 't' && e != '\\' && e != '"') return std::nullopt;
    out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
  }
  return out;
}

/// Replaces every `from` in `s` by `to`.
inline void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

/// A template's text with the parts remat reads from it cut out (each replaced by kCut), and
/// those parts: what the known templates are recognised by.
struct TemplateCut {
  std::string rest;
  /// ChatML: the literal of `'<|im_start|>system\n...<|im_end|>\n'`, the default system message
  /// (also where the template writes it alone, `'...' }}`, as Qwen2.5's tools branch does).
  std::string default_system;
  /// Llama 3.1+: the literal of `set date_string = "..."`, the default date.
  std::string date;
};
inline constexpr char kCut = '\x01';

/// Cuts the default system message and date out of `jinja` (see TemplateCut). Only the first
/// literal found of each is cut, everywhere it is written the same way: a template that writes
/// another one elsewhere keeps it, and so matches no known template.
inline TemplateCut cut_template(std::string_view jinja) {
  TemplateCut c{jinja_source(jinja), {}, {}};
  // a template holding the mark itself: nothing cut, so that it matches no known template
  if (c.rest.find(kCut) != std::string::npos) return c;
  const std::string cut(1, kCut);
  constexpr std::string_view open = "'<|im_start|>system\\n", close = "<|im_end|>\\n'";
  for (std::size_t at = c.rest.find(open); at != std::string::npos;
       at = c.rest.find(open, at + 1)) {
    const std::size_t begin = at + open.size(), end = c.rest.find(close, begin);
    if (end == std::string::npos) break;
    const std::string body = c.rest.substr(begin, end - begin);
    const std::optional<std::string> text = jinja_literal(body);
    // empty: the layout would write no system turn, where the template writes an empty one
    if (!text || text->empty()) continue;
    c.default_system = *text;
    replace_all(c.rest, remat::detail::cat(open, body, close),
                remat::detail::cat(open, cut, close));
    replace_all(c.rest, remat::detail::cat("'", body, "' }}"),
                remat::detail::cat("'", cut, "' }}"));
    break;
  }
  constexpr std::string_view set = "set date_string = \"";
  if (const std::size_t at = c.rest.find(set); at != std::string::npos) {
    const std::size_t begin = at + set.size(), end = c.rest.find('"', begin);
    const std::string body =
        end == std::string::npos ? std::string() : c.rest.substr(begin, end - begin);
    if (!body.empty() && body.find('\\') == std::string::npos) {
      c.date = body;
      replace_all(c.rest, remat::detail::cat(set, body, "\""), remat::detail::cat(set, cut, "\""));
    }
  }
  return c;
}

/// 64-bit FNV-1a of `s`: the fingerprint of a template's cut text.
constexpr std::uint64_t fingerprint(std::string_view s) {
  std::uint64_t h = 14695981039346656037ull;
  for (const char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

/// A template remat renders byte for byte: its cut text's fingerprint, and its layout.
struct KnownTemplate {
  std::string_view name;
  ChatFamily family;
  std::uint64_t fingerprint;
  /// TRL's training variants: their {% generation %} mark also covers the newline before the
  /// content, or the one after the end marker (see ChatTemplate).
  bool span_newline_before = false, span_newline_after = false;
  bool ends_with_assistant_header = false;  // see ChatTemplate
};

/// The known templates. Each is in tests/hub/chat/templates.json with where it comes from, and
/// the test renders conversations with it through Jinja2 and remat; a template whose text differs
/// anywhere else than in the cut literals, a space or a comment included, is refused: remat
/// cannot tell which differences change no byte. To add one that renders as a known family's
/// layout: the refusal's message gives its fingerprint; add it here and to templates.json.
inline constexpr KnownTemplate kKnownTemplates[] = {
    {"Qwen3 (Qwen/Qwen3-* tokenizer_config.json)", ChatFamily::qwen3, 0x2bfdb7aa9754484e},
    {"Qwen3 (TRL's qwen3.jinja)", ChatFamily::qwen3, 0x959a4551391a6549},
    {"Qwen2.5 Instruct, any default system message", ChatFamily::chatml, 0xf00d7d97742fbb3d},
    {"Qwen2.5 (TRL's qwen2_5_training.jinja)", ChatFamily::chatml, 0xe15b9ec1c2822149, true, true},
    {"Qwen2.5-VL (TRL's qwen2_5_vl_training.jinja), text only", ChatFamily::chatml,
     0x160a169d537d8278, false, true},
    {"Qwen3-Instruct-2507 (TRL's qwen3_instruct_2507.jinja)", ChatFamily::chatml,
     0x3751fe8ea48448ab},
    {"Qwen3-Instruct-2507 (TRL's qwen3_instruct_2507_training.jinja)", ChatFamily::chatml,
     0xe8faca59b0472e66, false, true},
    {"ChatML with a default system message (Qwen2 Instruct, SmolLM2)", ChatFamily::chatml,
     0xff9679972e699600},
    {"ChatML (transformers' former default)", ChatFamily::chatml, 0xa41d6bae9b9141bc},
    {"Llama 3 Instruct", ChatFamily::llama3, 0x0e60067a5537498e},
    {"Llama 3 Instruct, first release (the assistant header always written)", ChatFamily::llama3,
     0x74891e390e614ae2, false, false, true},
    {"Llama 3 (TRL's llama3_training.jinja)", ChatFamily::llama3, 0xf2a9dd138dc335ee},
    {"Llama 3.1 Instruct, any default date", ChatFamily::llama3, 0xe03f1e39acb1d7ce},
    {"Llama 3.2 Instruct", ChatFamily::llama3, 0x15e9d5d5e4cd5a7a},
    {"Llama 3.2 Instruct's with a fixed default date (tests/hub/chat)", ChatFamily::llama3,
     0xdc848e3378e0652b},
    {"Llama 2 chat (Llama-2-7b-chat-hf)", ChatFamily::llama2, 0xf344eecf1bd3a427},
    {"Mistral Instruct v0.1", ChatFamily::mistral, 0x8c734b90b4f8d84d},
};

/// `v` in hexadecimal, 16 digits.
inline std::string hex(std::uint64_t v) {
  char out[24];
  std::snprintf(out, sizeof out, "0x%016llx", static_cast<unsigned long long>(v));
  return out;
}

/// The names of the known templates, for messages.
inline std::string known_template_names() {
  std::string out;
  for (const KnownTemplate& k : kKnownTemplates)
    out += (out.empty() ? "" : "; ") + std::string(k.name);
  return out;
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
    if (m[i].role != Role::assistant) {
      w.prompt(remat::detail::cat("<|im_start|>", role_name(m[i].role), "\n", m[i].content,
                                  "<|im_end|>\n"));
      continue;
    }
    // the newlines around the turn: in the span where the template's {% generation %} has them
    const auto newline = [&](bool in_span) { in_span ? w.assistant("\n") : w.prompt("\n"); };
    w.prompt("<|im_start|>assistant");
    newline(t.span_newline_before);
    w.assistant(m[i].content + "<|im_end|>");
    newline(t.span_newline_after);
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
    const std::string_view content = python_strip(m.content);  // every known Llama 3 trims
    w.prompt(remat::detail::cat("<|start_header_id|>", role_name(m.role), "<|end_header_id|>\n\n"));
    if (m.role == Role::assistant)
      w.assistant(remat::detail::cat(content, "<|eot_id|>"));
    else
      w.prompt(remat::detail::cat(content, "<|eot_id|>"));
  }
  if (t.ends_with_assistant_header) w.prompt("<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/// The templates' own check: after an optional leading system message (Llama 2 only), user and
/// assistant alternate, user first.
inline void check_alternation(const ChatTemplate& t, const Conversation& c, std::size_t first) {
  for (std::size_t i = first; i < c.messages.size(); ++i) {
    const Role expected = (i - first) % 2 == 0 ? Role::user : Role::assistant;
    if (c.messages[i].role == expected) continue;
    if (c.messages[i].role == Role::system)
      throw UnknownRoleError(remat::detail::cat(
          c.source, ": messages[", i, "]: the ", family_name(t.family), " template accepts ",
          t.family == ChatFamily::llama2 ? "a system message only first" : "no system message"));
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

/// Recognises `jinja` (the chat_template of tokenizer_config.json) as one of the templates remat
/// renders byte for byte (detail::kKnownTemplates: Qwen2.5, Qwen3, ChatML with a default system
/// message, Llama 3/3.1/3.2, Llama 2, Mistral, and TRL's training variants): by its exact text,
/// once the parts remat reads from it are cut out (ChatML's default system message, Llama
/// 3.1's default date). `bos` and `eos` are the tokens the template writes as bos_token and
/// eos_token. Any other template is a ChatTemplateError quoting its start and listing the known
/// ones: a template recognised by its markers alone could render other bytes than remat's layout,
/// silently (Qwen1.5's drops the last <|im_end|>, TRL's Qwen3 training one writes every think
/// block, ...).
inline ChatTemplate recognise_chat_template(std::string_view jinja, std::string bos,
                                            std::string eos) {
  const detail::TemplateCut cut = detail::cut_template(jinja);
  const std::uint64_t print = detail::fingerprint(cut.rest);
  for (const detail::KnownTemplate& k : detail::kKnownTemplates) {
    if (k.fingerprint != print) continue;
    ChatTemplate t;
    t.family = k.family;
    t.name = k.name;
    t.bos = std::move(bos);
    t.eos = std::move(eos);
    t.default_system = cut.default_system;
    // Llama 3.2 writes today's date (transformers defines strftime_now); 3.1 its default
    if (k.family == ChatFamily::llama3 && !cut.date.empty())
      t.date_string =
          jinja.find("strftime_now(") != std::string_view::npos ? detail::today_date() : cut.date;
    t.span_newline_before = k.span_newline_before;
    t.span_newline_after = k.span_newline_after;
    t.ends_with_assistant_header = k.ends_with_assistant_header;
    return t;
  }
  const auto has = [&](std::string_view s) { return jinja.find(s) != std::string_view::npos; };
  const char* const what =
      has("<|im_start|>")
          ? "a ChatML template (<|im_start|>) that is not one of those remat renders"
      : has("<|start_header_id|>")
          ? "a Llama 3 template (<|start_header_id|>) that is not one of those remat renders"
      : has("[INST]") ? "an [INST] template that is neither Llama 2 chat's nor Mistral Instruct "
                        "v0.1's (their variants differ byte for byte)"
                      : "unknown chat template family (known: ChatML, Llama 3, [INST])";
  throw ChatTemplateError(remat::detail::cat(
      "hub::recognise_chat_template: ", what, ": template \"", detail::excerpt(jinja),
      "\" (fingerprint ", detail::hex(print),
      "). remat renders only templates it knows by their text, the default system message and "
      "date aside, since another text may render other bytes: ",
      detail::known_template_names()));
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

/// Whether `t` reads `enable_thinking` (GenerationPromptOptions): Qwen3's templates only.
inline bool reads_enable_thinking(const ChatTemplate& t) { return t.family == ChatFamily::qwen3; }

/// How render_generation_prompt renders.
struct GenerationPromptOptions {
  /// Qwen3's `enable_thinking`: false writes an empty reasoning block after the assistant's
  /// header, so that the model answers without reasoning. Only Qwen3's templates read it; false
  /// with another is an ArgumentError (the template would render the same bytes).
  bool enable_thinking = true;
};

/// Renders `c`, which ends with a user turn, as transformers' apply_chat_template does with
/// add_generation_prompt: the text a model's answer is generated after. ChatML and Llama 3 add
/// the assistant's header (Qwen3 with an empty reasoning block when enable_thinking is false);
/// the [INST] templates have no generation prompt, the text ends with " [/INST]".
inline std::string render_generation_prompt(const ChatTemplate& t, const Conversation& c,
                                            const GenerationPromptOptions& o = {}) {
  if (c.messages.empty() || c.messages.back().role != Role::user)
    throw ArgumentError(
        remat::detail::cat("hub::render_generation_prompt: ", c.source,
                           ": a generation prompt follows a user turn; the conversation ends with ",
                           c.messages.empty() ? "no message" : role_name(c.messages.back().role)));
  if (!o.enable_thinking && !reads_enable_thinking(t))
    throw ArgumentError(
        remat::detail::cat("hub::render_generation_prompt: enable_thinking false with the ", t.name,
                           " template, which does not read it (only Qwen3's do)"));
  std::string text = render_chat(t, c).text;
  switch (t.family) {
    case ChatFamily::chatml:
      return text + "<|im_start|>assistant\n";
    case ChatFamily::qwen3:
      return text + "<|im_start|>assistant\n" +
             (o.enable_thinking ? "" : "<think>\n\n</think>\n\n");
    case ChatFamily::llama3:
      // Meta-Llama-3-Instruct's first release has written the header already
      return t.ends_with_assistant_header
                 ? text
                 : text + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatFamily::llama2:
    case ChatFamily::mistral:
      return text;
  }
  return text;
}

}  // namespace remat::hub
