#!/usr/bin/env python3
"""Runs every libFuzzer target of the `fuzz` preset for a time budget and reports the figures.

    python3 tools/fuzz_all.py --budget-seconds 3600 [--jobs 2] [--targets gguf,delta]
        [--time api_request=600] [--build-dir build/fuzz] [--no-build] [--out FILE.md]

Builds the targets (fuzz/fuzz_*.cc) and the seed corpus program if needed (configuring the
`fuzz` preset when the build directory is missing), writes the generated seeds to
<build>/seeds/<target>/, and runs each target with its own growing corpus
<build>/corpus/<target>/ (kept between runs), the seeds and the target's extra seed directories
read-only, and crash / timeout / OOM inputs saved under <build>/artifacts/<target>/. The budget is
split evenly over the targets unless --time gives a target its own number of seconds; --jobs
targets run at once (each one libFuzzer process). A crash stops that target's run (libFuzzer's
behaviour); the others go on.

Prints (and with --out writes, as Markdown, plus a JSON file next to it) one row per target:
executions, executions per second, coverage (libFuzzer's `cov:` edges and `ft:` features at the
end of the run), corpus size, and findings. Exits 1 when any target found a crash, a timeout or
an out-of-memory input, 2 on a usage or build error. See docs/fuzzing.md.
"""
import argparse
import concurrent.futures
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Extra read-only seed directories of some targets (relative to the repository).
EXTRA_SEEDS = {
    "chat_template": ["tests/chat_templates/corpus"],
}

STATUS_RE = re.compile(r"^#(\d+)\s+(\w+)\s+(.*)$")
FIELD_RE = re.compile(r"(cov|ft|corp|exec/s|rss): (\S+)")


def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, **kw)


def list_targets(build):
    names = []
    for src in sorted(glob.glob(os.path.join(ROOT, "fuzz", "fuzz_*.cc"))):
        names.append(os.path.basename(src)[len("fuzz_"):-len(".cc")])
    return names


def build_targets(build, targets):
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        r = run(["cmake", "--preset", "fuzz", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                 "-DCMAKE_C_COMPILER_LAUNCHER=ccache"], cwd=ROOT)
        if r.returncode != 0:
            return False
    r = run(["cmake", "--build", build, "-j2", "--target", "fuzz_seed_corpus"] +
            ["fuzz_" + t for t in targets], cwd=ROOT)
    return r.returncode == 0


def parse_log(text):
    """The figures of one libFuzzer run from its output."""
    res = {"execs": 0, "cov": 0, "ft": 0, "corpus": 0, "exec_per_s": 0, "peak_rss_mb": 0}
    for line in text.splitlines():
        m = STATUS_RE.match(line)
        if m:
            res["execs"] = max(res["execs"], int(m.group(1)))
            for k, v in FIELD_RE.findall(m.group(3)):
                if k in ("cov", "ft"):
                    res[k] = int(v)
                elif k == "corp":
                    res["corpus"] = int(v.split("/")[0])
            continue
        if line.startswith("stat::number_of_executed_units:"):
            res["execs"] = max(res["execs"], int(line.split(":")[-1]))
        elif line.startswith("stat::average_exec_per_sec:"):
            res["exec_per_s"] = int(line.split(":")[-1])
        elif line.startswith("stat::peak_rss_mb:"):
            res["peak_rss_mb"] = int(line.split(":")[-1])
    return res


def fuzz_env():
    """ASan without allocation stack traces (malloc_context_size=0) unless ASAN_OPTIONS is set:
    collecting a stack on every malloc and free halves the rate of the allocation-heavy JSON
    targets. A finding is reproduced without it, with full stacks (docs/fuzzing.md)."""
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "malloc_context_size=0")
    return env


def fuzz_one(build, target, seconds, args):
    binary = os.path.join(build, "fuzz", "fuzz_" + target)
    corpus = os.path.join(build, "corpus", target)
    seeds = os.path.join(build, "seeds", target)
    artifacts = os.path.join(build, "artifacts", target)
    logs = os.path.join(build, "logs")
    for d in (corpus, artifacts, logs):
        os.makedirs(d, exist_ok=True)
    before = set(os.listdir(artifacts))
    cmd = ["nice", "-n", str(args.nice), binary, "-max_total_time=%d" % seconds,
           "-print_final_stats=1", "-timeout=%d" % args.timeout,
           "-rss_limit_mb=%d" % args.rss_limit_mb, "-artifact_prefix=" + artifacts + "/"]
    if args.max_len:
        cmd.append("-max_len=%d" % args.max_len)
    cmd.append(corpus)
    if os.path.isdir(seeds):
        cmd.append(seeds)
    for extra in EXTRA_SEEDS.get(target, []):
        cmd.append(os.path.join(ROOT, extra))
    log_path = os.path.join(logs, target + ".log")
    start = time.time()
    with open(log_path, "w") as log:
        print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=fuzz_env()).returncode
    elapsed = time.time() - start
    with open(log_path, errors="replace") as f:
        res = parse_log(f.read())
    found = sorted(set(os.listdir(artifacts)) - before)
    res.update(target=target, seconds=round(elapsed, 1), exit_code=rc,
               findings=[os.path.join(artifacts, f) for f in found
                         if f.split("-")[0] in ("crash", "timeout", "oom", "leak")],
               log=log_path)
    if not res["exec_per_s"] and elapsed > 0:
        res["exec_per_s"] = int(res["execs"] / elapsed)
    # libFuzzer exits non-zero on a finding even when it could not save the input.
    if rc != 0 and not res["findings"]:
        res["findings"] = ["exit code %d (see %s)" % (rc, log_path)]
    return res


