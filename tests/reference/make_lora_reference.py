#!/usr/bin/env python3
"""Writes tests/reference/lora.json and the adapter folders tests/reference/lora/case<k>/: a tiny
Llama (llama_reference.py) with LoRA adapters in PEFT's layout, and the logits of the adapted
model in double, computed here independently of the C++.

    /usr/bin/python3 tests/reference/make_lora_reference.py

The adapter configs are drawn at random (fixed seed) over the adapter_config.json fields that
change which layers get an adapter and how it is scaled, with the meaning PEFT gives them
(peft/tuners/lora/config.py, tuners_utils.check_target_module_exists, utils/other.get_pattern_key,
LoraLayer.update_layer), re-stated here:
  - target_modules as a list: a module whose name equals an entry or ends in "." + entry; as one
    string: a regular expression the whole name must match (re.fullmatch);
  - exclude_modules: the same two forms, checked first;
  - layers_to_transform (list targets only): the layer index is the number after
    "<layers_pattern>." (or after the first "<x>." without a pattern), found by re.match of
    r".*?\\.<pattern>\\.(\\d+)\\."; a name listed in full in target_modules skips this filter;
  - rank_pattern / alpha_pattern: the first key (in the file's order) for which
    re.match(rf"(.*\\.)?({key})$", name) matches gives the module's r / lora_alpha;
  - scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
In evaluation (no dropout) an adapted linear layer computes x W^T + b + scale (x A^T) B^T, which
is the layer with weight W + scale B A: the reference folds each adapter into its weight in
double and runs llama_reference.logits."""

import json
import math
import os
import random
import re
import struct

import torch

import llama_reference as ref

HERE = os.path.dirname(os.path.abspath(__file__))
torch.set_default_dtype(torch.float64)

CONFIG = {"vocab_size": 29, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "max_position_embeddings": 16, "tie_word_embeddings": False,
          "attention_bias": False, "hidden_act": "silu", "model_type": "llama",
          "architectures": ["LlamaForCausalLM"]}
NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
REGEX_TARGETS = [r".*\.(q_proj|v_proj)", r"model\.layers\.[0-2]\.self_attn\..*",
                 r".*mlp\.(up|down)_proj", r".*\.[13]\..*_proj"]
PATTERN_KEYS = ["q_proj", "v_proj", r"layers\.1\..*", "model.layers.2.mlp.down_proj", r".*_proj",
                r"mlp\.up_proj", "self_attn.o_proj", r"[0-9]\.self_attn\.k_proj"]


def linear_modules():
    """Names of the model's Linear layers that carry a weight named <name>.weight (not lm_head,
    which no drawn target reaches)."""
    return [n[:-len(".weight")] for n, _ in ref.parameter_shapes(CONFIG)
            if n.endswith("_proj.weight")]


def selected(cfg, name):
    exclude = cfg.get("exclude_modules")
    if isinstance(exclude, str):
        if re.fullmatch(exclude, name):
            return False
    elif exclude and (name in exclude or any(name.endswith("." + e) for e in exclude)):
        return False
    targets = cfg["target_modules"]
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    if name in targets:
        return True
    if not any(name.endswith("." + t) for t in targets):
        return False
    layers = cfg.get("layers_to_transform")
    if not layers:
        return True
    patterns = cfg.get("layers_pattern") or []
    patterns = [patterns] if isinstance(patterns, str) else patterns
    match = None
    if not patterns:
        match = re.match(r".*?\.[^.]*\.(\d+)\.", name)
    for p in patterns:
        match = re.match(rf".*?\.{p}\.(\d+)\.", name)
        if match:
            break
    return match is not None and int(match.group(1)) in layers


