#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzers (safetensors, index, config, adapter_config,
training_state): a few valid inputs and one small input for each class the reader rejects (the
tests read each corpus and check that its names say what the reader does).

    python3 fuzz/make_corpus.py            # rewrites every folder of fuzz/corpus/
"""
import json
import pathlib
import shutil
import struct

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "safetensors"
INDEX_OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "index"


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
    # the dtypes of Hugging Face checkpoints: 16-bit floats (a NaN, an infinity, a subnormal),
    # integer buffers, booleans, and an 8-bit float that is accepted but not read
    "valid_bf16_f16": file(js({"b": entry("BF16", (2, 2), (0, 8)), "h": entry("F16", (4,), (8, 16))}),
                           struct.pack("<4H", 0x3FC0, 0x7FC0, 0xFF80, 0x0001) + struct.pack("<4H", 0x3C00, 0x7E00, 0xFC00, 0x0001)),
    "valid_integers": file(js({"i64": entry("I64", (2,), (0, 16)), "i32": entry("I32", (1,), (16, 20)), "i16": entry("I16", (2,), (20, 24)),
                               "i8": entry("I8", (2,), (24, 26)), "u8": entry("U8", (1,), (26, 27)), "ok": entry("BOOL", (1,), (27, 28))}),
                           struct.pack("<qqihhbbBB", -1, 2**40, 7, -3, 4, -128, 127, 255, 1)),
    "valid_f8_unread": file(js({"q": entry("F8_E4M3", (3,), (0, 3))}), bytes(3)),
    # header length and JSON
    "short_file": b"abc",
    "header_too_large": struct.pack("<Q", 100_000_001) + b"{}",
    "header_past_end": struct.pack("<Q", 64) + W.encode(),
    "empty_header": file(""),
    "not_json": file("{not json"),
    "trailing_text": file(W + " x", F3),
    "starts_with_bracket": file("[1,2]"),
    "valid_leading_space": file(" " + W, F3),  # JSON white space before '{': the crate allows it
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
    "dtype_sub_byte_partial": file(js({"w": entry("F6_E2M3", (3,), (0, 3))}), bytes(3)),
    "valid_f4_unread": file(js({"w": entry("F4", (6,), (0, 3))}), bytes(3)),
    "dtype_int_size_mismatch": file(js({"w": entry("I64", (3,), (0, 12))}), bytes(12)),
    "dtype_unknown": file(js({"w": entry("F33")}), F3),
    "shape_negative": file(js({"w": entry("F32", (-3,))}), F3),
    "shape_float": file('{"w":{"dtype":"F32","shape":[3.0],"data_offsets":[0,12]}}', F3),
    "shape_overflow": file(js({"w": entry("F32", (2**40, 2**40, 2), (0, 0))})),
    "valid_empty_huge_extents": file(js({"w": entry("F32", (0, 2**40, 2**40), (0, 0))})),
    # multiplied left to right, as the crate does: past 2^63 before the zero
    "shape_overflow_before_zero": file(js({"w": entry("F32", (2**40, 2**40, 0), (0, 0))})),
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


# Seeds of fuzz/index_fuzz (model.safetensors.index.json texts); "valid_" ones are accepted.
INDEX_SEEDS = {
    "valid_two_shards": js({"metadata": {"total_size": 28}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                            "b": "model-00002-of-00002.safetensors"}}),
    "valid_subfolder": js({"weight_map": {"a": "shards/a.safetensors"}}),
    "valid_no_metadata_total": js({"metadata": {"format": "pt"}, "weight_map": {}}),
    "not_json": "{\"weight_map\": {",
    "not_object": "[1]",
    "nested_deep": '{"weight_map":' + "[" * 70 + "]" * 70 + "}",
    "no_weight_map": js({"metadata": {}}),
    "shard_not_string": js({"weight_map": {"a": 1}}),
    "shard_parent": js({"weight_map": {"a": "../a.safetensors"}}),
    "shard_absolute": js({"weight_map": {"a": "/etc/passwd"}}),
    "valid_shard_dot": js({"weight_map": {"a": "./a.safetensors"}}),  # os.path.join reads it
    "duplicate_name": '{"weight_map":{"a":"x.safetensors","a":"y.safetensors"}}',
    "total_size_negative": js({"metadata": {"total_size": -1}, "weight_map": {}}),
}


# Seeds of fuzz/config_fuzz (config.json texts): a Llama and a Qwen2 config, then one per class
# the reader refuses (tests/nn/llama_load_test.cpp checks that they are).
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32, "hidden_size": 8,
         "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
         "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-06,
         "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
CONFIG_SEEDS = {
    "valid_llama": js(LLAMA),
    "valid_qwen2": js({**LLAMA, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                       "tie_word_embeddings": True, "rope_scaling": None}),
    "valid_rope_linear": js({**LLAMA, "rope_scaling": {"type": "linear", "factor": 2.0}}),
    "not_json": js(LLAMA)[:-3],
    "not_object": "[1]",
    "nested_deep": '{"x":' + "[" * 70 + "]" * 70 + "}",
    "duplicate_key": js(LLAMA)[:-1] + ',"vocab_size":64}',
    "duplicate_nested_key": js(LLAMA)[:-1] + ',"quantization_config":{"bits":4,"bits":8}}',
    "missing_field": js({k: v for k, v in LLAMA.items() if k != "hidden_size"}),
    "field_not_integer": js({**LLAMA, "vocab_size": "32"}),
    "field_negative": js({**LLAMA, "num_hidden_layers": -1}),
    "heads_not_dividing": js({**LLAMA, "num_attention_heads": 3}),
    "vocab_overflows": js({**LLAMA, "vocab_size": 2**62}),
    "intermediate_overflows": js({**LLAMA, "intermediate_size": 2**59 + 1}),
    "rope_scaling_yarn": js({**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}),
    "hidden_act_gelu": js({**LLAMA, "hidden_act": "gelu"}),
}

# Seeds of fuzz/adapter_config_fuzz (adapter_config.json beside rank-2, alpha-4 adapters on
# q_proj): what save_adapters writes, then one per class load_adapters refuses.
ADAPTER = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 4.0, "lora_dropout": 0.0,
           "target_modules": ["q_proj"], "bias": "none", "fan_in_fan_out": False, "inference_mode": False,
           "base_model_name_or_path": ""}
ADAPTER_SEEDS = {
    "valid_saved": js(ADAPTER),
    "not_json": js(ADAPTER)[:-2],
    "not_object": "[]",
    "nested_deep": '{"r":' + "[" * 70 + "]" * 70 + "}",
    "duplicate_key": js(ADAPTER)[:-1] + ',"r":2}',
    "duplicate_nested_key": js(ADAPTER)[:-1] + ',"alpha_pattern":{"q_proj":8,"q_proj":16}}',
    "rank_differs": js({**ADAPTER, "r": 4}),
    "alpha_differs": js({**ADAPTER, "lora_alpha": 8}),
    "rank_not_number": js({**ADAPTER, "r": "2"}),
    "other_peft_type": js({**ADAPTER, "peft_type": "IA3"}),
}


def training_state(lr="0.001", steps="1", updates="1", v=(0.25, 0.5), extra=None):
    """A training state of fuzz/training_state_fuzz's model (Linear 2 -> 1, no bias) and AdamW."""
    w = struct.pack("<2f", 0.5, -1.0)
    m = struct.pack("<2f", 0.1, 0.2)
    vv = struct.pack("<2f", *v)
    header = {"__metadata__": {"optimizer": "AdamW", "adamw.steps": steps, "adamw.lr": lr,
                               "adamw.updates.weight": updates, **(extra or {})},
              "adamw.m.weight": entry("F32", (1, 2), (0, 8)), "adamw.v.weight": entry("F32", (1, 2), (8, 16)),
              "model.weight": entry("F32", (1, 2), (16, 24))}
    return file(js(header), m + vv + w)


