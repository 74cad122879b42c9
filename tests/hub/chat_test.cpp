// Chat data (remat/hub): JSONL conversations and their errors, chat templates rendered byte for
// byte as Jinja2 renders the real templates (tests/hub/chat/cases.json, made by
// make_chat_cases.py with python3-jinja2), the assistant loss mask on tokens, token limits with
// their report, and the padded/packed batch layout.

#include <catch2/catch.hpp>

#include <remat/hub/byte_level.hpp>
#include <remat/hub/chat_template.hpp>
#include <remat/hub/chat_tokens.hpp>
#include <remat/hub/conversation.hpp>
#include <remat/hub/packing.hpp>
#include <remat/hub/token_limits.hpp>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace chat_test {

using nlohmann::json;
using namespace remat::hub;

std::string scratch(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("remat_chat_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return json::parse(in);
}

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no error of the expected type");
  return {};
}

Conversation from_json(const json& messages) {
  Conversation c;
  c.source = "case";
  for (const auto& m : messages) {
    const std::string role = m["role"];
    c.messages.push_back({role == "system"      ? Role::system
                          : role == "assistant" ? Role::assistant
                                                : Role::user,
                          m["content"]});
  }
  return c;
}

/// transformers' former default ChatML template (tests/hub/chat/templates.json "chatml"): no
/// default system message, every message in place.
const std::string kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' "
    "}}{% endif %}";

