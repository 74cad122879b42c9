"""An independent PyTorch implementation of the Llama / Qwen2 decoder, written from Hugging Face's
modeling_llama.py / modeling_qwen2.py (torch 1.13 ships no `transformers`): RMSNorm, rotary
embeddings in the rotate-half layout, grouped-query causal attention with optional q/k/v bias,
a SwiGLU MLP, tied or untied head. Parameter names are Hugging Face's. Used by
make_reference.py to write the test suite's reference data, and by score_llama.py to score a
folder written by examples/train_llama."""

import math

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(time, dim, theta, offset, dtype):
    """Hugging Face's angles (LlamaRotaryEmbedding): inverse frequencies and position products in
    float32. Their cos and sin are taken in double (HF takes them in float32, within an ulp)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    positions = torch.arange(offset, offset + time, dtype=torch.int64).float()
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1).double()
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x: (B, H, T, D); cos, sin: (T, D)."""
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    b, g, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, g, n_rep, t, d).reshape(b, g * n_rep, t, d)


def gqa_attention(q, k, v, heads, kv_heads, theta, offset):
    """q: (B, T, H D), k, v: (B, T, G D) -> (B, T, H D), causal, RoPE inside."""
    b, t, c = q.shape
    d = c // heads
    q = q.view(b, t, heads, d).transpose(1, 2)
    k = k.view(b, t, kv_heads, d).transpose(1, 2)
    v = v.view(b, t, kv_heads, d).transpose(1, 2)
    cos, sin = rope_cos_sin(t, d, theta, offset, q.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads)
    scores = q @ k.transpose(2, 3) / math.sqrt(d)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ v).transpose(1, 2).reshape(b, t, c)


def parameter_shapes(cfg):
    """Hugging Face's parameter names and shapes, in the model's order."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    shapes = [("model.embed_tokens.weight", (v, h))]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.append((p + "input_layernorm.weight", (h,)))
        for name, out in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            shapes.append((p + f"self_attn.{name}.weight", (out, h)))
            if cfg.get("attention_bias", False):
                shapes.append((p + f"self_attn.{name}.bias", (out,)))
        shapes.append((p + "self_attn.o_proj.weight", (h, h)))
        shapes.append((p + "post_attention_layernorm.weight", (h,)))
        shapes.append((p + "mlp.gate_proj.weight", (i, h)))
        shapes.append((p + "mlp.up_proj.weight", (i, h)))
        shapes.append((p + "mlp.down_proj.weight", (h, i)))
    shapes.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings", False):
        shapes.append(("lm_head.weight", (v, h)))
    return shapes


def logits(cfg, params, ids):
    """ids: (B, T) int64 -> logits (B, T, V)."""
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    x = F.embedding(ids, params["model.embed_tokens.weight"])

    def proj(name, h):
        return F.linear(h, params[name + ".weight"], params.get(name + ".bias"))

    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, params[p + "input_layernorm.weight"], eps)
        a = gqa_attention(proj(p + "self_attn.q_proj", h), proj(p + "self_attn.k_proj", h), proj(p + "self_attn.v_proj", h),
                          heads, kv_heads, theta, 0)
        x = x + proj(p + "self_attn.o_proj", a)
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        x = x + proj(p + "mlp.down_proj", F.silu(proj(p + "mlp.gate_proj", h)) * proj(p + "mlp.up_proj", h))
    x = rms_norm(x, params["model.norm.weight"], eps)
    head = params["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else params["lm_head.weight"]
    return F.linear(x, head)
