#!/usr/bin/env python3
"""Crash consistency of the offline writers (docs/hardening.md, "Crash consistency").

`chorus compress` (a delta file, and a delta directory) and `chorus convert` (a GGUF file, and
a Hugging Face directory) are SIGKILLed over and over while they replace an earlier output of the
same command with a different one: at a random moment of the run, or at a chosen step of the
atomic write (CHORUS_CRASH_POINT=atomic_write.partial / .before_rename / .after_rename, and for
the HF directory staged_dir.before_exchange / .after_exchange; durable_file.h).
After every kill:
  * the output is byte for byte the old one or the new one (before the rename: the old one;
    after it: the new one) — never a torn file; for the HF directory, the whole set of files is
    the old set or the new one (the old one has a single model.safetensors, the new one shards
    and an index), and a README someone put there is in both;
  * at most one `<file>.tmp.<pid>` (for the directory: `<dir>.tmp.<pid>`, or `….old` on file
    systems without RENAME_EXCHANGE) is left in the folder (the next writer removes a dead
    writer's before it writes), and nothing else appears there.
At the end a clean run writes the new output and leaves no temp file.

Usage: offline_kill_test.py --chorus BIN --models ../shared/models [--rounds 100] [--seed 1]
Exit 77 (skip) when the stories260K files are missing, unless CHORUS_REQUIRE_MODELS=1.
"""

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REQUIRED = os.environ.get("CHORUS_REQUIRE_MODELS") == "1"
TEMP_NAME = re.compile(r".*\.tmp\.\d+(\.old)?$")
# What a kill at each crash point must leave: a file is replaced by its rename; an HF directory's
# files are renamed inside its staging directory, and the directory is swapped in after them.
FILE_POINTS = {"atomic_write.partial": "old", "atomic_write.before_rename": "old",
               "atomic_write.after_rename": "new"}
DIR_POINTS = {"atomic_write.partial": "old", "atomic_write.before_rename": "old",
              "atomic_write.after_rename": "old", "staged_dir.before_exchange": "old",
              "staged_dir.after_exchange": "new"}


