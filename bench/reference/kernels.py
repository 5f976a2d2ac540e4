"""PyTorch's figures for the workloads of bench/gpu_kernels.cpp, timed the same way (CUDA events,
warm-up, median), printed as one JSON object per line.

Convolutions: the ResNet-18 totals, and one line per shape and direction
("conv_s{index}_{fwd|bwd_data|bwd_filter}", "_benchmark" appended with cudnn.benchmark) with "ms"
(median of per-call events), "gpu_ms" (device time alone: a spin kernel holds the stream while
the repetitions are queued) and "host_ms" (host time to issue one call), as gpu_kernels prints.

The tensors are contiguous (NCHW), so PyTorch runs the convolutions in NCHW too
(cudnn_conv_suggest_memory_format picks channels-last only for channels-last tensors), and bf16
convolutions always go through cuDNN's graph API (Conv_v8.cpp). Its execution-plan cache is keyed
without the benchmark flag, so a benchmark pass in the same process would reuse the heuristic
pass's plans: the benchmark pass runs in a fresh process.

Attention: GPT-2's causal self-attention through F.scaled_dot_product_attention, forward and
forward + backward, f32 with TF32 allowed ("_tf32"), f32 without, and bf16, as gpu_kernels does.

Usage: kernels.py [--conv-only | --attention-only] [--conv-pass both|heuristic|benchmark]"""
import argparse
import json
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def median_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[reps // 2]


def emit(name, ms, bytes_=0.0, flops=0.0, **extra):
    row = {"framework": "pytorch", "name": name, "ms": round(ms, 5)}
    if bytes_:
        row["gbps"] = round(bytes_ / ms / 1e6, 1)
    if flops:
        row["tflops"] = round(flops / ms / 1e9, 1)
    row.update(extra)
    print(json.dumps(row), flush=True)


_cycles_per_ms = None


def spin_cycles_per_ms():
    """torch.cuda._sleep's cycles per millisecond on this GPU, measured once."""
    global _cycles_per_ms
    if _cycles_per_ms is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
        _cycles_per_ms = 10_000_000 / start.elapsed_time(end)
    return _cycles_per_ms


def time_call(fn, reps=20):
    """(ms, gpu_ms, host_ms): median of per-call events; device time per call while a spin kernel
    held the stream during queuing (-1 if the spin ended before queuing did); host time per call."""
    ms = median_ms(fn, 3, reps)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host_ms = (time.perf_counter() - t0) * 1e3 / reps
    torch.cuda.synchronize()
    hold_ms = 20.0 + 3.0 * host_ms * reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(hold_ms * spin_cycles_per_ms()))
    start.record()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    queued_ms = (time.perf_counter() - t0) * 1e3
    end.record()
    torch.cuda.synchronize()
    gpu_ms = start.elapsed_time(end) / reps if queued_ms < hold_ms else -1.0
    return ms, gpu_ms, queued_ms / reps


RESNET18 = [  # (n, c, h, w, k, r, stride, pad), count in one forward pass
    ((256, 3, 32, 32, 64, 3, 1, 1), 1), ((256, 64, 32, 32, 64, 3, 1, 1), 4),
    ((256, 64, 32, 32, 128, 3, 2, 1), 1), ((256, 128, 16, 16, 128, 3, 1, 1), 3),
    ((256, 64, 32, 32, 128, 1, 2, 0), 1), ((256, 128, 16, 16, 256, 3, 2, 1), 1),
    ((256, 256, 8, 8, 256, 3, 1, 1), 3), ((256, 128, 16, 16, 256, 1, 2, 0), 1),
    ((256, 256, 8, 8, 512, 3, 2, 1), 1), ((256, 512, 4, 4, 512, 3, 1, 1), 3),
    ((256, 256, 8, 8, 512, 1, 2, 0), 1),
]


