#!/usr/bin/env python3
"""Writes the PyTorch reference of regen's training loop (tests/test_training.cpp):
tests/data/training_reference.safetensors.

Run by hand with Debian's PyTorch (python3-torch 1.13, CPU):
    /usr/bin/python3 tools/make_training_reference.py --out tests/data

It holds
  lr.<name>        the learning rate torch's schedulers give each step (get_last_lr() when
                   optimizer.step() runs), float64, for warm-up then constant, step and cosine:
                   SequentialLR([LinearLR(start_factor=1/W, total_iters=W-1), main], [W])
  clip.*           a tiny Transformer language model (regen's transformer-tiny at vocab 101,
                   sequence 16, dropout off) trained 6 steps by SGD (lr 0.1, momentum 0.9) under
                   warm-up 2 + cosine over 6 steps to 0.01, with clip_grad_norm_(max_norm=0.5):
                   the initial weights ("clip.init.<name>"), the batches, every step's loss, gradient
                   norm before clipping and learning rate, and the final weights
                   ("clip.final.<name>").
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import save_safetensors  # noqa: E402
from torch_models import TransformerLM, lm_loss  # noqa: E402


def scheduler(opt, kind, warmup, **kw):
    """regen's LrSchedule as torch composes it."""
    if kind == "constant":
        main = torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)
    elif kind == "step":
        main = torch.optim.lr_scheduler.StepLR(opt, step_size=kw["step_size"], gamma=kw["gamma"])
    else:
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=kw["horizon"] - warmup,
                                                          eta_min=kw["min"])
    if warmup <= 1:  # a warm-up of one step is lr * 1/1: no warm-up
        return main
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0,
                                             total_iters=warmup - 1)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, main], milestones=[warmup])


def lr_sequence(kind, warmup, steps, base, **kw):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sch = scheduler(opt, kind, warmup, **kw)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    return torch.tensor(out, dtype=torch.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data")
    a = ap.parse_args()
    torch.set_num_threads(2)
    out = {}
    # name: (kind, warm-up, steps, base, settings); the test builds the same LrSchedule.
    cases = {
        "cosine": ("cosine", 5, 30, 0.1, dict(horizon=30, min=0.001)),
        "cosine_nowarm": ("cosine", 0, 14, 0.05, dict(horizon=12, min=0.0)),
        "step": ("step", 3, 20, 0.1, dict(step_size=4, gamma=0.5)),
        "constant": ("constant", 4, 10, 0.2, {}),
    }
    for name, (kind, warmup, steps, base, kw) in cases.items():
        out["lr." + name] = lr_sequence(kind, warmup, steps, base, **kw)

    torch.manual_seed(4)
    lm = TransformerLM(101, 16, 32, 2, 4, 64, dropout=0.0).train()
    for k, v in lm.state_dict().items():
        out["clip.init." + k] = v.clone()
    opt = torch.optim.SGD(lm.parameters(), lr=0.1, momentum=0.9)
    sch = scheduler(opt, "cosine", 2, horizon=6, min=0.01)
    losses, norms, lrs = [], [], []
    for i in range(6):
        x = torch.randint(0, 101, (4, 16))
        y = torch.randint(0, 101, (4, 16))
        out[f"clip.input.{i}"] = x
        out[f"clip.target.{i}"] = y
        opt.zero_grad()
        loss = lm_loss(lm(x), y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(lm.parameters(), max_norm=0.5)))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
        losses.append(loss.item())
    out["clip.losses"] = torch.tensor(losses, dtype=torch.float32)
    out["clip.norms"] = torch.tensor(norms, dtype=torch.float64)
    out["clip.lrs"] = torch.tensor(lrs, dtype=torch.float64)
    for k, v in lm.state_dict().items():
        out["clip.final." + k] = v.clone()
    path = os.path.join(a.out, "training_reference.safetensors")
    save_safetensors(path, out, {"generator": "tools/make_training_reference.py",
                                 "torch": torch.__version__})
    print(f"{path}: {os.path.getsize(path)} bytes")
    for name in cases:
        print(name, [round(v, 6) for v in out["lr." + name].tolist()])
    print("losses", losses, "norms", norms, "lrs", lrs)


if __name__ == "__main__":
    main()
