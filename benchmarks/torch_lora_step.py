#!/usr/bin/env python3
"""One LoRA fine-tuning step of a Qwen2.5-0.5B-shaped decoder in PyTorch, on CPU: the PyTorch
side of the side-by-side with remat's finetune. Run it with Debian 12's /usr/bin/python3 (its
python3-torch 1.13 and numpy); the pyenv python3 first on PATH has no torch.

    /usr/bin/python3 benchmarks/torch_lora_step.py [--batch B] [--seq T] [--steps N] [--threads K]
        [--checkpoint every|none] [--loss plain|chunked] [--chunk-rows R] [--rank R] [--alpha A]
        [--lora-dropout P] [--openblas-core auto|installed|NAME] [--mmap-threshold-kib K] [--tiny]
        [--self-check] [--json]

The model is Qwen2 as in Hugging Face's modeling_qwen2.py, written out here (no transformers):
embedding 151,936 x 896, 24 layers of RMSNorm -> grouped-query attention (14 query heads, 2
key/value heads of 64, q/k/v with bias, rotary theta 1e6 in the rotate_half convention, causal
softmax) -> o_proj, residual; RMSNorm -> SwiGLU MLP (4864), residual; final RMSNorm; head tied to
the embedding. Weights are random normal(0, 0.02), norms 1, all frozen and float32: this CPU
build has no bitsandbytes, so where remat's comparable run stores the frozen projections in NF4,
PyTorch keeps them in float32 (1.84 GiB of weights; the RSS figures include them).
LoRA (rank 16, alpha 32, as PEFT: A kaiming-uniform, B zeros) sits on all seven linears of every
layer and is all that trains, with AdamW (lr 2e-4, no weight decay). Each decoder layer runs
under torch.utils.checkpoint (non-reentrant) unless --checkpoint none. --loss chunked computes
the tied head and cross entropy --chunk-rows rows at a time, each chunk checkpointed, so the full
B x T x 151,936 logits never exist (remat's loss is chunked); plain makes the full logits.

A step is forward + backward + optimizer.step() + zero_grad(set_to_none=True) on one fixed random
batch (targets random ids, mean over all tokens). Reported: each step's seconds, the median of the
steps after the first, tokens/s = B*T / median, and the process's peak RSS (ru_maxrss) after
building the model and after the run. --json adds one final JSON line. --self-check runs the
correctness checks on the --tiny shape (float64) and exits.

Memory: glibc's malloc raises its mmap threshold (up to 32 MiB) each time a large block is freed,
after which the step's activation-sized blocks come from the heap, which fragments: RSS then grows
step after step well beyond the tensors alive (measured with 2 of the 24 layers: +385 MiB after
one step against a 122 MiB allocator peak). That is what a user gets, so it is the default;
--mmap-threshold-kib K fixes the threshold with mallopt (as MALLOC_MMAP_THRESHOLD_ would), so
freed blocks go back to the system and the RSS increment tracks the live tensors.

Threads and kernels: torch.set_num_threads() does not reach the OpenBLAS that Debian's PyTorch
calls for its GEMMs, so OPENBLAS_NUM_THREADS / OMP_NUM_THREADS are set before torch is imported.
Debian 12's OpenBLAS does not know recent CPUs (Sapphire Rapids, ...) and falls back to its SSE3
"Prescott" kernels there (measured 19 GFLOP/s against 66 with SkylakeX on one core); remat picks
its kernels by itself, so --openblas-core auto (the default) sets OPENBLAS_CORETYPE from the CPU's
flags, as torch_reference.py --config best does; `installed` leaves OpenBLAS's own choice.
"""
import argparse
import ctypes
import json
import math
import os
import resource
import statistics
import time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--checkpoint", default="every", choices=["every", "none"])
ap.add_argument("--loss", default="chunked", choices=["plain", "chunked"])
ap.add_argument("--chunk-rows", type=int, default=64)
ap.add_argument("--rank", type=int, default=16)
ap.add_argument("--alpha", type=float, default=32.0)
ap.add_argument("--lora-dropout", type=float, default=0.0)
ap.add_argument("--mmap-threshold-kib", type=int, default=0, help="mallopt(M_MMAP_THRESHOLD); 0: glibc's")
ap.add_argument("--openblas-core", default="auto", help="auto | installed | an OpenBLAS core name")
ap.add_argument("--tiny", action="store_true", help="hidden 64, 2 layers, vocab 1000, 4/2 heads")
ap.add_argument("--self-check", action="store_true", help="check the model code on the tiny shape")
ap.add_argument("--json", action="store_true")
args = ap.parse_args()


