# GPT-2 from Python (models/gpt2.h, docs/models.md): regen.Model("gpt2-tiny") trains on an llm.c
# token shard written here with numpy, with AdamW decaying the matrices only (the biases and layer
# norms keep what Adam alone gives them), saves and loads llm.c's checkpoint format, and refuses a
# bad shard naming it.
import numpy as np
import pytest

import regen


def write_shard(path, tokens):
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(tokens, np.uint16).tobytes())


def counting_tokens(n, vocab=100, seed=0):
    """Counting sequences modulo vocab with a random start and stride: a task the loss learns."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        start, stride = rng.integers(0, vocab), rng.integers(1, 7)
        out += [(start + stride * t) % vocab for t in range(17)]
    return out[:n]


def test_gpt2_tiny_trains_on_llmc_tokens_and_round_trips_its_checkpoint(tmp_path):
    models = regen.models()
    assert {"gpt2", "gpt2-medium", "gpt2-tiny"} <= set(models)
    assert "124M" in models["gpt2"]
    shard = str(tmp_path / "train.bin")
    write_shard(shard, counting_tokens(4000))
    m = regen.Model("gpt2-tiny", batch=8, device="cpu", threads=1, optimizer="adamw", lr=3e-3,
                    weight_decay=0.1, data="tokens:" + shard)
    names = list(m.state_dict())
    assert names[:3] == ["wte.weight", "wpe.weight", "h.0.ln_1.weight"]
    assert names[-1] == "ln_f.bias"
    assert m.state_dict()["wte.weight"].shape == (128, 32)  # vocabulary 100 padded to 128
    losses = [r.loss for r in m.train(40)]
    # A fresh model is near uniform over 100 tokens (log 100 = 4.6); counting is learnable.
    assert abs(losses[0] - np.log(100)) < 0.1
    assert np.mean(losses[-5:]) < losses[0] - 0.8
    state = m.state_dict()
    # The padded rows of the tied embedding are never a class: still zero after training.
    assert not state["wte.weight"][100:].any()
    ckpt = str(tmp_path / "tiny.bin")
    m.save(ckpt)
    assert (tmp_path / "tiny.bin").stat().st_size == 1024 + 4 * 30080
    other = regen.Model("gpt2-tiny", batch=8, device="cpu", threads=1, seed=5)
    assert not np.array_equal(other.state_dict()["wpe.weight"], state["wpe.weight"])
    assert other.load(ckpt) == len(names)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, state[k])


def test_gpt2_bad_llmc_files_are_named(tmp_path):
    shard = str(tmp_path / "big.bin")
    write_shard(shard, [1, 2, 3] * 20 + [150])
    with pytest.raises(regen.Error, match=r"big\.bin.*token 150 at position 60"):
        regen.Model("gpt2-tiny", batch=2, device="cpu", data="tokens:" + shard).train(1)
    m = regen.Model("gpt2-tiny", batch=2, device="cpu")
    with pytest.raises(regen.Error, match=r"big\.bin.*bad magic 20240520"):
        m.load(shard)
