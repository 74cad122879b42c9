#!/usr/bin/env bash
# generate: on a tiny hub folder made at test time (make_hub_folder.sh): the prompt's ids are the
# tokenizer's (one per character here), the text is the new ids decoded, every greedy token is
# the full forward's argmax (--verify re-runs the model without a cache), with NF4 storage and
# with LoRA adapters from finetune too; a stop string ends the continuation where it first
# appears, one begun in the prompt too (StopStringCriteria); a seed reproduces a sampled
# continuation; a NUL in the text is printed; eos ids come from generation_config.json, else
# config.json; generation_config.json's sampling and repetition penalty are followed unless flags
# override them, and its fields that would choose other tokens (or unknown ones) are refused by
# name; bad flags are one line and exit 1.
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
field() { last_json "$1" | sed -n "s/.*\"$2\":\(\[[^]]*\]\|\"[^\"]*\"\|[^,}]*\).*/\1/p"; }
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

# A model whose head is padded past its tokenizer's vocabulary (Qwen2.5's has 271 rows more): an
# id drawn there decodes to nothing, as tokenizers' decode leaves it out. Here the tokenizer loses
# ids 86 to 95 ('u' to '~', none in the prompt); near-uniform draws reach them within a few seeds.
cp -r hub padded
sed -i -E 's/, "[^"]": (8[6-9]|9[0-5])//g' padded/tokenizer.json
[ "$(grep -o '"vocab".*' padded/tokenizer.json | grep -o '": [0-9]' | wc -l)" = 86 ] \
  || fail "the padded tokenizer does not have 86 tokens"
drew_padded=false
for seed in 1 2 3 4 5 6 7 8; do
  "$generate" --base padded --prompt "$prompt" --max-new-tokens 32 --temperature 4 --top-k 0 --seed $seed \
    --json > padded.txt || fail "seed $seed: $(cat padded.txt)"
  ids=$(field padded.txt new_ids | tr -d '[]' | tr ',' ' ')
  kept=""
  for id in $ids; do
    if [ "$id" -ge 86 ]; then drew_padded=true; else kept+="${kept:+,}$id"; fi
  done
  text=$(text_of "[$kept]")
  last_json padded.txt | grep -qF "\"text\":$(json_string "${text%.}")," \
    || fail "seed $seed: the text is not the ids below 86 decoded: $(cat padded.txt)"
  $drew_padded && break
done
$drew_padded || fail "no seed drew an id past the tokenizer's vocabulary: $(cat padded.txt)"

# a stop string begun in the prompt ends at the first new token that completes it (transformers'
# StopStringCriteria matches the prompt's text and the new tokens' together)
first=$(echo "$new_ids" | tr -d '[]' | cut -d, -f1)
"$generate" --base hub --prompt "$prompt" --max-new-tokens 12 --stop "${prompt: -1}${continuation:0:1}" \
  --json > span.txt
[ "$(field span.txt stop_reason)" = '"stop_string"' ] && [ "$(field span.txt new_ids)" = "[$first]" ] \
  || fail "a stop string across the prompt did not stop at the first token: $(cat span.txt)"
# one wholly inside the prompt never stops
"$generate" --base hub --prompt "$prompt" --max-new-tokens 4 --stop "$prompt" --json > inside.txt
[ "$(field inside.txt stop_reason)" = '"length"' ] || fail "the prompt's text stopped: $(cat inside.txt)"

# the printed text is written whole: a NUL in it (a token decoding to byte 0) does not cut it.
# A folder whose token for one letter of the continuation (not in the prompt) is byte 0's, Ā.
letter=$(printf '%s' "$continuation" | tr -cd 'a-z' | tr -d "$(printf '%s' "$prompt" | tr 'A-Z' 'a-z')" | head -c 1)
[ -n "$letter" ] || fail "no letter of '$continuation' outside the prompt"
cp -r hub nul
sed -i "s/\"$letter\": /\"\\\\u0100\": /" nul/tokenizer.json
grep -q '"\\u0100"' nul/tokenizer.json || fail "no NUL token written"
"$generate" --base nul --prompt "$prompt" --max-new-tokens 12 > nul.txt
[ "$(wc -c < nul.txt)" = 13 ] || fail "the text with a NUL printed as $(wc -c < nul.txt) bytes, not 12 + newline"
[ "$(tr -d '\000' < nul.txt | wc -c)" -lt 13 ] || fail "no NUL in the printed text"

# end-of-sequence ids: config.json's when there is no generation_config.json (null here: none),
# else generation_config.json's; the third new token as eos stops there
[ "$(field greedy.txt eos_ids)" = '[]' ] || fail "eos ids $(field greedy.txt eos_ids), config.json has null"
third=$(echo "$new_ids" | tr -d '[]' | cut -d, -f3)
cp -r hub cfg_eos
sed -i "s/\"eos_token_id\": null/\"eos_token_id\": [$third]/" cfg_eos/config.json
"$generate" --base cfg_eos --prompt "$prompt" --max-new-tokens 12 --json > cfg_eos.txt
[ "$(field cfg_eos.txt eos_ids)" = "[$third]" ] && [ "$(field cfg_eos.txt stop_reason)" = '"eos"' ] \
  || fail "config.json's eos_token_id not used: $(cat cfg_eos.txt)"
cp -r hub gen
echo "{\"eos_token_id\": $third, \"pad_token_id\": 0, \"bos_token_id\": 1, \"max_length\": 20, \"transformers_version\": \"4.51.0\"}" \
  > gen/generation_config.json
"$generate" --base gen --prompt "$prompt" --max-new-tokens 12 --json > gen_eos.txt
[ "$(field gen_eos.txt eos_ids)" = "[$third]" ] && [ "$(field gen_eos.txt stop_reason)" = '"eos"' ] \
  || fail "generation_config.json's eos_token_id not used: $(cat gen_eos.txt)"

# generation_config.json's sampling when no flag chooses: top_k 50 when it sets none; the flags
# override it; its repetition penalty applies under every choice unless --repetition-penalty
sampled() {
  echo "$1" > gen/generation_config.json
  shift
  "$generate" --base gen --prompt "$prompt" --max-new-tokens 3 --json "$@" > cfg.txt
  echo "$(last_json cfg.txt | sed -n 's/.*"sampling":\(null\|{[^}]*}\).*/\1/p') $(field cfg.txt repetition_penalty)"
}
[ "$(sampled '{"do_sample": true, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}')" \
  = '{"temperature":0.7,"top_k":20,"top_p":0.8,"seed":0} 1.05' ] || fail "file sampling: $(cat cfg.txt)"
[ "$(sampled '{"do_sample": true, "temperature": 0.7}' --seed 4)" \
  = '{"temperature":0.7,"top_k":50,"top_p":1.0,"seed":4} 1.0' ] || fail "file sampling, top_k 50: $(cat cfg.txt)"
[ "$(sampled '{"do_sample": true, "top_k": 20, "repetition_penalty": 1.05}' --greedy)" = 'null 1.05' ] \
  || fail "--greedy over the file: $(cat cfg.txt)"
[ "$(sampled '{"do_sample": true, "top_k": 20}' --temperature 1.5 --repetition-penalty 1.2)" \
  = '{"temperature":1.5,"top_k":50,"top_p":1.0,"seed":0} 1.2' ] || fail "flags over the file: $(cat cfg.txt)"
[ "$(sampled '{"do_sample": false, "temperature": 0.7, "min_p": 0.1}')" = 'null 1.0' ] \
  || fail "a greedy file's sampling fields: $(cat cfg.txt)"
[ "$(sampled '{"num_beams": 4}' --greedy)" = 'null 1.0' ] || fail "--greedy over num_beams: $(cat cfg.txt)"
[ "$(sampled '{"do_sample": true, "top_k": null}' --temperature 1)" \
  = '{"temperature":1.0,"top_k":50,"top_p":1.0,"seed":0} 1.0' ] || fail "--temperature over a null top_k: $(cat cfg.txt)"
[ "$(sampled '{"cache_implementation": "static", "cache_config": {"max_cache_len": 64}}')" = 'null 1.0' ] \
  || fail "a static cache: $(cat cfg.txt)"
# a greedy file with a penalty: --verify checks the penalized argmax
echo '{"repetition_penalty": 1.5}' > gen/generation_config.json
"$generate" --base gen --prompt "$prompt" --max-new-tokens 8 --verify --json > pen.txt
[ "$(field pen.txt full_forward_agrees)" = true ] || fail "penalized greedy vs the full forward: $(cat pen.txt)"

# --chat with the folder's chat template (here Mistral Instruct v0.1's, no bos token set): the
# prompt as a user turn, the template's bytes encoded without added special tokens
cp -r hub chat
with_template() {  # with_template NAME: hub's tokenizer_config.json with templates.json's NAME
  python3 - "$here/../hub/chat/templates.json" "$1" hub/tokenizer_config.json > chat/tokenizer_config.json <<'PY'
import json, sys
templates = {t["name"]: t for t in json.load(open(sys.argv[1], encoding="utf-8"))}
text = templates[sys.argv[2]]["template"] if sys.argv[2] in templates else sys.argv[2]
config = json.load(open(sys.argv[3], encoding="utf-8"))
config["chat_template"] = text
print(json.dumps(config))
PY
}
with_template mistral
"$generate" --base chat --chat --prompt "$prompt" --max-new-tokens 2 --json > chat.txt
[ "$(field chat.txt prompt_ids)" = "$(ids_of "[INST] $prompt [/INST]")" ] \
  || fail "--chat prompt ids $(field chat.txt prompt_ids), expected $(ids_of "[INST] $prompt [/INST]")"

# bad flags: one line on standard error, exit status 1; --help exits 0
"$generate" --help > /dev/null
bad() {
  local status=0
  "$generate" "$@" > out.txt 2> err.txt || status=$?
  [ "$status" = 1 ] || fail "exit status $status for: $*"
  [ "$(wc -l < err.txt)" = 1 ] || fail "not one line for: $*: $(cat err.txt)"
  grep -q "$expect" err.txt || fail "'$expect' not in: $(cat err.txt)"
}
# generation_config.json fields that would choose other tokens, unknown fields, bad eos ids
refused() {
  echo "$1" > gen/generation_config.json
  shift
  bad --base gen --prompt x --max-new-tokens 2 "$@"
}
expect="field 'num_beams' is 4: beam search" refused '{"num_beams": 4}'
expect="field 'min_p' is 0.1: min-p" refused '{"do_sample": true, "min_p": 0.1}'
expect="field 'no_repeat_ngram_size' is 3" refused '{"no_repeat_ngram_size": 3}' --greedy
expect="field 'suppress_tokens' is \[5\]" refused '{"suppress_tokens": [5]}' --temperature 1
expect="field 'my_setting' is 1: remat does not know" refused '{"my_setting": 1}'
expect="field 'eos_token_id' is 4294967298: 4294967298 is not a token id" refused '{"eos_token_id": 4294967298}'
expect="field 'eos_token_id' is \[2,-1\]: -1 is not a token id" refused '{"eos_token_id": [2, -1]}'
expect="field 'temperature' is 0.0: sampling needs" refused '{"do_sample": true, "temperature": 0.0}'
expect="verify checks greedy tokens, and generation_config.json" refused '{"do_sample": true}' --verify
# a cache that changes the keys and values, or one transformers does not know; a null top_k,
# which transformers' versions read differently (no top-k, or 50)
expect="field 'cache_implementation' is \"quantized\": remat's KV cache" \
  refused '{"cache_implementation": "quantized", "cache_config": {"nbits": 2}}'
expect="field 'cache_implementation' is \"mine\"" refused '{"cache_implementation": "mine"}' --greedy
expect="field 'top_k' is null: transformers v4" refused '{"do_sample": true, "top_k": null}'
rm gen/generation_config.json
base=(--base hub --prompt x)
expect="max-new-tokens must be >= 1" bad "${base[@]}" --max-new-tokens 0
expect="temperature must be" bad "${base[@]}" --max-new-tokens 2 --temperature -1
expect="need --temperature" bad "${base[@]}" --max-new-tokens 2 --top-k 3
expect="top-p must be in" bad "${base[@]}" --max-new-tokens 2 --temperature 1 --top-p 1.5
expect="storage must be" bad "${base[@]}" --max-new-tokens 2 --storage q3
expect="max-new-tokens" bad --base hub --prompt x
expect="nowhere" bad --base nowhere --prompt x --max-new-tokens 2
expect="max_position_embeddings" bad "${base[@]}" --max-new-tokens 100000
expect="add up to more positions" bad "${base[@]}" --max-new-tokens 9223372036854775807
expect="is not an integer in \[0, 2^64 - 1\]" bad "${base[@]}" --max-new-tokens 2 --temperature 1 --seed -1
expect="is not an integer in \[0, 2^64 - 1\]" bad "${base[@]}" --max-new-tokens 2 --temperature 1 \
  --seed 18446744073709551616
expect="nothing is drawn" bad "${base[@]}" --max-new-tokens 2 --seed 3
expect="greedy draws nothing" bad "${base[@]}" --max-new-tokens 2 --greedy --temperature 1
expect="is not an integer in \[0, 1024\]" bad "${base[@]}" --max-new-tokens 2 --threads 5000
expect="is not an integer in \[0, 1024\]" bad "${base[@]}" --max-new-tokens 2 --threads -1
expect="repetition-penalty must be" bad "${base[@]}" --max-new-tokens 2 --repetition-penalty 0
expect="temperature 1e-310 is too small" bad "${base[@]}" --max-new-tokens 2 --temperature 1e-310
expect="chat: hub has no chat template" bad "${base[@]}" --max-new-tokens 2 --chat
expect="system is a chat turn: it needs --chat" bad "${base[@]}" --max-new-tokens 2 --system hi
expect="no-thinking renders a chat template: it needs --chat" bad "${base[@]}" --max-new-tokens 2 --no-thinking
# what the folder's template cannot take, named before the weights are read
expect="system: the chat template of chat (Mistral Instruct v0.1) accepts no system message" \
  bad --base chat --prompt x --max-new-tokens 2 --chat --system hi
expect="no-thinking: the chat template of chat (Mistral Instruct v0.1) does not read enable_thinking" \
  bad --base chat --prompt x --max-new-tokens 2 --chat --no-thinking
with_template "{{ messages }}"
expect="chat: hub::recognise_chat_template: unknown chat template family" \
  bad --base chat --prompt x --max-new-tokens 2 --chat
echo "generate_test: ok"
