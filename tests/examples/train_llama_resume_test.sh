#!/usr/bin/env bash
# train_llama --save / --resume / --stop-after: a run stopped and resumed (twice, under other
# checkpoint plans) ends with the weights, optimizer state and loss curve of the run that never
# stopped, bit for bit; resuming with --stop-after before the file's step, or with other
# --steps/--seed/--batch/--lr, is refused. --save-hf over a saved folder replaces it whole,
# keeping the user's other files.
set -euo pipefail
train_llama=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
base=(--layers 2 --width 32 --heads 4 --kv-heads 2 --mlp 48 --context 16 --batch 4 --eval-every 5 --sample 0 --json)
small=("${base[@]}" --steps 24)
curve() { cut -d, -f1-4 "$1"; }

"$train_llama" "${small[@]}" --checkpoint none --log full.csv --save full.safetensors --save-hf full > full.json
"$train_llama" "${small[@]}" --checkpoint every --log part.csv --save part.safetensors --stop-after 7 > part.json
"$train_llama" "${small[@]}" --checkpoint sqrt --log part.csv --save part2.safetensors --resume part.safetensors --stop-after 16 > part2.json
"$train_llama" "${small[@]}" --checkpoint budget:0.2 --log part.csv --save resumed.safetensors --resume part2.safetensors --save-hf resumed > resumed.json
cmp <(curve full.csv) <(curve part.csv) || { echo "stop + resume does not reproduce the uninterrupted curve"; diff full.csv part.csv | head; exit 1; }
cmp full.safetensors resumed.safetensors || { echo "stop + resume does not reproduce the weights and optimizer state"; exit 1; }
cmp full/model.safetensors resumed/model.safetensors || { echo "--save-hf after a resume differs"; exit 1; }
[ "$(wc -l < part.csv)" -eq 25 ] || { echo "expected 24 steps in the resumed CSV"; cat part.csv; exit 1; }
field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" "$2"; }
[ "$(field first_val_loss resumed.json)" = "$(field first_val_loss full.json)" ] || { echo "first_val_loss lost on resume"; exit 1; }
[ "$(field final_val_loss resumed.json)" = "$(field final_val_loss full.json)" ] || { echo "final_val_loss differs after resume"; exit 1; }
[ "$(field steps part.json)" = 7 ] || { echo "--stop-after 7 did not stop at step 7"; cat part.json; exit 1; }

# refused: stopping before the step the file holds (it would save step 16's weights as step 3),
# and resuming with another plan of run
expect_error() {  # expect_error PATTERN ARGS...: exit status 1 and PATTERN on stderr
  local pattern=$1; shift
  local status=0
  "$train_llama" "$@" > out.txt 2> err.txt || status=$?
  [ "$status" -eq 1 ] || { echo "exit $status, not 1: $*"; cat err.txt; exit 1; }
  grep -q -- "$pattern" err.txt || { echo "no '$pattern' for: $*"; cat err.txt; exit 1; }
}
expect_error "--stop-after 3 is before step 16" "${small[@]}" --resume part2.safetensors --stop-after 3 --save x.safetensors
[ ! -e x.safetensors ] || { echo "a refused resume wrote a file"; exit 1; }
expect_error "resume with the --steps, --seed, --batch and --lr" "${base[@]}" --resume part2.safetensors --steps 30
expect_error "resume with the --steps, --seed, --batch and --lr" "${small[@]}" --resume part2.safetensors --seed 2
expect_error "resume with the --steps, --seed, --batch and --lr" "${small[@]}" --resume part2.safetensors --lr 0.001
expect_error "--resume and --init-from" "${small[@]}" --resume part2.safetensors --init-from full
# a file with its metadata damaged: a clear error, not an abort
sed 's/"step":"16"/"step":"1x"/' part2.safetensors > damaged.safetensors
cmp -s part2.safetensors damaged.safetensors && { echo "the damage did not apply"; exit 1; }
expect_error "invalid 'step' metadata value '1x'" "${small[@]}" --resume damaged.safetensors

cp full/model.safetensors before_model.safetensors
# --save-hf over a saved folder replaces it whole (io::save_folder; its failure midway is tested
# in tests/io/folder_test.cpp: a file size limit here would stop Open MPI's start-up instead):
# the user's other files stay, nothing is left beside it
echo '{"mine": true}' > full/tokenizer.json
"$train_llama" "${base[@]}" --steps 2 --save-hf full > out.txt
cmp -s full/model.safetensors before_model.safetensors && { echo "--save-hf did not replace the weights"; exit 1; }
grep -q '"mine"' full/tokenizer.json || { echo "--save-hf dropped the folder's other files"; exit 1; }
[ -z "$(ls -A | grep -e '\.tmp\.')" ] || { echo "--save-hf left temporaries:"; ls -A; exit 1; }
echo "train_llama: stop + resume reproduces the uninterrupted run; bad resumes and failed saves are clean"
