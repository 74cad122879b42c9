#!/usr/bin/env python3
"""A generated command-line fuzz over every example's and benchmark's flags.

For each program given as NAME=PATH, the flags are read from its --help (which must exit 0 with
its usage), and each flag is given values from classes of bad input: negative, zero, huge,
overflowing, non-numeric, NaN, empty, a missing file, a directory, a FIFO, a file in a missing
folder, an unknown flag; the other flags keep small values so that an accepted run is short.
Every run must end by itself within its time limit (no hang), by exit() (no signal: a crash, an
abort, an uncaught exception), and a value of a class the program must refuse must end with
status 1 and a message on stderr. A few named cases check the messages of the refusals
issue 26 asked for.

    cli_fuzz.py [--max-cases N] [--timeout S] [--seed N] NAME=PATH...

With more generated cases than --max-cases, a fixed-seed sample of them runs: the same cases on
every run (another --seed draws others).
"""
import argparse
import concurrent.futures
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Flags that keep every accepted run small; a fuzzed flag replaces its entry here.
BASE = {
    "train_mlp": {"--epochs": "1", "--hidden": "8"},
    "train_gpt": {"--layers": "1", "--width": "16", "--heads": "2", "--context": "8",
                  "--batch": "2", "--steps": "2", "--eval-every": "1", "--eval-batches": "1",
                  "--sample": "0", "--save": ""},
    "train_llama": {"--layers": "1", "--width": "16", "--heads": "2", "--kv-heads": "1",
                    "--mlp": "16", "--context": "8", "--batch": "2", "--steps": "2",
                    "--eval-every": "1", "--eval-batches": "1", "--sample": "0"},
    "finetune": {"--base": "{base}", "--context": "8", "--batch": "2", "--steps": "2",
                 "--eval-every": "1", "--eval-batches": "1", "--rank": "2"},
    "will_it_fit": {"--layers": "2", "--width": "64", "--heads": "2", "--context": "32",
                    "--vocab": "100", "--batch": "2", "--memory": "16"},
    "remat_bench": {"--model": "gpt", "--context": "8", "--batch": "1", "--mode": "none",
                    "--steps": "1", "--gemm-peak": "10"},
    "ops_bench": {"--repeat": "1"},
    "quantized_bench": {"--in": "64", "--out": "64", "--batch": "8", "--rank": "2",
                        "--repeat": "1"},
    "dist_bench": {"--layers": "1", "--width": "16", "--heads": "2", "--kv-heads": "1",
                   "--mlp": "16", "--context": "8", "--vocab": "16", "--batch": "2",
                   "--steps": "3"},
}
# Flags whose huge value is a long run, not a bad one (more steps, more characters to sample).
WORK = {"--steps", "--epochs", "--repeat", "--sample", "--accumulate", "--eval-every"}
# Flags naming a file or folder to read, or to write.
INPUTS = {"--data", "--resume", "--base", "--config", "--init-from"}
OUTPUTS = {"--save", "--log", "--trace", "--save-hf", "--save-adapters", "--print-plan", "--out"}
# Flags taking a word from a list; --checkpoint and --mode also take budget:<MiB>.
PLANS = {"--checkpoint", "--mode"}

OPTION = re.compile(r"^\s+(?:-\w,)?(--[\w-]+)(?:\s+(\w+)(?::[^\s]+)?)?")


def read_flags(path):
    """(flag, type or None for a switch) for each option --help lists, and the --help text."""
    run = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    if run.returncode != 0 or "Usage:" not in run.stdout:
        raise SystemExit(f"{path} --help: exit {run.returncode}, no usage:\n{run.stdout}{run.stderr}")
    out = []
    for line in run.stdout.splitlines():
        m = OPTION.match(line)
        if m and m.group(1) != "--help":
            out.append((m.group(1), m.group(2)))
    return out, run.stdout


def values_for(flag, kind, paths):
    """(value, must_refuse) pairs for one flag of one type."""
    if kind is None:  # a switch: given a value, it is an error
        return [(None, False)]
    numeric = kind in ("INT", "UINT", "FLOAT", "THREADS", "NUMBER")
    cases = []
    if numeric:
        cases += [("-1", True), ("-9223372036854775808", True), ("abc", True), ("1x", True),
                  ("nan", True), ("inf", True), ("", True), ("18446744073709551616", True),
                  ("0", False)]
        if flag not in WORK:
            cases += [("4611686018427387904", False), ("1e300", False), ("2147483647", False)]
    elif flag in INPUTS:
        cases += [(paths["missing"], True), (paths["fifo"], True), ("", True)]
        # any bytes are a text to a character-level model: --data may be binary
        cases.append((paths["garbage"], flag != "--data"))
        if flag not in ("--base", "--init-from", "--config"):
            cases.append((paths["dir"], True))
    elif flag in OUTPUTS:
        cases += [(paths["fifo"], True), (paths["nodir"] + "/out", True)]
        if flag not in ("--save-hf", "--save-adapters", "--out"):
            cases.append((paths["dir"], True))
        else:
            cases.append((paths["garbage"], True))  # a file where a folder is wanted
    elif flag in PLANS:
        cases += [("sometimes", True), ("", True), ("budget:abc", True), ("budget:-1", True),
                  ("budget:nan", True), ("budget:", True), ("budget:1e400", True)]
    else:  # a word from a list, a list of names or a policy
        cases += [("no-such-value", False), ("", False), ("\x7f\x01", False)]
    return cases


