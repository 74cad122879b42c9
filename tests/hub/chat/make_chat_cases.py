#!/usr/bin/env python3
"""Renders generated conversations with real chat templates through Jinja2, as Hugging Face
transformers' apply_chat_template does (sandboxed environment, trim_blocks, lstrip_blocks,
loopcontrols, raise_exception, and strftime_now where a template names a day for it), to test
remat's hub/chat_template.hpp byte for byte.

Reads templates.json (each template's text and where it comes from) and writes cases.json:
one case per conversation, with the rendered text, or "error": true when the template itself
raises; the text of the conversation up to its last user turn rendered with
add_generation_prompt (what generation starts from; for Qwen3's templates also with
enable_thinking=False); and where the template marks assistant turns with {% generation %} (TRL's training
variants), the byte ranges it marks, as transformers' assistant mask reads them. A template may be
given as a variant of another ("variant_of", "edits": [from, to] pairs, each replacing every
`from`; "$END" appends); one that remat must refuse ("refused": why) gets no case, and when it is
a variant, the check here that it renders other bytes than its base for some conversation.
Run: python3 make_chat_cases.py  (Debian 12: python3-jinja2).
"""
import datetime
import json
import os
import random
import re
from contextlib import contextmanager

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_PER_TEMPLATE = 60


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} extension (chat_template_utils.py): records the character
    ranges the blocks render."""
    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(activate_tracker=self.activate_tracker)
        self._rendered_blocks = None
        self._generation_indices = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        rv = caller()
        if self._rendered_blocks is not None:
            start = len("".join(self._rendered_blocks))
            self._generation_indices.append((start, start + len(rv)))
        return rv

    @contextmanager
    def activate_tracker(self, rendered_blocks, generation_indices):
        try:
            self._rendered_blocks = rendered_blocks
            self._generation_indices = generation_indices
            yield
        finally:
            self._rendered_blocks = None
            self._generation_indices = None


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env


def render(compiled, messages, t, add_generation_prompt=False, **variables):
    """The text and the byte ranges of its {% generation %} blocks (empty ones left out)."""
    blocks, marks = [], []
    with compiled.environment.activate_tracker(blocks, marks):
        for block in compiled.generate(messages=messages,
                                       add_generation_prompt=add_generation_prompt,
                                       bos_token=t["bos"], eos_token=t["eos"], **variables):
            blocks.append(block)
    text = "".join(blocks)
    at = lambda i: len(text[:i].encode("utf-8"))
    return text, [[at(a), at(b)] for a, b in marks if a != b]


def template_text(t, by_name):
    """A template's text: its own, or its base's with its edits made."""
    if "variant_of" not in t:
        return t["template"]
    text = template_text(by_name[t["variant_of"]], by_name)
    for old, new in t["edits"]:
        assert old == "$END" or old in text, (t["name"], old)
        text = text + new if old == "$END" else text.replace(old, new)
    return text


def check_differs(env, t, by_name):
    """A refused variant renders other bytes than its base for some conversation: it is a case
    remat would get wrong if it rendered it as its base."""
    base = by_name[t["variant_of"]]
    rng = random.Random(t["name"])
    family = base["family"]
    compiled = [env.from_string(template_text(x, by_name)) for x in (base, t)]
    for messages in [conversation(rng, family) for _ in range(CASES_PER_TEMPLATE)]:
        rendered = []
        for c in compiled:
            try:
                rendered.append(render(c, messages, t)[0])
            except jinja2.exceptions.TemplateError as e:
                rendered.append("error: " + str(e))
        if rendered[0] != rendered[1]:
            return
    raise AssertionError(t["name"] + " renders as its base")


# Pieces of message text: words, unicode in several scripts, newlines, and the whitespace that
# Python's str.strip (Jinja's trim) removes, including non-ASCII spaces.
PIECES = ["hello", "world", "Qwen", "x", "42", "é", "ñandú", "中文字", "日本語", "🙂", "👩‍💻",
          "مرحبا", "Ελλάδα", "\n", "\n\n", " ", "  ", "\t", "\u3000", "\u00a0", "\u2003",
          "<b>", "{json: 1}", "'quote'", "\"dq\"", "\\", "[INST]", "<<SYS>>"]


def text(rng, allow_empty=True):
    if allow_empty and rng.random() < 0.1:
        return ""
    return "".join(rng.choice(PIECES) + (" " if rng.random() < 0.5 else "")
                   for _ in range(rng.randint(1, 8)))


def assistant_text(rng, family):
    body = text(rng)
    if family == "qwen3" and rng.random() < 0.4:
        # reasoning written inline, as Qwen3's template splits it at </think>
        return rng.choice(["", "\n"]) + "<think>" + text(rng) + "</think>" + \
            rng.choice(["", "\n", "\n\n"]) + body
    return body


def conversation(rng, family):
    messages = []
    if family in ("chatml", "qwen3", "llama3", "llama2") and rng.random() < 0.6:
        messages.append({"role": "system", "content": text(rng)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": text(rng, allow_empty=False)})
        messages.append({"role": "assistant", "content": assistant_text(rng, family)})
    if rng.random() < 0.2:
        messages.append({"role": "user", "content": text(rng)})
    if family in ("chatml", "qwen3", "llama3") and rng.random() < 0.2:
        # a system message inside the conversation: ChatML and Llama 3 render it in place
        at = rng.randint(1, len(messages))
        messages.insert(at, {"role": "system", "content": text(rng)})
    return messages


def broken(rng, family):
    """A conversation the [INST] templates refuse: two user or two assistant turns in a row,
    or (Mistral) a system message first."""
    messages = conversation(rng, family)
    first = 1 if messages[0]["role"] == "system" else 0
    at = rng.randint(first, len(messages) - 1)
    messages.insert(at, dict(messages[at]))
    if family == "mistral" and rng.random() < 0.3:
        messages = [{"role": "system", "content": text(rng)}] + messages[at:at + 1] + messages
    return messages


def main():
    rng = random.Random(23)
    env = environment()
    templates = json.load(open(os.path.join(HERE, "templates.json"), encoding="utf-8"))
    by_name = {t["name"]: t for t in templates}
    cases = []
    for t in templates:
        if "strftime_now" in t:
            # transformers gives templates strftime_now = datetime.now().strftime; a fixed day
            # here, which the test gives remat's template as its date_string
            day = datetime.date.fromisoformat(t["strftime_now"])
            env.globals["strftime_now"] = day.strftime
        else:
            env.globals.pop("strftime_now", None)
        if "refused" in t:
            if "variant_of" in t:
                check_differs(env, t, by_name)
            continue
        text = template_text(t, by_name)
        compiled = env.from_string(text)
        marked = re.search(r"{%[-+]?\s*generation", text) is not None
        count = t.get("cases", CASES_PER_TEMPLATE)
        generated = [conversation(rng, t["family"]) for _ in range(count)]
        if t["family"] in ("llama2", "mistral"):
            generated += [broken(rng, t["family"]) for _ in range(count // 4)]
        for messages in generated:
            case = {"template": t["name"], "messages": messages}
            try:
                case["text"], marks = render(compiled, messages, t)
                if marked:
                    case["generation"] = marks
                # the conversation up to its last user turn, as a prompt for an answer
                last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
                case["prompt_text"] = render(compiled, messages[:last_user + 1], t, True)[0]
                if t["family"] == "qwen3":  # the only templates that read enable_thinking
                    case["prompt_text_no_thinking"] = render(
                        compiled, messages[:last_user + 1], t, True, enable_thinking=False)[0]
            except jinja2.exceptions.TemplateError as e:
                case["error"] = str(e)
            cases.append(case)
    with open(os.path.join(HERE, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/hub/chat/make_chat_cases.py", "jinja2": jinja2.__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(len(cases), "cases,", sum("error" in c for c in cases), "refused by the template")


if __name__ == "__main__":
    main()
