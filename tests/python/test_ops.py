"""Every op of the flowjit op surface against a numpy reference, on random data.

Tolerances (stated once, used everywhere unless a test says otherwise):
  float32: rtol 1e-5, atol 1e-6       float64: rtol 1e-12, atol 1e-14
  integer and bool results: exact.
Sizes are chosen not to be multiples of the 16-lane vector width (1, 7, 17,
33, 1000), and include 0-d inputs and, where the op allows it, empty tensors
(passed through tp.ListNumpy placeholders, whose bounds admit a 0 extent).
"""
import inspect

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}
FLOW_DT = {np.float32: flow.float32, np.float64: flow.float64, np.int8: flow.int8,
           np.uint8: flow.uint8, np.int32: flow.int32, np.int64: flow.int64, np.bool_: flow.bool}
SIZES = [1, 7, 17, 33, 1000]


def build(body, *arrays, ret=tp.Numpy, name="op_job"):
    """A predict job with one placeholder per array (its shape and dtype); arrays
    with a 0 extent get a tp.ListNumpy placeholder bounded by max(extent, 1)."""
    names = [f"x{i}" for i in range(len(arrays))]
    listy = [a.size == 0 for a in arrays]

    def fn(*blobs):
        return body(*blobs)

    ann = {}
    for n, a, lst in zip(names, arrays, listy):
        dt = FLOW_DT[a.dtype.type]
        if lst:
            ann[n] = tp.ListNumpy.Placeholder(tuple(max(d, 1) for d in a.shape), dtype=dt)
        else:
            ann[n] = tp.Numpy.Placeholder(a.shape, dtype=dt)
    ann["return"] = ret
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    fn.__annotations__ = ann
    fn.__name__ = fn.__qualname__ = name
    job = flow.global_function(type="predict")(fn)
    return job, [[a] if lst else a for a, lst in zip(arrays, listy)]


def run(body, *arrays, ret=tp.Numpy):
    job, args = build(body, *arrays, ret=ret)
    out = job(*args)
    if ret is tp.ListNumpy:
        assert isinstance(out, list) and len(out) == 1
        out = out[0]
    return out


