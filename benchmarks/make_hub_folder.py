#!/usr/bin/env python3
"""Writes a Hugging Face model folder shaped like Qwen2.5-0.5B, with random BF16 weights, for
benchmarks/load_bench (`load_bench llama DIR ...`). Nothing here is a real model: the weights are
normal(0, 0.02) draws, the config.json is Qwen2.5-0.5B's own field for field.

    python3 benchmarks/make_hub_folder.py /tmp/qwen25_05b_random

Shapes: hidden 896, 24 layers, 14 query / 2 key-value heads (head size 64), MLP 4864, vocabulary
151,936, head tied to the embedding: 494,032,768 parameters, 988 MB as BF16 in one
model.safetensors, as the hub's file. Needs NumPy only. Never commit the output."""

import json
import os
import struct
import sys

import numpy as np

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}


def tensors(cfg):
    """(name, shape) in Hugging Face's order; the head is tied, so there is no lm_head.weight."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
                (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (h, h)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i))]
    out.append(("model.norm.weight", (h,)))
    return out


def bf16(values):
    """float32 -> BF16 bits, rounded to nearest even (as torch rounds)."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def main(folder):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    specs = tensors(CONFIG)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in specs:
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    rng = np.random.default_rng(20261201)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in specs:
            if "norm" in name:
                values = 1 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
            else:
                values = 0.02 * rng.standard_normal(shape, dtype=np.float32)
            f.write(bf16(values).tobytes())
    params = sum(int(np.prod(s)) for _, s in specs)
    print(f"wrote {folder}: {len(specs)} tensors, {params:,} parameters, {offset / 1e6:.0f} MB of BF16")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_hub_folder.py FOLDER")
    main(sys.argv[1])
