#!/usr/bin/env python3
"""The benchmark targets of a bench/run_all.sh run, each against what this run measured, as one
Markdown table (a row per target: the figure, the target, met or not).

    python3 bench/targets.py OUT_DIR

OUT_DIR is run_all.sh's output folder: apply_gradients.json, all_reduce.json (Google Benchmark,
medians of repetitions), and where they exist tf_compare.json, e2e_digits.json, e2e_fashion.json and
multi_worker.log (bench/bench_multi_worker.sh's output). A missing input leaves its rows out.
Python 3 standard library only.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summarize import args_of, rows  # noqa: E402


def benches(path, prefix):
    if not path.exists():
        return []
    return [b for b in rows(str(path))[1] if b["name"].startswith(prefix)]


def row(what, figure, target, met):
    verdict = "met" if met else "**missed**"
    return f"| {what} | {figure} | {target} | {verdict} |"


def apply_gradients_rows(out):
    lines = []
    for b in benches(out / "apply_gradients.json", "BM_ApplyGradients"):
        a = args_of(b["name"])
        if a.get("tensors") != 100:
            continue
        n = a["replicas"]
        for key, name in (("sgd", "SGD"), ("adam", "Adam"), ("adam_sh", "Adam, sharded")):
            vs = b[f"{key}_vs_floor"]
            lines.append(row(f"`apply_gradients` {name}, 25 MB in 100 tensors, N = {n}: step / all-reduce, over its "
                             "floor", f"{b[key]:.2f} (floor {b[key + '_floor']:.2f}): {vs:.2f}x the floor", "<= 1.15x",
                             vs <= 1.15))
        if n == 4:
            lines.append(row("Adam state per replica, sharded / unsharded, N = 4", f"{b['adam_state']:.3f}", "<= 0.26",
                             b["adam_state"] <= 0.26))
    return lines


def all_reduce_rows(out, tf):
    lines = []
    path = out / "all_reduce.json"
    for b in benches(path, "BM_CrossReplica"):
        n = args_of(b["name"])["replicas"]
        lines.append(row(f"`strategy.reduce` 64 MiB, N = {n}: reduce / all-reduce, over its floor",
                         f"{b['reduce_vs_ar']:.2f} (floor {b['reduce_floor']:.3f}): {b['reduce_vs_floor']:.2f}x",
                         "<= 1.15x", b["reduce_vs_floor"] <= 1.15))
        if tf:
            tf_row = [r for r in tf["rows"] if r["op"] == "reduce" and r["replicas"] == n]
            if tf_row:
                r = tf_row[0]
                lines.append(row(f"`strategy.reduce` 64 MiB, N = {n}, against TF eager (`tf_compare.py`)",
                                 f"{r['mirrored_ms']:.2f} ms vs {r['tf_eager_ms']:.2f} ms", "no slower",
                                 r["mirrored_ms"] <= r["tf_eager_ms"]))
        lines.append(row(f"`strategy.gather` 64 MiB, N = {n}: the replicas' own copy / gather",
                         f"{b['gather_ratio']:.2f}", "reported (same traffic)", True))
    for b in benches(path, "BM_AllReduce"):
        a = args_of(b["name"])
        if a["replicas"] == 2 and a["bytes"] == 64 << 10:
            lines.append(row("64 KiB all-reduce / empty `run`, N = 2", f"{b['vs_empty']:.2f}", "<= 2", b["vs_empty"] <= 2))
    return lines


def compression_rows(out):
    path = out / "multi_worker.log"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        # bench_multi_worker.sh's compression table: the transport in 30 columns, then none, FP16
        # and BF16 as "ms (GB/s)", then the two speed-ups.
        label, fields = line[:30].strip(), line[30:].split()
        if not label.startswith(("Gloo/TCP", "shared memory")) or len(fields) != 8:
            continue
        fp16 = float(fields[-2])
        target = label == "Gloo/TCP"
        lines.append(row(f"64 MiB float all-reduce, 2 workers, {label}: none / FP16", f"{fp16:.2f}",
                         ">= 1.5" if target else "reported", fp16 >= 1.5 or not target))
    return lines


def e2e_rows(out):
    path = out / "e2e_digits.json"
    if not path.exists():
        return []
    e2e = json.loads(path.read_text())
    lines = []
    for key, name, target in (("tf_keras", "TF Keras `fit`", 50), ("torch_ddp", "PyTorch DDP", 15)):
        r = e2e["ratios"].get(key)
        if not r:
            continue
        s = e2e["summary"]

        def to_target(side):
            t = s[side]["train_s_to_target"]
            return "not reached" if t is None else f"{t:.3f} s"

        lines.append(row(f"digits end to end: examples/s, `train_digits` / {name}",
                         f"{r['examples_per_s']:.1f}x ({s['mirrored']['examples_per_s']:,.0f} vs "
                         f"{s[key]['examples_per_s']:,.0f}); 97 % after {to_target('mirrored')} vs {to_target(key)}",
                         f">= {target}x", r["examples_per_s"] >= target))
    return lines


def fashion_rows(out):
    """e2e_fashion.py's targets: fashion_mnist's E(2), its examples/s at 2 replicas against TF's
    tutorial and PyTorch DDP at their best, the epoch-1 losses and the final test accuracy."""
    path = out / "e2e_fashion.json"
    if not path.exists():
        return []
    r = json.loads(path.read_text())
    lines = []
    speed = r.get("speed") or {}
    m = speed.get("mirrored", {})
    if m.get("e2") is not None:
        others = ", ".join([f"{name} {speed[k]['e2']:.2f}" for k, name in (("tf", "TF"), ("torch_ddp", "DDP"))
                            if speed.get(k, {}).get("e2") is not None] +
                           ([f"the cores without synchronisation {speed['anchor']['e2']:.2f}"] if "anchor" in speed
                            else []))
        lines.append(row("Fashion-MNIST: `fashion_mnist`'s E(2) = X(2) / (2 X(1))",
                         f"{m['e2']:.2f}" + (f" ({others})" if others else ""), ">= 0.9, no lower than TF's and DDP's",
                         m["e2_verdict"] == "met"))
    for key, name in (("tf", "TF's tutorial"), ("torch_ddp", "PyTorch DDP")):
        s = speed.get(key, {})
        if s.get("mirrored_over_best") is not None:
            lines.append(row(f"Fashion-MNIST: examples/s, `fashion_mnist` at 2 replicas / {name} at its best",
                             f"{s['mirrored_over_best']:.2f}x ({m['2']:,.0f} vs {s['best']:,.0f})", ">= 1.2x",
                             s["mirrored_over_best"] >= 1.2))
    loss = r.get("loss", {})
    if "max_abs" in loss:
        lines.append(row("Fashion-MNIST: epoch-1 loss, largest relative difference to TF's tutorial",
                         f"{loss['max_abs']:.1e}", "<= 1e-4", loss["max_abs"] <= 1e-4))
    acc = r.get("accuracy")
    if acc:
        final = acc["final"]
        lines.append(row(f"Fashion-MNIST: test accuracy after {r['epochs']} epochs, `fashion_mnist` / TF's tutorial",
                         f"{100 * final['mirrored']:.2f} % vs {100 * final['tf']:.2f} %", "at least TF's",
                         final["mirrored"] >= final["tf"]))
    return lines


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    out = Path(argv[1])
    tf_path = out / "tf_compare.json"
    tf = json.loads(tf_path.read_text()) if tf_path.exists() else None
    lines = ["| target | this run | target | verdict |", "|---|---|---|---|"]
    lines += (apply_gradients_rows(out) + all_reduce_rows(out, tf) + compression_rows(out) + e2e_rows(out) +
              fashion_rows(out))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
