#!/usr/bin/env bash
# tools/plot.py, the one plotting tool: each kind turns a CSV of the matching benchmark into a
# PNG; a CSV of another kind is refused with a message naming the missing columns.
# usage: plot_tool_test.sh REPO_ROOT
set -euo pipefail
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
plot() { python3 "$root/tools/plot.py" "$@"; }
is_png() { [[ $(head -c 8 "$1" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]]; }

cat >"$tmp/punica.csv" <<'CSV'
shape,threads,isa,dtype,metric,batch,tokens_per_s,roofline_fraction,bandwidth_gbs,runs,adapters
tiny,2,avx512,q4_0,base,32,266.67,0,0,266.67,0
tiny,2,avx512,q4_0,distinct,32,234.5,0,0,234.5,32
CSV
cat >"$tmp/requests.csv" <<'CSV'
request,arrival_s,input_tokens,output_tokens,status,ttft_s,tpot_s,latency_s,completion_tokens,error,adapter,cold
0,0.0,16,8,200,0.07,0.05,0.5,8,"",0,1
1,0.5,16,8,200,0.06,0.04,0.4,8,"",1,1
2,0.9,16,8,503,0,0,0,0,"busy",-1,0
CSV
cat >"$tmp/slora.csv" <<'CSV'
n,requests_ok,errors,req_s,output_tok_s,ttft_p50,ttft_p99,tpot_p50,tpot_p99,ttft_cold_p50,ttft_warm_p50,cold_over_warm_p50,distinct_used,load_avg
100,60,0,1.0,37.2,0.18,0.33,0.02,0.05,0.18,0.18,1.01,46,0.35
1000,60,0,1.0,37.1,0.19,0.34,0.02,0.05,0.2,0.18,1.08,50,0.4
CSV
cat >"$tmp/loss.csv" <<'CSV'
step,epoch,lr,loss,grad_norm,tokens_per_s,elapsed_s,eval_loss
1,0.04,0.0002,0.98,0.33,1400.0,1.50,
2,0.07,0.0004,0.95,0.31,1410.0,3.00,0.94
CSV
cat >"$tmp/sim.csv" <<'CSV'
policy,rate,attainment,ttft_attainment,tpot_attainment,ttft_p50_ms,ttft_p90_ms,tpot_p50_ms,tpot_p90_ms,tpot_mean_ms,e2e_p50_s,e2e_p90_s,throughput_rps,tokens_per_s,busy_fraction,requests,completed
rank-aware,100,1.0,1.0,1.0,9.2,17.3,0.19,0.26,0.20,0.03,0.06,99.6,13334.7,0.44,2000,2000
random,100,0.9,1.0,0.9,10.2,18.8,0.34,0.96,0.46,0.05,0.14,99.6,13334.7,0.45,2000,2000
rank-aware,200,0.8,1.0,0.8,9.2,17.3,0.19,0.26,0.30,0.03,0.06,199.6,26334.7,0.84,2000,2000
random,200,0.5,1.0,0.5,10.2,18.8,0.34,0.96,0.66,0.05,0.14,199.6,26334.7,0.85,2000,2000
CSV
plot simulate "$tmp/sim.csv" >/dev/null
is_png "$tmp/sim.png" || fail "simulate: no PNG"

cat >"$tmp/sweep.csv" <<'CSV'
x,immediate_tokens_per_min,immediate_attainment,immediate_load,deferred_tokens_per_min,deferred_attainment,deferred_load
200,9000,0.97,3.1,12000,0.96,3.2
1000,9100,0.98,3.0,21000,0.97,3.3
CSV
plot finetune-sweep "$tmp/sweep.csv" >/dev/null
is_png "$tmp/sweep.png" || fail "finetune-sweep: no PNG"
# The current layout (columns by name, the swept quantity labels the x axis), and a merged sweep.
cat >"$tmp/sweep2.csv" <<'CSV'
x,swept,immediate_tokens_per_min,immediate_attainment,deferred_tokens_per_min,deferred_attainment,ratio,runs
1000.0,bound,934,0.925,1227,1.0,1.31,2
4000.0,bound,1281,1.0,1754,0.975,1.37,2
CSV
plot finetune-sweep "$tmp/sweep2.csv" >/dev/null
is_png "$tmp/sweep2.png" || fail "finetune-sweep (named columns): no PNG"

cat >"$tmp/samples.csv" <<'CSV'
t,rss_kib,running,waiting,kv_used,kv_pages,adapter_pages,free_pages,prefix_blocks,resident,registered,host_entries,host_bytes
0.01,236000,0.0,1.0,0.0,0.0,0.0,4096.0,0.0,0.0,100.0,4.0,458752.0
2.02,237000,13.0,0.0,155.0,673.0,127.0,3296.0,656.0,34.0,99.0,34.0,3899392.0
CSV
cat >"$tmp/windows.csv" <<'CSV'
window,start_s,requests,ttft_p50_ms,ttft_p99_ms,latency_p50_ms,latency_p99_ms,rss_mib
0,0.0,215,27.4,119.7,207.2,672.7,257.3
1,60.0,427,14.1,87.2,99.4,377.2,261.0
CSV
plot soak "$tmp/samples.csv" >/dev/null
is_png "$tmp/samples.png" || fail "soak: no PNG"
plot soak-windows "$tmp/windows.csv" >/dev/null
is_png "$tmp/windows.png" || fail "soak-windows: no PNG"
plot punica "$tmp/punica.csv" >/dev/null
is_png "$tmp/punica.png" || fail "punica: no PNG"
plot requests "$tmp/requests.csv" -o "$tmp/r.png" >/dev/null
is_png "$tmp/r.png" || fail "requests: no PNG"
plot slora-vs-n "$tmp/slora.csv" -o "$tmp/s.png" --title "test" >/dev/null
is_png "$tmp/s.png" || fail "slora-vs-n: no PNG"
cat >"$tmp/dvs.csv" <<'CSV'
system,popularity,runs,req_s,output_tok_s,ttft_p50,ttft_p90,swaps
delta,uniform,2,0.15,9.9,3.1,10.7,0
delta,zipf,2,0.15,9.9,3.1,10.7,0
swap,uniform,2,0.15,10.1,1.3,3.4,22
swap,zipf,2,0.15,10.1,1.3,3.4,22
CSV
plot delta-vs-swap "$tmp/dvs.csv" -o "$tmp/dvs.png" >/dev/null
is_png "$tmp/dvs.png" || fail "delta-vs-swap: no PNG"
plot loss "$tmp/loss.csv" >/dev/null
is_png "$tmp/loss.png" || fail "loss: no PNG"
cat >"$tmp/slo.csv" <<'CSV'
policy,cv,fraction,rate,attainment,attainment_admitted,satisfaction
fcfs,1,0.5,4.0,0.98,0.98,0.80
slo,1,0.5,4.0,0.99,1.0,0.82
fcfs,1,1.5,12.0,0.10,0.10,0.05
slo,1,1.5,12.0,0.55,0.99,0.40
fcfs,4,0.5,4.0,0.70,0.70,0.50
slo,4,0.5,4.0,0.75,0.98,0.55
CSV
plot slo-sweep "$tmp/slo.csv" >/dev/null
is_png "$tmp/slo.png" || fail "slo-sweep: no PNG"
head -1 "$tmp/slo.csv" >"$tmp/slo-empty.csv"
if plot slo-sweep "$tmp/slo-empty.csv" 2>"$tmp/err"; then fail "an empty slo-sweep CSV plotted"; fi
grep -q "bad data" "$tmp/err" || fail "message: $(cat "$tmp/err")"
if plot punica "$tmp/slora.csv" -o "$tmp/x.png" 2>"$tmp/err"; then fail "a slora CSV plotted as punica"; fi
grep -q "missing column(s) dtype, metric, batch, tokens_per_s" "$tmp/err" || fail "message: $(cat "$tmp/err")"
[[ ! -e $tmp/x.png ]] || fail "a PNG was written for a refused CSV"
if plot requests "$tmp/none.csv" 2>"$tmp/err"; then fail "a missing CSV was accepted"; fi
grep -q "cannot read" "$tmp/err" || fail "message: $(cat "$tmp/err")"
echo "plot_tool_test: all checks passed"
