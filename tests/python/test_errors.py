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
    (dict(batch=0), r"^batch=0: must be a positive integer"),
    (dict(batch=2**70), r"^batch=1180591620717411303424: must be at most"),
    (dict(batch="2"), r"^batch='2': must be an integer \(got a str\)"),
    (dict(device="tpu"), r"^device='tpu': unknown device 'tpu'"),
    (dict(imagesize=64), "unknown model option 'imagesize'.*image_size"),
    (dict(image_size="64"), r"^image_size='64': must be an integer \(got a str\)"),
    (dict(image_size=64.0), r"^image_size=64.0: must be an integer \(got a float\)"),
    (dict(seed=-1), r"^seed=-1: must be a non-negative integer"),
    (dict(seed=2**64), r"^seed=18446744073709551616: must be at most 18446744073709551615"),
    (dict(lr=float("nan")), r"^lr=nan: must be a finite number >= 0"),
    (dict(lr=True), r"^lr=True: must be a number \(got a bool\)"),
    (dict(optimizer="adam"), r"^optimizer='adam': must be sgd or adamw"),
    (dict(seq_len=16), r"^seq_len=16 does not apply to model 'resnet-tiny' "
                       r"\(its options: image_size, num_classes\)"),
    (dict(batch=10**12), r"^batch=1000000000000: must be at most 16777216"),
    (dict(data="cifar10:/nonexistent"), r"^data='cifar10:/nonexistent': cannot open"),
    (dict(data="text:/x"), r"bad data='text:/x': model 'resnet-tiny' takes synthetic, cifar10:DIR"),
])
def test_bad_model_options(kwargs, match):
    args = dict(name="resnet-tiny", batch=2, device="cpu")
    args.update(kwargs)
    with pytest.raises(regen.Error, match=match):
        regen.Model(args.pop("name"), **args)


# Every range check of the command line, applied by the module from the same place
# (SessionOptions::validate), with the keyword in the message. Each is refused before anything is
# built: a thread count libgomp cannot take used to crash the interpreter, a vocabulary of one
# token trained with a loss of 0.
@pytest.mark.parametrize("name,kwargs,match", [
    ("resnet-tiny", dict(threads=300000), r"^threads=300000: must be at most 1024$"),
    ("resnet-tiny", dict(threads=5000), r"^threads=5000: must be at most 1024$"),
    ("resnet-tiny", dict(threads=2**31 - 1), r"^threads=2147483647: must be at most 1024$"),
    ("resnet-tiny", dict(threads=-1), r"^threads=-1: must be a positive integer$"),
    ("resnet-tiny", dict(num_classes=1), r"^num_classes=1: must be an integer from 2 to 16777216$"),
    ("resnet-tiny", dict(image_size=0), r"^image_size=0: must be a positive integer$"),
    ("resnet-tiny", dict(image_size=16),
     r"^image_size=16 is too small for ResNet's five downsamplings \(at least 32\)$"),
    ("resnet-tiny", dict(batch=1, image_size=32),
     r"^batch=1 at image_size=32: batch norm in training needs at least 2 values per channel.*"
     r"use batch=2 or more$"),
    ("resnet-tiny", dict(batch=2, image_size=1099511627776), r"image_size=1099511627776.*too large"),
    ("resnet-tiny", dict(momentum=1.5), r"^momentum=1.5: must be a number from 0 to 1$"),
    ("resnet-tiny", dict(weight_decay=-1), r"^weight_decay=-1: must be a finite number >= 0$"),
    ("resnet-tiny", dict(conv="fast"), r"^conv='fast': must be native or cudnn$"),
    ("resnet-tiny", dict(math="fp16"), r"^math='fp16': must be fp32 or tf32$"),
    ("resnet-tiny", dict(compress="bf17"), r"^compress='bf17': must be none, bf16 or fp16$"),
    ("resnet-tiny", dict(cuda_graph="always"), r"^cuda_graph='always': must be off, on or auto$"),
    ("resnet-tiny", dict(masks="on"), r"masks.*True or False"),
    ("resnet-tiny", dict(math="fp32", tf32=True),
     r"^tf32=True \(the same as math='tf32'\) conflicts with math='fp32'"),
    ("resnet-tiny", dict(tf32=True), r"^tf32=True applies to CUDA devices"),
    ("transformer-tiny", dict(dropout=-0.5), r"^dropout=-0.5: must be a number from 0 to 0.99$"),
    ("transformer-tiny", dict(dropout=1.0), r"^dropout=1: must be a number from 0 to 0.99$"),
    ("transformer-tiny", dict(vocab=0), r"^vocab=0: must be an integer >= 2$"),
    ("transformer-tiny", dict(vocab=1), r"^vocab=1: must be an integer >= 2$"),
    ("transformer-tiny", dict(seq_len=0), r"^seq_len=0: must be a positive integer$"),
    ("transformer-tiny", dict(lm_head_chunk=-2),
     r"^lm_head_chunk=-2: must be an integer from -1 to 2147483647$"),
    ("transformer-tiny", dict(lm_head_recompute=2),
     r"^lm_head_recompute=2: must be at most 1$"),
    ("transformer-tiny", dict(lm_head_recompute=1, lm_head_chunk=-1),
     r"^lm_head_recompute=1 recomputes the fused LM head's logits in the backward, but "
     r"lm_head_chunk=-1 asks for the unfused head .*: pass lm_head_chunk=0 \(or a row count\) "
     r"with it, or lm_head_recompute=0$"),
    ("transformer-tiny", dict(image_size=32), r"^image_size=32 does not apply to model"),
    ("transformer-tiny", dict(data="text:/nonexistent"),
     r"^data='text:FILE' feeds byte tokens \(0..255\), but model 'transformer-tiny' has a "
     r"vocabulary of 101: pass vocab=256 or more$"),
])
def test_the_command_lines_range_checks(name, kwargs, match):
    args = dict(batch=2, device="cpu")
    args.update(kwargs)
    with pytest.raises(regen.Error, match=match):
        regen.Model(name, **args).train(1)
    # regen.profile takes the same options through the same checks.
    with pytest.raises(regen.Error, match=match):
        regen.profile(name, **args)


