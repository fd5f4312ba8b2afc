"""The TensorFlow and PyTorch sides of e2e_fashion.py: TF's tutorial "Custom training with
tf.distribute.Strategy" as published, and the same model, loss and Adam in PyTorch DDP. Each runs as
a worker process of e2e_fashion.py (`--tf-worker` inside TensorFlow's virtual environment,
`--torch-worker` under Debian's /usr/bin/python3) and prints its result as JSON: every epoch's
training and test metrics, the examples/s of its training loop with the first step left out (TF
traces its step function there, PyTorch warms up), and the first epoch's loss of every step.

Both start from the weights of a safetensors file (written by the first TF run, which draws them
with Keras' Glorot uniform, seed 0; numpy only) and train the file order (no shuffle): each global
batch is the next `replicas x batch` examples, each replica its consecutive slice.
"""
import gzip
import json
import os
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_common import replica_slice  # noqa: E402

LEARNING_RATE = 0.001
L2 = 1e-5
# The tutorial's trainable variables, in Keras' order, under fashion_mnist's names.
NAMES = ["conv2d/kernel", "conv2d/bias", "conv2d_1/kernel", "conv2d_1/bias",
         "dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]
SHAPES = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (1600, 64), (64,), (64, 10), (10,)]


def log(*args):
    print("e2e_fashion:", *args, file=sys.stderr, flush=True)


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


def keras_step_size(np, t):
    """Adam's bias-corrected step size at step t as Keras computes it for float32 variables: in
    float32, from the float32 betas (their powers rounded from float64, as mirrored's
    adam_step_size). The exact value (in float64) is about 6e-6 larger over the first epoch, which
    put PyTorch's epoch-1 loss 3e-4 from TF's."""
    f = np.float32
    b1_power, b2_power = f(float(f(0.9)) ** t), f(float(f(0.999)) ** t)
    return float(f(LEARNING_RATE) * np.sqrt(f(1) - b2_power) / (f(1) - b1_power))


def epoch_record(epoch, loss, accuracy, test_loss, test_accuracy, train_s, timed_examples, timed_s):
    return {"epoch": epoch, "loss": loss, "accuracy": accuracy, "test_loss": test_loss,
            "test_accuracy": test_accuracy, "train_s": train_s,
            "examples_per_s": timed_examples / timed_s if timed_s > 0 else None}


# ---------------------------------------------------------------------------------------------
# TF: the tutorial (inside the virtual environment: `python e2e_fashion.py --tf-worker ...`)
# ---------------------------------------------------------------------------------------------

def tf_worker(a):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    replicas, batch = a.replicas, a.batch_per_replica
    if a.threads:  # before TensorFlow's runtime starts: its thread pools' sizes
        tf.config.threading.set_intra_op_parallelism_threads(a.threads)
        tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    tf.keras.utils.set_random_seed(0)  # the same initial weights in every run of the script
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()
                                                         for _ in range(replicas)])
    train_images, train_labels, test_images, test_labels = load_data(np, a.data, a.train_examples, a.test_examples)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    BATCH_SIZE_PER_REPLICA = batch
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
    assert [tuple(w.shape) for w in weights] == SHAPES, [w.shape for w in weights]
    if a.read_init:
        init = read_safetensors(np, a.read_init)
        for name, w in zip(NAMES, weights):
            w.assign(init[name])
    if a.write_init:
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

    n = len(train_labels)
    epochs, step_losses = [], []
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        total_loss = 0.0
        num_batches = 0
        losses = []  # the steps' loss tensors, read after the epoch (no extra synchronisation)
        timed_from = None
        for x in train_dist_dataset:
            loss = distributed_train_step(x)
            total_loss += loss
            losses.append(loss)
            num_batches += 1
            if num_batches == 1:
                float(loss)  # the first step (tracing included) is done
                timed_from = time.perf_counter()
        train_loss = float(total_loss / num_batches)  # waits for the last step
        t1 = time.perf_counter()
        for x in test_dist_dataset:
            distributed_test_step(x)
        first = min(GLOBAL_BATCH_SIZE, n)
        epochs.append(epoch_record(epoch + 1, train_loss, float(train_accuracy.result()), float(test_loss.result()),
                                   float(test_accuracy.result()), t1 - t0, n - first, t1 - timed_from))
        if epoch == 0:
            step_losses = [float(v) for v in losses]
        log(f"TF ({replicas} replicas x {batch}) epoch {epoch + 1}: loss {train_loss:.7f}, test accuracy "
            f"{float(test_accuracy.result()):.4f}, training loop {t1 - t0:.2f} s")
        test_loss.reset_state()
        train_accuracy.reset_state()
        test_accuracy.reset_state()
    return {"framework": "tf", "version": f"TensorFlow {tf.__version__}", "replicas": replicas,
            "batch_per_replica": batch, "threads": a.threads or "default", "examples": n, "epochs": epochs,
            "step_losses": step_losses}


