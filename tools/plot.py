#!/usr/bin/env python3
"""The one plotting tool for Chorus's benchmark output: CSV in, PNG out (gnuplot, from Debian's
gnuplot-nox, which scripts/setup.sh installs). Benchmarks write CSV/JSON only; plots are made
here.

  tools/plot.py punica   OUT.csv [-o OUT.png]   chorus bench --workload punica: decode tokens/s
                                                 by adapter popularity and batch size
  tools/plot.py requests PREFIX.csv [-o ...]    chorus_bench_serve's per-request CSV: TTFT,
                                                 latency and time per output token by arrival
  tools/plot.py loss     DIR/loss.csv [-o ...]     chorus finetune: training loss per step (and the
                                                 held-out loss where it was evaluated)
  tools/plot.py slora-vs-n slora_vs_n.csv [-o ...]  bench/serve/adapter_workloads.sh slora:
                                                 throughput and TTFT against registered adapters
  tools/plot.py simulate SIM.csv [-o ...]       chorus simulate --csv: SLO attainment and mean
                                                 time per output token against load, per routing
                                                 policy (the shape of CaraServe's Fig. 19)

  tools/plot.py finetune-sweep sweep.csv [-o ...]  tools/finetune_concurrency.py --sweep:
                                                 fine-tuning tokens/min and deferral-bound
                                                 attainment of both policies against the swept x

  tools/plot.py slo-sweep slo_sweep.csv [-o ...]  bench/serve/slo_sweep.py: TTFT SLO attainment
                                                 (of all requests and of the admitted ones) and
                                                 S-LoRA's user satisfaction against the rate as a
                                                 fraction of capacity, one line per policy, one
                                                 column of panels per arrival cv

  tools/plot.py delta-vs-swap summary.csv [-o ...]  bench/serve/delta_vs_swap.sh plot: throughput
                                                 and p90 TTFT of base + deltas vs
                                                 --swap-full-models, per popularity
  tools/plot.py soak     OUT/samples.csv [-o ...]  tools/soak.py: server RSS, running and waiting
                                                 sequences, KV blocks and adapter pages over time
  tools/plot.py soak-windows OUT/windows.csv [-o ...]  tools/soak.py: p50/p99 TTFT and latency per
                                                 window

The PNG defaults to the CSV's path with .png. Exit status: 0 written, 1 bad input or gnuplot
failed, 2 usage.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys


def gp_quote(path):
    return "'" + path.replace("'", "''") + "'"


def punica(csv_path, png, title):
    return f"""set terminal pngcairo size 900,600 noenhanced
set output {gp_quote(png)}
set datafile separator ','
set title {gp_quote(title or 'chorus bench --workload punica: decode tokens/s by adapter popularity')}
set style data histograms
set style histogram clustered
set style fill solid 0.8 border -1
set ylabel 'decode tokens/s'
set grid ytics
set yrange [0:*]
set xtics rotate by -35
plot {gp_quote(csv_path)} every ::1 using 7:xtic(sprintf('%s b%s', strcol(5), strcol(6))) notitle
"""


def requests(csv_path, png, title):
    return f"""set terminal pngcairo size 1000,700 noenhanced
set output {gp_quote(png)}
set datafile separator ','
set key autotitle columnhead
set multiplot layout 2,1 title {gp_quote(title or 'chorus serve: requests by arrival time')}
set xlabel 'arrival time (s)'
set ylabel 'seconds'
set grid
plot {gp_quote(csv_path)} using 2:($5==200?$6:1/0) with points pt 7 ps 0.6 title 'TTFT', \\
     '' using 2:($5==200?$8:1/0) with points pt 6 ps 0.6 title 'latency'
set ylabel 'ms per output token'
plot {gp_quote(csv_path)} using 2:($5==200?$7*1000:1/0) with points pt 7 ps 0.6 title 'time per output token'
unset multiplot
"""


def loss(csv_path, png, title):
    return f"""set terminal pngcairo size 900,600 noenhanced
