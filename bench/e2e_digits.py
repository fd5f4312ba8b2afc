#!/usr/bin/env python3
"""The digits MLP trained end to end by train_digits, TensorFlow Keras and PyTorch DDP, in one run.

The same model, data, batches, initial weights, optimizer and epochs on two CPU replicas (or
processes), three ways:

  mirrored    build/release/train_digits --devices CPU:0,CPU:1 --eval-every-epoch (C++, this library)
  TF Keras    model.fit under tf.distribute.MirroredStrategy on 2 logical CPU devices
              (tensorflow-cpu from PyPI, in the virtual environment of tf_venv.py)
  PyTorch DDP DistributedDataParallel, gloo backend, 2 processes on 127.0.0.1, torch.set_num_threads(1)
              (Debian's python3-torch under /usr/bin/python3: scripts/install-deps.sh --ddp)

The model is examples/digits/mlp.hpp's: 64-64-10, ReLU hidden layer, softmax cross-entropy on the
logits, the global batch's mean loss; SGD without momentum (learning rate 0.5, train_digits'
default), global batch 32 (16 per replica; the last batch of an epoch, 30 examples, 15 each), 20
epochs. `e2e_digits_setup` (bench/e2e_digits_setup.cpp, built with train_digits) writes what makes
the three identical: train_digits' held-out split, each epoch's shuffled order of the training set
as train_digits' input pipeline visits it, and its initial weights; the Python sides train on
exactly those batches from exactly those weights (the epoch-1 losses agree to float rounding; the
script reports them).

Timed the same way for all three: the training loop, epoch by epoch, from the start of an epoch's
pass over the input to the end of its last step (input batching included; process start, data
loading, model and strategy set-up excluded). After every epoch each side evaluates the held-out
set (outside the training loop's time) to find when held-out accuracy first reaches 97 %.
Reported: examples/s over all epochs and over epochs 2.. (without the first epoch, whose steps
include TF's tracing of the training function and every side's first-use costs), the training
loop's seconds and the wall seconds (evaluations included) until 97 %, the final accuracy, and
the ratios. Writes one JSON file and one Markdown table.

    cmake --preset release && cmake --build --preset release --target train_digits e2e_digits_setup
    python3 bench/e2e_digits.py --out-json e2e_digits.json --out-md e2e_digits.md

--quick: 3 epochs (checks the plumbing; the numbers mean little). Python 3 standard library only
in the driver (TensorFlow inside its virtual environment; PyTorch under /usr/bin/python3).
"""
import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_common import add_worker_arguments, loadavg, replica_slice, run_as_worker, run_torch_workers  # noqa: E402
from tf_venv import TF_PACKAGE, default_venv, ensure_venv  # noqa: E402

TARGET_ACCURACY = 0.97
GLOBAL_BATCH = 32
LEARNING_RATE = 0.5
REPLICAS = 2