def generate(programs, paths):
    """Every case: (program, args, must_refuse, label)."""
    cases = []
    for name, path in programs.items():
        base = {k: v.format(**paths) for k, v in BASE.get(name, {}).items()}
        if name == "load_bench":
            cases += load_bench_cases(path, paths)
            continue
        flags, _ = read_flags(path)
        cases.append((name, [path, "--no-such-flag"] + flat(base), True, "unknown flag"))
        cases.append((name, [path] + flat(base) + ["stray-positional"], True, "positional"))
        for flag, kind in flags:
            for value, refuse in values_for(flag, kind, paths):
                args = dict(base)
                args.pop(flag, None)
                tail = [flag] if value is None else [flag, value]
                if kind is None:
                    tail = [flag + "=maybe"]
                    refuse = True
                cases.append((name, [path] + flat(args) + tail, refuse, f"{flag} {value!r}"))
    return cases


def load_bench_cases(path, paths):
    """load_bench has commands, not flags: each command with bad paths and sizes."""
    small = os.path.join(paths["work"], "small.safetensors")
    c = [
        ([], True), (["nonsense"], True), (["load"], True), (["load", paths["missing"]], True),
        (["load", paths["dir"]], True), (["load", paths["fifo"]], True),
        (["load", paths["garbage"]], True), (["read2", paths["fifo"]], True),
        (["read2", paths["dir"]], True), (["make", paths["nodir"] + "/x"], True),
        (["make", paths["dir"]], True), (["make", small, "-1"], True), (["make", small, "abc"], True),
        (["make", small, "1e30"], True), (["make", small, "nan"], True),
        (["make", small, "0.0001"], False),
    ]
    return [("load_bench", [path] + a, refuse, " ".join(a) or "(none)") for a, refuse in c]


def flat(args):
    out = []
    for k, v in args.items():
        out += [k, v]
    return out


def named_cases(programs, paths):
    """The refusals issue 26 names, with the words their message must hold."""
    out = []
    gpt, llama = programs.get("train_gpt"), programs.get("train_llama")
    for name, exe in (("train_gpt", gpt), ("train_llama", llama)):
        if not exe:
            continue
        out += [
            (name, [exe, "--context", "1000000000"], r"needs [0-9.]+ [KMGTPE]iB; this machine has"),
            (name, [exe, "--checkpoint", "budget:abc"], r"budget must be a finite number"),
            (name, [exe, "--seed", "-1"], r"--seed: '-1' is not an integer"),
            (name, [exe, "--data", paths["fifo"]], r"is a FIFO"),
        ]
    if gpt:
        out.append(("train_gpt", [gpt, "--dropout", "1.0"], r"not a number in \[0, 1\)"))
    return out


def run_case(args, timeout, cwd):
    start = time.monotonic()
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                           stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        return None, "", time.monotonic() - start
    return r.returncode, r.stderr, time.monotonic() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-cases", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("programs", nargs="+")
    a = ap.parse_args()
    programs = {k: os.path.abspath(v) for k, v in (p.split("=", 1) for p in a.programs)}
    work = tempfile.mkdtemp(prefix="cli_fuzz.")
    try:
        paths = {"work": work, "missing": os.path.join(work, "missing.txt"),
                 "dir": os.path.join(work, "a_directory"), "fifo": os.path.join(work, "fifo"),
                 "nodir": os.path.join(work, "no", "such", "folder"),
                 "garbage": os.path.join(work, "garbage.bin"),
                 "base": os.path.join(work, "base.safetensors")}
        os.mkdir(paths["dir"])
        os.mkfifo(paths["fifo"])
        with open(paths["garbage"], "wb") as f:
            f.write(b"\x00\xff not a model \x01" * 10)
        if "finetune" in programs:  # finetune starts from a saved model: a tiny train_gpt one
            gpt = programs.get("train_gpt")
            if not gpt:
                raise SystemExit("finetune's cases need train_gpt=PATH to make a base model")
            subprocess.run([gpt, "--layers", "1", "--width", "16", "--heads", "2", "--context",
                            "8", "--batch", "2", "--steps", "1", "--sample", "0", "--json",
                            "--save", paths["base"]], check=True, capture_output=True, cwd=work)
        cases = generate(programs, paths)
        chosen = random.Random(a.seed).sample(cases, min(a.max_cases, len(cases)))
        failures = []
        t0 = time.monotonic()
        # two at a time: most of a case is the process starting
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda c: run_case(c[1], a.timeout, work), chosen))
        for (name, args, refuse, label), (code, err, seconds) in zip(chosen, results):
            where = f"{name} {label}: {' '.join(repr(x) for x in args[1:])}"
            if code is None:
                failures.append(f"{where}: no exit within {a.timeout} s (a hang)")
            elif code < 0:
                failures.append(f"{where}: killed by signal {-code}\n{err[-600:]}")
            elif "terminate called" in err or "Aborted" in err:
                failures.append(f"{where}: exit {code} after an abort message\n{err[-600:]}")
            elif refuse and code == 0:
                failures.append(f"{where}: exit 0 on an input it must refuse")
            elif refuse and code != 1:
                failures.append(f"{where}: exit {code} on a refusal, not 1\n{err[-600:]}")
            elif refuse and not err.strip():
                failures.append(f"{where}: exit {code} with nothing on stderr")
        for name, args, pattern in named_cases(programs, paths):
            code, err, _ = run_case(args, a.timeout, work)
            if code != 1 or not re.search(pattern, err):
                failures.append(f"{name} {args[1:]}: exit {code}, stderr does not match "
                                f"/{pattern}/:\n{err[-600:]}")
        total = time.monotonic() - t0
        print(f"cli_fuzz: {len(chosen)} of {len(cases)} generated command lines "
              f"({sum(c[2] for c in chosen)} that must be refused) and "
              f"{len(named_cases(programs, paths))} named ones over {len(programs)} programs "
              f"in {total:.1f} s; {len(failures)} failures")
        for f in failures:
            print("FAIL", f)
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