STATE_SEEDS = {
    "valid_adamw": training_state(),
    "valid_zero_lr": training_state(lr="0"),
    "lr_infinite": training_state(lr="inf"),
    "lr_nan": training_state(lr="nan"),
    "lr_negative": training_state(lr="-0.5"),
    "steps_negative": training_state(steps="-1"),
    "updates_negative": training_state(updates="-2"),
    "updates_without_moments": file(js({"__metadata__": {"optimizer": "AdamW", "adamw.steps": "1", "adamw.lr": "0.1",
                                                         "adamw.updates.weight": "1"},
                                        "model.weight": entry("F32", (1, 2), (0, 8))}), bytes(8)),
    "other_optimizer": file(js({"__metadata__": {"optimizer": "SGD", "sgd.steps": "0", "sgd.lr": "0.1"},
                                "model.weight": entry("F32", (1, 2), (0, 8))}), bytes(8)),
    "wrong_shape": file(js({"__metadata__": {"optimizer": "AdamW", "adamw.steps": "0", "adamw.lr": "0.1",
                                             "adamw.updates.weight": "0"},
                            "model.weight": entry("F32", (2, 1), (0, 8))}), bytes(8)),
    "not_safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}",
}

CORPORA = ((OUT, SEEDS, ".safetensors"), (INDEX_OUT, INDEX_SEEDS, ".json"),
           (OUT.parent / "config", CONFIG_SEEDS, ".json"), (OUT.parent / "adapter_config", ADAPTER_SEEDS, ".json"),
           (OUT.parent / "training_state", STATE_SEEDS, ".safetensors"))


def main():
    for out, seeds, suffix in CORPORA:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name, data in seeds.items():
            (out / f"{name}{suffix}").write_bytes(data.encode() if isinstance(data, str) else data)
        print(f"wrote {len(seeds)} seeds to {out}")


if __name__ == "__main__":
    main()
