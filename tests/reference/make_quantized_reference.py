#!/usr/bin/env python3
"""Writes tests/reference/quantized.json: the expected codes and dequantized values of remat's
BF16, INT8 (per-row absmax) and NF4 (blocks of 64, optional double quantization of the absmaxes
in blocks of 256 around their mean) storage, for random matrices, computed here in float32 with
NumPy/PyTorch independently of the C++ (include/remat/core/quantized.hpp documents the format).

    /usr/bin/python3 tests/reference/make_quantized_reference.py

NF4 and its double quantization follow bitsandbytes (bitsandbytes/functional.py: quantize_4bit
with compress_statistics=True, quantize_blockwise, dequantize_blockwise, create_dynamic_map; the
kernels' rounding in csrc/kernels.cu: dQuantizeNF4 and dQuantize without stochastic rounding),
re-stated here:
  - first level: absmax per block of 64; each value times float32(1 / absmax) gets the NF4 code
    whose index is the number of midpoints between consecutive NF4 values (double, rounded to
    float32) strictly below it; an all-zero block has 1 / 0 = inf, 0 * inf = NaN: code 0;
  - second level: offset = absmax.mean(), as bitsandbytes takes it: torch's float32 mean,
    here on one thread (on more, past 32,768 values, torch's own last bit depends on the thread
    count: Note [torch's float sum] in include/remat/core/torch_sum.hpp), centred = absmax -
    offset in float32, per 256 blocks a2 = max |centred|, and each
    centred * float32(1 / a2) gets the code dQuantize's binary search reaches in the dynamic map
    (create_dynamic_map(signed=True), run below as bitsandbytes writes it, with torch float32);
  - dequantization: absmax' = code_map[q] * a2 + offset, value = NF4[code] * absmax', float32.
The NF4 values are bitsandbytes' table (QLoRA, Appendix E), as torch float32."""

import json
import os

import numpy as np
import torch

torch.set_num_threads(1)  # torch's CPU sums differ with the thread count past 32,768 values

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


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """bitsandbytes' dynamic map, with the same torch float32 operations."""
    data = []
    non_sign_bits = total_bits - 1
    for i in range(max_exponent_bits):
        items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                    else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    # with these arguments no items come from the all-zero exponent case
    assert 2 ** (non_sign_bits - max_exponent_bits) - 1 == 0
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return torch.tensor(data, dtype=torch.float32).numpy()


DYNAMIC = create_dynamic_map()
NF4_MIDPOINTS = np.array([(float(NF4[i]) + float(NF4[i + 1])) / 2 for i in range(15)]).astype(np.float32)


def reciprocal(a):
    with np.errstate(divide="ignore"):
        return (f32(1) / a).astype(np.float32)


def nf4_code(x):
    """The index of the NF4 code: how many midpoints lie strictly below x (NaN: 0)."""
    return (x[..., None] > NF4_MIDPOINTS).sum(axis=-1)


def dynamic_code(x):
    """dQuantize<0>: binary search from index 127, then the nearer of the codes bracketing x."""
    at, below, above = 127, 0, 255
    below_value, above_value = f32(-1), f32(1)
    for step in (64, 32, 16, 8, 4, 2, 1):
        value = DYNAMIC[at]
        if x > value:
            below, below_value, at = at, value, at + step
        else:
            above, above_value, at = at, value, at - step
    if above == 255:
        above_value = DYNAMIC[255]
    if below == 0:
        below_value = DYNAMIC[0]
    reached = DYNAMIC[at]
    if x > reached:
        return above if x > f32((above_value + reached) * f32(0.5)) else at
    return below if x < f32((below_value + reached) * f32(0.5)) else at


def nf4(w, double_quant):
    flat = w.reshape(-1)
    n = flat.size
    blocks = (n + 63) // 64
    padded = np.zeros(blocks * 64, dtype=np.float32)
    padded[:n] = flat
    padded = padded.reshape(blocks, 64)
    absmax = np.abs(padded).max(axis=1)
    with np.errstate(invalid="ignore"):
        v = (padded * reciprocal(absmax)[:, None]).astype(np.float32)
    codes = nf4_code(v).reshape(-1)[:n]
    state = {}
    if double_quant:
        offset = f32(torch.from_numpy(absmax).mean().item())
        state["exact_mean_differs"] = bool(offset != f32(absmax.astype(np.float64).mean()))
        centred = (absmax - offset).astype(np.float32)
        groups = (blocks + 255) // 256
        deq_absmax = np.empty(blocks, dtype=np.float32)
        q = np.empty(blocks, dtype=np.int64)
        scales = np.empty(groups, dtype=np.float32)
        for g in range(groups):
            c = centred[g * 256:(g + 1) * 256]
            a2 = np.abs(c).max()
            with np.errstate(invalid="ignore"):
                x = (c * reciprocal(a2)).astype(np.float32)
            qg = np.array([dynamic_code(v) for v in x], dtype=np.int64)
            q[g * 256:(g + 1) * 256] = qg
            scales[g] = a2
            deq_absmax[g * 256:(g + 1) * 256] = (DYNAMIC[qg] * a2).astype(np.float32) + offset
        absmax = deq_absmax
        state.update({"codes": q, "scales": scales, "offset": float(offset)})
    lut = (NF4[None, :] * absmax[:, None]).astype(np.float32)  # (blocks, 16)
    block = np.arange(n) // 64
    return codes, lut[block, codes], state


