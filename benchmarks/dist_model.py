#!/usr/bin/env python3
"""Step time of a data-parallel job on paper (docs/distributed.md).

For N machines joined by links of B bit/s, each step all-reduces the fp32 gradients in buckets
with a ring: every machine sends and receives 2(N-1)/N x gradient bytes, in 2(N-1) messages per
bucket, each paying a latency alpha. All buckets but the last are reduced while backward still
runs; the last (the embeddings: their gradients are final when backward ends) cannot be hidden.
A bucket holds at most 25 MiB and at most an eighth of the gradient (DataParallel's layout).

    comm(N)  = 2(N-1)/N * G / B  +  buckets * 2(N-1) * alpha
    last(N)  = 2(N-1)/N * G_last / B  +  2(N-1) * alpha
    step(N)  = forward + max(backward, comm(N) - last(N)) + last(N) + update
    speed-up = N * step(1) / step(N)        (weak scaling: the same rows per machine)

The compute times are measured (dist_bench, train_gpt); the rest are the stated assumptions.
Prints the markdown tables of docs/distributed.md.
"""
import argparse


def ring(n, grad_bytes, buckets, last_bytes, link_bits, alpha):
    bw = link_bits / 8.0
    comm = 2 * (n - 1) / n * grad_bytes / bw + buckets * 2 * (n - 1) * alpha
    last = 2 * (n - 1) / n * last_bytes / bw + 2 * (n - 1) * alpha
    return comm, last


def bucket_count(grad, bucket_mb=25, first_mb=1):
    """DataParallel's layout, parameters aside: a first bucket, then full ones; none holds more
    than bucket_mb nor more than an eighth of the gradient bytes."""
    cap = min(bucket_mb * 2**20, grad / 8)
    first = min(first_mb * 2**20, cap)
    return 1 + max(0, -(-(grad - first) // cap)) if grad > first else 1


def table(name, params, forward, backward, update, tokens, buckets, last_bytes, alpha):
    grad = 4.0 * params
    one = forward + backward + update
    print(f"\n{name}: {params / 1e6:,.1f} M parameters, {grad / 2**20:,.1f} MiB of fp32 gradients in {int(buckets)} "
          f"buckets; one machine: forward {forward:.3g} s + backward {backward:.3g} s + update {update:.3g} s "
          f"= {one:.3g} s per step of {tokens:,} tokens\n")
    print("| machines | link | bytes sent per machine per step | all-reduce alone | exposed after backward | step | speed-up (ideal = machines) | tokens/s (job) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in (8, 64, 512):
        for gbit in (10, 100):
            comm, last = ring(n, grad, buckets, min(last_bytes, grad), gbit * 1e9, alpha)
            step = forward + max(backward, comm - last) + last + update
            exposed = step - one
            sent = 2 * (n - 1) / n * grad
            print(f"| {n} | {gbit} Gbit/s | {sent / 2**20:,.1f} MiB | {fmt(comm)} | {fmt(exposed)} | {fmt(step)} | "
                  f"{n * one / step:,.1f} | {n * tokens / step:,.0f} |")


def fmt(seconds):
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    return f"{seconds * 1e3:,.1f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alpha", type=float, default=30e-6, help="per-message latency in s (MPI over TCP)")
    ap.add_argument("--gpt-forward", type=float, required=True)
    ap.add_argument("--gpt-backward", type=float, required=True)
    ap.add_argument("--gpt-update", type=float, required=True)
    ap.add_argument("--gpt-buckets", type=int, required=True, help="dist_bench's buckets")
    ap.add_argument("--gpt-last-mb", type=float, required=True, help="dist_bench's last_bucket_mb")
    ap.add_argument("--llama-forward", type=float, required=True)
    ap.add_argument("--llama-backward", type=float, required=True)
    ap.add_argument("--llama-update", type=float, required=True)
    ap.add_argument("--llama-buckets", type=int, required=True, help="dist_bench --model llama's buckets")
    ap.add_argument("--llama-last-mb", type=float, required=True, help="its last_bucket_mb")
    ap.add_argument("--gflops", type=float, required=True, help="sustained GFLOP/s of one machine (measured)")
    ap.add_argument("--faster", type=float, default=32, help="a second 2B table for machines this much faster")
    args = ap.parse_args()
    # The gpt example (dist_bench defaults: 4 blocks, width 128, context 64, vocab 96, 16 rows).
    gpt_params = 826_112
    # its layout as dist_bench measures it: the bucket count and the last bucket's size
    table("gpt example", gpt_params, args.gpt_forward, args.gpt_backward, args.gpt_update, 16 * 64,
          args.gpt_buckets, args.gpt_last_mb * 2**20, args.alpha)
    # The llama example (train_llama's defaults: 6 layers, width 256, 4 query and 2 key/value
    # heads, SwiGLU 512, context 64, 16 rows; dist_bench --model llama --layers 6 --width 256).
    llama_params = 3_591_424
    table("llama example", llama_params, args.llama_forward, args.llama_backward, args.llama_update,
          16 * 64, args.llama_buckets, args.llama_last_mb * 2**20, args.alpha)
    # A 2B Qwen-class model: width 2048, 28 layers, vocab 248,000; grouped-query attention with 16
    # query and 8 key/value heads of 128, SwiGLU MLP of 6144, tied embeddings.
    width, layers, vocab, kv, ffn = 2048, 28, 248_000, 1024, 6144
    per_layer = width * (width + 2 * kv + width) + 3 * width * ffn + 2 * width
    params = layers * per_layer + vocab * width + width
    tokens = 4 * 2048  # 4 sequences of 2048 per machine per step
    flops = 6.0 * params * tokens + 6.0 * layers * tokens * 2048 * width  # matmuls + attention (causal)
    seconds = flops / (args.gflops * 1e9)
    # the update reads p, g, m, v and writes p, m, v: 28 bytes per parameter at an assumed 20 GB/s
    # its last bucket: the embedding (2 GB: a bucket of its own), final only when backward ends
    buckets = bucket_count(4.0 * params)
    table("2B Qwen-class model, machines like this one", params, seconds / 3, 2 * seconds / 3, 28.0 * params / 20e9,
          tokens, buckets, vocab * width * 4, args.alpha)
    fast = seconds / args.faster
    table(f"2B Qwen-class model, machines {args.faster:g} x faster", params, fast / 3, 2 * fast / 3,
          28.0 * params / 20e9, tokens, buckets, vocab * width * 4, args.alpha)


if __name__ == "__main__":
    main()
