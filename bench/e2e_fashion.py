#!/usr/bin/env python3
"""TF's tutorial "Custom training with tf.distribute.Strategy" on Fashion-MNIST three ways -- TF,
PyTorch DDP and mirrored's fashion_mnist -- trained alike, and each one's speed at 1 and 2 replicas.

  TF          the tutorial's custom training loop as published (its model, compute_loss with
              compute_average_loss and scale_regularization_loss, Adam 0.001, 64 examples per
              replica, train_step / distributed_train_step / test_step), MirroredStrategy on 1 or 2
              logical CPU devices (tensorflow-cpu from PyPI, in the virtual environment of tf_venv.py)
  PyTorch DDP the same model and loss, DistributedDataParallel, gloo, 1 or 2 processes on
              127.0.0.1 (Debian's python3-torch under /usr/bin/python3); Adam written out with
              Keras' formula (Keras puts epsilon outside the bias correction, torch inside)
  mirrored    build/release/fashion_mnist (C++, this library)

The workers are in e2e_fashion_workers.py. What runs, in order:

  comparison  the three at 2 replicas from the same weights (TF draws them, Keras' Glorot uniform,
              and writes a safetensors file the others read) on the same batches (no shuffle: each
              global batch of 128 is the next 128 examples in file order, each replica its
              consecutive half), --epochs epochs (default 10): every epoch's loss, accuracy, test
              loss and test accuracy, and the first epoch's loss of every step. Reported: the
              epoch-1 losses (their relative differences, target 1e-4), where the steps' losses
              part (steps 1, 10, 25, 50; the mean and sign of mirrored's and PyTorch's per-step
              difference to TF's), and the test accuracy after the last epoch (target: mirrored's at
              least the tutorial's).
  noise floor TF and mirrored at 1 replica with the same global batch of 128: the same training,
              only the order of the float32 sums differs (one replica sums what two summed apart).
              Their epoch-1 losses against the same framework's at 2 replicas: the agreement that
              float32 training allows, to read the comparison's against.
  speed       one epoch of --scaling-examples (default 19,200) at 64 examples per replica, so the
              global batch grows with the replicas (the tutorial's way): each framework at 1 replica
              with one thread (the kernels' speed: the "kernel ratio"), at 1 replica with its default
              threads (TF's and PyTorch's intra-op pools use every core: their best single-replica
              setting), and at 2 replicas (TF: its default threads; PyTorch: 2 processes of 1 thread;
              mirrored: 2 replica threads). X(N) in examples/s, E(2) = X(2) / (2 X(1, one thread)).
              The anchor: two independent single-replica fashion_mnist processes at once, their
              summed examples/s over 2 X(1): the E(2) the two cores allow with no synchronisation
              at all. --speed-rounds rounds (default 3), each running every configuration once:
              each figure is the median over the rounds, each E(2) the median of the rounds' own.
  workers     fashion_mnist under tools/launch.sh with 2 and 4 workers of one replica each
              (MultiWorkerMirroredStrategy), the same epoch: X(N) and E(N) = X(N) / (N X(1)).
  step        fashion_mnist at 2 replicas with --timeline, the gradients reduced after the backward
              pass (the default on one worker) and in 64 KiB buckets during it (--bucket-bytes
              65536): the step split into compute, exposed communication and the rest, and the
              overlap (fashion_timeline.py).

examples/s is each side's training loop over the epoch; TF's and PyTorch's first step (TF traces
its step function there) is left out of the time and the examples, mirrored's is in (it is one
ordinary step). The evaluation, data loading and set-up are excluded everywhere.

    cmake --preset release && cmake --build --preset release --target fashion_mnist
    python3 bench/e2e_fashion.py --out-json e2e_fashion.json --out-md e2e_fashion.md

On the idle 2-vCPU VM (2026-12-07, in make bench-report) it took 15.5 minutes: the 10-epoch
comparison 9.5 of them (TF 4.8, PyTorch 3.4, fashion_mnist 1.4), the noise floor 0.6, the three
speed rounds 5.2, workers and steps 0.2; next to other sessions' builds (load 5-10) the same with
one speed round had taken 25. --epochs 1 saves most of the comparison. --quick (6,400 training and 1,000 test examples, 2 epochs, 3,200 for the speed runs)
checks the plumbing in about 2 minutes; its numbers mean little. Python 3 standard library only in the driver (TensorFlow inside its virtual
environment; PyPI's numpy there and Debian's under /usr/bin/python3).
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_common import add_worker_arguments, loadavg, run_as_worker, run_torch_workers  # noqa: E402
from e2e_fashion_workers import log, tf_worker, torch_worker  # noqa: E402
from fashion_timeline import step_breakdown  # noqa: E402
from tf_venv import default_venv, ensure_venv  # noqa: E402

BATCH_PER_REPLICA = 64
DEFAULT_DATA = Path("/usr/share/datasets/fashion-mnist")
LOSS_TARGET = 1e-4  # the comparison's hope for the epoch-1 losses, relative
SPEED_TARGET = 1.2  # mirrored's examples/s at 2 replicas over TF's and PyTorch's best
EFFICIENCY_TARGET = 0.9

EPOCH_LINE = re.compile(r"^(?:\[worker 0\] )?Epoch (\d+), Loss: ([\d.eE+-]+), Accuracy: ([\d.eE+-]+), "
                        r"Test Loss: ([\d.eE+-]+), Test Accuracy: ([\d.eE+-]+)$", re.M)
LOOP_LINE = re.compile(r"^(?:\[worker 0\] )?training loop: (\d+) examples in ([\d.]+) s", re.M)


def commit():
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "?"


# ---------------------------------------------------------------------------------------------
# Running each side
# ---------------------------------------------------------------------------------------------

def run_mirrored(a, replicas, train_n, epochs, batch=BATCH_PER_REPLICA, init=None, extra=(), workers=0,
                 step_losses=False):
    """fashion_mnist's result (as the workers'). `workers` > 0: that many worker processes of one
    replica each under tools/launch.sh (worker 0's output)."""
    losses_file = Path(a.out_json).with_name(Path(a.out_json).stem + ".step_losses.txt")
    cmd = mirrored_command(a, replicas, train_n, epochs, batch, init,
                           [*(["--step-losses", str(losses_file)] if step_losses else []), *extra])
    if workers:
        cmd = [str(REPO / "tools" / "launch.sh"), str(workers), "--", *cmd, "--strategy", "multi_worker"]
    log("mirrored:", " ".join(cmd))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    sys.stderr.write(out)
    result = mirrored_result(out, cmd, replicas, workers, batch, epochs)
    if step_losses:
        result["step_losses"] = [float(line.split()[2]) for line in losses_file.read_text().splitlines()
                                 if line.split()[0] == "1"]
    return result


def mirrored_command(a, replicas, train_n, epochs, batch, init, extra=()):
    """fashion_mnist's command line: `replicas` CPU replicas, the first `train_n` examples, from
    the weights `init` without shuffling (or its own, shuffled, when `init` is None)."""
    binary = a.build_dir / "fashion_mnist"
    if not binary.exists():
        sys.exit(f"e2e_fashion: {binary} not found; build it: cmake --build --preset release --target fashion_mnist")
    devices = ",".join(f"CPU:{i}" for i in range(replicas))
    return [str(binary), "--devices", devices, "--epochs", str(epochs), "--train-examples", str(train_n),
            "--test-examples", str(a.test_examples), "--data", str(a.data), "--batch-per-replica", str(batch),
            *(["--no-shuffle", "--initial-weights", str(init)] if init else []), *extra]


def mirrored_result(out, cmd, replicas, workers, batch, epochs):
    """What fashion_mnist's output `out` says."""
    lines, loop = EPOCH_LINE.findall(out), LOOP_LINE.search(out)
    if len(lines) != epochs or not loop:
        sys.exit("e2e_fashion: could not read fashion_mnist's output (its epoch lines or the training loop's time)")
    examples, seconds = int(loop[1]), float(loop[2])
    result = {"framework": "mirrored", "version": f"mirrored (commit {commit()}), release build",
              "command": " ".join(cmd), "replicas": max(replicas, workers), "batch_per_replica": batch, "threads": 1,
              "examples": examples // epochs,
              "epochs": [{"epoch": int(e[0]), "loss": float(e[1]), "accuracy": float(e[2]) / 100,
                          "test_loss": float(e[3]), "test_accuracy": float(e[4]) / 100, "train_s": seconds / epochs,
                          "examples_per_s": examples / seconds} for e in lines],
              "examples_per_s": examples / seconds}
    return result


def run_mirrored_pair(a, train_n, init=None):
    """The hardware's anchor: two independent single-replica fashion_mnist processes at once (no
    synchronisation between them), each one's examples/s. Their sum over twice one alone is the
    E(2) that the two cores allow without any collective."""
    cmd = mirrored_command(a, 1, train_n, 1, BATCH_PER_REPLICA, init)
    log("mirrored, two independent processes at once:", " ".join(cmd))
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate()[0] for p in procs]
    for p in procs:
        if p.returncode:
            sys.exit(f"e2e_fashion: fashion_mnist exited with {p.returncode}")
    return [mirrored_result(out, cmd, 1, 0, BATCH_PER_REPLICA, 1)["examples_per_s"] for out in outs]


