#!/usr/bin/env python3
"""The remat_bench models and modes in PyTorch, printing the same JSON line.

    torch_reference.py --model {mlp,deep,gpt} --mode {none,every,sqrt,plan:<file>}
                       [--steps N] [--threads T] [--config {installed,best,fallback}]
                       [--dtype {f32,bf16}]

Runs with Debian's python3-torch (1.13, CPU). A training step is forward, cross-entropy, backward
and an AdamW update, as in remat_bench. Checkpointing uses torch.utils.checkpoint (non-reentrant);
`every` checkpoints every layer but the last, `sqrt` cuts the layers as checkpoint_sequential does
with ceil(sqrt(n)) segments (the last runs plainly; 1.13's checkpoint_sequential itself is
reentrant-only, so each segment goes through checkpoint(use_reentrant=False)), and `plan:<file>`
applies the top-level segments of a remat plan written by `remat_bench --print-plan FILE` (plans
whose segments keep outputs under a save policy are refused: 1.13 has no such policies).

Threads: torch.set_num_threads() does not reach the OpenBLAS that Debian's PyTorch calls for its
GEMMs, so this script also sets OPENBLAS_NUM_THREADS and OMP_NUM_THREADS before importing torch;
without them a "1-thread" PyTorch step runs its GEMMs on every core.

Configurations: `installed` runs PyTorch as a user would get it: OPENBLAS_CORETYPE removed from
the environment (so Debian's OpenBLAS picks its kernels from its own CPU table) and denormals not
flushed. `best` gives it what remat does by itself: OpenBLAS's kernels for the CPU's widest
instructions (SkylakeX for AVX-512, Haswell for AVX2 + FMA, read from /proc/cpuinfo's flags) and
torch.set_flush_denormal(True). `fallback` is `installed` on a CPU newer than OpenBLAS's table,
simulated: OpenBLAS forced to its SSE3 "Prescott" kernels, which Debian 12's OpenBLAS falls back to
on such CPUs (measured on an Intel Xeon with AVX-512: 30 GFLOP/s against 137). Start remat_bench
with OPENBLAS_CORETYPE=Prescott beside it to see remat re-select its kernels in the same situation.
The JSON line names the configuration, the kernels and the mode.

`--dtype bf16` runs the forward pass (and the loss) under torch.autocast("cpu",
dtype=torch.bfloat16), PyTorch's own BF16 training: GEMMs in bfloat16 with float32 weights,
gradients and AdamW (remat_bench --dtype bf16's counterpart). AdamW runs its foreach kernels
either way, PyTorch's fastest.

Activation memory: with torch.profiler's profile_memory, PyTorch's CPU allocator records every
allocation and free with its size (Kineto "[memory]" events, in order). The running sum of those
sizes over one forward + backward, minus its starting value, peaks at act_peak_mb: the same
definition as remat's counting allocator (tensor bytes live above those live before the step).
The profiled step is a separate step from the timed ones, so the profiler costs no time.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp", choices=["mlp", "deep", "gpt"])
    ap.add_argument("--mode", default="none")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--config", default="installed", choices=["installed", "best", "fallback"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    return ap.parse_args()


def best_openblas_core():
    """OpenBLAS's kernel family for the CPU's widest instructions, from the CPU's flags."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


args = parse()
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)
os.environ.pop("OPENBLAS_CORETYPE", None)  # OpenBLAS reads it when torch loads it
if args.config == "best" and best_openblas_core():
    os.environ["OPENBLAS_CORETYPE"] = best_openblas_core()
if args.config == "fallback":
    os.environ["OPENBLAS_CORETYPE"] = "Prescott"

import torch  # noqa: E402  (after the thread variables)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

torch.set_num_threads(args.threads)
torch.set_flush_denormal(args.config == "best")
torch.manual_seed(1)


