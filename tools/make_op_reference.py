#!/usr/bin/env python3
"""Writes tests/data/op_reference.safetensors: PyTorch's values for the rows of regen's op table
(tests/op_table.h) that are checked against stored values.

Run by hand with Debian's PyTorch (python3-torch 1.13, CPU; install libopenblas0-pthread too):
    /usr/bin/python3 tools/make_op_reference.py --out tests/data

For every row below, named exactly as its row in tests/op_table.h, it draws the row's inputs
(float64 uniform in [lo, hi), int64 indices, int32 key-padding masks whose first column is 0),
runs the op in float64 and back-propagates a float64 cotangent drawn uniform in [-1, 1), and
stores, under "<row name>/":
  in<i>    input i
  cot      the cotangent (the output's shape)
  out      the output
  grad<i>  the gradient of every floating input i that the row marks as needing one
The op table runs each such row on these inputs and this cotangent and compares its output and
gradients, in f64 and f32, on the CPU and on CUDA, with these values. A row of the unary list
(kernels/unary_ops.h) and dropout are checked against f64 formulas instead (tests/op_reference.h,
tests/op_table.h), so they need nothing here. A new row adds its entry to ROWS and reruns this.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import save_safetensors  # noqa: E402  (tools/make_reference.py)


def real(*shape, lo=-1.0, hi=1.0):
    return ("real", shape, lo, hi, True)


def fixed(*shape, lo=-1.0, hi=1.0):  # a floating input that needs no gradient
    return ("real", shape, lo, hi, False)


def index(*shape, range_):
    return ("index", shape, range_)


def mask(*shape):
    return ("mask", shape)


def attention(qkv, heads, key_pad=None, causal=False):
    """regen's attention: qkv (B, S, 3D) laid out [q | k | v], heads split in D; scores scaled by
    1/sqrt(Dh); key_pad (B, S) nonzero = padded key; output (B, S, D) with heads merged."""
    B, S, D3 = qkv.shape
    D = D3 // 3
    Dh = D // heads
    q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(B, S, heads, Dh).transpose(1, 2)
               for i in range(3))
    s = q @ k.transpose(-1, -2) / math.sqrt(Dh)
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    if key_pad is not None:
        s = s.masked_fill(key_pad.ne(0)[:, None, None, :], float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, S, D)


def split_row(x):
    p = torch.split(x, [2, 0, 5], dim=-1)
    return torch.cat([p[2] * 3.0, p[0]], dim=1)


# (row name, inputs, function of the input tensors); names and inputs as in tests/op_table.h.
ROWS = [
    ("linear with bias", [real(3, 5), real(4, 5), real(4)], lambda x, w, b: F.linear(x, w, b)),
    ("matmul", [real(3, 4), real(4, 5)], lambda a, b: a @ b),
    ("bmm transposed b", [real(2, 3, 4), real(2, 5, 4)],
     lambda a, b: torch.bmm(a, b.transpose(1, 2))),
    ("conv2d 3x3 stride 2 pad 1 bias", [real(2, 3, 7, 6), real(4, 3, 3, 3), real(4)],
     lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1)),
    ("conv_transpose2d 2x2 stride 2 bias", [real(2, 4, 3, 3), real(4, 3, 2, 2), real(3)],
     lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2)),
    ("conv_transpose2d 3x3 stride 2 pad 1 output_padding 1", [real(1, 2, 4, 3), real(2, 3, 3, 3)],
     lambda x, w: F.conv_transpose2d(x, w, None, stride=2, padding=1, output_padding=1)),
    ("batchnorm2d training",
     [real(3, 2, 3, 4), real(2, lo=0.5, hi=1.5), real(2), fixed(2), fixed(2, lo=0.5, hi=1.5)],
     # the row passes fresh running statistics (zeros, ones) on every call
     lambda x, g, b, _rm, _rv: F.batch_norm(x, torch.zeros(2, dtype=x.dtype),
                                            torch.ones(2, dtype=x.dtype), g, b, training=True,
                                            momentum=0.1, eps=1e-5)),
    ("max_pool2d 3x3 stride 2 pad 1", [real(2, 2, 7, 6)], lambda x: F.max_pool2d(x, 3, 2, 1)),
    ("avg_pool2d 2x2 stride 2", [real(2, 3, 6, 5)], lambda x: F.avg_pool2d(x, 2, 2)),
    ("global_avg_pool", [real(2, 3, 5, 4)], lambda x: x.mean(dim=(2, 3), keepdim=True)),
    ("upsample2x nearest", [real(2, 3, 3, 4)],
     lambda x: F.interpolate(x, scale_factor=2, mode="nearest")),
    ("upsample2x bilinear", [real(1, 2, 4, 3)],
     lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)),
    ("add broadcast over leading dims", [real(3, 4, 5), real(4, 5)], lambda a, b: a + b),
    ("mul", [real(3, 5), real(3, 5)], lambda a, b: a * b),
    ("scale", [real(6, 5)], lambda x: x * -2.5),
    ("reshape", [real(2, 6)], lambda x: x.reshape(3, 4)),
    ("transpose", [real(2, 3, 4)], lambda x: x.transpose(0, 2).contiguous()),
    ("permute", [real(2, 3, 4)], lambda x: x.permute(1, 2, 0).contiguous()),
    ("concat along dim 1 of three", [real(2, 3, 2), real(2, 1, 2), real(2, 4, 2)],
     lambda a, b, c: torch.cat([a, b, c], dim=1)),
    ("split along the last dim (pieces concatenated back, one scaled)", [real(3, 7)], split_row),
    ("narrow along dim 0", [real(5, 3)], lambda x: x.narrow(0, 1, 3)),
    ("embedding", [index(3, 4, range_=7), real(7, 5)], lambda i, w: F.embedding(i, w)),
    ("layernorm", [real(3, 6), real(6, lo=0.5, hi=1.5), real(6)],
     lambda x, g, b: F.layer_norm(x, (6,), g, b, eps=1e-5)),
    ("softmax", [real(3, 7, lo=-2, hi=2)], lambda x: x.softmax(-1)),
    ("attention causal, 2 heads", [real(2, 5, 12)], lambda qkv: attention(qkv, 2, causal=True)),
    ("attention with a key padding mask", [real(2, 4, 6), mask(2, 4)],
     lambda qkv, m: attention(qkv, 1, key_pad=m)),
    ("cross_entropy", [real(5, 6, lo=-2, hi=2), index(5, range_=6)],
     lambda z, t: F.cross_entropy(z, t)),
    ("linear_cross_entropy in chunks of 2 rows",
     [real(5, 4), real(6, 4), real(6), index(5, range_=6)],
     lambda x, w, b, t: F.cross_entropy(F.linear(x, w, b), t)),
    ("sum", [real(3, 4)], lambda x: x.sum()),
    ("mean", [real(3, 4)], lambda x: x.mean()),
]


def draw(spec, g):
    kind, shape = spec[0], spec[1]
    if kind == "real":
        lo, hi = spec[2], spec[3]
        return torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
    if kind == "index":
        return torch.randint(0, spec[2], shape, generator=g, dtype=torch.int64)
    m = torch.randint(0, 2, shape, generator=g, dtype=torch.int32)
    m[..., 0] = 0  # every row keeps a key
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(26)
    out = {}
    for name, specs, fn in ROWS:
        xs = [draw(s, g) for s in specs]
        for i, x in enumerate(xs):
            out[f"{name}/in{i}"] = x.clone()
            if specs[i][0] == "real" and specs[i][4]:
                x.requires_grad_(True)
        y = fn(*xs)
        cot = torch.rand(y.shape, generator=g, dtype=torch.float64) * 2 - 1
        (y * cot).sum().backward()
        out[f"{name}/cot"] = cot
        out[f"{name}/out"] = y.detach()
        for i, x in enumerate(xs):
            if x.requires_grad:
                out[f"{name}/grad{i}"] = x.grad
    path = os.path.join(a.out, "op_reference.safetensors")
    save_safetensors(path, out, {"generator": "tools/make_op_reference.py",
                                 "torch": torch.__version__, "rows": str(len(ROWS))})
    print(f"{path}: {len(ROWS)} rows, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