def log(*args):
    print("e2e_digits:", *args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Shared by the workers (numpy is imported by the caller: both the TF venv and Debian have it)
# ---------------------------------------------------------------------------------------------

def load_inputs(np, setup_path, data_path):
    """The training and held-out sets, the epoch orders and the initial weights of the setup file."""
    setup = json.loads(Path(setup_path).read_text())
    rows = []
    with gzip.open(data_path, "rt") as f:
        for line in f:
            if line.strip():
                rows.append([int(v) for v in line.split(",")])
    table = np.array(rows, dtype=np.int64)
    x = (table[:, :64].astype(np.float32) / np.float32(16))  # pixel / 16, exact, as digits_data.hpp
    y = table[:, 64].astype(np.int64)
    train, test = np.array(setup["train_rows"]), np.array(setup["test_rows"])
    init = {k: np.array(v["values"], dtype=np.float32).reshape(v["shape"]) for k, v in setup["init"].items()}
    return {"x_train": x[train], "y_train": y[train], "x_test": x[test], "y_test": y[test],
            "orders": np.array(setup["epoch_orders"], dtype=np.int64), "init": init}



# ---------------------------------------------------------------------------------------------
# TF Keras (runs inside the virtual environment: `python e2e_digits.py --tf-worker ...`)
# ---------------------------------------------------------------------------------------------

def tf_worker(a):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import keras

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()
                                                         for _ in range(REPLICAS)])
    d = load_inputs(np, a.setup, a.data)
    epochs = a.epochs
    n = len(d["y_train"])
    steps = -(-n // GLOBAL_BATCH)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        init = d["init"]
        model.set_weights([init["dense/kernel"], init["dense/bias"], init["dense_1/kernel"], init["dense_1/bias"]])
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # Epoch e's batches are the training set in train_digits' order for epoch e, cut into global
    # batches of 32 (the last one 30); fit's distributed iterator splits each into 2 replica
    # slices. One dataset of all epochs, read steps_per_epoch batches per epoch.
    x_train, y_train = tf.constant(d["x_train"]), tf.constant(d["y_train"].astype(np.int32))
    epoch_sets = [tf.data.Dataset.from_tensor_slices((tf.gather(x_train, o), tf.gather(y_train, o))).batch(GLOBAL_BATCH)
                  for o in d["orders"][:epochs]]
    ds = epoch_sets[0]
    for e in epoch_sets[1:]:
        ds = ds.concatenate(e)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    # fit distributes the dataset with experimental_distribute_dataset: each replica gets half of
    # each global batch. Checked once here, outside the timing.
    first = next(iter(strategy.experimental_distribute_dataset(epoch_sets[0])))
    replica_rows = [int(t.shape[0]) for t in strategy.experimental_local_results(first[0])]
    assert replica_rows == [GLOBAL_BATCH // REPLICAS] * REPLICAS, replica_rows
    x_test, y_test = tf.constant(d["x_test"]), d["y_test"]

    records = []

    class Timer(keras.callbacks.Callback):
        train_s = 0.0
        first = None

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()
            if self.first is None:
                self.first = self.t0

        def on_epoch_end(self, epoch, logs=None):
            # logs["loss"] is a Python number here: the epoch's last step has finished.
            loss = float(logs["loss"])
            Timer.train_s += time.perf_counter() - self.t0
            logits = model(x_test, training=False).numpy()
            acc = float(np.mean(np.argmax(logits, axis=1) == y_test))
            records.append({"epoch": epoch + 1, "loss": loss, "test_accuracy": acc, "train_s": Timer.train_s,
                            "wall_s": time.perf_counter() - self.first})
            log(f"TF epoch {epoch + 1}: loss {loss:.6f}, held-out accuracy {100 * acc:.2f} %, "
                f"training loop {Timer.train_s:.3f} s")

    model.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[Timer()])
    return {"framework": "tf_keras", "version": f"TensorFlow {tf.__version__}, Keras {keras.__version__}",
            "package": TF_PACKAGE, "jit_compile": bool(model.jit_compile),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "replica_batch_rows": replica_rows,
            "examples": n * epochs, "epochs": records}


# ---------------------------------------------------------------------------------------------
# PyTorch DDP (runs under /usr/bin/python3: `python3 e2e_digits.py --torch-worker --rank R ...`)
# ---------------------------------------------------------------------------------------------

def torch_worker(a):
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rank, world = a.rank, REPLICAS
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world)
    d = load_inputs(np, a.setup, a.data)
    epochs = a.epochs
    x_train, y_train = torch.from_numpy(d["x_train"]), torch.from_numpy(d["y_train"])
    x_test, y_test = torch.from_numpy(d["x_test"]), torch.from_numpy(d["y_test"])
    orders = torch.from_numpy(d["orders"])
    n = len(y_train)
    steps = -(-n // GLOBAL_BATCH)

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    init = d["init"]
    with torch.no_grad():  # torch's Linear keeps (out, in): the kernels transposed
        model[0].weight.copy_(torch.from_numpy(init["dense/kernel"].T.copy()))
        model[0].bias.copy_(torch.from_numpy(init["dense/bias"]))
        model[2].weight.copy_(torch.from_numpy(init["dense_1/kernel"].T.copy()))
        model[2].bias.copy_(torch.from_numpy(init["dense_1/bias"]))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

    records = []
    train_s = 0.0
    dist.barrier()
    first = time.perf_counter()
    for e in range(epochs):
        t0 = time.perf_counter()
        order = orders[e]
        loss_sum = torch.zeros((), dtype=torch.float64)
        for s in range(steps):
            start = s * GLOBAL_BATCH
            b = min(GLOBAL_BATCH, n - start)
            lo, hi = replica_slice(b, rank, world)
            idx = order[start + lo:start + hi]
            xb, yb = x_train[idx], y_train[idx]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(xb), yb)
            # DDP averages the gradients over the processes: scaled so that the result is the
            # gradient of the global batch's mean loss, as on the other two sides.
            (loss * (world / b)).backward()
            opt.step()
            loss_sum += loss.detach()
        dist.all_reduce(loss_sum)  # once per epoch: the epoch's mean loss over all its examples
        train_s += time.perf_counter() - t0
        with torch.no_grad():
            acc = float((model(x_test).argmax(dim=1) == y_test).double().mean())
        records.append({"epoch": e + 1, "loss": float(loss_sum) / n, "test_accuracy": acc, "train_s": train_s,
                        "wall_s": time.perf_counter() - first})
        if rank == 0:
            log(f"PyTorch epoch {e + 1}: loss {float(loss_sum) / n:.6f}, held-out accuracy {100 * acc:.2f} %, "
                f"training loop {train_s:.3f} s")
    dist.destroy_process_group()
    return {"framework": "torch_ddp", "version": f"PyTorch {torch.__version__} (Debian python3-torch), gloo",
            "threads_per_process": torch.get_num_threads(), "examples": n * epochs, "epochs": records}


