"""An independent PyTorch implementation of the Llama / Mistral / Qwen2 / Qwen3 decoders, written
from Hugging Face's modeling_llama.py, modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py,
modeling_rope_utils.py and masking_utils.py (torch 1.13 ships no `transformers`): RMSNorm, rotary
embeddings in the rotate-half layout with the rope types default, linear, dynamic and llama3,
grouped-query causal attention with sliding windows, biases per family (Llama's attention_bias on
q, k, v and o, Qwen2's on q, k, v only, Qwen3's on q, k, v and o), Qwen3's per-head q_norm and
k_norm before RoPE, an explicit head_dim, a SwiGLU MLP with Llama's mlp_bias, tied or untied
head. Parameter names are Hugging Face's. Configs are config.json dicts, read here the way
Hugging Face's config classes read them. Used by make_reference.py to write the test suite's
reference data, and by score_llama.py to score a folder written by examples/train_llama."""

import math

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def default_inv_freq(theta, dim):
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def inv_freq(dim, theta, scaling, seq_len):
    """modeling_rope_utils.py's init functions, in float32 as there. `scaling` is the rope_scaling
    dict (None: default); seq_len the last position + 1, which only dynamic reads (HF's forward
    passes it as a 0-dim int64 tensor once it exceeds max_position_embeddings)."""
    kind = "default" if scaling is None else scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return default_inv_freq(theta, dim)
    factor = scaling["factor"]
    if kind == "linear":
        return default_inv_freq(theta, dim) / factor
    if kind == "dynamic":
        max_pos = scaling["max_position_embeddings"]
        if seq_len > max_pos:
            s = torch.tensor(seq_len, dtype=torch.int64)
            base = theta * ((factor * s / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        else:
            base = theta
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind == "llama3":
        inv = default_inv_freq(theta, dim)
        low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv
        inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_llama)
    raise ValueError(f"rope type {kind} not in the reference")


def rope_cos_sin(time, dim, theta, offset, dtype, scaling=None):
    """Hugging Face's angles (LlamaRotaryEmbedding): inverse frequencies and position products in
    float32. Their cos and sin are taken in double (HF takes them in float32, within an ulp); the
    attention scaling of these rope types is 1."""
    inv = inv_freq(dim, theta, scaling, offset + time)
    positions = torch.arange(offset, offset + time, dtype=torch.int64).float()
    freqs = torch.outer(positions, inv)
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


def gqa_attention(q, k, v, heads, kv_heads, theta, offset, window=None, scaling=None, q_norm=None, k_norm=None):
    """q: (B, T, H D), k, v: (B, T, G D) -> (B, T, H D), causal, RoPE inside. A window w lets
    query i see keys j with i - w < j <= i (masking_utils.sliding_window_overlay); q_norm and
    k_norm (Qwen3) are functions applied to each head vector before RoPE."""
    b, t, c = q.shape
    d = c // heads
    q = q.view(b, t, heads, d)
    k = k.view(b, t, kv_heads, d)
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = v.view(b, t, kv_heads, d).transpose(1, 2)
    cos, sin = rope_cos_sin(t, d, theta, offset, q.dtype, scaling)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads)
    scores = q @ k.transpose(2, 3) / math.sqrt(d)
    qi = torch.arange(t)[:, None]
    kj = torch.arange(t)[None, :]
    allowed = kj <= qi
    if window is not None:
        allowed = allowed & (kj > qi - window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ v).transpose(1, 2).reshape(b, t, heads * d)


class Family:
    """What a config.json means, read as Hugging Face's config class of its model_type reads it."""

    def __init__(self, cfg):
        self.type = cfg.get("model_type", "llama")
        t = self.type
        self.hidden, self.layers = cfg["hidden_size"], cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or (8 if t == "mistral" else self.heads)
        default_head_dim = 128 if t == "qwen3" else None
        self.head_dim = cfg.get("head_dim", default_head_dim) or self.hidden // self.heads
        bias = cfg.get("attention_bias", False)
        self.qkv_bias = True if t == "qwen2" else (bias if t in ("llama", "qwen3") else False)
        self.o_bias = bias if t in ("llama", "qwen3") else False
        self.mlp_bias = cfg.get("mlp_bias", False) if t == "llama" else False
        self.qk_norm = t == "qwen3"
        self.theta = cfg.get("rope_theta", 10000.0)
        self.scaling = cfg.get("rope_scaling")
        if self.scaling is not None:
            self.scaling = dict(self.scaling, max_position_embeddings=cfg.get("max_position_embeddings"))
        self.windows = [None] * self.layers
        if t == "mistral":
            self.windows = [cfg.get("sliding_window", 4096)] * self.layers
        elif t in ("qwen2", "qwen3"):
            window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
            types = cfg.get("layer_types") or [
                "sliding_attention" if window is not None and i >= cfg.get("max_window_layers", 28) else "full_attention"
                for i in range(self.layers)]
            self.windows = [window if kind == "sliding_attention" else None for kind in types]


def parameter_shapes(cfg):
    """Hugging Face's parameter names and shapes, in the model's order."""
    fam = Family(cfg)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = fam.head_dim
    q, kv = fam.heads * d, fam.kv_heads * d
    shapes = [("model.embed_tokens.weight", (v, h))]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.append((p + "input_layernorm.weight", (h,)))
        for name, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes.append((p + f"self_attn.{name}.weight", (out, h)))
            if fam.qkv_bias:
                shapes.append((p + f"self_attn.{name}.bias", (out,)))
        shapes.append((p + "self_attn.o_proj.weight", (h, q)))
        if fam.o_bias:
            shapes.append((p + "self_attn.o_proj.bias", (h,)))
        if fam.qk_norm:
            shapes.append((p + "self_attn.q_norm.weight", (d,)))
            shapes.append((p + "self_attn.k_norm.weight", (d,)))
        shapes.append((p + "post_attention_layernorm.weight", (h,)))
        for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
            shapes.append((p + f"mlp.{name}.weight", shape))
            if fam.mlp_bias:
                shapes.append((p + f"mlp.{name}.bias", shape[:1]))
    shapes.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings", False):
        shapes.append(("lm_head.weight", (v, h)))
    return shapes


def logits(cfg, params, ids):
    """ids: (B, T) int64 -> logits (B, T, V)."""
    fam = Family(cfg)
    eps = cfg["rms_norm_eps"]
    x = F.embedding(ids, params["model.embed_tokens.weight"])

    def proj(name, h):
        return F.linear(h, params[name + ".weight"], params.get(name + ".bias"))

    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, params[p + "input_layernorm.weight"], eps)
        norms = {}
        if fam.qk_norm:
            norms = {"q_norm": lambda y, w=params[p + "self_attn.q_norm.weight"]: rms_norm(y, w, eps),
                     "k_norm": lambda y, w=params[p + "self_attn.k_norm.weight"]: rms_norm(y, w, eps)}
        a = gqa_attention(proj(p + "self_attn.q_proj", h), proj(p + "self_attn.k_proj", h), proj(p + "self_attn.v_proj", h),
                          fam.heads, fam.kv_heads, fam.theta, 0, fam.windows[layer], fam.scaling, **norms)
        x = x + proj(p + "self_attn.o_proj", a)
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        x = x + proj(p + "mlp.down_proj", F.silu(proj(p + "mlp.gate_proj", h)) * proj(p + "mlp.up_proj", h))
    x = rms_norm(x, params["model.norm.weight"], eps)
    head = params["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else params["lm_head.weight"]
    return F.linear(x, head)