def worker_args(a, replicas, train_n, epochs, batch, threads, init_flag, init):
    return ["--data", str(a.data), "--train-examples", str(train_n), "--test-examples", str(a.test_examples),
            "--epochs", str(epochs), "--replicas", str(replicas), "--batch-per-replica", str(batch),
            "--threads", str(threads), init_flag, str(init)]


def run_tf(a, replicas, train_n, epochs, init, write_init=False, batch=BATCH_PER_REPLICA, threads=0):
    py = ensure_venv(a.venv or default_venv(), log)
    args = worker_args(a, replicas, train_n, epochs, batch, threads, "--write-init" if write_init else "--read-init",
                       init)
    log(f"TF ({py}): {replicas} replicas x {batch}, threads {threads or 'default'}, {epochs} epochs")
    out = subprocess.run([str(py), str(Path(__file__).resolve()), "--tf-worker", *args], check=True,
                         stdout=subprocess.PIPE, text=True)
    result = json.loads(out.stdout)
    result["examples_per_s"] = mean_speed(result)
    return result


def run_torch(a, replicas, train_n, epochs, init, batch=BATCH_PER_REPLICA, threads=0):
    args = worker_args(a, replicas, train_n, epochs, batch, threads, "--read-init", init)
    result = json.loads(run_torch_workers(__file__, args, replicas, log, "e2e_fashion"))
    result["examples_per_s"] = mean_speed(result)
    return result