# ---------------------------------------------------------------------------------------------
# The driver (any python3)
# ---------------------------------------------------------------------------------------------


def run_setup(binary, out, epochs, data):
    if not Path(binary).exists():
        sys.exit(f"e2e_digits: {binary} not found; build it: "
                 "cmake --build --preset release --target train_digits e2e_digits_setup")
    subprocess.run([str(binary), str(out), "--epochs", str(epochs), "--data", str(data)], check=True,
                   stdout=sys.stderr)


def run_mirrored(binary, epochs, data):
    if not Path(binary).exists():
        sys.exit(f"e2e_digits: {binary} not found; build it: cmake --build --preset release --target train_digits")
    cmd = [str(binary), "--devices", "CPU:0,CPU:1", "--epochs", str(epochs), "--global-batch", str(GLOBAL_BATCH),
           "--optimizer", "sgd", "--learning-rate", str(LEARNING_RATE), "--seed", "0", "--data", str(data),
           "--eval-every-epoch"]
    log("mirrored:", " ".join(cmd))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    sys.stderr.write(out)
    records = []
    for m in re.finditer(r"^  after epoch (\d+): held-out accuracy ([\d.]+)%, loss ([\d.eE+-]+), "
                         r"training loop ([\d.]+) s, wall ([\d.]+) s$", out, re.M):
        records.append({"epoch": int(m[1]), "test_accuracy": float(m[2]) / 100, "loss": float(m[3]),
                        "train_s": float(m[4]), "wall_s": float(m[5])})
    total = re.search(r"^training loop: (\d+) examples in ([\d.]+) s", out, re.M)
    if len(records) != epochs or not total:
        sys.exit("e2e_digits: could not read train_digits' output (per-epoch lines or the training loop's time)")
    version = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    return {"framework": "mirrored", "version": f"mirrored (commit {version or '?'}), release build",
            "command": " ".join(cmd), "examples": int(total[1]), "epochs": records}