def check(got, want, dtype=None, atol=None):
    """Same shape and dtype as the numpy result, values within the tolerance of its dtype
    (atol: a wider absolute tolerance, for sums whose terms cancel)."""
    want = np.asarray(want)
    if dtype is not None:
        want = want.astype(dtype)
    assert isinstance(got, np.ndarray), type(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.type in TOL:
        tol = dict(TOL[want.dtype.type])
        if atol is not None:
            tol["atol"] = atol
        np.testing.assert_allclose(got, want, **tol)
    else:
        np.testing.assert_array_equal(got, want)


def rand(rng, shape, dtype=np.float32, lo=-3.0, hi=3.0):
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.asarray(rng.integers(max(int(lo), info.min), min(int(hi), info.max) + 1,
                                       size=shape).astype(dtype))
    return np.asarray(rng.uniform(lo, hi, size=shape).astype(dtype))


# ---------------------------------------------------------------- unary elementwise

def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# name -> (flow function, numpy reference, input range)
UNARY = {
    "exp": (flow.math.exp, np.exp, (-20, 20)),
    "log": (flow.math.log, np.log, (1e-3, 100)),
    "sqrt": (flow.math.sqrt, np.sqrt, (0, 100)),
    "rsqrt": (flow.math.rsqrt, lambda x: 1 / np.sqrt(x), (1e-2, 100)),
    "square": (flow.math.square, np.square, (-30, 30)),
    "abs": (flow.math.abs, np.abs, (-5, 5)),
    "negative": (flow.math.negative, np.negative, (-5, 5)),
    "tanh": (flow.math.tanh, np.tanh, (-10, 10)),
    "sigmoid": (flow.math.sigmoid, _sigmoid, (-30, 30)),
    "nn.relu": (flow.nn.relu, lambda x: np.maximum(x, 0), (-5, 5)),
    "math.relu": (flow.math.relu, lambda x: np.maximum(x, 0), (-5, 5)),
    "sign": (flow.math.sign, np.sign, (-5, 5)),
    "floor": (flow.math.floor, np.floor, (-50, 50)),
    "ceil": (flow.math.ceil, np.ceil, (-50, 50)),
    "round": (flow.math.round, np.round, (-50, 50)),
    "reciprocal": (flow.math.reciprocal, np.reciprocal, (0.05, 20)),
    "sin": (flow.math.sin, np.sin, (-20, 20)),
    "cos": (flow.math.cos, np.cos, (-20, 20)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float(name, dtype, rng):
    fn, ref, (lo, hi) = UNARY[name]
    for shape in [(1,), (7,), (3, 17), (33,), (1000,), ()]:
        x = rand(rng, shape, dtype, lo, hi)
        if name in ("sign", "abs", "nn.relu", "math.relu") and x.size > 2:
            x.flat[0] = 0
        check(run(lambda a: fn(a), x), ref(x))


@pytest.mark.parametrize("name", ["exp", "sqrt", "abs", "negative", "tanh", "floor", "round", "sign"])
def test_unary_empty(name, rng):
    fn, ref, _ = UNARY[name]
    for shape in [(0,), (3, 0)]:
        x = np.zeros(shape, np.float32)
        check(run(lambda a: fn(a), x, ret=tp.ListNumpy), ref(x))


def test_round_half_to_even():
    # numpy and PyTorch round halves to the nearest even integer.
    x = np.array([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -0.49999997,
                  1e7 + 0.5, 2.4, -2.6] + [4.5] * 20, np.float32)
    check(run(lambda a: flow.math.round(a), x), np.round(x))
    x64 = x.astype(np.float64)
    check(run(lambda a: flow.math.round(a), x64), np.round(x64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_special_values(dtype):
    inf = np.inf
    x = np.array([0.0, -0.0, 1e-30, 100.0, -100.0, 1000.0, -1000.0, inf, -inf] + [1.0] * 8, dtype)
    with np.errstate(all="ignore"):
        got = run(lambda a: (flow.math.exp(a), flow.math.tanh(a), flow.math.sigmoid(a),
                             flow.math.abs(a), flow.math.sign(a), flow.nn.relu(a)), x,
                  ret=tp.Bundle[tp.Numpy])
        want = (np.exp(x), np.tanh(x), _sigmoid(x), np.abs(x), np.sign(x), np.maximum(x, 0))
    for g, w in zip(got, want):
        check(g, w)
    y = np.array([0.0, -1.0, inf, 4.0, 1e-30] + [2.0] * 12, dtype)
    with np.errstate(all="ignore"):
        got = run(lambda a: (flow.math.log(a), flow.math.sqrt(a), flow.math.reciprocal(a)), y,
                  ret=typing_tuple(3))
        want = (np.log(y), np.sqrt(y), np.reciprocal(y))
    for g, w in zip(got, want):
        check(g, w)


def typing_tuple(n):
    import typing
    return typing.Tuple[tuple([tp.Numpy] * n)]


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64])
def test_unary_integer(dtype, rng):
    x = rand(rng, (33,), dtype, -11, 11)
    got = run(lambda a: (flow.math.abs(a), flow.math.negative(a), flow.math.square(a),
                         flow.math.sign(a), flow.nn.relu(a), -a, abs(a)), x, ret=typing_tuple(7))
    with np.errstate(all="ignore"):
        want = (np.abs(x), np.negative(x), np.square(x), np.sign(x), np.maximum(x, 0),
                np.negative(x), np.abs(x))
    for g, w in zip(got, want):
        check(g, w)


def test_unary_float_rejects_ints():
    x = np.arange(7, dtype=np.int32)
    with pytest.raises(TypeError, match=r"exp: input must be a floating-point tensor.*flow\.cast"):
        run(lambda a: flow.math.exp(a), x)


@pytest.mark.parametrize("n", SIZES)
def test_logical_not(n, rng):
    b = rand(rng, (n,), np.bool_)
    check(run(lambda a: (flow.math.logical_not(a)), b), np.logical_not(b))
    check(run(lambda a: ~a, b), np.logical_not(b))


def test_logical_not_of_numbers(rng):
    # numpy's logical_not of a number tests it against zero.
    x = rand(rng, (17,), np.float32)
    x[::3] = 0
    i = rand(rng, (17,), np.int32, -2, 2)
    got = run(lambda a, b: (flow.math.logical_not(a), flow.math.logical_not(b)), x, i,
              ret=typing_tuple(2))
    check(got[0], np.logical_not(x))
    check(got[1], np.logical_not(i))


# ---------------------------------------------------------------- binary elementwise

BINARY = {
    "add": (flow.math.add, np.add),
    "subtract": (flow.math.subtract, np.subtract),
    "multiply": (flow.math.multiply, np.multiply),
    "divide": (flow.math.divide, np.divide),
    "pow": (flow.math.pow, np.power),
    "maximum": (flow.math.maximum, np.maximum),
    "minimum": (flow.math.minimum, np.minimum),
}
COMPARE = {
    "equal": (flow.math.equal, np.equal),
    "not_equal": (flow.math.not_equal, np.not_equal),
    "less": (flow.math.less, np.less),
    "less_equal": (flow.math.less_equal, np.less_equal),
    "greater": (flow.math.greater, np.greater),
    "greater_equal": (flow.math.greater_equal, np.greater_equal),
}
BROADCAST_SHAPES = [((7,), (7,)), ((1000,), (1000,)), ((4, 1), (1, 5)), ((3, 17), (17,)),
                    ((17,), (3, 17)), ((), (33,)), ((33,), ()), ((), ()), ((2, 1, 33), (7, 1)),
                    ((1, 1), (1,))]


def _binary_inputs(rng, name, sa, sb, dtype):
    if name == "pow":
        return rand(rng, sa, dtype, 0.1, 4.0), rand(rng, sb, dtype, -3.0, 3.0)
    a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
    if name == "divide":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(dtype)
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_float(name, dtype, rng):
    fn, ref = BINARY[name]
    for sa, sb in BROADCAST_SHAPES:
        a, b = _binary_inputs(rng, name, sa, sb, dtype)
        check(run(lambda x, y: fn(x, y), a, b), ref(a, b))


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_compare(name, rng):
    fn, ref = COMPARE[name]
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8):
        for sa, sb in [((33,), (33,)), ((4, 1), (1, 17)), ((), (7,)), ((1000,), ())]:
            a = rand(rng, sa, dtype, 0, 3)
            b = rand(rng, sb, dtype, 0, 3)
            if np.issubdtype(dtype, np.floating):
                a, b = np.asarray(np.round(a), dtype), np.asarray(np.round(b), dtype)  # ties occur
            check(run(lambda x, y: fn(x, y), a, b), ref(a, b))


@pytest.mark.parametrize("name", ["logical_and", "logical_or"])
def test_logical_binary(name, rng):
    fn = getattr(flow.math, name)
    ref = getattr(np, name)
    for sa, sb in [((33,), (33,)), ((4, 1), (1, 17)), ((), (7,)), ((1000,), ())]:
        a, b = rand(rng, sa, np.bool_), rand(rng, sb, np.bool_)
        check(run(lambda x, y: fn(x, y), a, b), ref(a, b))
    a, b = rand(rng, (17,), np.bool_), rand(rng, (17,), np.bool_)
    op = (lambda x, y: x & y) if name == "logical_and" else (lambda x, y: x | y)
    check(run(op, a, b), ref(a, b))


def test_logical_binary_of_numbers(rng):
    a = np.round(rand(rng, (17,), np.float32, -1, 1))
    b = rand(rng, (17,), np.int32, -1, 1)
    got = run(lambda x, y: (flow.math.logical_and(x, y), flow.math.logical_or(x, y)), a, b,
              ret=typing_tuple(2))
    check(got[0], np.logical_and(a, b))
    check(got[1], np.logical_or(a, b))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64])
def test_binary_integer(dtype, rng):
    lo = 0 if dtype == np.uint8 else -9
    a, b = rand(rng, (33,), dtype, lo, 9), rand(rng, (4, 1, 33), dtype, lo, 9)
    got = run(lambda x, y: (x + y, x - y, x * y, flow.math.maximum(x, y), flow.math.minimum(x, y)),
              a, b, ret=typing_tuple(5))
    with np.errstate(all="ignore"):
        want = (a + b, a - b, a * b, np.maximum(a, b), np.minimum(a, b))
    for g, w in zip(got, want):
        check(g, w)


