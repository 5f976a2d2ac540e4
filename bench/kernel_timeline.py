"""Where a step's time goes on the GPU as it actually ran: the kernels, memsets and copies of the
marked part of a command (bench/train_step marks its timed steps), with the time between them.

Runs the command with the CUPTI library built from bench/kernel_timeline.cpp injected
(CUDA_INJECTION64_PATH), which records when the GPU ran each kernel, memset and copy, the nodes of
replayed CUDA graphs included. Nothing is serialised: unlike bench/kernel_profile.py (ncu, one
kernel at a time, 2 to 3 us added to each small kernel) the times are those of the run itself,
so the gaps between kernels (launch latency, memset and copy nodes, host stalls) show. Recording
makes a step slightly longer (about 0.1 ms of GPT-2 B1 T1024's 3.7 ms on an H200).

The command runs with TANDEM_DEPENDENT_LAUNCH=0 unless the environment sets it: tandem's kernels
then launch the ordinary way, so each record is that kernel's own time.

With --cuda-graph each replay is one step: the replay whose span is the median is printed, with
the medians over all replays. Without a graph the marked part is divided by --steps (by default
the command's own --steps: bench/train_step marks its timed steps).

Usage: python3 bench/kernel_timeline.py [--library PATH] [--top N] [--steps N] [--keep FILE]
                                        -- COMMAND [ARGS...]
  e.g. python3 bench/kernel_timeline.py -- build/bench/train_step --workload gpt2 --batch 1 \\
           --seq-len 1024 --precision bf16 --steps 20 --cuda-graph"""
import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_profile import short_name  # noqa: E402


class Record:
    def __init__(self, kind, start, end, correlation, graph, name):
        self.kind, self.start, self.end = kind, int(start), int(end)
        self.correlation, self.graph, self.name = int(correlation), int(graph), name


def read_timeline(path):
    """(marks, records): marks maps 'start'/'stop' to correlation ids (the first of each)."""
    marks, records = {}, []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "mark":
                marks.setdefault(fields[1], int(fields[2]))
            elif len(fields) == 6:
                records.append(Record(*fields))
    return marks, records


def demangled(names):
    """Mangled name -> short readable name (c++filt where present)."""
    names = sorted(set(names))
    plain = names
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        plain = out.split("\n")[:len(names)]
    # ncu names anonymous namespaces "<unnamed>", c++filt "(anonymous namespace)"
    return {n: short_name(p.replace("(anonymous namespace)", "<unnamed>")) for n, p in zip(names, plain)}


def busy_ns(records):
    """Time covered by at least one record (records may overlap on several streams)."""
    total, cur_start, cur_end = 0, None, None
    for r in sorted(records, key=lambda r: r.start):
        if cur_end is None or r.start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = r.start, r.end
        else:
            cur_end = max(cur_end, r.end)
    return total + (cur_end - cur_start if cur_end is not None else 0)


def span_ns(records):
    return max(r.end for r in records) - min(r.start for r in records)


def gaps(records, names):
    """(idle ns, name before, name after) for every stretch with nothing running."""
    out, end, before = [], None, None
    for r in sorted(records, key=lambda r: r.start):
        if end is not None and r.start > end:
            out.append((r.start - end, names[before.name], names[r.name]))
        if end is None or r.end > end:
            end, before = r.end, r
    return out


def steps_of(records, steps):
    """The records of each step: a replayed graph's per launch, else the whole part once."""
    replays = collections.defaultdict(list)
    for r in records:
        if r.graph != 0:
            replays[r.correlation].append(r)
    if replays:
        return [replays[c] for c in sorted(replays)], 1
    return [records], steps


