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


def test_estimate_counts_the_precision_asked_or_refuses():
    # A mixed precision's terms come from its dry run: the closed forms count an fp32 step, so
    # without compare the answer would be fp32's under another name.
    for precision in ("bf16", "fp16"):
        with pytest.raises(regen.Error, match=r"^estimate: precision='%s': the closed forms count "
                                              r"an fp32 step; pass compare=True" % precision):
            regen.estimate("resnet-tiny", 2, precision=precision)
    fp32 = regen.estimate("resnet-tiny", 8, compare=True)["exact"]
    bf16 = regen.estimate("resnet-tiny", 8, precision="bf16", compare=True)
    assert set(bf16) == {"exact"}
    assert bf16["exact"]["activations"] < fp32["activations"]
    assert bf16["exact"]["parameters"] == fp32["parameters"]  # master weights stay fp32
    # What one CPU step's estimate cannot count, and the training loop's options, are refused.
    for kwargs, match in [
        (dict(math="tf32"), r"^estimate: math='tf32' applies to CUDA devices"),
        (dict(conv="cudnn"), r"^estimate: conv='cudnn' applies to CUDA devices"),
        (dict(compress="bf16"), r"^estimate: compress='bf16' narrows what a remat plan retains"),
        (dict(accumulate=4), r"^estimate: accumulate= applies to training"),
        (dict(lr_schedule="cosine"), r"^estimate: lr_schedule= applies to training"),
    ]:
        with pytest.raises(regen.Error, match=match):
            regen.estimate("resnet-tiny", 2, **kwargs)
