# Models from Python: the ops a model is built from (regen.ops) against numpy, a model written in
# Python and registered (its own input options and checks, exact plans and bitwise training), the
# mistakes such a model can make, and a C++ model loaded as an extension into this module's regen
# (REGEN_UNET_EXTENSION: examples/unet/unet_extension.cpp, built by tests/CMakeLists.txt).
import os
import sys

import numpy as np
import pytest

import regen
from regen import ops

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))


def t(a, **kw):
    return regen.tensor(np.asarray(a), **kw)


def test_ops_values_match_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    y = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(ops.relu(t(x)).numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal((t(x) + t(y)).numpy(), x + y)
    np.testing.assert_array_equal((t(x) * t(y)).numpy(), x * y)
    np.testing.assert_array_equal(ops.concat([t(x), t(y)], 1).numpy(), np.concatenate([x, y], 1))
    np.testing.assert_array_equal(ops.permute(t(x), [0, 2, 3, 1]).numpy(), x.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(ops.reshape(t(x), [2, -1]).numpy(), x.reshape(2, -1))
    np.testing.assert_array_equal(ops.upsample2x(t(x)).numpy(), x.repeat(2, 2).repeat(2, 3))
    np.testing.assert_array_equal(ops.max_pool2d(t(x), 2).numpy(),
                                  x.reshape(2, 3, 2, 2, 2, 2).max(axis=(3, 5)))
    parts = ops.split(t(x), [1, 2], 1)
    np.testing.assert_array_equal(parts[1].numpy(), x[:, 1:])
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 3)).astype(np.float32)
    np.testing.assert_allclose((t(a) @ t(b)).numpy(), a @ b, rtol=1e-5, atol=1e-6)
    w = rng.standard_normal((6, 3, 1, 1)).astype(np.float32)
    np.testing.assert_allclose(ops.conv2d(t(x), t(w)).numpy(),
                               np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]), rtol=1e-5, atol=1e-5)
    logits = rng.standard_normal((4, 5))
    ids = np.array([0, 4, 2, 2])
    shifted = logits - logits.max(1, keepdims=True)
    want = -(shifted[np.arange(4), ids] - np.log(np.exp(shifted).sum(1))).mean()
    assert ops.cross_entropy(t(logits), t(ids)).numpy() == pytest.approx(want, rel=1e-12)
    with pytest.raises(regen.Error, match="mode must be 'nearest' or 'bilinear'"):
        ops.upsample2x(t(x), "cubic")
    with pytest.raises(regen.Error, match="concat"):
        ops.concat([t(x), t(a)], 1)


def test_ops_record_gradients():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4))
    w = rng.standard_normal((2, 4))
    xt, wt = t(x, requires_grad=True), t(w, requires_grad=True)
    loss = ops.sum(ops.relu(ops.linear(xt, wt)))
    assert loss.numpy() == pytest.approx(np.maximum(x @ w.T, 0).sum())
    loss.backward()
    mask = (x @ w.T > 0).astype(np.float64)
    np.testing.assert_allclose(xt.grad.numpy(), mask @ w)
    np.testing.assert_allclose(wt.grad.numpy(), mask.T @ x)
    with regen.no_grad():
        assert not ops.relu(t(x, requires_grad=True)).requires_grad
    with pytest.raises(regen.Error, match="only float32 and float64"):
        t(np.arange(3), requires_grad=True)


def build_mlp(net, config):
    """Flattened images through `depth` linear layers with relu, each one block for the planners,
    then a linear head."""
    width = [3 * config["image_size"] ** 2] + [config["hidden"]] * config["depth"]
    hidden = [(f"fc{i + 1}", net.linear(f"fc{i + 1}", width[i], width[i + 1]))
              for i in range(config["depth"])]
    out = net.linear("out", config["hidden"], config["num_classes"])

    def forward(x):
        h = ops.flatten(x, 1)
        for name, layer in hidden:
            with regen.scope(name), regen.block():
                h = ops.relu(layer(h))
        return out(h)
    return forward


