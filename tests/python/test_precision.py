# The precision keyword of regen.Model checks what --precision checks, with keywords in the
# messages, and a bf16 or fp16 model trains under autocast with f32 master weights.

import math

import pytest

import regen


def test_precision_keyword_is_checked_as_the_flag():
    with pytest.raises(regen.Error, match=r"precision='bfloat16'.*fp32, tf32, bf16 or fp16"):
        regen.Model("transformer-tiny", batch=2, device="cpu", precision="bfloat16")
    with pytest.raises(regen.Error, match=r"precision='fp32' conflicts with math='tf32'"):
        regen.Model("transformer-tiny", batch=2, device="cpu", precision="fp32", math="tf32")
    with pytest.raises(regen.Error, match=r"compress='bf16' with precision='bf16'"):
        regen.Model("transformer-tiny", batch=2, device="cpu", precision="bf16", compress="bf16")
    with pytest.raises(regen.Error, match=r"precision='tf32' applies to CUDA devices"):
        regen.Model("transformer-tiny", batch=2, device="cpu", precision="tf32")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_model_trains_with_f32_master_weights(precision):
    m = regen.Model("transformer-tiny", batch=4, device="cpu", precision=precision, seed=3)
    f32 = regen.Model("transformer-tiny", batch=4, device="cpu", seed=3)
    losses = [m.step().loss for _ in range(3)]
    ref = [f32.step().loss for _ in range(3)]
    assert all(math.isfinite(x) for x in losses)
    # The same weights and batches: the first losses agree to the 16-bit formats' rounding (about
    # 1% here), but are not the f32 run's bits.
    assert losses != ref
    assert abs(losses[0] - ref[0]) < 0.02 * ref[0]
    for name, t in m.state_dict().items():
        assert str(t.dtype) in ("float32", "int64"), (name, t.dtype)
