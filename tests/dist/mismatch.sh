#!/usr/bin/env bash
# mismatch.sh MPIRUN_SH PROGRAM: two ranks started with one flag different (mpirun's
# "-np 1 A : -np 1 B") must both stop within 30 s, non-zero, each with one line naming the flag
# and both values. Before the ranks compared their settings, --heads, --batch and --seed trained
# on silently, --steps hung forever, and --width and --layers crashed inside Open MPI.
set -uo pipefail
mpirun_sh=$1
program=$2
name=$(basename "$program")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
small=(--layers 1 --width 16 --heads 2 --context 8 --batch 2 --steps 4 --eval-every 4
       --eval-batches 1 --sample 0 --threads 1 --save "")
case $name in
  train_gpt) cases=("--heads 2 4" "--batch 2 3" "--seed 1 2" "--steps 4 5" "--width 16 24"
                    "--layers 1 2" "--dropout 0 0.1") ;;
  train_llama) small=("${small[@]/--save/--save-hf}" --kv-heads 1 --mlp 16)  # flag value pairs
               cases=("--kv-heads 1 2" "--mlp 16 24" "--steps 4 6") ;;
  *) echo "mismatch.sh: unknown program $name"; exit 2 ;;
esac
failed=0
for case in "${cases[@]}"; do
  set -- $case
  flag=$1 a=$2 b=$3
  # the small run's flags without the one this case sets
  base=()
  for ((i = 0; i < ${#small[@]}; i += 2)); do
    [ "${small[i]}" = "$flag" ] || base+=("${small[i]}" "${small[i + 1]}")
  done
  start=$(date +%s)
  timeout 60 bash "$mpirun_sh" 1 "$program" "${base[@]}" "$flag" "$a" : \
    -np 1 "$program" "${base[@]}" "$flag" "$b" > "$out" 2>&1
  status=$?
  seconds=$(( $(date +%s) - start ))
  expected="rank 1 has $flag $b, rank 0 has $flag $a"
  lines=$(grep -c "^rank [01]: $name: the ranks were not started alike: $expected" "$out")
  echo "== $name $flag $a vs $b: exit status $status after $seconds s, $lines of 2 ranks said why"
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || [ "$seconds" -gt 30 ] || [ "$lines" -ne 2 ]; then
    cat "$out"
    echo "FAILED: expected both ranks to stop at once with: $expected"
    failed=1
  fi
done
# A rank that fails before the first collective (its --data cannot be read) ends the job at
# once, non-zero, with its message, while rank 0 waits in the agreement.
start=$(date +%s)
timeout 60 bash "$mpirun_sh" 1 "$program" "${small[@]}" : -np 1 "$program" "${small[@]}" \
  --data /nonexistent/corpus.txt > "$out" 2>&1
status=$?
seconds=$(( $(date +%s) - start ))
echo "== $name, rank 1 cannot read its --data: exit status $status after $seconds s"
if [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || [ "$seconds" -gt 30 ] ||
   ! grep -q "/nonexistent/corpus.txt" "$out"; then
  cat "$out"
  echo "FAILED: expected the job to end at once with a message naming rank 1's --data"
  failed=1
fi
[ "$failed" -eq 0 ] && echo "$name: ranks started unlike stop with the first difference"
exit "$failed"
