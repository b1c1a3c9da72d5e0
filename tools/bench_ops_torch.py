#!/usr/bin/python3
"""PyTorch reference for `regen bench ops`: times GEMM and conv2d forward, backward-data and
backward-filter on the same ResNet-152 layer shapes (batch 4, 224x224), f32, on the CPU.

Run with Debian's torch (1.13, oneDNN):  /usr/bin/python3 tools/bench_ops_torch.py --threads 2
With --regen FILE (the JSON of `regen bench ops --json FILE`) it also prints a markdown table
of both side by side with the ratio regen/PyTorch in GFLOP/s (>1: regen is faster).
The shape list must match kConvShapes in tools/cmd_bench_ops.cpp (the script checks names).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

# name, count in ResNet-152, N, C, H, W, K, R, S, stride, pad
CONV_SHAPES = [
    ("stem 7x7/2", 1, 4, 3, 224, 224, 64, 7, 7, 2, 3),
    ("s1 1x1 64>64", 1, 4, 64, 56, 56, 64, 1, 1, 1, 0),
    ("s1 3x3 64", 3, 4, 64, 56, 56, 64, 3, 3, 1, 1),
    ("s1 1x1 64>256", 4, 4, 64, 56, 56, 256, 1, 1, 1, 0),
    ("s1 1x1 256>64", 2, 4, 256, 56, 56, 64, 1, 1, 1, 0),
    ("s2 1x1 256>128 @56", 1, 4, 256, 56, 56, 128, 1, 1, 1, 0),
    ("s2 3x3/2 128", 1, 4, 128, 56, 56, 128, 3, 3, 2, 1),
    ("s2 1x1/2 256>512 ds", 1, 4, 256, 56, 56, 512, 1, 1, 2, 0),
    ("s2 1x1 128>512", 8, 4, 128, 28, 28, 512, 1, 1, 1, 0),
    ("s2 1x1 512>128", 7, 4, 512, 28, 28, 128, 1, 1, 1, 0),
    ("s2 3x3 128", 7, 4, 128, 28, 28, 128, 3, 3, 1, 1),
    ("s3 1x1 512>256 @28", 1, 4, 512, 28, 28, 256, 1, 1, 1, 0),
    ("s3 3x3/2 256", 1, 4, 256, 28, 28, 256, 3, 3, 2, 1),
    ("s3 1x1/2 512>1024 ds", 1, 4, 512, 28, 28, 1024, 1, 1, 2, 0),
    ("s3 1x1 256>1024", 36, 4, 256, 14, 14, 1024, 1, 1, 1, 0),
    ("s3 1x1 1024>256", 35, 4, 1024, 14, 14, 256, 1, 1, 1, 0),
    ("s3 3x3 256", 35, 4, 256, 14, 14, 256, 3, 3, 1, 1),
    ("s4 1x1 1024>512 @14", 1, 4, 1024, 14, 14, 512, 1, 1, 1, 0),
    ("s4 3x3/2 512", 1, 4, 512, 14, 14, 512, 3, 3, 2, 1),
    ("s4 1x1/2 1024>2048 ds", 1, 4, 1024, 14, 14, 2048, 1, 1, 2, 0),
    ("s4 1x1 512>2048", 3, 4, 512, 7, 7, 2048, 1, 1, 1, 0),
    ("s4 1x1 2048>512", 2, 4, 2048, 7, 7, 512, 1, 1, 1, 0),
    ("s4 3x3 512", 2, 4, 512, 7, 7, 512, 3, 3, 1, 1),
]
GEMM_SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (256, 3136, 64), (1024, 196, 256),
               (512, 49, 4608)]


def median_seconds(fn, repeats):
    fn()  # warm-up (oneDNN primitive creation, page faults)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(repeats):
    rows = []
    for m, n, k in GEMM_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        t = median_seconds(lambda: torch.mm(a, b), repeats)
        rows.append({"kind": "gemm", "name": f"gemm {m}x{n}x{k}", "seconds": t,
                     "gflops": 2.0 * m * n * k / t / 1e9})
    for name, _, n, c, h, w, k, r, s, stride, pad in CONV_SHAPES:
        x = torch.randn(n, c, h, w)
        wt = torch.randn(k, c, r, s) * 0.05
        y = F.conv2d(x, wt, None, stride, pad)
        dy = torch.randn_like(y)
        flops = 2.0 * n * k * y.shape[2] * y.shape[3] * c * r * s
        args = (dy, x, wt, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1)
        passes = {
            "forward": lambda: F.conv2d(x, wt, None, stride, pad),
            "backward_data": lambda: torch.ops.aten.convolution_backward(*args,
                                                                         [True, False, False]),
            "backward_filter": lambda: torch.ops.aten.convolution_backward(*args,
                                                                           [False, True, False]),
        }
        for kind, fn in passes.items():
            t = median_seconds(fn, repeats)
            rows.append({"kind": kind, "name": name, "seconds": t, "gflops": flops / t / 1e9})
    return rows


def counts_of(row):
    """How often a row runs in one ResNet-152 training step (0: not part of the step)."""
    if row["kind"] == "gemm":
        return 0
    if row["kind"] == "backward_data" and row["name"].startswith("stem"):
        return 0  # a training step never computes the gradient of the input images
    return {s[0]: s[1] for s in CONV_SHAPES}[row["name"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--regen", help="JSON written by `regen bench ops --json`")
    ap.add_argument("--json", help="write PyTorch's rows here")
    ap.add_argument("--load", help="compare rows written earlier with --json instead of measuring")
    args = ap.parse_args()
    if args.load:
        with open(args.load) as f:
            saved = json.load(f)
        rows = saved["rows"]
        print(f"# PyTorch {saved.get('version', '?')}, {saved['threads']} threads, f32, median of "
              f"{saved.get('repeats', '?')} (loaded from {args.load})")
    else:
        torch.set_num_threads(args.threads)
        with torch.no_grad():
            rows = measure(args.repeats)
        print(f"# PyTorch {torch.__version__}, {torch.get_num_threads()} threads, f32, median of "
              f"{args.repeats}")
    if args.json and not args.load:
        with open(args.json, "w") as f:
            json.dump({"version": torch.__version__, "threads": torch.get_num_threads(),
                       "repeats": args.repeats, "rows": rows}, f, indent=1)
    if not args.regen:
        total = sum(counts_of(r) * r["seconds"] for r in rows)
        for r in rows:
            print(f"{r['kind']:16s} {r['name']:24s} {r['seconds'] * 1e3:9.3f} ms "
                  f"{r['gflops']:8.1f} GFLOP/s")
        print(f"# all ResNet-152 convolutions of one training step: {total:.3f} s")
        return
    with open(args.regen) as f:
        regen = {(r["kind"], r["name"]): r for r in json.load(f)["rows"]}
    print("| pass | shape | per step | regen ms | regen GFLOP/s | PyTorch ms | PyTorch GFLOP/s "
          "| ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    total = {"regen": 0.0, "torch": 0.0}
    for r in rows:
        g = regen.get((r["kind"], r["name"]))
        if g is None:
            raise SystemExit(f"regen JSON has no row {r['kind']} {r['name']}")
        print(f"| {r['kind']} | {r['name']} | {counts_of(r)} | {g['seconds'] * 1e3:.2f} | "
              f"{g['gflops']:.0f} | "
              f"{r['seconds'] * 1e3:.2f} | {r['gflops']:.0f} | {g['gflops'] / r['gflops']:.2f} |")
        total["regen"] += counts_of(r) * g["seconds"]
        total["torch"] += counts_of(r) * r["seconds"]
    print(f"\nAll ResNet-152 convolutions of one training step (shape counts as in the network): "
          f"regen {total['regen']:.3f} s, PyTorch {total['torch']:.3f} s, "
          f"ratio (PyTorch time / regen time) {total['torch'] / total['regen']:.2f}")


if __name__ == "__main__":
    main()
