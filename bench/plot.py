#!/usr/bin/env python3
"""Draws the charts of docs/performance.md from the benchmarks' JSON output (PNG, matplotlib).

    python3 bench/plot.py --all-reduce all_reduce.json --run-overhead run_overhead.json \\
        --tf-compare tf_compare.json --e2e-digits e2e_digits.json --e2e-fashion e2e_fashion.json --out docs/img

  all_reduce.png    bench_all_reduce: all-reduce GB/s against the size per replica, one line per
                    replica count, with the memory anchor (one in-place pass over the same
                    buffers, same threads) dashed in the same colour
  run_overhead.png  bench_run_overhead: µs per empty strategy.run against the replica count, with
                    the std::barrier round trip of as many threads
  tf_compare.png    tf_compare.py: TF eager, TF tf.function and mirrored for each operation and
                    replica count (log scale)
  e2e_digits.png    e2e_digits.py: the digits MLP trained by train_digits, TF Keras and PyTorch DDP:
                    examples/s of each (log scale), and held-out accuracy after each epoch against
                    the seconds since training began (log scale), with the 97 % line
  e2e_fashion.png   e2e_fashion.py: TF's Fashion-MNIST tutorial, PyTorch DDP and fashion_mnist:
                    examples/s of each at 1 replica (one thread, default threads) and 2, with E(2),
                    and the test accuracy after each epoch of the same training

Each input is optional; only the charts whose input is given are drawn. Google Benchmark files
with repetitions use the median aggregate (as summarize.py does). --note adds a line under every
title (run_all.sh --quick passes "provisional ..."). Needs matplotlib (Debian python3-matplotlib).
"""
import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

MIB = 1 << 20
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def gbench_rows(path):
    """The rows of a Google Benchmark JSON file: medians when there are repetitions."""
    data = json.loads(Path(path).read_text())
    benches = data.get("benchmarks", [])
    has_median = any(b.get("aggregate_name") == "median" for b in benches)
    rows = []
    for b in benches:
        if has_median and b.get("aggregate_name") != "median":
            continue
        if not has_median and b.get("run_type") == "aggregate":
            continue
        args = {}
        for part in b["name"].split("/")[1:]:
            if ":" in part:
                k, v = part.split(":", 1)
                args[k] = int(v)
        rows.append((b["name"].split("/")[0], args, b))
    return data.get("context", {}), rows


def size_label(nbytes):
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes >> 10} KiB"


def titled(ax, title, note):
    ax.set_title(title + (f"\n{note}" if note else ""), fontsize=11)


