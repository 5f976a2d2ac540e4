#!/usr/bin/env python3
"""PyTorch's figures for bench/train_step.cpp: the time of one full training step (zero_grad,
forward, loss, backward, AdamW step) of the same workload, timed the same way (CUDA events on the
current stream after warm-up; wall time on the CPU), with the same flags and JSON keys. Prints each
step's loss, a one-line summary on stderr and the JSON as stdout's last line. Needs only torch.

    python3 bench/reference/train_step.py --workload gpt2 --precision bf16 [--compile]
    torchrun --nproc_per_node 2 bench/reference/train_step.py --workload resnet18 --precision bf16

Workloads (bench/workloads.h defines the same ones in tandem; parameter names match, so state
dicts move between the two as safetensors):
  mlp       1024 -> 4096 -> 4096 -> 4096 -> 4096 -> 1024, GELU (tanh), MSE; batch 1024
  gpt2      GPT-2 124M (12 layers, width 768, 12 heads, vocab 50304, context 1024, pre-LayerNorm,
            GELU (tanh), causal self-attention, output head tied to the token embedding),
            nanoGPT's initialisation; cross-entropy against random tokens; batch 8 x 1024 tokens
  resnet18  ResNet-18 for 3x32x32 images (3x3 stem, no max-pool), batch norm, 10 classes,
            cross-entropy against random labels; batch 256
Inputs are drawn once, before timing.

Under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel over NCCL, one GPU
per rank, the batch per GPU fixed, like tandem's train_step under mpirun.

Precision is tandem's recipe: f32 and tf32 keep everything in f32 (TF32 matmuls off / on); bf16
and fp16 convert the model and the inputs to 16 bits (batch norm's parameters and statistics
stay f32), take the loss in f32, and let the optimizer update f32 master weights that are copied
back into the 16-bit model after each step; fp16 scales the loss with a GradScaler.
--autocast instead runs PyTorch's usual mixed precision (f32 parameters, forward under
torch.autocast), for comparison.
"""
import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

DTYPES = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_BATCH = {"mlp": 1024, "gpt2": 8, "resnet18": 256}
# tandem's train_step: lr 1e-4, torch.optim.AdamW's defaults otherwise.
ADAMW = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}


@dataclasses.dataclass
class GPT2Config:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    block_size: int = 1024


@dataclasses.dataclass
class WorkloadSpec:
    """What defines a workload's model and batch (bench/workloads.h's WorkloadOptions)."""
    name: str = "mlp"
    batch: int = 0  # samples (gpt2: sequences) per step; 0: the workload's default
    seq_len: int = 0  # gpt2: tokens per sequence; 0: block_size
    mlp_widths: tuple = (1024, 4096, 4096, 4096, 4096, 1024)
    gpt2: GPT2Config = dataclasses.field(default_factory=GPT2Config)
    num_classes: int = 10
    image_size: int = 32
    channels_last: bool = False  # resnet18: model and images in torch.channels_last

    def batch_or_default(self):
        return self.batch if self.batch > 0 else DEFAULT_BATCH[self.name]

    def seq_len_or_default(self):
        return self.seq_len if self.seq_len > 0 else self.gpt2.block_size

    def tokens_per_sample(self):
        return self.seq_len_or_default() if self.name == "gpt2" else 1


# ---- GPT-2 (models/gpt2.h) ----

def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(D) + causal mask) v for q, k, v (B, H, T, D)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch before 2.0: the same attention, explicitly.
    T, D = q.size(-2), q.size(-1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # (B, H, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    return att @ v


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):  # (B, T, C)
        B, T, C = x.shape
        H = self.n_head
        heads = self.c_attn(x).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)  # (3, B, H, T, D)
        y = causal_attention(heads[0], heads[1], heads[2])  # (B, H, T, D)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class GPT2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """Parameters: wte, wpe, h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_f;
    the output head is wte itself (one parameter, so the state dict has no shared tensors)."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([GPT2Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        # nanoGPT's initialisation: N(0, 0.02) linear and embedding weights, zero linear biases,
        # N(0, 0.02 / sqrt(2 n_layer)) for the residual projections; LayerNorm keeps ones and zeros.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    def forward(self, idx):  # (B, T) token ids -> (B, T, V) logits
        T = idx.size(1)
        assert T <= self.config.block_size, f"sequence of {T} tokens, longer than block_size {self.config.block_size}"
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # (B, T, V)


# ---- ResNet-18, CIFAR variant (models/resnet.h) ----

class BasicBlock(nn.Module):
    def __init__(self, in_channels, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, 0, bias=False),
                                            nn.BatchNorm2d(channels))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages, in_channels = [], 64
        for channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels, 1)))
            in_channels = channels
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):  # (N, 3, H, W) -> (N, num_classes)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.layer4(self.layer3(self.layer2(self.layer1(y))))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


# ---- the workloads ----

