"""The ops composed of primitives (issue #12: activations, math, reductions,
losses, layers.prelu) against numpy, their gradients, and their errors.

Tolerances: float32 forward rtol 2e-6 (the compositions measure <= 2.5 ulp,
1 ulp = 1.2e-7), atol 1e-37 (denormal results); float64 forward rtol 1e-13;
gradients (float64 train jobs vs central differences of the numpy reference,
h = 1e-6) rtol 1e-6, atol 1e-8. Many ops share one job so each test compiles
once or twice.
"""
import inspect
import math
import typing

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

DT = {np.dtype(np.float32): flow.float32, np.dtype(np.float64): flow.float64,
      np.dtype(np.int32): flow.int32, np.dtype(np.int64): flow.int64, np.dtype(np.bool_): flow.bool}
FWD = {np.float32: dict(rtol=2e-6, atol=1e-37), np.float64: dict(rtol=1e-13, atol=1e-300)}
m, nn = flow.math, flow.nn


def job(name, arrays, body, kind="predict", n_out=None):
    """A job `name` with one placeholder per array; returns a tuple when n_out is set."""
    names = [f"a{i}" for i in range(len(arrays))]

    def fn(*blobs):
        return body(*blobs)

    ann = {n: tp.Numpy.Placeholder(a.shape, dtype=DT[a.dtype]) for n, a in zip(names, arrays)}
    ann["return"] = tp.Numpy if n_out is None else typing.Tuple[tuple([tp.Numpy] * n_out)]
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    fn.__annotations__ = ann
    fn.__name__ = fn.__qualname__ = name
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64 if any(a.dtype == np.float64 for a in arrays) else flow.float)
    return flow.global_function(type=kind, function_config=cfg)(fn)


def run_all(name, cases, dtype=None):
    """cases: list of (label, flow fn of blobs, numpy ref, input arrays); one job for all."""
    arrays = [a for _, _, _, ins in cases for a in ins]
    counts = [len(ins) for _, _, _, ins in cases]

    def body(*blobs):
        outs, k = [], 0
        for (_, f, _, _), n in zip(cases, counts):
            outs.append(f(*blobs[k:k + n]))
            k += n
        return tuple(outs)

    got = job(name, arrays, body, n_out=len(cases))(*arrays)
    for (label, _, ref, ins), g in zip(cases, got):
        with np.errstate(all="ignore"):
            want = np.asarray(ref(*[a.astype(np.float64) if a.dtype == np.float32 else a for a in ins]))
        floats = [a.dtype for a in ins if a.dtype.kind == "f"]
        out_dt = floats[0] if want.dtype.kind == "f" else want.dtype
        assert g.shape == want.shape, (label, g.shape, want.shape)
        assert g.dtype == out_dt, (label, g.dtype, out_dt)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(g, want.astype(out_dt), **FWD[out_dt.type], err_msg=label)
        else:
            np.testing.assert_array_equal(g, want, err_msg=label)


def sample(rng, shape, lo, hi, dtype, tiny=True):
    """Uniform in [lo, hi), with the first row log-uniform in +-[1e-9, 1e-2] (when
    0 is inside the range): where naive formulas cancel."""
    x = rng.uniform(lo, hi, shape)
    if tiny and lo < 0 < hi and len(shape) == 2:
        x[0] = np.exp(rng.uniform(np.log(1e-9), np.log(1e-2), shape[1])) * rng.choice([-1, 1], shape[1])
    return x.astype(dtype)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0, x)


