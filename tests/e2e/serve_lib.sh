# Shared by the shell tests that run `chorus serve` on stories260K. Source it after setting
# $chorus (the binary) and $models (../shared/models). It sets $base and $tok (exiting 77, a
# skip, when they are missing, unless CHORUS_REQUIRE_MODELS=1: then 1), a temporary $tmp removed
# at exit with any server still running, and fail().
base=$models/stories260K/stories260K.bin
tok=$models/stories260K/tok512.bin
if [[ ! -f $base || ! -f $tok ]]; then
  echo "shared models not found under $models"
  [[ ${CHORUS_REQUIRE_MODELS:-0} == 1 ]] && exit 1
  exit 77
fi
tmp=$(mktemp -d)
pid=""
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# serve ARGS...: starts `chorus serve` on a free loopback port with ARGS, waits until it prints
# the URL it serves at, and sets $pid and $url; its stdout and stderr go to $tmp/out and
# $tmp/err (emptied first). Fails when the server exits or does not start within 30 s.
serve() {
  : >"$tmp/out"  # exists before the background job opens it (the first sed may run first)
  : >"$tmp/err"
  "$chorus" serve --port 0 --host 127.0.0.1 --threads 1 "$@" >>"$tmp/out" 2>>"$tmp/err" &
  pid=$!
  for _ in $(seq 1 300); do
    url=$(sed -n 's|.*serving ".*" at \(http://[^ ]*\)/v1 .*|\1|p' "$tmp/out")
    [[ -n $url ]] && return 0
    kill -0 "$pid" 2>/dev/null || fail "server exited: $(cat "$tmp/err")"
    sleep 0.1
  done
  fail "server did not start: $(cat "$tmp/err")"
}

# stop: ends the server `serve` started.
stop() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
}