def run_tf(py, setup, data, epochs):
    log(f"TF Keras ({py})")
    out = subprocess.run([str(py), str(Path(__file__).resolve()), "--tf-worker", "--setup", str(setup),
                          "--data", str(data), "--epochs", str(epochs)], check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout)



def run_torch(setup, data, epochs):
    out = run_torch_workers(__file__, ["--setup", str(setup), "--data", str(data), "--epochs", str(epochs)], REPLICAS,
                            log, "e2e_digits")
    return json.loads(out)


def summarize(run):
    """examples/s, time to the target accuracy, final accuracy of one side's per-epoch records."""
    recs = run["epochs"]
    n_epochs = len(recs)
    per_epoch = run["examples"] / n_epochs
    total = recs[-1]["train_s"]
    after_first = total - recs[0]["train_s"]
    hit = next((r for r in recs if r["test_accuracy"] >= TARGET_ACCURACY - 1e-12), None)
    return {
        "examples_per_s": run["examples"] / total,
        "examples_per_s_after_epoch_1": per_epoch * (n_epochs - 1) / after_first if n_epochs > 1 else None,
        "first_epoch_s": recs[0]["train_s"],
        "train_s": total,
        "epoch_to_target": hit["epoch"] if hit else None,
        "train_s_to_target": hit["train_s"] if hit else None,
        "wall_s_to_target": hit["wall_s"] if hit else None,
        "final_accuracy": recs[-1]["test_accuracy"],
        "epoch1_loss": recs[0]["loss"],
    }


NAMES = {"mirrored": "mirrored `train_digits`", "tf_keras": "TF Keras `model.fit`, `MirroredStrategy`",
         "torch_ddp": "PyTorch DDP (gloo, 2 processes)"}
SHORT = {"mirrored": "mirrored", "tf_keras": "TF", "torch_ddp": "PyTorch"}


