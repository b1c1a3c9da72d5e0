#!/usr/bin/env python3
"""PyTorch's figures on a real text for tests/python/test_text_bf16.py: transformer-tiny at byte
vocabulary (tools/torch_models.py's TransformerLM(256, 16, 32, 2, 4, 64), dropout off) from the
NumPy-drawn weights of tools/text_data.py, trained on the first nine tenths of Debian's
/usr/share/common-licenses/GPL-3 in the window order regen's text source draws, with the test's
schedule and optimizer (SGD with momentum, linear warm-up then cosine), then the mean loss per
target on the held-out last tenth, as regen evaluates it (consecutive windows).

As tools/torch_digits.py does for the digits, it measures the spread of PyTorch's own runs across
the variants a user's machine could give: f32, or f32 under torch.autocast("cpu",
dtype=torch.bfloat16) (forward and loss inside the region, backward and the optimizer outside;
evaluation under it too), on 1 or 2 threads, oneDNN on or off:

    /usr/bin/python3 tools/torch_text.py                   # bf16 autocast, 2 threads, oneDNN on
    /usr/bin/python3 tools/torch_text.py --amp --early 4   # the eight variants, then the spread
    /usr/bin/python3 tools/torch_text.py --jitter 6 --early 4

--jitter N: N more bf16 runs from weights scaled by 1 + j * 2^-16, the spread bf16's rounding alone
gives (tools/torch_digits.py says why), then one f32 run at j = N.
"""
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import text_data as td  # noqa: E402
from torch_digits import JITTER, autocast, print_early_spread  # noqa: E402
from torch_models import TransformerLM, lm_loss  # noqa: E402

# The test's run (tests/python/test_text_bf16.py holds the same numbers).
BATCH, STEPS, LR, MOMENTUM, WD, WARMUP = 16, 400, 0.3, 0.9, 0.0, 10
HEADS = 4


def lr_at(t, steps):
    if t < WARMUP:
        return LR * (t + 1) / WARMUP
    return LR * (1 + math.cos(math.pi * (t - WARMUP) / (steps - WARMUP))) / 2


def run(data, dt, threads, mkldnn, early=0, steps=STEPS, jitter=0):
    """One training run in dt ('f32', or 'bf16': f32 under autocast), the initial weights scaled
    by 1 + jitter * JITTER; returns (held-out loss, last training loss, the first `early` training
    losses)."""
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = mkldnn
    train, held = td.split(data)
    model = TransformerLM(td.VOCAB, td.SEQ, td.D, td.LAYERS, HEADS, td.FF, dropout=0.0).train()
    model.load_state_dict({k: torch.from_numpy(v * (1 + jitter * JITTER))
                           for k, v in td.init_state().items()})
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    losses = []
    for t, starts in enumerate(td.window_starts(len(train), BATCH, steps)):
        x, y = (torch.from_numpy(a) for a in td.windows(train, starts))
        for g in opt.param_groups:
            g["lr"] = lr_at(t, steps)
        opt.zero_grad()
        with autocast(dt):
            loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        if t < early:
            losses.append(loss.item())
    # Dropout is off, so train mode evaluates as eval mode would; it keeps nn.TransformerEncoder
    # off its inference fast path, which regen has no counterpart of.
    x, y = (torch.from_numpy(a) for a in td.held_out_windows(held))
    with torch.no_grad(), autocast(dt):
        test_loss = lm_loss(model(x), y).float().item()
    return test_loss, loss.item(), losses


AMP_VARIANTS = [(d, t, m) for d in ("bf16", "f32") for t in (1, 2) for m in (True, False)]


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="bf16",
                    help="bf16: f32 weights under CPU autocast to bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-mkldnn", action="store_true", help="PyTorch's plain CPU kernels")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast and f32 x threads x oneDNN")
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
    data = td.text_bytes()
    if data is None:
        sys.exit(f"{td.TEXT} is missing or not the text measured (SHA-256 {td.TEXT_SHA256}); "
                 "Debian's base-files installs it")
    held_targets = td.held_out_windows(td.split(data)[1])[1].size
    if a.jitter < 0:
        ap.error(f"--jitter must be at least 0 (got {a.jitter})")
    variants = AMP_VARIANTS if a.amp else [(a.dtype, a.threads, not a.no_mkldnn)]
    variants = [(dt, th, mk, 0) for dt, th, mk in variants]
    if a.jitter:
        variants += [("bf16", 1, True, j) for j in range(1, a.jitter + 1)]
        variants.append(("f32", 1, True, a.jitter))
    results, early_bf16 = [], []
    for dt, th, mk, jit in variants:
        start = time.monotonic()
        test_loss, last, early = run(data, dt, th, mk, a.early, a.steps, jit)
        results.append(test_loss)
        if dt == "bf16" and early:
            early_bf16.append(early)
        print(f"torch {torch.__version__} {dt}, {th} thread(s), oneDNN {'on' if mk else 'off'}"
              f"{f', weights x (1 + {jit} * 2^-16)' if jit else ''}: after {a.steps} steps of {BATCH}x{td.SEQ}, last training loss {last:.4f}; "
              f"held-out loss {test_loss:.4f} over {held_targets} targets "
              f"({time.monotonic() - start:.1f} s)", flush=True)
        if early:
            print("  first losses: " + ", ".join(repr(x) for x in early))
    if len(results) > 1:
        print(f"spread over {len(results)} runs: held-out loss {min(results):.4f}-"
              f"{max(results):.4f}")
    if len(early_bf16) > 1:
        print(f"bf16's first losses over {len(early_bf16)} runs:")
        print_early_spread(early_bf16)


if __name__ == "__main__":
    main()