set output {gp_quote(png)}
set datafile separator ','
set title {gp_quote(title or 'chorus finetune: loss per optimizer step')}
set xlabel 'step'
set ylabel 'mean loss per token (nats)'
set grid
set key top right
plot {gp_quote(csv_path)} every ::1 using 1:4 with lines lw 2 title 'training loss', \\
     {gp_quote(csv_path)} every ::1 using 1:(strcol(8) eq '' ? NaN : column(8)) with linespoints pt 7 lw 2 title 'held-out loss'
"""


def slora_vs_n(csv_path, png, title):
    return f"""set terminal pngcairo size 900,600 noenhanced
set output {gp_quote(png)}
set datafile separator ','
set title {gp_quote(title or 'slora over HTTP: throughput vs registered adapters n')}
set logscale x
set xlabel 'registered adapters n'
set ylabel 'output tokens/s'
set y2label 'TTFT p50 (s)'
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:*]
set grid
plot {gp_quote(csv_path)} every ::1 using 1:5 with linespoints pt 7 lw 2 title 'output tokens/s', \\
     '' every ::1 using 1:6 axes x1y2 with linespoints pt 5 title 'TTFT p50 (s)', \\
     '' every ::1 using 1:10 axes x1y2 with linespoints pt 4 title 'TTFT p50 cold (s)', \\
     '' every ::1 using 1:11 axes x1y2 with linespoints pt 6 title 'TTFT p50 warm (s)'
"""


def simulate(csv_path, png, title):
    # One gnuplot data block per policy (rows sorted by rate), so each policy is one line.
    rows = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(row["policy"], []).append(
                (float(row["rate"]), float(row["attainment"]), float(row["tpot_mean_ms"])))
    blocks = ""
    for i, (policy, pts) in enumerate(rows.items()):
        blocks += f"$p{i} << EOD\n" + "".join(f"{r} {a} {t}\n" for r, a, t in sorted(pts)) + "EOD\n"
    def lines(column):
        return ", ".join(f"$p{i} using 1:{column} with linespoints lw 2 pt {i + 5} "
                         f"title {gp_quote(policy)}" for i, policy in enumerate(rows))
    return f"""{blocks}set terminal pngcairo size 1200,500 noenhanced
set output {gp_quote(png)}
set multiplot layout 1,2 title {gp_quote(title or 'chorus simulate: routing policies by load')}
set xlabel 'load (requests/s)'
set grid
set key bottom left
set ylabel 'SLO attainment (TTFT and TPOT met)'
set yrange [0:1.05]
plot {lines(2)}
set ylabel 'mean time per output token (ms)'
set yrange [0:*]
set key top left
plot {lines(3)}
unset multiplot
"""


def slo_sweep(csv_path, png, title):
    # One gnuplot data block per (cv, policy), rows sorted by rate; a column of three panels
    # (attainment, attainment of the admitted, satisfaction) per cv.
    data, policies = {}, []
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row["policy"] not in policies:
                policies.append(row["policy"])  # in the order of the sweep
            data.setdefault(float(row["cv"]), {}).setdefault(row["policy"], []).append(
                (float(row["fraction"]), float(row["attainment"]),
                 float(row["attainment_admitted"]), float(row["satisfaction"])))
    if not data:
        raise ValueError("no rows")
    cvs = sorted(data)
    blocks = ""
    for i, cv in enumerate(cvs):
        for j, p in enumerate(policies):
            pts = sorted(data[cv].get(p, []))
            blocks += f"$c{i}p{j} << EOD\n" + "".join(
                f"{x} {a} {b} {s}\n" for x, a, b, s in pts) + "EOD\n"
    panels = ""
    for col, ylabel in ((2, "TTFT SLO attainment (all requests)"),
                        (3, "attainment of admitted requests"),
                        (4, "user satisfaction (S-LoRA)")):
        for i, cv in enumerate(cvs):
            lines = ", ".join(
                f"$c{i}p{j} using 1:{col} with linespoints lw 2 pt {j + 5} title {gp_quote(p)}"
                for j, p in enumerate(policies) if data[cv].get(p))
            panels += (f"set title 'cv = {cv:g}'\nset ylabel {gp_quote(ylabel)}\n"
                       f"plot {lines}\n")
    return f"""{blocks}set terminal pngcairo size {420 * len(cvs) + 120},1100 noenhanced
