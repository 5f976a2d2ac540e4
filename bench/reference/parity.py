#!/usr/bin/env python3
"""Parity of tandem with PyTorch on the benchmark workloads (train_step.py's definitions).

    parity.py --binary build/bench/parity [--device cuda|cpu] [--size full|small]
              [--workloads mlp,gpt2,resnet18] [--batch N] [--seq-len T] [--steps 3] [--rtol 1e-4]
              [--check strict|l2|first-step]

For each workload, in f32 without TF32 and in training mode: builds the model, saves its initial
state (parameters and buffers) and one batch of inputs and targets as safetensors, trains
--steps AdamW steps (tandem's hyper-parameters) on that batch, and saves each step's loss and
the final state. Then runs tandem's `parity` binary on the same files: it loads the initial
state and the batch, trains the same steps, and compares the first step's loss and gradients and
every tensor of the final state, err = max|tandem - torch| / max|torch| per tensor, against
--rtol. Exits with the binary's status for the --check verdict (0: every workload passed), or 77
(skipped) when torch or safetensors is missing.

--size small shrinks the MLP and GPT-2 (not ResNet-18) so that the check runs on the CPU in
a CTest test; the default batch is then small too (mlp 64, gpt2 2 sequences, resnet18 8). On
CUDA the default is the benchmark's full size and batch.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import torch
    from safetensors.torch import save_file
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step as ts  # noqa: E402  (the workload definitions)

CPU_BATCH = {"mlp": 64, "gpt2": 2, "resnet18": 8}
SMALL_MLP = (128, 512, 512, 512, 512, 128)
SMALL_GPT2 = ts.GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, block_size=64)


def workload_spec(name, args):
    spec = ts.WorkloadSpec(name=name, batch=args.batch, seq_len=args.seq_len)
    if args.size == "small":
        spec.mlp_widths = SMALL_MLP
        spec.gpt2 = SMALL_GPT2
    if spec.batch <= 0 and args.device == "cpu":
        spec.batch = CPU_BATCH[name]
    return spec


def metadata(spec, steps):
    """What tandem's parity needs to build the same model and optimizer (strings, as safetensors wants)."""
    meta = {"workload": spec.name, "steps": str(steps)}
    meta.update({"lr": repr(ts.ADAMW["lr"]), "beta1": repr(ts.ADAMW["betas"][0]), "beta2": repr(ts.ADAMW["betas"][1]),
                 "eps": repr(ts.ADAMW["eps"]), "weight_decay": repr(ts.ADAMW["weight_decay"])})
    if spec.name == "mlp":
        meta["mlp_widths"] = ",".join(str(w) for w in spec.mlp_widths)
    elif spec.name == "gpt2":
        g = spec.gpt2
        meta.update({"n_layer": str(g.n_layer), "n_head": str(g.n_head), "n_embd": str(g.n_embd),
                     "vocab_size": str(g.vocab_size), "block_size": str(g.block_size)})
    elif spec.name == "resnet18":
        meta["num_classes"] = str(spec.num_classes)
    return meta


def state(model):
    return {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}


def train(model, batch, name, steps, device):
    """`steps` AdamW steps on one batch; returns the losses and the first step's gradients."""
    optimizer = ts.make_adamw(model.parameters(), device)
    losses, grads = [], None
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = ts.workload_loss(name, model, batch)
        loss.backward()
        if grads is None:
            grads = {k: p.grad.detach().cpu().contiguous() for k, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.item())
    return losses, grads


def run_torch(spec, device, steps, out_dir):
    """Trains `steps` steps from a fresh model and writes <name>_{init,batch,grads,after}.safetensors;
    then the same in f64 from the same start, <name>_after64.safetensors: the reference that tells
    f32 rounding (amplified by Adam's normalised steps) from a real difference."""
    torch.manual_seed(0)
    model = ts.make_model(spec).to(device)
    model.train()
    torch.manual_seed(1)
    batch = ts.make_batch(spec, torch.float32, device)
    meta = metadata(spec, steps)
    init = state(model)
    save_file(init, os.path.join(out_dir, f"{spec.name}_init.safetensors"), metadata=meta)
    start = time.perf_counter()
    losses, grads = train(model, batch, spec.name, steps, device)
    seconds = time.perf_counter() - start
    save_file(grads, os.path.join(out_dir, f"{spec.name}_grads.safetensors"), metadata=meta)

    model64 = ts.make_model(spec).double().to(device)
    model64.load_state_dict(init)
    model64.train()
    batch64 = tuple(t.double() if t.is_floating_point() else t for t in batch)
    losses64, grads64 = train(model64, batch64, spec.name, steps, device)
    save_file(state(model64), os.path.join(out_dir, f"{spec.name}_after64.safetensors"), metadata=meta)
    save_file(grads64, os.path.join(out_dir, f"{spec.name}_grads64.safetensors"), metadata=meta)
    del model64, batch64
    save_file({"input": batch[0].cpu().contiguous(), "target": batch[1].cpu().contiguous(),
               "losses": torch.tensor(losses, dtype=torch.float64)},
              os.path.join(out_dir, f"{spec.name}_batch.safetensors"), metadata=meta)
    save_file(state(model), os.path.join(out_dir, f"{spec.name}_after.safetensors"), metadata=meta)
    params = sum(p.numel() for p in model.parameters())
    print(f"parity.py: torch {spec.name} on {device}, batch {tuple(batch[0].shape)}, {params / 1e6:.2f}M params, "
          f"{steps} steps in {seconds:.1f} s, losses {' '.join(f'{l:.6g}' for l in losses)} "
          f"(f64: {' '.join(f'{l:.6g}' for l in losses64)})", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", required=True, help="tandem's parity executable (bench/parity)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--size", default=None, choices=["full", "small"],
                        help="full: the benchmark's models (default on cuda); small: shrunk MLP and GPT-2 "
                             "(default on cpu)")
    parser.add_argument("--workloads", default="mlp,gpt2,resnet18")
    parser.add_argument("--batch", type=int, default=0,
                        help="per workload; 0: the benchmark's on cuda, mlp 64 / gpt2 2 / resnet18 8 on cpu")
    parser.add_argument("--seq-len", type=int, default=0, help="gpt2 tokens per sequence; 0: the block size")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--check", default="strict", choices=["strict", "l2", "first-step"],
                        help="the verdict that sets the exit status (see bench/parity.cpp)")
    parser.add_argument("--dir", help="where the files go (kept); default: a temporary folder, removed after")
    args = parser.parse_args()
    if args.size is None:
        args.size = "full" if args.device == "cuda" else "small"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    if not os.path.isfile(args.binary):
        parser.error(f"--binary {args.binary}: no such file (build the 'parity' target)")
    names = [n for n in args.workloads.split(",") if n]
    for n in names:
        if n not in ts.DEFAULT_BATCH:
            parser.error(f"unknown workload '{n}': expected mlp, gpt2 or resnet18")

    device = torch.device(args.device)
    # f32 everywhere: no TF32 in matmuls or convolutions (tandem's f32 has none either).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    out_dir = args.dir or tempfile.mkdtemp(prefix="tandem_parity_")
    os.makedirs(out_dir, exist_ok=True)
    try:
        for n in names:
            run_torch(workload_spec(n, args), device, args.steps, out_dir)
        command = [args.binary, "--dir", out_dir, "--workloads", ",".join(names), "--device", args.device,
                   "--rtol", repr(args.rtol), "--check", args.check]
        print("parity.py: running", " ".join(command), flush=True)
        return subprocess.call(command)
    finally:
        if not args.dir:
            shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
