#!/usr/bin/env python3
"""Loss curves on real data with and without --compress (docs/results.md, "Compression").

Trains resnet-tiny on scikit-learn's digits (1797 8x8 images, converted at run time to the CIFAR-10
binary format that ``data='cifar10:DIR'`` reads: each image scaled to 32x32 by repeating pixels, its
16 grey levels spread over 0..255, the same in the three channels) and transformer-tiny on a real
text file (byte tokens; default: Debian's /usr/share/common-licenses/GPL-3), each with compress
none, bf16 and fp16 from the same seed, and writes every step's loss to ``curves.csv`` and a figure
to ``curves.png``. Under bf16 and fp16 the first step profiles (in full precision) and the others
run under plan none, which holds every compressible saved activation narrow; under none every step
runs plainly. Each step under a plan is checked against its predicted peaks.

Needs Debian's python3-sklearn and python3-matplotlib (scripts/install-deps.sh with
REGEN_WITH_CURVES=1) and the regen module:

    PYTHONPATH=build/python /usr/bin/python3 tools/compress_curves.py --out out/curves
"""
import argparse
import csv
import os
import sys
import time


def write_digits(folder):
    """scikit-learn's digits as one CIFAR-10 binary batch: label byte, then R, G, B planes."""
    from sklearn.datasets import load_digits
    d = load_digits()
    os.makedirs(folder, exist_ok=True)
    out = bytearray()
    for img, label in zip(d.images, d.target):
        grey = [[round(float(v) * 255 / 16) for v in row] for row in img]
        plane = bytearray()
        for r in range(32):
            for c in range(32):
                plane.append(grey[r // 4][c // 4])
        out.append(int(label))
        out += plane * 3
    with open(os.path.join(folder, "data_batch_1.bin"), "wb") as f:
        f.write(out)
    return len(d.target)


def train(regen, name, mode, steps, options):
    m = regen.Model(name, compress=mode, **options)
    t0 = time.time()
    results = m.train(steps, policy="none", profile_steps=1)
    wall = time.time() - t0
    plan = m.plan_in_use if mode != "none" else None
    # Under bf16/fp16 the first step profiled (train() returns the steps under the plan).
    losses = ([float("nan")] if mode != "none" else []) + [r.loss for r in results]
    exact = None
    if plan is not None:
        exact = all(r.peak_allocated == plan.peak_allocated and r.peak_reserved == plan.peak_reserved
                    for r in results)
    peak = max(r.peak_allocated for r in results)
    return dict(losses=losses[:steps], peak=peak, exact=exact, wall=wall,
                narrowed=plan.predicted.narrowed if plan else 0,
                compress_ms=plan.predicted.compress_ms if plan else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for curves.csv, curves.png, digits/")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import regen
    os.makedirs(args.out, exist_ok=True)
    n = write_digits(os.path.join(args.out, "digits"))
    print(f"digits: {n} images in {args.out}/digits/data_batch_1.bin")
    runs = {
        "resnet-tiny, digits": ("resnet-tiny", dict(
            batch=32, device="cpu", seed=0, lr=0.05, threads=args.threads,
            data="cifar10:" + os.path.join(args.out, "digits"))),
        "transformer-tiny, " + os.path.basename(args.text): ("transformer-tiny", dict(
            batch=32, device="cpu", seed=0, lr=0.05, optimizer="adamw", threads=args.threads,
            vocab=256, seq_len=64, dropout=0.1, data="text:" + args.text)),
    }
    table = []
    curves = {}
    for title, (name, options) in runs.items():
        for mode in ("none", "bf16", "fp16"):
            r = train(regen, name, mode, args.steps, options)
            curves[(title, mode)] = r["losses"]
            tail = [v for v in r["losses"][-25:]]
            table.append((title, mode, sum(tail) / len(tail), r))
            print(f"{title:40s} {mode:5s} mean loss of the last 25 steps {sum(tail) / len(tail):.4f}, "
                  f"peak {r['peak'] / 2**20:.2f} MiB, narrowed {r['narrowed']}, "
                  f"conversions {r['compress_ms']:.2f} ms/step predicted, exact {r['exact']}, "
                  f"{r['wall']:.0f} s", flush=True)
    with open(os.path.join(args.out, "curves.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "compress", "step", "loss"])
        for (title, mode), losses in curves.items():
            for i, v in enumerate(losses):
                w.writerow([title, mode, i + 1, v])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for col, title in enumerate(runs):
        base = curves[(title, "none")]
        ax, dx = axes[0][col], axes[1][col]
        for mode, style in (("none", "-"), ("bf16", "--"), ("fp16", ":")):
            ys = curves[(title, mode)]
            ax.plot(range(1, len(ys) + 1), ys, style, label=mode, linewidth=1)
            if mode != "none":
                dx.plot(range(1, len(ys) + 1), [a - b for a, b in zip(ys, base)], style,
                        label=mode, linewidth=1)
        ax.set_title(title)
        ax.set_ylabel("training loss")
        ax.legend()
        dx.axhline(0, color="grey", linewidth=0.5)
        dx.set_ylabel("loss - loss without compression")
        dx.set_xlabel("step")
        dx.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "curves.png"), dpi=110)
    print(f"wrote {args.out}/curves.csv and {args.out}/curves.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
