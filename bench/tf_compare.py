#!/usr/bin/env python3
"""mirrored side by side with TensorFlow's MirroredStrategy on logical CPU devices.

Times, on 2 and 4 replicas (TF: logical CPU devices of one physical CPU; mirrored: CPU:k replica
threads), in one run of both:

  empty_run    strategy.run of a function that does nothing (TF: eager and tf.function)
  all_reduce   strategy.run of a function whose replica-context all_reduce(SUM) sums a float32
               tensor of 64 MiB per replica, returning the sum (TF: eager and tf.function)
  reduce       strategy.reduce(SUM, per_replica, axis=None) of a 64 MiB float32 tensor per replica,
               from the cross-replica context (TF: eager and tf.function)

and writes one JSON file and one Markdown table, with the ratios mirrored / TF (below 1: mirrored
is faster). The TF side runs in a virtual environment this script makes (PyPI tensorflow-cpu,
pinned in tf_venv.py) under ~/.cache/mirrored/ unless --venv says otherwise; the mirrored side is
bench_tf_ops (Google Benchmark) from the release build.

    cmake --preset release && cmake --build --preset release --target bench_tf_ops
    python3 bench/tf_compare.py --out-json tf_compare.json --out-md tf_compare.md

--quick: few repetitions and 4 MiB instead of 64 MiB (checks the plumbing; the numbers mean little).
Python 3 standard library only (TensorFlow only inside the virtual environment).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tf_venv import TF_PACKAGE, default_venv, ensure_venv  # noqa: E402  (bench/, next to this file)

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def log(*args):
    print("tf_compare:", *args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The TF side (runs inside the virtual environment: `python tf_compare.py --tf-worker ...`)
# ---------------------------------------------------------------------------------------------

def tf_worker(replica_counts, nbytes, reps, warmup):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(max(replica_counts))])
    n_floats = nbytes // 4

    def timed(fn):
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e3, samples

    rows = []
    for n in replica_counts:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        x = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.fill([n_floats], float(ctx.replica_id_in_sync_group + 1)))

        def empty():
            pass

        def all_reduce_fn(v):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v)

        # The check before timing: the all-reduce and the reduce return the right sum.
        want = float(n * (n + 1) // 2)
        got = strategy.experimental_local_results(strategy.run(all_reduce_fn, args=(x,)))
        assert all(float(g[0]) == want and float(g[-1]) == want for g in got), "TF all_reduce gave a wrong sum"
        red = strategy.reduce(tf.distribute.ReduceOp.SUM, x, axis=None)
        assert float(red[0]) == want and float(red[-1]) == want, "TF reduce gave a wrong sum"

        empty_function = tf.function(lambda: strategy.run(empty))
        all_reduce_function = tf.function(lambda v: strategy.run(all_reduce_fn, args=(v,)))
        reduce_function = tf.function(lambda v: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None))

        cases = [
            ("empty_run", 0, "eager", lambda: strategy.run(empty)),
            ("empty_run", 0, "function", lambda: empty_function()),
            ("all_reduce", nbytes, "eager", lambda: strategy.run(all_reduce_fn, args=(x,))),
            ("all_reduce", nbytes, "function", lambda: all_reduce_function(x)),
            ("reduce", nbytes, "eager", lambda: strategy.reduce(tf.distribute.ReduceOp.SUM, x, axis=None)),
            ("reduce", nbytes, "function", lambda: reduce_function(x)),
        ]
        for op, size, mode, fn in cases:
            # Empty runs are short: time batches of 64 and report per run, like bench_tf_ops.
            batch = 64 if op == "empty_run" else 1

            def body(fn=fn, batch=batch):
                for _ in range(batch):
                    fn()

            ms, samples = timed(body)
            rows.append({"op": op, "replicas": n, "bytes": size, "mode": mode, "ms": ms / batch,
                         "samples_ms": [s * 1e3 / batch for s in samples]})
            log(f"TF {op} N={n} {mode}: {ms / batch:.4g} ms")
    return {"tf_version": tf.__version__, "rows": rows}


# ---------------------------------------------------------------------------------------------
# The driver (system python3)
# ---------------------------------------------------------------------------------------------

def run_mirrored(binary, nbytes, reps, min_time):
    """Runs bench_tf_ops; returns rows like the TF worker's (mode 'mirrored')."""
    if not Path(binary).exists():
        sys.exit(f"tf_compare: {binary} not found; build it: cmake --build --preset release --target bench_tf_ops")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_tf_ops.{os.getpid()}.json"
    cmd = [str(binary), f"--benchmark_out={out}", "--benchmark_out_format=json",
           f"--benchmark_repetitions={reps}", "--benchmark_report_aggregates_only=true",
           f"--benchmark_min_time={min_time}"]
    env = dict(os.environ, MIRRORED_TF_OPS_BYTES=str(nbytes))
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)
    data = json.loads(out.read_text())
    out.unlink()
    rows = []
    has_median = any(b.get("aggregate_name") == "median" for b in data["benchmarks"])
    for b in data["benchmarks"]:
        if has_median and b.get("aggregate_name") != "median":
            continue
        if not has_median and b.get("run_type") == "aggregate":
            continue
        args = dict(p.split(":", 1) for p in b["name"].split("/")[1:] if ":" in p)
        op = {"BM_EmptyRun": "empty_run", "BM_ReplicaAllReduce": "all_reduce", "BM_Reduce": "reduce"}[
            b["name"].split("/")[0]]
        rows.append({"op": op, "replicas": int(args["replicas"]), "bytes": int(args.get("bytes", 0)),
                     "mode": "mirrored", "ms": b["ms"]})
    return data.get("context", {}), rows


