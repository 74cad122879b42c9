#!/usr/bin/env bash
# train_gpt_mpi.sh MPIRUN_SH TRAIN_GPT: 2 ranks x --batch 4 train like 1 process x --batch 8
# (the same loss curve to float rounding, the same validation losses), only rank 0 prints,
# logs and saves, and --json reports the job's world size.
set -euo pipefail
mpirun_sh=$1
train_gpt=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
small=(--layers 2 --width 32 --heads 2 --context 32 --steps 20 --eval-every 10 --sample 0 --json --threads 1)

"$train_gpt" "${small[@]}" --batch 8 --log one.csv --save one.safetensors > one.json
bash "$mpirun_sh" 2 "$train_gpt" "${small[@]}" --batch 4 --log two.csv --save two.safetensors > two.json
cat two.json
[ "$(wc -l < two.json)" -eq 1 ] || { echo "more than rank 0 printed"; exit 1; }
grep -q '"world_size": 2}' two.json || { echo "world_size missing"; exit 1; }
grep -q '"world_size": 1}' one.json || { echo "world_size missing for one process"; cat one.json; exit 1; }
[ -s two.safetensors ] || { echo "rank 0 did not save"; exit 1; }
# training losses (column 2) and validation losses (column 3) within 1e-5 relative
paste -d, one.csv two.csv | awk -F, 'NR > 1 {
  for (c = 2; c <= 3; ++c) {
    a = $c; b = $(c + 6);
    if ((a == "") != (b == "")) { print "row " NR ": missing value"; bad = 1; continue }
    if (a == "") continue;
    d = a - b; if (d < 0) d = -d;
    if (d > 1e-5 * a) { print "row " NR " column " c ": " a " vs " b; bad = 1 }
  }
} END { exit bad }' || { echo "2 ranks x 4 rows do not train like 1 x 8 rows"; exit 1; }
echo "train_gpt under mpirun: 2 ranks x 4 rows = 1 process x 8 rows"
