# The module, models, tensors and files from Python; a step checked against the command line's.
import json
import os
import struct
import subprocess

import numpy as np
import pytest

import regen


def test_import_and_registries():
    assert regen.__version__
    assert set(regen.build) == {"cuda", "cudnn", "milp", "mpi", "nccl"}
    models = regen.models()
    assert list(models)[:5] == ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]
    assert "transformer-tiny" in models and all(models.values())
    assert list(regen.policies())[:6] == ["none", "blocks", "sqrt", "mutwo", "dp", "milp"]
    assert regen.chains() == ["auto", "keep", "drop"]
    assert issubclass(regen.OutOfMemory, regen.Error)


def test_model_options_and_config():
    m = regen.Model("resnet-tiny", batch=2, device="cpu", image_size=np.int64(64), num_classes=7, seed=3)
    assert m.name == "resnet-tiny" and m.batch == 2 and m.device == "cpu"
    assert m.config["image_size"] == 64 and m.config["num_classes"] == 7 and m.config["seed"] == 3
    assert m.num_parameters == sum(t.numel for t in m.parameters().values())
    assert m.steps_done == 0 and m.first_step_peak > 0
    # The pre-flight dry run predicted the first step's peak exactly (on the CPU).
    assert m.step().peak_allocated == m.first_step_peak


def test_tensor_buffer_protocol_is_a_live_view():
    m = regen.Model("resnet-tiny", batch=2, device="cpu")
    w = m.parameters()["fc.weight"]
    assert w.name == "fc.weight" and w.dtype == "float32" and w.device == "cpu"
    view = np.asarray(w)
    assert view.shape == w.shape and view.dtype == np.float32
    copy = w.numpy()
    np.testing.assert_array_equal(view, copy)
    view[0, 0] = 42.0  # a view: the write reaches the parameter
    assert m.state_dict()["fc.weight"][0, 0] == 42.0
    assert copy[0, 0] != 42.0
    m.step()
    g = w.grad
    assert g is not None and g.shape == w.shape and np.isfinite(g.numpy()).all()


def test_state_dict_round_trip():
    a = regen.Model("resnet-tiny", batch=2, device="cpu", seed=1)
    b = regen.Model("resnet-tiny", batch=2, device="cpu", seed=2)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert any(not np.array_equal(sa[k], sb[k]) for k in sa)
    b.load_state_dict(sa)
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v, sa[k])
    # Any layout comes in (a Fortran-ordered copy of the same values).
    w = sa["fc.weight"]
    b.load_state_dict({"fc.weight": np.asfortranarray(w)}, strict=False)
    np.testing.assert_array_equal(b.state_dict()["fc.weight"], w)


def test_safetensors_and_checkpoints(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 2], dtype=np.int64)}
    path = str(tmp_path / "t.safetensors")
    regen.save_safetensors(path, arrays, {"note": "x"})
    back, meta = regen.load_safetensors(path)
    assert list(back) == ["a", "b"] and meta["note"] == "x"
    for k in arrays:
        np.testing.assert_array_equal(back[k], arrays[k])
        assert back[k].dtype == arrays[k].dtype

    a = regen.Model("resnet-tiny", batch=2, device="cpu", seed=5)
    a.train(2)
    ckpt = str(tmp_path / "m.safetensors")
    a.save(ckpt)
    b = regen.Model("resnet-tiny", batch=2, device="cpu", seed=6)
    assert b.load(ckpt) == len(a.state_dict())
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v, a.state_dict()[k])
    _, meta = regen.load_safetensors(ckpt)
    assert meta["model"] == "resnet-tiny" and meta["steps"] == "2"

