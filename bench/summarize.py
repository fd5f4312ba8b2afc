#!/usr/bin/env python3
"""Turns the JSON output of bench_all_reduce / bench_run_overhead into the Markdown tables of
docs/performance.md.

    build/release/bench/bench_all_reduce --benchmark_repetitions=5 \
        --benchmark_out=all_reduce.json --benchmark_out_format=json
    build/release/bench/bench_run_overhead --benchmark_repetitions=5 \
        --benchmark_out=run_overhead.json --benchmark_out_format=json
    python3 bench/summarize.py all_reduce.json run_overhead.json

With repetitions, the median aggregate of every counter is used; without, the single run.
Python 3 standard library only.
"""
import json
import sys


def rows(path):
    with open(path) as f:
        data = json.load(f)
    benches = data.get("benchmarks", [])
    has_median = any(b.get("aggregate_name") == "median" for b in benches)
    out = []
    for b in benches:
        if has_median and b.get("aggregate_name") != "median":
            continue
        if not has_median and b.get("run_type") == "aggregate":
            continue
        out.append(b)
    return data.get("context", {}), out


def args_of(name):
    """'BM_AllReduce/replicas:2/bytes:65536/manual_time_median' -> {'replicas': 2, 'bytes': 65536}"""
    parts = {}
    for p in name.split("/")[1:]:
        if ":" in p:
            k, v = p.split(":", 1)
            parts[k] = int(v)
    return parts


def size_str(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def all_reduce_table(benches):
    print("| N | size/replica | all-reduce ms | anchor ms | ratio anchor/AR | ratio (median paired) "
          "| AR GB/s | anchor GB/s | empty run ms | alloc share | ratio excl. alloc |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for b in benches:
        if not b["name"].startswith("BM_AllReduce"):
            continue
        a = args_of(b["name"])
        # What the ratio would be if allocating the output were free (estimate: subtracts the
        # measured cost of allocating and first-touching an output of the same size).
        no_alloc = b["allreduce_ms"] * (1 - b["alloc_share"])
        print(f"| {a['replicas']} | {size_str(a['bytes'])} | {b['allreduce_ms']:.4g} | {b['anchor_ms']:.4g} "
              f"| {b['ratio']:.2f} | {b['ratio_med']:.2f} | {b['allreduce_GBps']:.3g} | {b['anchor_GBps']:.3g} "
              f"| {b['run_ms']:.3g} | {100 * b['alloc_share']:.0f} % | {b['anchor_ms'] / no_alloc:.2f} |")


def run_table(benches):
    print("| N | run µs | barrier µs | ratio run/barrier | ratio (median paired) | run CPU-µs "
          "| barrier CPU-µs | cores busy during run | idle cores |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in benches:
        if not b["name"].startswith("BM_RunOverhead"):
            continue
        a = args_of(b["name"])
        print(f"| {a['replicas']} | {b['run_us']:.3g} | {b['barrier_us']:.3g} | {b['ratio']:.2f} | {b['ratio_med']:.2f} "
              f"| {b['run_cpu_us']:.3g} | {b['barrier_cpu_us']:.3g} | {b['run_cores']:.2f} | {b['idle_cores']:.3f} |")


def main(paths):
    if not paths:
        print(__doc__)
        return 2
    for path in paths:
        ctx, benches = rows(path)
        print(f"<!-- {path}: {ctx.get('date', '?')}, {ctx.get('num_cpus', '?')} CPUs, "
              f"load {ctx.get('load_avg', '?')} -->")
        if any(b["name"].startswith("BM_AllReduce") for b in benches):
            all_reduce_table(benches)
        if any(b["name"].startswith("BM_RunOverhead") for b in benches):
            run_table(benches)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
