#!/usr/bin/env python3
"""Writes the PyTorch reference fixtures of regen's parity tests (tests/test_parity.cpp).

Run by hand with Debian's PyTorch (python3-torch 1.13, CPU; install libopenblas0-pthread too):
    /usr/bin/python3 tools/make_reference.py --out tests/data

For a small ResNet (bottleneck blocks at 1/8 width on 32x32 images, torchvision's layout and
names) and the tiny Transformer language model (regen's `transformer-tiny`, dropout off), it
writes, as safetensors:
  <model>_reference.safetensors  weights (state dict), one batch, the loss, every parameter
                                 gradient ("grad.<name>") of one training step in train mode
  <model>_sgd.safetensors        five batches and the losses of five SGD steps on them
                                 (ResNet: batch 8, lr 0.01, momentum 0.9, weight decay 1e-4;
                                 Transformer: batch 4, lr 0.1, momentum 0.9)
Everything is float32 (int64 for labels and tokens). The files stay far under 5 MB.
"""
import argparse
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32", torch.int64: "I64"}


def save_safetensors(path, tensors, metadata):
    """The safetensors layout, written directly (no extra Python package needed)."""
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (len(text) + 8) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


from torch_models import ResNet, TransformerLM, lm_loss  # noqa: E402  (tools/torch_models.py)


def state_with_grads(model, loss, extra):
    out = {k: v for k, v in model.state_dict().items()}
    out.update(extra)
    out["loss"] = loss.detach().reshape(())
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad
    return out


def sgd_run(model, batches, loss_fn, lr, momentum, weight_decay):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(2)
    meta = {"generator": "tools/make_reference.py", "torch": torch.__version__}

    # ResNet: bottleneck [1, 1, 1, 1], width 8, 10 classes, 32x32 images, batch 4.
    torch.manual_seed(0)
    resnet = ResNet([1, 1, 1, 1], 8, 10).train()
    init = {k: v.clone() for k, v in resnet.state_dict().items()}
    x = torch.randn(4, 3, 32, 32)
    y = torch.randint(0, 10, (4,))
    loss = F.cross_entropy(resnet(x), y)
    loss.backward()
    ref = state_with_grads(resnet, loss, {"input": x, "target": y})
    # The state dict after the step's forward has updated running stats; keep the initial one
    # for loading and the updated one for checking.
    for k, v in init.items():
        ref[k] = v
    for k, v in resnet.state_dict().items():
        if "running" in k or "num_batches" in k:
            ref["after." + k] = v
    save_safetensors(os.path.join(a.out, "resnet-tiny_reference.safetensors"), ref,
                     dict(meta, model="resnet-tiny"))
    torch.manual_seed(1)
    resnet = ResNet([1, 1, 1, 1], 8, 10).train()
    init = {k: v.clone() for k, v in resnet.state_dict().items()}
    # Batch 8 and a small learning rate: with batch 4 the last stage's batch norm sees 4 values
    # per channel and the training trajectory is chaotic, so float rounding alone diverges.
    batches = [(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))) for _ in range(5)]
    losses = sgd_run(resnet, batches, F.cross_entropy, lr=0.01, momentum=0.9, weight_decay=1e-4)
    sgd = dict(init)
    for i, (bx, by) in enumerate(batches):
        sgd[f"input.{i}"] = bx
        sgd[f"target.{i}"] = by
    sgd["losses"] = losses
    save_safetensors(os.path.join(a.out, "resnet-tiny_sgd.safetensors"), sgd,
                     dict(meta, model="resnet-tiny", lr="0.01", momentum="0.9",
                          weight_decay="0.0001"))

    # Transformer: vocab 101, sequence 16, d_model 32, 2 layers, 4 heads, ff 64, batch 4.
    torch.manual_seed(2)
    lm = TransformerLM(101, 16, 32, 2, 4, 64, dropout=0.0).train()
    init = {k: v.clone() for k, v in lm.state_dict().items()}
    tokens = torch.randint(0, 101, (4, 16))
    targets = torch.randint(0, 101, (4, 16))
    loss = lm_loss(lm(tokens), targets)
    loss.backward()
    ref = state_with_grads(lm, loss, {"input": tokens, "target": targets})
    for k, v in init.items():
        ref[k] = v
    save_safetensors(os.path.join(a.out, "transformer-tiny_reference.safetensors"), ref,
                     dict(meta, model="transformer-tiny"))
    torch.manual_seed(3)
    lm = TransformerLM(101, 16, 32, 2, 4, 64, dropout=0.0).train()
    init = {k: v.clone() for k, v in lm.state_dict().items()}
    batches = [(torch.randint(0, 101, (4, 16)), torch.randint(0, 101, (4, 16))) for _ in range(5)]
    losses = sgd_run(lm, batches, lm_loss, lr=0.1, momentum=0.9, weight_decay=0.0)
    sgd = dict(init)
    for i, (bx, by) in enumerate(batches):
        sgd[f"input.{i}"] = bx
        sgd[f"target.{i}"] = by
    sgd["losses"] = losses
    save_safetensors(os.path.join(a.out, "transformer-tiny_sgd.safetensors"), sgd,
                     dict(meta, model="transformer-tiny", lr="0.1", momentum="0.9",
                          weight_decay="0"))
    for f in sorted(os.listdir(a.out)):
        print(f"{f}: {os.path.getsize(os.path.join(a.out, f))} bytes")


if __name__ == "__main__":
    main()
