#!/usr/bin/env python3
"""Calls per second of regen.simulate from Python, on a profile (docs/results.md, "Python module").

    PYTHONPATH=build/python python3 scripts/bench_simulate.py PROFILE.json [--seconds 3] [--rounds 5]

For three decision vectors (none recomputed; mu-TWO's plan at 50% with its chain; dp's at 50% with
its regenerations) it runs simulate() back to back for --seconds, --rounds times, and prints the
median rate, with the time build_schedule and the replay take beside the Python call's own.
"""
import argparse
import statistics
import time

import numpy as np

import regen


def rate(fn, seconds):
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        t = time.perf_counter() - t0
        if t >= seconds:
            return n / t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", default="50%")
    args = ap.parse_args()
    p = regen.load_profile(args.profile)
    print(p)
    mutwo = regen.plan(p, "mutwo", args.budget)
    dp = regen.plan(p, "dp", args.budget)
    cases = [
        ("none recomputed", np.zeros(p.num_saved, dtype=bool), "keep", None),
        (f"mutwo {args.budget} ({mutwo.recomputed} recomputed, chain {mutwo.chain})",
         mutwo.decisions, mutwo.chain, None),
        (f"dp {args.budget} ({dp.recomputed} recomputed, {len(dp.regenerations)} regenerations)",
         dp.decisions, dp.chain, dp.regenerations),
    ]
    for label, d, chain, regens in cases:
        rates = [rate(lambda: regen.simulate(p, d, chain=chain, regenerations=regens), args.seconds)
                 for _ in range(args.rounds)]
        judged = [rate(lambda: regen.simulate(p, d, chain=chain, regenerations=regens,
                                              budget=args.budget), args.seconds)
                  for _ in range(args.rounds)]
        print(f"{label}: {statistics.median(rates):.0f} calls/s "
              f"({1000 / statistics.median(rates):.2f} ms each); with budget= (judged, limited "
              f"replay when needed): {statistics.median(judged):.0f} calls/s; rounds "
              f"{', '.join(f'{r:.0f}' for r in rates)}")


if __name__ == "__main__":
    main()