# ---------------------------------------------------------------------------------------------
# PyTorch DDP (under /usr/bin/python3: `python3 e2e_fashion.py --torch-worker --rank R ...`)
# ---------------------------------------------------------------------------------------------

def torch_worker(a):
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    if a.threads:
        torch.set_num_threads(a.threads)
    rank, world, batch = a.rank, a.replicas, a.batch_per_replica
    global_batch = batch * world
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world)
    x_train, y_train, x_test, y_test = (torch.from_numpy(v) for v in
                                        load_data(np, a.data, a.train_examples, a.test_examples))
    x_train, x_test = x_train.permute(0, 3, 1, 2), x_test.permute(0, 3, 1, 2)  # NCHW for torch's convolutions
    n = len(y_train)
    steps = -(-n // global_batch)

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
    beta_1, beta_2, eps = 0.9, 0.999, 1e-7  # Keras' defaults

    epochs, step_losses, t = [], [], 0
    for epoch in range(a.epochs):
        dist.barrier()
        t0 = time.perf_counter()
        timed_from = None
        total_loss = torch.zeros((), dtype=torch.float64)
        correct = torch.zeros((), dtype=torch.float64)
        losses = []
        for s in range(steps):
            start = s * global_batch
            b = min(global_batch, n - start)
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
                t += 1
                alpha = keras_step_size(np, t)
                for p, mp, vp in zip(params, m, v):  # Keras' Adam
                    mp.add_((p.grad - mp) * (1 - beta_1))
                    vp.add_((p.grad * p.grad - vp) * (1 - beta_2))
                    p.sub_(alpha * mp / (vp.sqrt() + eps))
                step_loss = loss.detach().double()
                dist.all_reduce(step_loss)  # the step's loss: the replicas' sum, as strategy.reduce(SUM)
                total_loss += step_loss
                losses.append(float(step_loss))
                correct += (logits.argmax(1) == yb).double().sum()
            if s == 0:
                timed_from = time.perf_counter()
        dist.all_reduce(correct)
        t1 = time.perf_counter()
        with torch.no_grad():
            logits = model(x_test)
            test_loss = float(F.cross_entropy(logits, y_test, reduction="mean"))
            test_accuracy = float((logits.argmax(1) == y_test).double().mean())
        first = min(global_batch, n)
        epochs.append(epoch_record(epoch + 1, float(total_loss) / steps, float(correct) / n, test_loss, test_accuracy,
                                   t1 - t0, n - first, t1 - timed_from))
        if epoch == 0:
            step_losses = losses
        if rank == 0:
            log(f"PyTorch ({world} processes x {batch}) epoch {epoch + 1}: loss {epochs[-1]['loss']:.7f}, test "
                f"accuracy {test_accuracy:.4f}, training loop {t1 - t0:.2f} s")
    dist.destroy_process_group()
    return {"framework": "torch_ddp", "version": f"PyTorch {torch.__version__} (Debian python3-torch), gloo",
            "replicas": world, "batch_per_replica": batch, "threads": torch.get_num_threads(), "examples": n,
            "epochs": epochs, "step_losses": step_losses}
