# Bad input from Python raises regen.Error (or Python's own TypeError for a wrong argument type)
# with a message naming what was wrong; nothing crashes and no file is left half-written.
import os

import numpy as np
import pytest

import regen
from conftest import RESNET, TRANSFORMER


@pytest.fixture(scope="module")
def profile():
    m = regen.Model("resnet-tiny", batch=4, device="cpu")
    return m.profile(iterations=1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="resnet9000"), "resnet9000.*resnet18"),
    (dict(batch=0), "batch must be a positive integer, got 0"),
    (dict(device="tpu"), "tpu"),
    (dict(imagesize=64), "unknown model option 'imagesize'.*image_size"),
    (dict(image_size="64"), "image_size must be an integer"),
    (dict(image_size=64.0), "image_size must be an integer"),
    (dict(threads=2**40), "threads is out of range"),
    (dict(seed=-1), "seed must be >= 0"),
    (dict(lr=float("nan")), "lr"),
    (dict(lr=True), "lr must be a number"),
    (dict(optimizer="adam"), "adam"),
    (dict(seq_len=16), "seq-len"),  # a Transformer option on a ResNet
    (dict(batch=10**12), "too large"),
    (dict(data="cifar10:/nonexistent"), "nonexistent"),
])
def test_bad_model_options(kwargs, match):
    args = dict(name="resnet-tiny", batch=2, device="cpu")
    args.update(kwargs)
    with pytest.raises(regen.Error, match=match):
        regen.Model(args.pop("name"), **args)


def test_bad_decisions(profile):
    n = profile.num_saved
    with pytest.raises(regen.Error, match=f"decisions has {n - 1} entries.*{n} saved tensors"):
        regen.simulate(profile, np.zeros(n - 1, dtype=bool))
    with pytest.raises(regen.Error, match="one-dimensional"):
        regen.simulate(profile, np.zeros((n, 1), dtype=bool))
    with pytest.raises(regen.Error, match="bools or 0/1 integers"):
        regen.simulate(profile, np.full(n, 0.5))
    bad = np.zeros(n, dtype=np.int64)
    bad[3] = 2
    with pytest.raises(regen.Error, match=r"decisions\[3\] is 2"):
        regen.simulate(profile, bad)
    # Recomputing a saved tensor that is not a candidate (an input of the model).
    not_cand = int(np.flatnonzero(~profile.saved()["candidate"])[0])
    d = np.zeros(n, dtype=bool)
    d[not_cand] = True
    with pytest.raises(regen.Error, match="saved tensor .* cannot be recomputed"):
        regen.simulate(profile, d)
    with pytest.raises(regen.Error, match="saved tensor .* cannot be recomputed"):
        regen.make_plan(profile, d)
    with pytest.raises(regen.Error, match="chain must be 'keep' or 'drop'"):
        regen.simulate(profile, np.zeros(n, dtype=bool), chain="auto")
    with pytest.raises(regen.Error, match="budget or a limit"):
        regen.simulate(profile, np.zeros(n, dtype=bool), budget="50%", limit=1 << 20)
    with pytest.raises(regen.Error, match="regeneration"):
        regen.simulate(profile, np.zeros(n, dtype=bool), regenerations=[(0, [5])])


def test_bad_plans(profile):
    with pytest.raises(regen.Error, match="unknown.*mutwo"):
        regen.plan(profile, "greedy", "50%")
    with pytest.raises(regen.Error, match="budget"):
        regen.plan(profile, "dp", "fifty")
    with pytest.raises(regen.Error, match="60%"):
        regen.plan(profile, "dp", 0.6)
    with pytest.raises(regen.Error, match="positive"):
        regen.plan(profile, "dp", -5)
    with pytest.raises(regen.Error, match="reserved.*allocated"):
        regen.plan(profile, "dp", "50%", budget_of="device")
    with pytest.raises(regen.Error, match="layout"):
        regen.plan(profile, "dp", "50%", layout="tight")
    with pytest.raises(regen.Error, match="profile is None"):
        regen.plan(None, "dp", "50%")
    with pytest.raises(TypeError):
        regen.plan("profile.json", "dp", "50%")