def fail(msg):
    print("offline_kill_test: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


class Case:
    """One command whose output at `path` goes from the bytes of `old_args` to those of `new_args`.

    `path` is what the command names with --output; `file` is the file it writes (for a delta
    directory, the delta file inside it)."""

    points = FILE_POINTS

    def __init__(self, name, chorus, old_args, new_args, path, file):
        self.name, self.chorus = name, chorus
        self.old_args, self.new_args = old_args, new_args
        self.path, self.file = path, file
        self.folder = os.path.dirname(file)

    def run(self, args, env=None):
        return subprocess.run([self.chorus] + args + ["--output", self.path], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def snapshot(self):
        with open(self.file, "rb") as f:
            return f.read()

    def describe(self, snap):
        return "%d bytes" % len(snap)

    def reference(self, args):
        """The output `args` writes, and how long the run took."""
        t0 = time.monotonic()
        p = self.run(args)
        took = time.monotonic() - t0
        if p.returncode != 0:
            fail("%s: reference run failed: %s" % (self.name, p.stderr.decode(errors="replace")))
        return self.snapshot(), took

    def prepare(self):
        os.makedirs(self.folder, exist_ok=True)
        self.new, self.duration = self.reference(self.new_args)
        self.old, _ = self.reference(self.old_args)
        if self.old == self.new:
            fail("%s: old and new outputs are the same bytes; the test could not tell them apart"
                 % self.name)

    def restore_old(self):
        # The old output in place, as a finished earlier run left it (written with a rename, so
        # a temp file of a killed writer stays where it is).
        tmp = self.file + ".restore"
        with open(tmp, "wb") as f:
            f.write(self.old)
        os.replace(tmp, self.file)

    def temp_files(self):
        return sorted(n for n in os.listdir(self.folder) if TEMP_NAME.match(n))

    def other_files(self):
        base = os.path.basename(self.file)
        return sorted(n for n in os.listdir(self.folder)
                      if n != base and not TEMP_NAME.match(n))


class DirCase(Case):
    """An output directory replaced as a whole: its state is {relative path: bytes}. The old
    directory also holds a README someone put there, which the new one must keep."""

    points = DIR_POINTS

    def __init__(self, name, chorus, old_args, new_args, path):
        Case.__init__(self, name, chorus, old_args, new_args, path, path)
        self.folder = os.path.dirname(path)
        self.saved_old = path + "-reference-old"  # outside `folder`'s checks: see other_files

    def snapshot(self):
        state = {}
        for root, dirs, files in os.walk(self.path):
            for n in files:
                full = os.path.join(root, n)
                with open(full, "rb") as f:
                    state[os.path.relpath(full, self.path)] = f.read()
        return state

    def describe(self, snap):
        return "files %s" % sorted(snap)

    def prepare(self):
        os.makedirs(self.folder, exist_ok=True)
        self.old, _ = self.reference(self.old_args)
        with open(os.path.join(self.path, "README.md"), "w") as f:
            f.write("notes kept beside the model\n")
        self.old = self.snapshot()
        shutil.copytree(self.path, self.saved_old, symlinks=True)
        self.new, self.duration = self.reference(self.new_args)
        if self.old == self.new:
            fail("%s: old and new outputs are the same; the test could not tell them apart"
                 % self.name)
        if "README.md" not in self.new or "model.safetensors" in self.new:
            fail("%s: the new directory did not keep the README or kept the old weights: %s"
                 % (self.name, sorted(self.new)))

    def restore_old(self):
        shutil.rmtree(self.path)
        shutil.copytree(self.saved_old, self.path, symlinks=True)

    def other_files(self):
        base = os.path.basename(self.path)
        return sorted(n for n in os.listdir(self.folder)
                      if n not in (base, os.path.basename(self.saved_old))
                      and not TEMP_NAME.match(n))


def kill_round(case, rng, round_no):
    """One kill of a writer replacing the old output; returns what it was killed by."""
    case.restore_old()
    env = dict(os.environ)
    mode = round_no % 2
    point = None
    if mode == 1:
        points = sorted(case.points)
        point = points[(round_no // 2) % len(points)]
        env["CHORUS_CRASH_POINT"] = point
    proc = subprocess.Popen([case.chorus] + case.new_args + ["--output", case.path], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if point is None:
        # A random moment of the run: start-up, reading the models, computing, writing.
        time.sleep(rng.uniform(0, case.duration * 1.1))
        proc.send_signal(signal.SIGKILL)
    rc = proc.wait(timeout=300)
    if point is not None and rc != -signal.SIGKILL:
        fail("%s round %d: crash point %s was never reached (exit %d)" %
             (case.name, round_no, point, rc))
    if rc not in (0, -signal.SIGKILL):
        fail("%s round %d: the writer exited %d" % (case.name, round_no, rc))
    data = case.snapshot()
    if data == case.old:
        got = "old"
    elif data == case.new:
        got = "new"
    else:
        fail("%s round %d (%s): the output is neither the old nor the new one (%s)" %
             (case.name, round_no, point or "random kill", case.describe(data)))
    want = case.points.get(point)
    if want is not None and got != want:
        fail("%s round %d: killed at %s, the output is the %s one" % (case.name, round_no, point, got))
    temps = case.temp_files()
    if len(temps) > 1:
        fail("%s round %d: %d temp files accumulate: %s" % (case.name, round_no, len(temps), temps))
    others = case.other_files()
    if others:
        fail("%s round %d: unexpected files beside the output: %s" % (case.name, round_no, others))
    return (point or "random") + ":" + got + (":temp" if temps else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chorus", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--rounds", type=int,
                    default=int(os.environ.get("CHORUS_CRASH_ITERATIONS", "100")),
                    help="kills per case (default: CHORUS_CRASH_ITERATIONS, else 100)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    base = os.path.join(a.models, "stories260K", "stories260K.bin")
    tok = os.path.join(a.models, "stories260K", "tok512.bin")
    ft = os.path.join(a.models, "stories260K-finetunes", "things", "full.bin")
    for p in (base, tok, ft):
        if not os.path.exists(p):
            print("offline_kill_test: skipped: %s is missing" % p, file=sys.stderr)
            sys.exit(1 if REQUIRED else 77)

    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="chorus-offline-kill-")
    compress = ["compress", "--base", base, "--finetuned", ft, "--method", "rtn"]
    cases = [
        Case("compress-file", a.chorus, compress + ["--bits", "8", "--sparsity", "none"],
             compress + ["--bits", "2", "--sparsity", "2:4"],
             os.path.join(work, "file", "ft.safetensors"),
             os.path.join(work, "file", "ft.safetensors")),
        Case("compress-dir", a.chorus, compress + ["--bits", "4", "--sparsity", "none"],
             compress + ["--bits", "4", "--sparsity", "2:4"], os.path.join(work, "dir", "ft"),
             os.path.join(work, "dir", "ft", "delta.safetensors")),
        Case("convert-gguf", a.chorus,
             ["convert", "--model", base, "--tokenizer", tok, "--format", "gguf", "--dtype", "f32"],
             ["convert", "--model", base, "--tokenizer", tok, "--format", "gguf", "--dtype", "f16"],
             os.path.join(work, "gguf", "model.gguf"), os.path.join(work, "gguf", "model.gguf")),
        DirCase("convert-hf-dir", a.chorus,
                ["convert", "--model", base, "--tokenizer", tok, "--format", "hf", "--dtype", "f32"],
                ["convert", "--model", base, "--tokenizer", tok, "--format", "hf", "--dtype",
                 "bf16", "--max-shard-size", "300KB"],
                os.path.join(work, "hf", "out")),
    ]
    try:
        for case in cases:
            case.prepare()
            counts = {}
            for r in range(a.rounds):
                outcome = kill_round(case, rng, r)
                counts[outcome] = counts.get(outcome, 0) + 1
            # A clean run after all the kills: the new output, no temp file left.
            case.restore_old()
            p = case.run(case.new_args)
            if p.returncode != 0:
                fail("%s: the clean run failed: %s" % (case.name, p.stderr.decode(errors="replace")))
            if case.snapshot() != case.new:
                fail("%s: the clean run wrote other bytes than the reference" % case.name)
            if case.temp_files():
                fail("%s: temp files left after a clean run: %s" % (case.name, case.temp_files()))
            summary = ", ".join("%s %d" % kv for kv in sorted(counts.items()))
            print("offline_kill_test: %s: %d/%d kills left the old or the new output (%s); run %.3f s"
                  % (case.name, a.rounds, a.rounds, summary, case.duration))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("offline_kill_test: PASS")


if __name__ == "__main__":
    main()
