# The training loop from Python: Model takes the training-loop options and checks them as the
# command line does (SessionOptions), Model.train takes the schedule, clipping and evaluation
# options, Model.evaluate, gradient accumulation, exact resume (save_state / resume, bitwise), the
# metrics log. PyTorch's figures for the same loop: tests/test_training.cpp; real data:
# test_digits.py.
import csv
import math

import numpy as np
import pytest

import regen

LM = dict(name="transformer-tiny", batch=4, device="cpu")


@pytest.mark.parametrize("kwargs,match", [
    (dict(accumulate=0), r"^accumulate=0: must be a positive integer"),
    (dict(lr_schedule="linear"), r"^lr_schedule='linear': must be constant, step or cosine"),
    (dict(lr_schedule="step"), r"^lr_schedule='step' needs lr_step_size"),
    (dict(lr_schedule="cosine"), r"lr_schedule='cosine' needs schedule_steps"),
    (dict(lr_schedule="cosine", warmup_steps=5, schedule_steps=5), "must be more than warmup_steps=5"),
    (dict(clip_grad_norm=-1.0), r"^clip_grad_norm=-1: must be a finite number >= 0"),
    (dict(eval_split=0.95), r"^eval_split=0.95: must be a number from 0 to 0.9"),
    (dict(eval_split=0.5), r"^eval_split=0.5 holds out the end of a text file; this data has "
                           r"held-out examples of its own"),
    (dict(lr_schedule="cosine", schedule_steps=5, lr=0.1, lr_min=0.5),
     r"^lr_schedule='cosine' decays from lr=0.1 to lr_min=0.5, which must not be above it"),
    (dict(warmup_steps="2"), r"^warmup_steps='2': must be an integer \(got a str\)"),
    (dict(grad_norm=1), r"^grad_norm=1: must be True or False"),
])
def test_training_options_are_checked_like_the_flags(kwargs, match):
    with pytest.raises(regen.Error, match=match):
        regen.Model(**LM, **kwargs)


def test_schedule_and_clipping_in_train():
    m = regen.Model(**LM, lr=0.2)
    rs = m.train(6, lr_schedule="cosine", warmup_steps=2, schedule_steps=6, lr_min=0.02,
                 clip_grad_norm=0.25)
    # warm-up lr*(t+1)/W, then cosine from lr to lr_min over the remaining 4 steps
    want = [0.1, 0.2] + [0.02 + 0.18 * (1 + math.cos(math.pi * u / 4)) / 2 for u in range(4)]
    np.testing.assert_allclose([r.lr for r in rs], want, rtol=1e-12)
    assert all(r.grad_norm is not None and r.grad_norm > 0 for r in rs)
    assert [r.optimizer_step for r in rs] == list(range(1, 7))
    assert m.optimizer_steps == 6
    # The options stay for later calls; a bad one is refused with its keyword.
    with pytest.raises(regen.Error, match=r"^lr_schedule=.step. needs lr_step_size"):
        m.train(1, lr_schedule="step", lr_step_size=0)
    with pytest.raises(regen.Error, match="accumulate is set when the Model is built"):
        m.train(1, accumulate=2)
    with pytest.raises(regen.Error, match="not an option of train"):
        m.train(1, image_size=64)


def test_resume_is_bitwise_the_run_that_never_stopped(tmp_path):
    opts = dict(LM, optimizer="adamw", lr=0.01, lr_schedule="cosine", warmup_steps=1,
                schedule_steps=6, clip_grad_norm=0.5)
    full = regen.Model(**opts)
    full.train(6)
    first = regen.Model(**opts)
    first.train(3)
    path = str(tmp_path / "test_training_state.safetensors")
    first.save_state(path)
    resumed = regen.Model(**opts)
    meta = resumed.resume(path)
    assert meta["optimizer_steps"] == "3" and meta["plan"] == "no plan"
    resumed.train(3)
    a, b = full.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    with pytest.raises(regen.Error, match=r"saved by a run with lr=0.01, but this run has lr=0.02"):
        regen.Model(**dict(opts, lr=0.02)).resume(path)


def test_accumulation_equals_the_full_batch():
    full = regen.Model("transformer-tiny", batch=8, device="cpu", dropout=0.0)
    acc = regen.Model("transformer-tiny", batch=4, accumulate=2, device="cpu", dropout=0.0)
    a, b = full.step(), acc.step()
    assert b.micro_batches == 2
    assert abs(a.loss - b.loss) <= 1e-6 * a.loss
    # Half the micro-batch's activations: the accumulated step's peak is lower.
    assert b.peak_allocated < a.peak_allocated
    for (k, x), (_, y) in zip(full.state_dict().items(), acc.state_dict().items()):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6 * max(1.0, np.abs(x).max()), err_msg=k)


def test_evaluate_and_eval_every(tmp_path):
    m = regen.Model("resnet-tiny", batch=4, device="cpu", eval_batches=2)
    before = m.evaluate()
    assert before["examples"] == 8 and before["batches"] == 2
    assert 0 <= before["accuracy"] <= 1 and before["perplexity"] is None
    assert before["peak_allocated"] > before["persistent"]
    log = tmp_path / "metrics.csv"
    m.train(4, eval_every=2, log=str(log))
    assert [e["step"] for e in m.evaluations] == [2, 4]
    rows = list(csv.DictReader(open(log)))
    assert [(r["kind"], r["step"]) for r in rows] == [
        ("train", "1"), ("train", "2"), ("eval", "2"), ("train", "3"), ("train", "4"), ("eval", "4")]
    assert float(rows[2]["accuracy"]) == m.evaluations[0]["accuracy"]
    lm = regen.Model(**LM)
    e = lm.evaluate(batches=1)
    assert e["accuracy"] is None and e["perplexity"] == pytest.approx(math.exp(e["loss"]))
