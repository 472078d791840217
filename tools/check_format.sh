#!/usr/bin/env bash
# Checks that every tracked C++ file is formatted by clang-format (.clang-format: Google style,
# 100 columns). `tools/check_format.sh --fix` rewrites the files instead. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/check_format.$$; then
  grep -m 20 "error:" /tmp/check_format.$$ >&2 || true
  echo "check_format: $(grep -c 'error:' /tmp/check_format.$$) places differ from clang-format; run tools/check_format.sh --fix" >&2
  rm -f /tmp/check_format.$$
  exit 1
fi
rm -f /tmp/check_format.$$
echo "check_format: ${#files[@]} files formatted"
