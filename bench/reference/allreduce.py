"""All-reduce bandwidth through torch.distributed (NCCL), for comparison with bench/allreduce.

Same sizes, dtype, timing rule and columns as bench/allreduce: f32 sum, message sizes from 1 MiB
to 1 GiB in powers of two, each round --calls calls back to back from an idle GPU (time per call:
the round's over its calls), the median over rounds of the slowest rank's time, algbw = bytes /
time and busbw = algbw * 2 (n - 1) / n in GB/s. Run under torchrun:

    python3 -m torch.distributed.run --standalone --nproc_per_node 4 bench/reference/allreduce.py

Each size also prints one JSON object on a line of its own.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-mb", type=float, default=1)
    parser.add_argument("--max-mb", type=float, default=1024)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20, help="calls per round, back to back")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world = dist.get_world_size()
    bus_factor = 2 * (world - 1) / world
    if rank == 0:
        print(f"# torch.distributed all_reduce (NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}): {world} ranks,"
              f" f32 sum; ms per call, median of {args.reps} rounds of {args.calls} calls back to back after"
              f" {args.warmup} warm-up rounds")
        print(f"# {'bytes':>12s}  {'torch ms':>10s} {'algbw':>10s} {'busbw':>10s}  {'host us to issue (rank 0)':>26s}")
    size = int(args.min_mb * 2**20)
    while size <= int(args.max_mb * 2**20):
        x = torch.randn(size // 4, device="cuda")  # (size / 4,) f32
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times, host_us = [], []
        for rep in range(args.warmup + args.reps):
            dist.barrier()
            torch.cuda.synchronize()
            start.record()
            issued = time.perf_counter()
            for _ in range(args.calls):
                dist.all_reduce(x)
            issued = (time.perf_counter() - issued) / args.calls
            end.record()
            end.synchronize()
            if rep >= args.warmup:
                times.append(start.elapsed_time(end) / args.calls)
                host_us.append(issued * 1e6)
        # The slowest rank's time of each round, then the median over rounds.
        local = torch.tensor(times, device="cuda")
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
        ms = statistics.median(local.tolist())
        algbw = size / (ms * 1e-3) / 1e9
        if rank == 0:
            host = statistics.median(host_us)
            print(f"  {size:12d}  {ms:10.4f} {algbw:10.2f} {algbw * bus_factor:10.2f}  {host:26.1f}")
            print(json.dumps({"backend": "torch-nccl", "ranks": world, "bytes": size, "torch_ms": ms,
                              "torch_algbw_gbs": algbw, "torch_busbw_gbs": algbw * bus_factor,
                              "torch_host_us": host}))
        size *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
