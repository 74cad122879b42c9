#!/usr/bin/env python3
"""Writes the PyTorch reference data the C++ tests compare against (tests/reference/*.json).

Run with a Python that has torch (1.13 was used: Debian's python3-torch):
    /usr/bin/python3 tests/reference/make_reference.py
CI does not need torch: the JSON files are committed. Each case holds its inputs (random, from a
fixed seed), the upstream gradient R of the scalar <R, output>, the output, and the gradient of
every input, all in double."""

import json
import math
import os

import torch
import torch.nn.functional as F

import llama_reference as ref

HERE = os.path.dirname(os.path.abspath(__file__))
torch.set_default_dtype(torch.float64)


def tensor(t):
    t = t.detach()
    return {"shape": list(t.shape), "data": [float(v) if t.is_floating_point() else int(v) for v in t.reshape(-1).tolist()]}


def case(name, fn, inputs, params=None, extra=None):
    """Runs fn on leaves made from `inputs` (a dict), backpropagates <R, out>, records it all."""
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    out = fn(**leaves)
    r = torch.randn(out.shape)
    (out * r).sum().backward()
    entry = {"op": name, "params": params or {}, "inputs": {k: tensor(v) for k, v in inputs.items()},
             "R": tensor(r), "output": tensor(out),
             "grads": {k: tensor(v.grad) for k, v in leaves.items() if v.grad is not None}}
    entry.update(extra or {})
    return entry


def op_cases():
    torch.manual_seed(20261130)
    cases = []
    for shape in [(5,), (3, 7), (2, 3, 8)]:
        c = shape[-1]
        for eps in (1e-6, 1e-2):
            cases.append(case("rms_norm", lambda x, w, eps=eps: ref.rms_norm(x, w, eps),
                              {"x": torch.randn(shape), "w": torch.randn(c)}, {"eps": eps}))
        for name, fn in [("silu", lambda x: F.silu(x)), ("gelu", lambda x: F.gelu(x)),
                         ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))]:
            cases.append(case(name, fn, {"x": 2 * torch.randn(shape)}))
        cases.append(case("swiglu", lambda gate, up: F.silu(gate) * up, {"gate": torch.randn(shape), "up": torch.randn(shape)}))
        mask = torch.rand(shape) < 0.4
        cases.append(case("where", lambda a, b, cond=mask: torch.where(cond, a, b),
                          {"cond": mask, "a": torch.randn(shape), "b": torch.randn(shape)}))
        trailing = torch.rand(shape[-1:]) < 0.5
        cases.append(case("masked_fill", lambda x, mask=trailing: x.masked_fill(mask, -1.5),
                          {"x": torch.randn(shape), "mask": trailing}, {"value": -1.5}))
        for reduction in ("mean", "sum", "none"):
            cases.append(case("mse_loss", lambda input, target, r=reduction: F.mse_loss(input, target, reduction=r),
                              {"input": torch.randn(shape), "target": torch.randn(shape)}, {"reduction": reduction}))
        n = math.prod(shape)
        new_shape = [n] if len(shape) > 1 else [1, n]
        cases.append(case("reshape", lambda x, s=new_shape: x.reshape(s), {"x": torch.randn(shape)}, {"shape": new_shape}))
    # rope on (B, T, H, D): ref.apply_rope works on (B, H, T, D)
    # the last two at positions past 4,000, where float32 angles (HF's) and double angles differ
    for shape, theta, offset in [((1, 4, 1, 2), 10000.0, 0), ((2, 5, 3, 8), 10000.0, 3), ((2, 6, 2, 4), 1e6, 11),
                                 ((1, 3, 2, 8), 10000.0, 4093), ((1, 2, 1, 16), 1e6, 8190)]:
        def rope(x, theta=theta, offset=offset):
            cos, sin = ref.rope_cos_sin(x.shape[1], x.shape[3], theta, offset, x.dtype)
            return ref.apply_rope(x.transpose(1, 2), cos, sin).transpose(1, 2)
        cases.append(case("rope", rope, {"x": torch.randn(shape)}, {"theta": theta, "offset": offset}))
    # grouped-query attention: (B, T, H, G, D, theta, offset)
    for b, t, h, g, d, theta, offset in [(1, 1, 2, 1, 2, 10000.0, 0), (2, 5, 4, 2, 4, 10000.0, 0), (1, 7, 6, 2, 4, 1e6, 2),
                                         (2, 4, 3, 3, 6, 500.0, 0), (1, 6, 4, 1, 2, 10000.0, 5)]:
        cases.append(case("grouped_query_attention",
                          lambda q, k, v, h=h, g=g, theta=theta, offset=offset: ref.gqa_attention(q, k, v, h, g, theta, offset),
                          {"q": torch.randn(b, t, h * d), "k": torch.randn(b, t, g * d), "v": torch.randn(b, t, g * d)},
                          {"heads": h, "kv_heads": g, "theta": theta, "offset": offset}))
    # add/sub/mul/div broadcasting by NumPy's rules (divisors kept away from 0)
    for sa, sb in [((2, 1, 4), (3, 1)), ((1, 3), (2, 1)), ((2, 3, 1), (1, 1, 4)), ((4, 1, 1), (3, 2)), ((3, 4), (2, 1, 4))]:
        b = torch.randn(sb)
        b = b + 0.5 * torch.sign(b)
        for name, fn in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div)]:
            cases.append(case(name, lambda a, b, fn=fn: fn(a, b), {"a": torch.randn(sa), "b": b}))
    # scaled rotary embeddings (rope_scaling): linear; llama3 with one wavelength in each band;
    # dynamic past max_position_embeddings (positions 14..18 of 16) and within it (the plain rope)
    for shape, theta, offset, scaling in [
            ((1, 3, 2, 8), 10000.0, 2, {"rope_type": "linear", "factor": 4.0}),
            ((2, 4, 1, 8), 500000.0, 5, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 400}),
            ((1, 5, 2, 8), 10000.0, 14, {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}),
            ((1, 3, 1, 4), 10000.0, 3, {"rope_type": "dynamic", "factor": 3.0, "max_position_embeddings": 16})]:
        def scaled_rope(x, theta=theta, offset=offset, scaling=scaling):
            cos, sin = ref.rope_cos_sin(x.shape[1], x.shape[3], theta, offset, x.dtype, scaling)
            return ref.apply_rope(x.transpose(1, 2), cos, sin).transpose(1, 2)
        cases.append(case("rope", scaled_rope, {"x": torch.randn(shape)},
                          {"theta": theta, "offset": offset, "scaling": scaling}))
    # grouped-query attention under a sliding window (query i sees keys i - w < j <= i)
    for b, t, h, g, d, window in [(1, 6, 2, 1, 4, 1), (2, 7, 4, 2, 2, 3), (1, 5, 3, 3, 4, 5), (1, 9, 2, 2, 6, 4)]:
        cases.append(case("grouped_query_attention",
                          lambda q, k, v, h=h, g=g, w=window: ref.gqa_attention(q, k, v, h, g, 10000.0, 0, w),
                          {"q": torch.randn(b, t, h * d), "k": torch.randn(b, t, g * d), "v": torch.randn(b, t, g * d)},
                          {"heads": h, "kv_heads": g, "theta": 10000.0, "offset": 0, "window": window}))
    return cases