def _int_div(a, b):
    """C-style integer division (truncation toward zero); x / 0 is 0."""
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    safe = np.where(b64 == 0, 1, b64)
    q = np.abs(a64) // np.abs(safe) * np.sign(a64) * np.sign(safe)
    return np.where(b64 == 0, 0, q).astype(np.result_type(a, b))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64])
def test_integer_division_truncates_and_survives_zero(dtype, rng):
    lo = 0 if dtype == np.uint8 else -100
    a = rand(rng, (1000,), dtype, lo, 100)
    b = rand(rng, (1000,), dtype, max(lo, -7), 7)
    b[:5] = 0  # division by zero: no crash, 0
    if dtype != np.uint8:
        a[5:9] = np.array([-7, 7, -7, 7], dtype)
        b[5:9] = np.array([2, -2, -2, 2], dtype)
    got = run(lambda x, y: x / y, a, b)
    check(got, _int_div(a, b))
    # and a scalar zero divisor, and the flow.math spelling
    got = run(lambda x: (flow.math.divide(x, 0), x / 3), a, ret=typing_tuple(2))
    check(got[0], np.zeros_like(a))
    check(got[1], _int_div(a, np.full_like(a, 3)))
    # the process is still fine
    check(run(lambda x: x + 1, a[:7]), a[:7] + np.array(1, dtype))


def test_float_division_by_zero_is_ieee():
    a = np.array([1.0, -1.0, 0.0] + [2.0] * 14, np.float32)
    b = np.zeros(17, np.float32)
    with np.errstate(all="ignore"):
        check(run(lambda x, y: x / y, a, b), a / b)


