"""PyTorch's Gloo all-reduce, timed like bench_multi_worker (bench/bench_multi_worker.sh).

    python3 bench/torch_gloo_allreduce.py RANK WORLD PORT SIZES_MIB ITERS

Rank 0 prints one line per size:  torch-gloo <MiB> MiB <iters> iters: <ms> ms per all-reduce
"""
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sizes = [int(s) for s in sys.argv[4].split(",")]
    iters = [int(s) for s in sys.argv[5].split(",")]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for k, mib in enumerate(sizes):
        count = iters[min(k, len(iters) - 1)]
        x = torch.ones(mib << 18, dtype=torch.float32)
        for _ in range(3):
            dist.all_reduce(x)
        x.fill_(1.0)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(count):
            dist.all_reduce(x)
        ms = (time.perf_counter() - start) * 1000.0
        if rank == 0:
            print(f"torch-gloo {mib} MiB {count} iters: {ms / count:.3f} ms per all-reduce", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