def resnet18_convs(dev, passes):
    for benchmark in passes:
        torch.backends.cudnn.benchmark = benchmark
        suffix = "_benchmark" if benchmark else ""
        total, total_flops = 0.0, 0.0
        for index, ((n_, c, h, w, k, r, stride, pad), count) in enumerate(RESNET18):
            inp = torch.randn(n_, c, h, w, device=dev, dtype=torch.bfloat16)
            wt = torch.randn(k, c, r, r, device=dev, dtype=torch.bfloat16)
            out = F.conv2d(inp, wt, stride=stride, padding=pad)
            g = torch.randn_like(out)

            def backward(mask):
                return torch.ops.aten.convolution_backward(g, inp, wt, None, [stride, stride], [pad, pad], [1, 1],
                                                           False, [0, 0], 1, mask)

            def step():
                F.conv2d(inp, wt, stride=stride, padding=pad)
                backward([True, True, False])

            total += median_ms(step) * count
            flops = 2.0 * out.numel() * c * r * r  # one direction
            total_flops += 3 * flops * count
            shape = f"{n_}x{c}x{h}x{w} k{k} r{r} s{stride} p{pad}"
            directions = [
                ("fwd", lambda: F.conv2d(inp, wt, stride=stride, padding=pad)),
                ("bwd_data", lambda: backward([True, False, False])),
                ("bwd_filter", lambda: backward([False, True, False])),
            ]
            for direction, fn in directions:
                ms, gpu_ms, host_ms = time_call(fn)
                emit(f"conv_s{index}_{direction}{suffix}", ms, flops=flops, shape=shape, count=count,
                     gpu_ms=round(gpu_ms, 5), host_ms=round(host_ms, 5))
        emit("resnet18_convs_fwd_bwd_bf16" + suffix, total, flops=total_flops)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--conv-only", action="store_true", help="only the convolutions")
    parser.add_argument("--attention-only", action="store_true", help="only the attention")
    parser.add_argument("--conv-pass", choices=["both", "heuristic", "benchmark"], default="both",
                        help="cudnn.benchmark off, on, or both (on in a fresh process)")
    args = parser.parse_args()
    dev = torch.device("cuda:0")
    if args.conv_pass != "benchmark":
        emit("versions", 0.0, torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
             device=torch.cuda.get_device_name(dev))
    if args.attention_only:
        attention(dev)
        return
    if not args.conv_only:
        other_kernels(dev)
        attention(dev)
    if args.conv_pass in ("both", "heuristic"):
        resnet18_convs(dev, [False])
    if args.conv_pass == "benchmark":
        resnet18_convs(dev, [True])
    elif args.conv_pass == "both":
        sys.stdout.flush()
        subprocess.run([sys.executable, __file__, "--conv-only", "--conv-pass", "benchmark"], check=True)


def other_kernels(dev):
    n = 1 << 28
    a = torch.randn(n, device=dev)
    b = torch.randn(n, device=dev)
    dst = torch.empty_like(a)
    nbytes = n * 4.0
    emit("copy_d2d_f32", median_ms(lambda: dst.copy_(a)), 2 * nbytes)
    emit("add_f32", median_ms(lambda: a + b), 3 * nbytes)
    a16, b16 = a.bfloat16(), b.bfloat16()
    emit("add_bf16", median_ms(lambda: a16 + b16), 1.5 * nbytes)
    emit("cast_f32_bf16", median_ms(lambda: a.to(torch.bfloat16)), 1.5 * nbytes)
    emit("gelu_bf16", median_ms(lambda: F.gelu(a16, approximate="tanh")), nbytes)
    del a16, b16, b, dst
    rows = a.view(65536, 4096)
    emit("softmax_rows4096_f32", median_ms(lambda: torch.softmax(rows, -1)), 2 * nbytes)
    rows16 = rows.bfloat16()
    emit("softmax_rows4096_bf16", median_ms(lambda: torch.softmax(rows16, -1)), nbytes)
    del rows, rows16, a

    m = 8192
    flops = 2.0 * m ** 3
    x = torch.randn(m, m, device=dev)
    y = torch.randn(m, m, device=dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    emit("matmul8192_tf32", median_ms(lambda: torch.matmul(x, y), 3, 10), flops=flops)
    torch.backends.cuda.matmul.allow_tf32 = False
    x16, y16 = x.bfloat16(), y.bfloat16()
    emit("matmul8192_bf16", median_ms(lambda: torch.matmul(x16, y16)), flops=flops)
    del x, y, x16, y16



def attention(dev):
    b, h, t, d = 8, 12, 1024, 64
    fwd_flops = 2.0 * b * h * t * t * d  # two (T x T x D) products, half of them masked
    packed = torch.randn(b, t, 3, h, d, device=dev)  # (B, T, 3, H, D)
    grad = torch.randn(b, h, t, d, device=dev)
    for name, dtype, tf32 in (("tf32", torch.float32, True), ("f32", torch.float32, False),
                              ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        x = packed.to(dtype).requires_grad_()
        g = grad.to(dtype)
        q, k, v = (x[:, :, i].permute(0, 2, 1, 3) for i in range(3))
        with torch.no_grad():
            emit(f"attention_gpt2_fwd_{name}",
                 median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), flops=fwd_flops)

        def step():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(g)
            x.grad = None
        emit(f"attention_gpt2_fwdbwd_{name}", median_ms(step), flops=3.5 * fwd_flops)
    torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    main()
