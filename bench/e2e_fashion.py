#!/usr/bin/env python3
"""TF's tutorial "Custom training with tf.distribute.Strategy" on Fashion-MNIST, three ways, and
fashion_mnist's scaling from one CPU replica to two.

  TF          the tutorial's custom training loop as published (its model, compute_loss with
              compute_average_loss and scale_regularization_loss, Adam 0.001, 64 examples per
              replica, train_step / distributed_train_step / test_step), MirroredStrategy on 2
              logical CPU devices (tensorflow-cpu from PyPI, in the virtual environment of tf_venv.py)
  PyTorch DDP the same model and loss, DistributedDataParallel, gloo, 2 processes on 127.0.0.1,
              torch.set_num_threads(1) (Debian's python3-torch under /usr/bin/python3); Adam written
              out with Keras' formula (Keras puts epsilon outside the bias correction, torch inside)
  mirrored    build/release/fashion_mnist --devices CPU:0,CPU:1 (C++, this library)

All three train the same batches from the same weights: TF's tutorial draws the initial weights
(Keras' Glorot uniform) and writes them as a safetensors file (numpy only), which the other two
read (fashion_mnist --initial-weights); the training set is not shuffled (--no-shuffle: each global
batch of 128 is the next 128 examples in file order, each replica its consecutive half). The
epoch-1 mean losses (the tutorial's `total_loss / num_batches`, regularisation included) should
agree to about 1e-4 relative: only the order of float32 sums differs. Reported with each side's
epoch-1 training and test metrics and examples/s (the epoch's training loop; TF's includes tracing).

Scaling: fashion_mnist at 1 and 2 CPU replicas (64 examples per replica, so the global batch grows
with the replicas, as in the tutorial), examples/s X(1), X(2) over one epoch of --scaling-examples,
and the efficiency E(2) = X(2) / (2 X(1)).

    cmake --preset release && cmake --build --preset release --target fashion_mnist
    python3 bench/e2e_fashion.py --out-json e2e_fashion.json --out-md e2e_fashion.md

--quick: 6,400 training and 1,000 test examples (checks the plumbing; the numbers mean little).
Python 3 standard library only in the driver (TensorFlow inside its virtual environment; PyPI's
numpy there and Debian's under /usr/bin/python3).
"""
import argparse
import gzip
import json
import os
import platform
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_common import add_worker_arguments, loadavg, replica_slice, run_as_worker, run_torch_workers  # noqa: E402
from tf_venv import TF_PACKAGE, default_venv, ensure_venv  # noqa: E402

BATCH_PER_REPLICA = 64
REPLICAS = 2
GLOBAL_BATCH = BATCH_PER_REPLICA * REPLICAS
LEARNING_RATE = 0.001
L2 = 1e-5
DEFAULT_DATA = Path("/usr/share/datasets/fashion-mnist")
# The tutorial's trainable variables, in Keras' order, under fashion_mnist's names.
NAMES = ["conv2d/kernel", "conv2d/bias", "conv2d_1/kernel", "conv2d_1/bias",
         "dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]


def log(*args):
    print("e2e_fashion:", *args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Shared by the workers (numpy is imported by the caller: both the TF venv and Debian have it)
# ---------------------------------------------------------------------------------------------

def read_idx(np, path):
    """An IDX file (gzip or plain) as a uint8 array."""
    raw = gzip.open(path).read() if str(path).endswith(".gz") else Path(path).read_bytes()
    if raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * raw[3], raw[4:4 + 4 * raw[3]])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).reshape(dims)


def idx_path(data, name):
    gz = Path(data) / (name + ".gz")
    return gz if gz.exists() else Path(data) / name


def load_data(np, data, train_n, test_n):
    """The tutorial's arrays: images[..., None] / np.float32(255), labels as int64."""
    def split(images, labels, n):
        x = read_idx(np, idx_path(data, images))[:n]
        y = read_idx(np, idx_path(data, labels))[:n]
        return (x[..., None] / np.float32(255)).astype(np.float32), y.astype(np.int64)
    x_train, y_train = split("train-images-idx3-ubyte", "train-labels-idx1-ubyte", train_n)
    x_test, y_test = split("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", test_n)
    return x_train, y_train, x_test, y_test