/// A templates.json entry's text: its own, or its base's with its edits made (each replacing
/// every `from`; "$END" appends), as make_chat_cases.py builds it.
std::string template_text(const json& t, const json& all) {
  if (!t.contains("variant_of")) return t["template"];
  std::string text;
  for (const auto& base : all)
    if (base["name"] == t["variant_of"]) text = template_text(base, all);
  REQUIRE(!text.empty());
  for (const auto& edit : t["edits"]) {
    const std::string from = edit[0], to = edit[1];
    if (from == "$END") {
      text += to;
      continue;
    }
    REQUIRE(text.find(from) != std::string::npos);
    for (std::size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  }
  return text;
}

ChatFamily family_of(const std::string& name) {
  static const std::map<std::string, ChatFamily> names = {{"chatml", ChatFamily::chatml},
                                                          {"qwen3", ChatFamily::qwen3},
                                                          {"llama3", ChatFamily::llama3},
                                                          {"llama2", ChatFamily::llama2},
                                                          {"mistral", ChatFamily::mistral}};
  return names.at(name);
}

/// The tokenizer.json of chatml_tokenizer(), with `post_processor`.
json chatml_tokenizer_json(const json& post_processor = nullptr) {
  const auto& alphabet = ByteAlphabet::get();
  const auto bl = [&](std::string_view s) {
    std::string out;
    for (const char c : s) out += alphabet.encode(static_cast<unsigned char>(c));
    return out;
  };
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bl(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"\n", "\n"}, {"t", "\n"}, {" ", "a"}, {"a", "b"}, {"ab", "c"}, {"s", "t"}, {"\n", "x"}};
  json merge_list = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[bl(a + b)] = id++;
    merge_list.push_back(bl(a) + " " + bl(b));
  }
  json added = json::array();
  for (const char* t : {"<|im_start|>", "<|im_end|>"})
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  return json{{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer", byte_level},
              {"post_processor", post_processor},
              {"decoder", byte_level},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

/// A byte-level tokenizer with ChatML's markers as special tokens and merges that make tokens
/// straddle span boundaries ("\n\n", "t\n", " a").
Tokenizer chatml_tokenizer() {
  return Tokenizer::from_json(chatml_tokenizer_json(), "chatml test tokenizer");
}

/// A random ASCII conversation: optional system, 1 to `exchanges` exchanges.
Conversation random_chat(std::mt19937& rng, int exchanges, int words = 6) {
  static const char* pieces[] = {"abc", "st", " a", "\n", "\n\n", "t", "x", "hello", " ", "ab"};
  const auto text = [&] {
    std::string s;
    for (int i = std::uniform_int_distribution<int>(0, words)(rng); i > 0; --i)
      s += pieces[std::uniform_int_distribution<std::size_t>(0, std::size(pieces) - 1)(rng)];
    return s;
  };
  Conversation c;
  c.source = "random";
  if (rng() % 2) c.messages.push_back({Role::system, text()});
  for (int k = std::uniform_int_distribution<int>(1, exchanges)(rng); k > 0; --k) {
    c.messages.push_back({Role::user, text()});
    c.messages.push_back({Role::assistant, text()});
  }
  return c;
}

/// strftime's "%d %b %Y" of `when` in local time, in the C locale (Python's default for dates).
std::string strftime_date(std::time_t when) {
  std::tm local{};
  localtime_r(&when, &local);
  char out[32];
  REQUIRE(std::strftime(out, sizeof out, "%d %b %Y", &local) > 0);
  return out;
}

/// Noon, local time, of an ISO date "YYYY-MM-DD".
std::time_t day_of(const std::string& iso) {
  std::tm t{};
  REQUIRE(std::sscanf(iso.c_str(), "%d-%d-%d", &t.tm_year, &t.tm_mon, &t.tm_mday) == 3);
  t.tm_year -= 1900;
  t.tm_mon -= 1;
  t.tm_hour = 12;
  t.tm_isdst = -1;
  return std::mktime(&t);
}

}  // namespace chat_test

using namespace chat_test;

TEST_CASE("Chat templates render byte for byte as Jinja2 renders the real templates",
          "[hub][chat]") {
  const std::string dir = REMAT_HUB_CHAT_DIR;
  std::map<std::string, ChatTemplate> templates;
  const json all = read_json(dir + "/templates.json");
  for (const auto& t : all) {
    if (t.contains("refused")) continue;  // the next test's
    INFO(t["name"].get<std::string>());
    ChatTemplate recognised = recognise_chat_template(template_text(t, all), t["bos"], t["eos"]);
    CHECK(recognised.family == family_of(t["family"]));
    if (t.contains("strftime_now")) {  // today's date, as transformers renders it; then the cases'
      CHECK(recognised.date_string == strftime_date(std::time(nullptr)));
      recognised.date_string = strftime_date(day_of(t["strftime_now"]));
    }
    templates[t["name"]] = recognised;
  }
  CHECK(templates.at("llama3.1-date").date_string == "26 Jul 2024");
  // Meta's layout with another date format, or without dropping the system message it read:
  // refused, not rendered with the wrong date or the system text once instead of twice
  for (const auto& t : all) {
    if (t["name"] != "llama3.2") continue;
    std::string other = t["template"];
    other.replace(other.find("%d %b %Y"), 8, "%d %B %Y");
    CHECK_THROWS_AS(recognise_chat_template(other, t["bos"], t["eos"]), ChatTemplateError);
    std::string kept = t["template"];
    for (std::size_t at; (at = kept.find("{%- set messages = messages[1:] %}")) != kept.npos;)
      kept.erase(at, 34);
    CHECK_THROWS_AS(recognise_chat_template(kept, t["bos"], t["eos"]), ChatTemplateError);
  }
  CHECK(templates.at("llama3").date_string.empty());
  CHECK(templates.at("qwen2.5").default_system ==
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  CHECK(templates.at("qwen3").default_system.empty());
  // the parts remat reads from a template: the escapes it undoes, another default date
  CHECK(templates.at("smollm2-escapes").default_system == "a\nb\tc \"q\" \\n 中文 {{ x }}");
  CHECK(templates.at("llama3.1").date_string == "26 Jul 2024");
  CHECK(templates.at("llama3.1-other-date").date_string == "01 Jan 2025");
  CHECK(templates.at("qwen2.5-crlf").name == templates.at("qwen2.5").name);
  const json cases = read_json(dir + "/cases.json")["cases"];
  REQUIRE(cases.size() >= 500);
  std::size_t compared = 0, refused = 0, marked = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& k = cases[i];
    const ChatTemplate& t = templates.at(k["template"]);
    const Conversation c = from_json(k["messages"]);
    INFO("case " << i << " (" << k["template"].get<std::string>() << ")");
    if (k.contains("error")) {
      CHECK_THROWS_AS(render_chat(t, c), UnknownRoleError);
      ++refused;
      continue;
    }
    const RenderedChat r = render_chat(t, c);
    CHECK(r.text == k["text"].get<std::string>());
    ++compared;
    // up to the last user turn, with the generation prompt
    Conversation asked = c;
    while (asked.messages.back().role != Role::user) asked.messages.pop_back();
    CHECK(render_generation_prompt(t, asked) == k["prompt_text"].get<std::string>());
    if (k.contains("prompt_text_no_thinking"))
      CHECK(render_generation_prompt(t, asked, {.enable_thinking = false}) ==
            k["prompt_text_no_thinking"].get<std::string>());
    else
      CHECK_THROWS_AS(render_generation_prompt(t, asked, {.enable_thinking = false}),
                      remat::ArgumentError);
    asked.messages.push_back({Role::assistant, "x"});
    CHECK_THROWS_AS(render_generation_prompt(t, asked), remat::ArgumentError);
    // One span per assistant turn, each ending with the end marker and holding the content.
    std::vector<const Message*> answers;
    for (const Message& m : c.messages)
      if (m.role == Role::assistant) answers.push_back(&m);
    REQUIRE(r.assistant.size() == answers.size());
    // TRL's training templates: the spans are the bytes their {% generation %} blocks mark
    if (k.contains("generation")) {
      std::vector<std::pair<std::size_t, std::size_t>> spans;
      for (const auto& s : r.assistant) spans.emplace_back(s.begin, s.end);
      CHECK(spans == k["generation"].get<std::vector<std::pair<std::size_t, std::size_t>>>());
      ++marked;
    }
    const std::string end_marker = t.family == ChatFamily::llama3 ? "<|eot_id|>"
                                   : t.family == ChatFamily::chatml || t.family == ChatFamily::qwen3
                                       ? (t.span_newline_after ? "<|im_end|>\n" : "<|im_end|>")
                                       : t.eos;
    for (std::size_t a = 0; a < answers.size(); ++a) {
      const std::string span =
          r.text.substr(r.assistant[a].begin, r.assistant[a].end - r.assistant[a].begin);
      CHECK(span.ends_with(end_marker));
      std::string_view content = answers[a]->content;
      if (t.family == ChatFamily::qwen3 && content.find("</think>") != std::string_view::npos)
        content = content.substr(content.rfind("</think>") + 8);
      CHECK(span.find(detail::python_strip(content)) != std::string::npos);
    }
  }
  CHECK(compared >= 400);
  CHECK(refused >= 20);
  CHECK(marked >= 40);
}

TEST_CASE("Chat templates: look-alikes of the known ones are refused, naming the known ones",
          "[hub][chat]") {
  // Each refused entry of templates.json renders other bytes than the known template it looks
  // like (make_chat_cases.py checks it for the variants): Qwen1.5-Chat, TRL's Qwen3 training
  // template, and small edits of known templates, in the literals remat reads too.
  const json all = read_json(std::string(REMAT_HUB_CHAT_DIR) + "/templates.json");
  std::size_t refused = 0;
  for (const auto& t : all) {
    if (!t.contains("refused")) continue;
    const std::string jinja = template_text(t, all);
    INFO(t["name"].get<std::string>() << ": " << t["refused"].get<std::string>());
    const std::string message =
        error_of<ChatTemplateError>([&] { recognise_chat_template(jinja, t["bos"], t["eos"]); });
    CHECK(message.find("that is not one of those remat renders") != std::string::npos);
    std::string start = jinja.substr(0, 40);  // quoted with its newlines as spaces
    std::replace(start.begin(), start.end(), '\n', ' ');
    CHECK(message.find(start) != std::string::npos);
    CHECK(message.find("(fingerprint 0x") != std::string::npos);
    CHECK(message.find("Qwen2.5 Instruct") != std::string::npos);  // and the known ones
    CHECK(message.find("Llama 3.2 Instruct") != std::string::npos);
    ++refused;
  }
  CHECK(refused >= 18);
  // One byte of difference is enough, even where it renders the same (a space in a tag): only
  // the default system message and date, and what Jinja's lexer drops, may differ
  for (const auto& t : all) {
    if (t["name"] != "llama3" && t["name"] != "chatml") continue;
    const std::string jinja = t["template"];
    CHECK(recognise_chat_template(jinja, t["bos"], t["eos"]).family == family_of(t["family"]));
    CHECK(recognise_chat_template(jinja + "\r\n", t["bos"], t["eos"]).name ==
          recognise_chat_template(jinja, t["bos"], t["eos"]).name);
    CHECK_THROWS_AS(recognise_chat_template(jinja + " ", t["bos"], t["eos"]), ChatTemplateError);
    CHECK_THROWS_AS(recognise_chat_template(" " + jinja, t["bos"], t["eos"]), ChatTemplateError);
    std::string spaced = jinja;
    spaced.replace(spaced.find("{% endfor %}"), 12, "{%  endfor %}");
    CHECK_THROWS_AS(recognise_chat_template(spaced, t["bos"], t["eos"]), ChatTemplateError);
  }
}

TEST_CASE("Chat templates: unknown ones are refused with an excerpt", "[hub][chat]") {
  const std::string unknown = "{% for m in messages %}<start_of_turn>{{ m.content }}{% endfor %}";
  const std::string msg =
      error_of<ChatTemplateError>([&] { recognise_chat_template(unknown, "", ""); });
  CHECK(msg.find("unknown chat template") != std::string::npos);
  CHECK(msg.find("<start_of_turn>") != std::string::npos);
  // A date preamble outside Meta's layout, and an [INST] variant: refused, not guessed.
  CHECK_THROWS_AS(recognise_chat_template("<|start_header_id|><|end_header_id|><|eot_id|> "
                                          "Cutting Knowledge Date: December 2023",
                                          "", ""),
                  ChatTemplateError);
  CHECK(error_of<ChatTemplateError>([&] {
          recognise_chat_template("{{ '[INST] ' + message['content'] }}", "<s>", "</s>");
        }).find("[INST]") != std::string::npos);
  // ChatML look-alikes whose bytes the ChatML layout would not write: refused, named
  const std::string turn = "{{ '<|im_start|>' + m['role'] + '\\n' + CONTENT + '<|im_end|>\\n' }}";
  const auto chatml = [&](const std::string& before, const std::string& content) {
    std::string t = turn;
    t.replace(t.find("CONTENT"), 7, content);
    return before + "{% for m in messages %}" + t + "{% endfor %}";
  };
  for (const std::string& jinja :
       {chatml("{{ bos_token }}", "m['content']"), chatml("", "m['content'] + eos_token"),
        chatml("", "m['content'] | trim"), chatml("", "m['content'].strip()"),
        chatml("", "m['content']"), std::string("<|im_start|><|im_end|>")}) {
    const std::string message =
        error_of<ChatTemplateError>([&] { recognise_chat_template(jinja, "<s>", "<|im_end|>"); });
    CHECK(message.find("a ChatML template (<|im_start|>) that is not one of those remat renders") !=
          std::string::npos);
  }
  const ChatTemplate chatml_default = recognise_chat_template(kChatML, "", "<|im_end|>");
  CHECK(chatml_default.family == ChatFamily::chatml);
  CHECK(chatml_default.name == "ChatML (transformers' former default)");
  CHECK(chatml_default.default_system.empty());
}

TEST_CASE("JSONL conversations: every malformed line is named, or skipped and counted",
          "[hub][chat]") {
  std::mt19937 rng(7);
  const std::string good = R"({"messages": [{"role": "user", "content": "hi é"}, )"
                           R"({"role": "assistant", "content": "hello\nthere"}]})";
  // Bad lines and the words their error must contain.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant"})", "JSON"},
      {R"({"messages": [], "messages": []})", "twice"},
      {R"({"messages": [{"role": "user", "content": "a", "name": "x"}]})", "'name'"},
      {R"({"messages": [{"role": "tool", "content": "a"}]})", "unknown role 'tool'"},
      {R"({"messages": [{"role": "user", "content": "a"}]})", "no assistant"},
      {R"({"messages": [{"role": "user", "content": 3}]})", "\"content\""},
      {R"({"chat": []})", "unknown key 'chat'"},
      {R"([1, 2])", "expected a JSON object"},
  };
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string> lines(std::uniform_int_distribution<int>(1, 8)(rng), good);
    const std::size_t which = rng() % bad.size();
    const std::size_t at = rng() % (lines.size() + 1);
    lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(at), bad[which].first);
    std::string text;
    for (const auto& l : lines) text += l + (rng() % 3 == 0 ? "\r\n" : "\n");
    const std::string file = scratch("chats.jsonl");
    write(file, text);
    const std::string msg = error_of<DataError>([&] { read_conversations(file); });
    INFO(msg);
    CHECK(msg.find(file + ":" + std::to_string(at + 1) + ":") != std::string::npos);
    CHECK(msg.find(bad[which].second) != std::string::npos);
    const ConversationFile read = read_conversations(file, {.skip_bad = true});
    CHECK(read.skipped == 1);
    CHECK(read.conversations.size() == lines.size() - 1);
    CHECK(read.conversations[0].messages[1].content == "hello\nthere");
  }
  const std::string empty = scratch("empty.jsonl");
  write(empty, "\n  \n");
  CHECK_THROWS_AS(read_conversations(empty), EmptyDataError);
  write(empty, bad[0].first + "\n");
  CHECK_THROWS_AS(read_conversations(empty, {.skip_bad = true}), EmptyDataError);
  CHECK_THROWS_AS(parse_conversation(bad[3].first, "x:1"), UnknownRoleError);
  CHECK_THROWS_AS(parse_conversation(bad[4].first, "x:1"), NoAssistantError);
  CHECK_THROWS_AS(parse_conversation(bad[0].first, "x:1"), MalformedDataError);
}