def test_pow_special(rng):
    x = rand(rng, (17,), np.float32, -3, 3)
    got = run(lambda a: (a ** 2, a ** 3.0, flow.math.abs(a) ** 0.5, 2.0 ** a,
                         a ** 0), x, ret=typing_tuple(5))
    want = (x ** 2, x ** 3, np.abs(x) ** 0.5, np.float32(2.0) ** x, np.ones_like(x))
    for g, w in zip(got, want):
        check(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_python_operators(dtype, rng):
    a = rand(rng, (3, 17), dtype, 0.5, 3)
    b = rand(rng, (17,), dtype, 0.5, 3)
    ops = [
        (lambda x, y: x + y, lambda x, y: x + y),
        (lambda x, y: x - y, lambda x, y: x - y),
        (lambda x, y: x * y, lambda x, y: x * y),
        (lambda x, y: x / y, lambda x, y: x / y),
        (lambda x, y: x ** y, lambda x, y: x ** y),
        (lambda x, y: -x, lambda x, y: -x),
        (lambda x, y: abs(x - 2), lambda x, y: abs(x - 2)),
        (lambda x, y: 2 - x, lambda x, y: 2 - x),
        (lambda x, y: 2 / x, lambda x, y: 2 / x),
        (lambda x, y: 2 ** x, lambda x, y: 2 ** x),
        (lambda x, y: 3 + x, lambda x, y: 3 + x),
        (lambda x, y: 3 * x, lambda x, y: 3 * x),
        (lambda x, y: x - 2.5, lambda x, y: x - 2.5),
        (lambda x, y: x / 4, lambda x, y: x / 4),
        (lambda x, y: x ** 2, lambda x, y: x ** 2),
        (lambda x, y: x < y, lambda x, y: x < y),
        (lambda x, y: x <= y, lambda x, y: x <= y),
        (lambda x, y: x > y, lambda x, y: x > y),
        (lambda x, y: x >= y, lambda x, y: x >= y),
        (lambda x, y: x == x, lambda x, y: x == x),
        (lambda x, y: x != y, lambda x, y: x != y),
        (lambda x, y: 1 < x, lambda x, y: 1 < x),
        (lambda x, y: 2 >= x, lambda x, y: 2 >= x),
        (lambda x, y: (x > 1) & (y < 2), lambda x, y: (x > 1) & (y < 2)),
        (lambda x, y: (x > 1) | (y < 2), lambda x, y: (x > 1) | (y < 2)),
        (lambda x, y: ~(x > 1), lambda x, y: ~(x > 1)),
    ]
    got = run(lambda x, y: tuple(f(x, y) for f, _ in ops), a, b, ret=typing_tuple(len(ops)))
    for i, (g, (_, ref)) in enumerate(zip(got, ops)):
        w = np.asarray(ref(a, b))
        if w.dtype != np.bool_:
            w = w.astype(dtype)  # a Python scalar takes the blob's dtype
        check(g, w)


def test_binary_empty():
    a = np.zeros((0, 3), np.float32)
    b = np.arange(3, dtype=np.float32)
    check(run(lambda x, y: x * y + 1, a, b, ret=tp.ListNumpy), a * b + 1)
    check(run(lambda x, y: x < y, a, b, ret=tp.ListNumpy), a < b)


def test_binary_incompatible_shapes():
    a, b = np.zeros((3,), np.float32), np.zeros((4,), np.float32)
    with pytest.raises(ValueError, match="add"):
        run(lambda x, y: x + y, a, b)


# ---------------------------------------------------------------- where

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_where(dtype, rng):
    for sc, sx, sy in [((33,), (33,), (33,)), ((4, 1), (1, 17), (17,)), ((), (7,), (7,)),
                       ((1000,), (), (1000,))]:
        c = rand(rng, sc, np.bool_)
        x, y = rand(rng, sx, dtype), rand(rng, sy, dtype)
        check(run(lambda cc, xx, yy: flow.where(cc, xx, yy), c, x, y), np.where(c, x, y))


def test_where_numeric_condition_and_scalars(rng):
    c = rand(rng, (17,), np.float32)
    c[::2] = 0
    x = rand(rng, (17,), np.float32)
    got = run(lambda cc, xx: (flow.where(cc, xx, 0.0), flow.where(xx > 0, xx, -1.0),
                              flow.where(xx > 0, 1.0, xx)), c, x, ret=typing_tuple(3))
    check(got[0], np.where(c != 0, x, 0))
    check(got[1], np.where(x > 0, x, -1).astype(np.float32))
    check(got[2], np.where(x > 0, 1, x).astype(np.float32))


def test_where_scalar_branches(rng):
    c = rand(rng, (17,), np.bool_)
    got = run(lambda cc: (flow.where(cc, 1.0, 0.0), flow.where(cc, 3, -1)), c, ret=typing_tuple(2))
    check(got[0], np.where(c, 1.0, 0.0).astype(np.float32))
    check(got[1], np.where(c, 3, -1).astype(np.int32))


def test_where_one_argument_is_rejected():
    c = np.ones(3, np.bool_)
    with pytest.raises(NotImplementedError, match="where"):
        run(lambda cc: flow.where(cc), c)


# ---------------------------------------------------------------- cast

ALL_DTYPES = [np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_]


def _cast_source(rng, src, dst, n):
    if src == np.bool_:
        return rand(rng, (n,), np.bool_)
    if np.issubdtype(src, np.floating):
        # float -> int is only defined (numpy, C) within the target's range
        lo = 0.0 if dst in (np.uint8, np.bool_) else -100.0
        x = rng.uniform(lo, 100.0, size=n).astype(src)
        if dst in (np.uint8,) or n < 4:
            return x
        x[:3] = [0.0, -0.0 if lo < 0 else 0.0, 0.5]
        return x
    info = np.iinfo(src)
    x = rng.integers(max(info.min, -120), min(info.max, 250) + 1, size=n).astype(src)
    x[0] = 0
    return x


@pytest.mark.parametrize("dst", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("src", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_cast(src, dst, rng):
    x = _cast_source(rng, src, dst, 33)
    with np.errstate(all="ignore"):
        want = x.astype(dst)  # int -> narrower int wraps (numpy and C agree)
    check(run(lambda a: flow.cast(a, FLOW_DT[dst]), x), want)


def test_cast_bad_dtype_names_job_and_line():
    x = np.zeros(3, np.float32)
    with pytest.raises(TypeError, match=r"^job 'op_job', test_ops\.py:\d+: cast: numpy dtype complex64 "
                                        r"has no flowjit equivalent"):
        run(lambda a: flow.cast(a, np.complex64), x)


def test_cast_forms(rng):
    x = rand(rng, (7,), np.float32, -50, 50)
    got = run(lambda a: (flow.cast(a, flow.int32), flow.cast(a, np.float64), flow.cast(a, "int64"),
                         flow.cast(flow.cast(a, flow.double), flow.float)), x, ret=typing_tuple(4))
    check(got[0], x.astype(np.int32))
    check(got[1], x.astype(np.float64))
    check(got[2], x.astype(np.int64))
    check(got[3], x)
    check(run(lambda a: flow.cast(a, flow.int8), np.full((), 3.7, np.float32)),
          np.array(3, np.int8))
    check(run(lambda a: flow.cast(a, flow.int32), np.zeros((0, 2), np.float32), ret=tp.ListNumpy),
          np.zeros((0, 2), np.int32))


# ---------------------------------------------------------------- reductions

REDUCE = {
    "reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max, "reduce_min": np.min,
    "reduce_prod": np.prod,
}
AXES = [None, 0, 1, -1, -2, [0, 2], [-1, 0], [0, 1, 2], []]


def oneflow_full(want):
    """numpy's result of a reduction of a rank >= 1 input, in OneFlow's shape: a
    reduction over every axis without keepdims gives shape (1,), not ()."""
    want = np.asarray(want)
    return want.reshape(1) if want.ndim == 0 else want


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce(name, dtype, rng):
    fn, ref = getattr(flow.math, name), REDUCE[name]
    lo, hi = (0.7, 1.3) if name == "reduce_prod" else (-3, 3)
    x = rand(rng, (3, 7, 33), dtype, lo, hi)
    for ax in AXES:  # one job per axis, with and without keepdims
        got = run(lambda a: (fn(a, axis=ax), fn(a, axis=ax, keepdims=True)), x, ret=typing_tuple(2))
        np_axis = tuple(ax) if isinstance(ax, list) else ax
        check(got[0], oneflow_full(ref(x, axis=np_axis)))
        check(got[1], ref(x, axis=np_axis, keepdims=True))


def test_partial_reduction_shared_by_two_outputs(rng):
    x = rand(rng, (3, 17), np.float32)

    def body(a):
        s = flow.math.reduce_sum(a, axis=1)
        return s + 1.0, s * 2.0

    got = run(body, x, ret=typing_tuple(2))
    # float32 sums of 17 terms in another order (SSE's 4 lanes vs numpy's
    # pairwise) differ by a few ulp of the terms, not of a cancelled result.
    eps = 17 * np.finfo(np.float32).eps * float(np.abs(x).max())
    check(got[0], x.sum(1) + 1, atol=eps)
    check(got[1], x.sum(1) * 2, atol=2 * eps)


@pytest.mark.parametrize("reduce", ["reduce_sum", "reduce_max"])
def test_full_reduction_shared_by_two_outputs(reduce, rng):
    x = rand(rng, (3, 17), np.float32)

    def body(a):
        s = getattr(flow.math, reduce)(a)
        return s + 1.0, s * 2.0

    got = run(body, x, ret=typing_tuple(2))
    want = oneflow_full(getattr(np, reduce[len("reduce_"):])(x))
    check(got[0], want + np.float32(1))
    check(got[1], want * np.float32(2))


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce_sizes(name, rng):
    fn, ref = getattr(flow.math, name), REDUCE[name]
    lo, hi = (0.99, 1.01) if name == "reduce_prod" else (-3, 3)
    for n in SIZES:
        x = rand(rng, (n,), np.float32, lo, hi)
        got = run(lambda a: (fn(a), fn(a, axis=0, keepdims=True)), x, ret=typing_tuple(2))
        check(got[0], oneflow_full(ref(x)))
        check(got[1], ref(x, axis=0, keepdims=True))
    x = rand(rng, (17, 1000), np.float64, lo, hi)
    check(run(lambda a: fn(a, axis=1), x), ref(x, axis=1))
    check(run(lambda a: fn(a, axis=0), x), ref(x, axis=0))
    s = np.full((), 1.5, np.float32)
    check(run(lambda a: fn(a), s), ref(s))  # a 0-d input still gives ()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_integer(dtype, rng):
    x = rand(rng, (7, 33), dtype, -50, 50)
    got = run(lambda a: (flow.math.reduce_sum(a), flow.math.reduce_sum(a, axis=0),
                         flow.math.reduce_max(a, axis=1), flow.math.reduce_min(a, axis=-1, keepdims=True)),
              x, ret=typing_tuple(4))
    check(got[0], oneflow_full(np.sum(x, dtype=dtype)))
    check(got[1], np.sum(x, axis=0, dtype=dtype))
    check(got[2], np.max(x, axis=1))
    check(got[3], np.min(x, axis=-1, keepdims=True))


def test_reduce_empty():
    x = np.zeros((0, 3), np.float32)
    got = run(lambda a: (flow.math.reduce_sum(a, axis=0), flow.math.reduce_sum(a, axis=1),
                         flow.math.reduce_prod(a, axis=0)), x, ret=typing_tuple(3))
    check(got[0], np.zeros(3, np.float32))
    check(got[1], np.zeros(0, np.float32))
    check(got[2], np.ones(3, np.float32))


def test_reduce_bad_axis():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="reduce_sum"):
        run(lambda a: flow.math.reduce_sum(a, axis=2), x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_argmax(dtype, rng):
    x = rand(rng, (7, 33), dtype, -1000, 1000)
    if dtype == np.int32:
        x = rng.permutation(7 * 33).reshape(7, 33).astype(np.int32)  # no ties
    got = run(lambda a: (flow.math.argmax(a), flow.math.argmax(a, axis=0), flow.argmax(a, axis=-1),
                         flow.math.argmax(a, axis=1, dtype=flow.int64)), x, ret=typing_tuple(4))
    check(got[0], np.argmax(x, axis=-1).astype(np.int32))
    check(got[1], np.argmax(x, axis=0).astype(np.int32))
    check(got[2], np.argmax(x, axis=-1).astype(np.int32))
    check(got[3], np.argmax(x, axis=1).astype(np.int64))
    for n in SIZES:
        v = rng.permutation(n).astype(dtype)
        # OneFlow's shape rule: the argmax of a vector has shape (1,)
        check(run(lambda a: flow.math.argmax(a), v), np.array([np.argmax(v)], np.int32))


def test_argmax_ties_take_first():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 0, 5]], np.float32)
    check(run(lambda a: flow.math.argmax(a), x), np.argmax(x, axis=-1).astype(np.int32))