@pytest.fixture(scope="module")
def mlp():
    regen.register_model("py-mlp", build_mlp, input="images",
                         preset=dict(image_size=16, num_classes=5),
                         options=dict(hidden=64, depth=(2, 1, 16)),
                         help="a Python MLP")
    return "py-mlp"


def test_a_python_model_takes_its_own_options_and_sizes(mlp):
    assert regen.models()["py-mlp"] == "a Python MLP"
    opts = regen.model_options("py-mlp")
    assert set(opts) == {"image_size", "num_classes", "hidden", "depth"}
    assert (opts["depth"]["lo"], opts["depth"]["hi"], opts["depth"]["integer"]) == (1, 16, True)
    assert opts["hidden"]["default"] == 64 and opts["image_size"]["default"] == 16
    assert regen.model_input("py-mlp")["data"] == ["synthetic", "cifar10:DIR"]
    # 16x16 images: an MLP has no downsamplings, so nothing refuses them (a ResNet does).
    m = regen.Model("py-mlp", batch=4, device="cpu", image_size=16, hidden=24, seed=3, lr=0.01)
    assert m.config == dict(name="py-mlp", image_size=16, num_classes=5, hidden=24, depth=2, seed=3)
    assert m.num_parameters == (768 * 24 + 24) + (24 * 24 + 24) + (24 * 5 + 5)
    assert sorted(m.parameters()) == sorted(
        f"{l}.{p}" for l in ("fc1", "fc2", "out") for p in ("weight", "bias"))
    losses = [r.loss for r in m.train(20)]
    assert losses[-1] < losses[0]
    with pytest.raises(regen.Error, match=r"image_size=16 is too small for ResNet"):
        regen.Model("resnet-tiny", batch=4, device="cpu", image_size=16)
    with pytest.raises(regen.Error, match=r"^hidden=0: must be a positive integer$"):
        regen.Model("py-mlp", batch=4, device="cpu", hidden=0)
    with pytest.raises(regen.Error, match=r"^depth=17: must be at most 16$"):
        regen.Model("py-mlp", batch=4, device="cpu", depth=17)
    with pytest.raises(regen.Error, match=r"^hidden=8 does not apply to model 'resnet-tiny'"):
        regen.Model("resnet-tiny", batch=4, device="cpu", hidden=8)
    with pytest.raises(regen.Error, match=r"^num_classes=1: must be an integer from 2"):
        regen.Model("py-mlp", batch=4, device="cpu", num_classes=1)


def test_a_python_model_is_planned_exactly_and_trains_bitwise(mlp):
    # Activations (batch x hidden) outweigh the parameters (features x hidden): room to plan.
    kw = dict(batch=256, device="cpu", image_size=8, hidden=256, depth=6, seed=5, lr=0.01)
    ref = regen.Model("py-mlp", **kw)
    ref_losses = [r.loss for r in ref.train(3)]
    ref_state = ref.state_dict()
    del ref
    profile = regen.profile("py-mlp", iterations=1, **kw)
    assert profile.blocks == [f"fc{i}" for i in range(1, 7)]
    recomputing = 0
    for policy in ("blocks", "mutwo", "dp"):
        probe = regen.plan(profile, policy, 1, budget_of="allocated")
        budget = (probe.lowest_peak + probe.no_remat_peak) // 2
        plan = regen.plan(profile, policy, budget, budget_of="allocated")
        assert plan.feasible, plan
        recomputing += plan.recomputed > 0
        m = regen.Model("py-mlp", **kw)
        results = m.train(3, plan=plan)
        for r in results:
            assert (r.peak_allocated, r.peak_reserved) == (plan.peak_allocated, plan.peak_reserved)
            assert r.peak_allocated <= budget
        assert [r.loss for r in results] == ref_losses
        for k, v in m.state_dict().items():
            assert np.array_equal(v, ref_state[k]), k
        del m  # one model alive at a time: another's tensors would count in the peaks
    assert recomputing >= 2


