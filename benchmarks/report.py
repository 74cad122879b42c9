#!/usr/bin/env python3
"""Regenerates docs/benchmarks.md, its figures and its raw data, from measurements.

    benchmarks/report.py [--build build/release] [--rounds 3] [--steps 5] [--docs docs]
    benchmarks/report.py --frontier [--build ...]   (only docs/figures/frontier_gpt.png)

Measures, on this machine:
  - the single-precision GEMM rate (benchmarks/ops_bench);
  - remat_bench over models x modes x thread counts, and benchmarks/torch_reference.py (PyTorch)
    on the same models and modes, in interleaved rounds: each round runs every configuration once,
    remat then PyTorch, so that the ratios quoted (remat / PyTorch, mode / none) are medians of
    ratios of runs made one after the other;
  - remat_bench --sweep for each model (the figures).
Writes docs/benchmarks.md, docs/figures/sweep_*.{csv,png} (remat_bench writes the CSV, this script
draws it with matplotlib, PyTorch's points of the same run on the same axes, and writes them to
docs/figures/sweep_*_torch.csv) and docs/data/report.json. Needs /usr/bin/python3 with Debian's
python3-matplotlib, and python3-torch for the PyTorch side. About 45 minutes.

    benchmarks/report.py --plot-only    # redraws the figures from docs/data/report.json and the CSVs
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

MODELS = {
    # model: (full description, budget MiB, binomial slots)
    "mlp": ("32 x (Linear 1024->1024 + GELU), batch 256", 24, 4),
    "deep": ("1000 x (Linear 256->256 + tanh), batch 64", 8, 8),
    "gpt": ("8 blocks, width 256, 4 heads, context 256, batch 8, vocabulary 256", 96, 2),
}
TORCH_MODES = ["none", "every", "sqrt", "budget"]  # budget: remat's plan, applied by torch_reference


# Everything runs as on a user's machine: without the OpenBLAS variables this project's
# environment sets (remat chooses kernels itself; torch_reference.py sets what its config says).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=CLEAN_ENV).stdout
    return json.loads(out.strip().splitlines()[-1])


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def measure(args, bench, torch_ref, gemm_peak):
    """results[(model, threads, mode, framework)] = list of runs, one per round."""
    results = {}
    plan_file = os.path.join(args.docs, "data", "plan.json")
    for r in range(args.rounds):
        for model, (_, budget, slots) in MODELS.items():
            for threads in (1, 2):
                modes = ["none", "every", "sqrt", f"budget:{budget}"]
                if threads == 1:
                    modes.append(f"optimal:{slots}")
                for mode in modes:
                    cmd = [bench, "--model", model, "--mode", mode, "--steps", str(args.steps), "--threads", str(threads),
                           "--gemm-peak", str(gemm_peak)]
                    results.setdefault((model, threads, mode, "remat"), []).append(run_json(cmd))
                    if mode.startswith("budget"):
                        # PyTorch 1.13 cannot keep a GEMM's output inside a segment, so its twin
                        # runs the layer-level plan for the same budget
                        run_json([bench, "--model", model, "--mode", mode.replace("budget:", "budget_layers:"),
                                  "--steps", "1", "--threads", str(threads), "--gemm-peak", str(gemm_peak),
                                  "--print-plan", plan_file])
                    if mode.split(":")[0] in TORCH_MODES and not args.no_torch:
                        tmode = f"plan:{plan_file}" if mode.startswith("budget") else mode
                        torch_cmd = ["/usr/bin/python3", torch_ref, "--model", model, "--mode", tmode, "--steps", str(args.steps),
                                     "--threads", str(threads)]
                        results.setdefault((model, threads, mode, "torch"), []).append(run_json(torch_cmd + ["--config", "installed"]))
                        if mode == "none":  # PyTorch's best configuration too: right kernels, denormals flushed
                            results.setdefault((model, threads, mode, "torch_best"), []).append(run_json(torch_cmd + ["--config", "best"]))
                    got = results[(model, threads, mode, "remat")][-1]
                    log(f"round {r + 1}/{args.rounds} {model} {threads}t {mode}: remat {got['step_s']:.3f} s"
                        + (f", torch {results[(model, threads, mode, 'torch')][-1]['step_s']:.3f} s"
                           if (model, threads, mode, "torch") in results and len(results[(model, threads, mode, 'torch')]) == r + 1 else ""))
    return results


def med(runs, key):
    return statistics.median(run[key] for run in runs)


def paired(a, b, key):
    return statistics.median(x[key] / y[key] for x, y in zip(a, b))


def tradeoff_table(results, model):
    rows = [f"| {model} mode | step (s) | step / none | fwd+bwd (s) | fwd+bwd / none | act peak (MiB) | predicted (MiB) "
            "| none / peak | recompute | GFLOP/s | of GEMM peak |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    none = results[(model, 1, "none", "remat")]
    for (m, t, mode, fw), runs in results.items():
        if m != model or t != 1 or fw != "remat":
            continue
        rows.append(f"| {mode} | {med(runs, 'step_s'):.3f} | {paired(runs, none, 'step_s'):.2f} | {med(runs, 'fwd_bwd_s'):.3f} "
                    f"| {paired(runs, none, 'fwd_bwd_s'):.2f} | {runs[-1]['act_peak_mb']:.2f} | {runs[-1]['predicted_peak_mb']:.2f} "
                    f"| {none[-1]['act_peak_mb'] / runs[-1]['act_peak_mb']:.1f} | {runs[-1]['recompute']:.2f} "
                    f"| {med(runs, 'gflops'):.0f} | {100 * med(runs, 'peak_share'):.0f} % |")
    return "\n".join(rows)


def torch_table(results, model):
    rows = [f"| {model} | threads | remat step (s) | PyTorch step (s) | remat / PyTorch | remat fwd+bwd (s) "
            "| PyTorch fwd+bwd (s) | remat / PyTorch | remat peak (MiB) | PyTorch peak (MiB) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for (m, t, mode, fw), runs in results.items():
        if m != model or fw != "remat" or (m, t, mode, "torch") not in results:
            continue
        tr = results[(m, t, mode, "torch")]
        rows.append(f"| {mode} | {t} | {med(runs, 'step_s'):.3f} | {med(tr, 'step_s'):.3f} | {paired(runs, tr, 'step_s'):.2f} "
                    f"| {med(runs, 'fwd_bwd_s'):.3f} | {med(tr, 'fwd_bwd_s'):.3f} | {paired(runs, tr, 'fwd_bwd_s'):.2f} "
                    f"| {runs[-1]['act_peak_mb']:.2f} | {tr[-1]['act_peak_mb']:.2f} |")
    return "\n".join(rows)


def best_table(results):
    rows = ["| model | threads | remat step (s) | PyTorch installed (s) | remat / installed | PyTorch best (s) | remat / best |",
            "|---|---|---|---|---|---|---|"]
    for (m, t, mode, fw), runs in results.items():
        if fw != "remat" or (m, t, mode, "torch_best") not in results:
            continue
        inst, best = results[(m, t, mode, "torch")], results[(m, t, mode, "torch_best")]
        rows.append(f"| {m} | {t} | {med(runs, 'step_s'):.3f} | {med(inst, 'step_s'):.3f} | {paired(runs, inst, 'step_s'):.2f} "
                    f"| {med(best, 'step_s'):.3f} | {paired(runs, best, 'step_s'):.2f} |")
    return "\n".join(rows)


def targets_table(results):
    """The project's measured targets, checked against this run."""
    rows = ["\n## Targets\n", "| target | measured | met |", "|---|---|---|"]

    def row(what, value, ok):
        rows.append(f"| {what} | {value} | {'yes' if ok else '**no**'} |")

    def r(model, mode, fw="remat", threads=1):
        return results.get((model, threads, mode, fw))

    none, sqrt = r("deep", "none"), r("deep", "sqrt")
    gain = none[-1]["act_peak_mb"] / sqrt[-1]["act_peak_mb"]
    row("deep, sqrt: activation peak at least 8 x below none", f"{gain:.1f} x", gain >= 8)
    ratio = paired(sqrt, none, "step_s")
    row("deep, sqrt: step at most 1.35 x none", f"{ratio:.2f} x", ratio <= 1.35)
    ratio = paired(r("mlp", "every"), r("mlp", "none"), "step_s")
    row("mlp, every: step at most 1.30 x none", f"{ratio:.2f} x", ratio <= 1.30)
    g_none, g_every = r("gpt", "none"), r("gpt", "every")
    gain = g_none[-1]["act_peak_mb"] / g_every[-1]["act_peak_mb"]
    row("gpt, every: activation peak at least 4 x below none", f"{gain:.1f} x", gain >= 4)
    ratio = paired(g_every, g_none, "step_s")
    row("gpt, every: step at most 1.30 x none", f"{ratio:.2f} x", ratio <= 1.30)
    for (m, t, mode, fw), runs in results.items():
        if fw == "remat" and mode.startswith("budget:"):
            limit = float(mode.split(":")[1])
            row(f"{m}, {mode}, {t} thread(s): counted peak within the budget", f"{runs[-1]['act_peak_mb']:.2f} MiB", runs[-1]["act_peak_mb"] <= limit)
    share = statistics.median(x["peak_share"] for x in r("mlp", "none"))
    row("mlp, none: at least 85 % of the GEMM peak", f"{100 * share:.0f} %", share >= 0.85)
    if r("mlp", "none", "torch"):
        for model in MODELS:
            ratio = paired(r(model, "none"), r(model, "none", "torch"), "step_s")
            row(f"{model}, none, 1 thread: step at most PyTorch's", f"{ratio:.2f} x", ratio <= 1.0)
        if r("mlp", "none", "torch_best"):
            for model in MODELS:
                ratio = paired(r(model, "none"), r(model, "none", "torch_best"), "step_s")
                row(f"{model}, none, 1 thread: step at most 0.8 x PyTorch's best", f"{ratio:.2f} x", ratio <= 0.8)
                ratio = paired(r(model, "none"), r(model, "none", "torch"), "step_s")
                row(f"{model}, none, 1 thread: step at most 0.5 x PyTorch as installed", f"{ratio:.2f} x", ratio <= 0.5)
            for model in ("mlp", "gpt"):
                ratio = paired(r(model, "none", threads=2), r(model, "none", "torch_best", threads=2), "step_s")
                row(f"{model}, none, 2 threads: step at most 0.6 x PyTorch's best", f"{ratio:.2f} x", ratio <= 0.6)
        # budget modes are left out: PyTorch runs the layer-level plan there (see measure())
        worst = max(runs[-1]["act_peak_mb"] / results[(m, t, mode, "torch")][-1]["act_peak_mb"]
                    for (m, t, mode, fw), runs in results.items()
                    if fw == "remat" and (m, t, mode, "torch") in results and not mode.startswith("budget"))
        row("activation peak at or below PyTorch's under the same plan (none, every, sqrt)",
            f"at most {worst:.2f} x PyTorch's", worst <= 1.0)
    return "\n".join(rows) + "\n"