def test_safetensors_f16_and_bf16(tmp_path):
    # float16 arrays are F16 tensors and come back as float16, bit for bit.
    h = np.array([[1.5, -65504.0, 2.0 ** -24], [0.0, np.inf, -3.25]], dtype=np.float16)
    path = str(tmp_path / "h.safetensors")
    regen.save_safetensors(path, {"h": h})
    back, _ = regen.load_safetensors(path)
    assert back["h"].dtype == np.float16
    np.testing.assert_array_equal(back["h"].view(np.uint16), h.view(np.uint16))
    # A BF16 tensor (as torch writes one): NumPy has no bfloat16, so it comes back as float32,
    # exactly the values the 16 bits hold (the top half of each float32).
    values = np.array([1.0, -2.5, 3.140625, 1.0e38], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2")
    header = json.dumps({"b": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    raw = str(tmp_path / "b.safetensors")
    with open(raw, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bits.tobytes())
    back, _ = regen.load_safetensors(raw)
    assert back["b"].dtype == np.float32
    np.testing.assert_array_equal(back["b"], (bits.astype(np.uint32) << 16).view(np.float32))



@pytest.mark.parametrize("name,extra", [("resnet-tiny", []), ("transformer-tiny", ["--seq-len", "32"])])
def test_one_step_matches_the_command_line(tmp_path, regen_binary, name, extra):
    """The same step from Python and from `regen train`: the same loss and bitwise the same weights."""
    cli_ckpt = str(tmp_path / "cli.safetensors")
    out = subprocess.run([regen_binary, "train", "--model", name, "--batch", "4", "--device", "cpu",
                          "--steps", "1", "--progress", "plain", "--lr", "0.05", "--seed", "7",
                          "--save", cli_ckpt] + extra,
                         check=True, capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("step 1/1 loss "))
    cli_loss = float(line.split()[3])

    kw = {"seq_len": 32} if extra else {}
    m = regen.Model(name, batch=4, device="cpu", lr=0.05, seed=7, **kw)
    r = m.step()
    assert f"{r.loss:.4f}" == f"{cli_loss:.4f}"
    assert r.ms > 0 and r.peak_allocated > 0 and r.peak_reserved >= r.peak_allocated
    cli_state, meta = regen.load_safetensors(cli_ckpt)
    assert meta["model"] == name
    mine = m.state_dict()
    assert list(mine) == list(cli_state)
    for k, v in mine.items():
        assert np.array_equal(v, cli_state[k]), k


def test_train_progress_callback_can_stop():
    m = regen.Model("resnet-tiny", batch=2, device="cpu")
    seen = []

    def progress(step, result):
        seen.append((step, result.loss))
        return step < 2

    results = m.train(5, progress=progress)
    assert [s for s, _ in seen] == [1, 2] and len(results) == 2
    assert m.steps_done == 2


def test_module_level_profile():
    p = regen.profile("transformer-tiny", batch=2, device="cpu", iterations=1, seq_len=32)
    assert (p.model, p.batch, p.device, p.iterations) == ("transformer-tiny", 2, "cpu", 1)
    assert p.run["--seq-len"] == "32" and p.num_saved > 0 and p.iteration_ms > 0
    m = regen.Model("transformer-tiny", batch=2, device="cpu", seq_len=32)
    q = regen.profile(m, iterations=1)
    assert q is m.profile_in_use and q.num_saved == p.num_saved
    with pytest.raises(regen.Error, match="options go to the Model"):
        regen.profile(m, seq_len=16)
    # Op times on the device's clock: the same graph, the timing recorded; a bad name refused
    # as the command line refuses it.
    assert p.op_timing == "sync"
    d = regen.profile("transformer-tiny", batch=2, device="cpu", iterations=1, seq_len=32,
                      op_timing="device")
    assert d.op_timing == "device" and d.num_saved == p.num_saved and d.iteration_ms > 0
    with pytest.raises(regen.Error, match="op_timing: unknown op timing 'events'"):
        m.profile(iterations=1, op_timing="events")


def test_masks_and_compress():
    # Packed saves change no bit of training; the Transformer with dropout packs each layer's relu.
    args = dict(batch=2, device="cpu", seed=3, dropout=0.1)
    # One model at a time: dropout draws from the process's stream, which a model's seed resets.
    on = regen.Model("transformer-tiny", **args)
    on_losses = [r.loss for r in on.train(2)]
    assert on.profile(iterations=1).run["--masks"] == "on"
    off = regen.Model("transformer-tiny", masks=False, **args)
    assert [r.loss for r in off.train(2)] == on_losses
    # compress='bf16' with policy 'none' still plans (the plan holds what it retains narrow), and
    # every step under it measures the predicted peaks.
    lossy = regen.Model("transformer-tiny", compress="bf16", **args)
    steps = lossy.train(3, policy="none", profile_steps=1)
    plan = lossy.plan_in_use
    assert plan.predicted.narrowed > 0 and plan.predicted.compress_ms > 0
    assert [s.peak_allocated for s in steps[1:]] == [plan.peak_allocated] * 2
