#!/usr/bin/env bash
# The sanitizer builds (docs/sanitizers.md), run by .ci/run after the release suite:
#   scripts/sanitize.sh asan-ubsan   every CTest test under ASan + LeakSanitizer + UBSan
#   scripts/sanitize.sh tsan         the tests labelled `concurrency` under TSan
# Extra arguments go to ctest (e.g. `-R Engine`). Each build lives in build/<preset>; every
# sanitizer report (from test binaries and from the chorus processes the e2e scripts start) is
# written to build/<preset>/sanitizer-reports/ rather than stderr, so none can hide in a test that
# passes. Fails if a test fails or if any report was written; the last line is the summary.
set -euo pipefail
cd "$(dirname "$0")/.."

build="${1:-}"
case "$build" in
  asan-ubsan) target=all labels=() ;;
  tsan) target=concurrency_tests labels=(-L concurrency) ;;
  *)
    echo "usage: scripts/sanitize.sh asan-ubsan|tsan [ctest arguments]" >&2
    exit 2
    ;;
esac
shift

if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
fi
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"  # cache keys independent of the clone's folder
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"  # -g1 builds too (ccache hashes the folder by default)
start=$(date +%s)
cmake --preset "$build" >/dev/null
cmake --build "build/$build" -j"$(nproc)" --target "$target"
built=$(date +%s)

reports="$PWD/build/$build/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
# ASan aborts on the first error; LeakSanitizer checks every process at exit. An allocation beyond
# ASan's limit fails as it would without ASan (std::bad_alloc, or null from malloc) instead of
# ending the process: the behaviour under test stays that of the release build.
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:allocator_may_return_null=1:log_path=$reports/asan"
# -fno-sanitize-recover=undefined already makes every UBSan finding fatal; the stack says where.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"
# TSan reports every race (a process with one exits 66, failing its test). scripts/tsan.supp
# says which uninstrumented library's interceptor calls it cannot judge, and why.
export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp:log_path=$reports/tsan"

runner=()
if [ "$build" = tsan ]; then
  # TSan maps its shadow at fixed addresses; with a high vm.mmap_rnd_bits (newer kernels) a
  # randomized layout can collide with it ("unexpected memory mapping"). No ASLR avoids that.
  runner=(setarch "$(uname -m)" -R)
fi
set +e
"${runner[@]}" ctest --test-dir "build/$build" --output-on-failure -j2 "${labels[@]}" "$@" 2>&1 |
  tee "build/$build/ctest.log"
rc=${PIPESTATUS[0]}
set -e
done_at=$(date +%s)

count=$(find "$reports" -type f | wc -l)
if ((count > 0)); then
  echo "sanitize: $count sanitizer report(s) in $reports:"
  for f in "$reports"/*; do
    echo "---- $f"
    grep -m1 -B2 -A30 "ERROR\|WARNING\|runtime error" "$f" || head -40 "$f"
  done
fi
summary=$(grep -E "tests passed|tests failed" "build/$build/ctest.log" | tail -1 || true)
echo "sanitize: $build: ${summary:-no ctest summary}; sanitizer reports: $count" \
  "(build $((built - start)) s, tests $((done_at - built)) s)"
if ((rc != 0 || count > 0)); then
  exit 1
fi