def report(records, steps, top):
    if not records:
        sys.exit("kernel_timeline: no kernels recorded in the marked part")
    names = demangled(r.name for r in records)
    groups, divide = steps_of(records, steps)
    spans = [span_ns(g) for g in groups]
    median = statistics.median(spans)
    chosen = min(groups, key=lambda g: abs(span_ns(g) - median))
    span, busy = span_ns(chosen) / divide, busy_ns(chosen) / divide
    kind = f"{len(groups)} replays of a CUDA graph" if divide == 1 and len(groups) > 1 else f"{divide} step{'s' if divide != 1 else ''}, eager"
    print(f"{kind}: {len(chosen) // divide} kernels, memsets and copies a step")
    print(f"step on the GPU: {span / 1e3:.1f} us (median of {len(groups)}: {median / divide / 1e3:.1f}); "
          f"something running {busy / 1e3:.1f} us, nothing running {(span - busy) / 1e3:.1f} us")
    totals = collections.defaultdict(lambda: [0, 0])
    for r in chosen:
        totals[names[r.name]][0] += r.end - r.start
        totals[names[r.name]][1] += 1
    print(f"{'us':>9} {'share':>6} {'calls':>6} {'us/call':>8}  kernel, memset or copy")
    for name, (t, n) in sorted(totals.items(), key=lambda x: -x[1][0])[:top]:
        print(f"{t / divide / 1e3:9.1f} {100 * t / divide / span:5.1f}% {n / divide:6g} {t / n / 1e3:8.2f}  {name}")
    idle = gaps(chosen, names)
    by_pair = collections.defaultdict(lambda: [0, 0])
    for ns, before, after in idle:
        by_pair[(before, after)][0] += ns
        by_pair[(before, after)][1] += 1
    print(f"nothing running: {len(idle) / divide:g} gaps a step, {sum(g[0] for g in idle) / divide / 1e3:.1f} us; "
          f"the largest totals, by what ran before and after:")
    for (before, after), (t, n) in sorted(by_pair.items(), key=lambda x: -x[1][0])[:12]:
        print(f"{t / divide / 1e3:9.1f} us {n / divide:5g}x  {before[:55]} -> {after[:55]}")


def steps_in_command(command):
    """The command's own --steps N (bench/train_step's timed steps, which it marks), or None."""
    for i, arg in enumerate(command):
        value = arg[len("--steps="):] if arg.startswith("--steps=") else (
            command[i + 1] if arg == "--steps" and i + 1 < len(command) else None)
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    default_library = next((p for p in (os.path.join(here, "..", d, "bench", "libkernel_timeline.so")
                                        for d in ("build", "build-gpu")) if os.path.exists(p)), None)
    parser.add_argument("--library", default=default_library, help="libkernel_timeline.so (default: the build's)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--steps", type=int,
                        help="without a graph: steps in the marked part (default: the command's --steps, else 1)")
    parser.add_argument("--keep", help="also keep the recorded timeline (TSV) here")
    parser.add_argument("--timeline", help="read this recorded timeline instead of running a command")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if args.timeline:
        path = args.timeline
    else:
        if not args.library or not os.path.exists(args.library):
            sys.exit("kernel_timeline: libkernel_timeline.so not found (build the kernel_timeline target of a "
                     "CUDA build whose toolkit has CUPTI, or pass --library)")
        path = args.keep or tempfile.mkstemp(suffix=".tsv")[1]
        env = dict(os.environ, CUDA_INJECTION64_PATH=os.path.abspath(args.library), TANDEM_TIMELINE_OUT=path)
        env.pop("TANDEM_TIMELINE_ACTIVE", None)
        # Each kernel's own time: with dependent launch a kernel's record would start when it was
        # scheduled, its wait for the kernel before it included (set the variable to 1 to see that).
        env.setdefault("TANDEM_DEPENDENT_LAUNCH", "0")
        proc = subprocess.run(command, env=env, stdout=subprocess.DEVNULL)
        if proc.returncode != 0:
            sys.exit(f"kernel_timeline: the command exited with status {proc.returncode}")
    marks, records = read_timeline(path)
    if "start" in marks:
        stop = marks.get("stop", float("inf"))
        records = [r for r in records if marks["start"] < r.correlation < stop]
    steps = args.steps or steps_in_command(command)
    if steps is None:
        steps = 1
        if records and all(r.graph == 0 for r in records):
            print("kernel_timeline: the marked part is taken as one step (pass --steps N, or run a command "
                  "with --steps N, to divide it by N)", file=sys.stderr)
    report(records, steps, args.top)
    if not args.timeline and not args.keep:
        os.remove(path)


if __name__ == "__main__":
    main()