def write_safetensors(path, arrays):
    """float32 arrays in the safetensors format (a JSON header, then the raw little-endian data)."""
    header, blobs, offset = {}, [], 0
    for name, a in arrays.items():
        data = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(np, path):
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        lo, hi = h["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype="<f4").reshape(h["shape"]).copy()
    return out



# ---------------------------------------------------------------------------------------------
# TF: the tutorial (runs inside the virtual environment: `python e2e_fashion.py --tf-worker ...`)
# ---------------------------------------------------------------------------------------------

def tf_worker(a):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)  # the same initial weights in every run of the script
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()
                                                         for _ in range(REPLICAS)])
    train_images, train_labels, test_images, test_labels = load_data(np, a.data, a.train_examples, a.test_examples)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    BATCH_SIZE_PER_REPLICA = BATCH_PER_REPLICA
    GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
    # The tutorial shuffles (shuffle(BUFFER_SIZE)); here the file order, which the others repeat.
    train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).batch(GLOBAL_BATCH_SIZE)
    test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

    def create_model():
        regularizer = tf.keras.regularizers.L2(L2)
        return tf.keras.Sequential([
            tf.keras.layers.Conv2D(32, 3, activation='relu', kernel_regularizer=regularizer),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation='relu', kernel_regularizer=regularizer),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation='relu', kernel_regularizer=regularizer),
            tf.keras.layers.Dense(10, kernel_regularizer=regularizer)
        ])

    with strategy.scope():
        # The tutorial's Reduction.NONE; Keras 3 (TF 2.16 on) spells it None.
        none = tf.keras.losses.Reduction.NONE if hasattr(tf.keras.losses, "Reduction") else None
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=none)

        def compute_loss(labels, predictions, model_losses):
            per_example_loss = loss_object(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss)
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            return loss

        test_loss = tf.keras.metrics.Mean(name='test_loss')
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name='train_accuracy')
        test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name='test_accuracy')
        model = create_model()
        model.build((None, 28, 28, 1))
        optimizer = tf.keras.optimizers.Adam(learning_rate=LEARNING_RATE)
        # Not in the tutorial: Keras 3 would make Adam's slots inside the first traced step, which
        # fails under MirroredStrategy ("You must feed a value for placeholder tensor").
        optimizer.build(model.trainable_variables)
    weights = model.trainable_variables
    assert [tuple(w.shape) for w in weights] == [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (1600, 64), (64,),
                                                 (64, 10), (10,)], [w.shape for w in weights]
    write_safetensors(a.write_init, {name: w.numpy() for name, w in zip(NAMES, weights)})

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions, model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_accuracy.update_state(labels, predictions)
        return loss

    def test_step(inputs):
        images, labels = inputs
        predictions = model(images, training=False)
        t_loss = loss_object(labels, predictions)
        test_loss.update_state(t_loss)
        test_accuracy.update_state(labels, predictions)

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    @tf.function
    def distributed_test_step(dataset_inputs):
        return strategy.run(test_step, args=(dataset_inputs,))

    t0 = time.perf_counter()
    total_loss = 0.0
    num_batches = 0
    for x in train_dist_dataset:
        total_loss += distributed_train_step(x)
        num_batches += 1
    train_loss = float(total_loss / num_batches)  # waits for the last step
    train_s = time.perf_counter() - t0
    for x in test_dist_dataset:
        distributed_test_step(x)
    epoch = {"epoch": 1, "loss": train_loss, "accuracy": float(train_accuracy.result()),
             "test_loss": float(test_loss.result()), "test_accuracy": float(test_accuracy.result()),
             "train_s": train_s}
    log(f"TF epoch 1: loss {train_loss:.7f}, training loop {train_s:.2f} s")
    return {"framework": "tf", "version": f"TensorFlow {tf.__version__}", "package": TF_PACKAGE,
            "examples": len(train_labels), "epochs": [epoch]}


# ---------------------------------------------------------------------------------------------
# PyTorch DDP (runs under /usr/bin/python3: `python3 e2e_fashion.py --torch-worker --rank R ...`)
# ---------------------------------------------------------------------------------------------