TEST_CASE("Plain text files: documents between empty lines", "[hub][chat]") {
  const std::string file = scratch("doc.txt");
  write(file, "one\r\ntwo\n\n\n  \nthree\n");
  CHECK(read_text_documents(file) == std::vector<std::string>{"one\ntwo", "three"});
  write(file, "ok\n\xff\n");
  CHECK(error_of<MalformedDataError>([&] { read_text_documents(file); }).find(":2:") !=
        std::string::npos);
  write(file, "\n\n");
  CHECK_THROWS_AS(read_text_documents(file), EmptyDataError);
}

TEST_CASE("Plain text documents get the special tokens transformers' tokenizer adds, as TRL's",
          "[hub][chat]") {
  // <|im_start|> (263) as bos, <|im_end|> (264) as eos; the post-processor writes bos first, as
  // Llama 2's and 3's tokenizer.json files do
  const json bos_first = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens",
       {{"<|im_start|>", {{"id", "<|im_start|>"}, {"ids", {263}}, {"tokens", {"<|im_start|>"}}}}}}};
  const auto folder = [&](const json& post_processor, const json& config) {
    const std::string dir = scratch("document_tokens");
    std::filesystem::create_directories(dir);
    write(dir + "/tokenizer.json", chatml_tokenizer_json(post_processor).dump());
    write(dir + "/tokenizer_config.json", config.dump());
    return Tokenizer::from_folder(dir);
  };
  const json tokens = {{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}};
  const Tokenizer plain = folder(nullptr, tokens);
  const std::vector<std::int32_t> body = plain.encode("abc st", false);
  const auto with = [&](std::vector<std::int32_t> before, std::vector<std::int32_t> after) {
    before.insert(before.end(), body.begin(), body.end());
    before.insert(before.end(), after.begin(), after.end());
    return before;
  };
  // the post-processor's bos, then eos (was: no bos unless add_bos_token)
  CHECK(tokenize_document(folder(bos_first, tokens), "abc st").ids == with({263}, {264}));
  // add_bos_token / add_eos_token rebuild it, as transformers does: bos as they say
  json no_bos = tokens;
  no_bos["add_bos_token"] = false;
  CHECK(tokenize_document(folder(bos_first, no_bos), "abc st").ids == with({}, {264}));
  json both = tokens;
  both["add_bos_token"] = true;
  both["add_eos_token"] = true;
  CHECK(tokenize_document(folder(nullptr, both), "abc st").ids == with({263}, {264, 264}));
  // a text that ends with eos's text gets no second one (TRL appends it only then)
  const TokenizedExample ended = tokenize_document(plain, "abc st<|im_end|>");
  CHECK(ended.ids == with({}, {264}));
  CHECK(ended.loss == std::vector<std::uint8_t>(ended.ids.size(), 1));
}

