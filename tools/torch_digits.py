#!/usr/bin/env python3
"""PyTorch's figures on sklearn's digits for tests/python/test_digits.py: resnet-tiny
(tools/torch_models.py's ResNet([1, 1, 1, 1], 8, 10)) from the weights of
tests/data/resnet-tiny_reference.safetensors, trained on the digits' CIFAR-format training split
(tools/digits_data.py) in the batch order regen's cifar10 source draws, with the schedule and
optimizer of the test (SGD, momentum, weight decay, linear warm-up then cosine), then top-1
accuracy and mean loss on the 500 held-out images in eval mode.

One run is not a reference: 160 steps of SGD amplify rounding, so the same program on the same
weights ends a few images apart with another summation order. The test holds the spread of the
reference's own runs, made by this script across the variants a user's machine could give:

    /usr/bin/python3 tools/torch_digits.py                         # f32, 2 threads, oneDNN on
    /usr/bin/python3 tools/torch_digits.py --all                   # every variant, then the spread
    /usr/bin/python3 tools/torch_digits.py --dtype f64 --threads 1 --no-mkldnn

and the first losses of the f64 run (--early N prints them), which regen's f32 run matches to float
rounding: the deterministic part of the comparison.

Mixed precision (tests/python/test_digits_bf16.py): --dtype bf16 trains the f32 model under
torch.autocast("cpu", dtype=torch.bfloat16) (forward and loss inside the autocast region, backward
and the optimizer outside it, as PyTorch's recipe has it; weights, gradients and momentum stay f32)
and evaluates under the same autocast. --amp runs bf16 and f32, 1 and 2 threads, oneDNN on and off,
then prints the spread over those eight runs and, step by step, over the bf16 runs' first losses:

    /usr/bin/python3 tools/torch_digits.py --amp --early 4 --steps 80

bf16 rounds every activation to 8 significant bits, so which way each value rounds is close to a
coin toss, and a second correct bf16 implementation tosses other coins. --jitter N measures that
spread: N more bf16 runs (1 thread, oneDNN on) whose initial weights are scaled by 1 + j * 2^-16
(j = 1..N), which moves the f32 computation by about 1e-5 but sends a share of the bf16 roundings
the other way, and then one f32 run at j = N to show the f32 side of it.
"""
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_data import RECORD, batches, write_digits_cifar  # noqa: E402
from torch_models import ResNet  # noqa: E402

# The test's run (tests/python/test_digits.py holds the same numbers).
BATCH, STEPS, LR, MOMENTUM, WD, WARMUP, LR_MIN = 16, 160, 0.05, 0.9, 5e-4, 10, 0.0
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def read(path):
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, RECORD)
    x = raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / np.float32(255.0)
    x = (x - MEAN[None, :, None, None]) / STD[None, :, None, None]
    return torch.from_numpy(x), torch.from_numpy(raw[:, 0].astype(np.int64))


def load_init(model):
    """The state entries of the parity fixture (its other entries are a batch and gradients)."""
    import json
    import struct
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                        "resnet-tiny_reference.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "I64": np.int64}
    state = {}
    for name, h in header.items():
        if name == "__metadata__" or name not in model.state_dict():
            continue
        a, b = h["data_offsets"]
        state[name] = torch.from_numpy(
            np.frombuffer(data[a:b], dtype=kinds[h["dtype"]]).reshape(h["shape"]).copy())
    model.load_state_dict(state)


def lr_at(t, steps=STEPS):
    if t < WARMUP:
        return LR * (t + 1) / WARMUP
    u, span = t - WARMUP, steps - WARMUP
    return LR_MIN + (LR - LR_MIN) * (1 + math.cos(math.pi * u / span)) / 2


