# Offload from Python: fates in decisions, regen.plan(offload=..., transfer=...), the host tier's
# peaks in simulations and steps, and Model.train under offload plans (bitwise as no remat, every
# step's device and host peaks as predicted); bad fates and transfer models refused by name.
import gc
import subprocess

import numpy as np
import pytest

import regen
from conftest import RESNET


def model(**kw):
    c = dict(RESNET)
    return regen.Model(c.pop("name"), batch=c.pop("batch"), device="cpu", **c, **kw)


@pytest.fixture(scope="module")
def profile():
    m = model()
    p = m.profile(iterations=1)
    del m
    gc.collect()
    return p


@pytest.fixture(scope="module")
def reference():
    gc.collect()
    ref = model()
    losses = [r.loss for r in ref.train(2)]
    state = ref.state_dict()
    del ref
    gc.collect()
    return losses, state


def train_under(plan, reference):
    gc.collect()
    m = model()
    results = m.train(2, plan=plan)
    assert [r.loss for r in results] == reference[0]
    for k, v in m.state_dict().items():
        assert np.array_equal(v, reference[1][k]), k
    return m, results


def test_fates_and_transfer_models(profile):
    assert regen.fates() == ["retain", "recompute", "offload"]
    assert regen.offload_modes() == ["none", "activations", "optimizer", "all"]
    t = profile.transfer
    assert t["to_host_gb_per_s"] > 0 and t["to_device_gb_per_s"] > 0
    assert t["source"].startswith("measured by regen profile on cpu")
    m = regen.measure_transfer("cpu", sizes=[1 << 20, 2 << 20], repeats=1)
    assert m["to_host_gb_per_s"] > 0


def test_hand_made_offload_plan_trains_exactly(profile, reference):
    n = profile.num_saved
    offloadable = np.array(profile.saved()["offloadable"])
    fates = np.where(offloadable, "offload", "retain")
    sim = regen.simulate(profile, fates, transfer="gbps:100")
    none = regen.simulate(profile, np.zeros(n, dtype=bool))
    assert sim.peak_allocated < none.peak_allocated
    assert sim.host_peak_allocated > 0 and none.host_peak_allocated == 0
    assert sim.offloads == int(offloadable.sum())
    assert sim.bytes_to_host == sim.bytes_to_device > 0
    assert sim.time_ms == pytest.approx(profile.iteration_ms + sim.stall_ms)
    # Codes work as names do; the optimizer state on the host lowers the device peak again.
    codes = np.where(offloadable, 2, 0)
    plan = regen.make_plan(profile, codes, optimizer_state="host", transfer="gbps:100")
    assert plan.offloaded == int(offloadable.sum())
    assert plan.optimizer_state == "host" and plan.fates.count("offload") == plan.offloaded
    assert plan.peak_allocated < sim.peak_allocated
    assert len(plan.offloads) == plan.offloaded
    m, results = train_under(plan, reference)
    for r in results:
        assert r.exact
        assert (r.peak_allocated, r.peak_reserved) == (plan.peak_allocated, plan.peak_reserved)
        assert (r.host_peak_allocated, r.host_peak_reserved) == (
            plan.predicted.host_peak_allocated,
            plan.predicted.host_peak_reserved,
        )
    assert m.executor["offloads"] == plan.offloaded
    assert m.executor["bytes_to_host"] == plan.predicted.bytes_to_host


def test_dp_with_offload(profile, reference):
    plain = regen.plan(profile, "dp", "lowest", budget_of="allocated")
    every = regen.plan(profile, "dp", "lowest", budget_of="allocated", offload="all",
                       transfer="step:0.4")
    assert every.budget_bytes < plain.budget_bytes
    assert every.offloaded > 0 or every.optimizer_state == "host"
    assert every.transfer["source"].startswith("step:0.4")
    _, results = train_under(every, reference)
    for r in results:
        assert r.exact


def test_offload_refusals(profile, tmp_path):
    n = profile.num_saved
    with pytest.raises(regen.Error, match="unknown fate 'compress'"):
        regen.simulate(profile, ["compress"] * n)
    with pytest.raises(regen.Error, match=r"decisions\[0\] is 3; each is 0 \(retain\)"):
        regen.simulate(profile, np.full(n, 3))
    leaf = np.array(profile.saved()["offloadable"]).argmin()
    bad = np.zeros(n, dtype=np.int64)
    bad[leaf] = 2
    with pytest.raises(regen.Error, match="cannot be offloaded"):
        regen.simulate(profile, bad)
    with pytest.raises(regen.Error, match="offload='weights': unknown offload mode"):
        regen.plan(profile, "dp", "50%", offload="weights")
    with pytest.raises(regen.Error, match="transfer='pcie': --transfer 'pcie'"):
        regen.plan(profile, "dp", "50%", offload="all", transfer="pcie")
    with pytest.raises(regen.Error, match="device or host"):
        regen.make_plan(profile, np.zeros(n, dtype=bool), optimizer_state="disk")


def test_cli_offload(profile, tmp_path, regen_binary):
    path = tmp_path / "profile.json"
    profile.save(str(path))
    out = subprocess.run(
        [regen_binary, "plan", "--profile", str(path), "--policy", "dp", "--budget", "lowest",
         "--budget-of", "allocated", "--offload", "all", "--transfer", "step:0.4", "--out", str(tmp_path / "plan.json"),
         "--decisions", str(tmp_path / "decisions.csv")],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "to the host tier" in out.stdout or "optimizer state lives on the host" in out.stdout
    assert "waiting for copies" in out.stdout
    plan = regen.load_plan(str(tmp_path / "plan.json"), profile)
    assert plan.offloaded > 0 or plan.optimizer_state == "host"
    bad = subprocess.run([regen_binary, "plan", "--profile", str(path), "--offload", "weights"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--offload" in bad.stderr