def make_model(spec):
    """The workload's model in f32 on the CPU, initialised from torch's default generator."""
    if spec.name == "mlp":
        widths, layers = spec.mlp_widths, []
        for i in range(len(widths) - 1):
            if i > 0:
                layers.append(nn.GELU(approximate="tanh"))
            layers.append(nn.Linear(widths[i], widths[i + 1]))
        return nn.Sequential(*layers)
    if spec.name == "gpt2":
        return GPT2(spec.gpt2)
    if spec.channels_last and spec.name != "resnet18":
        raise ValueError(f"channels-last applies to the resnet18 workload only (its convolutions), not to {spec.name}")
    if spec.name == "resnet18":
        model = ResNet18(spec.num_classes)
        return model.to(memory_format=torch.channels_last) if spec.channels_last else model
    raise ValueError(f"unknown workload '{spec.name}': expected mlp, gpt2 or resnet18")


def to_precision(model, dtype):
    """tandem's Module::to(dtype): floating tensors to dtype, batch norm's kept f32."""
    model.to(dtype)
    if dtype != torch.float32:
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.float()
    return model


def make_batch(spec, dtype, device):
    """(input, target): normal inputs and MSE targets in dtype; token ids and labels uniform (i64)."""
    B = spec.batch_or_default()
    if spec.name == "mlp":
        x = torch.randn(B, spec.mlp_widths[0], device=device).to(dtype)  # (B, 1024)
        target = torch.randn(B, spec.mlp_widths[-1], device=device).to(dtype)  # (B, 1024)
        return x, target
    if spec.name == "gpt2":
        T = spec.seq_len_or_default()
        if T > spec.gpt2.block_size:
            raise ValueError(f"gpt2: sequence length {T} is longer than the block size {spec.gpt2.block_size}")
        idx = torch.randint(0, spec.gpt2.vocab_size, (B, T), device=device)  # (B, T)
        target = torch.randint(0, spec.gpt2.vocab_size, (B, T), device=device)  # (B, T)
        return idx, target
    if spec.name == "resnet18":
        S = spec.image_size
        images = torch.randn(B, 3, S, S, device=device).to(dtype)  # (B, 3, S, S)
        labels = torch.randint(0, spec.num_classes, (B,), device=device)  # (B,)
        if spec.channels_last:  # the same values, laid out NHWC once (the batch is drawn once)
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels
    raise ValueError(f"unknown workload '{spec.name}': expected mlp, gpt2 or resnet18")


def workload_loss(name, model, batch):
    """The loss, in f32 for every dtype (as tandem takes it)."""
    x, target = batch
    if name == "mlp":
        return F.mse_loss(model(x).float(), target.float())
    if name == "gpt2":
        logits = model(x)  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1))
    if name == "resnet18":
        return F.cross_entropy(model(x).float(), target)
    raise ValueError(f"unknown workload '{name}'")


def make_adamw(params, device):
    """torch.optim.AdamW with tandem's hyper-parameters; fused on CUDA (PyTorch's fastest)."""
    if device.type == "cuda":
        try:
            return torch.optim.AdamW(params, fused=True, **ADAMW)
        except (RuntimeError, TypeError) as e:  # torch before 2.0
            print(f"train_step.py: fused AdamW unavailable ({e}); using the default implementation", file=sys.stderr)
    return torch.optim.AdamW(params, **ADAMW)


class MasterWeights:
    """tandem's 16-bit training: the optimizer updates f32 copies of the 16-bit parameters, which
    are written back (rounded) after each step. Gradients are widened into the copies' .grad."""

    def __init__(self, params, device):
        self.params = [p for p in params if p.dtype != torch.float32]
        self.masters = [p.detach().float().requires_grad_() for p in self.params]
        by_id = {id(p): m for p, m in zip(self.params, self.masters)}
        self.optimizer = make_adamw([by_id.get(id(p), p) for p in params], device)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def prepare(self):
        """Widens the 16-bit gradients into the masters (before a GradScaler or the step)."""
        for p, m in zip(self.params, self.masters):
            m.grad = p.grad.float() if p.grad is not None else None

    def write_back(self):
        with torch.no_grad():
            if hasattr(torch, "_foreach_copy_"):  # one multi-tensor launch (torch 2.1 and later)
                torch._foreach_copy_(self.params, self.masters)
            else:
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)