def cpu_info():
    """The CPU's model name and flags, from /proc/cpuinfo."""
    name, flags = "unknown", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown":
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return name, flags


CPU, FLAGS = cpu_info()
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)
os.environ.pop("OPENBLAS_CORETYPE", None)  # read by OpenBLAS when torch loads it
if args.openblas_core == "auto":
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= FLAGS:
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    elif {"avx2", "fma"} <= FLAGS:
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"
elif args.openblas_core != "installed":
    os.environ["OPENBLAS_CORETYPE"] = args.openblas_core

import torch  # noqa: E402  (after the OpenBLAS variables)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

torch.set_num_threads(args.threads)
# Subnormal floats (AdamW's second moments, tiny gradients) run tens of times slower on many x86
# cores; remat computes with them flushed (FTZ/DAZ, core/float_mode.hpp), so PyTorch does too.
torch.set_flush_denormal(True)
if args.mmap_threshold_kib:  # before the model's tensors are allocated; M_MMAP_THRESHOLD is -3
    ctypes.CDLL("libc.so.6").mallopt(-3, args.mmap_threshold_kib * 1024)

QWEN = dict(vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, inter=4864, theta=1e6, eps=1e-6)
TINY = dict(vocab=1000, hidden=64, layers=2, heads=4, kv_heads=2, inter=172, theta=1e6, eps=1e-6)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class LoRALinear(nn.Module):
    """A frozen float32 linear plus PEFT's LoRA: y = x W^T + b + (alpha / r) * B(A(dropout(x)))."""

    def __init__(self, n_in, n_out, bias, rank, alpha, dropout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in).normal_(0, 0.02), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(n_out), requires_grad=False) if bias else None
        self.lora_A = nn.Parameter(torch.empty(rank, n_in))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # PEFT's init of A (nn.Linear's default)
        self.lora_B = nn.Parameter(torch.zeros(n_out, rank))
        self.scaling, self.dropout = alpha / rank, nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x):
        lora = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
        return F.linear(x, self.weight, self.bias) + self.scaling * lora


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def position_tables(t, d, theta):
    """HF's rotary cos and sin (t x d): position p turns dims j and j + d/2 by p * theta^(-2j/d);
    and the causal mask (t x t), True above the diagonal: the future."""
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin(), torch.ones(t, t, dtype=torch.bool).triu(1)


