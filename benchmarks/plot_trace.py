#!/usr/bin/env python3
"""Draws the live-bytes curve of one training step from remat trace files (Chrome trace event
format, written by `remat_bench --trace FILE` or remat::Trace::save_chrome_json), several plans
on one figure, and writes the curves as CSV beside the figure.

    benchmarks/plot_trace.py --out docs/figures/timeline_gpt none=none.json every=every.json sqrt=sqrt.json
"""
import argparse
import csv
import json
import sys


def live_curve(path):
    """(milliseconds, MiB) samples of the 'live bytes' counter, and the peak event's bytes."""
    with open(path, encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    samples = [(e["ts"] / 1000.0, e["args"]["live"] / 2**20) for e in events if e.get("ph") == "C"]
    peaks = [e["args"]["peak_bytes"] for e in events if e.get("ph") == "i" and e.get("name") == "peak"]
    if not samples:
        sys.exit(f"plot_trace.py: {path} has no 'live bytes' counter events")
    return samples, (peaks[0] / 2**20 if peaks else max(mib for _, mib in samples))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", metavar="LABEL=FILE", help="a trace file and its legend label")
    parser.add_argument("--out", required=True, help="output path without extension (.png and .csv are written)")
    parser.add_argument("--title", default="Live tensor bytes during one training step")
    args = parser.parse_args()

    curves = []
    for item in args.traces:
        label, sep, path = item.partition("=")
        if not sep:
            parser.error(f"expected LABEL=FILE, got {item!r}")
        samples, peak = live_curve(path)
        curves.append((label, samples, peak))

    with open(args.out + ".csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["plan", "ms", "live_mib"])
        for label, samples, _ in curves:
            writer.writerows((label, f"{ms:.3f}", f"{mib:.4f}") for ms, mib in samples)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=120)
    for label, samples, peak in curves:
        xs, ys = zip(*samples)
        ax.step(xs, ys, where="post", linewidth=1.2, label=f"{label} (peak {peak:.1f} MiB)")
    ax.set_xlabel("time in the step (ms)")
    ax.set_ylabel("live tensor bytes (MiB)")
    ax.set_title(args.title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(args.out + ".png")
    print(f"wrote {args.out}.png and {args.out}.csv")


if __name__ == "__main__":
    main()
