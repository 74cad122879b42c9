#!/usr/bin/env python3
"""Scores a Hugging Face-layout folder written by `train_llama --save-hf DIR` with the independent
PyTorch implementation (llama_reference.py), in double, on the validation batches the run saved
(remat_eval.json), and compares with the loss remat reported (computed in float32).

    /usr/bin/python3 tests/reference/score_llama.py DIR

Reads model.safetensors with the standard library (torch 1.13 has no safetensors package): an
8-byte little-endian header size, a JSON header, then the raw tensors."""

import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402

DTYPES = {"F32": torch.float32, "F64": torch.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=DTYPES[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]).to(torch.float64)
    return tensors


def main(folder):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    params = read_safetensors(os.path.join(folder, "model.safetensors"))
    expected = {name for name, _ in ref.parameter_shapes(cfg)}
    if set(params) != expected:
        sys.exit(f"tensor names differ from Hugging Face's: missing {sorted(expected - set(params))}, "
                 f"extra {sorted(set(params) - expected)}")
    ev = json.load(open(os.path.join(folder, "remat_eval.json")))
    total = 0.0
    with torch.no_grad():
        for b in ev["batches"]:
            ids = torch.tensor(b["ids"], dtype=torch.int64).reshape(b["shape"])
            targets = torch.tensor(b["targets"], dtype=torch.int64).reshape(b["shape"])
            logits = ref.logits(cfg, params, ids)
            total += F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), targets.reshape(-1)).item()
    loss = total / len(ev["batches"])
    rel = abs(loss - ev["loss"]) / abs(loss)
    print(f"PyTorch reference (double): {loss:.6f}; remat (float32): {ev['loss']:.6f}; relative difference {rel:.2e}")
    sys.exit(0 if rel < 1e-4 else 1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: score_llama.py DIR")
    main(sys.argv[1])
