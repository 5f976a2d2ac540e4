#!/usr/bin/env python3
"""Checks that safetensors files move between tandem and Python's `safetensors` package.

  safetensors_interop.py BINARY DIR

1. BINARY write DIR/from_tandem.safetensors; this script loads it with safetensors and checks
   every name, dtype, shape and value against the formula both sides share.
2. This script writes DIR/from_python.safetensors with safetensors; BINARY read checks it.

Uses safetensors.torch when torch is installed (every dtype), else safetensors.numpy (bf16 has
no numpy dtype: those tensors are then left out on both sides, and said so). Exits 77 (skipped)
when safetensors is missing.
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import safetensors
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)
try:
    import torch
    from safetensors.torch import save_file
except ImportError:
    torch = None
    from safetensors.numpy import save_file

DTYPES = ["F32", "F64", "F16", "BF16", "I32", "I64", "U8", "BOOL"]
NUMPY = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "I64": np.int64,
         "U8": np.uint8, "BOOL": np.bool_}


def values(dtype, k, n):
    num = (np.arange(n, dtype=np.int64) * 37 + k * 11) % 101
    if dtype == "U8":
        return num.astype(np.float64)
    if dtype == "BOOL":
        return (num % 2).astype(np.float64)
    if dtype in ("I32", "I64"):
        return (num - 50).astype(np.float64)
    return (num - 50).astype(np.float64) / 8.0


def specs(python):
    out = []
    for k, d in enumerate(DTYPES):
        shape = (k + 1, 3) if python else (2, k + 2, 3)
        out.append((f"t_{d}", d, shape))
    out.append(("scalar_f32", "F32", ()))
    out.append(("empty_f32", "F32", (0, 4)))
    return out


def make(dtype, k, shape):
    v = values(dtype, k, int(np.prod(shape)) if shape else 1).reshape(shape)
    if torch is not None:
        tdt = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
               "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool}[dtype]
        return torch.from_numpy(v).to(tdt)
    return v.astype(NUMPY[dtype])


def as_float64(t):
    if torch is not None:
        return t.to(torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def dtype_tag(t):
    if torch is not None:
        return {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8", torch.bool: "BOOL"}[t.dtype]
    return {v: k for k, v in NUMPY.items()}[t.dtype.type]


def main():
    binary, directory = sys.argv[1], sys.argv[2]
    os.makedirs(directory, exist_ok=True)
    failures = 0
    backend = "safetensors.torch" if torch is not None else "safetensors.numpy"
    print(f"safetensors {safetensors.__version__} through {backend}")

    from_tandem = os.path.join(directory, "from_tandem.safetensors")
    subprocess.run([binary, "write", from_tandem], check=True)
    with safetensors.safe_open(from_tandem, framework="pt" if torch is not None else "np") as f:
        metadata = f.metadata()
        names = set(f.keys())
        expected = specs(False)
        if names != {name for name, _, _ in expected}:
            print(f"FAIL: names {sorted(names)}")
            failures += 1
        for k, (name, dtype, shape) in enumerate(expected):
            if torch is None and dtype == "BF16":
                print(f"skip: {name} (no bf16 in numpy)")
                continue
            if name not in names:
                continue
            t = f.get_tensor(name)
            want = values(dtype, k, int(np.prod(shape)) if shape else 1).reshape(shape)
            if dtype_tag(t) != dtype or tuple(t.shape) != shape:
                print(f"FAIL: {name} is {dtype_tag(t)} {tuple(t.shape)}, expected {dtype} {shape}")
                failures += 1
            elif not np.array_equal(as_float64(t), want):
                print(f"FAIL: {name} has other values")
                failures += 1
            else:
                print(f"ok: {name} {dtype} {shape}")
    if metadata.get("writer") != "tandem":
        print(f"FAIL: metadata {metadata}")
        failures += 1

    from_python = os.path.join(directory, "from_python.safetensors")
    tensors = {name: make(dtype, k, shape) for k, (name, dtype, shape) in enumerate(specs(True))
               if torch is not None or dtype != "BF16"}
    save_file(tensors, from_python, metadata={"writer": "python"})
    command = [binary, "read", from_python] + ([] if torch is not None else ["--without-bf16"])
    read = subprocess.run(command, capture_output=True, text=True)
    print(read.stdout, end="")
    if read.returncode != 0:
        print(read.stderr, end="")
        failures += 1
    print(f"safetensors interop: {failures} failure(s)")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