set output {gp_quote(png)}
set multiplot layout 3,{len(cvs)} title {gp_quote(title or 'slora: SLO attainment and satisfaction by rate')}
set xlabel 'arrival rate / capacity'
set grid
set key bottom left
set yrange [0:1.05]
set xrange [0:*]
{panels}unset multiplot
"""


def finetune_sweep(csv_path, png, title):
    # Columns by name (sweeps written by older versions of the tool have extra load columns).
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    col = {name: header.index(name) + 1 for name in header}
    swept = rows[1][header.index("swept")] if "swept" in header and len(rows) > 1 else ""
    xlabel = {"bound": "deferral bound (ms)", "rate": "arrival rate (requests/s)"}.get(
        swept, "swept value (deferral bound ms or arrival rate req/s)")
    return f"""set terminal pngcairo size 900,600 noenhanced
set output {gp_quote(png)}
set datafile separator ','
set title {gp_quote(title or 'fine-tuning while serving: deferred vs immediate')}
set xlabel {gp_quote(xlabel)}
set ylabel 'fine-tuning tokens/min'
set y2label 'deferral-bound attainment'
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:1.05]
set grid
set key bottom right
plot {gp_quote(csv_path)} every ::1 using 1:{col['immediate_tokens_per_min']} with linespoints pt 7 lw 2 title 'immediate tokens/min', \\
     '' every ::1 using 1:{col['deferred_tokens_per_min']} with linespoints pt 5 lw 2 title 'deferred tokens/min', \\
     '' every ::1 using 1:{col['immediate_attainment']} axes x1y2 with linespoints pt 6 dt 2 title 'immediate attainment', \\
     '' every ::1 using 1:{col['deferred_attainment']} axes x1y2 with linespoints pt 4 dt 2 title 'deferred attainment'
"""


def soak(csv_path, png, title):
    return f"""set terminal pngcairo size 1000,800 noenhanced
set output {gp_quote(png)}
set datafile separator ','
set multiplot layout 2,1 title {gp_quote(title or 'tools/soak.py: chorus serve over time')}
set xlabel 'seconds'
set ylabel 'RSS (MiB)'
set grid
plot {gp_quote(csv_path)} every ::1 using 1:($2/1024) with lines lw 2 title 'VmRSS'
set ylabel 'count'
set key top right
plot {gp_quote(csv_path)} every ::1 using 1:3 with lines title 'running', \\
     '' every ::1 using 1:4 with lines title 'waiting', \\
     '' every ::1 using 1:5 with lines title 'KV blocks used', \\
     '' every ::1 using 1:7 with lines title 'adapter pages'
unset multiplot
"""


def soak_windows(csv_path, png, title):
    return f"""set terminal pngcairo size 900,600 noenhanced
set output {gp_quote(png)}
set datafile separator ','
set title {gp_quote(title or 'tools/soak.py: latency per window')}
set xlabel 'window start (s)'
set ylabel 'ms'
set grid
set yrange [0:*]
plot {gp_quote(csv_path)} every ::1 using 2:6 with linespoints pt 7 title 'latency p50', \\
     '' every ::1 using 2:7 with linespoints pt 5 title 'latency p99', \\
     '' every ::1 using 2:4 with linespoints pt 6 title 'TTFT p50 (streamed)', \\
     '' every ::1 using 2:5 with linespoints pt 4 title 'TTFT p99 (streamed)'
