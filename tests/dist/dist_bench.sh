#!/usr/bin/env bash
# dist_bench.sh MPIRUN_SH DIST_BENCH: both models, tiny, on 2 ranks: the JSON names the world
# size and the model, every bucket started during the sweep (Note [buckets]: min_buckets splits
# even a tiny model), and with --min-buckets 1 the layout is DDP's: a first bucket, then one
# for the rest.
set -euo pipefail
mpirun_sh=$1
bench=$2
tiny=(--layers 2 --width 32 --heads 2 --context 16 --vocab 40 --batch 2 --steps 4)
field() { sed -n "s/.*\"$1\": \"\{0,1\}\([^,\"}]*\).*/\1/p"; }
for model in gpt llama; do
  out=$(bash "$mpirun_sh" 2 "$bench" "${tiny[@]}" --model "$model" --mlp 64 --kv-heads 1 | tail -1)
  echo "$out"
  [ "$(field world_size <<< "$out")" = 2 ] || { echo "world_size is not 2"; exit 1; }
  [ "$(field model <<< "$out")" = "$model" ] || { echo "model is not $model"; exit 1; }
  buckets=$(field buckets <<< "$out")
  [ "$buckets" -ge 8 ] || { echo "$model: $buckets buckets, expected at least 8"; exit 1; }
  [ "$(field started_during_backward <<< "$out")" = "$buckets" ] ||
    { echo "$model: not every bucket started during the sweep"; exit 1; }
done
out=$(bash "$mpirun_sh" 2 "$bench" "${tiny[@]}" --min-buckets 1 --first-bucket-mb 0.01 | tail -1)
echo "$out"
[ "$(field buckets <<< "$out")" = 2 ] || { echo "--min-buckets 1: expected DDP's 2 buckets"; exit 1; }
