#!/usr/bin/env python3
"""DDP scaling study: runs bench/train_step on 1 GPU and under `mpirun -np N` over a grid of DDP
settings, collects every run's JSON into one results file, records a Chrome-trace timeline of one
setting, and plots step time and exposed communication per setting.

The grid, on each GPU count above 1 (the batch per GPU stays fixed, so ideal scaling keeps the
1-GPU step time):
  - bucket size 1, 5, 25, 100 MB and one bucket, for each gradient communication dtype (f32, bf16),
    with overlap on;
  - overlap off (every bucket launched after backward) at 25 MB, for each dtype.
The default setting is 25 MB, the gradients' own dtype, overlap on; its timeline is recorded on
the largest GPU count.

    python3 bench/scaling_study.py --build build-gpu --gpus 1,2 --workload gpt2 --out study
    python3 bench/scaling_study.py plot study/results.json --out study/study.png

Without matplotlib the study still writes results.json and prints the command that draws it.
Running as root under Open MPI: --allow-run-as-root (or TANDEM_MPIRUN_AS_ROOT=1).
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time

BUCKETS = ["1", "5", "25", "100", "one"]
ONE_BUCKET_MB = 1e6  # larger than any model: every gradient in one bucket
DEFAULT_BUCKET = "25"
# The dtype gradients have under each precision, i.e. what DDP sends when told nothing.
GRADIENT_DTYPE = {"f32": "f32", "tf32": "f32", "bf16": "bf16", "fp16": "same"}


def setting_label(bucket, dtype, overlap):
    size = "one bucket" if bucket == "one" else f"{bucket}MB"
    return f"{size} {dtype}" + ("" if overlap else " no-overlap")


def slug(text):
    return text.replace(" ", "_")


def grid(buckets, dtypes, precision):
    """The DDP settings of one GPU count, in plotting order: (bucket, dtype, overlap)."""
    settings = []
    for dtype in dtypes:
        settings += [(bucket, dtype, True) for bucket in buckets]
        settings.append((DEFAULT_BUCKET, dtype, False))
    default_dtype = GRADIENT_DTYPE[precision]
    if default_dtype not in dtypes:  # fp16: gradients travel in f16 unless told otherwise
        settings += [(DEFAULT_BUCKET, default_dtype, True), (DEFAULT_BUCKET, default_dtype, False)]
    seen, unique = set(), []
    for s in settings:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


def train_step_args(args, json_path):
    cmd = ["--workload", args.workload, "--precision", args.precision, "--json", json_path]
    for flag, value in (("--device", args.device), ("--batch", args.batch), ("--steps", args.steps),
                        ("--warmup", args.warmup), ("--seq-len", args.seq_len)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def ddp_args(bucket, dtype, overlap):
    mb = ONE_BUCKET_MB if bucket == "one" else float(bucket)
    # The first bucket is 1 MB by default (communication starts early); "one bucket" means all.
    cmd = ["--bucket-mb", f"{mb:g}", "--comm-dtype", dtype]
    if bucket == "one":
        cmd += ["--first-bucket-mb", f"{mb:g}"]
    if not overlap:
        cmd.append("--no-overlap")
    return cmd


def mpirun_prefix(args, gpus):
    return [args.mpirun, "-np", str(gpus), "--bind-to", "none"] + shlex.split(args.mpirun_args)


def run_env(args):
    env = dict(os.environ)
    if args.allow_run_as_root:  # Open MPI refuses root unless both are set
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def read_result(json_path, stdout):
    try:
        with open(json_path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    for line in reversed(stdout.strip().splitlines()):  # train_step prints the JSON last
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def run_one(args, gpus, setting, out_dir, trace_path):
    bucket, dtype, overlap = setting if setting else (None, None, None)
    name = f"{gpus}gpu" + (f"_{slug(setting_label(*setting))}" if setting else "")
    json_path = os.path.join(out_dir, "runs", name + ".json")
    log_path = os.path.join(out_dir, "runs", name + ".log")
    cmd = ([] if gpus == 1 else mpirun_prefix(args, gpus)) + [args.binary] + train_step_args(args, json_path)
    if setting:
        cmd += ddp_args(bucket, dtype, overlap)
    if trace_path:
        cmd += ["--trace", trace_path]
    print(f"scaling_study: {name}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    if os.path.exists(json_path):
        os.remove(json_path)
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=run_env(args))
        status, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        status = "timeout"
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    with open(log_path, "w") as f:
        f.write(f"$ {' '.join(shlex.quote(c) for c in cmd)}\n{stdout}\n{stderr}")
    result = read_result(json_path, stdout) if status == 0 else None
    ddp = (result or {}).get("ddp") or {}
    run = {
        "gpus": gpus,
        "setting": setting_label(*setting) if setting else "1 GPU",
        "bucket": bucket,
        "comm_dtype": dtype,
        "overlap": overlap,
        "ok": result is not None,
        "step_ms": (result or {}).get("step_ms_median"),
        "exposed_ms": ddp.get("exposed_ms", 0.0 if gpus == 1 else None),
        "comm_ms": ddp.get("comm_ms"),
        "hidden_fraction": ddp.get("hidden_fraction"),
        "buckets": ddp.get("buckets"),
        "bytes": ddp.get("bytes"),
        "seconds": round(time.time() - start, 1),
        "command": cmd,
        "log": os.path.relpath(log_path, out_dir),
        "trace": os.path.relpath(trace_path, out_dir) if trace_path and result is not None else None,
        "result": result,
    }
    if not run["ok"]:
        tail = "\n".join((stderr or stdout).strip().splitlines()[-5:])
        print(f"scaling_study: {name} FAILED ({status}); see {log_path}\n{tail}", file=sys.stderr, flush=True)
    return run


def print_table(results):
    runs = results["runs"]
    base = {r["gpus"]: r for r in runs if r["gpus"] == 1 and r["ok"]}.get(1)
    print(f"{'GPUs':>4} {'setting':24} {'step ms':>9} {'exposed ms':>10} {'comm ms':>9} {'hidden':>7} "
          f"{'buckets':>7} {'efficiency':>10}")
    for r in runs:
        if not r["ok"]:
            print(f"{r['gpus']:>4} {r['setting']:24} FAILED ({r['log']})")
            continue
        eff = f"{base['step_ms'] / r['step_ms']:.1%}" if base else "-"
        def num(value, fmt):
            width = int(fmt.split(".")[0].rstrip("d") or 0)
            return format(value, fmt) if value is not None else "-".rjust(width)
        print(f"{r['gpus']:>4} {r['setting']:24} {r['step_ms']:9.2f} {num(r['exposed_ms'], '10.2f')} "
              f"{num(r['comm_ms'], '9.2f')} {num(r['hidden_fraction'], '7.2f')} {num(r['buckets'], '7d')} {eff:>10}")


def plot(results, png_path):
    """Step time per setting as stacked bars (compute below, exposed communication on top), one
    panel per GPU count, the 1-GPU step time as a dashed line and the scaling efficiency above each
    bar. Returns False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = [r for r in results["runs"] if r["ok"]]
    base = next((r for r in runs if r["gpus"] == 1), None)
    counts = sorted({r["gpus"] for r in runs if r["gpus"] > 1}) or ([1] if base else [])
    if not counts:
        raise SystemExit("scaling_study: no successful run to plot")
    width = max(6.0, 0.7 * max(sum(1 for r in runs if r["gpus"] == n) for n in counts) + 2)
    fig, axes = plt.subplots(len(counts), 1, figsize=(width, 4.2 * len(counts)), squeeze=False)
    for ax, n in zip(axes[:, 0], counts):
        panel = [r for r in runs if r["gpus"] == n]
        labels = [r["setting"] for r in panel]
        steps = [r["step_ms"] for r in panel]
        exposed = [min(r["exposed_ms"] or 0.0, r["step_ms"]) for r in panel]
        xs = range(len(panel))
        ax.bar(xs, [s - e for s, e in zip(steps, exposed)], color="#4c72b0", label="compute (step - exposed)")
        ax.bar(xs, exposed, bottom=[s - e for s, e in zip(steps, exposed)], color="#dd8452",
               label="exposed communication")
        if base and n > 1:
            ax.axhline(base["step_ms"], color="black", linestyle="--", linewidth=1,
                       label=f"1 GPU: {base['step_ms']:.1f} ms (ideal)")
            for x, s in zip(xs, steps):
                ax.annotate(f"{base['step_ms'] / s:.0%}", (x, s), ha="center", va="bottom", fontsize=8,
                            xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per step (median)")
        top = max(steps + ([base["step_ms"]] if base else []))
        ax.set_ylim(0, top * 1.15)
        ax.set_title(f"{results['workload']} {results['precision']}, {n} GPU{'s' if n > 1 else ''}, "
                     f"batch {results.get('batch_per_gpu', '?')} per GPU"
                     + ("  (labels: scaling efficiency = 1-GPU step / step)" if base and n > 1 else ""),
                     fontsize=10)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return True


def plot_or_explain(results, results_path, png_path):
    if plot(results, png_path):
        print(f"scaling_study: plot written to {png_path}")
    else:
        print(f"scaling_study: matplotlib is not installed, so no plot was drawn. The results are in "
              f"{results_path}; on any machine with matplotlib (pip install matplotlib):\n"
              f"  python3 {sys.argv[0]} plot {results_path} --out {png_path}")


def load_earlier(out_dir, args):
    """The successful runs of results.json in out_dir, by (gpus, setting), when made with the same
    workload, precision and batch."""
    try:
        with open(os.path.join(out_dir, "results.json")) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return {}
    same = (earlier.get("workload") == args.workload and earlier.get("precision") == args.precision
            and (args.batch is None or earlier.get("batch_per_gpu") == args.batch))
    if not same:
        print("scaling_study: --resume: the earlier study used another workload, precision or batch; running all")
        return {}
    return {(r["gpus"], r["setting"]): r for r in earlier.get("runs", []) if r.get("ok")}


def parse_list(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def main_run(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(prog="scaling_study.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(os.path.dirname(here), "build"),
                        help="build folder holding bench/train_step (default: the repository's build/)")
    parser.add_argument("--binary", help="train_step to run (default: BUILD/bench/train_step)")
    parser.add_argument("--gpus", default="1,2", help="GPU counts (ranks), e.g. 1,2,4; 1 is the reference")
    parser.add_argument("--workload", default="gpt2")
    parser.add_argument("--precision", default="bf16", choices=sorted(GRADIENT_DTYPE))
    parser.add_argument("--device", choices=["cuda", "cpu"], help="train_step's --device (default: its own)")
    parser.add_argument("--batch", type=int, help="per GPU (default: the workload's)")
    parser.add_argument("--seq-len", type=int, help="gpt2: tokens per sequence (default: 1024)")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: train_step's)")
    parser.add_argument("--warmup", type=int, help="warm-up steps per run (default: train_step's)")
    parser.add_argument("--buckets", default=",".join(BUCKETS), help="bucket sizes in MB; 'one': a single bucket")
    parser.add_argument("--dtypes", default="f32,bf16", help="gradient communication dtypes: f32, bf16, same")
    parser.add_argument("--trace-setting", help="setting whose timeline to record on the largest GPU count "
                        f"(a label as in the table, e.g. '25MB bf16'; default: {DEFAULT_BUCKET}MB, the gradients' "
                        "dtype, overlap on); 'none' records none")
    parser.add_argument("--out", default="scaling_study", help="output folder (results.json, study.png, traces, logs)")
    parser.add_argument("--mpirun", default=os.environ.get("TANDEM_MPIRUN", "mpirun"), help="mpirun to use")
    parser.add_argument("--mpirun-args", default=os.environ.get("TANDEM_MPIRUN_ARGS", ""),
                        help="extra mpirun flags, e.g. '--oversubscribe' (env TANDEM_MPIRUN_ARGS); "
                             "'--bind-to none' is always passed")
    parser.add_argument("--allow-run-as-root", action="store_true",
                        default=os.environ.get("TANDEM_MPIRUN_AS_ROOT", "") not in ("", "0"),
                        help="let Open MPI run as root (sets OMPI_ALLOW_RUN_AS_ROOT{,_CONFIRM}=1; env "
                             "TANDEM_MPIRUN_AS_ROOT=1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--resume", action="store_true",
                        help="keep the successful runs of an earlier study in --out with the same workload, "
                             "precision and batch, run only the rest, and keep the earlier runs outside this grid "
                             "too (a study split over several commands)")
    args = parser.parse_args(argv)

    args.binary = args.binary or os.path.join(args.build, "bench", "train_step")
    if not os.access(args.binary, os.X_OK):
        parser.error(f"{args.binary} is not an executable train_step: build it (cmake --build BUILD --target "
                     "train_step) or pass --build/--binary")
    gpus = sorted({int(n) for n in parse_list(args.gpus)})
    if not gpus or gpus[0] < 1:
        parser.error(f"--gpus {args.gpus}: expected positive counts such as 1,2,4")
    buckets = parse_list(args.buckets)
    for b in buckets:
        if b != "one":
            try:
                if float(b) <= 0:
                    raise ValueError
            except ValueError:
                parser.error(f"--buckets: '{b}' is neither a positive size in MB nor 'one'")
    dtypes = parse_list(args.dtypes)
    for d in dtypes:
        if d not in ("f32", "bf16", "same"):
            parser.error(f"--dtypes: '{d}': expected f32, bf16 or same")

    settings = grid(buckets, dtypes, args.precision)
    labels = [setting_label(*s) for s in settings]
    default_label = setting_label(DEFAULT_BUCKET, GRADIENT_DTYPE[args.precision], True)
    trace_label = args.trace_setting or (default_label if default_label in labels else labels[0])
    if trace_label != "none" and max(gpus) > 1 and trace_label not in labels:
        parser.error(f"--trace-setting '{trace_label}' is not in the grid: {', '.join(labels)}")

    out_dir = os.path.abspath(args.out)
    os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
    results = {
        "study": "tandem DDP scaling",
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "workload": args.workload,
        "precision": args.precision,
        "batch_per_gpu": args.batch,
        "device": args.device,
        "gpus": gpus,
        "binary": args.binary,
        "runs": [],
        "traces": [],
    }
    results_path = os.path.join(out_dir, "results.json")
    earlier = load_earlier(out_dir, args) if args.resume else {}
    for n in gpus:
        for setting in [None] if n == 1 else settings:
            label = setting_label(*setting) if setting else "1 GPU"
            if (n, label) in earlier:
                print(f"scaling_study: {n} GPU(s) {label}: kept from the earlier study")
                run = earlier[(n, label)]
                results["runs"].append(run)
                if run["trace"]:
                    results["traces"].append({"gpus": n, "setting": label, "path": run["trace"]})
                if results["batch_per_gpu"] is None and run["result"]:
                    results["batch_per_gpu"] = run["result"].get("batch")
                continue
            traced = trace_label != "none" and n == max(gpus) and (
                (setting is None and n == 1) or (setting and setting_label(*setting) == trace_label))
            trace_path = (os.path.join(out_dir, f"trace_{n}gpu" + (f"_{slug(trace_label)}" if setting else "")
                                       + ".json") if traced else None)
            run = run_one(args, n, setting, out_dir, trace_path)
            if results["batch_per_gpu"] is None and run["result"]:
                results["batch_per_gpu"] = run["result"].get("batch")
            results["runs"].append(run)
            if run["trace"]:
                results["traces"].append({"gpus": n, "setting": run["setting"], "path": run["trace"]})
            with open(results_path, "w") as f:  # after every run, so an interrupted study keeps its points
                json.dump(results, f, indent=1)

    visited = {(r["gpus"], r["setting"]) for r in results["runs"]}
    for key, run in earlier.items():  # --resume: runs of the earlier grid that this one left out stay
        if key not in visited:
            results["runs"].append(run)
            if run["trace"]:
                results["traces"].append({"gpus": run["gpus"], "setting": run["setting"], "path": run["trace"]})
    results["runs"].sort(key=lambda r: r["gpus"])  # stable: grid order within a GPU count
    with open(results_path, "w") as f:
        json.dump(results, f, indent=1)
    print_table(results)
    for t in results["traces"]:
        print(f"scaling_study: timeline of {t['setting']} on {t['gpus']} GPU(s): {os.path.join(out_dir, t['path'])} "
              "(open in ui.perfetto.dev)")
    plot_or_explain(results, results_path, os.path.join(out_dir, "study.png"))
    failed = sum(1 for r in results["runs"] if not r["ok"])
    if failed:
        print(f"scaling_study: {failed} of {len(results['runs'])} runs failed", file=sys.stderr)
    return 1 if failed else 0


def main_plot(argv):
    parser = argparse.ArgumentParser(prog="scaling_study.py plot",
                                     description="Draw the plot of a finished study from its results.json")
    parser.add_argument("results", help="results.json written by the study")
    parser.add_argument("--out", help="PNG to write (default: study.png beside the results)")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    png = args.out or os.path.join(os.path.dirname(os.path.abspath(args.results)), "study.png")
    print_table(results)
    if not plot(results, png):
        print("scaling_study: plotting needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 1
    print(f"scaling_study: plot written to {png}")
    return 0


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["plot"]:
        return main_plot(argv[1:])
    return main_run(argv[1:] if argv[:1] == ["run"] else argv)


if __name__ == "__main__":
    sys.exit(main())
