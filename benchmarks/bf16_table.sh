#!/usr/bin/env bash
# The BF16 training table of docs/benchmarks.md: remat float32, remat BF16, PyTorch float32 and
# PyTorch's CPU autocast (torch_reference.py --config best), interleaved in rounds so that a
# machine's drift reaches every column alike. Prints one JSON line per run (remat_bench's and
# torch_reference.py's own), each prefixed by its round; take medians per row.
#
#   benchmarks/bf16_table.sh BUILD_DIR [ROUNDS] [MODELS] [MODES] [THREADS]
#   e.g. benchmarks/bf16_table.sh build/release 3 "mlp gpt" "none every" "1 2"
#
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the environment: remat picks OpenBLAS's
# kernels itself, and torch_reference.py's `best` sets its own.
set -euo pipefail
build=${1:?usage: bf16_table.sh BUILD_DIR [ROUNDS] [MODELS] [MODES] [THREADS]}
rounds=${2:-3}
models=${3:-mlp gpt}
modes=${4:-none every}
threads=${5:-1 2}
here=$(cd "$(dirname "$0")" && pwd)
clean=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
for round in $(seq 1 "$rounds"); do
  for model in $models; do
    for mode in $modes; do
      for t in $threads; do
        for dtype in f32 bf16; do
          echo "round $round remat $("${clean[@]}" "$build/benchmarks/remat_bench" --model "$model" \
            --mode "$mode" --dtype "$dtype" --threads "$t" --steps 5 2>/dev/null | tail -1)"
          echo "round $round torch $("${clean[@]}" /usr/bin/python3 "$here/torch_reference.py" \
            --model "$model" --mode "$mode" --dtype "$dtype" --threads "$t" --steps 5 \
            --config best 2>/dev/null | tail -1)"
        done
      done
    done
  done
done
