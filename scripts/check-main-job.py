#!/usr/bin/env python3
"""Checks what the main job (scripts/main-job.sh) wrote: every output exists and parses, and
every executed plan measured exactly its predicted peaks.

    python3 scripts/check-main-job.py OUT [--batches 4,8]

Exits 1 naming each problem. Uses only the standard library (csv, json).
"""
import argparse
import csv
import json
import os
import sys

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the main job's output folder (REGEN_OUT, default out/main-job)")
    ap.add_argument("--batches", default="4,8", help="the sweep's batches (default 4,8)")
    ap.add_argument("--models", default="resnet152,transformer",
                    help="the frontier's models, one folder each (default resnet152,transformer)")
    ap.add_argument("--sweep-model", default="resnet152")
    ap.add_argument("--sweep-policy", default="dp")
    ap.add_argument("--sweep-budget", default="50pct")
    a = ap.parse_args()
    problems = []

    def need(path):
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            problems.append(f"{path}: missing or empty")
            return False
        return True

    def png(path):
        if need(path):
            with open(path, "rb") as f:
                if f.read(8) != PNG_MAGIC:
                    problems.append(f"{path}: not a PNG file")

    def rows(path, columns):
        if not need(path):
            return []
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                missing = [c for c in columns if c not in (reader.fieldnames or [])]
                if missing:
                    problems.append(f"{path}: no column(s) {', '.join(missing)}")
                    return []
                out = list(reader)
        except (csv.Error, UnicodeDecodeError) as e:
            problems.append(f"{path}: does not parse as CSV: {e}")
            return []
        if not out:
            problems.append(f"{path}: no rows")
        return out

    def profile(path, model):
        if not need(path):
            return
        try:
            with open(path) as f:
                p = json.load(f)
        except (ValueError, UnicodeDecodeError) as e:
            problems.append(f"{path}: does not parse as JSON: {e}")
            return
        if p.get("model") != model:
            problems.append(f"{path}: model {p.get('model')!r}, expected {model!r}")
        for key in ("events", "nodes", "saved"):
            if not p.get(key):
                problems.append(f"{path}: no {key}")

    frontier_cols = ["policy", "budget_bytes", "feasible", "predicted_peak_allocated",
                     "predicted_peak_reserved", "executed", "measured_peak_allocated",
                     "measured_peak_reserved", "exact"]
    executed_total = 0
    for model in a.models.split(","):
        d = os.path.join(a.out, model)
        table = rows(os.path.join(d, "frontier.csv"), frontier_cols)
        policies = {r["policy"] for r in table}
        for want in ("blocks", "sqrt", "mutwo", "dp"):
            if table and not any(p == want or p.startswith(want + ":") for p in policies):
                problems.append(f"{d}/frontier.csv: no rows for policy {want}")
        executed = [r for r in table if r["executed"] == "1"]
        if table and not executed:
            problems.append(f"{d}/frontier.csv: no executed plan")
        for r in executed:
            executed_total += 1
            if r["exact"] != "1":
                problems.append(
                    f"{d}/frontier.csv: {r['policy']} at budget {r['budget_bytes']} measured "
                    f"{r['measured_peak_allocated']}/{r['measured_peak_reserved']} bytes "
                    f"(allocated/reserved), predicted {r['predicted_peak_allocated']}/"
                    f"{r['predicted_peak_reserved']}: not exact")
        png(os.path.join(d, "frontier.png"))
        profile(os.path.join(d, "profile.json"), model)

    m = a.sweep_model
    summary = rows(os.path.join(a.out, f"{m}_summary.csv"), ["batch"])
    batches = {r["batch"] for r in summary}
    for b in a.batches.split(","):
        if summary and b not in batches:
            problems.append(f"{a.out}/{m}_summary.csv: no row for batch {b}")
        need(os.path.join(a.out, f"{m}_b{b}_{a.sweep_policy}_{a.sweep_budget}_decisions.csv"))
        profile(os.path.join(a.out, f"{m}_b{b}_profile.json"), m)
    rows(os.path.join(a.out, f"{m}_timeline.csv"), [])
    need(os.path.join(a.out, f"{m}_summary.txt"))
    for kind in ("peak_memory", "latency", "timeline"):
        png(os.path.join(a.out, f"{m}_{kind}.png"))

    if problems:
        print(f"check-main-job: {len(problems)} problem(s) in {a.out}:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"check-main-job: every output in {a.out} exists and parses; {executed_total} executed "
          f"plans, every one exact to the byte (allocated and reserved, every step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
