#!/usr/bin/env bash
# finetune: fine-tunes a train_llama folder and a train_gpt file; the JSON line has every field;
# weights, adapters, gradients and optimizer state are counted exactly as estimated, the total
# within 2 %; checkpointing changes no loss (to the last digit); LoRA + NF4 + checkpointing counts
# less than --full; the adapters are saved in PEFT's layout; bad input is a clear error.
set -euo pipefail
train_llama=$1
train_gpt=$2
finetune=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

"$train_llama" --layers 2 --width 32 --heads 4 --kv-heads 2 --mlp 48 --context 32 --batch 4 --steps 10 --sample 0 --json \
  --save-hf llama > /dev/null
"$train_gpt" --layers 2 --width 32 --heads 2 --context 32 --batch 4 --steps 10 --sample 0 --json --save gpt.safetensors > /dev/null

run=(--steps 6 --batch 4 --eval-every 3 --eval-batches 2 --json)
field() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1"; }
# one number of the counted_mb or estimated_mb object
part() { sed -n "s/.*\"$2\": {\([^}]*\)}.*/\1/p" "$1" | sed -n "s/.*\"$3\": \([0-9.e+-]*\).*/\1/p"; }

"$finetune" --base llama "${run[@]}" --checkpoint every --save-adapters adapter > lora.json
"$finetune" --base llama "${run[@]}" --checkpoint none > lora_none.json
"$finetune" --base llama "${run[@]}" --full > full.json
"$finetune" --base gpt.safetensors "${run[@]}" --storage int8 --targets qkv,fc --accumulate 2 --checkpoint sqrt > gpt.json
for f in lora.json full.json gpt.json; do
  for key in first_val_loss final_val_loss seconds counted_mb estimated_mb; do
    grep -q "\"$key\"" "$f" || { echo "$f: JSON field $key missing"; cat "$f"; exit 1; }
  done
  for key in weights adapters gradients optimizer activations logits total; do
    c=$(part "$f" counted_mb "$key"); e=$(part "$f" estimated_mb "$key")
    [ -n "$c" ] && [ -n "$e" ] || { echo "$f: $key missing from counted_mb or estimated_mb"; cat "$f"; exit 1; }
    case $key in
      weights|adapters|gradients|optimizer)
        [ "$c" = "$e" ] || { echo "$f: $key counted $c MiB, estimated $e MiB"; exit 1; } ;;
      total)
        awk -v c="$c" -v e="$e" 'BEGIN { d = c - e; if (d < 0) d = -d; exit !(d <= 0.02 * c) }' \
          || { echo "$f: total counted $c MiB, estimated $e MiB"; exit 1; } ;;
    esac
  done
done
# checkpointing changes no loss, to the last digit
[ "$(field lora.json final_val_loss)" = "$(field lora_none.json final_val_loss)" ] \
  || { echo "final loss differs with and without checkpointing"; cat lora.json lora_none.json; exit 1; }
# the adapters trained only: the full run's weights are as large as its gradients; LoRA's are not
[ "$(part full.json counted_mb adapters)" = "0.0000" ] || { cat full.json; exit 1; }
awk -v l="$(part lora.json counted_mb total)" -v f="$(part full.json counted_mb total)" 'BEGIN { exit !(l < f) }' \
  || { echo "LoRA + NF4 + checkpointing counted no less than --full"; cat lora.json full.json; exit 1; }
# full fine-tuning learns on this text
awk -v a="$(field full.json first_val_loss)" -v b="$(field full.json final_val_loss)" 'BEGIN { exit !(b < a) }' \
  || { echo "--full: validation loss did not fall"; cat full.json; exit 1; }
[ -s adapter/adapter_model.safetensors ] && grep -q '"r": 8' adapter/adapter_config.json \
  || { echo "adapters not saved in PEFT's layout"; ls adapter; exit 1; }
grep -q 'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight' adapter/adapter_model.safetensors \
  || { echo "PEFT tensor names missing"; exit 1; }

# bad input is a clear error
if "$finetune" --base no_such_base "${run[@]}" > out.txt 2>&1; then echo "missing base accepted"; exit 1; fi
grep -q "no_such_base" out.txt || { cat out.txt; exit 1; }
printf 'Zebras and Xylophones\n' > odd.txt  # Z and X are not in the base corpus' vocabulary
if "$finetune" --base llama --data odd.txt "${run[@]}" > out.txt 2>&1; then echo "unknown characters accepted"; exit 1; fi
grep -q "odd.txt has the character 90 ('Z') at byte 0" out.txt || { cat out.txt; exit 1; }
if "$finetune" --base llama --targets q_proj,qkv "${run[@]}" > out.txt 2>&1; then echo "bad target accepted"; exit 1; fi
grep -q "target 'qkv'" out.txt || { cat out.txt; exit 1; }
if "$finetune" --base llama --context 64 "${run[@]}" > out.txt 2>&1; then echo "--context beyond the base accepted"; exit 1; fi
grep -q "context 64 must be in \[2, 32\]" out.txt || { cat out.txt; exit 1; }
if "$finetune" --base gpt.safetensors --checkpoint sometimes "${run[@]}" > out.txt 2>&1; then echo "bad --checkpoint accepted"; exit 1; fi
grep -q "checkpoint must be" out.txt || { cat out.txt; exit 1; }
# a remat_eval.json whose vocabulary is not bytes, or has a key twice: named, not read on
cp -r llama bad_vocab
sed -i 's/"vocab":\[/"vocab":[300,/' bad_vocab/remat_eval.json
if "$finetune" --base bad_vocab "${run[@]}" > out.txt 2>&1; then echo "vocab entry 300 accepted"; exit 1; fi
grep -q "bad_vocab/remat_eval.json: vocab entry 0 is 300" out.txt || { cat out.txt; exit 1; }
cp -r llama twice
sed -i 's/"vocab":\[/"vocab":[],"vocab":[/' twice/remat_eval.json
if "$finetune" --base twice "${run[@]}" > out.txt 2>&1; then echo "a repeated key accepted"; exit 1; fi
grep -q "twice/remat_eval.json" out.txt && grep -qi "vocab" out.txt || { cat out.txt; exit 1; }
echo "finetune: split counted as estimated, losses equal across plans, adapters saved"