TEST_CASE("The loss mask is on exactly the tokens that overlap assistant spans", "[hub][chat]") {
  const Tokenizer tok = chatml_tokenizer();
  const ChatTemplate t = recognise_chat_template(kChatML, "", "<|im_end|>");
  std::mt19937 rng(11);
  std::size_t straddling = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const RenderedChat r = render_chat(t, random_chat(rng, 3));
    const TokenizedExample ex = tokenize_chat(tok, r);
    REQUIRE(ex.ids == tok.encode(r.text, false));
    // Byte ranges of the tokens (the text is ASCII, so each token decodes to its own bytes).
    std::size_t at = 0;
    for (std::size_t i = 0; i < ex.ids.size(); ++i) {
      const std::size_t len = tok.decode(std::span(&ex.ids[i], 1), false).size();
      bool overlaps = false, inside = true;
      for (const auto& s : r.assistant) {
        overlaps |= at < s.end && s.begin < at + len;
        if (at < s.end && s.begin < at + len) inside = s.begin <= at && at + len <= s.end;
      }
      straddling += overlaps && !inside;
      CHECK(ex.loss[i] == (overlaps ? 1 : 0));
      at += len;
    }
    CHECK(at == r.text.size());
    const TokenizedExample all = tokenize_chat(tok, r, TrainOn::all);
    CHECK(std::count(all.loss.begin(), all.loss.end(), 1) ==
          static_cast<std::ptrdiff_t>(all.ids.size()));
  }
  CHECK(straddling > 0);  // the merges did make tokens cross span boundaries
}

