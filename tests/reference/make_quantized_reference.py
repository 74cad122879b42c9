#!/usr/bin/env python3
"""Writes tests/reference/quantized.json: the expected codes and dequantized values of remat's
BF16, INT8 (per-row absmax) and NF4 (blocks of 64, optional double quantization of the absmaxes
in blocks of 256 around their mean) storage, for random matrices, computed here in float32 with
NumPy/PyTorch independently of the C++ (include/remat/core/quantized.hpp documents the format).

    /usr/bin/python3 tests/reference/make_quantized_reference.py

The NF4 values are bitsandbytes' table (QLoRA, Appendix E), as torch float32."""

import json
import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=torch.float32).numpy()
f32 = np.float32


def bf16(x):
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).astype(np.uint32).view(np.float32)


def int8_code(x, absmax):
    """rint(x / absmax * 127) in float32, 0 where absmax is 0."""
    safe = np.where(absmax > 0, absmax, f32(1))
    v = np.where(absmax > 0, x / safe, f32(0)).astype(np.float32)
    return np.rint(v * f32(127)).astype(np.int8)


def int8(w):
    a = np.abs(w).max(axis=1, keepdims=True)
    q = int8_code(w, a)
    scale = (a / f32(127)).astype(np.float32)
    return q, (q.astype(np.float32) * scale).astype(np.float32)


def nf4(w, double_quant):
    flat = w.reshape(-1)
    n = flat.size
    blocks = (n + 63) // 64
    padded = np.zeros(blocks * 64, dtype=np.float32)
    padded[:n] = flat
    padded = padded.reshape(blocks, 64)
    absmax = np.abs(padded).max(axis=1)
    safe = np.where(absmax > 0, absmax, f32(1))[:, None]
    v = np.where(absmax[:, None] > 0, padded / safe, f32(0)).astype(np.float32)
    # nearest code, the lower index on a tie (argmin returns the first minimum)
    codes = np.abs(v[:, :, None] - NF4[None, None, :]).argmin(axis=2).reshape(-1)[:n]
    if double_quant:
        offset = f32(absmax.astype(np.float64).mean())
        centred = (absmax - offset).astype(np.float32)
        groups = (blocks + 255) // 256
        deq_absmax = np.empty(blocks, dtype=np.float32)
        for g in range(groups):
            c = centred[g * 256:(g + 1) * 256]
            a2 = np.abs(c).max()
            q = int8_code(c, np.full_like(c, a2))
            s2 = f32(a2 / f32(127))
            deq_absmax[g * 256:(g + 1) * 256] = (q.astype(np.float32) * s2).astype(np.float32) + offset
        absmax = deq_absmax
    lut = (NF4[None, :] * absmax[:, None]).astype(np.float32)  # (blocks, 16)
    block = np.arange(n) // 64
    return codes, lut[block, codes]


def tensor(a):
    # float32 values in their shortest round-trip form (numpy's repr), to keep the file small
    data = [float(repr(v)) if a.dtype.kind == "f" else int(v) for v in a.reshape(-1)]
    return {"shape": list(a.shape), "data": data}


def main():
    rng = np.random.default_rng(12)
    cases = []
    for rows, cols in [(1, 1), (3, 64), (7, 13), (5, 100), (33, 100), (130, 129)]:
        w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 3.0)).astype(np.float32)
        if rows >= 5:
            w[1] = 0  # a zero row (INT8) and zero NF4 blocks
            w[2, 0] = 40.0  # an outlier
        q8, d8 = int8(w)
        codes, d4 = nf4(w, False)
        _, d4dq = nf4(w, True)
        cases.append({
            "rows": rows, "cols": cols, "weight": tensor(w),
            "bf16": tensor(bf16(w.reshape(-1))),
            "int8_codes": tensor(q8), "int8": tensor(d8),
            "nf4_codes": tensor(codes.astype(np.int64)), "nf4": tensor(d4), "nf4_dq": tensor(d4dq),
        })
    with open(os.path.join(HERE, "quantized.json"), "w") as f:
        json.dump({"nf4_table": [float(v) for v in NF4], "cases": cases}, f)


if __name__ == "__main__":
    main()