def test_mistakes_in_a_python_model():
    def returns_a_list(net, config):
        fc = net.linear("fc", 3 * 32 * 32, 10)
        return lambda x: [fc(ops.flatten(x, 1))]
    regen.register_model("py-list", returns_a_list)
    with pytest.raises(regen.Error, match=r"model 'py-list': forward returned \[.*not a regen.Tensor"):
        regen.Model("py-list", batch=2, device="cpu")

    state = {"fail": False, "net": None, "layer": None}

    def flaky(net, config):
        state["net"] = net
        fc = net.linear("fc", 3 * 32 * 32, 10)
        state["layer"] = fc

        def forward(x):
            if state["fail"]:
                raise ValueError("my forward failed")
            return fc(ops.flatten(x, 1))
        return forward
    regen.register_model("py-flaky", flaky)
    m = regen.Model("py-flaky", batch=2, device="cpu")
    with pytest.raises(regen.Error, match="the model is built already"):
        state["net"].linear("late", 2, 2)
    state["fail"] = True
    with pytest.raises(ValueError, match="my forward failed"):
        m.step()
    state["fail"] = False
    first = m.step()  # the failed step left nothing behind
    assert np.isfinite(first.loss) and m.steps_done == 1
    assert m.step().peak_allocated == first.peak_allocated
    del m
    with pytest.raises(regen.Error, match="layer 'fc' belongs to a model that no longer exists"):
        state["layer"](t(np.zeros((1, 3072), np.float32)))

    with pytest.raises(regen.Error, match="registered already"):
        regen.register_model("py-flaky", flaky)
    with pytest.raises(regen.Error, match="unknown model 'pictures'"):
        regen.register_model("py-x", flaky, input="pictures")
    with pytest.raises(regen.Error, match="preset 'vocab' is no option of the model"):
        regen.register_model("py-y", flaky, preset=dict(vocab=300))
    with pytest.raises(regen.Error, match="option 'lr' is the session's own"):
        regen.register_model("py-z", flaky, options=dict(lr=0.5))
    with pytest.raises(regen.Error, match="option 'p' default 2 must be a number from 0 to 1"):
        regen.register_model("py-w", flaky, options=dict(p=(2.0, 0.0, 1.0)))
    with pytest.raises(regen.Error, match="returned .*not a regen.Tensor|build\\(\\) must return"):
        regen.register_model("py-v", lambda net, c: 42)
        regen.Model("py-v", batch=2, device="cpu")


@pytest.fixture(scope="module")
def extension():
    path = os.environ.get("REGEN_UNET_EXTENSION", "")
    if not path or not os.path.exists(path):
        pytest.fail("REGEN_UNET_EXTENSION must name unet_extension.so (ctest sets it)")
    return path


def test_a_cpp_model_loaded_as_an_extension(extension, tmp_path):
    assert regen.load_extension(extension) == ["unet"]
    assert regen.load_extension(extension) == ["unet"]  # once: nothing registered twice
    assert "unet" in regen.models()
    assert set(regen.model_options("unet")) == {"image_size", "num_classes", "width", "levels"}
    kw = dict(batch=4, device="cpu", image_size=32, width=4, levels=3, seed=2)
    m = regen.Model("unet", **kw)
    assert m.config["levels"] == 3
    r = m.train(2, policy="dp", budget="90%", budget_of="allocated")[-1]
    plan = m.plan_in_use
    assert (r.peak_allocated, r.peak_reserved) == (plan.peak_allocated, plan.peak_reserved)
    with pytest.raises(regen.Error, match=r"^image_size=36 is not a multiple of 8, as the U-Net's "
                                          r"levels=3 poolings need$"):
        regen.Model("unet", **dict(kw, image_size=36))
    # The U-Net written from regen.ops (examples/python/unet.py) trains bitwise as the C++ one.
    from unet import build_unet
    regen.register_model("py-unet", build_unet, input="unet")
    a, b = regen.Model("unet", **kw), regen.Model("py-unet", **kw)
    assert [x.loss for x in a.train(2)] == [x.loss for x in b.train(2)]
    for k, v in a.state_dict().items():
        assert np.array_equal(v, b.state_dict()[k]), k

    with pytest.raises(regen.Error, match="cannot load .*nope.so"):
        regen.load_extension(str(tmp_path / "nope.so"))
    with pytest.raises(regen.Error, match="has no regen_extension_init"):
        regen.load_extension(regen.__file__)
