# The unary element-wise ops from Python: regen.ops binds every entry of regen's unary op list
# (kernels/unary_ops.h, listed by regen.ops.unary_names()), and gelu_tanh's float32 value and
# gradient match the tanh-approximation GELU computed by numpy in float64. Every op registered from
# its own file (regen.ops.function_names()) is in regen.ops too, and rmsnorm, bound that way, matches
# numpy in float64.
import numpy as np
import pytest

import regen
from regen import ops


def test_every_unary_op_of_the_list_is_in_regen_ops():
    names = ops.unary_names()
    assert len(names) == len(set(names))
    # The ops the list held when this test was written; the list may grow.
    assert {"relu", "gelu", "gelu_tanh"} <= set(names)
    rng = np.random.default_rng(0)
    for name in names:
        op = getattr(ops, name, None)
        assert callable(op), f"regen.ops has no '{name}', an op of the unary list"
        assert f"'{name}'" in op.__doc__
        for dtype in (np.float32, np.float64):
            x = regen.tensor(rng.standard_normal((3, 5)).astype(dtype), requires_grad=True)
            y = op(x)
            assert y.shape == x.shape and y.dtype == x.dtype and y.requires_grad
            ops.sum(y).backward()
            assert x.grad.shape == x.shape and np.isfinite(x.grad.numpy()).all()


def gelu_tanh_reference(x):
    """GELU with the tanh approximation and its derivative, in float64."""
    c = np.sqrt(2 / np.pi)
    u = c * (x + 0.044715 * x**3)
    t = np.tanh(u)
    du = c * (1 + 3 * 0.044715 * x**2)
    return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * du, du


def check_within(what, got, want, bound, x):
    err = np.abs(got.astype(np.float64) - want)
    bad = np.flatnonzero(~(err <= bound))  # a NaN is past any bound
    ratio = np.divide(err, bound, out=np.where(err > 0, np.inf, 0.0), where=bound > 0)
    worst = np.argmax(np.nan_to_num(ratio, nan=np.inf))
    assert bad.size == 0, (
        f"gelu_tanh {what}: {bad.size} of {err.size} past the float32 bound; first at x = "
        f"{x[bad[:5]]}: got {got[bad[:5]]}, want {want[bad[:5]]}; worst error/bound "
        f"{ratio[worst]:.3g} at x = {x[worst]}")


def test_gelu_tanh_matches_the_float64_formula():
    # Inputs across the curve: both tails (where tanh saturates and 1 + tanh(u) cancels), the bend
    # and zero, as float32 values, so that the reference sees exactly the inputs regen saw.
    rng = np.random.default_rng(1)
    x32 = np.concatenate([np.linspace(-10, 10, 2001), rng.standard_normal(4000) * 3,
                          [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    x = x32.astype(np.float64)
    want_y, want_g, du = gelu_tanh_reference(x)

    xt = regen.tensor(x32, requires_grad=True)
    y = ops.gelu_tanh(xt)
    ops.sum(y).backward()  # dy = 1 exactly, so x's grad is the derivative itself
    got_y, got_g = y.numpy(), xt.grad.numpy()
    assert got_y.dtype == np.float32 and got_g.dtype == np.float32

    # The bounds, in units of float32's eps = 2^-23 (a rounding's relative error is at most
    # eps/2; the float constants and glibc's tanhf, within 2 ulp, count as a few):
    # - u = c (x + 0.044715 x^3) adds terms of one sign: relative error <= ~6 eps.
    # - t = tanh(u): |dt| <= |u| (1 - t^2) 6 eps + 2 eps <= 4.7 eps, as |u| sech^2 u <= 0.45.
    # - y = 0.5 x (1 + t): |dy| <= 0.5 |x| (4.7 + 2) eps + 2 eps |y| < 4 eps (|x| + |y|). Absolute
    #   in |x|, not relative to y: for x << 0, 1 + t cancels and y is far smaller than its error.
    # - g = 0.5 (1 + t) + 0.5 x (1 - t^2) u': 1 - t^2 is off by <= 12 eps absolutely (near
    #   t = +-1 it is all cancellation), so |dg| <= 3.4 eps + 9.5 eps |x u'| + eps |g|.
    # Checked at twice those or more, so that a correct kernel never fails, while an error in a
    # constant, a dropped term or a float16 step (eps 2^-10) is caught by orders of magnitude.
    eps = float(np.finfo(np.float32).eps)
    check_within("value", got_y, want_y, 8 * eps * (np.abs(x) + np.abs(want_y)), x)
    check_within("gradient", got_g, want_g, eps * (8 + 20 * np.abs(x * du) + 2 * np.abs(want_g)),
                 x)


def test_gelu_tanh_is_not_the_exact_gelu():
    # The two GELUs differ by 4.7e-4 at |x| = 2.7, far above float64 rounding: the binding reaches
    # the tanh form, not the erf one.
    x = regen.tensor(np.array([-2.7, 2.7]))
    assert np.abs(ops.gelu_tanh(x).numpy() - ops.gelu(x).numpy()).min() > 4e-4


@pytest.mark.parametrize("name", ["relu", "gelu"])
def test_the_existing_bindings_keep_their_name_and_argument(name):
    x = np.array([-1.5, 0.0, 2.0])
    assert getattr(ops, name)(x=regen.tensor(x)).shape == (3,)


def test_every_registered_function_is_in_regen_ops():
    # The ops bound from their own files' registration (REGEN_REGISTER_FUNCTION), beside the lists.
    names = ops.function_names()
    assert len(names) == len(set(names))
    for name in names:
        op = getattr(ops, name, None)
        assert callable(op), f"regen.ops has no '{name}', a registered function"
        assert op.__doc__


def test_rmsnorm_from_its_registration_matches_numpy():
    # regen.ops.rmsnorm is bound from autograd/ops_rmsnorm.cpp's registration alone.
    rng = np.random.default_rng(1)
    xv, wv = rng.standard_normal((4, 9)), rng.uniform(0.5, 1.5, 9)
    x = regen.tensor(xv, requires_grad=True)
    w = regen.tensor(wv, requires_grad=True)
    y = ops.rmsnorm(x, w, eps=1e-3)
    xhat = xv / np.sqrt((xv**2).mean(-1, keepdims=True) + 1e-3)
    assert np.allclose(y.numpy(), xhat * wv, rtol=1e-12, atol=1e-12)
    ops.sum(y).backward()
    assert np.allclose(w.grad.numpy(), xhat.sum(0), rtol=1e-12, atol=1e-12)
    assert x.grad.shape == x.shape and np.isfinite(x.grad.numpy()).all()
    with pytest.raises(Exception, match="no argument named 'epsilon'"):
        ops.rmsnorm(x, w, epsilon=1e-3)
