#!/usr/bin/env python3
"""SIGTERM-to-exit latency of the preemption handler, 2 workers (docs/fault_tolerance.md).

A job of 2 workers x 1 CPU replica training the digits MLP (train_digits --strategy multi_worker)
under tools/launch.sh is sent SIGTERM (the launcher forwards it to both workers) once both
workers train; timed is the moment of the signal to the launcher's exit:

  handler: --checkpoint-dir DIR: the workers finish the step, agree, save the model, Adam's state
           and the input position, and exit with 75;
  anchor:  the same job without --checkpoint-dir: SIGTERM's default action ends the workers at
           once (the cost of the launcher, the signal and two process exits).

ROUNDS interleaved rounds; the median of each, and handler - anchor (what saving on preemption
adds). Needs the release train_digits:
  cmake --preset release && cmake --build --preset release --target train_digits

  bench/bench_preemption.py [--build-dir build/release] [--rounds 7]
"""
import argparse
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def one(train, ckpt_dir):
    argv = ["/bin/bash", str(ROOT / "tools/launch.sh"), "2", "--", train, "--strategy", "multi_worker", "--devices",
            "CPU:0", "--optimizer", "adam", "--epochs", "100000", "--seed", "1"]
    if ckpt_dir:
        argv += ["--checkpoint-dir", ckpt_dir]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = set()
    # Both workers print their banner before training; then give the loop a moment to run.
    while len(seen) < 2:
        line = p.stdout.readline()
        if not line:
            raise SystemExit("bench_preemption: the job ended before training:\n" + line)
        if "training on" in line:
            seen.add(line.split("]")[0])
    time.sleep(0.5)
    start = time.perf_counter()
    p.send_signal(signal.SIGTERM)
    rest = p.stdout.read()
    code = p.wait()
    elapsed = time.perf_counter() - start
    want = 75 if ckpt_dir else 128 + signal.SIGTERM
    if code != want:
        raise SystemExit(f"bench_preemption: the launcher exited with {code}, expected {want}:\n{rest}")
    if ckpt_dir and "preempted; saved step" not in rest:
        raise SystemExit("bench_preemption: no preemption save reported:\n" + rest)
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default="build/release")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    train = str((ROOT / args.build_dir / "train_digits").resolve())
    if not os.access(train, os.X_OK):
        raise SystemExit(f"bench_preemption: {train} is missing; build it first:\n"
                         "  cmake --preset release && cmake --build --preset release --target train_digits")
    handler, anchor = [], []
    for r in range(args.rounds):
        order = [True, False] if r % 2 == 0 else [False, True]
        for with_handler in order:
            if with_handler:
                d = tempfile.mkdtemp(prefix="mirrored_preemption_")
                try:
                    handler.append(one(train, d))
                finally:
                    shutil.rmtree(d, ignore_errors=True)
            else:
                anchor.append(one(train, None))
    h, a = statistics.median(handler), statistics.median(anchor)
    print(f"SIGTERM to exit, 2 workers x 1 CPU replica, digits MLP + Adam, {args.rounds} rounds (median, min-max):")
    print(f"  with the preemption handler (step, agree, save, exit 75): {h * 1e3:8.1f} ms "
          f"({min(handler) * 1e3:.1f}-{max(handler) * 1e3:.1f})")
    print(f"  anchor, SIGTERM's default action:                          {a * 1e3:8.1f} ms "
          f"({min(anchor) * 1e3:.1f}-{max(anchor) * 1e3:.1f})")
    print(f"  what saving on preemption adds: {(h - a) * 1e3:.1f} ms; anchor/handler {a / h:.2f}")


if __name__ == "__main__":
    sys.exit(main())
