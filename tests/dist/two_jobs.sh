#!/usr/bin/env bash
# two_jobs.sh MPIRUN_SH DIST_TEST: two separate 2-rank jobs print the same fingerprint of the
# trained parameters (bitwise-identical runs).
set -euo pipefail
mpirun_sh=$1
program=$2
run() { bash "$mpirun_sh" 2 "$program" "two runs with the same ranks are bitwise identical" | grep "dist fingerprint"; }
a=$(run)
b=$(run)
echo "$a"
echo "$b"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "two jobs differ"; exit 1; }
