#!/usr/bin/env python3
"""A checkpoint policy written in Python, scored with regen's exact simulator, then executed.

The policy is a randomized local search over decision vectors, seeded from mu-TWO's greedy plan:
it flips, adds and swaps recomputations and keeps a change when the exact simulation says the
step still fits the budget and runs faster. Every candidate is scored with regen.simulate (the
peak the step will reach, to the byte, and its time with the recomputation), so the search never
needs to run a step. It is registered as a planner ("local-search"), compared with the built-in
planners at several budgets, and its plan at the lowest budget is then trained: the measured peak
must be the predicted one.

    PYTHONPATH=build/python python3 examples/python/custom_policy.py            # ResNet-50, batch 8
    PYTHONPATH=build/python python3 examples/python/custom_policy.py --quick    # seconds (CI)
    ... custom_policy.py --profile profile.json    # a profile from `regen profile` (or Profile.save)

It exits 1 when an executed step does not measure what was predicted.
"""
import argparse
import statistics
import sys
import time

import numpy as np

import regen


def score(profile, decisions, chain, budget, budget_of):
    s = regen.simulate(profile, decisions, chain=chain, budget=budget, budget_of=budget_of)
    return s.fits, s.time_ms


def local_search(profile, budget, budget_of, iterations, seed=0):
    """The fastest decision vector found that fits `budget`, with its chain mode (or None)."""
    rng = np.random.default_rng(seed)
    saved = profile.saved()
    cand = np.flatnonzero(saved["candidate"])
    # Bytes freed per millisecond of recomputation: where recomputing pays most.
    worth = saved["bytes"][cand] / np.maximum(saved["recompute_ms"][cand], 1e-6)
    best = None  # (time_ms, decisions, chain)
    for chain in ("keep", "drop"):
        start = regen.plan(profile, "mutwo", budget, chain=chain, budget_of=budget_of)
        if not start.feasible:
            continue
        d = start.decisions.copy()
        fits, t = score(profile, d, chain, budget, budget_of)
        assert fits and t == start.time_ms  # simulate() agrees with the planner's prediction
        for _ in range(iterations // 2):
            on = d[cand]
            trial = d.copy()
            move = rng.random()
            if move < 0.5 and on.any():
                # Retain a recomputed tensor, the cheap-to-keep ones more often.
                idx = np.flatnonzero(on)
                w = 1.0 / worth[idx]
                trial[cand[rng.choice(idx, p=w / w.sum())]] = False
            elif move < 0.85 and on.any() and (~on).any():
                # Swap: retain one recomputed tensor, recompute one retained tensor worth more.
                off, idx = np.flatnonzero(~on), np.flatnonzero(on)
                trial[cand[rng.choice(idx)]] = False
                w = worth[off]
                trial[cand[rng.choice(off, p=w / w.sum())]] = True
            elif (~on).any():
                off = np.flatnonzero(~on)
                w = worth[off]
                trial[cand[rng.choice(off, p=w / w.sum())]] = True
            ok, tt = score(profile, trial, chain, budget, budget_of)
            if ok and tt <= t:
                d, t = trial, tt
        if best is None or t < best[0]:
            best = (t, d, chain)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--profile", help="a profile.json to plan from (its model and batch are used)")
    ap.add_argument("--budgets", default="70%,50%,40%")
    ap.add_argument("--budget-of", default="reserved", choices=["reserved", "allocated"])
    ap.add_argument("--iterations", type=int, default=2000, help="simulations per search")
    ap.add_argument("--steps", type=int, default=3, help="training steps of the executed plan")
    ap.add_argument("--quick", action="store_true", help="a tiny ResNet and short searches")
    args = ap.parse_args()
    if args.quick:
        args.model, args.batch, args.image_size = "resnet-tiny", 8, 128
        args.budgets, args.budget_of, args.iterations, args.steps = "80%,60%", "allocated", 300, 2

    options = {"image_size": args.image_size} if args.image_size else {}
    if args.profile:
        profile = regen.load_profile(args.profile)
        model_name, batch = profile.model, profile.batch
        options = {}
        for flag, key in (("--image-size", "image_size"), ("--seq-len", "seq_len"),
                          ("--num-classes", "num_classes"), ("--vocab", "vocab")):
            if flag in profile.run:
                options[key] = int(profile.run[flag])
    else:
        model_name, batch = args.model, args.batch
        model = regen.Model(model_name, batch=batch, device="cpu", **options)
        profile = model.profile(iterations=2)
        del model  # one model at a time: the executed one below must start alone
    print(profile)
    base = profile.no_remat_peak(args.budget_of)
    print(f"no remat: {args.budget_of} peak {base / 2**20:.1f} MiB, step "
          f"{regen.simulate(profile, np.zeros(profile.num_saved, bool)).time_ms:.1f} ms (profiled); "
          f"lower bound {profile.lower_bound / 2**20:.1f} MiB allocated")

    def planner(p, budget_bytes):
        found = local_search(p, budget_bytes, args.budget_of, args.iterations)
        if found is None:  # nothing to start from: mu-TWO's own answer, judged as it is
            return regen.plan(p, "mutwo", budget_bytes, budget_of=args.budget_of)
        _, d, chain = found
        return regen.make_plan(p, d, budget_bytes, chain=chain, budget_of=args.budget_of,
                               policy="local-search")

    regen.register_planner("local-search", planner,
                           "randomized local search from mu-TWO's plan, scored by simulate()")

    policies = ["blocks", "sqrt", "mutwo", "dp", "local-search"]
    print(f"\n{'budget':>7} {'policy':>13} {'fits':>5} {'peak MiB':>9} {'step ms':>9} {'recompute':>9} "
          f"{'planning s':>10}")
    table = {}
    for budget in args.budgets.split(","):
        for policy in policies:
            t0 = time.perf_counter()
            plan = regen.plan(profile, policy, budget, budget_of=args.budget_of)
            secs = time.perf_counter() - t0
            table[budget, policy] = plan
            peak = plan.peak_reserved if args.budget_of == "reserved" else plan.peak_allocated
            print(f"{budget:>7} {policy:>13} {str(plan.feasible):>5} {peak / 2**20:>9.1f} "
                  f"{plan.time_ms:>9.1f} {plan.recomputed:>9} {secs:>10.2f}")

    print()
    for budget in args.budgets.split(","):
        mine = table[budget, "local-search"]
        if not mine.feasible:
            print(f"custom policy: at {budget} nothing fits (not even mu-TWO's plan, its seed): "
                  f"{mine.note}")
            continue
        parts = []
        for other in ("mutwo", "dp"):
            o = table[budget, other]
            if o.feasible:
                parts.append(f"{other} {o.time_ms:.1f} ms ({100 * (mine.time_ms / o.time_ms - 1):+.1f}%)")
            else:
                parts.append(f"{other} does not fit")
        print(f"custom policy: at {budget} local search predicts {mine.time_ms:.1f} ms; " + ", ".join(parts))

    # Execute the custom plan at the lowest budget it meets, on a fresh model.
    feasible = [b for b in args.budgets.split(",") if table[b, "local-search"].feasible]
    if not feasible:
        return 0
    plan = table[feasible[-1], "local-search"]
    model = regen.Model(model_name, batch=batch, device="cpu", **options)
    results = model.train(args.steps, plan=plan)
    ok = all(r.peak_allocated == plan.peak_allocated and r.peak_reserved == plan.peak_reserved
             for r in results)
    ms = statistics.median(r.ms for r in results[1:] or results)
    print(f"\nexecuted local-search at {feasible[-1]} for {args.steps} steps: measured peak allocated "
          f"{results[-1].peak_allocated} B, reserved {results[-1].peak_reserved} B; predicted "
          f"{plan.peak_allocated} B, {plan.peak_reserved} B ({'exact' if ok else 'MISMATCH'}); "
          f"step {ms:.1f} ms measured (median after the first), {plan.time_ms:.1f} ms predicted")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
