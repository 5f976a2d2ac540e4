"""Runs bench/gpu_kernels (tandem) and bench/reference/kernels.py (PyTorch) one after the other on
the same GPU and prints the side-by-side table: time, achieved bandwidth or rate, the fraction of
the device-to-device copy bandwidth measured in the same run, and tandem's speed relative to
PyTorch. Then one row per ResNet-18 convolution shape and direction: median per-call time (ms), device time alone (gpu), host time to issue a call (host),
and tandem's speed relative to PyTorch for ms and gpu (below 1.00x: tandem is slower).

Usage: python3 bench/compare_kernels.py BUILD_DIR [--json OUT.json] [--conv-only | --attention-only]
           [--runs N] [--log]
  --conv-only   only the convolutions (both sides)
  --attention-only   only GPT-2's attention, forward and forward + backward (both sides); in a
                     build with cuDNN's frontend, tandem's bf16 rows also come on its own flash
                     kernels (..._bf16_flash) and on cuDNN's (..._bf16_cudnn)
  --runs        run gpu_kernels N times (default 1): the convolution table once per run, to see
                run-to-run variation
  --log         TANDEM_CUDNN_LOG=1, and print tandem's cuDNN choices"""
import json
import os
import pathlib
import re
import subprocess
import sys


def run(cmd, env=None):
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    rows = {r["name"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    return rows, proc.stderr


def option(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def speed(torch_ms, tandem_ms):
    if torch_ms is None or tandem_ms is None or torch_ms <= 0 or tandem_ms <= 0:
        return ""
    return f"{torch_ms / tandem_ms:.2f}x"


def main_table(tandem, torch):
    copy_bw = tandem.get("copy_d2d_f32", {}).get("gbps")  # absent in an --attention-only run
    print(f"{'workload':40s} {'tandem ms':>10s} {'torch ms':>10s} {'tandem':>10s} {'torch':>10s} "
          f"{'of copy BW':>10s} {'speed vs torch':>14s}")
    for name, t in tandem.items():
        if name.startswith("conv_s"):
            continue
        # tandem's bf16 attention on one chosen kernel set, beside PyTorch's bf16 attention
        p = torch.get(re.sub(r"_(flash|cudnn)$", "", name), {})
        unit = "gbps" if "gbps" in t else "tflops"
        frac = f"{t['gbps'] / copy_bw:.0%}" if unit == "gbps" and copy_bw else ""
        ratio = f"{p['ms'] / t['ms']:.2f}x" if p else ""
        print(f"{name:40s} {t['ms']:10.3f} {p.get('ms', float('nan')):10.3f} {t.get(unit, 0):9.1f}{unit[0].upper()} "
              f"{p.get(unit, 0):9.1f}{unit[0].upper()} {frac:>10s} {ratio:>14s}")


def conv_table(label, tandem, torch):
    print()
    print(f"ResNet-18 convolutions, bf16 NCHW, tandem {label}")
    for suffix, mode in (("", "heuristics"), ("_benchmark", "benchmark mode")):
        names = [n for n in tandem if re.fullmatch(r"conv_s\d+_(fwd|bwd_data|bwd_filter)" + suffix, n)]
        if not names:
            continue
        print(f"  {mode}:")
        print(f"  {'#':>2s} {'shape':28s} {'direction':10s} {'tandem':>8s} {'torch':>8s} {'speed':>6s}  "
              f"{'gpu t':>8s} {'gpu p':>8s} {'speed':>6s}  {'host t':>7s} {'host p':>7s}")
        sums = {"t": 0.0, "p": 0.0, "tg": 0.0, "pg": 0.0, "th": 0.0, "ph": 0.0}
        for name in names:
            t, p = tandem[name], torch.get(name, {})
            index, direction = re.match(r"conv_s(\d+)_(fwd|bwd_data|bwd_filter)", name).groups()
            count = t.get("count", 1)
            tg, pg = t.get("gpu_ms", -1), p.get("gpu_ms", -1)
            sums["t"] += count * t["ms"]
            sums["p"] += count * p.get("ms", 0)
            sums["tg"] += count * max(tg, 0)
            sums["pg"] += count * max(pg, 0)
            sums["th"] += count * t.get("host_ms", 0)
            sums["ph"] += count * p.get("host_ms", 0)
            flag = " <" if p and t["ms"] > 1.1 * p["ms"] else ""

            def fmt(v, width=8):
                return f"{v:{width}.3f}" if v is not None and v >= 0 else f"{'n/a':>{width}s}"

            print(f"  {index:>2s} {t.get('shape', ''):28s} {direction:10s} {fmt(t['ms'])} {fmt(p.get('ms'))} "
                  f"{speed(p.get('ms'), t['ms']):>6s}  {fmt(tg)} {fmt(pg)} {speed(pg, tg):>6s}  "
                  f"{fmt(t.get('host_ms'), 7)} {fmt(p.get('host_ms'), 7)}{flag}")
        print(f"  {'':2s} {'sum, weighted by count':28s} {'':10s} {sums['t']:8.3f} {sums['p']:8.3f} "
              f"{speed(sums['p'], sums['t']):>6s}  {sums['tg']:8.3f} {sums['pg']:8.3f} {speed(sums['pg'], sums['tg']):>6s}  "
              f"{sums['th']:7.3f} {sums['ph']:7.3f}")
        total = "resnet18_convs_fwd_bwd_bf16" + suffix
        if total in tandem:
            p_ms = torch.get(total, {}).get("ms")
            print(f"  {'':2s} {'fwd+bwd step total':28s} {'':10s} {tandem[total]['ms']:8.3f} "
                  f"{p_ms if p_ms is not None else float('nan'):8.3f} {speed(p_ms, tandem[total]['ms']):>6s}")


def main():
    build = pathlib.Path(sys.argv[1])
    here = pathlib.Path(__file__).resolve().parent
    conv_only = "--conv-only" in sys.argv
    if "--attention-only" in sys.argv:
        torch, _ = run([sys.executable, str(here / "reference" / "kernels.py"), "--attention-only"])
        tandem, _ = run([str(build / "bench" / "gpu_kernels"), "--attention-only"])
        main_table(tandem, torch)
        if "--json" in sys.argv:
            pathlib.Path(option("--json")).write_text(json.dumps({"pytorch": torch, "tandem": tandem}, indent=1))
        return
    runs = int(option("--runs") or 1)
    extra = ["--conv-only"] if conv_only else []

    torch, _ = run([sys.executable, str(here / "reference" / "kernels.py")] + extra)
    results = {"pytorch": torch, "tandem_by_select": {}}
    v = torch.get("versions", {})
    print(f"PyTorch {v.get('torch')} with cuDNN {v.get('cudnn')} on {v.get('device')} "
          "(tandem's cuDNN version: the first line of --log)")
    for i in range(runs):
        env = dict(os.environ)
        if "--log" in sys.argv:
            env["TANDEM_CUDNN_LOG"] = "1"
        args = extra if (conv_only or i == 0) else ["--conv-only"]
        tandem, log = run([str(build / "bench" / "gpu_kernels")] + args, env)
        label = f"graph (run {i + 1})"
        results["tandem_by_select"][label] = tandem
        if i == 0:
            results["tandem"] = tandem  # the layout of earlier versions: the first run
        if i == 0 and not conv_only:
            main_table(tandem, torch)
        conv_table(label, tandem, torch)
        if "--log" in sys.argv:
            for line in log.splitlines():
                if line.startswith("[tandem cudnn"):
                    print("  " + line)
    if "--json" in sys.argv:
        pathlib.Path(option("--json")).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
