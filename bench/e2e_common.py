"""What the end-to-end comparisons share (e2e_digits.py, e2e_fashion.py): the replicas' slices of
a global batch, the PyTorch DDP workers' launch, the load average. Python 3 standard library only."""
import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3-torch (scripts/install-deps.sh --ddp)


def replica_slice(b, rank, world):
    """Rows [lo, hi) of a global batch of b that replica `rank` gets: consecutive slices, the first
    b % world replicas one more (TF's rule, and mirrored's)."""
    base, extra = divmod(b, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch_workers(script, args, world, log, name):
    """Runs `script --torch-worker --rank R --port P ARGS` under TORCH_PYTHON for R in 0..world-1
    (gloo on 127.0.0.1:P) and returns rank 0's stdout. Exits with a message when that python has no
    PyTorch with gloo, or a rank fails."""
    check = subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                           capture_output=True)
    if check.returncode != 0:
        sys.exit(f"{name}: {TORCH_PYTHON} has no PyTorch with gloo; install Debian's python3-torch "
                 "(scripts/install-deps.sh --ddp), or pass --skip-torch")
    port = free_port()
    log(f"PyTorch DDP ({TORCH_PYTHON}, gloo on 127.0.0.1:{port}, {world} processes)")
    cmd = lambda r: [TORCH_PYTHON, str(Path(script).resolve()), "--torch-worker", "--rank", str(r),  # noqa: E731
                     "--port", str(port), *args]
    others = [subprocess.Popen(cmd(r), stdout=subprocess.DEVNULL) for r in range(1, world)]
    try:
        return subprocess.run(cmd(0), check=True, stdout=subprocess.PIPE, text=True).stdout
    finally:
        for p in others:
            if p.wait(timeout=600) != 0:
                sys.exit(f"{name}: PyTorch worker {p.args[4]} failed")


def add_worker_arguments(ap, *extra):
    """The hidden flags a script's worker processes are started with: --tf-worker, --torch-worker,
    --rank, --port, and `extra` (each a string-valued flag)."""
    ap.add_argument("--tf-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    for flag in extra:
        ap.add_argument(flag, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)


def run_as_worker(a, tf_worker, torch_worker):
    """When this process is a worker (--tf-worker or --torch-worker): runs it, prints its result as
    JSON (PyTorch: rank 0 only) and returns True; otherwise False."""
    if a.tf_worker:
        json.dump(tf_worker(a), sys.stdout)
        return True
    if a.torch_worker:
        result = torch_worker(a)
        if a.rank == 0:
            json.dump(result, sys.stdout)
        return True
    return False
