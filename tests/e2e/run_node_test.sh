#!/usr/bin/env bash
# Runs a Node e2e script against the real `chorus serve` binary.
#   run_node_test.sh <script.mjs> <chorus binary> <node work dir> [needs-openai-sdk]
# With a 4th argument, installs the official OpenAI SDK (npm package `openai`) into
# <node work dir> first. A missing prerequisite (node, npm registry, shared model) skips the test
# (exit 77) — or fails it in CI, where CHORUS_REQUIRE_MODELS=1.
set -euo pipefail
script=$1
chorus=$2
workdir=$3
needs_sdk=${4:-}
here=$(cd "$(dirname "$0")" && pwd)

missing() {
  echo "e2e: $1" >&2
  if [ "${CHORUS_REQUIRE_MODELS:-0}" = 1 ]; then exit 1; fi
  exit 77
}

command -v node >/dev/null || missing "node is not installed"
models=$(cd "$here/../../.." && pwd)/shared/models
[ -f "$models/stories260K/stories260K.bin" ] || missing "$models/stories260K/stories260K.bin not found"
mkdir -p "$workdir"
if [ -n "$needs_sdk" ] && [ ! -f "$workdir/node_modules/openai/package.json" ]; then
  command -v npm >/dev/null || missing "npm is not installed"
  # flock: parallel ctest runs may reach here together.
  (
    flock 9
    if [ ! -f "$workdir/node_modules/openai/package.json" ]; then
      npm install --prefix "$workdir" --no-audit --no-fund --loglevel=error openai@4 >&2 ||
        missing "npm install openai failed (is the npm registry reachable?)"
    fi
  ) 9>"$workdir/.lock"
fi
export CHORUS_BIN="$chorus" CHORUS_MODELS="$models" CHORUS_NODE_DIR="$workdir"
exec node "$here/$script"
