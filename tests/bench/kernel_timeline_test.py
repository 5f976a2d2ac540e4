#!/usr/bin/env python3
"""bench/kernel_timeline.py's reading of a recorded timeline, on made-up records (no GPU needed):
only the marked part counts; a replayed graph's records are grouped by launch and the median
replay is printed; eager records are divided by --steps (by default the command's own); idle
time is what no record covers (records on two streams overlapping count once), and each gap is
named by what ran before and after it; kernels of anonymous namespaces keep their own names."""
import os
import shutil
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "kernel_timeline.py")


def run(lines, *args, command=()):
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        out = subprocess.run([sys.executable, SCRIPT, "--timeline", f.name, *args, "--", *command],
                             capture_output=True, text=True)
    finally:
        os.remove(f.name)
    if out.returncode != 0:
        sys.exit(f"kernel_timeline.py failed:\n{out.stderr}")
    return out.stdout


def expect(text, *pieces):
    for piece in pieces:
        if piece not in text:
            sys.exit(f"expected {piece!r} in:\n{text}")


def graph_replays():
    # Marks around correlation ids 5..20; three replays (launches 10, 11, 12) of a graph of four
    # nodes, the second replay slower; a kernel before the marks and one on another stream that
    # overlaps the first kernel of each replay.
    lines = ["mark\tstart\t5", "mark\tstop\t20", "kernel\t0\t500\t3\t0\t_Z7warm_upv"]
    t = 1000
    for launch, slow in ((10, 0), (11, 4000), (12, 0)):
        lines.append(f"kernel\t{t}\t{t + 2000}\t{launch}\t7\t_Z4gemmPf")
        lines.append(f"kernel\t{t + 500}\t{t + 1500}\t{launch}\t7\t_Z4sidePf")  # overlaps gemm
        lines.append(f"memset\t{t + 2500}\t{t + 2600}\t{launch}\t7\tmemset 4 B")
        lines.append(f"kernel\t{t + 6600 + slow}\t{t + 7600 + slow}\t{launch}\t7\t_Z4normPf")
        t += 20000
    out = run(lines)
    expect(out, "3 replays of a CUDA graph: 4 kernels, memsets and copies a step",
           "step on the GPU: 7.6 us (median of 3: 7.6); something running 3.1 us, nothing running 4.5 us",
           "gemm", "side", "norm", "memset 4 B", "nothing running: 2 gaps a step, 4.5 us",
           "4.0 us     1x  memset 4 B -> norm", "0.5 us     1x  gemm -> memset 4 B")
    if "warm_up" in out:
        sys.exit(f"a record before the start mark was counted:\n{out}")


def eager_steps():
    lines = ["mark\tstart\t5", "mark\tstop\t100"]
    t = 0
    for step in range(4):
        for name in ("_Z3fooi", "_Z3barv"):
            lines.append(f"kernel\t{t}\t{t + 2000}\t{10 + step}\t0\t{name}")
            t += 2500
    out = run(lines, "--steps", "4")
    expect(out, "4 steps, eager: 2 kernels, memsets and copies a step",
           "something running 4.0 us, nothing running 0.9 us", "foo", "bar")
    # Without --steps, the command's own (the timeline is read, not recorded: the command only counts).
    for command in (["train_step", "--workload", "mlp", "--steps", "4"], ["train_step", "--steps=4"]):
        expect(run(lines, command=command), "4 steps, eager: 2 kernels, memsets and copies a step")
    expect(run(lines, command=["train_step"]), "1 step, eager: 8 kernels, memsets and copies a step")


def anonymous_namespaces_keep_their_names():
    # Two kernels of an anonymous namespace stay apart (their names cut at the argument list, not at
    # the namespace's parentheses); c++filt names them, where the machine has it.
    if not shutil.which("c++filt"):
        return
    lines = ["kernel\t0\t1000\t1\t0\t_ZN6tandem12_GLOBAL__N_16updateEPf",
             "kernel\t2000\t3000\t1\t0\t_ZN6tandem12_GLOBAL__N_14normEPf"]
    expect(run(lines), "<unnamed>::update", "<unnamed>::norm")


graph_replays()
eager_steps()
anonymous_namespaces_keep_their_names()
print("kernel_timeline_test: passed")