def pattern_value(patterns, name, default):
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def draw_config(rng, rslora, regex):
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rng.randint(1, 5),
           "lora_alpha": rng.choice([4, 8, 16, 3.5]), "lora_dropout": rng.choice([0.0, 0.05]),
           "use_rslora": rslora, "bias": "none", "fan_in_fan_out": False,
           "init_lora_weights": True, "modules_to_save": None, "inference_mode": True,
           "base_model_name_or_path": "tiny-llama"}
    if regex:
        cfg["target_modules"] = rng.choice(REGEX_TARGETS)
    else:
        targets = rng.sample(NAMES, rng.randint(1, 4))
        if rng.random() < 0.3:
            targets.append(f"model.layers.{rng.randrange(4)}.mlp.{rng.choice(['up_proj', 'gate_proj'])}")
        cfg["target_modules"] = targets
        if rng.random() < 0.5:
            cfg["layers_to_transform"] = sorted(rng.sample(range(4), rng.randint(1, 3)))
            cfg["layers_pattern"] = rng.choice([None, "layers", ["h", "layers"]])
    exclude = rng.random()
    if exclude < 0.3:
        cfg["exclude_modules"] = [f"model.layers.{rng.randrange(4)}.self_attn.{rng.choice(NAMES[:4])}"]
    elif exclude < 0.45:
        cfg["exclude_modules"] = r".*\.2\.mlp\..*"
    cfg["rank_pattern"] = {k: rng.randint(1, 6) for k in rng.sample(PATTERN_KEYS, rng.randint(0, 3))}
    cfg["alpha_pattern"] = {k: rng.choice([2, 5, 12.5, 32])
                            for k in rng.sample(PATTERN_KEYS, rng.randint(0, 3))}
    return cfg


def valid(cfg, chosen):
    """remat asks that every listed target select a layer (PEFT: at least one overall)."""
    if not chosen:
        return False
    targets = cfg["target_modules"]
    if isinstance(targets, str):
        return True
    return all(any(name == t or name.endswith("." + t) for name in chosen) for t in targets)


def write_safetensors(path, tensors):
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors.items():
        data = t.contiguous().numpy().astype("<f8").tobytes()
        header[name] = {"dtype": "F64", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def tensor(t):
    return {"shape": list(t.shape), "data": [float(v) if t.is_floating_point() else int(v) for v in t.reshape(-1).tolist()]}


def main():
    rng = random.Random(26)
    torch.manual_seed(26)
    params = {name: (1 + 0.1 * torch.randn(shape)) if "norm" in name else 0.3 * torch.randn(shape)
              for name, shape in ref.parameter_shapes(CONFIG)}
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 7))
    shapes = dict(ref.parameter_shapes(CONFIG))
    cases = []
    while len(cases) < 8:
        # half of the cases rsLoRA, a third with target_modules as a regex
        cfg = draw_config(rng, len(cases) % 2 == 1, len(cases) % 3 == 2)
        chosen = [n for n in linear_modules() if selected(cfg, n)]
        if not valid(cfg, chosen):
            continue
        folder = f"case{len(cases)}"
        os.makedirs(os.path.join(HERE, "lora", folder), exist_ok=True)
        merged = dict(params)
        adapters, modules = {}, {}
        for name in chosen:
            r = pattern_value(cfg["rank_pattern"], name, cfg["r"])
            alpha = pattern_value(cfg["alpha_pattern"], name, cfg["lora_alpha"])
            scale = alpha / math.sqrt(r) if cfg["use_rslora"] else alpha / r
            out, inp = shapes[name + ".weight"]
            a, b = 0.3 * torch.randn(r, inp), 0.3 * torch.randn(out, r)
            adapters[f"base_model.model.{name}.lora_A.weight"] = a
            adapters[f"base_model.model.{name}.lora_B.weight"] = b
            merged[name + ".weight"] = params[name + ".weight"] + scale * (b @ a)
            modules[name] = {"r": r, "scale": scale}
        with open(os.path.join(HERE, "lora", folder, "adapter_config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(HERE, "lora", folder, "adapter_model.safetensors"), adapters)
        cases.append({"folder": folder, "modules": modules,
                      "logits": tensor(ref.logits(CONFIG, merged, ids))})
    with open(os.path.join(HERE, "lora.json"), "w") as f:
        json.dump({"torch": torch.__version__, "config": CONFIG, "ids": tensor(ids),
                   "params": {k: tensor(v) for k, v in params.items()},
                   "base_logits": tensor(ref.logits(CONFIG, params, ids)), "cases": cases},
                  f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