def test_profile_of_another_model_is_refused(profile):
    other = regen.Model("resnet-tiny", batch=2, device="cpu")
    with pytest.raises(regen.Error, match="batch"):
        other.use_profile(profile)
    plan = regen.plan(profile, "none")
    with pytest.raises(regen.Error, match="batch"):
        other.use_plan(plan)
    adamw = regen.Model("resnet-tiny", batch=4, device="cpu", optimizer="adamw")
    with pytest.raises(regen.Error, match="--optimizer adamw"):
        adamw.use_profile(profile)


def test_an_infeasible_plan_is_refused_before_training(profile):
    m = regen.Model("resnet-tiny", batch=4, device="cpu")
    plan = regen.plan(profile, "dp", "1%", budget_of="allocated")
    assert not plan.feasible and "cannot be met" in plan.note
    with pytest.raises(regen.Error, match="does not fit its budget"):
        m.train(1, plan=plan)
    assert m.steps_done == 0
    with pytest.raises(regen.Error, match="plan or a policy"):
        m.train(1, plan=plan, policy="dp")
    with pytest.raises(regen.Error, match="needs a policy"):
        m.train(1, budget="50%")
    fresh = regen.Model("resnet-tiny", batch=4, device="cpu")
    with pytest.raises(regen.Error, match="no profile"):
        fresh.plan("dp", "50%")


def test_divergence_is_an_error():
    m = regen.Model("resnet-tiny", batch=4, device="cpu", lr=1e300)
    with pytest.raises(regen.Error, match="training diverged"):
        m.train(3)


def test_a_python_planner_that_returns_garbage():
    regen.register_planner("py-garbage", lambda p, b: [1, 2, 3])
    m = regen.Model("resnet-tiny", batch=4, device="cpu")
    m.profile(iterations=1)
    with pytest.raises(regen.Error, match="planner 'py-garbage' returned bad decisions: decisions has 3"):
        m.plan("py-garbage", "50%")

    def raising(p, b):
        raise ValueError("my planner failed")

    regen.register_planner("py-raising", raising)
    with pytest.raises(ValueError, match="my planner failed"):
        m.plan("py-raising", "50%")
    with pytest.raises(regen.Error, match="name"):
        regen.register_planner("bad name!", raising)


def test_bad_state_and_files(tmp_path):
    m = regen.Model("resnet-tiny", batch=2, device="cpu")
    w = m.state_dict()["fc.weight"]
    with pytest.raises(regen.Error, match="fc.weight"):
        m.load_state_dict({"fc.weight": np.zeros((3, 3), dtype=np.float32)}, strict=False)
    with pytest.raises(regen.Error, match="float16.*astype"):
        m.load_state_dict({"fc.weight": w.astype(np.float16)}, strict=False)
    with pytest.raises(regen.Error, match="missing|unexpected|strict"):
        m.load_state_dict({"fc.weight": w})
    with pytest.raises(regen.Error, match="list"):
        m.load_state_dict({"fc.weight": [1.0, 2.0]}, strict=False)
    # The weights are unchanged by the refused loads.
    np.testing.assert_array_equal(m.state_dict()["fc.weight"], w)

    with pytest.raises(regen.Error, match="nope.json"):
        regen.load_profile(str(tmp_path / "nope.json"))
    damaged = tmp_path / "damaged.json"
    damaged.write_text('{"model": "resnet-tiny"')
    with pytest.raises(regen.Error, match="damaged.json"):
        regen.load_profile(str(damaged))
    # A failed save leaves an existing file as it was.
    keep = tmp_path / "keep.safetensors"
    regen.save_safetensors(str(keep), {"a": np.ones(2, dtype=np.float32)})
    before = keep.read_bytes()
    with pytest.raises(regen.Error):
        regen.save_safetensors(str(keep), {"": np.ones(2, dtype=np.float32)})
    assert keep.read_bytes() == before
    with pytest.raises(regen.Error, match="no_such_dir"):
        m.save(str(tmp_path / "no_such_dir" / "m.safetensors"))
    # A checkpoint of another model is refused, naming both.
    t = regen.Model("transformer-tiny", batch=2, device="cpu")
    ckpt = str(tmp_path / "t.safetensors")
    t.save(ckpt)
    with pytest.raises(regen.Error, match="transformer-tiny.*resnet-tiny"):
        m.load(ckpt)
    assert sorted(os.listdir(tmp_path)) == ["damaged.json", "keep.safetensors", "t.safetensors"]
