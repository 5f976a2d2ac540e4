#!/usr/bin/env python3
"""Draw the scaling model's predicted curves (bench/scaling_model --curves FILE) as a PNG:
one panel per workload, efficiency (1-GPU step / N-GPU step, batch per GPU fixed) against the
number of GPUs, one line per topology, solid for the planned buckets (--bucket-mb auto) and dashed
for DDP's default 25 MB cap.

    build/bench/scaling_model --curves curves.json
    python3 bench/scaling_plot.py curves.json --out curves.png
"""
import argparse
import json

NAMES = {"gpt2": "GPT-2 124M", "resnet18": "ResNet-18", "mlp": "MLP (58.7M)"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("curves")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = json.load(open(args.curves))["curves"]
    workloads = list(dict.fromkeys(c["workload"] for c in curves))
    topologies = list(dict.fromkeys(c["topology"] for c in curves))
    colors = dict(zip(topologies, ["tab:blue", "tab:orange", "tab:red", "tab:green", "tab:purple"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4.2), sharey=True)
    for ax, w in zip(axes, workloads):
        for c in curves:
            if c["workload"] != w:
                continue
            xs = [p["gpus"] for p in c["points"]]
            ys = [100 * p["efficiency"] for p in c["points"]]
            auto = c["buckets"] == "auto"
            ax.plot(xs, ys, "-" if auto else "--", color=colors[c["topology"]], marker="o" if auto else None,
                    markersize=3, label=f"{c['topology']}, {'planned buckets' if auto else '25 MB buckets'}")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 8, 64, 1024])
        ax.set_xticklabels(["1", "2", "8", "64", "1024"])
        ax.set_title(f"{NAMES.get(w, w)}, bf16, predicted")
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("scaling efficiency, %")
    axes[0].set_ylim(0, 102)
    axes[-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