# name -> (flow fn, numpy reference, domain)
UNARY = {
    "expm1": (m.expm1, np.expm1, (-10, 10)),
    "log1p": (m.log1p, np.log1p, (-0.99, 10)),
    "sinh": (m.sinh, np.sinh, (-30, 30)),
    "cosh": (m.cosh, np.cosh, (-30, 30)),
    "asinh": (m.asinh, np.arcsinh, (-1e3, 1e3)),
    "acosh": (m.acosh, np.arccosh, (1.0, 50)),
    "atanh": (m.atanh, np.arctanh, (-0.999, 0.999)),
    "tan": (m.tan, np.tan, (-1.5, 1.5)),
    "atan": (m.atan, np.arctan, (-50, 50)),
    "asin": (m.asin, np.arcsin, (-1, 1)),
    "acos": (m.acos, np.arccos, (-1, 1)),
    "log_sigmoid": (m.log_sigmoid, lambda x: -_softplus(-x), (-30, 30)),
    "leaky_relu": (nn.leaky_relu, lambda x: np.where(x > 0, x, 0.2 * x), (-5, 5)),
    "leaky_relu_0.5": (lambda x: nn.leaky_relu(x, alpha=0.5), lambda x: np.where(x > 0, x, 0.5 * x), (-5, 5)),
    "elu": (nn.elu, lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), (-5, 5)),
    "elu_2": (lambda x: nn.elu(x, 2.0), lambda x: np.where(x > 0, x, 2 * np.expm1(np.minimum(x, 0))), (-5, 5)),
    "relu6": (nn.relu6, lambda x: np.clip(x, 0, 6), (-3, 9)),
    "hardsigmoid": (nn.hardsigmoid, lambda x: np.clip(x / 6 + 0.5, 0, 1), (-5, 5)),
    "hardswish": (nn.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6, (-5, 5)),
    "hardtanh": (nn.hardtanh, lambda x: np.clip(x, -1, 1), (-3, 3)),
    "hardtanh_-2_0.5": (lambda x: nn.hardtanh(x, -2, 0.5), lambda x: np.clip(x, -2, 0.5), (-3, 3)),
    "softsign": (nn.softsign, lambda x: x / (1 + np.abs(x)), (-10, 10)),
    "swish": (nn.swish, lambda x: x * _sigmoid(x), (-10, 10)),
    "swish_1.5": (lambda x: nn.swish(x, beta=1.5), lambda x: x * _sigmoid(1.5 * x), (-10, 10)),
    "silu": (nn.silu, lambda x: x * _sigmoid(x), (-10, 10)),
    "mish": (nn.mish, lambda x: x * np.tanh(_softplus(x)), (-10, 10)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_forward(dtype, rng):
    cases = [(k, f, ref, [sample(rng, (3, 17), lo, hi, dtype)]) for k, (f, ref, (lo, hi)) in UNARY.items()]
    run_all(f"unary_{dtype.__name__}", cases)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_special_values(dtype):
    inf, nan = np.inf, np.nan
    big = 88.0 if dtype == np.float32 else 709.0
    cases = [
        ("expm1", m.expm1, np.expm1, [np.array([-inf, inf, 0.0, -0.0, 1e-30, -1e-30, big, -big, nan], dtype)]),
        ("log1p", m.log1p, np.log1p, [np.array([-1, -2, inf, 0.0, 1e-30, -1e-30, 1e30, 0.5, nan], dtype)]),
        ("sinh", m.sinh, np.sinh, [np.array([-inf, inf, 0, 1e-30, -1e-30, big, -big, 19.9, 20.1], dtype)]),
        ("cosh", m.cosh, np.cosh, [np.array([-inf, inf, 0, 1e-30, -1e-30, big, -big, 2, 1e4], dtype)]),
        ("asinh", m.asinh, np.arcsinh, [np.array([-inf, inf, 0, 1e-30, -1e30, 1e30, 2.0 ** 28, 3e8, -7], dtype)]),
        ("acosh", m.acosh, np.arccosh, [np.array([inf, 1, 0.5, -1, 1e30, 1 + 1e-6, 2.0 ** 28, 3e8, 7], dtype)]),
        ("atanh", m.atanh, np.arctanh, [np.array([1, -1, 1.5, -2, 0, 1e-30, 0.5, -0.5, 0.9999], dtype)]),
        ("atan", m.atan, np.arctan, [np.array([-inf, inf, 0, 1e-30, 1e30, -1e30, 1, -1, 0.2679], dtype)]),
        ("asin", m.asin, np.arcsin, [np.array([1, -1, 1.0001, -2, 0, 1e-30, 0.5, -0.5, 0.99999], dtype)]),
        ("acos", m.acos, np.arccos, [np.array([1, -1, 1.0001, -2, 0, 1e-30, 0.5, -0.5, -0.99999], dtype)]),
        ("log_sigmoid", m.log_sigmoid, lambda x: -np.logaddexp(0, -x),
         [np.array([-inf, inf, 0, -100, 100, -1e4, 1e-30, 30, -30], dtype)]),
        ("mish", nn.mish, lambda x: x * np.tanh(np.logaddexp(0, x)),
         [np.array([-inf, inf, 0, -100, 100, -1e4, 1e-30, 30, -30], dtype)]),
    ]
    # numpy's float64 results stand for the exact values; float32 compares where
    # they are representable (the reference is evaluated in float64).
    run_all(f"special_{dtype.__name__}", cases)


def test_binary_and_elementwise_math(rng):
    f32 = np.float32
    x = sample(rng, (3, 1, 5), -4, 4, f32)
    y = sample(rng, (4, 5), -4, 4, f32, tiny=False)
    y[np.abs(y) < 0.1] = 0.5
    xz = np.array([0, 0, 1, 2.5, -1, 0, 3], f32)
    yz = np.array([0, 2, 0, 0.5, 3, 1e-30, 1e-20], f32)
    ia = np.array([7, -7, 7, -7, 0, 5, 9, -9, 3], np.int32)
    ib = np.array([2, 2, -2, -2, 3, 0, 3, 3, 1], np.int32)
    cases = [
        ("atan2", m.atan2, np.arctan2, [x, y]),
        ("xlogy", m.xlogy, lambda a, b: np.where(a == 0, 0, a * np.log(b)), [xz, yz]),
        ("xlogy_scalar", lambda a: m.xlogy(a, 3.0), lambda a: a * np.log(3.0), [x]),
        ("mod_float", m.mod, np.mod, [x, y]),
        ("floordiv_float", m.floordiv, np.floor_divide, [x, y]),
        ("mod_int", m.mod, lambda a, b: np.where(b == 0, 0, np.mod(a, np.where(b == 0, 1, b))), [ia, ib]),
        ("floordiv_int", m.floordiv, lambda a, b: np.where(b == 0, 0, a // np.where(b == 0, 1, b)), [ia, ib]),
        ("mod_int_scalar", lambda a: m.mod(a, -4), lambda a: np.mod(a, -4), [ia]),
    ]
    run_all("binary", cases)


def test_atan2_quadrants():
    yx = np.array([[1, 1], [1, -1], [-1, -1], [-1, 1], [1, 0], [-1, 0], [0, 0], [0, 2], [1e-20, -3],
                   [-2, 1e-30], [3, -1e-3], [-0.5, -4]], np.float64)
    y, x = np.ascontiguousarray(yx[:, 0]), np.ascontiguousarray(yx[:, 1])
    out = job("atan2_q2", [y, x], m.atan2)(y, x)
    np.testing.assert_allclose(out, np.arctan2(y, x), rtol=1e-13, atol=1e-300)


def test_clip_masks_triangles_add_n(rng):
    x = sample(rng, (2, 3, 5), -3, 3, np.float32)
    i = np.arange(-6, 9, dtype=np.int32)
    mask = rng.random((3, 5)) < 0.5
    imask = (rng.random((2, 3, 5)) < 0.5).astype(np.int32)
    sq = sample(rng, (4, 4), -3, 3, np.float64)
    one = sample(rng, (1, 7), -3, 3, np.float32)
    row, col = sample(rng, (5,), -3, 3, np.float32), sample(rng, (3, 1), -3, 3, np.float32)
    cases = [
        ("clip_by_value", lambda a: flow.clip_by_value(a, -1, 2.5), lambda a: np.clip(a, -1, 2.5), [x]),
        ("clip_min_only", lambda a: m.clip_by_value(a, min_value=0.5), lambda a: np.maximum(a, 0.5), [x]),
        ("clip_max_only", lambda a: flow.clip(a, max_value=0.5), lambda a: np.minimum(a, 0.5), [x]),
        ("clamp_int", lambda a: flow.clamp(a, -2, 3), lambda a: np.clip(a, -2, 3), [i]),
        ("masked_fill", lambda a, k: flow.masked_fill(a, k, 7.5), lambda a, k: np.where(k, 7.5, a), [x, mask]),
        ("masked_fill_int_mask", lambda a, k: flow.masked_fill(a, k, -1), lambda a, k: np.where(k != 0, -1, a),
         [x, imask]),
        # x broadcasts against the mask (OneFlow's where(mask, value, x)): the result has their common shape
        ("masked_fill_x_row", lambda a, k: flow.masked_fill(a, k, 7.5), lambda a, k: np.where(k, 7.5, a), [row, mask]),
        ("masked_fill_x_col", lambda a, k: flow.masked_fill(a, k, -2.0), lambda a, k: np.where(k != 0, -2.0, a),
         [col, imask]),
        ("tril", m.tril, np.tril, [x]),
        ("tril_1_fill", lambda a: nn.tril(a, 1, fill_value=-9.0), lambda a: np.where(np.tri(3, 5, 1, bool), a, -9.0),
         [x]),
        ("tril_-1", lambda a: m.tril(a, diagonal=-1), lambda a: np.tril(a, -1), [sq]),
        ("triu", m.triu, np.triu, [x]),
        ("triu_2", lambda a: m.triu(a, 2), lambda a: np.triu(a, 2), [sq]),
        ("triu_size1", lambda a: m.triu(a, -3), lambda a: np.triu(a, -3), [one]),
        ("add_n", lambda a, b, c: m.add_n([a, b, c]), lambda a, b, c: a + b + c, [x, x * 2, x - 1]),
        ("add_n_1", lambda a: m.add_n([a]), lambda a: a, [one]),
    ]
    run_all("clip_masks", cases)


def _lse(x, axis=None, keepdims=False):
    mx = np.max(x, axis=axis, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0)
    out = np.log(np.sum(np.exp(x - mx), axis=axis, keepdims=True)) + mx
    return out if keepdims else np.squeeze(out, axis=axis)


def _full(ref):
    """numpy's reduction `ref` of every axis in OneFlow's shape: without keepdims
    the result has shape (1,), not ()."""
    return lambda *a: np.reshape(ref(*a), (1,))


def test_reductions(rng):
    x = sample(rng, (3, 1, 7), -3, 3, np.float32)
    big = np.array([[1000, 999, -5], [-np.inf, -np.inf, -np.inf], [-np.inf, 2, 3]], np.float64)
    b = rng.random((4, 1, 5)) < 0.7
    ints = rng.integers(-1, 2, (4, 5)).astype(np.int32)
    cases = [
        ("any", m.reduce_any, _full(np.any), [b]),
        ("any_axis", lambda a: m.reduce_any(a, axis=[0, -1]), lambda a: np.any(a, axis=(0, 2)), [b]),
        ("all_keep", lambda a: m.reduce_all(a, axis=-1, keepdims=True), lambda a: np.all(a, -1, keepdims=True), [b]),
        ("all_int", lambda a: m.reduce_all(a, axis=0), lambda a: np.all(a != 0, axis=0), [ints]),
        ("any_int", lambda a: m.reduce_any(a, axis=1), lambda a: np.any(a != 0, axis=1), [ints]),
        ("lse", m.reduce_logsumexp, _full(_lse), [x]),
        ("lse_axis", lambda a: m.reduce_logsumexp(a, axis=-1, keepdims=True), lambda a: _lse(a, -1, True), [x]),
        ("lse_inf", lambda a: m.reduce_logsumexp(a, axis=1), lambda a: _lse(a, 1), [big]),
        ("variance", lambda a: m.reduce_variance(a, axis=[0, 2]), lambda a: np.var(a, axis=(0, 2)), [x]),
        ("std", lambda a: m.reduce_std(a, axis=-1, keepdims=True), lambda a: np.std(a, -1, keepdims=True), [x]),
        ("std_all", m.reduce_std, _full(np.std), [x]),
        ("moments_mean", lambda a: nn.moments(a, [0, 2])[0], lambda a: np.mean(a, axis=(0, 2)), [x]),
        ("moments_var", lambda a: nn.moments(a, axes=[1], keepdims=True)[1], lambda a: np.var(a, 1, keepdims=True),
         [x]),
        ("l2_normalize", lambda a: m.l2_normalize(a, axis=-1), lambda a: a / np.sqrt(np.sum(a * a, -1, keepdims=True)),
         [x]),
        ("l2_normalize_all", m.l2_normalize, lambda a: a / np.sqrt(np.sum(a * a)), [x]),
        ("l2_normalize_eps", lambda a: m.l2_normalize(a * 0, axis=0, epsilon=1e-6), lambda a: a * 0, [x]),
    ]
    run_all("reductions", cases)


# ---------------------------------------------------------------- losses

def _np_bce_logits(x, t, w=None, pw=None):
    lsig, lsig_neg = -np.logaddexp(0, -x), -np.logaddexp(0, x)
    out = -(t * lsig * (1 if pw is None else pw) + (1 - t) * lsig_neg)
    return out if w is None else out * w


def _red(v, r):
    # a mean or sum over every axis has shape (1,), as OneFlow's full reductions
    return {"none": v, "mean": np.reshape(np.mean(v), (1,)), "sum": np.reshape(np.sum(v), (1,))}[r]


def _np_smooth_l1(p, t, beta):
    d = np.abs(p - t)
    return np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta) if beta > 0 else d


def _np_kl(inp, t, log_target):
    if log_target:
        return np.exp(t) * (t - inp)
    return np.where(t > 0, t * (np.log(np.where(t > 0, t, 1)) - inp), 0)


def test_losses(rng):
    p = sample(rng, (4, 3), -2, 2, np.float32, tiny=False)
    t = sample(rng, (4, 3), -2, 2, np.float32, tiny=False)
    prob = rng.uniform(0.05, 0.95, (4, 3)).astype(np.float32)
    tgt = rng.uniform(0, 1, (4, 3)).astype(np.float32)
    tgt[0, 0] = 0
    w = rng.uniform(0.5, 2, (4, 3)).astype(np.float32)
    pw = np.array([0.5, 2.0, 3.0], np.float32)
    logp = np.log(rng.dirichlet(np.ones(3), 4)).astype(np.float32)
    dist = rng.dirichlet(np.ones(3), 4).astype(np.float32)
    dist[1, 2] = 0
    probs = rng.dirichlet(np.ones(5), (2, 3)).astype(np.float32)
    labels = rng.integers(0, 5, (2, 3)).astype(np.int32)
    labels1 = rng.integers(0, 5, (4, 1)).astype(np.int64)
    probs1 = rng.dirichlet(np.ones(5), 4).astype(np.float32)
    cases = []
    for r in ("none", "mean", "sum"):
        cases += [
            (f"mse_{r}", lambda a, b, r=r: nn.mse_loss(a, b, reduction=r), lambda a, b, r=r: _red((a - b) ** 2, r), [p, t]),
            (f"l1_{r}", lambda a, b, r=r: nn.L1Loss(a, b, reduction=r), lambda a, b, r=r: _red(np.abs(a - b), r), [p, t]),
            (f"smooth_l1_{r}", lambda a, b, r=r: nn.smooth_l1_loss(a, b, beta=0.7, reduction=r),
             lambda a, b, r=r: _red(_np_smooth_l1(a, b, 0.7), r), [p, t]),
            (f"bce_{r}", lambda a, b, r=r: nn.bce_loss(a, b, reduction=r),
             lambda a, b, r=r: _red(-(b * np.log(a) + (1 - b) * np.log(1 - a)), r), [prob, tgt]),
            (f"bce_logits_{r}", lambda a, b, r=r: nn.bce_with_logits_loss(a, b, reduction=r),
             lambda a, b, r=r: _red(_np_bce_logits(a, b), r), [p, tgt]),
            (f"kldiv_{r}", lambda a, b, r=r: nn.kldiv_loss(a, b, reduction=r),
             lambda a, b, r=r: _red(_np_kl(a, b, False), r), [logp, dist]),
        ]
    cases += [
        ("mse_default_mean", nn.MSELoss, _full(lambda a, b: np.mean((a - b) ** 2)), [p, t]),
        ("smooth_l1_default", flow.smooth_l1_loss, lambda a, b: _np_smooth_l1(a, b, 1.0), [p, t]),
        ("smooth_l1_beta0", lambda a, b: nn.smooth_l1_loss(a, b, 0.0), lambda a, b: np.abs(a - b), [p, t]),
        ("bce_weight", lambda a, b, c: nn.BCELoss(a, b, weight=c, reduction="sum"),
         _full(lambda a, b, c: np.sum(-(b * np.log(a) + (1 - b) * np.log(1 - a)) * c)), [prob, tgt, w]),
        ("bce_logits_weights", lambda a, b, c, d: nn.BCEWithLogitsLoss(a, b, c, d, reduction="none"),
         lambda a, b, c, d: _np_bce_logits(a, b, c, d), [p, tgt, w, pw]),
        ("bce_logits_large", lambda a, b: nn.bce_with_logits_loss(a * 100, b),
         _full(lambda a, b: np.mean(_np_bce_logits(a * 100, b))), [p, tgt]),
        ("kldiv_log_target", lambda a, b: nn.KLDivLoss(a, b, log_target=True, reduction="none"),
         lambda a, b: _np_kl(a, b, True), [logp, np.log(dist + 0.1)]),
        ("sparse_ce", nn.sparse_cross_entropy,
         lambda lab, pr: -np.log(np.take_along_axis(pr, lab[..., None], -1)[..., 0]), [labels, probs]),
        ("sparse_ce_n1", nn.sparse_cross_entropy,
         lambda lab, pr: -np.log(np.take_along_axis(pr, lab, -1)[:, 0]), [labels1, probs1]),
    ]
    run_all("losses", cases)


# ---------------------------------------------------------------- layers.prelu

def test_prelu_layer_variable_and_gradient():
    x = np.linspace(-2, 2, 2 * 3 * 4).reshape(2, 3, 4) + 0.01
    c = np.random.default_rng(5).standard_normal((2, 3, 4))

    def body(a, k):
        y = flow.layers.prelu(a, shared_axes=[2], name="act")
        loss = m.reduce_sum(y * k)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return y

    train = job("prelu_train", [x, c], body, kind="train")
    y0 = train(x, c)
    np.testing.assert_allclose(y0, np.maximum(x, 0), rtol=1e-13)  # alpha starts at 0
    alpha = flow.get_all_variables()["act-alpha"]
    assert alpha.shape == (3, 1)
    # d loss / d alpha = sum over batch and the shared axis of min(x, 0) * c; SGD lr 1.
    np.testing.assert_allclose(-alpha, np.sum(np.minimum(x, 0) * c, axis=(0, 2))[:, None], rtol=1e-12)
    flow.load_variables({"act-alpha": np.array([[0.1], [0.2], [0.3]])})
    y1 = train(x, c)
    a = np.array([0.1, 0.2, 0.3])[None, :, None]
    np.testing.assert_allclose(y1, np.where(x > 0, x, a * x), rtol=1e-13)


# ---------------------------------------------------------------- gradients

def _fd(ref, inputs, i, c, h=1e-6):
    """Central differences of sum(ref(*inputs) * c) with respect to inputs[i] (float64)."""
    g = np.zeros_like(inputs[i])
    for j in np.ndindex(g.shape):
        xp = [a.copy() for a in inputs]
        xm = [a.copy() for a in inputs]
        xp[i][j] += h
        xm[i][j] -= h
        g[j] = (np.sum(ref(*xp) * c) - np.sum(ref(*xm) * c)) / (2 * h)
    return g


def _away(rng, shape, lo, hi, kinks=()):
    """Uniform samples at least 0.05 from every kink."""
    x = rng.uniform(lo, hi, shape)
    for k in kinks:
        near = np.abs(x - k) < 0.05
        x[near] = k + 0.1
    return x


# name -> (flow fn, numpy ref, input generators); every input is differentiated.
GRAD = {
    "expm1": (m.expm1, np.expm1, [(-2, 2, ())]),
    "log1p": (m.log1p, np.log1p, [(-0.9, 2, ())]),
    "sinh": (m.sinh, np.sinh, [(-3, 3, ())]),
    "cosh": (m.cosh, np.cosh, [(-3, 3, ())]),
    "asinh": (m.asinh, np.arcsinh, [(-3, 3, ())]),
    "acosh": (m.acosh, np.arccosh, [(1.2, 4, ())]),
    "atanh": (m.atanh, np.arctanh, [(-0.9, 0.9, ())]),
    "tan": (m.tan, np.tan, [(-1.2, 1.2, ())]),
    "atan": (m.atan, np.arctan, [(-4, 4, ())]),
    "asin": (m.asin, np.arcsin, [(-0.9, 0.9, ())]),
    "acos": (m.acos, np.arccos, [(-0.9, 0.9, ())]),
    "atan2": (m.atan2, np.arctan2, [(-2, 2, (0,)), (-2, 2, (0,))]),
    "xlogy": (m.xlogy, lambda a, b: a * np.log(b), [(-2, 2, (0,)), (0.2, 3, ())]),
    "log_sigmoid": (m.log_sigmoid, lambda x: -np.logaddexp(0, -x), [(-5, 5, ())]),
    "leaky_relu": (nn.leaky_relu, lambda x: np.where(x > 0, x, 0.2 * x), [(-2, 2, (0,))]),
    "elu": (lambda x: nn.elu(x, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(np.minimum(x, 0))),
            [(-2, 2, (0,))]),
    "relu6": (nn.relu6, lambda x: np.clip(x, 0, 6), [(-2, 8, (0, 6))]),
    "hardsigmoid": (nn.hardsigmoid, lambda x: np.clip(x / 6 + 0.5, 0, 1), [(-4, 4, (-3, 3))]),
    "hardswish": (nn.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6, [(-4, 4, (-3, 3))]),
    "hardtanh": (nn.hardtanh, lambda x: np.clip(x, -1, 1), [(-2, 2, (-1, 1))]),
    "softsign": (nn.softsign, lambda x: x / (1 + np.abs(x)), [(-3, 3, (0,))]),
    "swish": (lambda x: nn.swish(x, 1.5), lambda x: x * _sigmoid(1.5 * x), [(-4, 4, ())]),
    "mish": (nn.mish, lambda x: x * np.tanh(np.logaddexp(0, x)), [(-4, 4, ())]),
    "clip": (lambda x: m.clip_by_value(x, -1, 1), lambda x: np.clip(x, -1, 1), [(-2, 2, (-1, 1))]),
    "tril": (lambda x: m.tril(x, 1), lambda x: np.tril(x, 1), [(-2, 2, ())]),
    "mod": (lambda x: m.mod(x, 1.5), lambda x: np.mod(x, 1.5), [(-3, 3, (-1.5, 0, 1.5))]),
    "lse": (lambda x: m.reduce_logsumexp(x, axis=-1), lambda x: _lse(x, -1), [(-3, 3, ())]),
    "std": (lambda x: m.reduce_std(x, axis=0), lambda x: np.std(x, axis=0), [(-3, 3, ())]),
    "variance": (m.reduce_variance, np.var, [(-3, 3, ())]),
    "l2_normalize": (lambda x: m.l2_normalize(x, -1), lambda x: x / np.sqrt(np.sum(x * x, -1, keepdims=True)),
                     [(-3, 3, ())]),
    "mse": (nn.mse_loss, lambda a, b: np.mean((a - b) ** 2), [(-2, 2, ()), (-2, 2, ())]),
    "smooth_l1": (lambda a, b: nn.smooth_l1_loss(a, b, 0.5, reduction="sum"),
                  lambda a, b: np.sum(_np_smooth_l1(a, b, 0.5)), [(-2, 2, ()), (-0.01, 0.01, ())]),
    "bce": (nn.bce_loss, lambda a, b: np.mean(-(b * np.log(a) + (1 - b) * np.log(1 - a))),
            [(0.1, 0.9, ()), (0, 1, ())]),
    "bce_logits": (lambda a, b: nn.bce_with_logits_loss(a, b, reduction="sum"),
                   lambda a, b: np.sum(_np_bce_logits(a, b)), [(-3, 3, ()), (0, 1, ())]),
    "kldiv": (lambda a, b: nn.kldiv_loss(a, b, reduction="sum"), lambda a, b: np.sum(_np_kl(a, b, False)),
              [(-3, 0, ()), (0.05, 1, ())]),
}


def test_gradients():
    """One float64 train job: every op of GRAD on its own variables, loss = the
    sum of reduce_sum(op(vars) * c); one SGD step (lr 1) gives every gradient."""
    rng = np.random.default_rng(11)
    shape = (3, 4)
    inputs, consts = {}, {}
    for k, (_, ref, gens) in GRAD.items():
        inputs[k] = [_away(rng, shape, lo, hi, kinks) for lo, hi, kinks in gens]
        with np.errstate(all="ignore"):
            consts[k] = rng.standard_normal(np.shape(ref(*inputs[k])))
    a, b = inputs["smooth_l1"]  # keep |a - b| clear of beta, the kink
    inputs["smooth_l1"][0] = np.where(np.abs(np.abs(a - b) - 0.5) < 0.05, b + 0.8 * np.sign(a - b), a)
    keys = list(GRAD)
    cs = [np.atleast_1d(consts[k]).astype(np.float64) for k in keys]

    def body(*cblobs):
        total = None
        for k, cb in zip(keys, cblobs):
            vs = [flow.get_variable(f"{k}_{i}", shape=shape, dtype=flow.float64,
                                    initializer=flow.constant_initializer(0.5))
                  for i in range(len(inputs[k]))]
            out = GRAD[k][0](*vs)
            if not out.shape:
                out = flow.reshape(out, [1])
            term = m.reduce_sum(out * cb)
            total = term if total is None else total + term
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(total)
        return total

    train = job("grads", cs, body, kind="train")
    train(*cs)  # creates the variables
    flow.load_variables({f"{k}_{i}": x for k in keys for i, x in enumerate(inputs[k])})
    train(*cs)
    after = flow.get_all_variables()
    for k in keys:
        ref = GRAD[k][1]
        for i, x in enumerate(inputs[k]):
            got = x - np.asarray(after[f"{k}_{i}"])
            want = _fd(ref, inputs[k], i, consts[k])
            assert np.abs(want).max() > 1e-3, f"{k}: the reference gradient of input {i} is ~0"
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8 * max(1, np.abs(want).max()),
                                       err_msg=f"gradient of {k} input {i}")


def test_gradients_stay_finite_where_a_branch_is_not_taken():
    # expm1/log1p/xlogy/atan2/kldiv pick between formulas with `where`; the
    # branch not taken is fed a safe input, so no 0 * inf = nan leaks in.
    x = np.array([0.0, 1e-30, -1e-30, 3.0, -3.0, 60.0, -0.999999], np.float64)
    y = np.array([0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 1.0], np.float64)

    def body(a, b):
        va = flow.get_variable("va", shape=a.shape, dtype=flow.float64, initializer=flow.constant_initializer(0))
        vb = flow.get_variable("vb", shape=a.shape, dtype=flow.float64, initializer=flow.constant_initializer(0))
        va = va + a
        vb = vb + b
        loss = (m.reduce_sum(m.expm1(va)) + m.reduce_sum(m.log1p(va)) + m.reduce_sum(m.xlogy(vb, va * va))
                + m.reduce_sum(m.atan2(va, vb)) + m.reduce_sum(m.sinh(va)) + m.reduce_sum(m.asinh(va)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss

    train = job("finite_grads", [x, y], body, kind="train")
    train(x, y)
    v = flow.get_all_variables()
    ga, gb = -np.asarray(v["va"]), -np.asarray(v["vb"])
    ok = np.array([False, True, True, True, True, True, True])  # atan2 at the origin has no gradient
    assert np.all(np.isfinite(ga[ok])) and np.all(np.isfinite(gb[ok])), (ga, gb)
    # d expm1 + d log1p + d sinh + d asinh at 3.0, plus atan2's d/dy at (y=3, x=0): 0
    want3 = math.exp(3) + 1 / 4 + math.cosh(3) + 1 / math.sqrt(10)
    np.testing.assert_allclose(ga[3], want3, rtol=1e-12)


# ---------------------------------------------------------------- fusion

def test_fused_matches_unfused(monkeypatch, rng):
    x = sample(rng, (5, 33), -3, 3, np.float32)
    t = rng.uniform(0, 1, (5, 33)).astype(np.float32)

    def body(a, b):
        return (nn.mish(a) + nn.hardswish(a) * m.atan(a), m.reduce_logsumexp(nn.elu(a), axis=-1),
                nn.bce_with_logits_loss(a, b, reduction="none"), m.reduce_std(m.expm1(a), axis=0))

    outs = {}
    for fused in (True, False):
        if fused:
            monkeypatch.delenv("FLOWJIT_DISABLE_FUSION", raising=False)
        else:
            monkeypatch.setenv("FLOWJIT_DISABLE_FUSION", "1")
        j = job(f"fusion_{fused}", [x, t], body, n_out=4)
        outs[fused] = j(x, t)
        outs[fused, "kernels"] = j.compiled_jobs()[0].num_kernels
    assert outs[True, "kernels"] < outs[False, "kernels"]
    for a, b in zip(outs[True], outs[False]):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)


# ---------------------------------------------------------------- errors

F = np.zeros((2, 3), np.float32)
I = np.zeros((2, 3), np.int32)
ERRORS = [
    ("int_input", [I], lambda a: nn.leaky_relu(a), TypeError,
     r"leaky_relu: x must be a floating-point blob \(float32 or float64\), got int32; convert it with flow\.cast"),
    ("alpha_type", [F], lambda a: nn.elu(a, alpha="1"), TypeError, r"elu: alpha must be a number, got str"),
    ("hardtanh_order", [F], lambda a: nn.hardtanh(a, 1, -1), ValueError,
     r"hardtanh: min_val 1 is greater than max_val -1"),
    ("clip_none", [F], lambda a: flow.clip_by_value(a), ValueError,
     r"clip_by_value: min_value and max_value cannot both be None"),
    ("clip_order", [F], lambda a: flow.clamp(a, 2, 1), ValueError, r"clip_by_value: min_value 2 is greater than max_value 1"),
    ("reduction", [F, F], lambda a, b: nn.mse_loss(a, b, reduction="avg"), ValueError,
     r"mse_loss: reduction must be one of 'none', 'mean', 'sum', got 'avg'"),
    ("loss_shapes", [F, np.zeros((3, 2), np.float32)], lambda a, b: nn.l1_loss(a, b), ValueError,
     r"l1_loss: input has shape \(2, 3\) but target has shape \(3, 2\); they must match"),
    ("pos_weight", [F, F, np.zeros(2, np.float32)], lambda a, b, c: nn.bce_with_logits_loss(a, b, pos_weight=c),
     ValueError, r"bce_with_logits_loss: pos_weight must be 1-D with one weight per class \(the last axis of "
                 r"input, 3\), got shape \(2,\)"),
    ("sce_labels", [np.zeros(3, np.int32), F], lambda a, b: nn.sparse_cross_entropy(a, b), ValueError,
     r"sparse_cross_entropy: labels of shape \(3,\) do not match prediction of shape \(2, 3\) "
     r"\(expected labels of shape \(2,\)\)"),
    ("sce_float_labels", [np.zeros(2, np.float32), F], lambda a, b: nn.sparse_cross_entropy(a, b), TypeError,
     r"sparse_cross_entropy: labels must be an integer blob, got float32"),
    ("tril_rank", [np.zeros(3, np.float32)], lambda a: m.tril(a), ValueError,
     r"tril: x must have rank >= 2 \(the last two axes are the matrix\), got shape \(3,\)"),
    ("add_n_mismatch", [F, I], lambda a, b: m.add_n([a, b]), ValueError,
     r"add_n: inputs\[1\] is int32\[2, 3\] but inputs\[0\] is float32\[2, 3\]; all must match"),
    ("add_n_empty", [F], lambda a: m.add_n([]), TypeError, r"add_n: inputs must be a non-empty list of Blobs"),
    ("axis_range", [F], lambda a: m.reduce_std(a, axis=2), ValueError,
     r"reduce_std: axis 2 is out of range for a rank-2 input \(expected -2 <= axis < 2\)"),
    ("moments_axes", [F], lambda a: nn.moments(a, None), TypeError, r"moments: axes must be an int or a list"),
    ("mod_dtypes", [F, I], lambda a, b: m.mod(a, b), TypeError,
     r"mod: x and y must have the same dtype, got float32 and int32"),
    # x broadcasts against the mask as in OneFlow; shapes that do not broadcast are refused by its where
    ("masked_fill_shape", [np.zeros(3, np.float32), np.zeros((2, 2), np.int32)],
     lambda a, b: flow.masked_fill(a, b, 1.0), ValueError,
     r"where: shapes \[2,2\] and \[3\] cannot be broadcast together \(numpy rules"),
    ("prelu_axes", [F], lambda a: flow.layers.prelu(a, shared_axes=[0], name="p"), ValueError,
     r"prelu 'p': shared_axes must hold axes 1..1 of the rank-2 inputs, got \[0\]"),
    ("not_a_blob", [F], lambda a: m.atan(np.ones(3)), TypeError, r"atan: x must be a Blob, got ndarray"),
]


@pytest.mark.parametrize("label,arrays,body,exc,msg", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors(label, arrays, body, exc, msg):
    with pytest.raises(exc, match=r"job 'err_" + label + r"', test_ops_extra\.py:\d+: " + msg):
        job(f"err_{label}", arrays, body)(*arrays)