def tensor(a):
    # float32 values in their shortest round-trip form (numpy's repr), to keep the file small
    data = [float(repr(v)) if a.dtype.kind == "f" else int(v) for v in a.reshape(-1)]
    return {"shape": list(a.shape), "data": data}


def main():
    rng = np.random.default_rng(12)
    cases = []
    differs = 0
    shapes = [(1, 1), (3, 64), (7, 13), (5, 100), (33, 100), (130, 129)]
    for rows, cols in shapes:
        w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 3.0)).astype(np.float32)
        if rows >= 5:
            w[1] = 0  # a zero row (INT8) and zero NF4 blocks
            w[2, 0] = 40.0  # an outlier
        q8, d8 = int8(w)
        codes, d4, _ = nf4(w, False)
        codes_dq, d4dq, state = nf4(w, True)
        assert (codes_dq == codes).all()
        differs += state["exact_mean_differs"]
        cases.append({
            "rows": rows, "cols": cols, "weight": tensor(w),
            "bf16": tensor(bf16(w.reshape(-1))),
            "int8_codes": tensor(q8), "int8": tensor(d8),
            "nf4_codes": tensor(codes.astype(np.int64)), "nf4": tensor(d4), "nf4_dq": tensor(d4dq),
            "nf4_dq_absmax_codes": tensor(state["codes"]), "nf4_dq_absmax_scales": tensor(state["scales"]),
            "nf4_dq_offset": state["offset"],
        })
    # dQuantize on its own: random values, every code, every midpoint between neighbours and the
    # floats next to them (where a rounding rule shows), and values past either end
    mids = ((DYNAMIC[:-1] + DYNAMIC[1:]) * f32(0.5)).astype(np.float32)
    probes = np.concatenate([rng.uniform(-1, 1, 3000).astype(np.float32), DYNAMIC, mids,
                             np.nextafter(mids, f32(-2)), np.nextafter(mids, f32(2)),
                             np.array([-1.5, -1, 1, 1.5], dtype=np.float32)])
    dynamic_cases = {"x": tensor(probes), "codes": tensor(np.array([dynamic_code(v) for v in probes]))}
    print(f"torch's float32 mean() of the absmaxes differs from the correctly rounded mean in "
          f"{differs} of {len(shapes)} cases")
    offset_cases, sum_cases = offsets(rng), sums(rng)
    with open(os.path.join(HERE, "quantized.json"), "w") as f:
        json.dump({"torch": f"{torch.__version__} {torch.__config__.show().split('CPU capability usage: ')[1].split()[0]}",
                   "nf4_table": [float(v) for v in NF4], "dynamic_map": [float(v) for v in DYNAMIC],
                   "dynamic_codes": dynamic_cases, "cases": cases,
                   "offset_cases": offset_cases, "torch_sums": sum_cases}, f)


def generated(n, salt, scale):
    """Values the C++ test makes again without a file: an integer hash over [0, 2^32) as a
    fraction, times a scale, in double, then rounded to float32 (both sides IEEE)."""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(salt)) % np.uint64(2 ** 32)
    return (h.astype(np.float64) / 2.0 ** 32 * scale).astype(np.float32)


def offsets(rng):
    """bitsandbytes' offset for generated matrices of up to 2,097,152 weights (one-thread sums
    in torch, as every size below its grain of 32,768 blocks)."""
    cases = []
    for _ in range(24):
        rows, cols = int(rng.integers(1, 1500)), int(rng.integers(1, 1500))
        salt, scale = int(rng.integers(0, 2 ** 32)), float(rng.uniform(0.01, 4))
        w = generated(rows * cols, salt, scale) - np.float32(scale / 2)
        n = w.size
        padded = np.zeros(((n + 63) // 64) * 64, dtype=np.float32)
        padded[:n] = w
        absmax = np.abs(padded.reshape(-1, 64)).max(axis=1)
        cases.append({"rows": rows, "cols": cols, "salt": salt, "scale": scale,
                      "offset": torch.from_numpy(absmax).mean().item()})
    return cases


def sums(rng):
    """torch's float32 sum of generated arrays, every length to 300 and random ones past."""
    lengths = list(range(1, 300)) + [int(n) for n in rng.integers(300, 300_000, 60)]
    return [{"n": n, "salt": n, "scale": 1.0,
             "sum": torch.from_numpy(generated(n, n, 1.0)).sum().item()} for n in lengths]


if __name__ == "__main__":
    main()