def autocast(dt):
    """PyTorch's CPU autocast to bf16 for dt 'bf16', else a region that changes nothing."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dt == "bf16")


JITTER = 2.0**-16  # --jitter's step: relative, on the initial weights


def run(data, dt, threads, mkldnn, early=0, steps=STEPS, jitter=0):
    """One training run in dt ('f32', 'f64', or 'bf16': f32 under autocast), the initial weights
    scaled by 1 + jitter * JITTER; returns (held-out correct, held-out loss, last training loss,
    the first `early` training losses)."""
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = mkldnn
    dtype = torch.float64 if dt == "f64" else torch.float32
    xtr, ytr, xte, yte = data
    model = ResNet([1, 1, 1, 1], 8, 10).train()
    load_init(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + jitter * JITTER)
    model = model.to(dtype)
    xtr, xte = xtr.to(dtype), xte.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    losses = []
    for t, idx in enumerate(batches(len(ytr), BATCH, steps)):
        for g in opt.param_groups:
            g["lr"] = lr_at(t, steps)
        opt.zero_grad()
        with autocast(dt):
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
        if t < early:
            losses.append(loss.item())
    model.eval()
    with torch.no_grad(), autocast(dt):
        logits = model(xte)
        correct = int((logits.argmax(1) == yte).sum().item())
        test_loss = F.cross_entropy(logits, yte).item()
    return correct, test_loss, loss.item(), losses


VARIANTS = [(d, t, m) for d in ("f32", "f64") for t in (1, 2) for m in (True, False)]
AMP_VARIANTS = [(d, t, m) for d in ("bf16", "f32") for t in (1, 2) for m in (True, False)]


def print_early_spread(runs):
    """Step by step, the spread of the first losses over `runs` (lists of losses)."""
    for i, col in enumerate(zip(*runs)):
        lo, hi = min(col), max(col)
        print(f"  step {i + 1}: {lo!r} .. {hi!r} (relative spread {(hi - lo) / lo:.2e})")


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=("f32", "f64", "bf16"), default="f32",
                    help="bf16: f32 weights under CPU autocast to bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-mkldnn", action="store_true", help="PyTorch's plain CPU kernels")
    ap.add_argument("--all", action="store_true", help="every dtype x threads x oneDNN variant")
    ap.add_argument("--amp", action="store_true",
                    help="bf16 autocast and f32 x threads x oneDNN (the mixed-precision spread)")
    ap.add_argument("--jitter", type=int, default=0,
                    help="N more bf16 runs from weights scaled by 1 + j * 2^-16, then one f32 run")
    ap.add_argument("--early", type=int, default=0, help="print the first N training losses")
    ap.add_argument("--steps", type=int, default=STEPS,
                    help=f"training steps, the cosine's horizon too (default {STEPS})")
    a = ap.parse_args()
    if a.threads < 1:
        ap.error(f"--threads must be at least 1 (got {a.threads})")
    if a.steps <= WARMUP:
        ap.error(f"--steps must be more than the warm-up's {WARMUP} (got {a.steps})")
    if a.early < 0 or a.early > a.steps:
        ap.error(f"--early must be in 0..{a.steps} (got {a.early})")
    if a.all and a.amp:
        ap.error("--all and --amp are two different sets of variants: pass one")
    with tempfile.TemporaryDirectory() as d:
        write_digits_cifar(d)
        xtr, ytr = read(os.path.join(d, "data_batch_1.bin"))
        xte, yte = read(os.path.join(d, "test_batch.bin"))
    data = (xtr, ytr, xte, yte)
    if a.jitter < 0:
        ap.error(f"--jitter must be at least 0 (got {a.jitter})")
    variants = VARIANTS if a.all else AMP_VARIANTS if a.amp else [
        (a.dtype, a.threads, not a.no_mkldnn)]
    variants = [(dt, th, mk, 0) for dt, th, mk in variants]
    if a.jitter:
        variants += [("bf16", 1, True, j) for j in range(1, a.jitter + 1)]
        variants.append(("f32", 1, True, a.jitter))
    results, early_bf16 = [], []
    for dt, th, mk, jit in variants:
        start = time.monotonic()
        correct, test_loss, last, early = run(data, dt, th, mk, a.early, a.steps, jit)
        results.append((correct, test_loss))
        if dt == "bf16" and early:
            early_bf16.append(early)
        print(f"torch {torch.__version__} {dt}, {th} thread(s), oneDNN {'on' if mk else 'off'}"
              f"{f', weights x (1 + {jit} * 2^-16)' if jit else ''}: "
              f"after {a.steps} steps of {BATCH}, last training loss {last:.4f}; held-out "
              f"{correct} of {len(yte)} ({100 * correct / len(yte):.2f}%), loss {test_loss:.4f} "
              f"({time.monotonic() - start:.1f} s)", flush=True)
        if early:
            print("  first losses: " + ", ".join(repr(x) for x in early))
    if len(results) > 1:
        cs, ls = [c for c, _ in results], [x for _, x in results]
        print(f"spread over {len(results)} runs: held-out {min(cs)}-{max(cs)} of {len(yte)}, "
              f"loss {min(ls):.4f}-{max(ls):.4f}")
    if len(early_bf16) > 1:
        print(f"bf16's first losses over {len(early_bf16)} runs:")
        print_early_spread(early_bf16)


if __name__ == "__main__":
    main()
