#!/usr/bin/python3
"""Writes tests/reference/half.bin: PyTorch 1.13's conversions of the 16-bit float formats, which
tests/io/half_test.cpp compares with remat/io/half.hpp bit for bit. Run with /usr/bin/python3.

Layout (little-endian uint32 unless said): the float bits of every F16 pattern 0..65535, the
float bits of every BF16 pattern 0..65535; N; N float inputs (bits) and the bf16 bits torch rounds
them to (uint32 each); N double inputs (uint64 bits) and their bf16 bits (uint32 each).
"""
import pathlib
import struct

import numpy as np
import torch

OUT = pathlib.Path(__file__).resolve().parent / "half.bin"
rng = np.random.default_rng(11)

every = np.arange(65536, dtype=np.int32).astype(np.int16)
f16 = torch.from_numpy(every.view(np.float16).copy()).float().numpy().view(np.uint32)
bf16 = torch.from_numpy(every.copy()).view(torch.bfloat16).float().numpy().view(np.uint32)

# Floats: random bit patterns (every exponent, subnormals, NaNs), ties (low 16 bits 0x8000) with
# odd and even kept parts, values next to ties, the largest floats, infinities, zeros.
N = 8192
bits = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32)
bits[: N // 4] = (bits[: N // 4] & 0xFFFF0000) | 0x8000                     # exact ties
bits[N // 4 : N // 2] = (bits[N // 4 : N // 2] & 0xFFFF0000) | rng.choice([0x7FFF, 0x8001, 0xFFFF, 0x0001], N // 4)
bits[N // 2 : N // 2 + 512] &= 0x807FFFFF                                    # subnormals and zeros
special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F7FFFFF, 0xFF7FFFFF,
           0x7F7F8000, 0x7F7F7FFF, 0x00000001, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000]
bits[-len(special):] = special
floats = bits.view(np.float32)
f_to_bf16 = torch.from_numpy(floats.copy()).bfloat16().view(torch.int16).numpy().astype(np.uint16).astype(np.uint32)

dbits = rng.integers(0, 2**63, N, dtype=np.uint64) | (rng.integers(0, 2, N, dtype=np.uint64) << np.uint64(63))
# doubles near float's and bfloat16's ties and ranges
near = rng.standard_normal(N // 2) * np.exp2(rng.integers(-140, 130, N // 2))
dbits[: N // 2] = near.view(np.uint64)
dspecial = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 1e-300, 3.4028235677973366e38,
                     1.0 + 2.0**-8, 1.0 + 2.0**-8 + 2.0**-40, 1.0 + 3 * 2.0**-8], dtype=np.float64)
dbits[-len(dspecial):] = dspecial.view(np.uint64)
doubles = dbits.view(np.float64)
d_to_bf16 = torch.from_numpy(doubles.copy()).bfloat16().view(torch.int16).numpy().astype(np.uint16).astype(np.uint32)

with open(OUT, "wb") as out:
    out.write(f16.astype("<u4").tobytes())
    out.write(bf16.astype("<u4").tobytes())
    out.write(struct.pack("<I", N))
    out.write(bits.astype("<u4").tobytes())
    out.write(f_to_bf16.astype("<u4").tobytes())
    out.write(dbits.astype("<u8").tobytes())
    out.write(d_to_bf16.astype("<u4").tobytes())
print(f"wrote {OUT} with torch {torch.__version__}")
