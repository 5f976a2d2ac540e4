"""Where a training step's GPU time goes, kernel by kernel: runs a command under Nsight Compute
(ncu) collecting only each kernel's duration, then prints the kernels grouped by name, largest
total first, with their share of the whole.

ncu runs the kernels one at a time (no overlap between streams) and adds no counters beyond the
duration, so each kernel's time is close to what it takes alone; the clocks are left as they are
(--clock-control none) and caches are not flushed between kernels (--cache-control none).

Usage: python3 bench/kernel_profile.py [--top N] [--csv OUT.csv] [--marked] -- COMMAND [ARGS...]
  --marked   only the kernels between the command's cuda::profiler_start() and profiler_stop()
             (train_step marks its timed steps); otherwise every kernel the command launched
  e.g. python3 bench/kernel_profile.py --marked -- build-gpu/bench/train_step --workload gpt2 \\
           --precision bf16 --warmup 2 --steps 1"""
import argparse
import collections
import csv
import io
import re
import shutil
import subprocess
import sys


def short_name(kernel):
    """A kernel's name without its argument list, at most 90 characters."""
    name = re.sub(r"\(.*", "", kernel)
    name = re.sub(r"^(void|tandem::)\s*", "", name)
    return name if len(name) <= 90 else name[:87] + "..."


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--csv", help="also keep ncu's raw CSV here")
    parser.add_argument("--marked", action="store_true", help="only between cudaProfilerStart and Stop")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    marked = ["--profile-from-start", "off"] if args.marked else []
    proc = subprocess.run([ncu, "--clock-control", "none", "--cache-control", "none", "--metrics",
                           "gpu__time_duration.sum", "--csv", "--print-units", "base"] + marked + command,
                          capture_output=True, text=True)
    text = proc.stdout
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(text)
    start = text.find('"ID"')
    if start < 0:
        sys.stderr.write(proc.stderr[-4000:] + text[-4000:])
        sys.exit(f"kernel_profile: no kernel table from ncu (exit status {proc.returncode})")
    totals = collections.defaultdict(float)
    counts = collections.Counter()
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = short_name(row["Kernel Name"])
        totals[name] += float(row["Metric Value"].replace(",", "")) / 1e6  # ns -> ms
        counts[name] += 1
    whole = sum(totals.values())
    print(f"{sum(counts.values())} kernels, {whole:.3f} ms in all (ncu, one kernel at a time)")
    print(f"{'ms':>9s} {'share':>6s} {'calls':>6s} {'ms/call':>8s}  kernel")
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{ms:9.3f} {ms / whole:6.1%} {counts[name]:6d} {ms / counts[name]:8.4f}  {name}")
    return 0 if proc.returncode == 0 else proc.returncode


if __name__ == "__main__":
    sys.exit(main())