"""


def delta_vs_swap(csv_path, png, title):
    # Rows: system, popularity, medians over runs. Two panels of clustered bars: throughput
    # (completed requests/s) and p90 TTFT, one cluster per popularity, one bar per system.
    rows = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            rows[(row["popularity"], row["system"])] = (float(row["req_s"]),
                                                         float(row["ttft_p90"]))
    pops = sorted({p for p, _ in rows})
    systems = sorted({s for _, s in rows})
    # No header line: gnuplot would plot it as an empty first cluster.
    data = "$d << EOD\n"
    for p in pops:
        vals = []
        for s in systems:
            r, t = rows.get((p, s), (float("nan"), float("nan")))
            vals += [f"{r:.6g}", f"{t:.6g}"]
        data += p + " " + " ".join(vals) + "\n"
    data += "EOD\n"
    def bars(offset):
        return ", ".join(f"$d using {2 + 2 * i + offset}:xtic(1) title {gp_quote(s)}"
                         for i, s in enumerate(systems))
    return f"""{data}set terminal pngcairo size 1000,450 noenhanced
set output {gp_quote(png)}
set multiplot layout 1,2 title {gp_quote(title or 'base + deltas vs --swap-full-models')}
set style data histograms
set style histogram clustered
set style fill solid 0.8 border -1
set grid ytics
set yrange [0:*]
set key top left
set xtics rotate by -25
set ylabel 'completed requests/s'
set title 'throughput'
plot {bars(0)}
set ylabel 'TTFT p90 (s)'
set title 'p90 time to first token'
set logscale y
set yrange [*:*]
plot {bars(1)}
unset multiplot
"""


# kind -> (script builder, columns the CSV header must have)
KINDS = {
    "loss": (loss, ["step", "loss", "eval_loss"]),
    "punica": (punica, ["dtype", "metric", "batch", "tokens_per_s"]),
    "requests": (requests, ["arrival_s", "status", "ttft_s", "tpot_s", "latency_s"]),
    "simulate": (simulate, ["policy", "rate", "attainment", "tpot_mean_ms"]),
    "finetune-sweep": (finetune_sweep, ["x", "immediate_tokens_per_min", "immediate_attainment",
                                        "deferred_tokens_per_min", "deferred_attainment"]),
    "slo-sweep": (slo_sweep, ["policy", "cv", "fraction", "attainment", "attainment_admitted",
                              "satisfaction"]),
    "slora-vs-n": (slora_vs_n, ["n", "output_tok_s", "ttft_p50", "ttft_cold_p50", "ttft_warm_p50"]),
    "delta-vs-swap": (delta_vs_swap, ["system", "popularity", "req_s", "ttft_p90"]),
    "soak": (soak, ["t", "rss_kib", "running", "waiting", "kv_used", "kv_pages", "adapter_pages"]),
    "soak-windows": (soak_windows, ["window", "start_s", "ttft_p50_ms", "ttft_p99_ms",
                                    "latency_p50_ms", "latency_p99_ms"]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("csv")
    ap.add_argument("-o", "--output", help="PNG to write (default: the CSV's path with .png)")
    ap.add_argument("--title", help="plot title")
    a = ap.parse_args()
    build, columns = KINDS[a.kind]
    try:
        with open(a.csv, newline="") as f:
            header = next(csv.reader(f), [])
    except OSError as e:
        print(f"plot: cannot read {a.csv}: {e.strerror}", file=sys.stderr)
        return 1
    missing = [c for c in columns if c not in header]
    if missing:
        print(f"plot: {a.csv} is not a '{a.kind}' CSV (missing column(s) {', '.join(missing)})",
              file=sys.stderr)
        return 1
    if shutil.which("gnuplot") is None:
        print("plot: gnuplot is not installed (Debian package gnuplot-nox)", file=sys.stderr)
        return 1
    png = a.output or os.path.splitext(a.csv)[0] + ".png"
    try:
        script = build(a.csv, png, a.title)
    except (ValueError, KeyError) as e:
        print(f"plot: {a.csv}: bad data ({e})", file=sys.stderr)
        return 1
    r = subprocess.run(["gnuplot"], input=script, text=True,
                       capture_output=True)
    if r.returncode != 0:
        print(f"plot: gnuplot failed: {r.stderr.strip()[:500]}", file=sys.stderr)
        return 1
    print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