LLAMA_CONFIGS = [
    # GQA (4 query heads, 2 key/value heads), untied head
    {"vocab_size": 37, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
     "attention_bias": False, "max_position_embeddings": 64},
    # Qwen2: q/k/v bias, tied head, one key/value head, another theta
    {"model_type": "qwen2", "vocab_size": 29, "hidden_size": 12, "intermediate_size": 20, "num_hidden_layers": 3, "num_attention_heads": 3,
     "num_key_value_heads": 1, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
     "max_position_embeddings": 32},
]


def llama_cases():
    torch.manual_seed(11)
    cases = []
    for cfg, (b, t) in zip(LLAMA_CONFIGS, [(2, 7), (3, 5)]):
        params = {}
        for name, shape in ref.parameter_shapes(cfg):
            # norms near one, the rest small: values like a trained model's, not like an init's
            params[name] = (1 + 0.1 * torch.randn(shape)) if "norm" in name else 0.3 * torch.randn(shape)
            params[name].requires_grad_(True)
        ids = torch.randint(0, cfg["vocab_size"], (b, t))
        targets = torch.randint(0, cfg["vocab_size"], (b, t))
        out = ref.logits(cfg, params, ids)
        loss = F.cross_entropy(out.reshape(-1, cfg["vocab_size"]), targets.reshape(-1))
        loss.backward()
        cases.append({"config": cfg, "ids": tensor(ids), "targets": tensor(targets), "logits": tensor(out),
                      "loss": loss.item(), "params": {k: tensor(v) for k, v in params.items()},
                      "grads": {k: tensor(v.grad) for k, v in params.items()}})
    return cases