TEST_CASE("Token limits: oldest exchanges dropped, system kept, or the example excluded",
          "[hub][chat]") {
  const Tokenizer tok = chatml_tokenizer();
  const ChatTemplate t = recognise_chat_template(kChatML, "", "<|im_end|>");
  std::mt19937 rng(5);
  std::vector<Conversation> chats;
  for (int i = 0; i < 40; ++i) chats.push_back(random_chat(rng, 5, 12));
  std::vector<std::size_t> lengths;
  for (const auto& c : chats) lengths.push_back(tokenize_chat(tok, render_chat(t, c)).ids.size());
  std::vector<std::size_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t limit = sorted[sorted.size() / 3];
  const ChatData kept = prepare_chat_data(tok, t, chats, {.max_tokens = limit});
  // Independently: the longest suffix of whole exchanges (with the system message) that fits.
  std::size_t truncated = 0, excluded = 0, next = 0;
  for (std::size_t i = 0; i < chats.size(); ++i) {
    const Conversation& c = chats[i];
    if (lengths[i] <= limit) {
      CHECK(kept.examples[next++].ids.size() == lengths[i]);
      continue;
    }
    const bool sys = c.messages[0].role == Role::system;
    bool found = false;
    for (std::size_t from = (sys ? 3 : 2); from < c.messages.size(); from += 2) {
      Conversation s;
      if (sys) s.messages.push_back(c.messages[0]);
      s.messages.insert(s.messages.end(), c.messages.begin() + static_cast<std::ptrdiff_t>(from),
                        c.messages.end());
      const TokenizedExample ex = tokenize_chat(tok, render_chat(t, s));
      if (ex.ids.size() <= limit) {
        CHECK(kept.examples[next++].ids == ex.ids);
        found = true;
        break;
      }
    }
    (found ? truncated : excluded)++;
  }
  CHECK(next == kept.examples.size());
  CHECK(kept.report.truncated == truncated);
  CHECK(kept.report.excluded == excluded);
  CHECK(truncated > 0);
  CHECK(kept.report.min == sorted.front());
  CHECK(kept.report.max == sorted.back());
  CHECK(kept.report.median == sorted[19]);  // nearest rank: ceil(0.5 * 40) = 20th
  CHECK(kept.report.p95 == sorted[37]);     // ceil(0.95 * 40) = 38th
  CHECK(kept.report.counts == sorted);      // every count, for finetune --auto's length
  const ChatData ex =
      prepare_chat_data(tok, t, chats, {.max_tokens = limit, .truncate = Truncate::exclude});
  CHECK(ex.report.excluded == truncated + excluded);
  CHECK(ex.report.truncated == 0);
  CHECK(describe(ex.report).find("excluded") != std::string::npos);
  CHECK_THROWS_AS(prepare_chat_data(tok, t, chats, {.max_tokens = 4096, .context = 2048}),
                  remat::ArgumentError);
  CHECK_THROWS_AS(prepare_chat_data(tok, t, chats, {.max_tokens = 3}), EmptyDataError);
}