class Block(nn.Module):
    """GPT-2 pre-LN block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        y = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def build(model):
    """Layers to checkpoint, the chain's input, and the loss of the chain's output."""
    if model in ("mlp", "deep"):
        n, width, batch, act = (32, 1024, 256, "gelu") if model == "mlp" else (1000, 256, 64, "tanh")
        layers = [nn.Sequential(nn.Linear(width, width), nn.GELU(approximate="tanh") if act == "gelu" else nn.Tanh())
                  for _ in range(n)]
        x = torch.randn(batch, width)
        targets = torch.randint(0, width, (batch,))
        return layers, lambda: x, lambda y: F.cross_entropy(y, targets), [p for l in layers for p in l.parameters()]
    vocab, context, width, n, batch = 256, 256, 256, 8, 8
    wte, wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
    layers = [Block(width, 4) for _ in range(n)]
    ln_f, head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
    ids = torch.randint(0, vocab, (batch, context))
    targets = torch.randint(0, vocab, (batch * context,))
    positions = torch.arange(context)
    params = [p for m in [wte, wpe, ln_f, head, *layers] for p in m.parameters()]
    return (layers, lambda: wte(ids) + wpe(positions),
            lambda y: F.cross_entropy(head(ln_f(y)).view(-1, vocab), targets), params)


def segments_for(mode, n):
    """Top-level [begin, end) runs to checkpoint."""
    if mode == "none":
        return []
    if mode == "every":
        return [(i, i + 1) for i in range(n - 1)]
    if mode == "sqrt":  # checkpoint_sequential's partition: k runs of n // k layers, the rest plain
        k = math.ceil(math.sqrt(n))
        size = n // k
        return [(i * size, (i + 1) * size) for i in range(k - 1)]
    if mode.startswith("plan:"):
        with open(mode[5:]) as f:
            plan = json.load(f)
        kept = [p for p in plan.get("policies", []) if p != "save_nothing"]
        if kept:  # torch.utils.checkpoint keeps nothing inside a segment before PyTorch 2.4
            raise SystemExit(f"torch_reference: PyTorch {torch.__version__} cannot run save policies ({', '.join(kept)})")
        return [tuple(s) for s in plan["segments"]]
    raise SystemExit(f"torch_reference: unknown mode {mode}")


def run_chain(layers, x, mode):
    runs = segments_for(mode, len(layers))
    starts = {b: e for b, e in runs}
    i = 0
    while i < len(layers):
        if i in starts:
            e = starts[i]
            x = checkpoint(lambda z, b=i, e=e: run_range(layers, b, e, z), x, use_reentrant=False)
            i = e
        else:
            x = layers[i](x)
            i += 1
    return x


def run_range(layers, begin, end, x):
    for layer in layers[begin:end]:
        x = layer(x)
    return x


def peak_of_step(step):
    """Peak bytes PyTorch's CPU allocator held during step() above what it held before."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_us()):  # stable: same-microsecond events keep their order
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def main():
    layers, chain_input, loss_of, params = build(args.model)
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=True)
    fwd_bwd_loss = {}

    def forward_backward():
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = loss_of(run_chain(layers, chain_input(), args.mode))
        t1 = time.perf_counter()
        loss.backward()
        fwd_bwd_loss.update(fwd=t1 - t0, fwd_bwd=time.perf_counter() - t0, loss=loss.item())

    def train_step():
        t0 = time.perf_counter()
        forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # keep gradient buffers, as remat does
        return time.perf_counter() - t0

    train_step()  # warm-up: gradients and AdamW state
    peak = peak_of_step(forward_backward)
    optimizer.zero_grad(set_to_none=False)
    steps, fwds, fwd_bwds = [], [], []
    for _ in range(args.steps):
        steps.append(train_step())
        fwds.append(fwd_bwd_loss["fwd"])
        fwd_bwds.append(fwd_bwd_loss["fwd_bwd"])
    print(json.dumps({
        "model": args.model, "mode": args.mode, "dtype": args.dtype, "threads": args.threads,
        "steps": args.steps,
        "step_s": round(statistics.median(steps), 4), "fwd_s": round(statistics.median(fwds), 4),
        "fwd_bwd_s": round(statistics.median(fwd_bwds), 4), "act_peak_mb": round(peak / 2**20, 2),
        "loss": round(fwd_bwd_loss["loss"], 6), "framework": f"torch {torch.__version__}",
        "config": args.config, "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "(its own choice)"),
        "flush_denormals": args.config == "best",
    }))


if __name__ == "__main__":
    main()
