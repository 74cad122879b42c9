#!/usr/bin/env bash
# train_mpi.sh MPIRUN_SH PROGRAM [FLAGS...]: PROGRAM (train_gpt or train_llama, built with MPI)
# with 2 ranks x --batch 4 trains like 1 process x --batch 8 (the same loss curve to float
# rounding, the same validation losses), only rank 0 prints, logs and saves, and --json reports
# the job's world size. FLAGS are added to the two-rank run only (e.g. --zero).
set -euo pipefail
mpirun_sh=$1
program=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
small=(--layers 2 --width 32 --heads 2 --context 32 --steps 20 --eval-every 10 --sample 0 --json --threads 1)
case "$(basename "$program")" in
  train_gpt) small+=(); save_one=(--save one.safetensors); save_two=(--save two.safetensors); saved=two.safetensors ;;
  train_llama) small+=(--kv-heads 1 --mlp 64); save_one=(); save_two=(--save-hf two); saved=two/model.safetensors ;;
  *) echo "train_mpi.sh: unknown program $program"; exit 2 ;;
esac

"$program" "${small[@]}" --batch 8 --log one.csv "${save_one[@]}" > one.json
bash "$mpirun_sh" 2 "$program" "${small[@]}" --batch 4 --log two.csv "${save_two[@]}" "$@" > two.json
cat two.json
[ "$(wc -l < two.json)" -eq 1 ] || { echo "more than rank 0 printed"; exit 1; }
grep -q '"world_size": 2}' two.json || { echo "world_size missing"; exit 1; }
grep -q '"world_size": 1}' one.json || { echo "world_size missing for one process"; cat one.json; exit 1; }
[ -s "$saved" ] || { echo "rank 0 did not save"; exit 1; }
[ "$(wc -l < two.csv)" -eq 21 ] || { echo "the log does not have 20 steps"; exit 1; }
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
echo "$(basename "$program") $* under mpirun: 2 ranks x 4 rows = 1 process x 8 rows"