def make_grad_scaler(device):
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device.type)
    return torch.cuda.amp.GradScaler()  # torch before 2.3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="mlp", choices=sorted(DEFAULT_BATCH))
    parser.add_argument("--precision", default="f32", choices=["f32", "tf32", "bf16", "fp16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--batch", type=int, default=0,
                        help="samples (gpt2: sequences) per step, per GPU; 0: the workload's default "
                             "(mlp 1024, gpt2 8, resnet18 256)")
    parser.add_argument("--seq-len", type=int, default=0, help="gpt2: tokens per sequence; 0: the context, 1024")
    parser.add_argument("--channels-last", action="store_true",
                        help="resnet18: model and images in torch.channels_last (NHWC), as train_step --channels-last")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=50, help="timed steps")
    parser.add_argument("--json", help="also write the result JSON to this file")
    parser.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    parser.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune"],
                        help="torch.compile's mode; reduce-overhead runs the compiled model through CUDA graphs")
    parser.add_argument("--autocast", action="store_true",
                        help="bf16/fp16 as PyTorch usually does it: f32 parameters, forward under torch.autocast")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (under torchrun)")
    parser.add_argument("--autotune", action="store_true",
                        help="GPU: torch.backends.cudnn.benchmark and TunableOp (torch.cuda.tunable) for the matrix "
                             "products, as train_step --autotune does for tandem")
    args = parser.parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.batch < 0 or args.seq_len < 0 or args.steps <= 0 or args.warmup < 0:
        parser.error("--batch and --seq-len must be non-negative, --steps positive, --warmup non-negative")
    if world_size > 1:
        import torch.distributed as dist
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")

    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    on_gpu = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    if args.autotune and on_gpu:
        torch.backends.cudnn.benchmark = True
        torch.cuda.tunable.enable(True)
        # TunableOp keeps its results in a CSV file: one per run, out of the working directory.
        torch.cuda.tunable.set_filename(os.path.join(tempfile.mkdtemp(prefix="tunableop-"), "results%d.csv"))
    half = args.precision in ("bf16", "fp16")
    model_dtype = DTYPES[args.precision] if half and not args.autocast else torch.float32
    autocast_dtype = DTYPES[args.precision] if half and args.autocast else None

    spec = WorkloadSpec(name=args.workload, batch=args.batch, seq_len=args.seq_len, channels_last=args.channels_last)
    batch = spec.batch_or_default()
    torch.manual_seed(0)
    model = to_precision(make_model(spec).to(device), model_dtype)
    torch.manual_seed(1 + rank)  # each rank its own batch, drawn once
    data = make_batch(spec, model_dtype, device)
    params = sum(p.numel() for p in model.parameters())
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[device.index], bucket_cap_mb=args.bucket_mb)
    masters = MasterWeights(list(model.parameters()), device) if model_dtype != torch.float32 else None
    optimizer = masters.optimizer if masters else make_adamw(model.parameters(), device)
    scaler = make_grad_scaler(device) if args.precision == "fp16" else None
    run_model = torch.compile(model, mode=args.compile_mode) if args.compile else model

    def autocast():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=autocast_dtype)

    def step():
        """One step; returns the loss, detached and still on the device, so no step waits for the host."""
        if masters:
            masters.zero_grad(set_to_none=True)
        else:
            optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = workload_loss(args.workload, run_model, data)
        if scaler is not None:
            scaler.scale(loss).backward()
            if masters:
                masters.prepare()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if masters:
                masters.prepare()
            optimizer.step()
        if masters:
            masters.write_back()
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
    peak = torch.cuda.max_memory_allocated(device) if on_gpu else None
    if world_size > 1:
        dist.destroy_process_group()
        if rank != 0:
            return
    for i, value in enumerate(loss_values):
        timed = i - args.warmup
        suffix = "(warm-up)" if timed < 0 else f"{step_ms[timed]:.3f} ms"
        print(f"step {i:3d}  loss {value:.6f}  {suffix}")

    med, low = statistics.median(step_ms), min(step_ms)
    samples_per_s = batch / (med / 1e3)  # gpt2: sequences per second
    tokens = spec.tokens_per_sample()
    compiled = "" if not args.compile else "-compile" if args.compile_mode == "default" else "-compile-" + args.compile_mode
    framework = "pytorch" + compiled + ("-autocast" if autocast_dtype else "") + ("-autotune" if args.autotune else "")
    result = {
        "framework": framework,
        "workload": args.workload,
        "precision": args.precision,
        "device": str(device),
        "batch": batch,
        "seq_len": spec.seq_len_or_default() if args.workload == "gpt2" else None,
        "channels_last": args.channels_last,
        "params": params,
        "step_ms_median": med,
        "step_ms_min": low,
        "samples_per_s": samples_per_s,
        "tokens_per_s": samples_per_s * tokens if args.workload == "gpt2" else None,
        "peak_memory_bytes": peak,
        "loss_first": loss_values[0],  # before any update
        "loss_last": loss_values[-1],
        "ddp": {"world_size": world_size, "bucket_mb": args.bucket_mb} if world_size > 1 else None,
        "autotune": args.autotune,
    }

    unit = "tokens" if tokens > 1 else "samples"
    summary = (f"train_step.py: {framework} {args.workload} {args.precision} on {device}, batch {batch}, "
               f"{params / 1e6:.1f}M params: {med:.3f} ms/step median (min {low:.3f}), "
               f"{samples_per_s * tokens:.0f} {unit}/s")
    if peak is not None:
        summary += f", peak {peak / 2**30:.2f} GiB"
    print(f"{summary}, loss {loss_values[0]:.6f} -> {loss_values[-1]:.6f}", file=sys.stderr, flush=True)

    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
