#!/usr/bin/env python3
"""PyTorch 1.13's accuracy on sklearn's digits for tests/python/test_digits.py: resnet-tiny
(tools/torch_models.py's ResNet([1, 1, 1, 1], 8, 10)) from the weights of
tests/data/resnet-tiny_reference.safetensors, trained on the digits' CIFAR-format training split
(tools/digits_data.py) in the batch order regen's cifar10 source draws, with the schedule and
optimizer of the test (SGD, momentum, weight decay, linear warm-up then cosine), then top-1
accuracy and mean loss on the 500 held-out images in eval mode.

    /usr/bin/python3 tools/torch_digits.py            # prints the figures the test holds
"""
import math
import os
import sys
import tempfile

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


def lr_at(t):
    if t < WARMUP:
        return LR * (t + 1) / WARMUP
    u, span = t - WARMUP, STEPS - WARMUP
    return LR_MIN + (LR - LR_MIN) * (1 + math.cos(math.pi * u / span)) / 2


def main():
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as d:
        write_digits_cifar(d)
        xtr, ytr = read(os.path.join(d, "data_batch_1.bin"))
        xte, yte = read(os.path.join(d, "test_batch.bin"))
    model = ResNet([1, 1, 1, 1], 8, 10).train()
    load_init(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    for t, idx in enumerate(batches(len(ytr), BATCH, STEPS)):
        for g in opt.param_groups:
            g["lr"] = lr_at(t)
        opt.zero_grad()
        loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(xte)
        acc = (logits.argmax(1) == yte).float().mean().item()
        test_loss = F.cross_entropy(logits, yte).item()
    print(f"torch {torch.__version__}: after {STEPS} steps of {BATCH}, last training loss "
          f"{loss.item():.4f}; held-out accuracy {100 * acc:.2f}% ({int(round(acc * len(yte)))} of "
          f"{len(yte)}), loss {test_loss:.4f}")


if __name__ == "__main__":
    main()