def mean_speed(run):
    """examples/s over the epochs (each epoch's timed part)."""
    speeds = [e["examples_per_s"] for e in run["epochs"] if e.get("examples_per_s")]
    return len(speeds) / sum(1 / s for s in speeds) if speeds else None


# ---------------------------------------------------------------------------------------------
# What the runs say
# ---------------------------------------------------------------------------------------------

def rel(x, ref):
    return (x - ref) / ref


def step_agreement(mine, ref):
    """How one run's first-epoch step losses part from another's: the relative difference at steps
    1, 10, 25, 50 and the last; its mean, standard error and sign over the first 50 steps and the
    epoch (a systematic difference shows as a mean well outside its standard error)."""
    n = min(len(ref), len(mine))
    diffs = [rel(mine[i], ref[i]) for i in range(n)]
    first50 = diffs[:50]
    return {"at_step": {str(s): diffs[s - 1] for s in (1, 10, 25, 50, n) if s <= n},
            "mean_first_50": statistics.mean(first50), "above_first_50": sum(d > 0 for d in first50) / len(first50),
            "mean_epoch": statistics.mean(diffs),
            "sem_epoch": statistics.stdev(diffs) / len(diffs) ** 0.5 if n > 1 else 0.0,
            "above_epoch": sum(d > 0 for d in diffs) / n, "steps": n}


