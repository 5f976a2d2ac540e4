#!/usr/bin/env python3
"""PyTorch's figures for bench/train_step.cpp: the time of one full training step (zero_grad,
forward, loss, backward, AdamW step) of the same workload, timed the same way (CUDA events on the
current stream after warm-up; wall time on the CPU), with the same flags and JSON keys. Prints each
step's loss, a one-line summary on stderr and the JSON as stdout's last line. Needs only torch.

    python3 bench/reference/train_step.py --precision bf16 [--compile]
    torchrun --nproc_per_node 2 bench/reference/train_step.py --precision bf16 --bucket-mb 25

Under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel over NCCL, one GPU
per rank, the batch per GPU fixed, like tandem's train_step under mpirun.

Precision here is PyTorch's usual recipe, which tandem's runs are compared against: f32 and tf32
keep everything in f32 (TF32 matmuls off / on); bf16 and fp16 keep f32 parameters and run the
forward under torch.autocast, fp16 with a GradScaler.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_mlp(args, device):
    """MLP 1024 -> 4096 -> 4096 -> 4096 -> 4096 -> 1024 (58.7M parameters), GELU (tanh) between
    the linear layers, mean squared error against a random target drawn once."""
    widths = [1024, 4096, 4096, 4096, 4096, 1024]
    layers = []
    for i in range(len(widths) - 1):
        if i > 0:
            layers.append(nn.GELU(approximate="tanh"))
        layers.append(nn.Linear(widths[i], widths[i + 1]))
    model = nn.Sequential(*layers).to(device)
    torch.manual_seed(1 + args.rank)  # each rank its own batch
    x = torch.randn(args.batch, widths[0], device=device)  # (B, 1024) inputs
    target = torch.randn(args.batch, widths[-1], device=device)  # (B, 1024) targets

    def loss_fn(m):
        # The loss in f32, as autocast would take it anyway (and as tandem does).
        return F.mse_loss(m(x).float(), target)

    return model, loss_fn


# Further workloads (gpt2, resnet18) go here: one factory each, returning (model, loss_fn).
WORKLOADS = {"mlp": make_mlp}


def make_adamw(params, lr):
    try:
        return torch.optim.AdamW(params, lr=lr, fused=True)
    except (RuntimeError, TypeError) as e:  # older torch: no fused AdamW on the CPU
        print(f"train_step.py: fused AdamW unavailable ({e}); using the default implementation", file=sys.stderr)
        return torch.optim.AdamW(params, lr=lr)


def make_grad_scaler(device):
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device.type)
    return torch.cuda.amp.GradScaler()  # torch before 2.3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    parser.add_argument("--precision", default="f32", choices=["f32", "tf32", "bf16", "fp16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--batch", type=int, default=1024, help="samples per step (per GPU)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=50, help="timed steps")
    parser.add_argument("--json", help="also write the result JSON to this file")
    parser.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (under torchrun)")
    args = parser.parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank = int(os.environ.get("RANK", "0"))
    if world_size > 1:
        import torch.distributed as dist
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
    if args.batch <= 0 or args.steps <= 0 or args.warmup < 0:
        parser.error("--batch and --steps must be positive, --warmup non-negative")

    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    on_gpu = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    autocast_dtype = AUTOCAST_DTYPES.get(args.precision)

    torch.manual_seed(0)
    model, loss_fn = WORKLOADS[args.workload](args, device)
    params = sum(p.numel() for p in model.parameters())
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[device.index], bucket_cap_mb=args.bucket_mb)
    optimizer = make_adamw(model.parameters(), lr=1e-4)  # torch's defaults otherwise
    scaler = make_grad_scaler(device) if args.precision == "fp16" else None
    run_model = torch.compile(model) if args.compile else model

    def autocast():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=autocast_dtype)

    def step():
        """One step; returns the loss, detached and still on the device, so no step waits for the host."""
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(run_model)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss.detach()

    losses = [step() for _ in range(args.warmup)]  # () each, one per step, warm-up included
    if on_gpu:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)

    step_ms = []
    if on_gpu:
        # Timed step i runs between marks[i] and marks[i + 1], on the current stream.
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
        marks[0].record()
        for i in range(args.steps):
            losses.append(step())
            marks[i + 1].record()
        marks[-1].synchronize()
        step_ms = [marks[i].elapsed_time(marks[i + 1]) for i in range(args.steps)]
    else:
        for _ in range(args.steps):
            start = time.perf_counter()
            losses.append(step())
            step_ms.append((time.perf_counter() - start) * 1e3)

    loss_values = torch.stack(losses).double().tolist()  # (warmup + steps,)
    if world_size > 1:
        dist.destroy_process_group()
        if args.rank != 0:
            return
    for i, value in enumerate(loss_values):
        timed = i - args.warmup
        suffix = "(warm-up)" if timed < 0 else f"{step_ms[timed]:.3f} ms"
        print(f"step {i:3d}  loss {value:.6f}  {suffix}")

    med, low = statistics.median(step_ms), min(step_ms)
    peak = torch.cuda.max_memory_allocated(device) if on_gpu else None
    result = {
        "framework": "pytorch-compile" if args.compile else "pytorch",
        "workload": args.workload,
        "precision": args.precision,
        "device": str(device),
        "batch": args.batch,
        "params": params,
        "step_ms_median": med,
        "step_ms_min": low,
        "samples_per_s": args.batch / (med / 1e3),
        "peak_memory_bytes": peak,
        "loss_first": loss_values[0],  # before any update
        "loss_last": loss_values[-1],
        "ddp": {"world_size": world_size, "bucket_mb": args.bucket_mb} if world_size > 1 else None,
    }

    summary = (f"train_step.py: {result['framework']} {args.workload} {args.precision} on {device}, batch {args.batch}, "
               f"{params / 1e6:.1f}M params: {med:.3f} ms/step median (min {low:.3f}), {result['samples_per_s']:.0f} samples/s")
    if peak is not None:
        summary += f", peak {peak / 2**30:.2f} GiB"
    print(f"{summary}, loss {loss_values[0]:.6f} -> {loss_values[-1]:.6f}", file=sys.stderr, flush=True)

    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
