"""erf, erfc and GELU: forward against math.erf/math.erfc (np.vectorize, tests
only), gradients against float64 finite differences, fused against unfused,
and the messages of bad calls.

Tolerances: float32 rtol 2e-7 (the kernels round once from double), float64
erf rtol 1e-15, erfc rtol 2e-15 (relative, down its tail to 1e-300)."""
import math

import numpy as np
import pytest

import flowjit as flow
from test_autodiff import check as check_grad
from test_ops import build, run

ERF = np.vectorize(math.erf, otypes=[np.float64])
ERFC = np.vectorize(math.erfc, otypes=[np.float64])


def gelu_ref(x):
    return 0.5 * x * (1.0 + ERF(x / math.sqrt(2.0)))


def gelu_ref_tail(x):
    """The same function without 1 + erf's cancellation, for x << 0."""
    return 0.5 * x * ERFC(-x / math.sqrt(2.0))


def grid(lo, hi, n=1001):
    return np.linspace(lo, hi, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_forward(dtype):
    x = np.concatenate([grid(-7, 7), [0.0, -0.0, 1e-30, -1e-30, 1e-6, 0.9999, 1.0, 1.0001]])
    x = x.astype(dtype)
    got = run(lambda b: flow.math.erf(b), x)
    assert got.dtype == dtype
    want = ERF(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-7 if dtype == np.float32 else 1e-15, atol=0)
    assert np.signbit(got[1001 + 1])  # erf(-0) = -0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erfc_forward_keeps_the_tail(dtype):
    hi = 9.0 if dtype == np.float32 else 26.0  # erfc(9) = 4e-37, erfc(26) = 6e-296
    x = np.concatenate([grid(-6, hi, 1501), [0.0, 0.5, 1.0]]).astype(dtype)
    got = run(lambda b: flow.math.erfc(b), x)
    want = ERFC(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-7 if dtype == np.float32 else 2e-15, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(dtype):
    x = np.array([np.inf, -np.inf, np.nan, 40.0, -40.0], dtype=dtype)
    np.testing.assert_array_equal(run(lambda b: flow.math.erf(b), x), [1, -1, np.nan, 1, -1])
    np.testing.assert_array_equal(run(lambda b: flow.math.erfc(b), x), [0, 2, np.nan, 0, 2])


@pytest.mark.parametrize("api", [flow.nn.gelu, flow.math.gelu], ids=["nn", "math"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_forward(api, dtype):
    x = np.concatenate([grid(-5, 5, 997), [0.0, 1e-8, -1e-8]]).astype(dtype)
    got = run(lambda b: api(b), x)
    want = gelu_ref(x.astype(np.float64))
    # atol: the reference's 1 + erf cancels for x < 0 (5e-16 absolute at x = -5).
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(got, want, **tol)


def test_gelu_tail_keeps_relative_accuracy():
    x = grid(-30, -5, 101)
    got = run(lambda b: flow.nn.gelu(b), x)
    # rtol: rounding z = -x / sqrt(2) alone moves erfc(z) by 2 z^2 eps relative
    # (1e-13 at x = -30), whichever way each side rounds it.
    np.testing.assert_allclose(got, gelu_ref_tail(x), rtol=3e-13, atol=0)
    assert np.all(got < 0)  # 0.5 x (1 + erf(x / sqrt 2)) would round to 0 here


def test_gelu_is_one_fused_kernel_and_matches_unfused(monkeypatch):
    x = np.random.default_rng(1).standard_normal((37, 19)).astype(np.float32)
    job, args = build(lambda b: flow.nn.gelu(b), x, name="gelu_fused")
    fused = job(*args)
    assert job.compiled_jobs()[0].num_kernels == 1
    monkeypatch.setenv("FLOWJIT_DISABLE_FUSION", "1")
    unfused = run(lambda b: flow.nn.gelu(b), x)
    np.testing.assert_allclose(fused, unfused, rtol=1e-6, atol=1e-7)


def _inputs(tag, shape=(3, 5)):
    import zlib
    return np.random.default_rng(zlib.crc32(tag.encode())).uniform(-3, 3, shape)


def test_erf_gradient():
    check_grad("erf", flow.math.erf, ERF, [_inputs("erf")])


def test_erfc_gradient():
    check_grad("erfc", flow.math.erfc, ERFC, [_inputs("erfc")])


def test_gelu_gradient():
    check_grad("gelu", flow.nn.gelu, gelu_ref, [_inputs("gelu")])


def test_erf_of_an_integer_blob_names_the_op():
    with pytest.raises(TypeError, match="erf"):
        run(lambda b: flow.math.erf(b), np.arange(4, dtype=np.int32))


def test_gelu_of_an_integer_blob_names_the_op():
    with pytest.raises(TypeError, match=r"gelu: x must be a floating-point blob.*got int32"):
        run(lambda b: flow.nn.gelu(b), np.arange(4, dtype=np.int32))