def test_budgets_are_checked_as_the_command_line_checks_them():
    m = regen.Model("resnet-tiny", batch=4, device="cpu")
    m.profile(iterations=1)
    with pytest.raises(regen.Error, match=r"^budget='' is empty \(leave it out, or pass None, "):
        m.plan("dp", "")
    with pytest.raises(regen.Error, match=r"^budget='' is empty"):
        m.train(1, policy="dp", budget="")
    with pytest.raises(regen.Error, match=r"^budget='' is empty"):
        regen.plan(m.profile_in_use, "dp", "")
    with pytest.raises(regen.Error, match=r"^budget='fifty': bad budget 'fifty'"):
        regen.plan(m.profile_in_use, "dp", "fifty")
    assert m.steps_done == 1  # nothing ran for the refused calls


def test_bad_decisions(profile):
    n = profile.num_saved
    with pytest.raises(regen.Error, match=f"decisions has {n - 1} entries.*{n} saved tensors"):
        regen.simulate(profile, np.zeros(n - 1, dtype=bool))
    with pytest.raises(regen.Error, match="one-dimensional"):
        regen.simulate(profile, np.zeros((n, 1), dtype=bool))
    with pytest.raises(regen.Error, match="bools or 0/1 integers"):
        regen.simulate(profile, np.full(n, 0.5))
    bad = np.zeros(n, dtype=np.int64)
    bad[3] = 3  # fate codes are 0-2 (2: offload)
    with pytest.raises(regen.Error, match=r"decisions\[3\] is 3"):
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
    # Of the wrong shape or type: named, not pybind11's cast error.
    with pytest.raises(regen.Error, match=r"^regenerations: expected a list of \(backward node, "
                                          r"\[saved indices\]\) pairs of integers, got an item "
                                          r"\[1, 2\]$"):
        regen.simulate(profile, np.zeros(n, dtype=bool), regenerations=[[1, 2]])
    with pytest.raises(regen.Error, match=r"^regenerations: .*, got type 'str'$"):
        regen.simulate(profile, np.zeros(n, dtype=bool), regenerations="x")


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
    # A hand-made plan's label goes into plan.json, whose reader refuses an empty one.
    for label in ("", "a b", "x\n"):
        with pytest.raises(regen.Error, match=r"^make_plan: policy=.*: the plan's label must be a "
                                              r"name"):
            regen.make_plan(profile, np.zeros(profile.num_saved, dtype=bool), policy=label)


