# DTR from Python: regen.plan(profile, 'dtr', budget) and regen.simulate_dtr predict the step that
# Model.train then runs to the byte (peaks, evictions, replays), bitwise as no remat; what DTR cannot
# run with is refused by name.
import gc

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


@pytest.mark.parametrize("policy", ["dtr", "dtr-coop"])
def test_dtr_plan_predicts_the_steps_it_trains(profile, policy):
    plan = regen.plan(profile, policy, "45%")
    assert plan.feasible and plan.dynamic and plan.recomputed == 0
    assert 0 < plan.limit <= plan.budget_bytes
    assert plan.predicted.evictions > 0 and plan.predicted.replays > 0
    assert plan.peak_reserved <= plan.budget_bytes < profile.peak_reserved
    # The same simulation from simulate_dtr under the plan's limit.
    sim = regen.simulate_dtr(profile, plan.limit, coop=policy == "dtr-coop")
    assert not sim.oom
    assert (sim.peak_allocated, sim.peak_reserved) == (plan.peak_allocated, plan.peak_reserved)
    assert (sim.evictions, sim.replays) == (plan.predicted.evictions, plan.predicted.replays)
    assert sim.time_ms == pytest.approx(profile.iteration_ms + sim.recompute_ms)

    gc.collect()
    ref = model()
    ref_losses = [r.loss for r in ref.train(2)]
    ref_state = ref.state_dict()
    del ref
    gc.collect()
    m = model()
    results = m.train(2, plan=plan)
    assert [r.loss for r in results] == ref_losses
    for k, v in m.state_dict().items():
        assert np.array_equal(v, ref_state[k]), k
    for r in results:
        assert (r.peak_allocated, r.peak_reserved) == (plan.peak_allocated, plan.peak_reserved)
    assert m.executor["evictions"] == plan.predicted.evictions
    assert m.executor["replays"] == plan.predicted.replays


def test_dtr_limits_and_refusals(profile):
    # Without a limit DTR never evicts; far below the persistent bytes it runs out of memory.
    free = regen.simulate_dtr(profile)
    assert free.evictions == 0 and free.peak_allocated == profile.peak_allocated
    assert regen.simulate_dtr(profile, 1 << 20).oom
    with pytest.raises(regen.Error, match="limit must be"):
        regen.simulate_dtr(profile, -1)
    with pytest.raises(regen.Error, match="--budget-of reserved"):
        regen.plan(profile, "dtr", "60%", budget_of="allocated")
    with pytest.raises(regen.Error, match="--layout caching"):
        regen.plan(profile, "dtr-coop", "60%", layout="planned")
    with pytest.raises(regen.Error, match="decides while the step runs"):
        regen.make_plan(profile, np.zeros(profile.num_saved, dtype=bool), "60%", policy="dtr")
    low = regen.plan(profile, "dtr", 1)
    assert not low.feasible and 0 < low.lowest_peak < profile.peak_reserved