TEST_CASE("Conversations the template refuses: an error, or skipped and counted on request",
          "[hub][chat][errors]") {
  // Mistral's template raises on a system message: random_chat gives one to about half.
  const Tokenizer tok = chatml_tokenizer();
  const std::string dir = REMAT_HUB_CHAT_DIR;
  std::optional<ChatTemplate> mistral;
  for (const auto& t : read_json(dir + "/templates.json"))
    if (t["name"] == "mistral")
      mistral = recognise_chat_template(t["template"].get<std::string>(), t["bos"], t["eos"]);
  REQUIRE(mistral);
  std::mt19937 rng(13);
  std::vector<Conversation> chats;
  std::vector<std::size_t> accepted_lengths;
  std::size_t refused = 0;
  std::string first;
  for (int i = 0; i < 30; ++i) {
    chats.push_back(random_chat(rng, 3));
    chats.back().source = "chats.jsonl:" + std::to_string(i + 1);
    if (chats.back().messages[0].role == Role::system) {
      if (refused++ == 0) first = chats.back().source;
    } else {
      accepted_lengths.push_back(
          tokenize_chat(tok, render_chat(*mistral, chats.back())).ids.size());
    }
  }
  REQUIRE(refused > 0);
  REQUIRE(accepted_lengths.size() > 1);
  CHECK_THROWS_AS(prepare_chat_data(tok, *mistral, chats, {.max_tokens = 4096}), UnknownRoleError);
  const ChatData kept =
      prepare_chat_data(tok, *mistral, chats, {.max_tokens = 4096, .skip_refused = true});
  CHECK(kept.report.refused == refused);
  CHECK(kept.report.examples == accepted_lengths.size());
  REQUIRE(kept.examples.size() == accepted_lengths.size());
  for (std::size_t i = 0; i < kept.examples.size(); ++i)
    CHECK(kept.examples[i].ids.size() == accepted_lengths[i]);
  CHECK(kept.report.first_refused.rfind(first + ":", 0) == 0);  // the first refused, by source
  CHECK(describe(kept.report)
            .find(std::to_string(refused) + " conversations the chat template "
                                            "refuses skipped") != std::string::npos);
  // every conversation refused: nothing to train on, said so
  std::vector<Conversation> all_system;
  for (const Conversation& c : chats)
    if (c.messages[0].role == Role::system) all_system.push_back(c);
  CHECK_THROWS_AS(
      prepare_chat_data(tok, *mistral, all_system, {.max_tokens = 4096, .skip_refused = true}),
      EmptyDataError);
}

