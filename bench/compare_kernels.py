"""Runs bench/gpu_kernels (tandem) and bench/reference/kernels.py (PyTorch) one after the other on
the same GPU and prints the side-by-side table: time, achieved bandwidth or rate, the fraction of
the device-to-device copy bandwidth measured in the same run, and tandem's speed relative to
PyTorch. Usage: python3 bench/compare_kernels.py BUILD_DIR [--json OUT.json]"""
import json
import pathlib
import subprocess
import sys


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["name"]: r for r in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}


def main():
    build = pathlib.Path(sys.argv[1])
    here = pathlib.Path(__file__).resolve().parent
    tandem = run([str(build / "bench" / "gpu_kernels")])
    torch = run([sys.executable, str(here / "reference" / "kernels.py")])
    copy_bw = tandem["copy_d2d_f32"]["gbps"]
    print(f"{'workload':40s} {'tandem ms':>10s} {'torch ms':>10s} {'tandem':>10s} {'torch':>10s} "
          f"{'of copy BW':>10s} {'speed vs torch':>14s}")
    for name, t in tandem.items():
        p = torch.get(name, {})
        unit = "gbps" if "gbps" in t else "tflops"
        frac = f"{t['gbps'] / copy_bw:.0%}" if unit == "gbps" else ""
        ratio = f"{p['ms'] / t['ms']:.2f}x" if p else ""
        print(f"{name:40s} {t['ms']:10.3f} {p.get('ms', float('nan')):10.3f} {t.get(unit, 0):9.1f}{unit[0].upper()} "
              f"{p.get(unit, 0):9.1f}{unit[0].upper()} {frac:>10s} {ratio:>14s}")
    if "--json" in sys.argv:
        pathlib.Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps({"tandem": tandem, "pytorch": torch}, indent=1))


if __name__ == "__main__":
    main()