class DecoderLayer(nn.Module):
    def __init__(self, c, lora):
        super().__init__()
        h, d = c["hidden"], c["hidden"] // c["heads"]
        self.heads, self.kv_heads, self.head_dim = c["heads"], c["kv_heads"], d
        self.input_layernorm = RMSNorm(h, c["eps"])
        self.q_proj = LoRALinear(h, c["heads"] * d, True, **lora)
        self.k_proj = LoRALinear(h, c["kv_heads"] * d, True, **lora)
        self.v_proj = LoRALinear(h, c["kv_heads"] * d, True, **lora)
        self.o_proj = LoRALinear(c["heads"] * d, h, False, **lora)
        self.post_attention_layernorm = RMSNorm(h, c["eps"])
        self.gate_proj = LoRALinear(h, c["inter"], False, **lora)
        self.up_proj = LoRALinear(h, c["inter"], False, **lora)
        self.down_proj = LoRALinear(c["inter"], h, False, **lora)

    def attention(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # B, 14, T, 64
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # B, 2, T, 64
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads  # HF's repeat_kv: query head i reads key/value head i // group
        k, v = (z.repeat_interleave(group, dim=1) for z in (k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        y = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.input_layernorm(x), cos, sin, mask)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Qwen2LoRA(nn.Module):
    def __init__(self, c, rank, alpha, dropout):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Parameter(torch.empty(c["vocab"], c["hidden"]).normal_(0, 0.02), requires_grad=False)
        lora = dict(rank=rank, alpha=alpha, dropout=dropout)
        self.layers = nn.ModuleList(DecoderLayer(c, lora) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"], c["eps"])

    def hidden(self, ids, ckpt):
        t, d = ids.shape[1], self.c["hidden"] // self.c["heads"]
        cos, sin, mask = position_tables(t, d, self.c["theta"])
        x = F.embedding(ids, self.embed_tokens)
        for layer in self.layers:
            x = checkpoint(layer, x, cos, sin, mask, use_reentrant=False) if ckpt else layer(x, cos, sin, mask)
        return self.norm(x).reshape(-1, self.c["hidden"])

    def loss(self, ids, targets, ckpt, chunked, chunk_rows):
        h, targets = self.hidden(ids, ckpt), targets.reshape(-1)
        if not chunked:
            return F.cross_entropy(F.linear(h, self.embed_tokens), targets)
        # Each chunk's logits live only inside its checkpoint; backward recomputes them chunk by chunk.
        head = lambda hc, tc: F.cross_entropy(F.linear(hc, self.embed_tokens), tc, reduction="sum")  # noqa: E731
        total = sum(checkpoint(head, h[i:i + chunk_rows], targets[i:i + chunk_rows], use_reentrant=False)
                    for i in range(0, h.shape[0], chunk_rows))
        return total / h.shape[0]


def adamw(params):
    # 1.13's AdamW has no fused CPU kernel; foreach=True (the multi-tensor path) updates the 336
    # adapter tensors in a few batched ops instead of a Python loop over them. Older builds: loop.
    try:
        return torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0, foreach=True), "foreach"
    except TypeError:
        return torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0), "for-loop"


def self_check():
    """On the tiny shape (float64): q/k/v shapes, attention (rotary, grouped heads, causal mask)
    against a naive loop, and equal loss and gradients with and without checkpointing, plain and chunked."""
    torch.manual_seed(0)
    m = Qwen2LoRA(TINY, 4, 8.0, 0.0).double()
    for p in m.parameters():  # B = 0 would leave every A's gradient 0: give the adapters some weight
        if p.requires_grad:
            p.data.normal_(0, 0.1)
    ids, targets = torch.randint(0, 1000, (2, 13)), torch.randint(0, 1000, (2, 13))
    layer, x = m.layers[0], torch.randn(2, 13, 64, dtype=torch.float64)
    assert layer.q_proj(x).shape == (2, 13, 64) and layer.k_proj(x).shape == layer.v_proj(x).shape == (2, 13, 32)
    # one layer's attention against a naive loop: head h reads key/value head h // 2, each pair of
    # dims (j, j + 8) turned by position * 1e6^(-j/8), softmax over positions 0..t only (causal)
    inv = 1.0 / 1e6 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)

    def turn(z, pos):
        c, s, z1, z2 = (pos * inv).cos(), (pos * inv).sin(), z[..., :8], z[..., 8:]
        return torch.cat((z1 * c - z2 * s, z2 * c + z1 * s), dim=-1)
    q, k, v = (f(x).view(2, 13, -1, 16) for f in (layer.q_proj, layer.k_proj, layer.v_proj))
    out = torch.zeros(2, 13, 4, 16, dtype=torch.float64)
    for h in range(4):
        for t in range(13):
            keys = torch.stack([turn(k[:, s, h // 2], s) for s in range(t + 1)], dim=1)
            w = torch.softmax((keys @ turn(q[:, t, h], t).unsqueeze(-1)).squeeze(-1) / 4.0, dim=-1)
            out[:, t, h] = (w.unsqueeze(-1) * v[:, :t + 1, h // 2]).sum(1)
    with torch.no_grad():
        got = layer.attention(x, *position_tables(13, 16, 1e6))
        assert torch.allclose(got, layer.o_proj(out.reshape(2, 13, 64)), atol=1e-6)
    grads = []
    for ckpt, chunked in ((False, False), (True, False), (True, True), (False, True)):
        m.zero_grad(set_to_none=True)
        loss = m.loss(ids, targets, ckpt, chunked, 5)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in m.parameters() if p.requires_grad]))
    for loss, g in grads[1:]:
        assert torch.allclose(loss, grads[0][0]) and all(torch.allclose(a, b) for a, b in zip(g, grads[0][1]))
    print("self-check passed: q/k/v shapes, attention == naive loop, "
          "checkpoint every == none and chunked == plain (loss and every adapter gradient)")


def main():
    if args.self_check:
        return self_check()
    torch.manual_seed(1)
    c = TINY if args.tiny else QWEN
    model = Qwen2LoRA(c, args.rank, args.alpha, args.lora_dropout)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_params, n_train = sum(p.numel() for p in model.parameters()), sum(p.numel() for p in trainable)
    optimizer, opt_kind = adamw(trainable)
    ids = torch.randint(0, c["vocab"], (args.batch, args.seq))
    targets = torch.randint(0, c["vocab"], (args.batch, args.seq))
    ckpt, chunked = args.checkpoint == "every", args.loss == "chunked"
    rss_mib = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # noqa: E731 (KiB on Linux)
    rss_before = rss_mib()

    step_seconds, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = model.loss(ids, targets, ckpt, chunked, args.chunk_rows)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_seconds.append(time.perf_counter() - t0)
        losses.append(loss.item())
    median = statistics.median(step_seconds[1:] if len(step_seconds) > 1 else step_seconds)
    tokens_per_second, peak = args.batch * args.seq / median, rss_mib()

    core = os.environ.get("OPENBLAS_CORETYPE", "(OpenBLAS's own choice)")
    malloc = f"mmap threshold {args.mmap_threshold_kib} KiB" if args.mmap_threshold_kib else "glibc's malloc"
    print(f"torch {torch.__version__} on {CPU}, {args.threads} threads, OpenBLAS core {core}, denormals flushed, "
          + malloc)
    print(f"model {'tiny' if args.tiny else 'Qwen2.5-0.5B shape'}: {n_params:,} parameters, {n_train:,} trainable "
          f"(LoRA r {args.rank}, alpha {args.alpha:g}, dropout {args.lora_dropout:g}); frozen weights float32")
    print(f"batch {args.batch} x seq {args.seq}, checkpoint {args.checkpoint}, loss {args.loss}"
          + (f" ({args.chunk_rows} rows a chunk)" if chunked else "") + f", AdamW {opt_kind}")
    print("step seconds  " + "  ".join(f"{s:.3f}" for s in step_seconds) + "   (loss " +
          "  ".join(f"{v:.4f}" for v in losses) + ")")
    print(f"median after the first {median:.3f} s, {tokens_per_second:.1f} tokens/s")
    print(f"peak RSS {peak:.1f} MiB after the run, {rss_before:.1f} MiB before the first step "
          f"(+{peak - rss_before:.1f} MiB for the steps)")
    if args.json:
        print(json.dumps({
            "torch_version": torch.__version__, "threads": args.threads, "batch": args.batch, "seq": args.seq,
            "checkpoint": args.checkpoint, "loss": args.loss, "step_seconds": [round(s, 4) for s in step_seconds],
            "median_step_seconds": round(median, 4), "tokens_per_second": round(tokens_per_second, 2),
            "peak_rss_mib": round(peak, 1), "rss_before_steps_mib": round(rss_before, 1),
            "parameters": n_params, "trainable": n_train, "cpu": CPU, "openblas_coretype": core,
            "mmap_threshold_kib": args.mmap_threshold_kib or None}))


if __name__ == "__main__":
    main()