TEST_CASE("Batch layout: padded and packed rows, positions and segments per example",
          "[hub][chat]") {
  std::mt19937 rng(3);
  std::vector<TokenizedExample> examples(23);
  for (auto& e : examples) {
    const std::size_t n = std::uniform_int_distribution<std::size_t>(2, 17)(rng);
    for (std::size_t i = 0; i < n; ++i) {
      e.ids.push_back(static_cast<std::int32_t>(rng() % 1000));
      e.loss.push_back(static_cast<std::uint8_t>(rng() % 2));
    }
  }
  for (const Layout layout : {Layout::pad, Layout::pack}) {
    const TokenBatch b = lay_out(examples, 16, layout, -7);
    if (layout == Layout::pad) CHECK(b.rows == examples.size());
    if (layout == Layout::pack) CHECK(b.rows < examples.size());
    // Walk the rows: every example appears whole, in order, positions from 0.
    std::size_t e = 0;
    for (std::size_t r = 0; r < b.rows; ++r) {
      std::size_t c = 0;
      for (std::int32_t seg = 0; c < b.columns && b.segment[r * 16 + c] == seg; ++seg, ++e) {
        const auto& ex = examples.at(e);
        for (std::size_t t = 0; t + 1 < ex.ids.size(); ++t, ++c) {
          const std::size_t at = r * 16 + c;
          CHECK(b.ids[at] == ex.ids[t]);
          CHECK(b.targets[at] == ex.ids[t + 1]);
          CHECK(b.loss[at] == ex.loss[t + 1]);
          CHECK(b.positions[at] == static_cast<std::int32_t>(t));
          CHECK(b.segment[at] == seg);
        }
      }
      for (; c < b.columns; ++c) {
        CHECK(b.ids[r * 16 + c] == -7);
        CHECK(b.targets[r * 16 + c] == -1);
        CHECK(b.loss[r * 16 + c] == 0);
        CHECK(b.segment[r * 16 + c] == -1);
      }
    }
    CHECK(e == examples.size());
  }
  examples[4].ids.resize(18);
  examples[4].loss.resize(18);
  CHECK_THROWS_AS(lay_out(examples, 16, Layout::pack, 0), remat::ArgumentError);
}
