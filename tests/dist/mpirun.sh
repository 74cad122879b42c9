#!/usr/bin/env bash
# mpirun.sh RANKS PROGRAM [ARGS]: runs PROGRAM on RANKS processes of this machine.
# --oversubscribe allows more ranks than cores; Open MPI refuses to run as root unless told.
set -euo pipefail
ranks=$1
shift
flags=(--oversubscribe -np "$ranks")
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
exec mpirun "${flags[@]}" "$@"
