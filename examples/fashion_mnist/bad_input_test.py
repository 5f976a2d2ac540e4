"""fashion_mnist on bad input: each mistake must stop the run with one message that names the
flag or file, the value and what was expected, before any training. Also: under DDP the test
metrics count each test sample once, whatever the world size.

Usage: python3 bad_input_test.py FASHION_MNIST_BINARY WORK_DIR [MPIEXEC]
"""
import gzip
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys

program, work = sys.argv[1], sys.argv[2]
mpiexec = sys.argv[3] if len(sys.argv) > 3 else None
failures = []


def write_idx(path, dims, data):
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data))


def fake_dataset(root, train_n, test_n):
    os.makedirs(root, exist_ok=True)
    rng = random.Random(7)
    for prefix, n in (("train", train_n), ("t10k", test_n)):
        write_idx(f"{root}/{prefix}-images-idx3-ubyte.gz", [n, 28, 28], [rng.randrange(256) for _ in range(n * 784)])
        write_idx(f"{root}/{prefix}-labels-idx1-ubyte.gz", [n], [rng.randrange(10) for _ in range(n)])


def run(args, ranks=None):
    cmd = [program] + args
    if ranks:
        cmd = [mpiexec, "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def expect_refused(what, args, parts, ranks=None):
    rc, out, err = run(args, ranks)
    text = out + err
    missing = [p for p in parts if p not in text]
    if rc == 0 or missing:
        failures.append(f"{what}: exit {rc}, missing {missing} in:\n{text[-2000:]}")
    elif re.search(r"^epoch \d+[: ]", out, re.M):
        failures.append(f"{what}: trained before refusing:\n{out[-1000:]}")
    else:
        print(f"ok: {what}: {err.strip().splitlines()[0] if err.strip() else ''}")
    return text


shutil.rmtree(work, ignore_errors=True)
data = f"{work}/data"
fake_dataset(data, train_n=24, test_n=7)
base = ["--device", "cpu", "--data", data, "--log-every", "0"]
quick = base + ["--batch-size", "4"]

# Numeric flags: the flag, the value and the allowed range in words.
for flag, value, expected in [("--epochs", "0", "at least 1"), ("--epochs", "abc", "at least 1"),
                              ("--batch-size", "0", "at least 1"), ("--lr", "-1", "above 0"),
                              ("--seed", "-1", "at least 0"), ("--log-every", "-5", "at least 0"),
                              ("--max-steps-per-epoch", "-3", "at least 0"), ("--weight-decay", "-0.1", "at least 0")]:
    expect_refused(f"{flag} {value}", quick + [flag, value], [flag, f"'{value}'", expected])

# Compact master weights are for bf16 alone.
expect_refused("--compact-masters with fp16", quick + ["--precision", "fp16", "--compact-masters"],
               ["--compact-masters", "--precision bf16", "fp16"])

# An unwritable --save is found before training, on one rank and under mpirun (said once).
expect_refused("--save in a missing directory", quick + ["--save", f"{work}/missing/ckpt.safetensors"],
               ["--save", f"{work}/missing/ckpt.safetensors", "does not exist", "writable directory"])
expect_refused("--save naming a directory", quick + ["--save", work], ["--save", f"'{work}' is a directory"])
if mpiexec:
    text = expect_refused("--save in a missing directory, 2 ranks",
                          quick + ["--save", f"{work}/missing/ckpt.safetensors"],
                          ["--save", "does not exist"], ranks=2)
    if text.count("does not exist") != 1:
        failures.append(f"--save under mpirun: the message should appear once:\n{text[-2000:]}")

# A directory in place of a dataset file is reported as such.
odd = f"{work}/odd_data"
fake_dataset(odd, 8, 4)
os.remove(f"{odd}/train-images-idx3-ubyte.gz")
os.makedirs(f"{odd}/train-images-idx3-ubyte.gz")
expect_refused("a directory as the images file", ["--device", "cpu", "--data", odd],
               [f"{odd}/train-images-idx3-ubyte.gz", "is a directory", "expected a regular"])

if mpiexec:
    text = expect_refused("a directory as the images file, 2 ranks", ["--device", "cpu", "--data", odd],
                          ["is a directory"], ranks=2)
    if text.count("is a directory") != 1:
        failures.append(f"a bad dataset under mpirun: the message should appear once:\n{text[-2000:]}")
    expect_refused("--batch-size 5 over 2 ranks", quick[:-2] + ["--batch-size", "5"],
                   ["--batch-size 5 must divide evenly across 2 ranks"], ranks=2)

# Resuming: another --epochs under the cosine schedule, and another model, are refused naming both.
ckpt = f"{work}/ckpt.safetensors"
rc, out, err = run(quick + ["--epochs", "1", "--save", ckpt])
if rc != 0:
    failures.append(f"the run to resume from failed:\n{out}{err}")
else:
    expect_refused("resume with another --epochs under cosine", quick + ["--epochs", "2", "--resume", ckpt],
                   ["--resume", "1 epochs (6 steps)", "2 epochs (12 steps)", "--epochs 1"])
    expect_refused("resume into another model", quick + ["--epochs", "1", "--model", "cnn", "--resume", ckpt],
                   ["this checkpoint is of model mlp in f32; you asked for model cnn in f32"])
    if mpiexec:
        text = expect_refused("resume into another model, 2 ranks",
                              quick[:-2] + ["--batch-size", "8", "--epochs", "1", "--model", "cnn", "--resume", ckpt],
                              ["you asked for model cnn"], ranks=2)
        if text.count("you asked for model cnn") != 1:
            failures.append(f"a bad resume under mpirun: the message should appear once:\n{text[-2000:]}")
    expect_refused("resume into another precision", quick + ["--epochs", "1", "--precision", "bf16", "--resume", ckpt],
                   ["model mlp in f32; you asked for model mlp in bf16"])

# Under DDP the 7 test samples count 7 times, not 8 (2 or 4 ranks) or 9 (3 ranks).
if mpiexec:
    for ranks in (2, 3, 4):
        metrics = f"{work}/metrics_np{ranks}.json"
        rc, out, err = run(base + ["--batch-size", str(4 * ranks), "--epochs", "1", "--metrics", metrics], ranks)
        if rc != 0:
            failures.append(f"np {ranks}: exit {rc}:\n{out}{err}")
            continue
        samples = json.load(open(metrics))["epochs"][0]["test_samples"]
        if samples != 7:
            failures.append(f"np {ranks}: the test metrics counted {samples} samples, expected 7")
        else:
            print(f"ok: np {ranks}: test metrics over 7 samples")

if failures:
    print("\n\n".join(failures))
    sys.exit(1)
print("all bad-input checks passed")
