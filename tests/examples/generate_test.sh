#!/usr/bin/env bash
# generate: on a tiny hub folder made at test time (make_hub_folder.sh): the prompt's ids are the
# tokenizer's (one per character here), the text is the new ids decoded, every greedy token is
# the full forward's argmax (--verify re-runs the model without a cache), with NF4 storage and
# with LoRA adapters from finetune too; a stop string ends the continuation where it first
# appears; a seed reproduces a sampled continuation; bad flags are one line and exit 1.
set -euo pipefail
train_llama=$1
finetune=$2
generate=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
bash "$here/make_hub_folder.sh" "$train_llama" hub

last_json() { tail -n 1 "$1"; }
field() { last_json "$1" | sed -n "s/.*\"$2\":\([^]]*\]\|\"[^\"]*\"\|[^,}]*\).*/\1/p"; }
fail() { echo "generate_test: $*"; exit 1; }

# ids of a text in the generated tokenizer: newline 0, space..'~' 1..95
ids_of() {
  local text=$1 out="" i code
  for ((i = 0; i < ${#text}; i++)); do
    code=$(printf '%d' "'${text:i:1}")
    out+="${out:+,}$((code - 31))"
  done
  echo "[$out]"
}
text_of() {  # a JSON array of ids -> the text they stand for (a trailing '.' keeps newlines)
  local id out=""
  for id in $(echo "$1" | tr -d '[]' | tr ',' ' '); do
    if [ "$id" = 0 ]; then out+=$'\n'; else out+=$(printf "\\$(printf '%03o' $((id + 31)))"); fi
  done
  printf '%s.' "$out"
}
json_string() {  # the JSON text of a string: backslash, quote and newline escaped
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "${s//$'\n'/\\n}"
}

prompt="The cat"
"$generate" --base hub --prompt "$prompt" --max-new-tokens 12 --verify --json > greedy.txt
for key in prompt_ids new_ids text seconds_per_token prefill_seconds cache_bytes stop_reason; do
  last_json greedy.txt | grep -q "\"$key\"" || fail "JSON field $key missing: $(cat greedy.txt)"
done
[ "$(field greedy.txt full_forward_agrees)" = true ] || fail "greedy differs from the full forward: $(cat greedy.txt)"
[ "$(field greedy.txt prompt_ids)" = "$(ids_of "$prompt")" ] \
  || fail "prompt ids $(field greedy.txt prompt_ids), expected $(ids_of "$prompt")"
new_ids=$(field greedy.txt new_ids)
[ "$(echo "$new_ids" | tr ',' '\n' | wc -l)" = 12 ] || fail "expected 12 new ids: $new_ids"
continuation=$(text_of "$new_ids")
continuation=${continuation%.}
last_json greedy.txt | grep -qF "\"text\":$(json_string "$continuation")," \
  || fail "the text is not the new ids decoded, $(json_string "$continuation"): $(cat greedy.txt)"
# the cache: 2 x 2 layers x (7 + 12) positions x 2 kv heads x 8 x 4 bytes
[ "$(field greedy.txt cache_bytes)" = $((2 * 2 * 19 * 2 * 8 * 4)) ] || fail "cache_bytes $(field greedy.txt cache_bytes)"

# a stop string: the 4th and 5th characters of the greedy continuation
stop=${continuation:3:2}
"$generate" --base hub --prompt "$prompt" --max-new-tokens 12 --stop "$stop" --json > stop.txt
[ "$(field stop.txt stop_reason)" = '"stop_string"' ] || fail "no stop: $(cat stop.txt)"
before=${continuation%%"$stop"*}  # the text before the stop string's first appearance
head_len=$(( ${#before} + ${#stop} ))
[ "$(text_of "$(field stop.txt new_ids)")" = "${continuation:0:head_len}." ] \
  || fail "stopped at $(field stop.txt new_ids), expected the greedy ids up to '$stop'"

# NF4 storage and LoRA adapters (trained briefly by finetune): still the full forward's argmax
"$generate" --base hub --prompt "$prompt" --max-new-tokens 8 --storage nf4 --verify --json > nf4.txt
[ "$(field nf4.txt full_forward_agrees)" = true ] || fail "NF4: $(cat nf4.txt)"
"$finetune" --base hub --steps 3 --batch 2 --context 32 --eval-every 3 --eval-batches 1 --json \
  --storage nf4 --save-adapters adapters > /dev/null
"$generate" --base hub --adapters adapters --storage nf4 --prompt "$prompt" --max-new-tokens 8 \
  --verify --json > lora.txt
[ "$(field lora.txt full_forward_agrees)" = true ] || fail "LoRA: $(cat lora.txt)"

# sampling: a seed reproduces the continuation
sample=(--base hub --prompt "$prompt" --max-new-tokens 10 --temperature 0.9 --top-k 20 --top-p 0.95 --json)
"$generate" "${sample[@]}" --seed 5 > s1.txt
"$generate" "${sample[@]}" --seed 5 > s2.txt
[ "$(field s1.txt new_ids)" = "$(field s2.txt new_ids)" ] || fail "seed 5 gave two continuations"

# bad flags: one line on standard error, exit status 1; --help exits 0
"$generate" --help > /dev/null
bad() {
  local status=0
  "$generate" "$@" > out.txt 2> err.txt || status=$?
  [ "$status" = 1 ] || fail "exit status $status for: $*"
  [ "$(wc -l < err.txt)" = 1 ] || fail "not one line for: $*: $(cat err.txt)"
  grep -q "$expect" err.txt || fail "'$expect' not in: $(cat err.txt)"
}
base=(--base hub --prompt x)
expect="max-new-tokens must be >= 1" bad "${base[@]}" --max-new-tokens 0
expect="temperature must be" bad "${base[@]}" --max-new-tokens 2 --temperature -1
expect="need --temperature" bad "${base[@]}" --max-new-tokens 2 --top-k 3
expect="top-p must be in" bad "${base[@]}" --max-new-tokens 2 --temperature 1 --top-p 1.5
expect="storage must be" bad "${base[@]}" --max-new-tokens 2 --storage q3
expect="max-new-tokens" bad --base hub --prompt x
expect="nowhere" bad --base nowhere --prompt x --max-new-tokens 2
expect="max_position_embeddings" bad "${base[@]}" --max-new-tokens 100000
echo "generate_test: ok"
