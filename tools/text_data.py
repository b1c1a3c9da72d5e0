"""A real text for the language model's fidelity tests, and what regen and PyTorch need to train on
it alike: the initial weights of transformer-tiny at byte vocabulary, the order regen's `text:FILE`
source draws its windows in, and the held-out windows regen evaluates on. Used by
tests/python/test_text_bf16.py (at test time, without PyTorch) and tools/torch_text.py
(PyTorch's figures for that test).

The text is the GNU GPL version 3 as Debian's base-files package installs it (35149 bytes of
English ASCII prose, present on every Debian system and unchanged since 2007): nothing is
downloaded, and its SHA-256 pins the exact bytes the figures were measured on.
"""
import hashlib
import os

import numpy as np

from digits_data import philox_word

TEXT = "/usr/share/common-licenses/GPL-3"
TEXT_SHA256 = "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986"
HOLDOUT = 0.1  # eval_split: the last tenth is held out, and training never draws from it

# transformer-tiny (models/model.cpp's preset) with the 256 byte tokens text data needs.
VOCAB, SEQ, D, LAYERS, FF = 256, 16, 32, 2, 64


def text_bytes():
    """The text's bytes, or None when the file is missing or is not the one measured."""
    if not os.path.exists(TEXT):
        return None
    with open(TEXT, "rb") as f:
        data = f.read()
    return data if hashlib.sha256(data).hexdigest() == TEXT_SHA256 else None


def split(data):
    """(training bytes, held-out bytes) as regen's text source splits them at eval_split."""
    tail = int(len(data) * HOLDOUT)
    return data[:len(data) - tail], data[len(data) - tail:]


def init_state(seed=0):
    """Float32 initial weights under PyTorch's state-dict names (regen's transformer-tiny uses the
    same), drawn by NumPy so that a test without PyTorch loads the same ones. The scales are
    PyTorch's defaults: embeddings N(0, 1); linear weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
    biases alike, but attention's projections with zero biases (nn.MultiheadAttention's); layer
    norms 1 and 0."""
    rng = np.random.RandomState(seed)

    def uniform(shape, fan_in):
        b = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-b, b, size=shape).astype(np.float32)

    s = {"tok_emb.weight": rng.standard_normal((VOCAB, D)).astype(np.float32),
         "pos_emb.weight": rng.standard_normal((SEQ, D)).astype(np.float32)}
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        s[p + "self_attn.in_proj_weight"] = uniform((3 * D, D), D)
        s[p + "self_attn.in_proj_bias"] = np.zeros(3 * D, np.float32)
        s[p + "self_attn.out_proj.weight"] = uniform((D, D), D)
        s[p + "self_attn.out_proj.bias"] = np.zeros(D, np.float32)
        s[p + "linear1.weight"] = uniform((FF, D), D)
        s[p + "linear1.bias"] = uniform((FF,), D)
        s[p + "linear2.weight"] = uniform((D, FF), FF)
        s[p + "linear2.bias"] = uniform((D,), FF)
        for n in ("norm1", "norm2"):
            s[p + n + ".weight"] = np.ones(D, np.float32)
            s[p + n + ".bias"] = np.zeros(D, np.float32)
    s["lm_head.weight"] = uniform((VOCAB, D), D)
    s["lm_head.bias"] = uniform((VOCAB,), D)
    return s


def window_starts(train_len, batch, steps, seed=0):
    """The first byte of every training window, `steps` batches of `batch`, in the order
    models/data.cpp's TextBytes draws them (Philox stream 6, one word per window)."""
    windows = train_len - SEQ
    return [[philox_word(seed, 6, t * batch + i) % windows for i in range(batch)]
            for t in range(steps)]


def windows(data, starts):
    """(inputs, targets) as int64 arrays (len(starts), SEQ): the bytes at each start and the next
    ones."""
    a = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    idx = np.asarray(starts)[:, None] + np.arange(SEQ)[None, :]
    return a[idx], a[idx + 1]


def held_out_windows(held):
    """The held-out split as regen evaluates it: consecutive windows of SEQ and their next bytes."""
    n = (len(held) - 1) // SEQ
    return windows(held, [i * SEQ for i in range(n)])