def torch_worker(a):
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rank, world = a.rank, REPLICAS
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world)
    x_train, y_train, x_test, y_test = (torch.from_numpy(v) for v in
                                        load_data(np, a.data, a.train_examples, a.test_examples))
    x_train, x_test = x_train.permute(0, 3, 1, 2), x_test.permute(0, 3, 1, 2)  # NCHW for torch's convolutions
    n = len(y_train)
    steps = -(-n // GLOBAL_BATCH)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = torch.nn.Conv2d(1, 32, 3), torch.nn.Conv2d(32, 64, 3)
            self.dense1, self.dense2 = torch.nn.Linear(1600, 64), torch.nn.Linear(64, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = x.permute(0, 2, 3, 1).flatten(1)  # Keras flattens NHWC
            return self.dense2(F.relu(self.dense1(x)))

    model = Model()
    init = read_safetensors(np, a.read_init)
    with torch.no_grad():  # TF's kernels (kh, kw, in, out) and (in, out); torch's (out, in, kh, kw) and (out, in)
        for layer, name in [(model.conv1, "conv2d"), (model.conv2, "conv2d_1")]:
            layer.weight.copy_(torch.from_numpy(init[name + "/kernel"].transpose(3, 2, 0, 1).copy()))
            layer.bias.copy_(torch.from_numpy(init[name + "/bias"]))
        for layer, name in [(model.dense1, "dense"), (model.dense2, "dense_1")]:
            layer.weight.copy_(torch.from_numpy(init[name + "/kernel"].T.copy()))
            layer.bias.copy_(torch.from_numpy(init[name + "/bias"]))
    ddp = DistributedDataParallel(model)
    kernels = [model.conv1.weight, model.conv2.weight, model.dense1.weight, model.dense2.weight]
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    beta_1, beta_2, eps = 0.9, 0.999, 1e-7

    dist.barrier()
    t0 = time.perf_counter()
    total_loss = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.float64)
    for s in range(steps):
        start = s * GLOBAL_BATCH
        b = min(GLOBAL_BATCH, n - start)
        lo, hi = replica_slice(b, rank, world)
        xb, yb = x_train[start + lo:start + hi], y_train[start + lo:start + hi]
        for p in params:
            p.grad = None
        logits = ddp(xb)
        # The tutorial's compute_loss on this replica: the summed cross-entropy / the global batch
        # plus the L2 terms / the replicas. DDP averages the replicas' gradients: scaled by the
        # replicas, the average is their sum, as MirroredStrategy's SUM.
        loss = F.cross_entropy(logits, yb, reduction="sum") / b + sum(L2 * (k * k).sum() for k in kernels) / world
        (loss * world).backward()
        with torch.no_grad():
            t = s + 1
            alpha = LEARNING_RATE * (1 - beta_2 ** t) ** 0.5 / (1 - beta_1 ** t)
            for p, mp, vp in zip(params, m, v):  # Keras' Adam
                mp.add_((p.grad - mp) * (1 - beta_1))
                vp.add_((p.grad * p.grad - vp) * (1 - beta_2))
                p.sub_(alpha * mp / (vp.sqrt() + eps))
            step_loss = loss.detach().double()
            dist.all_reduce(step_loss)  # the step's loss: the replicas' sum, as strategy.reduce(SUM)
            total_loss += step_loss
            correct += (logits.argmax(1) == yb).double().sum()
    dist.all_reduce(correct)
    train_s = time.perf_counter() - t0
    with torch.no_grad():
        logits = model(x_test)
        test_loss = float(F.cross_entropy(logits, y_test, reduction="mean"))
        test_accuracy = float((logits.argmax(1) == y_test).double().mean())
    dist.destroy_process_group()
    epoch = {"epoch": 1, "loss": float(total_loss) / steps, "accuracy": float(correct) / n, "test_loss": test_loss,
             "test_accuracy": test_accuracy, "train_s": train_s}
    if rank == 0:
        log(f"PyTorch epoch 1: loss {epoch['loss']:.7f}, training loop {train_s:.2f} s")
    return {"framework": "torch_ddp", "version": f"PyTorch {torch.__version__} (Debian python3-torch), gloo",
            "threads_per_process": torch.get_num_threads(), "examples": n, "epochs": [epoch]}


# ---------------------------------------------------------------------------------------------
# The driver (any python3)
# ---------------------------------------------------------------------------------------------

EPOCH_LINE = re.compile(r"^Epoch (\d+), Loss: ([\d.eE+-]+), Accuracy: ([\d.eE+-]+), Test Loss: ([\d.eE+-]+), "
                        r"Test Accuracy: ([\d.eE+-]+)$", re.M)
LOOP_LINE = re.compile(r"^training loop: (\d+) examples in ([\d.]+) s", re.M)


def run_mirrored(binary, devices, train_n, test_n, data, extra=()):
    if not Path(binary).exists():
        sys.exit(f"e2e_fashion: {binary} not found; build it: cmake --build --preset release --target fashion_mnist")
    cmd = [str(binary), "--devices", devices, "--epochs", "1", "--train-examples", str(train_n), "--test-examples",
           str(test_n), "--data", str(data), *extra]
    log("mirrored:", " ".join(cmd))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    sys.stderr.write(out)
    e, loop = EPOCH_LINE.search(out), LOOP_LINE.search(out)
    if not e or not loop:
        sys.exit("e2e_fashion: could not read fashion_mnist's output (its epoch line or the training loop's time)")
    version = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    epoch = {"epoch": 1, "loss": float(e[2]), "accuracy": float(e[3]) / 100, "test_loss": float(e[4]),
             "test_accuracy": float(e[5]) / 100, "train_s": float(loop[2])}
    return {"framework": "mirrored", "version": f"mirrored (commit {version or '?'}), release build",
            "command": " ".join(cmd), "examples": int(loop[1]), "epochs": [epoch]}


def worker_args(a):
    return ["--data", str(a.data), "--train-examples", str(a.train_examples), "--test-examples", str(a.test_examples)]


def run_tf(py, a, init):
    log(f"TF ({py})")
    out = subprocess.run([str(py), str(Path(__file__).resolve()), "--tf-worker", "--write-init", str(init),
                          *worker_args(a)], check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout)



def run_torch(a, init):
    return json.loads(run_torch_workers(__file__, ["--read-init", str(init), *worker_args(a)], REPLICAS, log,
                                        "e2e_fashion"))


NAMES_MD = {"tf": "TF tutorial (`MirroredStrategy`, 2 logical CPUs)", "torch_ddp": "PyTorch DDP (gloo, 2 processes)",
            "mirrored": "mirrored `fashion_mnist` (2 CPU replicas)"}


def markdown(r):
    lines = [f"<!-- e2e_fashion.py, {r['date']}: {r['machine']}; load average {r['load_start']} at the start, "
             f"{r['load_end']} at the end; {r['train_examples']} training and {r['test_examples']} test examples, "
             f"one epoch{', quick' if r['quick'] else ''} -->"]
    if r["runs"]:
        lines += ["| | epoch-1 loss | relative to TF | accuracy | test loss | test accuracy | examples/s |",
                  "|---|---|---|---|---|---|---|"]
        tf_loss = r["runs"].get("tf", {}).get("epochs", [{}])[0].get("loss")
        for key, run in r["runs"].items():
            e = run["epochs"][0]
            rel = "–" if tf_loss is None or key == "tf" else f"{(e['loss'] - tf_loss) / tf_loss:+.1e}"
            lines.append(f"| {NAMES_MD[key]} | {e['loss']:.7f} | {rel} | {100 * e['accuracy']:.2f} % "
                         f"| {e['test_loss']:.4f} | {100 * e['test_accuracy']:.2f} % "
                         f"| {run['examples'] / e['train_s']:,.0f} |")
        lines.append("")
        if r.get("epoch1_loss_max_rel_diff") is not None:
            lines.append(f"- Same batches (file order, no shuffle) from the same weights (TF's Glorot draw, read by the "
                         f"others): the epoch-1 mean losses differ from TF's by at most "
                         f"{r['epoch1_loss_max_rel_diff']:.1e} relative (target 1e-4: {r['loss_verdict']}).")
        lines.append("- Versions: " + "; ".join(run["version"] for run in r["runs"].values()) + ".")
    if r.get("scaling"):
        s = r["scaling"]
        lines += ["", "| fashion_mnist replicas | global batch | examples/s | efficiency E(N) = X(N) / (N X(1)) |",
                  "|---|---|---|---|",
                  f"| 1 | {BATCH_PER_REPLICA} | {s['x1']:,.0f} | 1 |",
                  f"| 2 | {2 * BATCH_PER_REPLICA} | {s['x2']:,.0f} | {s['e2']:.2f} |", "",
                  f"- One epoch of {s['examples']} examples each, the training loop's time (the test excluded), "
                  f"on {s['cpus']} CPUs."]
    return "\n".join(lines) + "\n"



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-json", default="e2e_fashion.json")
    ap.add_argument("--out-md", default="e2e_fashion.md")
    ap.add_argument("--build-dir", type=Path, default=REPO / "build" / "release")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--venv", type=Path, default=None, help=f"default: {default_venv()}")
    ap.add_argument("--train-examples", type=int, default=None, help="default: 60000 (--quick: 6400)")
    ap.add_argument("--test-examples", type=int, default=None, help="default: 10000 (--quick: 1000)")
    ap.add_argument("--scaling-examples", type=int, default=None,
                    help="training examples of the scaling runs (default: 19200; --quick: 6400)")
    ap.add_argument("--quick", action="store_true", help="fewer examples: checks the plumbing only")
    ap.add_argument("--skip-tf", action="store_true", help="no TensorFlow side (the others draw no weights then: "
                                                           "fashion_mnist's --seed 0 weights are used)")
    ap.add_argument("--skip-torch", action="store_true", help="no PyTorch side")
    ap.add_argument("--skip-comparison", action="store_true", help="the scaling runs only")
    ap.add_argument("--skip-scaling", action="store_true", help="no scaling runs")
    add_worker_arguments(ap, "--write-init", "--read-init")
    a = ap.parse_args()
    a.train_examples = a.train_examples or (6400 if a.quick else 60000)
    a.test_examples = a.test_examples or (1000 if a.quick else 10000)
    a.scaling_examples = a.scaling_examples or (6400 if a.quick else 19200)

    if run_as_worker(a, tf_worker, torch_worker):
        return 0

    binary = a.build_dir / "fashion_mnist"
    out_json = Path(a.out_json)
    init = out_json.with_name(out_json.stem + ".init.safetensors")
    load_start = loadavg()
    runs = {}
    if not a.skip_comparison:
        if not a.skip_tf:
            runs["tf"] = run_tf(ensure_venv(a.venv or default_venv(), log), a, init)
        elif not a.skip_torch:
            sys.exit("e2e_fashion: --skip-tf leaves nobody to draw the initial weights for PyTorch; "
                     "pass --skip-torch too (mirrored alone), or keep TF")
        if not a.skip_torch:
            runs["torch_ddp"] = run_torch(a, init)
        extra = ["--no-shuffle"] + (["--initial-weights", str(init)] if not a.skip_tf else [])
        runs["mirrored"] = run_mirrored(binary, "CPU:0,CPU:1", a.train_examples, a.test_examples, a.data, extra)
    scaling = None
    if not a.skip_scaling:
        x = {}
        for devices in ["CPU:0", "CPU:0,CPU:1"]:
            run = run_mirrored(binary, devices, a.scaling_examples, 1000, a.data)
            x[devices.count(",") + 1] = run["examples"] / run["epochs"][0]["train_s"]
        scaling = {"examples": a.scaling_examples, "x1": x[1], "x2": x[2], "e2": x[2] / (2 * x[1]),
                   "cpus": os.cpu_count()}
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "load_start": load_start, "load_end": loadavg(), "quick": a.quick,
              "train_examples": a.train_examples, "test_examples": a.test_examples, "runs": runs, "scaling": scaling}
    if "tf" in runs and len(runs) > 1:
        tf_loss = runs["tf"]["epochs"][0]["loss"]
        result["epoch1_loss_max_rel_diff"] = max(abs(r["epochs"][0]["loss"] - tf_loss) / tf_loss
                                                 for k, r in runs.items() if k != "tf")
        result["loss_verdict"] = "met" if result["epoch1_loss_max_rel_diff"] <= 1e-4 else "**missed**"
    Path(a.out_json).write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    Path(a.out_md).write_text(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
