#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/safetensors_fuzz: a few valid files and one small file for
each class of input the reader rejects (tests/io/safetensors_test.cpp tests the same classes).

    python3 fuzz/make_corpus.py            # rewrites fuzz/corpus/safetensors/
"""
import json
import pathlib
import shutil
import struct

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "safetensors"


def file(header, data=b""):
    """The 8-byte little-endian length, the header (str or bytes) and the data."""
    h = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(h)) + h + data


def entry(dtype="F32", shape=(3,), offsets=(0, 12)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def js(obj):
    return json.dumps(obj, separators=(",", ":"))


F3 = struct.pack("<3f", 1.5, -2.0, 0.25)
W = js({"w": entry()})

SEEDS = {
    # accepted
    "valid_f32_vector": file(W, F3),
    "valid_f64_and_metadata": file(js({"__metadata__": {"format": "pt"}, "a": entry("F64", (2, 1), (0, 16)),
                                       "b": entry("F64", (), (16, 24))}), struct.pack("<3d", 1, 2, 3)),
    "valid_empty_tensors_first_between_last": file(js({"z": entry("F32", (0, 2), (0, 0)), "a": entry("F32", (1,), (0, 4)),
                                                       "m": entry("F32", (2, 0), (4, 4)), "b": entry("F32", (1,), (4, 8)),
                                                       "e": entry("F64", (0,), (8, 8))}), F3[:8]),
    "valid_padded_header": file(W + "      ", F3),
    "valid_no_tensors": file("{}"),
    # header length and JSON
    "short_file": b"abc",
    "header_too_large": struct.pack("<Q", 100_000_001) + b"{}",
    "header_past_end": struct.pack("<Q", 64) + W.encode(),
    "empty_header": file(""),
    "not_json": file("{not json"),
    "trailing_text": file(W + " x", F3),
    "starts_with_bracket": file("[1,2]"),
    "starts_with_space": file(" " + W, F3),
    "byte_order_mark": file(b"\xef\xbb\xbf" + W.encode(), F3),
    "nul_inside": file(W[:10] + "\0" + W[10:], F3),
    "nul_then_garbage": file(W.encode() + b"\0garbage", F3),
    "nested_deep": file('{"w":{"dtype":"F32","shape":' + "[" * 70 + "]" * 70 + ',"data_offsets":[0,0]}}'),
    "invalid_utf8": file(b'{"w\xff":' + js(entry()).encode() + b"}", F3),
    # repeated keys
    "duplicate_name": file('{"w":' + js(entry("F32", (1,), (0, 4))) + ',"w":' + js(entry("F32", (1,), (4, 8))) + "}", F3[:8]),
    "duplicate_field": file('{"w":{"dtype":"F32","dtype":"F64","shape":[3],"data_offsets":[0,12]}}', F3),
    "duplicate_metadata_key": file('{"__metadata__":{"k":"1","k":"2"}}'),
    # entries
    "entry_not_object": file('{"w":[1,2]}'),
    "entry_extra_field": file(js({"w": {**entry(), "extra": 1}}), F3),
    "entry_no_dtype": file('{"w":{"shape":[3],"data_offsets":[0,12]}}', F3),
    "metadata_not_object": file('{"__metadata__":[1]}'),
    "metadata_not_string": file('{"__metadata__":{"k":1}}'),
    "dtype_unsupported": file(js({"w": entry("I64", (3,), (0, 24))}), bytes(24)),
    "dtype_unknown": file(js({"w": entry("F33")}), F3),
    "shape_negative": file(js({"w": entry("F32", (-3,))}), F3),
    "shape_float": file('{"w":{"dtype":"F32","shape":[3.0],"data_offsets":[0,12]}}', F3),
    "shape_overflow": file(js({"w": entry("F32", (2**40, 2**40, 0), (0, 0))})),
    "shape_rank_7": file(js({"w": entry("F32", (1, 1, 1, 1, 1, 1, 3))}), F3),
    "offsets_past_end": file(js({"w": entry("F32", (3,), (4, 16))}), F3),
    "offsets_reversed": file(js({"w": entry("F32", (3,), (12, 0))}), F3),
    "offsets_size_mismatch": file(js({"w": entry("F32", (3,), (0, 8))}), F3[:8]),
    "offsets_not_pair": file(js({"w": entry("F32", (3,), (0,))}), F3),
    "overlap": file(js({"a": entry("F32", (3,), (0, 12)), "b": entry("F32", (2,), (4, 12))}), F3),
    "empty_inside_another": file(js({"a": entry("F32", (3,), (0, 12)), "e": entry("F32", (0,), (4, 4))}), F3),
    "hole": file(js({"a": entry("F32", (1,), (0, 4)), "b": entry("F32", (1,), (8, 12))}), F3),
    "trailing_data": file(W, F3 + bytes(4)),
    "truncated_data": file(W, F3[:8]),
}


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for name, data in SEEDS.items():
        (OUT / f"{name}.safetensors").write_bytes(data)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
