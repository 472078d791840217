#!/usr/bin/env bash
# `chorus serve --lora-resolve-dir DIR` through the real binary (docs/adapters.md, "Adapters
# added while serving"): an adapter copied into DIR after start is registered on the first
# request that names it and answers as the same adapter registered at start does; /v1/models
# lists it from then on; a name with no entry is the usual 404; a broken entry is an error
# naming the file, nothing is registered and the server keeps serving; names never leave DIR.
# Usage: cli_lora_resolve_test.sh CHORUS MODELS_DIR
# Exit 77 (skip) when MODELS_DIR is missing, unless CHORUS_REQUIRE_MODELS=1 (CI): then it fails.
set -euo pipefail
chorus=$1
models=$2
source "$(dirname "$0")/serve_lib.sh"

# The real LoRA fine-tune of stories260K ("things"), under two names.
lora=$models/stories260K-finetunes/things/lora
[[ -f $lora/adapter_config.json ]] || fail "missing $lora"
mkdir -p "$tmp/made" "$tmp/live" "$tmp/fixed"
cp -r "$lora" "$tmp/made/lora-0"
cp -r "$lora" "$tmp/made/lora-1"
cp -r "$tmp/made/lora-0" "$tmp/fixed/"

# serve_as NAME ARGS...: the base with its own registry file NAME, and ARGS.
serve_as() {
  serve --model "$base" --tokenizer "$tok" --served-model-name base \
    --registry "$tmp/registry-$1.json" "${@:2}"
}
# post MODEL: the HTTP status, the body in $tmp/body.
post() {
  curl -s -o "$tmp/body" -w '%{http_code}' "$url/v1/completions" \
    -d "{\"model\":\"$1\",\"prompt\":\"They went to the\",\"max_tokens\":12,\"temperature\":0}"
}
text() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$tmp/body"; }

# The reference: lora-0 registered at start.
serve_as a --lora-dir "$tmp/fixed"
[[ $(post lora-0) == 200 ]] || fail "fixed lora-0: $(cat "$tmp/body")"
want=$(text)
[[ $(post base) == 200 ]] || fail "base: $(cat "$tmp/body")"
[[ $(text) != "$want" ]] || fail "the adapter does not change the output"
stop

serve_as b --lora-resolve-dir "$tmp/live"
[[ $(post lora-0) == 404 ]] || fail "no entry yet: expected 404, got $(cat "$tmp/body")"
grep -q model_not_found "$tmp/body" || fail "404 body: $(cat "$tmp/body")"
cp -r "$tmp/made/lora-0" "$tmp/live/"  # added while serving
[[ $(post lora-0) == 200 ]] || fail "resolved lora-0: $(cat "$tmp/body")"
[[ $(text) == "$want" ]] || fail "resolved lora-0 answers '$(text)', registered at start: '$want'"
grep -q "registered adapter 'lora-0'" "$tmp/err" || fail "no log line: $(cat "$tmp/err")"
curl -sf "$url/v1/models" | grep -q '"id":"lora-0"' || fail "/v1/models does not list lora-0"
# Concurrent first requests for another new adapter: each is served, it is registered once.
cp -r "$tmp/made/lora-1" "$tmp/live/"
clients=()
for i in 1 2 3 4; do
  post lora-1 >"$tmp/status$i" &
  clients+=($!)
done
wait "${clients[@]}"
for i in 1 2 3 4; do [[ $(cat "$tmp/status$i") == 200 ]] || fail "concurrent lora-1 #$i: $(cat "$tmp/status$i")"; done
[[ $(grep -c "registered adapter 'lora-1'" "$tmp/err") == 1 ]] || fail "lora-1 registered more than once"
# A broken entry: 400 naming the file; the server goes on.
mkdir "$tmp/live/broken" "$tmp/live/empty"
cp "$lora/adapter_config.json" "$tmp/live/broken/"
head -c 1000 "$lora/adapter_model.safetensors" >"$tmp/live/broken/adapter_model.safetensors"
[[ $(post broken) == 400 ]] || fail "truncated entry: expected 400, got $(cat "$tmp/body")"
grep -q "adapter_model.safetensors" "$tmp/body" || fail "truncated message: $(cat "$tmp/body")"
cp "$lora/adapter_config.json" "$tmp/live/empty/"
[[ $(post empty) == 404 ]] || fail "entry without weights: expected 404, got $(cat "$tmp/body")"
grep -q "no adapter_model.safetensors" "$tmp/body" || fail "missing-file message: $(cat "$tmp/body")"
curl -sf "$url/v1/models" | grep -q '"id":"broken"' && fail "a broken entry was registered"
# Names that would leave the directory, or hidden entries, are never looked up.
mkdir -p "$tmp/live/.hidden" && cp -r "$tmp/made/lora-0/." "$tmp/live/.hidden/"
for name in ../fixed/lora-0 .hidden ..; do
  [[ $(post "$name") == 404 ]] || fail "'$name': expected 404, got $(cat "$tmp/body")"
done
[[ $(post base) == 200 ]] || fail "base after the bad requests: $(cat "$tmp/body")"
stop
echo PASS
