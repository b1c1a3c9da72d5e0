#!/usr/bin/env python3
"""Plots of a `regen sweep` and of a `regen frontier` (Debian's python3-matplotlib):
  <model>_peak_memory.png   peak memory vs batch size, without and with remat (bars)
  <model>_latency.png       iteration latency vs batch size, without and with remat
  <model>_timeline.png      memory by category over one iteration (no remat and each plan)
  frontier.png              predicted peak vs predicted step overhead, one curve per policy,
                            executed plans as hollow markers at their measured values
  curves.png                training curves of a `regen train --log` file (CSV or JSON lines):
                            training and evaluation loss, accuracy or perplexity, learning rate,
                            gradient norm, samples/s and peak memory against the step
Usage: python3 tools/plot.py --summary DIR/M_summary.csv --timeline DIR/M_timeline.csv \
         --model M --out DIR
       python3 tools/plot.py --frontier DIR/frontier.csv --out DIR
       python3 tools/plot.py --curves LOG.csv [LOG2.jsonl ...] --out DIR
"""
import argparse
import csv
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py needs matplotlib: apt-get install python3-matplotlib "
             "(or REGEN_WITH_PLOTS=1 bash scripts/install-deps.sh)")

CATEGORIES = ["parameter", "gradient", "optimizer_state", "activation", "workspace", "input",
              "other", "communication"]


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plot_summary(rows, model, out):
    batches = sorted({int(r["batch"]) for r in rows})
    variants = []
    for r in rows:
        key = (r["policy"], r["budget"])
        if key not in variants:
            variants.append(key)
    base_peak = {}
    base_time = {}
    for r in rows:
        base_peak[int(r["batch"])] = float(r["initial_peak_gb"])
        base_time[int(r["batch"])] = float(r["initial_time_s"])

    def value(b, key, field):
        for r in rows:
            if int(r["batch"]) == b and (r["policy"], r["budget"]) == key:
                return float(r[field])
        return float("nan")

    width = 0.8 / (1 + len(variants))
    xs = range(len(batches))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar([x - 0.4 + width / 2 for x in xs], [base_peak[b] for b in batches], width,
           label="no remat")
    for i, key in enumerate(variants):
        ax.bar([x - 0.4 + width * (i + 1.5) for x in xs],
               [value(b, key, "final_peak_gb") for b in batches], width,
               label=f"{key[0]} @ {key[1]}")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak memory allocated (GiB)")
    ax.set_title(f"{model}: peak memory vs batch size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{model}_peak_memory.png"), dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(batches, [base_time[b] for b in batches], marker="o", label="no remat")
    for key in variants:
        ax.plot(batches, [value(b, key, "final_time_s") for b in batches], marker="o",
                label=f"{key[0]} @ {key[1]}")
    ax.set_xlabel("batch size")
    ax.set_ylabel("iteration latency (s)")
    ax.set_title(f"{model}: iteration latency vs batch size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{model}_latency.png"), dpi=120)
    plt.close(fig)


def plot_timeline(path, model, out):
    rows = read_rows(path)
    variants = []
    for r in rows:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    fig, axes = plt.subplots(len(variants), 1, figsize=(9, 3.2 * len(variants)), sharey=True,
                             squeeze=False)
    for ax, v in zip(axes[:, 0], variants):
        sel = [r for r in rows if r["variant"] == v]
        steps = list(range(len(sel)))
        series = [[int(r[c]) / 2**20 for r in sel] for c in CATEGORIES]
        ax.stackplot(steps, *series, labels=CATEGORIES)
        ax.plot(steps, [int(r["reserved"]) / 2**20 for r in sel], color="black", linewidth=0.8,
                label="reserved")
        ax.set_title(f"{model}: memory by category over one iteration ({v})")
        ax.set_xlabel("op boundary (forward, then backward, then optimizer)")
        ax.set_ylabel("MiB")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{model}_timeline.png"), dpi=120)
    plt.close(fig)