def plot_all_reduce(path, out, note):
    _, rows = gbench_rows(path)
    by_n = {}
    for name, args, b in rows:
        if name == "BM_AllReduce":
            by_n.setdefault(args["replicas"], []).append((args["bytes"], b["allreduce_GBps"], b["anchor_GBps"]))
    if not by_n:
        sys.exit(f"plot.py: no BM_AllReduce rows in {path}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = set()
    for i, (n, pts) in enumerate(sorted(by_n.items())):
        pts.sort()
        sizes.update(p[0] for p in pts)
        c = COLORS[i % len(COLORS)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, label=f"all-reduce, N = {n}")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], "s--", color=c, alpha=0.6, label=f"memory anchor, N = {n}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(sizes), [size_label(s) for s in sorted(sizes)])
    ax.minorticks_off()
    ax.set_xlabel("size per replica")
    ax.set_ylabel("GB/s (2·S·N bytes moved / time)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    titled(ax, "In-process all-reduce (SUM, float32) on CPU replicas", note)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_run_overhead(path, out, note):
    _, rows = gbench_rows(path)
    pts = sorted((args["replicas"], b["run_us"], b["barrier_us"]) for name, args, b in rows if name == "BM_RunOverhead")
    if not pts:
        sys.exit(f"plot.py: no BM_RunOverhead rows in {path}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ns = [p[0] for p in pts]
    ax.plot(ns, [p[1] for p in pts], "o-", color=COLORS[0], label="empty strategy.run")
    ax.plot(ns, [p[2] for p in pts], "s--", color=COLORS[1], label="std::barrier round trip (anchor)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("replicas N (threads)")
    ax.set_ylabel("µs per call")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    titled(ax, "Fixed cost of strategy.run", note)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_tf_compare(path, out, note):
    result = json.loads(Path(path).read_text())
    rows = result["rows"]
    names = {"empty_run": "empty run", "all_reduce": "all_reduce", "reduce": "reduce"}
    series = [("tf_eager_ms", f"TF {result['tf_version']} eager", COLORS[1]),
              ("tf_function_ms", f"TF {result['tf_version']} tf.function", COLORS[4]),
              ("mirrored_ms", "mirrored", COLORS[0])]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.27
    for k, (key, label, color) in enumerate(series):
        xs = [i + (k - 1) * width for i in range(len(rows))]
        ys = [r.get(key) or 0 for r in rows]
        bars = ax.bar(xs, ys, width, label=label, color=color)
        for bar, y in zip(bars, ys):
            if y:
                ax.annotate(f"{y:.3g}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom",
                            fontsize=6, xytext=(0, 1), textcoords="offset points")
    labels = []
    for r in rows:
        size = f", {r['bytes'] // MIB} MiB" if r["bytes"] else ""
        labels.append(f"{names[r['op']]}\nN = {r['replicas']}{size}")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per operation (log scale)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    titled(ax, "MirroredStrategy on logical CPU devices: TensorFlow and mirrored, one run", note)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_e2e_digits(path, out, note):
    result = json.loads(Path(path).read_text())
    names = {"mirrored": "mirrored train_digits", "tf_keras": "TF Keras model.fit", "torch_ddp": "PyTorch DDP (gloo)"}
    colors = {"mirrored": COLORS[0], "tf_keras": COLORS[1], "torch_ddp": COLORS[4]}
    keys = list(result["summary"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.38
    for k, (field, alpha) in enumerate((("examples_per_s", 1.0), ("examples_per_s_after_epoch_1", 0.55))):
        xs = [i + (k - 0.5) * width for i in range(len(keys))]
        ys = [result["summary"][key][field] or 0 for key in keys]
        bars = ax1.bar(xs, ys, width, color=[colors[key] for key in keys], alpha=alpha, edgecolor="black",
                       linewidth=0.5)
        for bar, y in zip(bars, ys):
            if y:
                ax1.annotate(f"{y:,.0f}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom",
                             fontsize=7, xytext=(0, 1), textcoords="offset points")
    ax1.set_xticks(range(len(keys)), [names[key] for key in keys], fontsize=8)
    ax1.set_yscale("log")
    ax1.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax1.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:,.0f}"))
    ax1.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax1.set_ylabel("examples/s of the training loop (log scale)")
    ax1.grid(True, axis="y", alpha=0.3)
    ax1.text(0.98, 0.98, "solid: all epochs\npale: after the first epoch", transform=ax1.transAxes, ha="right",
             va="top", fontsize=8)
    titled(ax1, f"Training throughput, 2 replicas, global batch {result['global_batch']}", note)
    for key in keys:
        recs = result["runs"][key]["epochs"]
        ax2.plot([r["wall_s"] for r in recs], [100 * r["test_accuracy"] for r in recs], "o-", ms=3,
                 color=colors[key], label=names[key])
    ax2.axhline(100 * result["target_accuracy"], color="gray", ls="--", lw=1,
                label=f"{100 * result['target_accuracy']:.0f} %")
    ax2.set_xscale("log")
    ax2.set_xlabel("seconds since training began (evaluations included, log scale)")
    ax2.set_ylabel("held-out accuracy after each epoch (%)")
    # Room under the lowest point for the legend.
    ax2.set_ylim(max(0, min(100 * r["test_accuracy"] for key in keys for r in result["runs"][key]["epochs"]) - 8),
                 100)
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8, loc="lower right")
    titled(ax2, f"Held-out accuracy against time ({result['epochs']} epochs)", note)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_e2e_fashion(path, out, note):
    """e2e_fashion.py: each framework's examples/s at 1 replica (one thread, default threads) and 2,
    and the comparison's test accuracy after each epoch."""
    result = json.loads(Path(path).read_text())
    names = {"tf": "TF tutorial", "torch_ddp": "PyTorch DDP", "mirrored": "mirrored fashion_mnist"}
    colors = {"tf": COLORS[1], "torch_ddp": COLORS[4], "mirrored": COLORS[0]}
    speed, runs = result.get("speed") or {}, result.get("comparison") or {}
    panels = [p for p, have in (("speed", speed), ("accuracy", runs)) if have]
    if not panels:
        raise SystemExit(f"plot.py: {path} has neither speed runs nor a comparison")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    if speed:
        ax = axes["speed"]
        settings = [("1", "1 replica, 1 thread", 0.45), ("1_default", "1 replica, default threads", 0.7),
                    ("2", "2 replicas", 1.0)]
        keys = [k for k in ("tf", "torch_ddp", "mirrored") if k in speed]
        width = 0.27
        for j, (field, label, alpha) in enumerate(settings):
            xs = [i + (j - 1) * width for i in range(len(keys))]
            ys = [speed[k].get(field) or 0 for k in keys]
            bars = ax.bar(xs, ys, width, color=[colors[k] for k in keys], alpha=alpha, edgecolor="black",
                          linewidth=0.5, label=label)
            for bar, y in zip(bars, ys):
                if y:
                    ax.annotate(f"{y:,.0f}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom",
                                fontsize=7, xytext=(0, 1), textcoords="offset points")
        labels = [names[k] + (f"\nE(2) = {speed[k]['e2']:.2f}" if speed[k].get("e2") is not None else "")
                  for k in keys]
        ax.set_xticks(range(len(keys)), labels, fontsize=8)
        ax.set_ylabel("examples/s of the training loop")
        ax.set_ylim(0, 1.3 * max(v for k in keys for f, _, _ in settings for v in [speed[k].get(f) or 0]))
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", ncol=3)
        titled(ax, f"Speed, 64 examples per replica ({result['scaling_examples']:,} examples)", note)
    if runs:
        ax = axes["accuracy"]
        for key, run in runs.items():
            recs = run["epochs"]
            ax.plot([r["epoch"] for r in recs], [100 * r["test_accuracy"] for r in recs], "o-", ms=3,
                    color=colors[key], label=names[key])
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel("test accuracy after the epoch (%)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        titled(ax, "Same weights, same batches, 2 replicas", note)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all-reduce", help="bench_all_reduce JSON")
    ap.add_argument("--run-overhead", help="bench_run_overhead JSON")
    ap.add_argument("--tf-compare", help="tf_compare.py JSON")
    ap.add_argument("--e2e-digits", help="e2e_digits.py JSON")
    ap.add_argument("--e2e-fashion", help="e2e_fashion.py JSON")
    ap.add_argument("--out", default="docs/img", help="output folder (default: docs/img)")
    ap.add_argument("--note", default="", help="a line under every title")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for arg, fn, name in ((a.all_reduce, plot_all_reduce, "all_reduce.png"),
                          (a.run_overhead, plot_run_overhead, "run_overhead.png"),
                          (a.tf_compare, plot_tf_compare, "tf_compare.png"),
                          (a.e2e_digits, plot_e2e_digits, "e2e_digits.png"),
                          (a.e2e_fashion, plot_e2e_fashion, "e2e_fashion.png")):
        if arg:
            fn(arg, out / name, a.note)
            made.append(str(out / name))
    if not made:
        ap.error("give at least one of --all-reduce, --run-overhead, --tf-compare, --e2e-digits, --e2e-fashion")
    print("plot.py: wrote " + ", ".join(made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
