#!/usr/bin/env bash
# failure.sh MPIRUN_SH DIST_FAIL: a rank that throws, and a rank that is killed, each end a
# 2-rank job (3 ranks for the kill) with a non-zero status and a message, within 30 s.
set -uo pipefail
mpirun_sh=$1
program=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for case in "2 throw" "3 kill"; do
  set -- $case
  start=$(date +%s)
  timeout 90 bash "$mpirun_sh" "$1" "$program" "$2" > "$out" 2>&1
  status=$?
  seconds=$(( $(date +%s) - start ))
  echo "== $2 on $1 ranks: exit status $status after $seconds s"
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then cat "$out"; echo "the job did not fail as it should"; exit 1; fi
  if [ "$seconds" -gt 30 ]; then cat "$out"; echo "the job took more than 30 s to end"; exit 1; fi
  case $2 in
    throw) grep -q "rank 1: boom: a failure injected" "$out" || { cat "$out"; echo "no message from the failing rank"; exit 1; } ;;
    kill) grep -qi "signal 9\|killed" "$out" || { cat "$out"; echo "no message naming the killed rank"; exit 1; } ;;
  esac
done
echo "failing ranks end the job"