def agreement(runs):
    """Per-step agreement of each side's first-epoch losses with TF's."""
    tf = runs["tf"]["step_losses"]
    return {key: step_agreement(run["step_losses"], tf) for key, run in runs.items()
            if key != "tf" and run.get("step_losses")}


def speed_from_rounds(r):
    """r["speed"]: each configuration's median over the rounds, each framework's E(2) as the median
    of its rounds' own (with their range), and the anchor's."""
    rounds, speed = r["speed_rounds"], r["speed"]
    for fw in {fw for rd in rounds for fw in rd if fw != "anchor"}:
        keys = {k for rd in rounds for k in rd.get(fw, {})}
        s = speed[fw] = {k: statistics.median(rd[fw][k] for rd in rounds) for k in keys}
        e2 = [rd[fw]["2"] / (2 * rd[fw]["1"]) for rd in rounds if rd[fw].get("1") and rd[fw].get("2")]
        if e2:
            s["e2"], s["e2_range"] = statistics.median(e2), [min(e2), max(e2)]
    pairs = [(sum(rd["anchor"]["pair"]) / (2 * rd["mirrored"]["1"])) for rd in rounds if "anchor" in rd]
    if pairs:
        speed["anchor"] = {"e2": statistics.median(pairs), "e2_range": [min(pairs), max(pairs)],
                           "pair": statistics.median(sum(rd["anchor"]["pair"]) for rd in rounds)}


def analyse(r):
    """The figures the report states, from the runs (each part only where its runs exist)."""
    runs = r.get("comparison", {})
    if "tf" in runs:
        tf1 = runs["tf"]["epochs"][0]["loss"]
        others = {k: rel(v["epochs"][0]["loss"], tf1) for k, v in runs.items() if k != "tf"}
        if others:
            worst = max(abs(v) for v in others.values())
            r["loss"] = {"relative_to_tf": others, "max_abs": worst, "verdict": "met" if worst <= LOSS_TARGET else
                         "**missed**", "per_step": agreement(runs)}
        tf_steps = runs["tf"].get("step_losses")
        if tf_steps:  # TF sums its epoch loss in float32; the same steps in float64
            r["loss"] = r.get("loss", {})
            r["loss"]["tf_float64_mean"] = sum(tf_steps) / len(tf_steps)
        if "mirrored" in runs:
            acc = {k: v["epochs"][-1]["test_accuracy"] for k, v in runs.items()}
            r["accuracy"] = {"final": acc, "verdict": "met" if acc["mirrored"] >= acc["tf"] else "**missed**"}
    floor = r.get("floor", {})
    for key, run in floor.items():
        two = runs.get(key)
        if two:
            run["relative_to_2_replicas"] = rel(run["epochs"][0]["loss"], two["epochs"][0]["loss"])
            if run.get("step_losses") and two.get("step_losses"):
                run["per_step"] = step_agreement(run["step_losses"], two["step_losses"])
    speed = r.get("speed", {})
    if speed:
        for fw in ("tf", "torch_ddp", "mirrored"):
            s = speed.get(fw)
            if s and s.get("1") and s.get("2") and "e2" not in s:  # one round: E(2) from the figures
                s["e2"] = s["2"] / (2 * s["1"])
        m = speed.get("mirrored", {})
        for fw in ("tf", "torch_ddp"):
            s = speed.get(fw)
            if s and m.get("2"):
                best = max(v for k, v in s.items() if k in ("1", "1_default", "2") and v)
                s["best"] = best
                s["mirrored_over_best"] = m["2"] / best
                if m.get("1") and s.get("1"):
                    s["kernel_ratio"] = m["1"] / s["1"]
        if m.get("e2") is not None:
            others = [speed[fw]["e2"] for fw in ("tf", "torch_ddp") if speed.get(fw, {}).get("e2") is not None]
            m["e2_verdict"] = "met" if m["e2"] >= EFFICIENCY_TARGET and all(m["e2"] >= e for e in others) else \
                "**missed**"
    return r


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------