def test_profile_of_another_model_is_refused(profile):
    other = regen.Model("resnet-tiny", batch=2, device="cpu")
    with pytest.raises(regen.Error, match="batch"):
        other.use_profile(profile)
    plan = regen.plan(profile, "none")
    with pytest.raises(regen.Error, match="batch"):
        other.use_plan(plan)
    adamw = regen.Model("resnet-tiny", batch=4, device="cpu", optimizer="adamw")
    with pytest.raises(regen.Error,
                       match="the profile was made with optimizer=sgd, but this model has "
                             "optimizer=adamw.*pass optimizer=sgd"):
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
    with pytest.raises(regen.Error, match=r"^train: plan must be a regen.Plan \(from regen.plan or "
                                          r"regen.load_plan\), got type 'str'$"):
        m.train(1, plan="plan.json")
    with pytest.raises(regen.Error, match=r"^train: progress must be a function "
                                          r"progress\(step, result\) or None, got type 'int'$"):
        m.train(1, progress=5)
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


def test_a_python_planner_that_returns_a_plan_for_another_profile():
    # Batch 2 and batch 4 of one model have as many saved tensors: only the profile tells them
    # apart.
    other = regen.Model("resnet-tiny", batch=2, device="cpu").profile(iterations=1)
    regen.register_planner("py-other-profile",
                           lambda p, b: regen.make_plan(other, [False] * other.num_saved))
    m = regen.Model("resnet-tiny", batch=4, device="cpu")
    m.profile(iterations=1)
    with pytest.raises(regen.Error, match=r"planner 'py-other-profile' returned a Plan made for "
                                          r"another profile \(resnet-tiny batch 2 on cpu\) than the "
                                          r"one it was given \(resnet-tiny batch 4 on cpu\)"):
        m.plan("py-other-profile", "50%")
    # A plan for the profile it was given, or for the same profile loaded again, is accepted.
    regen.register_planner("py-same-profile",
                           lambda p, b: regen.make_plan(p, [False] * p.num_saved))
    assert m.plan("py-same-profile", "90%") is not None


def test_a_progress_callback_returning_another_type():
    m = regen.Model("resnet-tiny", batch=2, device="cpu")
    with pytest.raises(TypeError, match=r"progress\(step, result\) must return None, True or "
                                        r"False .* type 'str' after step 1"):
        m.train(3, progress=lambda step, result: "yes")
    assert m.train(2, progress=lambda step, result: None) is not None


def test_bad_state_and_files(tmp_path):
    m = regen.Model("resnet-tiny", batch=2, device="cpu")
    w = m.state_dict()["fc.weight"]
    with pytest.raises(regen.Error, match="fc.weight"):
        m.load_state_dict({"fc.weight": np.zeros((3, 3), dtype=np.float32)}, strict=False)
    # A float16 array is an f16 tensor, which a float32 parameter does not take.
    with pytest.raises(regen.Error, match="'fc.weight' is f16 but the model expects f32"):
        m.load_state_dict({"fc.weight": w.astype(np.float16)}, strict=False)
    with pytest.raises(regen.Error, match="missing|unexpected|strict"):
        m.load_state_dict({"fc.weight": w})
    with pytest.raises(regen.Error, match="list"):
        m.load_state_dict({"fc.weight": [1.0, 2.0]}, strict=False)
    # Weights that are not finite are refused as a checkpoint's are (--load, load): else evaluate
    # answers NaN and save writes a file regen will not load.
    for bad in (np.nan, np.inf):
        poisoned = w.copy()
        poisoned.flat[5] = bad
        with pytest.raises(regen.Error, match=r"load_state_dict: tensor 'fc.weight' holds -?"
                                              r"(nan|inf) at flat index 5 \(weights must be"):
            m.load_state_dict({"fc.weight": poisoned}, strict=False)
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


def test_an_array_numpy_cannot_copy_is_refused_not_a_crash(tmp_path):
    # A view that broadcasts one value over 4 TiB: numpy cannot make the C-order copy, and its
    # null answer was once read as an array (a segmentation fault).
    huge = np.broadcast_to(np.float32(0), (2**20, 2**20))
    with pytest.raises((regen.Error, MemoryError)) as refused:
        regen.tensor(huge)
    if refused.type is regen.Error:  # else numpy's own MemoryError, where it raises one
        assert "cannot copy the (1048576, 1048576) array to C order" in str(refused.value)
    with pytest.raises((regen.Error, MemoryError)):
        regen.save_safetensors(str(tmp_path / "x.safetensors"), {"a": huge})
    assert not (tmp_path / "x.safetensors").exists()