def plot_frontier(path, out):
    rows = read_rows(path)
    base = next((r for r in rows if r["policy"] == "none"), None)
    bound = next((r for r in rows if r["policy"] == "lower_bound"), None)
    if base is None:
        sys.exit(f"plot.py: {path} has no 'none' row (the no-remat point)")
    # The peaks of the kind the budgets bound (reserved: what the device sees; allocated).
    kind = base.get("budget_of") or "allocated"
    pred, meas = f"predicted_peak_{kind}", f"measured_peak_{kind}"
    peaks = [int(r[pred]) for r in rows if r[pred]]
    peaks += [int(r[meas]) for r in rows if r[meas]]
    scale, unit = (2**30, "GiB") if max(peaks) >= 2**30 else (2**20, "MiB")
    base_ms = float(base["predicted_ms"])
    base_measured = float(base["measured_ms"]) if base["measured_ms"] else None

    fig, ax = plt.subplots(figsize=(9, 5.5))
    policies = []
    for r in rows:
        if r["policy"] not in ("none", "lower_bound") and r["policy"] not in policies:
            policies.append(r["policy"])
    markers = "osD^v<>ph*"
    executed_any = False
    for i, policy in enumerate(policies):
        sel = [r for r in rows if r["policy"] == policy and r["feasible"] == "1"]
        sel.sort(key=lambda r: -int(r["budget_bytes"]))  # along the frontier: budgets falling
        color = f"C{i % 10}"
        marker = markers[i % len(markers)]
        ax.plot([int(r[pred]) / scale for r in sel],
                [float(r["overhead_pct"]) for r in sel], marker=marker, markersize=4,
                linewidth=1.2, color=color, label=policy)
        # Each executed plan once (several budgets may have chosen it).
        seen = set()
        for r in sel:
            if r["executed"] != "1" or r["plan_id"] in seen:
                continue
            seen.add(r["plan_id"])
            ref = base_measured if base_measured else base_ms
            ax.plot(int(r[meas]) / scale,
                    100.0 * (float(r["measured_ms"]) / ref - 1.0), marker=marker, markersize=10,
                    markerfacecolor="none", markeredgecolor=color, markeredgewidth=1.5,
                    linestyle="none")
            executed_any = True
    ax.plot([int(base[pred]) / scale], [0.0], marker="*", markersize=14,
            color="black", linestyle="none", label="no remat")
    if base_measured is not None:
        ax.plot([int(base[meas]) / scale], [0.0], marker="*", markersize=18,
                markerfacecolor="none", markeredgecolor="black", linestyle="none")
    if bound is not None:
        lb = int(bound["predicted_peak_allocated"]) / scale
        ax.axvline(lb, color="gray", linestyle="--", linewidth=1,
                   label=f"lower bound, allocated ({lb:.2f} {unit})")
    if executed_any:
        ax.plot([], [], marker="o", markersize=9, markerfacecolor="none", markeredgecolor="gray",
                linestyle="none", label="executed (measured)")
    ax.set_xlabel(f"peak memory {kind} ({unit}): predicted; hollow markers: measured")
    ax.set_ylabel("step time over no remat (%): predicted; hollow: measured")
    ax.set_title(f"{base['model']} batch {base['batch']} on {base['device']} "
                 f"({base['threads']} threads): memory/time frontier")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    target = os.path.join(out, "frontier.png")
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


def read_log(path):
    """A `regen train --log` file: CSV (a .csv name, any case) or JSON lines; numbers or None."""
    import json
    rows = []
    with open(path, newline="") as f:
        if path.lower().endswith(".csv"):
            for r in csv.DictReader(f):
                rows.append({k: (r[k] if k == "kind" else (float(r[k]) if r[k] != "" else None))
                             for k in r})
        else:
            for line in f:
                if line.strip():
                    rows.append(json.loads(line))
    return rows


def plot_curves(paths, out):
    """One figure of six panels; every log a line in each (a resumed run continues its curve)."""
    panels = [("loss", "loss (train solid, eval dashed)"), ("metric", "eval accuracy / perplexity"),
              ("lr", "learning rate"), ("grad_norm", "gradient norm (before clipping)"),
              ("samples_per_s", "samples/s"), ("peak", "peak reserved (MiB)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for path in paths:
        rows = read_log(path)
        name = os.path.basename(path)
        train = [r for r in rows if r["kind"] == "train"]
        ev = [r for r in rows if r["kind"] == "eval"]
        steps = [r["step"] for r in train]

        def series(rs, key):
            pts = [(r["step"], r[key]) for r in rs if r.get(key) is not None]
            return [p[0] for p in pts], [p[1] for p in pts]

        for ax, (key, title) in zip(axes.flat, panels):
            ax.set_title(title)
            ax.set_xlabel("step")
            if key == "loss":
                line, = ax.plot(steps, [r["loss"] for r in train], label=name)
                x, y = series(ev, "loss")
                if x:
                    ax.plot(x, y, "--o", color=line.get_color())
            elif key == "metric":
                for k, style in (("accuracy", "-o"), ("perplexity", "-s")):
                    x, y = series(ev, k)
                    if x:
                        ax.plot(x, y, style, label=f"{name} {k}")
            elif key == "peak":
                x, y = series(train, "peak_reserved")
                ax.plot(x, [v / 2**20 for v in y], label=name)
            else:
                x, y = series(train, key)
                if x:
                    ax.plot(x, y, label=name)
    for ax in axes.flat:
        if ax.lines:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    target = os.path.join(out, "curves.png")
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return target


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summary")
    ap.add_argument("--timeline")
    ap.add_argument("--model")
    ap.add_argument("--frontier", help="frontier.csv of `regen frontier` (draws frontier.png)")
    ap.add_argument("--curves", nargs="+",
                    help="`regen train --log` files, CSV or JSON lines (draws curves.png)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.curves:
        for p in a.curves:
            if not os.path.isfile(p):
                sys.exit(f"plot.py: no such file: {p}")
        print(f"wrote {plot_curves(a.curves, a.out)}")
        return
    if a.frontier:
        if not os.path.isfile(a.frontier):
            sys.exit(f"plot.py: no such file: {a.frontier}")
        print(f"wrote {plot_frontier(a.frontier, a.out)}")
        if not a.summary:
            return
    if not a.summary or not a.model:
        ap.error("--summary and --model are required (or --frontier)")
    for p in [a.summary] + ([a.timeline] if a.timeline else []):
        if not os.path.isfile(p):
            sys.exit(f"plot.py: no such file: {p}")
    plot_summary(read_rows(a.summary), a.model, a.out)
    if a.timeline:
        plot_timeline(a.timeline, a.model, a.out)
    print(f"wrote {a.out}/{a.model}_peak_memory.png, {a.model}_latency.png"
          + (f", {a.model}_timeline.png" if a.timeline else ""))


if __name__ == "__main__":
    main()
