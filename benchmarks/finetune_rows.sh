#!/usr/bin/env bash
# The real-size fine-tuning rows of docs/benchmarks.md: QLoRA (NF4, LoRA r16 on all seven
# linears, the chunked loss) on a Qwen2.5-0.5B-shaped and a 2B-class hub folder, with a
# checkpoint per layer and without, on 1 and 2 threads, interleaved in rounds (the 2B-class rows
# in the first round only: a step is one to two minutes); then PyTorch 1.13's LoRA step on the
# 0.5B shape (benchmarks/torch_lora_step.py, `torch.utils.checkpoint` per layer) on 1 and 2
# threads in each round. Prints one line per run: its round, its name, finetune's --json line
# (counted and estimated split, median step, tokens/s, peak resident) and GNU time's maximum
# resident size in KiB.
#
#   benchmarks/finetune_rows.sh BUILD_DIR Q05_DIR Q2B_DIR DOC.txt [ROUNDS]
#
# The folders: benchmarks/make_hub_folder.py DIR [--2b-class] --tokenizer QWEN3_TOKENIZER_DIR.
# DOC.txt: any text of a few hundred KB (finetune cuts it into windows of --max-tokens).
set -euo pipefail
build=${1:?usage: finetune_rows.sh BUILD_DIR Q05_DIR Q2B_DIR DOC.txt [ROUNDS]}
q05=${2:?Q05_DIR}
q2b=${3:?Q2B_DIR}
doc=${4:?DOC.txt}
rounds=${5:-3}
here=$(cd "$(dirname "$0")" && pwd)
clean=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
measured=$(mktemp)
trap 'rm -f "$measured"' EXIT

# run NAME COMMAND...: one line, the command's last output line (or that it failed) and its peak
# resident KiB
run() {
  local name=$1
  shift
  local last
  last=$("${clean[@]}" /usr/bin/time -f '%M' -o "$measured" "$@" 2>/dev/null | tail -1) ||
    last="failed: $*"
  echo "round $round $name $last {\"time_max_rss_kib\": $(cat "$measured")}"
}

finetune=("$build/examples/finetune" --data "$doc" --eval-every 100 --eval-batches 1 --rank 16
  --alpha 32 --lr 2e-4 --json)

for round in $(seq 1 "$rounds"); do
  for plan in every none; do
    for t in 2 1; do
      run "0.5B/1x512/$plan/${t}t" "${finetune[@]}" --base "$q05" --max-tokens 513 --batch 1 \
        --steps 4 --checkpoint "$plan" --threads "$t"
      if [ "$round" -eq 1 ]; then
        run "2B/2x1024/$plan/${t}t" "${finetune[@]}" --base "$q2b" --max-tokens 1025 --batch 2 \
          --steps 2 --checkpoint "$plan" --threads "$t"
      fi
    done
  done
  for t in 2 1; do
    run "torch/0.5B/1x512/every/${t}t" /usr/bin/python3 "$here/torch_lora_step.py" --batch 1 \
      --seq 512 --checkpoint every --loss chunked --chunk-rows 64 --threads "$t" --steps 3 --json
  done
done
