#!/usr/bin/env python3
"""Turn a Chrome trace of one training step into a step profile for bench/scaling_model.

Commits older than `train_step --profile` can still profile their step: their `train_step --trace`
wrote the forward, backward and optimizer spans (and, under DDP, when each bucket was launched).
The parameters and the shape of the backward pass (when each gradient became ready, relative to
the others) come from a profile of the same workload taken with `train_step --profile` at any
commit with the same model; the trace gives the absolute times:

    python3 bench/trace_to_profile.py old_trace.json --shape new_profile.json --commit f5a8258 \
        --step-ms 22.93 --out profile.json

- The trace's rank 0 gives forward, backward (less its wait for gradients) and optimizer.
- A DDP trace also gives, for each bucket, the time its last gradient arrived (its launch mark and
  how many gradients had arrived): the shape is stretched piecewise to pass through those points.
- --step-ms (the 1-GPU step measured with that commit) scales the compute spans to it, so a
  trace taken on several GPUs, where NCCL slowed the compute down, gives a 1-GPU profile.
- Without a trace (--no-trace), --forward-share splits --step-ms less the shape's optimizer share
  between forward and backward: a stated assumption, for profiles no GPU has measured yet.
"""
import argparse
import bisect
import json
import sys


def spans_of_rank0(trace):
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("pid") == 0 and e.get("ph") in ("X", "i")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", help="Chrome trace written by train_step --trace")
    ap.add_argument("--shape", required=True, help="a step profile of the same workload (train_step --profile)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", required=True, help="the commit that produced the trace")
    ap.add_argument("--step-ms", type=float, help="the 1-GPU step measured with that commit (median ms)")
    ap.add_argument("--no-trace", action="store_true", help="no trace: --step-ms and --forward-share only")
    ap.add_argument("--forward-share", type=float, default=1 / 3,
                    help="--no-trace: forward's share of forward + backward (default 1/3)")
    ap.add_argument("--optimizer-ms", type=float, help="--no-trace: the optimizer's ms (default: the shape's share)")
    ap.add_argument("--source", default="", help="words on where the figures come from")
    args = ap.parse_args()

    shape = json.load(open(args.shape))
    grads = shape["gradients"]
    rel = [g["ready_ms"] / shape["backward_ms"] for g in grads]  # 0..1 within backward
    out = dict(shape)
    out["commit"] = args.commit

    if args.no_trace:
        if args.step_ms is None:
            sys.exit("trace_to_profile: --no-trace needs --step-ms")
        opt = args.optimizer_ms
        if opt is None:
            opt = args.step_ms * shape["optimizer_ms"] / shape["step_ms"]
        fb = args.step_ms - opt
        out.update(step_ms=args.step_ms, forward_ms=fb * args.forward_share, backward_ms=fb * (1 - args.forward_share),
                   optimizer_ms=opt)
        out["gradients"] = [dict(g, ready_ms=r * out["backward_ms"]) for g, r in zip(grads, rel)]
        out["source"] = args.source or (f"derived: 1-GPU step {args.step_ms} ms, optimizer {opt:.3f} ms, forward share "
                                        f"{args.forward_share:.3f} assumed; ready-time shape from {shape.get('device')} "
                                        f"profile at {shape.get('commit')}")
    else:
        if not args.trace:
            sys.exit("trace_to_profile: give a trace, or --no-trace")
        events = spans_of_rank0(json.load(open(args.trace)))
        total = lambda name: sum(e["dur"] for e in events if e["ph"] == "X" and e["name"] == name) / 1e3
        forward, optimizer = total("forward + loss"), total("optimizer")
        wait = total("wait for gradients") + total("wait for the last bucket")
        backward_span = next(e for e in events if e["ph"] == "X" and e["name"] == "backward")
        b0 = backward_span["ts"]
        backward = backward_span["dur"] / 1e3 - total("wait for gradients")
        optimizer -= total("wait for the last bucket")
        step = total("step")
        # Known points (fraction of gradients, ms since backward began) from the bucket launches.
        points = [(0.0, 0.0)]
        for e in events:
            args_ = e.get("args", {})
            if e["ph"] == "X" and e["name"].startswith("all_reduce bucket") and "launched_after_gradients" in args_:
                k = int(args_["launched_after_gradients"])
                t = (args_.get("launched_us", e["ts"]) - b0) / 1e3
                if 0 < k < len(grads) and 0 <= t <= backward:
                    points.append((rel[k - 1], t))
        points.append((1.0, backward))
        points.sort()
        xs = [p[0] for p in points]

        def stretch(r):  # piecewise linear through the known points
            i = max(1, min(len(points) - 1, bisect.bisect_left(xs, r)))
            (x0, y0), (x1, y1) = points[i - 1], points[i]
            return y0 if x1 <= x0 else y0 + (r - x0) / (x1 - x0) * (y1 - y0)

        ready = [stretch(r) for r in rel]
        scale = 1.0
        if args.step_ms is not None:
            other = max(0.0, step - wait - forward - backward - optimizer)
            scale = (args.step_ms - other) / (forward + backward + optimizer)
        out.update(step_ms=args.step_ms if args.step_ms is not None else step - wait, forward_ms=forward * scale,
                   backward_ms=backward * scale, optimizer_ms=optimizer * scale)
        out["gradients"] = [dict(g, ready_ms=min(t, backward) * scale) for g, t in zip(grads, ready)]
        out["source"] = args.source or (f"trace {args.trace} ({len(points) - 2} bucket launches), scaled by {scale:.3f} "
                                        f"to the 1-GPU step; shape from {shape.get('device')} profile at "
                                        f"{shape.get('commit')}")
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"{args.out}: step {out['step_ms']:.3f} ms, forward {out['forward_ms']:.3f}, backward "
          f"{out['backward_ms']:.3f}, optimizer {out['optimizer_ms']:.3f}, {len(out['gradients'])} gradients")


if __name__ == "__main__":
    main()
