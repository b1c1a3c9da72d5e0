"""sklearn's handwritten digits (python3-sklearn ships them: 1797 8x8 images, values 0..16,
labels 0..9) in the CIFAR-10 binary format regen's `cifar10:DIR` data reads, and the batch order
regen's CIFAR-10 source draws them in. Used by tests/python/test_digits.py (at test time) and
tools/torch_digits.py (PyTorch's figure for that test).

Each image is scaled to 32x32 (every pixel a 4x4 square) and to bytes (v * 240 / 16), copied to
the three channels, and each byte gets a fixed noise of 0..15 (numpy's RandomState(1)). Without the
noise the background is exactly 0 and the upscaled strokes repeat values, so max pooling sees exact
ties everywhere: which of equal maxima takes the gradient is the library's choice (PyTorch's oneDNN
path and its plain path choose differently, and their trajectories part after four steps), and the
comparison would be of tie-breaking rules. A fixed permutation (numpy's RandomState(0)) puts TRAIN
images in DIR/data_batch_1.bin and the other 1797 - TRAIN in DIR/test_batch.bin.
"""
import os

import numpy as np

TRAIN = 1297  # training images; the remaining 500 are the held-out split
RECORD = 1 + 3 * 32 * 32


def write_digits_cifar(folder):
    """Writes data_batch_1.bin and test_batch.bin into folder; returns (train, test) counts."""
    from sklearn.datasets import load_digits  # Debian: python3-sklearn

    d = load_digits()
    images = np.rint(d.images * 240.0 / 16.0).astype(np.int64)  # (1797, 8, 8), 0..240
    images = images.repeat(4, axis=1).repeat(4, axis=2)  # (1797, 32, 32)
    images = np.repeat(images[:, None], 3, axis=1)  # (1797, 3, 32, 32)
    noise = np.random.RandomState(1).randint(0, 16, size=images.shape)
    images = (images + noise).astype(np.uint8)
    order = np.random.RandomState(0).permutation(len(images))
    os.makedirs(folder, exist_ok=True)
    for name, idx in (("data_batch_1.bin", order[:TRAIN]), ("test_batch.bin", order[TRAIN:])):
        rec = np.zeros((len(idx), RECORD), dtype=np.uint8)
        rec[:, 0] = d.target[idx]
        rec[:, 1:] = images[idx].reshape(len(idx), -1)
        rec.tofile(os.path.join(folder, name))
    return TRAIN, len(images) - TRAIN


# regen's Philox4x32-10 (core/philox.h), for the order regen's CIFAR-10 source shuffles in.
M = 0xFFFFFFFF


def philox_word(seed, subsequence, element):
    block = element >> 2
    c = [block & M, (block >> 32) & M, subsequence & M, (subsequence >> 32) & M]
    k0, k1 = seed & M, (seed >> 32) & M
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M, p1 & M, ((p0 >> 32) ^ c[3] ^ k1) & M, p0 & M]
        k0 = (k0 + 0x9E3779B9) & M
        k1 = (k1 + 0xBB67AE85) & M
    return c[element & 3]


def epoch_order(records, seed, epoch):
    """The record order of one epoch, as models/data.cpp's Cifar10::shuffle makes it."""
    order = list(range(records))
    for i in range(records - 1, 0, -1):
        r = philox_word(seed, 5 + epoch, i)
        j = r % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def batches(records, batch, steps, seed=0):
    """The record indices of `steps` batches of `batch`, crossing epochs as regen does."""
    out, epoch, order, pos = [], 0, epoch_order(records, seed, 0), 0
    for _ in range(steps):
        b = []
        for _ in range(batch):
            if pos == records:
                epoch += 1
                order, pos = epoch_order(records, seed, epoch), 0
            b.append(order[pos])
            pos += 1
        out.append(b)
    return out