def merge(tf_rows, mirrored_rows):
    table = {}
    for r in tf_rows + mirrored_rows:
        key = (r["op"], r["replicas"])
        entry = table.setdefault(key, {"op": r["op"], "replicas": r["replicas"], "bytes": r["bytes"]})
        entry[{"eager": "tf_eager_ms", "function": "tf_function_ms", "mirrored": "mirrored_ms"}[r["mode"]]] = r["ms"]
    order = {"empty_run": 0, "all_reduce": 1, "reduce": 2}
    rows = sorted(table.values(), key=lambda e: (order[e["op"]], e["replicas"]))
    for e in rows:
        for mode in ("eager", "function"):
            tf_ms = e.get(f"tf_{mode}_ms")
            e[f"ratio_{mode}"] = e["mirrored_ms"] / tf_ms if tf_ms and "mirrored_ms" in e else None
    return rows


def fmt_ms(ms):
    return "–" if ms is None else (f"{ms * 1e3:.3g} µs" if ms < 1 else f"{ms:.3g} ms")


def markdown(result):
    names = {"empty_run": "empty `strategy.run`", "all_reduce": "replica-context `all_reduce` (SUM)",
             "reduce": "`strategy.reduce` (SUM)"}
    lines = [
        f"<!-- tf_compare.py, {result['date']}: TF {result['tf_version']}, {result['machine']}, "
        f"{result['repetitions']} repetitions (medians){', quick' if result['quick'] else ''} -->",
        "| operation | N | size/replica | TF eager | TF `tf.function` | mirrored | mirrored / TF eager "
        "| mirrored / TF `tf.function` |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in result["rows"]:
        size = "–" if not e["bytes"] else f"{e['bytes'] // MIB} MiB"
        ratio = lambda r: "–" if r is None else f"{r:.2g}"  # noqa: E731
        lines.append(f"| {names[e['op']]} | {e['replicas']} | {size} | {fmt_ms(e.get('tf_eager_ms'))} "
                     f"| {fmt_ms(e.get('tf_function_ms'))} | {fmt_ms(e.get('mirrored_ms'))} "
                     f"| {ratio(e['ratio_eager'])} | {ratio(e['ratio_function'])} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-json", default="tf_compare.json")
    ap.add_argument("--out-md", default="tf_compare.md")
    ap.add_argument("--bench-bin", default=str(REPO / "build" / "release" / "bench" / "bench_tf_ops"))
    ap.add_argument("--venv", type=Path, default=None, help=f"default: {default_venv()}")
    ap.add_argument("--replicas", default="2,4")
    ap.add_argument("--quick", action="store_true", help="4 MiB, few repetitions: checks the plumbing only")
    ap.add_argument("--tf-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bytes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    replica_counts = [int(n) for n in a.replicas.split(",")]
    nbytes = a.bytes or (4 * MIB if a.quick else 64 * MIB)
    reps = a.reps or (3 if a.quick else 20)

    if a.tf_worker:
        json.dump(tf_worker(replica_counts, nbytes, reps, warmup=2), sys.stdout)
        return 0

    venv = a.venv or default_venv()
    py = ensure_venv(venv, log)
    # One process per replica count: two MirroredStrategy objects in one TF process hand out the
    # same collective group keys, and the second one's all-reduce then fails.
    tf_result = {"rows": []}
    for n in replica_counts:
        log(f"TF side, {n} replicas ({py})")
        tf = subprocess.run([str(py), str(Path(__file__).resolve()), "--tf-worker", f"--replicas={n}",
                             f"--bytes={nbytes}", f"--reps={reps}"], check=True, stdout=subprocess.PIPE, text=True)
        one = json.loads(tf.stdout)
        tf_result["tf_version"] = one["tf_version"]
        tf_result["rows"] += one["rows"]
    log(f"mirrored side ({a.bench_bin})")
    context, mirrored_rows = run_mirrored(a.bench_bin, nbytes, 1 if a.quick else 5, 0.05 if a.quick else 0.5)
    rows = merge(tf_result["rows"], [r for r in mirrored_rows if r["replicas"] in replica_counts])
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
        "tf_version": tf_result["tf_version"],
        "tf_package": TF_PACKAGE,
        "quick": a.quick,
        "repetitions": reps,
        "bytes_per_replica": nbytes,
        "mirrored_context": context,
        "rows": rows,
        "tf_samples": tf_result["rows"],
    }
    Path(a.out_json).write_text(json.dumps(result, indent=1) + "\n")
    Path(a.out_md).write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
