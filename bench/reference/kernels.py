"""PyTorch's figures for the workloads of bench/gpu_kernels.cpp, timed the same way (CUDA events,
warm-up, median), printed as one JSON object per line."""
import json

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


def emit(name, ms, bytes_=0.0, flops=0.0):
    row = {"framework": "pytorch", "name": name, "ms": round(ms, 5)}
    if bytes_:
        row["gbps"] = round(bytes_ / ms / 1e6, 1)
    if flops:
        row["tflops"] = round(flops / ms / 1e9, 1)
    print(json.dumps(row), flush=True)


RESNET18 = [  # (n, c, h, w, k, r, stride, pad), count in one forward pass
    ((256, 3, 32, 32, 64, 3, 1, 1), 1), ((256, 64, 32, 32, 64, 3, 1, 1), 4),
    ((256, 64, 32, 32, 128, 3, 2, 1), 1), ((256, 128, 16, 16, 128, 3, 1, 1), 3),
    ((256, 64, 32, 32, 128, 1, 2, 0), 1), ((256, 128, 16, 16, 256, 3, 2, 1), 1),
    ((256, 256, 8, 8, 256, 3, 1, 1), 3), ((256, 128, 16, 16, 256, 1, 2, 0), 1),
    ((256, 256, 8, 8, 512, 3, 2, 1), 1), ((256, 512, 4, 4, 512, 3, 1, 1), 3),
    ((256, 256, 8, 8, 512, 1, 2, 0), 1),
]


def main():
    dev = torch.device("cuda:0")
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

    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        total, total_flops = 0.0, 0.0
        for (n_, c, h, w, k, r, stride, pad), count in RESNET18:
            inp = torch.randn(n_, c, h, w, device=dev, dtype=torch.bfloat16)
            wt = torch.randn(k, c, r, r, device=dev, dtype=torch.bfloat16)
            out = F.conv2d(inp, wt, stride=stride, padding=pad)
            g = torch.randn_like(out)

            def step():
                F.conv2d(inp, wt, stride=stride, padding=pad)
                torch.ops.aten.convolution_backward(g, inp, wt, None, [stride, stride], [pad, pad], [1, 1], False,
                                                    [0, 0], 1, [True, True, False])

            total += median_ms(step) * count
            total_flops += 3 * 2.0 * out.numel() * c * r * r * count
        emit("resnet18_convs_fwd_bwd_bf16" + ("_benchmark" if benchmark else ""), total, flops=total_flops)


if __name__ == "__main__":
    main()