def table(results, header):
    lines = [header, "",
             "| target | executions | exec/s | cov | ft | corpus | findings |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        lines.append("| %s | %s | %s | %d | %d | %d | %s |" % (
            r["target"], format(r["execs"], ","), format(r["exec_per_s"], ","), r["cov"], r["ft"],
            r["corpus"], ", ".join(os.path.basename(f) for f in r["findings"]) or "0"))
    total = sum(r["execs"] for r in results)
    crashes = sum(len(r["findings"]) for r in results)
    lines.append("| **total** | **%s** | | | | | **%d** |" % (format(total, ","), crashes))
    return "\n".join(lines) + "\n"


def sum_runs(paths):
    totals = {}
    seconds = 0
    for p in paths:
        with open(p) as f:
            run_ = json.load(f)
        seconds += run_["budget_seconds"]
        for r in run_["results"]:
            t = totals.setdefault(r["target"], dict(r, execs=0, findings=[], seconds=0))
            t["execs"] += r["execs"]
            t["seconds"] += r["seconds"]
            t["findings"] += r["findings"]
            for k in ("cov", "ft", "corpus"):
                t[k] = r[k]
    for t in totals.values():
        t["exec_per_s"] = int(t["execs"] / t["seconds"]) if t["seconds"] else 0
    print(table(sorted(totals.values(), key=lambda r: -r["execs"]),
                "fuzz_all: %d runs, %d process-seconds" % (len(paths), seconds)))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "fuzz"))
    ap.add_argument("--budget-seconds", type=int, default=600,
                    help="total seconds of fuzzing, split evenly over the targets without --time")
    ap.add_argument("--time", action="append", default=[], metavar="TARGET=SECONDS",
                    help="seconds for one target (taken out of the budget)")
    ap.add_argument("--targets", default="", help="comma-separated subset (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="targets run at once")
    ap.add_argument("--timeout", type=int, default=10, help="seconds per input before a timeout")
    ap.add_argument("--rss-limit-mb", type=int, default=2048)
    ap.add_argument("--max-len", type=int, default=0,
                    help="libFuzzer -max_len (default: libFuzzer's, from the corpus)")
    ap.add_argument("--nice", type=int, default=0, help="niceness of the fuzz processes")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", help="write the table (Markdown) here, and the figures as FILE.json")
    ap.add_argument("--sum", nargs="+", metavar="RUN.json",
                    help="only print the per-target totals of earlier runs' --out JSON files "
                    "(executions and findings summed; cov / ft / corpus of the last run)")
    args = ap.parse_args()
    if args.sum:
        return sum_runs(args.sum)

    build = os.path.abspath(args.build_dir)
    targets = list_targets(build)
    if args.targets:
        wanted = args.targets.split(",")
        unknown = [t for t in wanted if t not in targets]
        if unknown:
            print("unknown targets: %s (have: %s)" % (", ".join(unknown), ", ".join(targets)),
                  file=sys.stderr)
            return 2
        targets = wanted
    fixed = {}
    for spec in args.time:
        name, _, secs = spec.partition("=")
        if name not in targets or not secs.isdigit():
            print("bad --time %s" % spec, file=sys.stderr)
            return 2
        fixed[name] = int(secs)
    if not args.no_build and not build_targets(build, targets):
        return 2
    seeds = os.path.join(build, "seeds")
    r = run([os.path.join(build, "fuzz", "fuzz_seed_corpus"), seeds], stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        return 2

    rest = [t for t in targets if t not in fixed]
    left = max(0, args.budget_seconds - sum(fixed.values()))
    # With J jobs the wall time is about budget / J; each target gets its share of the
    # process-seconds.
    secs = {t: fixed.get(t, max(1, left // max(1, len(rest)))) for t in targets}
    load_before = open("/proc/loadavg").read().split()[:3]
    started = datetime.datetime.now(datetime.timezone.utc)
    # Longest first, so the parallel slots finish together.
    order = sorted(targets, key=lambda t: -secs[t])
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futs = {pool.submit(fuzz_one, build, t, secs[t], args): t for t in order}
        for fut in concurrent.futures.as_completed(futs):
            res = fut.result()
            results[res["target"]] = res
            print("%-16s %12s execs %8s exec/s  cov %6d  ft %7d  corpus %6d  findings %d" % (
                res["target"], format(res["execs"], ","), format(res["exec_per_s"], ","),
                res["cov"], res["ft"], res["corpus"], len(res["findings"])), flush=True)
    ordered = [results[t] for t in targets]
    load_after = open("/proc/loadavg").read().split()[:3]
    header = ("fuzz_all: %s, %d targets, %d s budget, %d job(s); load %s before, %s after" % (
        started.strftime("%Y-%m-%d %H:%M UTC"), len(targets), sum(secs.values()), args.jobs,
        " ".join(load_before), " ".join(load_after)))
    text = table(ordered, header)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump({"started": started.isoformat(), "budget_seconds": sum(secs.values()),
                       "jobs": args.jobs, "load_before": load_before, "load_after": load_after,
                       "results": ordered}, f, indent=1)
    for r in ordered:
        for f in r["findings"]:
            print("FINDING %s: %s" % (r["target"], f), file=sys.stderr)
    return 1 if any(r["findings"] for r in ordered) else 0


if __name__ == "__main__":
    sys.exit(main())