# ---------------------------------------------------------------- shapes

def test_reshape(rng):
    x = rand(rng, (3, 7, 33), np.float32)
    shapes = [[-1], [21, 33], [3, -1], [-1, 7, 3, 11], [693], [1, 3, 1, 231], (33, 21)]
    got = run(lambda a: tuple(flow.reshape(a, s) for s in shapes), x, ret=typing_tuple(len(shapes)))
    for g, s in zip(got, shapes):
        check(g, x.reshape(s))
    check(run(lambda a: flow.reshape(a, [1, 1]), np.ones((), np.float32)), np.ones((1, 1), np.float32))
    check(run(lambda a: flow.reshape(a, []), np.ones((1, 1), np.int32)), np.ones((), np.int32))
    check(run(lambda a: flow.reshape(a, [3, -1, 2]), np.zeros((0, 6), np.float32), ret=tp.ListNumpy),
          np.zeros((3, 0, 2), np.float32))


def test_reshape_bad():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="reshape"):
        run(lambda a: flow.reshape(a, [5, -1]), x)
    with pytest.raises(ValueError, match="reshape"):
        run(lambda a: flow.reshape(a, [-1, -1]), x)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_transpose(dtype, rng):
    x = rand(rng, (3, 7, 17), dtype)
    perms = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]]
    got = run(lambda a: tuple(flow.transpose(a, perm=p) for p in perms) + (flow.transpose(a),), x,
              ret=typing_tuple(len(perms) + 1))
    for g, p in zip(got, perms + [None]):
        check(g, np.transpose(x, p))
    y = rand(rng, (2, 3, 5, 7), dtype)
    check(run(lambda a: flow.transpose(a, perm=[3, 1, 0, 2]), y), np.transpose(y, [3, 1, 0, 2]))
    z = rand(rng, (33, 1000), dtype)
    check(run(lambda a: flow.transpose(a, [1, 0]), z), z.T)


def test_transpose_bad_perm():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="transpose"):
        run(lambda a: flow.transpose(a, [0, 0]), x)


def test_expand_dims_squeeze(rng):
    x = rand(rng, (3, 1, 7), np.float32)
    got = run(lambda a: (flow.expand_dims(a, 0), flow.expand_dims(a, -1), flow.expand_dims(a, 2),
                         flow.squeeze(a), flow.squeeze(a, axis=[1]), flow.squeeze(a, axis=[-2]),
                         flow.squeeze(flow.expand_dims(a, 0), axis=[0, 2])), x,
              ret=typing_tuple(7))
    want = (np.expand_dims(x, 0), np.expand_dims(x, -1), np.expand_dims(x, 2), np.squeeze(x),
            np.squeeze(x, axis=1), np.squeeze(x, axis=-2), np.squeeze(np.expand_dims(x, 0), axis=(0, 2)))
    for g, w in zip(got, want):
        check(g, w)
    s = np.full((), 2.5, np.float32)
    check(run(lambda a: flow.expand_dims(a, 0), s), np.expand_dims(s, 0))


def test_squeeze_bad_axis():
    x = np.zeros((3, 1), np.float32)
    with pytest.raises(ValueError, match="squeeze: axis 0 has extent 3, not 1"):
        run(lambda a: flow.squeeze(a, axis=[0]), x)
    with pytest.raises(ValueError, match=r"squeeze: axis 5 is out of range for a rank-2 input"):
        run(lambda a: flow.squeeze(a, axis=[5]), x)
    with pytest.raises(ValueError, match=r"squeeze: axis 0 is out of range for a rank-0 input"):
        run(lambda a: flow.squeeze(a, axis=0), np.zeros((), np.float32))
    with pytest.raises(ValueError, match=r"expand_dims: axis 3 is out of range for rank 1"):
        run(lambda a: flow.expand_dims(a, 3), np.zeros(3, np.float32))
    with pytest.raises(TypeError, match=r"reshape: shape must be a list or tuple of ints, got \[True, 3\]"):
        run(lambda a: flow.reshape(a, [True, 3]), np.zeros(3, np.float32))