NAMES_MD = {"tf": "TF tutorial (`MirroredStrategy`)", "torch_ddp": "PyTorch DDP (gloo)",
            "mirrored": "mirrored `fashion_mnist`"}


def fmt(x, spec=",.0f", none="–"):
    return none if x is None else format(x, spec)


def e2_range(s):
    lo_hi = s.get("e2_range")
    return f" [{lo_hi[0]:.2f}–{lo_hi[1]:.2f}]" if lo_hi and lo_hi[0] != lo_hi[1] else ""


def steps_md(a, other):
    at = ", ".join(f"step {s} {d:+.1e}" for s, d in a["at_step"].items())
    return (f"{at}; over the first 50 steps {a['mean_first_50']:+.1e} on average, above {other}'s in "
            f"{100 * a['above_first_50']:.0f} %; over the epoch's {a['steps']} steps {a['mean_epoch']:+.1e} ± "
            f"{a['sem_epoch']:.1e} (standard error), above in {100 * a['above_epoch']:.0f} %")


def markdown(r):
    lines = [f"<!-- e2e_fashion.py, {r['date']}: {r['machine']}; load average {r['load_start']} at the start, "
             f"{r['load_end']} at the end; {r['train_examples']} training and {r['test_examples']} test examples, "
             f"{r['epochs']} epochs; speed runs {r['scaling_examples']} examples"
             f"{'; quick' if r['quick'] else ''} -->"]
    runs = r.get("comparison", {})
    if runs:
        n = r["epochs"]
        lines += [f"**The same training, 2 replicas** (same initial weights, same batches, {n} epochs):", "",
                  f"| | epoch-1 loss | relative to TF | epoch-1 accuracy | epoch-1 test accuracy | test loss after "
                  f"{n} | test accuracy after {n} | examples/s |", "|---|---|---|---|---|---|---|---|"]
        tf1 = runs.get("tf", {}).get("epochs", [{}])[0].get("loss")
        for key, run in runs.items():
            e, last = run["epochs"][0], run["epochs"][-1]
            rel_tf = "–" if tf1 is None or key == "tf" else f"{rel(e['loss'], tf1):+.1e}"
            lines.append(f"| {NAMES_MD[key]} | {e['loss']:.7f} | {rel_tf} | {100 * e['accuracy']:.2f} % "
                         f"| {100 * e['test_accuracy']:.2f} % | {last['test_loss']:.4f} "
                         f"| {100 * last['test_accuracy']:.2f} % | {fmt(run['examples_per_s'])} |")
        lines.append("")
        loss = r.get("loss", {})
        if "max_abs" in loss:
            lines.append(f"- Epoch-1 losses: at most {loss['max_abs']:.1e} from TF's, relative (target "
                         f"{LOSS_TARGET:g}: {loss['verdict']}); TF's own, summed in float64 instead of its float32 "
                         f"running total: {loss['tf_float64_mean']:.7f}.")
        for key, a in loss.get("per_step", {}).items():
            lines.append(f"- {NAMES_MD[key]}, each step's loss against TF's: {steps_md(a, 'TF')}.")
        for key, f in r.get("floor", {}).items():
            if "relative_to_2_replicas" in f:
                lines.append(f"- Noise floor, {NAMES_MD[key]} at 1 replica of 128 against its 2 of 64 (only the order "
                             f"of the float32 sums differs): epoch-1 loss {f['epochs'][0]['loss']:.7f}, "
                             f"{f['relative_to_2_replicas']:+.1e} relative"
                             + (f"; each step's: {steps_md(f['per_step'], '2 replicas')}" if "per_step" in f else "")
                             + ".")
        if "accuracy" in r:
            acc = r["accuracy"]["final"]
            lines.append(f"- Test accuracy after {n} epochs: mirrored {100 * acc['mirrored']:.2f} %, TF "
                         f"{100 * acc['tf']:.2f} %" + (f", PyTorch {100 * acc['torch_ddp']:.2f} %" if "torch_ddp" in acc
                                                        else "") +
                         f" (target: mirrored's at least TF's: {r['accuracy']['verdict']}).")
        lines.append("- Versions: " + "; ".join(run["version"] for run in runs.values()) + ".")
        lines.append("")
    speed = r.get("speed", {})
    if speed:
        n_rounds = len(r.get("speed_rounds", [])) or 1
        lines += [f"**Speed**, one epoch of {r['scaling_examples']} examples, 64 per replica (examples/s; the "
                  f"median of {n_rounds} interleaved rounds, E(2) the median of the rounds' own, their range in "
                  f"brackets):", "",
                  "| | 1 replica, 1 thread | 1 replica, default threads | 2 replicas | E(2) = X(2) / (2 X(1)) "
                  "| mirrored at 2 replicas / its best | kernel ratio (mirrored / it, 1 replica) |",
                  "|---|---|---|---|---|---|---|"]
        for fw in ("tf", "torch_ddp", "mirrored"):
            s = speed.get(fw)
            if not s:
                continue
            lines.append(f"| {NAMES_MD[fw]} | {fmt(s.get('1'))} | {fmt(s.get('1_default'))} | {fmt(s.get('2'))} "
                         f"| {fmt(s.get('e2'), '.2f')}{e2_range(s)} | {fmt(s.get('mirrored_over_best'), '.2f')} "
                         f"| {fmt(s.get('kernel_ratio'), '.2f')} |")
        anchor = speed.get("anchor")
        if anchor:
            lines.append(f"| two independent 1-replica `fashion_mnist` processes at once (no collective) | – | – "
                         f"| {fmt(anchor['pair'])} | {anchor['e2']:.2f}{e2_range(anchor)} | – | – |")
        lines.append("")
        m = speed.get("mirrored", {})
        if m.get("e2") is not None:
            lines.append(f"- mirrored's E(2) {m['e2']:.2f} (target ≥ {EFFICIENCY_TARGET} and no lower than TF's and "
                         f"PyTorch's: {m['e2_verdict']})"
                         + (f"; the two cores allow {anchor['e2']:.2f} without any synchronisation (the anchor), so "
                            f"mirrored reaches {m['e2'] / anchor['e2']:.2f} of that" if anchor else "") + ".")
        for fw in ("tf", "torch_ddp"):
            s = speed.get(fw, {})
            if s.get("mirrored_over_best") is not None:
                lines.append(f"- mirrored at 2 replicas against {NAMES_MD[fw]} at its best ({fmt(s['best'])} "
                             f"examples/s): {s['mirrored_over_best']:.2f}× (target ≥ {SPEED_TARGET}: "
                             f"{'met' if s['mirrored_over_best'] >= SPEED_TARGET else '**missed**'}).")
        lines.append("")
    workers = r.get("workers")
    if workers:
        x1 = speed.get("mirrored", {}).get("1")
        lines += ["**fashion_mnist's workers** (`tools/launch.sh N`, one CPU replica each, "
                  "`MultiWorkerMirroredStrategy`, the same epoch):", "",
                  "| workers | global batch | examples/s | E(N) = X(N) / (N X(1)) |", "|---|---|---|---|"]
        for k, x in sorted(workers.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {k} | {int(k) * BATCH_PER_REPLICA} | {fmt(x)} | "
                         f"{fmt(x / (int(k) * x1) if x1 else None, '.2f')} |")
        lines.append("")
    step = r.get("step")
    if step:
        lines += ["**Where a 2-replica step goes** (`fashion_mnist --timeline`, means over the steps, ms; method "
                  "in `bench/fashion_timeline.py`):", "",
                  "| gradients reduced | examples/s | step | compute | exposed communication | of it, waiting for the "
                  "other replica | rest | communication (its own time) | overlap |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for mode, s in step.items():
            lines.append(f"| {mode} | {fmt(s['examples_per_s'])} | {s['step']:.2f} | {s['compute']:.2f} "
                         f"| {s['exposed']:.2f} | {fmt(s.get('wait'), '.2f')} | {s['rest']:.2f} | {s['comm']:.2f} "
                         f"| {fmt(s['overlap'], '.2f')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-json", default="e2e_fashion.json")
    ap.add_argument("--out-md", default="e2e_fashion.md")
    ap.add_argument("--build-dir", type=Path, default=REPO / "build" / "release")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--venv", type=Path, default=None, help=f"default: {default_venv()}")
    ap.add_argument("--epochs", type=int, default=None, help="epochs of the comparison (default: 10; --quick: 2)")
    ap.add_argument("--train-examples", type=int, default=None, help="default: 60000 (--quick: 6400)")
    ap.add_argument("--test-examples", type=int, default=None, help="default: 10000 (--quick: 1000)")
    ap.add_argument("--scaling-examples", type=int, default=None,
                    help="training examples of the speed, worker and step runs (default: 19200; --quick: 3200)")
    ap.add_argument("--quick", action="store_true", help="fewer examples and epochs: checks the plumbing only")
    ap.add_argument("--skip-tf", action="store_true", help="no TensorFlow side (and no PyTorch in the comparison, "
                                                           "which starts from TF's weights)")
    ap.add_argument("--skip-torch", action="store_true", help="no PyTorch side")
    ap.add_argument("--skip-comparison", action="store_true", help="no comparison and no noise floor")
    ap.add_argument("--skip-scaling", action="store_true", help="no speed, worker and step runs")
    ap.add_argument("--skip-workers", action="store_true", help="no runs under tools/launch.sh")
    ap.add_argument("--speed-rounds", type=int, default=None,
                    help="interleaved rounds of the speed runs, medians reported (default: 3; --quick: 1)")
    add_worker_arguments(ap, "--write-init", "--read-init")
    ap.add_argument("--replicas", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--batch-per-replica", type=int, default=BATCH_PER_REPLICA, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.epochs = a.epochs or (2 if a.quick else 10)
    a.train_examples = a.train_examples or (6400 if a.quick else 60000)
    a.test_examples = a.test_examples or (1000 if a.quick else 10000)
    a.scaling_examples = a.scaling_examples or (3200 if a.quick else 19200)
    a.speed_rounds = a.speed_rounds or (1 if a.quick else 3)
    if run_as_worker(a, tf_worker, torch_worker):
        return 0

    out_json = Path(a.out_json)
    init = out_json.with_name(out_json.stem + ".init.safetensors")
    r = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
         "load_start": loadavg(), "quick": a.quick, "epochs": a.epochs, "train_examples": a.train_examples,
         "test_examples": a.test_examples, "scaling_examples": a.scaling_examples, "seconds": {}}
    use_torch = not a.skip_torch and not a.skip_tf

    def timed(stage, fn):
        t0 = time.perf_counter()
        value = fn()
        r["seconds"][stage] = round(time.perf_counter() - t0, 1)
        return value

    n, e = a.train_examples, a.epochs
    if not a.skip_comparison:
        runs = r["comparison"] = {}
        weights = None
        if not a.skip_tf:
            runs["tf"] = timed("comparison tf", lambda: run_tf(a, 2, n, e, init, write_init=True))
            weights = init
        if use_torch:
            runs["torch_ddp"] = timed("comparison torch", lambda: run_torch(a, 2, n, e, init, threads=1))
        runs["mirrored"] = timed("comparison mirrored",
                                 lambda: run_mirrored(a, 2, n, e, init=weights, step_losses=True))
        floor = r["floor"] = {}
        if not a.skip_tf:
            floor["tf"] = timed("floor tf", lambda: run_tf(a, 1, n, 1, init, batch=2 * BATCH_PER_REPLICA))
        floor["mirrored"] = timed("floor mirrored", lambda: run_mirrored(a, 1, n, 1, batch=2 * BATCH_PER_REPLICA,
                                                                         init=weights, step_losses=True))
    if not a.skip_scaling:
        s, speed = a.scaling_examples, {}
        r["speed"] = speed
        if not init.exists() and not a.skip_tf:  # the speed runs alone: TF draws the weights first
            run_tf(a, 1, BATCH_PER_REPLICA, 1, init, write_init=True)
        weights = init if init.exists() else None
        # Every configuration once per round, the rounds one after another: the machine's speed
        # drifts over minutes (other tenants), so each figure is the median over the rounds and
        # each E(2) the median of the rounds' own X(2) / (2 X(1)), both measured minutes apart at most.
        configs = [("mirrored", "1", lambda: run_mirrored(a, 1, s, 1, init=weights)["examples_per_s"]),
                   ("mirrored", "2", lambda: run_mirrored(a, 2, s, 1, init=weights)["examples_per_s"]),
                   ("anchor", "pair", lambda: run_mirrored_pair(a, s, init=weights))]
        if not a.skip_tf:
            configs += [("tf", "1", lambda: run_tf(a, 1, s, 1, init, threads=1)["examples_per_s"]),
                        ("tf", "1_default", lambda: run_tf(a, 1, s, 1, init)["examples_per_s"]),
                        ("tf", "2", lambda: run_tf(a, 2, s, 1, init)["examples_per_s"])]
        if use_torch:
            configs += [("torch_ddp", "1", lambda: run_torch(a, 1, s, 1, init, threads=1)["examples_per_s"]),
                        ("torch_ddp", "1_default", lambda: run_torch(a, 1, s, 1, init)["examples_per_s"]),
                        ("torch_ddp", "2", lambda: run_torch(a, 2, s, 1, init, threads=1)["examples_per_s"])]
        rounds = r["speed_rounds"] = []
        t0 = time.perf_counter()
        for k in range(a.speed_rounds):
            log(f"speed round {k + 1} of {a.speed_rounds}")
            got = {}
            for fw, key, fn in configs:
                got.setdefault(fw, {})[key] = fn()
            rounds.append(got)
        r["seconds"]["speed"] = round(time.perf_counter() - t0, 1)
        speed_from_rounds(r)
        if not a.skip_workers:
            r["workers"] = timed("workers", lambda: {
                str(k): run_mirrored(a, 1, s, 1, init=weights, workers=k)["examples_per_s"] for k in (2, 4)})
        step = r["step"] = {}
        for mode, extra in (("after the backward pass (default)", []),
                            ("in 64 KiB buckets during it", ["--bucket-bytes", "65536"])):
            trace = out_json.with_name(out_json.stem + f".timeline.{len(step)}.json")
            run = timed(f"step {len(step)}", lambda: run_mirrored(a, 2, s, 1, init=weights,
                                                                  extra=["--timeline", str(trace), *extra]))
            step[mode] = {**step_breakdown(trace), "examples_per_s": run["examples_per_s"]}
    r["load_end"] = loadavg()
    analyse(r)
    out_json.write_text(json.dumps(r, indent=1) + "\n")
    md = markdown(r)
    Path(a.out_md).write_text(md)
    sys.stdout.write(md)
    log("seconds per stage: " + ", ".join(f"{k} {v}" for k, v in r["seconds"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
