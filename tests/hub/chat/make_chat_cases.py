#!/usr/bin/env python3
"""Renders generated conversations with real chat templates through Jinja2, as Hugging Face
transformers' apply_chat_template does (sandboxed environment, trim_blocks, lstrip_blocks,
loopcontrols, raise_exception, and strftime_now where a template names a day for it), to test
remat's hub/chat_template.hpp byte for byte.

Reads templates.json (each template's text and where it comes from) and writes cases.json:
one case per conversation, with the rendered text, or "error": true when the template itself
raises. Run: python3 make_chat_cases.py  (Debian 12: python3-jinja2).
"""
import datetime
import json
import os
import random

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_PER_TEMPLATE = 60


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env


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
    cases = []
    for t in templates:
        if "strftime_now" in t:
            # transformers gives templates strftime_now = datetime.now().strftime; a fixed day
            # here, which the test gives remat's template as its date_string
            day = datetime.date.fromisoformat(t["strftime_now"])
            env.globals["strftime_now"] = day.strftime
        else:
            env.globals.pop("strftime_now", None)
        compiled = env.from_string(t["template"])
        generated = [conversation(rng, t["family"]) for _ in range(CASES_PER_TEMPLATE)]
        if t["family"] in ("llama2", "mistral"):
            generated += [broken(rng, t["family"]) for _ in range(CASES_PER_TEMPLATE // 4)]
        for messages in generated:
            case = {"template": t["name"], "messages": messages}
            try:
                case["text"] = compiled.render(messages=messages, add_generation_prompt=False,
                                               bos_token=t["bos"], eos_token=t["eos"])
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