def torch_points(results, model):
    """PyTorch's (label, step_s, act_peak_mb) for the model on one thread, medians of the rounds."""
    points = []
    for (m, t, mode, fw), runs in results.items():
        if m == model and t == 1 and fw in ("torch", "torch_best"):
            label = mode.split(":")[0] + (" (best config)" if fw == "torch_best" else "")
            points.append((label, med(runs, "step_s"), runs[-1]["act_peak_mb"]))
    return points


def plot_sweep(figures, model, torch_pts, cpu, name="sweep"):
    """Draws figures/NAME_MODEL.png from remat_bench's sweep in NAME_MODEL.csv and PyTorch's points
    (also written to NAME_MODEL_torch.csv): activation peak against step time, one point a plan."""
    import csv
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    with open(os.path.join(figures, f"{name}_{model}.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(figures, f"{name}_{model}_torch.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "step_s", "act_peak_mb"])
        w.writerows((label, f"{x:.4f}", f"{y:.3f}") for label, x, y in torch_pts)
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=120)
    xs, ys = [float(r["step_s"]) for r in rows], [float(r["act_peak_mb"]) for r in rows]
    # With op-level plans in the sweep (gpt), its budget: points are op-level and budget_layers:
    # the layer-level planner's on the same budgets; the fixed plans are layer-level.
    op_level = any(r["mode"].startswith("budget_layers:") for r in rows)
    groups = [("remat", "#1f77b4", [i for i in range(len(rows))])]
    if op_level:
        ops = [i for i, r in enumerate(rows) if r["mode"].startswith("budget:")]
        groups = [("remat, layer-level plans", "#1f77b4", [i for i in range(len(rows)) if i not in ops]),
                  ("remat, op-level plans", "#2ca02c", ops)]
    for group, color, idx in groups:
        ax.scatter([xs[i] for i in idx], [ys[i] for i in idx], s=36, color=color, zorder=3, label=f"{group}, measured")
        ax.scatter([float(rows[i]["predicted_step_s"]) for i in idx], [float(rows[i]["predicted_peak_mb"]) for i in idx],
                   s=70, facecolors="none", edgecolors=color, linewidths=1.2, zorder=2,
                   label=f"{group}, predicted before the step")
    # labels above or below the measured points (a prediction sits at the same height, to one
    # side), alternating so that neighbours do not overlap
    # Budgets that chose the same plan as another mode share one label ("every = budget:66.1").
    same_plan = {}
    for i, r in enumerate(rows):
        same_plan.setdefault((r["predicted_peak_mb"], r["recompute"], r["segments"], r["depth"]), []).append(i)
    firsts = sorted((members[0], " = ".join(rows[i]["mode"] for i in members)) for members in same_plan.values())
    order = sorted(firsts, key=lambda f: ys[f[0]])
    for k, (i, text) in enumerate(order):
        ax.annotate(text, (xs[i], ys[i]), xytext=(0, 8 if k % 2 == 0 else -9), textcoords="offset points",
                    ha="center", va="bottom" if k % 2 == 0 else "top", fontsize=8, color="#1f4e79")
    if torch_pts:
        ax.scatter([p[1] for p in torch_pts], [p[2] for p in torch_pts], s=44, marker="s", color="#d62728", zorder=3,
                   label="PyTorch 1.13, same model and plan")
        for k, (label, x, y) in enumerate(sorted(torch_pts, key=lambda p: p[1])):
            ax.annotate(label, (x, y), xytext=(0, 7 if k % 2 == 0 else -8), textcoords="offset points", ha="center",
                        va="bottom" if k % 2 == 0 else "top", fontsize=8, color="#8b1a1a")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")  # 300, not 3 x 10^2
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("training step: forward + backward + AdamW (s, median)")
    ax.set_ylabel("activation peak (MiB, log scale)")
    ax.set_title(f"{model}: {MODELS[model][0]}\none point per plan, one thread, {cpu}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    # below the axes, where it hides no point
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(os.path.join(figures, f"{name}_{model}.png"))
    plt.close(fig)


def plot_all(docs, results, cpu):
    for model in MODELS:
        plot_sweep(os.path.join(docs, "figures"), model, torch_points(results, model), cpu)


def frontier(args, bench, torch_ref):
    """figures/frontier_gpt.png for the guide's "What to save": gpt's sweep (layer-level and
    op-level budget plans on the same budgets) and PyTorch's none, every and sqrt, in one run."""
    import shutil
    import tempfile
    figures = os.path.join(args.docs, "figures")
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([bench, "--sweep", "gpt", "--steps", str(args.steps), "--out", tmp, "--threads", "1"],
                             check=True, capture_output=True, text=True, env=CLEAN_ENV).stdout
        shutil.copy(os.path.join(tmp, "sweep_gpt.csv"), os.path.join(figures, "frontier_gpt.csv"))
    cpu = json.loads(out.splitlines()[0])["cpu"]
    points = []
    for mode in ("none", "every", "sqrt"):
        for config in ("installed", "best") if mode == "none" else ("installed",):
            got = run_json(["/usr/bin/python3", torch_ref, "--model", "gpt", "--mode", mode, "--steps", str(args.steps),
                            "--threads", "1", "--config", config])
            points.append((mode + (" (best config)" if config == "best" else ""), got["step_s"], got["act_peak_mb"]))
            log(f"torch gpt {mode} {config}: {got['step_s']:.3f} s, {got['act_peak_mb']:.1f} MiB")
    plot_sweep(figures, "gpt", points, cpu, name="frontier")
    log(f"wrote {figures}/frontier_gpt.png")


def load_results(docs):
    with open(os.path.join(docs, "data", "report.json")) as f:
        data = json.load(f)
    return {(r["model"], r["threads"], r["mode"], r["framework"]): r["rounds"] for r in data["runs"]}, data["cpu"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch (its tables are then left out)")
    ap.add_argument("--plot-only", action="store_true", help="only redraw the figures from the last run's data")
    ap.add_argument("--frontier", action="store_true",
                    help="only measure and draw figures/frontier_gpt.png (op-level and layer-level plans, PyTorch)")
    args = ap.parse_args()
    if args.plot_only:
        results, cpu = load_results(args.docs)
        plot_all(args.docs, results, cpu)
        log(f"redrew {args.docs}/figures/sweep_*.png")
        return
    here = os.path.dirname(os.path.abspath(__file__))
    bench = os.path.join(args.build, "benchmarks", "remat_bench")
    ops = os.path.join(args.build, "benchmarks", "ops_bench")
    torch_ref = os.path.join(here, "torch_reference.py")
    os.makedirs(os.path.join(args.docs, "figures"), exist_ok=True)
    os.makedirs(os.path.join(args.docs, "data"), exist_ok=True)
    if args.frontier:
        frontier(args, bench, torch_ref)
        return

    gemm = [json.loads(l) for l in subprocess.run([ops, "--threads", "1", "--repeat", "3"], check=True, capture_output=True,
                                                   text=True, env=CLEAN_ENV).stdout.splitlines() if '"gemm"' in l]
    gemm_peak = max(g["gflops"] for g in gemm if g["n"] == 1024)
    log(f"GEMM peak (n = 1024, one thread): {gemm_peak} GFLOP/s")
    results = measure(args, bench, torch_ref, gemm_peak)
    sweeps = {}
    for model in MODELS:
        log(f"sweep {model}")
        out = subprocess.run([bench, "--sweep", model, "--steps", str(args.steps), "--out", os.path.join(args.docs, "figures"),
                              "--gemm-peak", str(gemm_peak)], check=True, capture_output=True, text=True, env=CLEAN_ENV).stdout
        sweeps[model] = [json.loads(l) for l in out.splitlines()]
    first = results[("mlp", 1, "none", "remat")][-1]
    backend = f"{first['gemm']} ({first['gemm_reason']}); remat's kernels: {first['isa']}; denormals flushed: " + \
        ("yes" if first["flush_denormals"] else "no")
    cpu = first["cpu"]
    with open(os.path.join(args.docs, "data", "report.json"), "w") as f:
        json.dump({"gemm_peak_gflops": gemm_peak, "cpu": cpu, "gemm": first["gemm"], "gemm_reason": first["gemm_reason"],
                   "isa": first["isa"], "flush_denormals": first["flush_denormals"],
                   "runs": [{"model": k[0], "threads": k[1], "mode": k[2], "framework": k[3], "rounds": v} for k, v in results.items()],
                   "sweeps": sweeps}, f, indent=1)
    plot_all(args.docs, results, cpu)
    page = os.path.join(args.docs, "benchmarks.md")
    kept = hand_measured_sections(page)
    with open(page, "w") as f:
        f.write(render(args, results, gemm_peak, backend, cpu) + kept)
    log(f"wrote {page}")


HAND_MARKER = "<!-- Sections below were measured by hand; benchmarks/report.py keeps them as they are. -->"


def hand_measured_sections(page):
    """The page's sections after HAND_MARKER, marker included ("" when there are none): the
    measurements this script does not take (op-level budgets, build flags, compile time) survive
    a regeneration."""
    try:
        with open(page) as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    at = text.find(HAND_MARKER)
    return "" if at < 0 else "\n" + text[at:]


def render(args, results, gemm_peak, backend, cpu):
    date = datetime.date.today().isoformat()
    torch_version = next((v[0]["framework"] for k, v in results.items() if k[3] == "torch"), None)
    parts = [f"""# Benchmarks

Regenerated by `tools/dev report` (`benchmarks/report.py`, {args.rounds} rounds of {args.steps} steps) on {date}, on
this project's development machine: {cpu}, 2 cores, shared with other tenants and noisy (its
speed changes from minute to minute, which is why every ratio below is a median of ratios of runs
made one right after the other). No environment variable set. GEMMs: {backend}; this machine's single-precision GEMM rate is
{gemm_peak:.0f} GFLOP/s on one core (n = 1024, `benchmarks/ops_bench`).

## How a step is measured

`remat_bench --model M --mode P` builds the model and runs only plan P before the timed steps:
a warm-up step (it allocates the gradient and AdamW buffers every later step reuses) and one more
uncounted step of P, then the timed ones; the process's peak resident memory (`process_peak_mb`,
getrusage) is read there, and only then is the chain of layers profiled with `plan::profile` (the
GPT's chain is its blocks; the profile runs it without checkpoints) for the plan's predictions.
Budget and binomial plans need the profile first (their JSON says `"profiled_first": true`).
`--sweep` profiles first and runs every plan in one process. A **step** is forward, cross-entropy
loss, backward and an AdamW update; **fwd+bwd** is the step without the update;
**recompute_s** is the time the backward pass spent replaying segments, measured by the tape.

- **act peak** is the allocator's counted peak during forward and backward minus the bytes live
  before the step: activations, gradient temporaries, the loss. Weights, their gradients and the
  optimizer state live before the step and are not in it.
- **predicted** is the plan's prediction, made before the step from the profile.
- **recompute** is the plan's extra forward work, as a fraction of one forward pass.
- **GFLOP/s** counts the step's GEMM work (with the recompute) over the fwd+bwd time; **of GEMM
  peak** divides it by the GEMM rate above.

Models (float): **mlp** = {MODELS['mlp'][0]}; **deep** = {MODELS['deep'][0]};
**gpt** = {MODELS['gpt'][0]}, its loss chunked. `budget:N` is the plan with the least recompute
that fits N MiB, `optimal:K` the binomial plan with at most K checkpoints alive.

## The memory/time trade-off (one thread)
"""]
    for model in MODELS:
        parts.append(f"\n{tradeoff_table(results, model)}\n\n![{model} sweep](figures/sweep_{model}.png)\n")
    parts.append("""
Each figure is `remat_bench --sweep MODEL`: every plan of the sweep (none, every, sqrt, budgets
from 75 % of none's peak down, binomial plans that recompute at most four forward passes), its
measured step time and activation peak (filled), and its prediction (hollow): the predicted peak,
and the none step plus the profiled seconds of forward work the plan replays. PyTorch's points
(squares) are the same model under the same plans, measured by `benchmarks/torch_reference.py`
in the same run (medians of the rounds above). The raw numbers are in `figures/sweep_MODEL.csv`,
`figures/sweep_MODEL_torch.csv` and `data/report.json`.
""")
    parts.append(targets_table(results))
    if torch_version:
        parts.append(f"""
## Side by side with PyTorch

`benchmarks/torch_reference.py` runs the same models and modes with {torch_version} (Debian's
`python3-torch`, CPU): the same layers, initialization scheme, batch, loss and AdamW; checkpoints
with `torch.utils.checkpoint` (non-reentrant) on the same layers (`every`: all but the last,
`sqrt`: `checkpoint_sequential`'s partition into ceil(sqrt(n)) runs, `budget`: the top-level
segments of remat's layer-level plan for the same budget, `budget_layers:N`, since PyTorch 1.13
cannot keep a GEMM's output inside a segment as remat's op-level `budget:N` plans may). Two things
make the comparison fair:

- **Threads.** `torch.set_num_threads()` does not reach the OpenBLAS that Debian's PyTorch uses
  for its GEMMs; without `OPENBLAS_NUM_THREADS` a "one-thread" PyTorch step runs its GEMMs on
  every core (measured: 155 against 88 GFLOP/s). The script sets `OPENBLAS_NUM_THREADS` and
  `OMP_NUM_THREADS` to the thread count before importing torch.
- **Activation memory.** With `torch.profiler(profile_memory=True)`, PyTorch's CPU allocator
  records every allocation and free with its size; the running sum over one forward and backward,
  minus its start, peaks at the figure below: the same definition as remat's counter. The
  profiled step is separate from the timed ones. PyTorch keeps gradient buffers between steps
  (`zero_grad(set_to_none=False)`), as remat does.

Both use Debian's OpenBLAS; in these tables PyTorch runs as installed (OpenBLAS's own choice of
kernels, denormals not flushed). Ratios below 1 mean remat is faster or smaller.
""")
        for model in MODELS:
            parts.append(f"\n{torch_table(results, model)}\n")
        if any(k[3] == "torch_best" for k in results):
            parts.append(f"""
### PyTorch as installed and at its best (`--mode none`)

"As installed" is PyTorch as a user gets it: Debian's OpenBLAS choosing its kernels from its own
CPU table, denormals not flushed. "Best" gives it what remat does by itself: OpenBLAS's kernels for
the CPU's widest instructions (`OPENBLAS_CORETYPE`, from the CPU's flags) and
`torch.set_flush_denormal(True)`. remat runs with no environment variable set. Taken on {cpu}.

{best_table(results)}
""")
    parts.append("""
## Reproducing

```sh
tools/dev report                                     # everything on this page (about 45 minutes)
build/release/benchmarks/remat_bench --model gpt --mode every --threads 2      # one point
python3 benchmarks/torch_reference.py --model gpt --mode every --threads 2    # its PyTorch twin
build/release/benchmarks/remat_bench --sweep deep --out /tmp                  # one figure
build/release/benchmarks/ops_bench --threads 1                                # per-op timings, GEMM rate
```

The GEMM library decides a good part of every time on this page. Debian 12's OpenBLAS 0.3.21
picks its kernels at run time from a table of CPU models, and runs SSE3 kernels on CPUs newer than
its table; remat checks its choice against the CPU's instructions and re-selects when it fell
short (docs/design.md, "Speed on any x86-64 machine", with the alternatives measured). Every
figure here was taken without OpenBLAS variables, as a user runs; remat reports the CPU, the
kernels and why, its instruction set and its denormal mode in each JSON line (`cpu`, `gemm`,
`gemm_reason`, `isa`, `flush_denormals`).
""")
    return "".join(parts)


if __name__ == "__main__":
    main()
