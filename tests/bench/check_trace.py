#!/usr/bin/env python3
"""Runs a command that writes a Chrome trace (train_step --trace), then checks the trace: it parses,
has one process per rank named "rank N", each with a "compute" and a "communication" thread, the
step's phases on the compute track and the buckets' all-reduces (index, bytes, dtype) on the
communication track, all inside the step.

    check_trace.py --ranks 2 out.json -- mpirun -np 2 train_step ... --trace out.json
"""
import argparse
import json
import os
import subprocess
import sys


def fail(message):
    print(f"check_trace: {message}", file=sys.stderr)
    sys.exit(1)


def check(trace_path, ranks):
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace.get("traceEvents")
    if not isinstance(events, list) or not events:
        fail(f"{trace_path}: no traceEvents list")
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    expected = {r: f"rank {r}" for r in range(ranks)}
    if processes != expected:
        fail(f"processes {processes}, expected {expected}")
    for rank in range(ranks):
        threads = {e["tid"]: e["args"]["name"] for e in events
                   if e.get("ph") == "M" and e["name"] == "thread_name" and e["pid"] == rank}
        names = set(threads.values())
        if not {"compute", "communication"} <= names or any(
                n != "compute" and not n.startswith("communication") for n in names):
            fail(f"rank {rank}: threads {threads}, expected compute and communication (MPI: more lanes of it)")
        compute_tid = next(t for t, n in threads.items() if n == "compute")
        comm_tids = {t for t, n in threads.items() if n.startswith("communication")}
        spans = [e for e in events if e.get("ph") == "X" and e["pid"] == rank]
        for e in spans:
            if not (isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0):
                fail(f"rank {rank}: bad ts/dur in {e}")
        compute = {e["name"]: e for e in spans if e["tid"] == compute_tid}
        comm = [e for e in spans if e["tid"] in comm_tids]
        for name in ("step", "zero_grad", "forward + loss", "backward", "optimizer"):
            if name not in compute:
                fail(f"rank {rank}: no '{name}' span on the compute track (has {sorted(compute)})")
        if ranks > 1:
            if "wait for gradients" not in compute:
                fail(f"rank {rank}: no 'wait for gradients' span on the compute track")
            if not comm:
                fail(f"rank {rank}: no all-reduce on the communication track")
            for e in comm:
                for key in ("bucket", "bytes", "dtype", "launched_us"):
                    if key not in e.get("args", {}):
                        fail(f"rank {rank}: all-reduce span without '{key}': {e}")
            buckets = sorted(e["args"]["bucket"] for e in comm)
            if buckets != list(range(len(comm))):
                fail(f"rank {rank}: buckets {buckets}, expected each of 0..{len(comm) - 1} once")
            launches = [e["args"]["launched_us"] for e in sorted(comm, key=lambda e: e["args"]["bucket"])]
            if launches != sorted(launches):
                fail(f"rank {rank}: buckets were not launched in bucket order: {launches}")
            backward, wait = compute["backward"], compute["wait for gradients"]
            slack = 50.0  # us: host clock readings of nested spans
            if wait["ts"] + slack < backward["ts"] or wait["ts"] + wait["dur"] > backward["ts"] + backward["dur"] + slack:
                fail(f"rank {rank}: the wait for gradients is not inside backward")
        step = compute["step"]
        for e in spans:
            if e["ts"] + 1.0 < step["ts"] or e["ts"] + e["dur"] > step["ts"] + step["dur"] + 1.0:
                fail(f"rank {rank}: span '{e['name']}' lies outside the step")
    print(f"check_trace: {trace_path}: {ranks} ranks, compute and communication tracks, "
          f"{sum(1 for e in events if e.get('ph') == 'X')} spans: ok")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="the trace file the command writes")
    parser.add_argument("--ranks", type=int, default=2, help="ranks the trace must hold")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run first")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command:
        if os.path.exists(args.trace):
            os.remove(args.trace)
        status = subprocess.call(command)
        if status != 0:
            fail(f"the command exited with {status}: {' '.join(command)}")
    if not os.path.exists(args.trace):
        fail(f"{args.trace} was not written")
    check(args.trace, args.ranks)


if __name__ == "__main__":
    main()
