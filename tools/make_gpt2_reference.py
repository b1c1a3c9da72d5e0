#!/usr/bin/env python3
"""Writes the PyTorch reference of regen's GPT-2 (tests/test_gpt2.cpp):
tests/data/gpt2-tiny_adamw.safetensors.

Run by hand with Debian's PyTorch (python3-torch 1.13, CPU):
    /usr/bin/python3 tools/make_gpt2_reference.py --out tests/data

The model is regen's gpt2-tiny (vocabulary 100 padded to 128, context 16, width 32, 2 layers,
4 heads) as tools/torch_gpt2.py writes it, trained for 20 steps in float32 by AdamW (lr 3e-3,
betas 0.9 and 0.999, eps 1e-8, weight decay 0.1 on the matrices only) on batches of 4 sequences
of 16 tokens. The file holds
  <name>            the initial weights (state-dict names), torch's draw of GPT-2's
                    initialization, or those of --weights (a safetensors file regen wrote, such as
                    a checkpoint's model state)
  input.<i>, target.<i>   step i's tokens and next-token targets, (4, 16) int64
  losses            the 20 losses, float32
  final.<name>      after the 20 steps: every 1-D parameter (biases and layer norms, which are
                    not decayed) and wpe.weight (a decayed matrix)
The tokens are counting sequences modulo 100 (a random start and stride per sequence) with one
token in ten replaced by a random one, so the loss falls. Together about 140 KB.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import save_safetensors  # noqa: E402
from torch_gpt2 import GPT2, adamw, load_safetensors, loss_of  # noqa: E402

VOCAB, CONTEXT, WIDTH, LAYERS, HEADS = 100, 16, 32, 2, 4
BATCH, STEPS, LR, DECAY = 4, 20, 3e-3, 0.1


def batches(gen):
    out = []
    for _ in range(STEPS):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
        stride = torch.randint(1, 7, (BATCH, 1), generator=gen)
        seq = (start + stride * torch.arange(CONTEXT + 1)) % VOCAB
        noise = torch.rand(BATCH, CONTEXT + 1, generator=gen) < 0.1
        seq = torch.where(noise, torch.randint(0, VOCAB, seq.shape, generator=gen), seq)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data")
    ap.add_argument("--weights", help="start from these weights (safetensors) instead")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = GPT2(VOCAB, CONTEXT, WIDTH, LAYERS, HEADS)
    if args.weights:
        state = load_safetensors(args.weights)
        model.load_state_dict({k: v for k, v in state.items() if k in model.state_dict()})
    out = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(args.seed + 1)
    opt = adamw(model, LR, DECAY)
    losses = []
    for i, (x, y) in enumerate(batches(gen)):
        out[f"input.{i}"] = x
        out[f"target.{i}"] = y
        opt.zero_grad()
        loss = loss_of(model, x, y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    for name, p in model.named_parameters():
        if p.dim() == 1 or name == "wpe.weight":
            out["final." + name] = p.detach().clone()
    path = os.path.join(args.out, "gpt2-tiny_adamw.safetensors")
    meta = {"model": "gpt2-tiny", "optimizer": "adamw", "lr": str(LR),
            "weight_decay": str(DECAY), "decay": "matrices", "steps": str(STEPS),
            "torch": torch.__version__}
    save_safetensors(path, out, meta)
    print(f"{path}: losses {losses[0]:.6f} -> {losses[-1]:.6f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
