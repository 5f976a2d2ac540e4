#!/usr/bin/env python3
"""PyTorch's figures for bench/host_overhead.cpp: host time per op on tiny bf16 tensors, the same
ops timed the same way (synchronise, issue --calls calls back to back timed on the host,
synchronise; microseconds per call, median over --rounds rounds). Needs only torch.

    python3 bench/reference/host_overhead.py [--device cuda] [--calls 100] [--rounds 30]
"""
import argparse
import json
import statistics
import time

import torch


def host_us_per_call(op, device, calls, rounds):
    for _ in range(10):  # warm-up
        op()
    per_call = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            op()
        per_call.append((time.perf_counter() - start) * 1e6 / calls)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return statistics.median_high(per_call)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    opts = dict(device=device, dtype=torch.bfloat16)
    a, b = torch.randn(64, 64, **opts), torch.randn(64, 64, **opts)
    ln_weight, ln_bias = torch.randn(64, **opts), torch.randn(64, **opts)
    weight = torch.randn(64, 64, **opts, requires_grad=True)
    bias = torch.randn(64, **opts, requires_grad=True)
    x = torch.randn(64, 64, **opts)
    params = [torch.randn(64, 64, **opts, requires_grad=True) for _ in range(10)]
    for p in params:
        p.grad = torch.randn(64, 64, **opts)
    adamw = torch.optim.AdamW(params, fused=device.type == "cuda")
    sink = [None]

    def linear_forward_backward():
        weight.grad = None
        bias.grad = None
        torch.nn.functional.linear(x, weight, bias).sum().backward()

    def keep(fn):
        def run():
            sink[0] = fn()
        return run

    ops = [
        ("add", keep(lambda: a + b)),
        ("mul_scalar", keep(lambda: a * 0.5)),
        ("gelu", keep(lambda: torch.nn.functional.gelu(a, approximate="tanh"))),
        ("matmul", keep(lambda: a @ b)),
        ("layer_norm", keep(lambda: torch.nn.functional.layer_norm(a, (64,), ln_weight, ln_bias, 1e-5))),
        ("sum", keep(lambda: a.sum())),
        ("linear_forward_backward", linear_forward_backward),
        ("adamw_step_10_tensors", adamw.step),
    ]
    print(f"# PyTorch {torch.__version__} host time per op, {device}, bf16 (64, 64) operands; "
          f"median of {args.rounds} rounds of {args.calls} calls")
    print(f"# {'op':<26} {'host us':>10}")
    results = []
    for name, op in ops:
        us = host_us_per_call(op, device, args.calls, args.rounds)
        results.append((name, us))
        print(f"  {name:<26} {us:10.2f}")
    for name, us in results:
        print(json.dumps({"bench": "host_overhead", "framework": "pytorch", "device": str(device), "op": name,
                          "host_us": round(us, 3)}))


if __name__ == "__main__":
    main()
