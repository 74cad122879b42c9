#!/usr/bin/env bash
# train_gpt: the same seed gives bitwise-identical loss curves with and without checkpointing,
# and stopping then resuming from the saved file reproduces the uninterrupted curve.
set -euo pipefail
train_gpt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
small=(--layers 2 --width 32 --heads 2 --context 32 --batch 4 --steps 40 --eval-every 10 --sample 0 --json --dropout 0.1)

"$train_gpt" "${small[@]}" --checkpoint none --log none.csv --save none.safetensors > none.json
"$train_gpt" "${small[@]}" --checkpoint every --log every.csv --save every.safetensors > every.json
# step, train loss (all 9 digits), validation loss, learning rate; not the timing columns
curve() { cut -d, -f1-4 "$1"; }
cmp <(curve none.csv) <(curve every.csv) || { echo "curves differ between --checkpoint none and every"; diff none.csv every.csv | head; exit 1; }
cmp none.safetensors every.safetensors || { echo "final weights differ between none and every"; exit 1; }

"$train_gpt" "${small[@]}" --checkpoint sqrt --log part.csv --save part.safetensors --stop-after 17 > part.json
"$train_gpt" "${small[@]}" --checkpoint sqrt --log part.csv --save resumed.safetensors --resume part.safetensors > resumed.json
cmp <(curve none.csv) <(curve part.csv) || { echo "stop + resume does not reproduce the uninterrupted curve"; diff none.csv part.csv | head; exit 1; }
cmp none.safetensors resumed.safetensors || { echo "stop + resume does not reproduce the final weights"; exit 1; }

grep -q '"first_val_loss"' none.json && grep -q '"final_val_loss"' none.json && grep -q '"tokens_per_s"' none.json \
  && grep -q '"act_peak_mb"' none.json && grep -q '"seconds"' none.json || { echo "JSON fields missing"; cat none.json; exit 1; }
# the resumed run must not restart the clock on its first validation loss
[ "$(grep -o '"first_val_loss": [0-9.]*' resumed.json)" = "$(grep -o '"first_val_loss": [0-9.]*' none.json)" ] \
  || { echo "first_val_loss lost on resume"; cat resumed.json none.json; exit 1; }
# resuming with --stop-after before the file's step is refused (the file would say step 5 and
# hold step 17's weights), and nothing is written
status=0
"$train_gpt" "${small[@]}" --resume part.safetensors --stop-after 5 --save refused.safetensors > out.txt 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q -- "--stop-after 5 is before step 17" out.txt || { echo "exit $status"; cat out.txt; exit 1; }
[ ! -e refused.safetensors ] || { echo "a refused resume wrote a file"; exit 1; }
# --dtype bf16: the same curve under every plan (bfloat16 saves; segment inputs kept float), a
# different one from float32's, and a validation loss within 2 % of it
"$train_gpt" "${small[@]}" --dtype bf16 --checkpoint none --log bf16.csv > bf16.json
"$train_gpt" "${small[@]}" --dtype bf16 --checkpoint every --log bf16_every.csv > bf16_every.json
cmp <(curve bf16.csv) <(curve bf16_every.csv) || { echo "bf16 curves differ between --checkpoint none and every"; diff bf16.csv bf16_every.csv | head; exit 1; }
! cmp -s <(curve none.csv) <(curve bf16.csv) || { echo "--dtype bf16 trained exactly as float32"; exit 1; }
grep -q '"dtype": "bf16"' bf16.json || { echo "dtype missing from the JSON"; cat bf16.json; exit 1; }
final() { grep -o '"final_val_loss": [0-9.]*' "$1" | cut -d' ' -f2; }
awk -v a="$(final none.json)" -v b="$(final bf16.json)" 'BEGIN { d = (b - a) / a; exit !(d < 0.02 && d > -0.02) }' \
  || { echo "bf16 validation loss $(final bf16.json) is not within 2 % of float32's $(final none.json)"; exit 1; }
status=0
"$train_gpt" --dtype fp16 > out.txt 2>&1 || status=$?
[ "$status" -ne 0 ] && grep -q -- "--dtype" out.txt && grep -q "fp16" out.txt || { echo "bad --dtype: exit $status"; cat out.txt; exit 1; }
# bad input gets a clear error
if "$train_gpt" --checkpoint sometimes > out.txt 2>&1; then echo "bad --checkpoint accepted"; exit 1; fi
grep -q "checkpoint must be" out.txt || { cat out.txt; exit 1; }
echo "train_gpt: curves equal across plans and across a resume"