def fmt_s(s):
    return "not reached" if s is None else (f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s")


def fmt_rate(x):
    return "–" if x is None else f"{x:,.0f}"


def fmt_ratio(x):
    return "–" if x is None else f"{x:.3g}×"


def markdown(result):
    lines = [
        f"<!-- e2e_digits.py, {result['date']}: {result['machine']}; load average {result['load_start']} at the start, "
        f"{result['load_end']} at the end; {result['epochs']} epochs{', quick' if result['quick'] else ''} -->",
        "| | examples/s, all epochs | examples/s, epochs 2–" + str(result["epochs"]) + " | first epoch "
        "| training loop to 97 % | wall to 97 % (with evaluations) | epoch reaching 97 % | final held-out accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, s in result["summary"].items():
        lines.append(f"| {NAMES[key]} | {fmt_rate(s['examples_per_s'])} | {fmt_rate(s['examples_per_s_after_epoch_1'])} "
                     f"| {fmt_s(s['first_epoch_s'])} | {fmt_s(s['train_s_to_target'])} | {fmt_s(s['wall_s_to_target'])} "
                     f"| {s['epoch_to_target'] or '–'} | {100 * s['final_accuracy']:.2f} % |")
    lines.append("")
    for key, r in result["ratios"].items():
        to_target = (f"97 % held-out accuracy {fmt_ratio(r['train_s_to_target'])} sooner in training-loop time, "
                     f"{fmt_ratio(r['wall_s_to_target'])} sooner in wall time" if r["train_s_to_target"]
                     else "97 % not reached by both in this run")
        lines.append(f"- mirrored against {NAMES[key]}: **{fmt_ratio(r['examples_per_s'])}** the examples/s over all "
                     f"epochs, **{fmt_ratio(r['examples_per_s_after_epoch_1'])}** after the first epoch (target "
                     f"≥ {r['target']}×: {r['verdict']}); {to_target}.")
    losses = ", ".join(f"{SHORT[k]} {s['epoch1_loss']:.6f}" for k, s in result["summary"].items())
    lines.append(f"- Same batches from the same weights: the epoch-1 mean losses are {losses} "
                 f"(largest relative difference {result['epoch1_loss_max_rel_diff']:.1e}).")
    lines.append("- Versions: " + "; ".join(r["version"] for r in result["runs"].values()) + ".")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-json", default="e2e_digits.json")
    ap.add_argument("--out-md", default="e2e_digits.md")
    ap.add_argument("--build-dir", type=Path, default=REPO / "build" / "release")
    ap.add_argument("--data", type=Path, default=REPO / "data" / "digits.csv.gz")
    ap.add_argument("--venv", type=Path, default=None, help=f"default: {default_venv()}")
    ap.add_argument("--epochs", type=int, default=None, help="default: 20 (--quick: 3)")
    ap.add_argument("--quick", action="store_true", help="3 epochs: checks the plumbing only")
    ap.add_argument("--skip-tf", action="store_true", help="no TensorFlow side")
    ap.add_argument("--skip-torch", action="store_true", help="no PyTorch side")
    add_worker_arguments(ap, "--setup")
    a = ap.parse_args()
    a.epochs = a.epochs or (3 if a.quick else 20)

    if run_as_worker(a, tf_worker, torch_worker):
        return 0

    out_json = Path(a.out_json)
    setup = out_json.with_name(out_json.stem + ".setup.json")
    py = None if a.skip_tf else ensure_venv(a.venv or default_venv(), log)
    load_start = loadavg()
    run_setup(a.build_dir / "bench_workers" / "e2e_digits_setup", setup, a.epochs, a.data)
    runs = {"mirrored": run_mirrored(a.build_dir / "train_digits", a.epochs, a.data)}
    if not a.skip_tf:
        runs["tf_keras"] = run_tf(py, setup, a.data, a.epochs)
    if not a.skip_torch:
        runs["torch_ddp"] = run_torch(setup, a.data, a.epochs)
    load_end = loadavg()

    summary = {k: summarize(r) for k, r in runs.items()}
    ours = summary["mirrored"]
    ratios = {}
    targets = {"tf_keras": 50, "torch_ddp": 15}
    for key in runs:
        if key == "mirrored":
            continue
        other = summary[key]
        div = lambda x, y: x / y if x and y else None  # noqa: E731
        r = {"examples_per_s": div(ours["examples_per_s"], other["examples_per_s"]),
             "examples_per_s_after_epoch_1": div(ours["examples_per_s_after_epoch_1"],
                                                 other["examples_per_s_after_epoch_1"]),
             "train_s_to_target": div(other["train_s_to_target"], ours["train_s_to_target"]),
             "wall_s_to_target": div(other["wall_s_to_target"], ours["wall_s_to_target"]),
             "target": targets[key]}
        met = lambda x: "met" if x and x >= r["target"] else "missed"  # noqa: E731
        r["verdict"] = (f"{met(r['examples_per_s'])} over all epochs, "
                        f"{met(r['examples_per_s_after_epoch_1'])} after the first")
        ratios[key] = r
    base = ours["epoch1_loss"]
    max_rel = max(abs(s["epoch1_loss"] - base) / base for s in summary.values())
    if max_rel > 1e-4:
        log(f"WARNING: the epoch-1 losses differ by {max_rel:.1e} (relative): the sides did not train on the same "
            "batches from the same weights")
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_start": load_start, "load_end": load_end,
        "quick": a.quick, "epochs": a.epochs, "global_batch": GLOBAL_BATCH, "learning_rate": LEARNING_RATE,
        "replicas": REPLICAS, "target_accuracy": TARGET_ACCURACY,
        "summary": summary, "ratios": ratios, "epoch1_loss_max_rel_diff": max_rel, "runs": runs,
    }
    out_json.write_text(json.dumps(result, indent=1) + "\n")
    Path(a.out_md).write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