def test_identity(rng):
    for dtype in ALL_DTYPES:
        x = rand(rng, (17,), dtype)
        check(run(lambda a: flow.identity(a), x), x)
    x = rand(rng, (), np.float64)
    check(run(lambda a: flow.identity(a), x), x)


def test_returning_a_placeholder_unchanged(rng):
    x = rand(rng, (33,), np.float32)
    check(run(lambda a: a, x), x)


# ---------------------------------------------------------------- matmul

def _matmul_check(got, a, b, ta, tb, dtype):
    """Dot products: each element within rtol * (|a| @ |b|) of the float64 product
    (the standard bound for a sum of products), plus atol."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if ta:
        a64 = np.swapaxes(a64, -1, -2)
    if tb:
        b64 = np.swapaxes(b64, -1, -2)
    want = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    assert got.shape == want.shape and got.dtype == dtype
    rtol, atol = (1e-5, 1e-6) if dtype == np.float32 else (1e-12, 1e-14)
    err = np.abs(got.astype(np.float64) - want)
    bad = err > rtol * scale + atol
    assert not bad.any(), f"{bad.sum()} elements off; max error {err.max()}"


MATMUL_SIZES = [(1, 1, 1), (7, 17, 33), (33, 1, 17), (17, 33, 1), (16, 16, 16), (33, 1000, 7),
                (65, 130, 47)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul(ta, tb, dtype, rng):
    for m, k, n in MATMUL_SIZES:
        a = rand(rng, (k, m) if ta else (m, k), dtype)
        b = rand(rng, (n, k) if tb else (k, n), dtype)
        got = run(lambda x, y: flow.matmul(x, y, transpose_a=ta, transpose_b=tb), a, b)
        _matmul_check(got, a, b, ta, tb, dtype)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_batched(ta, tb, rng):
    # 3-D a with 2-D b
    a = rand(rng, (3, 17, 7) if ta else (3, 7, 17), np.float32)
    b = rand(rng, (33, 17) if tb else (17, 33), np.float32)
    _matmul_check(run(lambda x, y: flow.matmul(x, y, transpose_a=ta, transpose_b=tb), a, b),
                  a, b, ta, tb, np.float32)
    # 3-D with 3-D
    a = rand(rng, (5, 17, 7) if ta else (5, 7, 17), np.float64)
    b = rand(rng, (5, 33, 17) if tb else (5, 17, 33), np.float64)
    _matmul_check(run(lambda x, y: flow.matmul(x, y, transpose_a=ta, transpose_b=tb), a, b),
                  a, b, ta, tb, np.float64)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_matmul_integer(dtype, rng):
    a, b = rand(rng, (7, 33), dtype, -9, 9), rand(rng, (33, 17), dtype, -9, 9)
    check(run(lambda x, y: flow.matmul(x, y), a, b), a @ b)
    check(run(lambda x, y: flow.matmul(x, y, transpose_a=True, transpose_b=True), a.T.copy(), b.T.copy()),
          a @ b)


def test_matmul_bad_shapes():
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ"):
        run(lambda x, y: flow.matmul(x, y), np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"matmul: batch dimensions differ"):
        run(lambda x, y: flow.matmul(x, y), np.zeros((2, 3, 4), np.float32),
            np.zeros((3, 4, 5), np.float32))
    with pytest.raises(ValueError, match=r"matmul: operands must have rank 2 or more"):
        run(lambda x, y: flow.matmul(x, y), np.zeros(3, np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match=r"matmul: operand dtypes differ"):
        run(lambda x, y: flow.matmul(x, y), np.zeros((3, 4), np.float32), np.zeros((4, 2), np.float64))


def test_matmul_alpha(rng):
    a, b = rand(rng, (7, 17), np.float32), rand(rng, (17, 5), np.float32)
    got = run(lambda x, y: flow.matmul(x, y, alpha=2.0), a, b)
    _matmul_check(got / 2, a, b, False, False, np.float32)


def test_matmul_empty_contraction():
    # k == 0: the result is zeros
    k0a, k0b = np.zeros((7, 0), np.float32), np.zeros((0, 5), np.float32)
    check(run(lambda x, y: flow.matmul(x, y), k0a, k0b, ret=tp.ListNumpy), np.zeros((7, 5), np.float32))


def in_subprocess(code, timeout=120):
    """Runs `code` in a fresh interpreter (for bugs that kill the process);
    returns (exit status, output)."""
    import subprocess
    import sys
    import textwrap
    prelude = "import numpy as np, typing, flowjit as flow, flowjit.typing as tp\n"
    p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("m,n", [(0, 5), (7, 0)])
def test_matmul_empty_result(m, n):
    rc, out = in_subprocess(f"""
        @flow.global_function()
        def g(a: tp.ListNumpy.Placeholder(({max(m, 1)}, 17)),
              b: tp.ListNumpy.Placeholder((17, {max(n, 1)}))) -> tp.Numpy:
            return flow.matmul(a, b)
        r = g([np.ones(({m}, 17), np.float32)], [np.ones((17, {n}), np.float32)])
        assert r.shape == ({m}, {n}) and r.dtype == np.float32, r.shape
        print("OK")
    """)
    assert rc == 0 and "OK" in out, out[-2000:]


# ---------------------------------------------------------------- softmax and losses

def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_log_softmax(dtype, rng):
    for shape, axis in [((7,), None), ((3, 17), None), ((3, 17), 0), ((2, 5, 33), 1),
                        ((2, 5, 33), -1), ((4, 1000), None), ((5, 1), None)]:
        x = rand(rng, shape, dtype, -5, 5)
        ax = -1 if axis is None else axis
        got = run(lambda a: (flow.nn.softmax(a, axis=axis), flow.nn.log_softmax(a, axis=axis)), x,
                  ret=typing_tuple(2))
        check(got[0], _softmax(x.astype(np.float64), ax).astype(dtype))
        check(got[1], _log_softmax(x.astype(np.float64), ax).astype(dtype))


def test_softmax_is_stable():
    x = np.array([[1000.0, 0.0, -1000.0, 999.0], [-1e4, -1e4, -1e4, -1e4],
                  [-np.inf, 0.0, 1.0, -np.inf]], np.float32)  # -inf: a masked entry
    labels = np.array([3, 1, 2], np.int32)
    got = run(lambda a, lb: (flow.nn.softmax(a), flow.nn.log_softmax(a),
                             flow.nn.sparse_softmax_cross_entropy_with_logits(lb, a)), x, labels,
              ret=typing_tuple(3))
    with np.errstate(all="ignore"):
        ls = _log_softmax(x.astype(np.float64))
        check(got[0], _softmax(x.astype(np.float64)).astype(np.float32))
    check(got[1], ls.astype(np.float32))
    check(got[2], -ls[np.arange(3), labels].astype(np.float32))


@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_softmax_cross_entropy(dtype, label_dtype, rng):
    for n, c in [(1, 1), (7, 10), (33, 17), (1000, 3)]:
        logits = rand(rng, (n, c), dtype, -5, 5)
        labels = rng.integers(0, c, size=n).astype(label_dtype)
        got = run(lambda lb, lg: flow.nn.sparse_softmax_cross_entropy_with_logits(labels=lb, logits=lg),
                  labels, logits)
        want = -_log_softmax(logits.astype(np.float64))[np.arange(n), labels]
        check(got, want.astype(dtype))


def test_softmax_cross_entropy_dense(rng):
    logits = rand(rng, (7, 10), np.float32)
    labels = _softmax(rand(rng, (7, 10), np.float64)).astype(np.float32)
    got = run(lambda lb, lg: flow.nn.softmax_cross_entropy_with_logits(labels=lb, logits=lg), labels, logits)
    check(got, -(labels * _log_softmax(logits.astype(np.float64))).sum(-1).astype(np.float32))


@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64, np.uint8])
def test_one_hot(idx_dtype, rng):
    idx = rng.integers(0, 10, size=33).astype(idx_dtype)
    got = run(lambda i: (flow.one_hot(i, depth=10), flow.one_hot(i, 10, on_value=5, off_value=-1,
                                                                  dtype=flow.int32),
                         flow.one_hot(i, depth=12, dtype=flow.float64)), idx, ret=typing_tuple(3))
    eye = np.eye(10, dtype=np.float32)[idx]
    check(got[0], eye)
    check(got[1], np.where(eye > 0, 5, -1).astype(np.int32))
    check(got[2], np.eye(12)[idx])
    # an index outside [0, depth) is an error of the run (TensorFlow gives a row of off_value)
    bad = np.array([0, 10, 200, 3], idx_dtype)
    with pytest.raises(IndexError, match=r"one_hot: indices holds 10 at \[1\], outside the valid range \[0, 10\)"):
        run(lambda i: flow.one_hot(i, depth=10), bad)
    idx2 = rng.integers(0, 7, size=(3, 5)).astype(idx_dtype)
    check(run(lambda i: flow.one_hot(i, depth=7), idx2), np.eye(7, dtype=np.float32)[idx2])


# ---------------------------------------------------------------- constants

def test_constant_zeros_ones():
    @flow.global_function(type="predict")
    def consts() -> tp.Bundle[tp.Numpy]:
        return (flow.constant(3.5, shape=(2, 17)), flow.constant(7, dtype=flow.int64, shape=[33]),
                flow.constant(2.0, dtype=flow.double), flow.constant(4),
                flow.zeros((3, 7)), flow.ones([1000], dtype=flow.int8), flow.zeros((2,), flow.bool),
                flow.ones((), dtype=flow.float64), flow.constant(True, dtype=flow.bool, shape=(3,)),
                flow.zeros((0, 3)))

    got = consts()
    want = (np.full((2, 17), 3.5, np.float32), np.full(33, 7, np.int64), np.array(2.0),
            np.array(4, np.int32), np.zeros((3, 7), np.float32), np.ones(1000, np.int8),
            np.zeros(2, np.bool_), np.ones((), np.float64), np.ones(3, np.bool_),
            np.zeros((0, 3), np.float32))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        check(g, w)


def test_constant_in_arithmetic(rng):
    x = rand(rng, (3, 17), np.float32)
    got = run(lambda a: (a + flow.constant(2.0, shape=(17,)), a * flow.ones_like(a),
                         a + flow.zeros_like(a), flow.broadcast_to(flow.constant(1.5), [3, 17]),
                         flow.broadcast_like(flow.constant(0.5, shape=(17,)), a)), x, ret=typing_tuple(5))
    check(got[0], x + 2)
    check(got[1], x)
    check(got[2], x)
    check(got[3], np.full((3, 17), 1.5, np.float32))
    check(got[4], np.full((3, 17), 0.5, np.float32))


def test_constant_rejects_arrays():
    with pytest.raises(TypeError, match="constant: value must be a scalar number"):
        run(lambda a: flow.constant(np.ones(3)) + a, np.ones(3, np.float32))


# ---------------------------------------------------------------- composed expressions

def test_fused_expression_chain(rng):
    # a long elementwise chain with broadcasting, a reduction and a matmul in one job
    x = rand(rng, (33, 17), np.float32)
    w = rand(rng, (17, 7), np.float32)
    b = rand(rng, (7,), np.float32)

    def body(xx, ww, bb):
        h = flow.math.tanh(flow.matmul(xx, ww) + bb)
        s = flow.math.reduce_sum(h * h, axis=1, keepdims=True)
        return flow.math.sqrt(s + 1.0) * flow.math.sigmoid(h) - h / 3.0

    h = np.tanh(x.astype(np.float64) @ w + b)
    s = (h * h).sum(1, keepdims=True)
    want = np.sqrt(s + 1) * _sigmoid(h) - h / 3
    np.testing.assert_allclose(run(body, x, w, b), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- empty tensors through every op kind

def test_empty_tensors_through_ops():
    x = np.zeros((0, 5), np.float32)
    idx = np.zeros((0,), np.int32)
    c = np.zeros((0, 5), np.bool_)
    got = run(lambda a, i, cc: (flow.transpose(a), flow.where(cc, a, 1.0), flow.identity(a),
                                flow.expand_dims(a, 1), flow.nn.softmax(a), flow.nn.log_softmax(a),
                                flow.math.argmax(a), flow.one_hot(i, depth=4),
                                flow.math.reduce_max(a, axis=1), flow.cast(a, flow.int8)),
              x, idx, c, ret=tp.Bundle[tp.Numpy])
    want = (x.T, x, x, x[:, None], x, x, np.zeros(0, np.int32), np.zeros((0, 4), np.float32),
            np.zeros(0, np.float32), np.zeros((0, 5), np.int8))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        check(g, w)


def test_empty_cross_entropy():
    logits = np.zeros((0, 10), np.float32)
    labels = np.zeros((0,), np.int32)
    got = run(lambda lb, lg: flow.nn.sparse_softmax_cross_entropy_with_logits(lb, lg), labels, logits,
              ret=tp.ListNumpy)
    check(got, np.zeros(0, np.float32))


def test_ieee_simplifications(rng):
    # algebraic rewrites must keep IEEE results: x*0 is nan for inf/nan, x-x too, x/x is nan at 0
    x = np.array([np.inf, -np.inf, np.nan, 0.0, 1.0, -2.0, 3e38, -1e-40] + [1.5] * 9, np.float32)
    got = run(lambda a: (a * 0.0, a - a, a / a, a * 1.0, 0.0 * a, -(-a), a ** 1.0,
                         flow.math.maximum(a, a), a == a, a != a), x, ret=tp.Bundle[tp.Numpy])
    with np.errstate(all="ignore"):
        want = (x * 0.0, x - x, x / x, x * 1.0, 0.0 * x, -(-x), x ** 1.0, np.maximum(x, x), x == x,
                x != x)
    for g, w in zip(got, want):
        check(g, w)


def test_adding_zero_normalizes_negative_zero():
    x = np.array([-0.0, 0.0, 1.0], np.float32)
    got = run(lambda a: a + 0.0, x)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(x + np.float32(0.0)))


def test_views_fused_with_elementwise_and_matmul(rng):
    a = rand(rng, (7, 17), np.float32)
    b = rand(rng, (17, 7), np.float32)

    def body(x, y):
        xt = flow.transpose(x)
        return (xt + y, flow.reshape(xt, [7, 17]) * 2, flow.matmul(flow.transpose(y), xt),
                flow.matmul(xt, flow.transpose(y)), flow.math.reduce_sum(xt * y, axis=0),
                flow.nn.softmax(xt), flow.math.reduce_max(xt + 1, axis=1, keepdims=True) - xt,
                flow.broadcast_to(flow.reshape(flow.math.reduce_sum(x, axis=1), [7, 1]), [7, 17]) + x,
                flow.transpose(xt * y))

    got = run(body, a, b, ret=tp.Bundle[tp.Numpy])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T + b64, a64.T.reshape(7, 17) * 2, b64.T @ a64.T, a64.T @ b64.T, (a64.T * b64).sum(0),
            _softmax(a64.T), (a64.T + 1).max(1, keepdims=True) - a64.T, a64.sum(1, keepdims=True) + a64,
            (a64.T * b64).T)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)  # sums of 17 terms


def test_integer_constants_exact():
    @flow.global_function()
    def consts() -> tp.Bundle[tp.Numpy]:
        return (flow.constant(2 ** 31 - 1, dtype=flow.int32), flow.constant(-2 ** 31, dtype=flow.int32),
                flow.constant(255, dtype=flow.uint8), flow.constant(-128, dtype=flow.int8),
                flow.constant(2 ** 40 + 1, dtype=flow.int64))

    got = consts()
    want = (np.array(2 ** 31 - 1, np.int32), np.array(-2 ** 31, np.int32), np.array(255, np.uint8),
            np.array(-128, np.int8), np.array(2 ** 40 + 1, np.int64))
    for g, w in zip(got, want):
        check(g, w)


def test_int64_constant_beyond_double_precision():
    @flow.global_function()
    def big() -> tp.Numpy:
        return flow.constant(2 ** 53 + 1, dtype=flow.int64)

    check(big(), np.array(2 ** 53 + 1, np.int64))


def test_argmin(rng):
    x = rand(rng, (7, 33), np.float32, -1000, 1000)
    got = run(lambda a: (flow.math.argmin(a), flow.math.argmin(a, axis=0, dtype=flow.int64)), x,
              ret=typing_tuple(2))
    check(got[0], np.argmin(x, axis=-1).astype(np.int32))
    check(got[1], np.argmin(x, axis=0).astype(np.int64))


def test_composite_python_ops(rng):
    # ops flowjit composes in Python from the primitives
    x = rand(rng, (4, 3, 5), np.float32, -30, 30)
    z = rand(rng, (4, 3, 5), np.float32, 0, 1)
    bias = rand(rng, (3,), np.float32)
    bias5 = rand(rng, (5,), np.float32)
    got = run(lambda a, b, c, d: (flow.math.squared_difference(a, b), flow.math.softplus(a),
                                  flow.nn.sigmoid_cross_entropy_with_logits(labels=b, logits=a),
                                  flow.nn.bias_add(a, c, data_format="NCHW"), flow.nn.bias_add(a, d)),
              x, z, bias, bias5, ret=typing_tuple(5))
    x64, z64 = x.astype(np.float64), z.astype(np.float64)
    check(got[0], ((x64 - z64) ** 2).astype(np.float32))
    check(got[1], np.logaddexp(0, x64).astype(np.float32))
    check(got[2], (np.logaddexp(0, x64) - x64 * z64).astype(np.float32))
    check(got[3], x + bias.reshape(1, 3, 1))
    check(got[4], x + bias5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sin_cos_reduce_large_arguments(dtype):
    """The argument reduction holds far beyond the polynomials' range (float
    is reduced in double): |x| up to 1e12 matches numpy; beyond the reduction's
    range results stay in [-1, 1] instead of growing without bound."""
    rng = np.random.default_rng(3)
    x = (rng.uniform(-1, 1, 4000) * 10.0 ** rng.uniform(3, 12, 4000)).astype(dtype)
    x64 = x.astype(np.float64)
    got = run(lambda a: (flow.math.sin(a), flow.math.cos(a)), x, ret=typing_tuple(2))
    atol = 2e-7 if dtype == np.float32 else 1e-15
    np.testing.assert_allclose(got[0], np.sin(x64), rtol=0, atol=atol)
    np.testing.assert_allclose(got[1], np.cos(x64), rtol=0, atol=atol)
    huge = np.array([1e20, -3e30, np.finfo(dtype).max], dtype)
    far = run(lambda a: (flow.math.sin(a), flow.math.cos(a)), huge, ret=typing_tuple(2))
    assert np.all(np.abs(far[0]) <= 1) and np.all(np.abs(far[1]) <= 1), far