def family_config(rng, family, option):
    """A random tiny config.json of `family` exercising `option`, with Hugging Face's field names."""
    kv = rng.choice([1, 2])
    heads = kv * rng.choice([1, 2])
    head_dim = 2 if heads > 2 else rng.choice([2, 4, 6])
    cfg = {"model_type": family, "vocab_size": rng.randint(5, 12), "intermediate_size": rng.randint(3, 8),
           "num_hidden_layers": rng.randint(2, 3) if option == "sliding_window" else rng.randint(1, 2), "num_attention_heads": heads, "num_key_value_heads": kv,
           "rope_theta": rng.choice([10000.0, 500.0, 1000000.0]), "rms_norm_eps": rng.choice([1e-6, 1e-5, 1e-2]),
           "tie_word_embeddings": rng.random() < 0.5, "max_position_embeddings": 16}
    explicit = option == "head_dim" or family == "qwen3"
    # an explicit head_dim other than hidden_size / heads, so that the q/o shapes tell them apart
    cfg["hidden_size"] = rng.choice([s for s in (4, 6, 8) if s != heads * head_dim]) if explicit else heads * head_dim
    if explicit:
        cfg["head_dim"] = head_dim
    if family in ("llama", "qwen3"):
        cfg["attention_bias"] = option == "attention_bias" or (family == "qwen3" and rng.random() < 0.5)
    if family == "llama":
        cfg["mlp_bias"] = option == "mlp_bias"
    if option in ("linear", "dynamic", "default"):
        cfg["rope_scaling"] = {"type" if rng.random() < 0.5 else "rope_type": option}
        if option != "default":
            cfg["rope_scaling"]["factor"] = rng.choice([2.0, 4.0, 8.0])
    if option == "llama3":
        # the old context put so that one wavelength 2 pi / f_i falls between the two thresholds
        # (interpolated), the shorter ones below (kept), the longer ones above (divided)
        high = rng.choice([2.0, 4.0])
        wavelen = 2 * math.pi * cfg["rope_theta"] ** (2 * rng.randint(1, head_dim // 2 - 1) / head_dim) if head_dim > 2 else 6.3
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": rng.choice([8.0, 32.0]), "low_freq_factor": 1.0,
                               "high_freq_factor": high,
                               "original_max_position_embeddings": int(wavelen * rng.uniform(1.0, high))}
    if family == "mistral":
        cfg["sliding_window"] = rng.randint(1, 5) if option == "sliding_window" else None
    if family in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = option == "sliding_window"
        cfg["sliding_window"] = rng.randint(1, 5)
        if option == "sliding_window" and rng.random() < 0.5:
            cfg["layer_types"] = [rng.choice(["full_attention", "sliding_attention"]) for _ in range(cfg["num_hidden_layers"])]
        else:
            cfg["max_window_layers"] = rng.randint(0, cfg["num_hidden_layers"])
    return cfg


FAMILY_OPTIONS = [("llama", "plain"), ("llama", "attention_bias"), ("llama", "mlp_bias"), ("llama", "head_dim"),
                  ("llama", "llama3"), ("llama", "linear"), ("llama", "dynamic"), ("llama", "default"),
                  ("qwen2", "plain"), ("qwen2", "sliding_window"), ("qwen3", "plain"), ("qwen3", "sliding_window"),
                  ("mistral", "plain"), ("mistral", "sliding_window"), ("mistral", "head_dim")]


def grid(t):
    """Values on a grid of 1/64: short in JSON, exact in binary."""
    return torch.round(t * 64) / 64


def short(t):
    """A double tensor with 14 significant digits: within 1e-14 of the value, a third shorter."""
    t = t.detach()
    return {"shape": list(t.shape), "data": [float(f"{v:.14g}") for v in t.reshape(-1).tolist()]}


def family_cases():
    """One case per (family, option): a random config, weights, a batch; logits, loss, gradients."""
    import random
    rng = random.Random(2026_12_01)
    torch.manual_seed(2212)
    cases = []
    for family, option in FAMILY_OPTIONS:
        cfg = family_config(rng, family, option)
        b, t = rng.randint(1, 2), rng.randint(5, 8)
        params = {}
        for name, shape in ref.parameter_shapes(cfg):
            params[name] = grid((1 + 0.1 * torch.randn(shape)) if "norm" in name else 0.4 * torch.randn(shape))
            params[name].requires_grad_(True)
        ids = torch.randint(0, cfg["vocab_size"], (b, t))
        targets = torch.randint(0, cfg["vocab_size"], (b, t))
        out = ref.logits(cfg, params, ids)
        loss = F.cross_entropy(out.reshape(-1, cfg["vocab_size"]), targets.reshape(-1))
        loss.backward()
        cases.append({"family": family, "option": option, "config": cfg, "ids": tensor(ids), "targets": tensor(targets),
                      "logits": short(out), "loss": loss.item(), "params": {k: tensor(v) for k, v in params.items()},
                      "grads": {k: short(v.grad) for k, v in params.items()}})
    return cases


def write(name, value):
    with open(os.path.join(HERE, name), "w") as f:
        json.dump(value, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    write("ops.json", {"torch": torch.__version__, "cases": op_cases()})
    write("llama.json", {"torch": torch.__version__, "cases": llama_cases()})
    write("llama_families.json", {"torch": torch.__version__, "cases": family_cases()})
