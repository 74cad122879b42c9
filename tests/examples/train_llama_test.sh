#!/usr/bin/env bash
# train_llama: the same seed gives bitwise-identical loss curves and final weights with and
# without checkpointing (every layer, sqrt(n) segments, a byte budget), the JSON line has
# train_gpt's fields, the Hugging Face folder is complete, and bad flags are clear errors.
set -euo pipefail
train_llama=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
run=(--context 32 --batch 4 --eval-every 10 --sample 0 --json)
small=(--layers 3 --width 32 --heads 4 --kv-heads 2 --mlp 48 "${run[@]}" --steps 30)

"$train_llama" "${small[@]}" --checkpoint none --log none.csv --save-hf none > none.json
# step, train loss (all 9 digits), validation loss, learning rate; not the timing columns
curve() { cut -d, -f1-4 "$1"; }
for plan in every sqrt budget:0.45; do
  "$train_llama" "${small[@]}" --checkpoint "$plan" --log plan.csv --save-hf plan > plan.json
  cmp <(curve none.csv) <(curve plan.csv) || { echo "curves differ between --checkpoint none and $plan"; diff none.csv plan.csv | head; exit 1; }
  cmp none/model.safetensors plan/model.safetensors || { echo "final weights differ between none and $plan"; exit 1; }
done
[ "$(wc -l < none.csv)" -eq 31 ] || { echo "expected 30 steps in the CSV"; cat none.csv; exit 1; }

for field in first_val_loss final_val_loss tokens_per_s act_peak_mb seconds steps checkpoint; do
  grep -q "\"$field\"" none.json || { echo "JSON field $field missing"; cat none.json; exit 1; }
done
# the loss went down
first=$(sed -n 's/.*"first_val_loss": \([0-9.]*\).*/\1/p' none.json)
final=$(sed -n 's/.*"final_val_loss": \([0-9.]*\).*/\1/p' none.json)
awk -v a="$first" -v b="$final" 'BEGIN { exit !(b < a) }' || { echo "validation loss did not fall: $first -> $final"; exit 1; }
grep -q '"num_key_value_heads": 2' none/config.json || { cat none/config.json; exit 1; }
grep -q 'model.layers.2.self_attn.k_proj.weight' none/model.safetensors || { echo "HF tensor names missing"; exit 1; }
[ -s none/remat_eval.json ] || { echo "remat_eval.json missing"; exit 1; }

# --init-from continues from the saved folder: its first validation loss is the saved model's,
# to the last digit (the same weights, the same validation batches)
"$train_llama" "${run[@]}" --steps 2 --init-from none --save-hf again > init.json
saved=$(sed -n 's/.*"final_val_loss": \([0-9.e+-]*\).*/\1/p' none.json)
resumed=$(sed -n 's/.*"first_val_loss": \([0-9.e+-]*\).*/\1/p' init.json)
[ -n "$saved" ] && [ "$saved" = "$resumed" ] || { echo "--init-from: first validation loss $resumed, saved model's $saved"; exit 1; }
cmp none/config.json again/config.json || { echo "--init-from did not keep the folder's shape"; exit 1; }
# a folder whose config does not match its weights, or that is missing, is a clear error
mkdir bad && cp none/model.safetensors bad/ && sed 's/"intermediate_size": 48/"intermediate_size": 40/' none/config.json > bad/config.json
if "$train_llama" "${run[@]}" --init-from bad > out.txt 2>&1; then echo "mismatched folder accepted"; exit 1; fi
grep -q "model.layers.0.mlp.gate_proj.weight' in bad/model.safetensors has shape (48, 32) but the model expects (40, 32)" out.txt || { cat out.txt; exit 1; }
if "$train_llama" "${run[@]}" --init-from no_such_folder > out.txt 2>&1; then echo "missing folder accepted"; exit 1; fi
grep -q "no_such_folder" out.txt || { cat out.txt; exit 1; }

# bad input gets a clear error
if "$train_llama" --checkpoint sometimes > out.txt 2>&1; then echo "bad --checkpoint accepted"; exit 1; fi
grep -q "checkpoint must be" out.txt || { cat out.txt; exit 1; }
if "$train_llama" --heads 3 > out.txt 2>&1; then echo "--heads 3 with width 256 accepted"; exit 1; fi
grep -q "LlamaConfig" out.txt || { cat out.txt; exit 1; }
if "$train_llama" --no-such-flag > out.txt 2>&1; then echo "unknown flag accepted"; exit 1; fi
echo "train_llama: curves and weights equal across plans"
