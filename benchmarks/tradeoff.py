#!/usr/bin/env python3
"""Runs remat_bench over models and modes and prints a Markdown table of medians.

    benchmarks/tradeoff.py [--bench build/release/benchmarks/remat_bench] [--rounds 3]
                           [--threads 1] [--models mlp,deep] [--steps 5]

Each round runs every mode of a model once, in order, so that a mode's time can be divided by
the `none` time of the same round: the ratios quoted are the medians of those per-round ratios,
which hold when the machine's speed drifts between rounds. Memory figures are deterministic.
Standard library only.
"""
import argparse
import json
import statistics
import subprocess
import sys

MODES = {
    "mlp": ["none", "every", "sqrt", "budget:24", "optimal:4"],
    "deep": ["none", "every", "sqrt", "budget:8", "optimal:8"],
}


def run(bench, model, mode, steps, threads):
    out = subprocess.run(
        [bench, "--model", model, "--mode", mode, "--steps", str(steps), "--threads", str(threads)],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def table(bench, model, rounds, steps, threads):
    modes = MODES[model]
    results = {m: [] for m in modes}
    for r in range(rounds):
        for m in modes:
            results[m].append(run(bench, model, m, steps, threads))
            print(f"  {model} round {r + 1}/{rounds} {m}: step {results[m][-1]['step_s']:.3f} s",
                  file=sys.stderr)
    lines = [
        f"| {model} mode | step (s) | step / none | fwd+bwd (s) | fwd+bwd / none | act peak (MiB) "
        "| predicted (MiB) | none / peak | recompute | loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    none = results["none"]
    for m in modes:
        rs = results[m]
        step_ratio = statistics.median(rs[i]["step_s"] / none[i]["step_s"] for i in range(rounds))
        fb_ratio = statistics.median(rs[i]["fwd_bwd_s"] / none[i]["fwd_bwd_s"] for i in range(rounds))
        peak = rs[-1]["act_peak_mb"]
        lines.append(
            f"| {m} | {statistics.median(r['step_s'] for r in rs):.3f} | {step_ratio:.2f} "
            f"| {statistics.median(r['fwd_bwd_s'] for r in rs):.3f} | {fb_ratio:.2f} "
            f"| {peak:.2f} | {rs[-1]['predicted_peak_mb']:.2f} | {none[-1]['act_peak_mb'] / peak:.1f} "
            f"| {rs[-1]['recompute']:.2f} | {rs[-1]['loss']:.6f} |")
    lines.append("")
    lines.append(f"{model}: {results['none'][-1]['threads']} thread(s), GEMM: {results['none'][-1]['gemm']}, "
                 f"{rounds} rounds of {steps} steps; times are medians, ratios medians of per-round ratios.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/release/benchmarks/remat_bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="mlp,deep")
    args = ap.parse_args()
    for model in args.models.split(","):
        print(table(args.bench, model, args.rounds, args.steps, args.threads))
        print()


if __name__ == "__main__":
    main()
