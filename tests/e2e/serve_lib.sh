# Shared by the shell tests that run `chorus serve` (source it after setting $chorus and $tmp,
# with a fail() function defined).
#
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
