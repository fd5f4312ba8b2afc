#!/usr/bin/env python3
"""Turns the JSON output of the benchmarks (bench_all_reduce, bench_run_overhead,
bench_apply_gradients, bench_input_pipeline, bench_checkpoint, bench_overlap) into the Markdown tables of
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
import re
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
    """'BM_AllReduce/replicas:2/bytes:65536/manual_time_median' -> {'replicas': 2, 'bytes': 65536}.
    Without manual time the aggregate's suffix sticks to the last argument
    ('BM_Crc32/kernel:0/bytes:262144_median'): only the leading integer counts."""
    parts = {}
    for p in name.split("/")[1:]:
        if ":" in p:
            k, v = p.split(":", 1)
            parts[k] = int(re.match(r"-?[0-9]+", v).group(0))
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


def apply_gradients_table(benches):
    print("| N | tensors | anchor ms | reduce packed | SGD (floor) | SGD unpacked | Adam (floor) "
          "| Adam sharded (floor) | worst / floor | Adam state sharded/unsharded |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b in benches:
        if not b["name"].startswith("BM_ApplyGradients"):
            continue
        a = args_of(b["name"])
        worst = max(b["sgd_vs_floor"], b["adam_vs_floor"], b["adam_sh_vs_floor"])
        print(f"| {a['replicas']} | {a['tensors']} | {b['anchor_ms']:.3g} | {b['reduce_pk']:.2f} "
              f"| {b['sgd']:.2f} ({b['sgd_floor']:.2f}) | {b['sgd_un']:.2f} | {b['adam']:.2f} ({b['adam_floor']:.2f}) "
              f"| {b['adam_sh']:.2f} ({b['adam_sh_floor']:.2f}) | {worst:.2f} | {b['adam_state']:.2f} |")


def cross_replica_table(benches):
    print("| N | size/replica | all-reduce ms | reduce ms | reduce / all-reduce (floor) | reduce / floor "
          "| gather ms | copy ms | copy / gather |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in benches:
        if not b["name"].startswith("BM_CrossReplica"):
            continue
        a = args_of(b["name"])
        print(f"| {a['replicas']} | {size_str(a['bytes'])} | {b['allreduce_ms']:.3g} | {b['reduce_ms']:.3g} "
              f"| {b['reduce_vs_ar']:.2f} ({b['reduce_floor']:.2f}) | {b['reduce_vs_floor']:.2f} "
              f"| {b['gather_ms']:.3g} | {b['copy_ms']:.3g} | {b['gather_ratio']:.2f} |")


def input_pipeline_tables(benches):
    print("| N | global batch | dist µs/step | anchor µs/step | ratio anchor/dist | ratio (median paired) "
          "| GB/s | first step µs |")
    print("|---|---|---|---|---|---|---|---|")
    for b in benches:
        if not b["name"].startswith("BM_DistributedThroughput"):
            continue
        a = args_of(b["name"])
        print(f"| {a['replicas']} | {size_str(a['bytes'])} | {b['dist_us']:.3g} | {b['anchor_us']:.3g} "
              f"| {b['ratio']:.2f} | {b['ratio_med']:.2f} | {b['dist_GBps']:.3g} | {b['start_us']:.3g} |")
    print()
    print("| input | step ms | input ms | compute ms | serial ms | step / max | step / sum | hidden |")
    print("|---|---|---|---|---|---|---|---|")
    for b in benches:
        if not b["name"].startswith("BM_PrefetchOverlap"):
            continue
        a = args_of(b["name"])
        kind = "waiting (io:1)" if a.get("io") else "CPU-bound (io:0)"
        print(f"| {kind} | {b['step_ms']:.3g} | {b['input_ms']:.3g} | {b['compute_ms']:.3g} | {b['serial_ms']:.3g} "
              f"| {b['ratio_max']:.2f} | {b['ratio_sum']:.2f} | {b['hidden']:.2f} |")


def checkpoint_table(benches):
    print("| operation | size | checkpoint ms | plain I/O ms | ratio plain/checkpoint | ratio (median paired) "
          "| checkpoint GB/s | plain GB/s | CRC-32 GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in benches:
        a = args_of(b["name"])
        if b["name"].startswith("BM_Save"):
            print(f"| save (anchor: write + fsync + rename) | {size_str(a['bytes'])} | {b['save_ms']:.4g} "
                  f"| {b['write_ms']:.4g} | {b['ratio']:.2f} | {b['ratio_med']:.2f} | {b['save_GBps']:.3g} "
                  f"| {b['write_GBps']:.3g} | |")
        elif b["name"].startswith("BM_Load"):
            print(f"| load (anchor: read) | {size_str(a['bytes'])} | {b['load_ms']:.4g} | {b['read_ms']:.4g} "
                  f"| {b['ratio']:.2f} | {b['ratio_med']:.2f} | {b['load_GBps']:.3g} | {b['read_GBps']:.3g} "
                  f"| {b['crc_GBps']:.3g} |")


def overlap_table(benches):
    print("| N | gradients | compute | compute/comm | step ms | compute ms | comm ms | step / max(compute, comm) "
          "| (median paired) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in benches:
        if not b["name"].startswith("BM_Overlap"):
            continue
        a = args_of(b["name"])
        print(f"| {a['replicas']} | 8 x {size_str(a['bytes'])} | {'busy loop' if a['busy'] else 'sleep'} "
              f"| {a['compute_pct'] / 100:.1f} | {b['step_ms']:.4g} | {b['compute_ms']:.4g} | {b['comm_ms']:.4g} "
              f"| {b['ratio']:.2f} | {b['ratio_med']:.2f} |")


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
        if any(b["name"].startswith("BM_CrossReplica") for b in benches):
            cross_replica_table(benches)
        if any(b["name"].startswith("BM_RunOverhead") for b in benches):
            run_table(benches)
        if any(b["name"].startswith("BM_ApplyGradients") for b in benches):
            apply_gradients_table(benches)
        if any(b["name"].startswith("BM_DistributedThroughput") for b in benches):
            input_pipeline_tables(benches)
        if any(b["name"].startswith(("BM_Save", "BM_Load")) for b in benches):
            checkpoint_table(benches)
        if any(b["name"].startswith("BM_Overlap") for b in benches):
            overlap_table(benches)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
