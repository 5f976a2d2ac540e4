#!/usr/bin/env python3
"""Reads the flight recorders that tandem's process groups write when a collective fails or times
out, or the process gets SIGTERM/SIGINT (InitOptions::dump_dir or $TANDEM_DIST_DUMP_DIR:
rank<R>-<backend>.json, one per rank and group), and says which rank is behind or missing at which
collective, and where ranks issued different collectives.

Usage: scripts/dist_analyze.py DUMP_DIR
Exit status: 0 when the dumps were read (whatever they say), 1 when there were none.
"""
import glob
import json
import os
import re
import sys


def load(directory):
    groups = {}  # backend -> {rank: dump}
    for path in sorted(glob.glob(os.path.join(directory, "rank*-*.json"))):
        match = re.match(r"rank(\d+)-(\w+)\.json$", os.path.basename(path))
        if not match:
            continue
        with open(path) as f:
            try:
                dump = json.load(f)
            except json.JSONDecodeError as e:
                print(f"{path}: unreadable ({e}); skipped")
                continue
        groups.setdefault(match.group(2), {})[int(match.group(1))] = dump
    return groups


def first_unfinished(dump):
    """The oldest entry that did not complete, or None."""
    for entry in dump["entries"]:
        if entry["state"] != "completed":
            return entry
    return None


def last_completed(dump):
    done = [e["seq"] for e in dump["entries"] if e["state"] == "completed"]
    return max(done) if done else 0


def analyze(backend, dumps):
    size = max(d["world_size"] for d in dumps.values())
    print(f"== {backend} group: {size} rank(s), flight recorders from rank(s) {', '.join(map(str, sorted(dumps)))}")
    for rank in sorted(dumps):
        d = dumps[rank]
        stuck = first_unfinished(d)
        where = "every collective completed"
        if stuck is not None:
            age = d["dumped_at"] - stuck["queued_at"]
            where = f"waits in {stuck['describe']} ({stuck['state']}, issued {age:.1f} s before the dump)"
        print(f"rank {rank}: issued {d['last_seq']} collective(s), completed up to #{last_completed(d)}; {where}; "
              f"dumped because: {d['reason']}")

    # Ranks that issued different collectives at the same sequence number.
    by_seq = {}
    for rank, d in dumps.items():
        for e in d["entries"]:
            by_seq.setdefault(e["seq"], {})[rank] = e
    for seq in sorted(by_seq):
        seen = by_seq[seq]
        if len({(e["op"], e["label"], e["count"], e["dtype"]) for e in seen.values()}) > 1:
            parts = [f"rank {r} issued {seen[r]['describe']}" for r in sorted(seen)]
            print(f"verdict: ranks issued different collectives at #{seq}: " + "; ".join(parts))
            return

    waiting = {r: first_unfinished(d) for r, d in dumps.items() if first_unfinished(d) is not None}
    if not waiting:
        missing = [r for r in range(size) if r not in dumps]
        print("verdict: no rank with a flight recorder waits on a collective" +
              (f"; rank(s) {', '.join(map(str, missing))} wrote none" if missing else ""))
        return
    # The collective the waiting ranks are stuck in: the earliest of them.
    seq = min(e["seq"] for e in waiting.values())
    entry = next(e for e in waiting.values() if e["seq"] == seq)
    waiters = sorted(r for r, e in waiting.items() if e["seq"] == seq)
    culprits = []
    for r in range(size):
        if r in waiters:
            continue
        if r not in dumps:
            culprits.append(f"rank {r} never joined {entry['describe']} and wrote no flight recorder "
                            f"(stopped, killed, or hung outside tandem's collectives)")
        elif dumps[r]["last_seq"] < seq:
            culprits.append(f"rank {r} is behind: it issued only up to #{dumps[r]['last_seq']} and never joined "
                            f"{entry['describe']}")
    who = ", ".join(map(str, waiters))
    if culprits:
        print(f"verdict: rank(s) {who} wait in {entry['describe']}; " + "; ".join(culprits))
    else:
        print(f"verdict: rank(s) {who} wait in {entry['describe']}, which every rank issued: a network or "
              f"device problem rather than a missing rank")


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip())
        return 2
    groups = load(sys.argv[1])
    if not groups:
        print(f"no flight recorders (rank*-*.json) in {sys.argv[1]}")
        return 1
    for backend in sorted(groups):
        analyze(backend, groups[backend])
    return 0


if __name__ == "__main__":
    sys.exit(main())
