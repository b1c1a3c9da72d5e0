# regen.estimate: the closed-form memory of a step, and with compare=True the exact terms of a dry
# run beside it (docs/results.md has the table over every preset).
import pytest

import regen


@pytest.mark.parametrize("policy", ["none", "blocks"])
def test_estimate_terms_match_the_dry_run(policy):
    est = regen.estimate("resnet-tiny", 8, image_size=128, policy=policy, compare=True)
    exact = est["exact"]
    for term in ("parameters", "gradients", "optimizer_state", "inputs", "activations"):
        assert est[term] == exact[term] > 0, term
    assert est["peak"] == sum(est[t] for t in ("parameters", "gradients", "optimizer_state",
                                                "inputs", "activations", "backward"))
    assert exact["peak_allocated"] >= exact["peak"]


def test_estimate_options_and_refusals():
    sgd = regen.estimate("transformer-tiny", 4, seq_len=32)
    adamw = regen.estimate("transformer-tiny", 4, seq_len=32, optimizer="adamw")
    assert adamw["optimizer_state"] == 2 * sgd["optimizer_state"] == 2 * sgd["gradients"]
    assert "exact" not in sgd
    blocks = regen.estimate("transformer-tiny", 4, seq_len=32, policy="blocks")
    assert blocks["activations"] < sgd["activations"]
    with pytest.raises(regen.Error, match="unknown estimate policy"):
        regen.estimate("resnet-tiny", 2, policy="sqrt")
    with pytest.raises(regen.Error, match="seq_len=64 does not apply to model 'resnet-tiny'"):
        regen.estimate("resnet-tiny", 2, seq_len=64)
    with pytest.raises(regen.Error, match="unknown model option"):
        regen.estimate("resnet-tiny", 2, image=64)
