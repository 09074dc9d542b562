"""Math ops written as compositions of the IR's primitive ops (flow.math, flow.*).

Gradients, fusion and device layouts come from the primitives. Two rules keep
the compositions honest:
  * accuracy near the points where the naive formula cancels (expm1, log1p,
    sinh, asinh, ...) comes from a second formula on that range, picked with
    `where`;
  * a branch that `where` does not pick still gets a zero gradient, and
    0 * inf is nan, so every branch is fed an input clamped into the range
    where it is finite ("safe" inputs below), not the raw operand.
"""
import math as _pymath
import numbers
from typing import Optional, Sequence, Tuple

from .._core import dtypes as _dtypes, trace as _trace
from . import builders as _ops
from .._core.blob import Blob
from .builders import Axis, BlobOrScalar

_FLOATS = _dtypes.FLOATS
_INTS = (_dtypes.int8, _dtypes.uint8, _dtypes.int32, _dtypes.int64)


# ---------------------------------------------------------------- argument checks

def blob(x, api, what="x"):
    """x itself, or a TypeError naming the op when it is not a Blob."""
    if not isinstance(x, Blob):
        _trace.fail(TypeError, f"{api}: {what} must be a Blob, got {type(x).__name__}")
    return x


def floating(x, api, what="x"):
    """x itself, or a TypeError naming the op when it is not a float32/float64 Blob."""
    blob(x, api, what)
    if x.dtype not in _FLOATS:
        _trace.fail(TypeError, f"{api}: {what} must be a floating-point blob (float32 or float64), "
                    f"got {x.dtype.name}; convert it with flow.cast")
    return x


def number(v, api, what):
    """v as a float, or a TypeError naming the op when it is not a real number."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        _trace.fail(TypeError, f"{api}: {what} must be a number, got {type(v).__name__}")
    return float(v)


def axes(x, axis, api):
    """`axis` (None, an int or a list of ints) as a list of non-negative axes of x."""
    r = len(x.shape)
    if axis is None:
        return list(range(r))
    if isinstance(axis, numbers.Integral) and not isinstance(axis, bool):
        axis = [axis]
    if not isinstance(axis, (list, tuple)) or not all(
            isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in axis):
        _trace.fail(TypeError, f"{api}: axis must be None, an int or a list of ints, got {axis!r}")
    out = []
    for a in axis:
        if not -r <= a < r:
            _trace.fail(ValueError, f"{api}: axis {a} is out of range for a rank-{r} input "
                        f"(expected {-r} <= axis < {r})")
        out.append(int(a) % r)
    return out


def _const(x, v):
    """A scalar constant of x's dtype."""
    return _ops._scalar(v, x.dtype, "constant")


# ---------------------------------------------------------------- exp and log near 0

def expm1(x: Blob, name: Optional[str] = None) -> Blob:
    """exp(x) - 1, accurate for small |x|: 2t / (1 - t) with t = tanh(x/2) for
    |x| < 0.5 (no cancellation), exp(x) - 1 elsewhere.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.expm1(x)
        >>> job(np.float32([-1, 0.001, 2])).astype(float).round(3).tolist()
        [-0.632, 0.001, 6.389]
    """
    floating(x, "expm1")
    small = _ops.less(_ops.abs(x), 0.5)
    xs = _ops.where(small, x, _const(x, 0.0))
    t = _ops.tanh(_ops.multiply(xs, 0.5))
    near = _ops.divide(_ops.multiply(t, 2.0), _ops.subtract(1.0, t))
    return _ops.where(small, near, _ops.subtract(_ops.exp(x), 1.0), name=name)


def log1p(x: Blob, name: Optional[str] = None) -> Blob:
    """log(1 + x), accurate for small |x|: with u = 1 + x rounded,
    log(u) * x / (u - 1) cancels the rounding of u (x itself where u == 1).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.log1p(x)
        >>> job(np.float32([-0.5, 0.001, 3])).astype(float).round(3).tolist()
        [-0.693, 0.001, 1.386]
    """
    floating(x, "log1p")
    small = _ops.less(_ops.abs(x), 0.5)
    xs = _ops.where(small, x, _const(x, 0.0))
    u = _ops.add(xs, 1.0)
    d = _ops.subtract(u, 1.0)
    exact = _ops.equal(d, 0.0)
    d_safe = _ops.where(exact, _const(x, 1.0), d)
    near = _ops.where(exact, xs, _ops.multiply(_ops.log(u), _ops.divide(xs, d_safe)))
    return _ops.where(small, near, _ops.log(_ops.add(x, 1.0)), name=name)


def log_sigmoid(x: Blob, name: Optional[str] = None) -> Blob:
    """log(sigmoid(x)) = -softplus(-x) = min(x, 0) - log1p(exp(-|x|)).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.log_sigmoid(x)
        >>> job(np.float32([-2, 0, 3])).astype(float).round(3).tolist()
        [-2.127, -0.693, -0.049]
    """
    floating(x, "log_sigmoid")
    return _ops.subtract(_ops.minimum(x, 0.0), log1p(_ops.exp(_ops.negative(_ops.abs(x)))),
                         name=name)


def _zero_where_x_is_zero(x, y, f, api, name):
    """f(x, y), and 0 where x == 0 (y is replaced by 1 there, so a y of 0 or inf
    makes no NaN): xlogy and xdivy."""
    x, y = _ops._lift_pair(x, y, api)
    floating(x, api, "x")
    floating(y, api, "y")
    zero = _ops.equal(x, 0.0)
    y_safe = _ops.where(zero, _const(y, 1.0), y)
    return _ops.where(zero, _const(x, 0.0), f(x, y_safe), name=name)


def xlogy(x: BlobOrScalar, y: BlobOrScalar, name: Optional[str] = None) -> Blob:
    """x * log(y), and 0 where x == 0 (even where y is 0).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.xlogy(x, y)
        >>> job(np.float32([0, 2, 3]), np.float32([0, 1, 2])).astype(float).round(3).tolist()
        [0.0, 0.0, 2.079]
    """
    return _zero_where_x_is_zero(x, y, lambda a, b: _ops.multiply(a, _ops.log(b)), "xlogy", name)


# ---------------------------------------------------------------- hyperbolic

def _odd(x, f, name):
    """f(|x|) with the sign of x."""
    return _ops.where(_ops.less(x, 0.0), _ops.negative(f), f, name=name)


def sinh(x: Blob, name: Optional[str] = None) -> Blob:
    """sinh(x) = (e + e / (e + 1)) / 2 with e = expm1(|x|), exact near 0;
    exp(|x|/2)^2 / 2 past 20, where exp(-|x|) no longer counts.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.sinh(x)
        >>> job(np.float32([-1, 0.5, 2])).astype(float).round(3).tolist()
        [-1.175, 0.521, 3.627]
    """
    floating(x, "sinh")
    a = _ops.abs(x)
    e = expm1(_ops.minimum(a, 20.0))
    near = _ops.multiply(_ops.add(e, _ops.divide(e, _ops.add(e, 1.0))), 0.5)
    h = _ops.exp(_ops.multiply(_ops.maximum(a, 20.0), 0.5))
    far = _ops.multiply(_ops.multiply(h, 0.5), h)
    return _odd(x, _ops.where(_ops.less(a, 20.0), near, far), name)


def cosh(x: Blob, name: Optional[str] = None) -> Blob:
    """cosh(x) = h^2 / 2 + 1 / (2 h^2) with h = exp(|x|/2), so it overflows only
    where cosh does.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.cosh(x)
        >>> job(np.float32([-1, 0.5, 2])).astype(float).round(3).tolist()
        [1.543, 1.128, 3.762]
    """
    floating(x, "cosh")
    h = _ops.exp(_ops.multiply(_ops.abs(x), 0.5))
    hh = _ops.multiply(h, h)
    return _ops.add(_ops.multiply(_ops.multiply(h, 0.5), h), _ops.divide(0.5, hh), name=name)


_LN2 = _pymath.log(2.0)
_BIG = 2.0 ** 28  # past it sqrt(1 + x^2) == |x| in float64 too


def asinh(x: Blob, name: Optional[str] = None) -> Blob:
    """asinh(x) = sign(x) log1p(a + a^2 / (1 + sqrt(1 + a^2))), a = |x|;
    log(a) + log(2) for huge a, where a^2 would overflow.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.asinh(x)
        >>> job(np.float32([-1, 0.5, 2])).astype(float).round(3).tolist()
        [-0.881, 0.481, 1.444]
    """
    floating(x, "asinh")
    a = _ops.abs(x)
    s = _ops.minimum(a, _BIG)
    ss = _ops.multiply(s, s)
    near = log1p(_ops.add(s, _ops.divide(ss, _ops.add(_ops.sqrt(_ops.add(ss, 1.0)), 1.0))))
    far = _ops.add(_ops.log(_ops.maximum(a, _BIG)), _LN2)
    return _odd(x, _ops.where(_ops.less(a, _BIG), near, far), name)


def acosh(x: Blob, name: Optional[str] = None) -> Blob:
    """acosh(x) = log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact near 1);
    log(x) + log(2) for huge x; nan below 1.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.acosh(x)
        >>> job(np.float32([1, 1.5, 3])).astype(float).round(3).tolist()
        [0.0, 0.962, 1.763]
    """
    floating(x, "acosh")
    s = _ops.minimum(x, _BIG)
    t = _ops.subtract(s, 1.0)
    near = log1p(_ops.add(t, _ops.sqrt(_ops.add(_ops.multiply(t, 2.0), _ops.multiply(t, t)))))
    far = _ops.add(_ops.log(_ops.maximum(x, _BIG)), _LN2)
    return _ops.where(_ops.less(x, _BIG), near, far, name=name)


def atanh(x: Blob, name: Optional[str] = None) -> Blob:
    """atanh(x) = sign(x) log1p(2a / (1 - a)) / 2, a = |x| (1 - a is exact near 1).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.atanh(x)
        >>> job(np.float32([-0.5, 0.1, 0.9])).astype(float).round(3).tolist()
        [-0.549, 0.1, 1.472]
    """
    floating(x, "atanh")
    a = _ops.abs(x)
    f = _ops.multiply(log1p(_ops.divide(_ops.multiply(a, 2.0), _ops.subtract(1.0, a))), 0.5)
    return _odd(x, f, name)


# ---------------------------------------------------------------- circular

def tan(x: Blob, name: Optional[str] = None) -> Blob:
    """sin(x) / cos(x).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.tan(x)
        >>> job(np.float32([-1, 0.5, 1.2])).astype(float).round(3).tolist()
        [-1.557, 0.546, 2.572]
    """
    floating(x, "tan")
    return _ops.divide(_ops.sin(x), _ops.cos(x), name=name)


_SQRT3 = _pymath.sqrt(3.0)
_TAN_PI_12 = 2.0 - _SQRT3


def _atan_abs(a):
    """atan(a) for a >= 0 (inf included):
      1. a > 1: atan(a) = pi/2 - atan(1/a), so r = min(a, 1/a) is in [0, 1];
      2. r > tan(pi/12): atan(r) = pi/6 + atan((sqrt3 r - 1) / (r + sqrt3)),
         so s is in [-tan(pi/12), tan(pi/12)], |s| <= 0.268;
      3. atan(s) by its Taylor series s - s^3/3 + s^5/5 ..., cut where the next
         term is below the dtype's rounding (s^2 <= 0.072)."""
    inv = _ops.greater(a, 1.0)
    r = _ops.where(inv, _ops.reciprocal(_ops.maximum(a, 1.0)), a)
    red = _ops.greater(r, _TAN_PI_12)
    s = _ops.where(red, _ops.divide(_ops.subtract(_ops.multiply(r, _SQRT3), 1.0),
                                    _ops.add(r, _SQRT3)), r)
    z = _ops.multiply(s, s)
    terms = 8 if a.dtype is _dtypes.float32 else 14
    p = _const(a, (-1.0) ** terms / (2 * terms + 1))
    for k in range(terms - 1, 0, -1):
        p = _ops.add(_ops.multiply(p, z), (-1.0) ** k / (2 * k + 1))
    t = _ops.add(s, _ops.multiply(_ops.multiply(s, z), p))
    t = _ops.where(red, _ops.add(t, _pymath.pi / 6), t)
    return _ops.where(inv, _ops.subtract(_pymath.pi / 2, t), t)


def atan(x: Blob, name: Optional[str] = None) -> Blob:
    """Elementwise arctangent (range reduction and a series, see _atan_abs).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.atan(x)
        >>> job(np.float32([-1, 0.5, 3])).astype(float).round(3).tolist()
        [-0.785, 0.464, 1.249]
    """
    floating(x, "atan")
    return _odd(x, _atan_abs(_ops.abs(x)), name)


def asin(x: Blob, name: Optional[str] = None) -> Blob:
    """asin(x) = sign(x) atan(a / sqrt((1 - a)(1 + a))), a = |x|; nan past 1.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.asin(x)
        >>> job(np.float32([-1, 0.3, 0.9])).astype(float).round(3).tolist()
        [-1.571, 0.305, 1.12]
    """
    floating(x, "asin")
    a = _ops.abs(x)
    d = _ops.sqrt(_ops.multiply(_ops.subtract(1.0, a), _ops.add(a, 1.0)))
    return _odd(x, _atan_abs(_ops.divide(a, d)), name)


def acos(x: Blob, name: Optional[str] = None) -> Blob:
    """acos(x) = 2 atan(sqrt((1 - x) / (1 + x))); nan past 1.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.acos(x)
        >>> job(np.float32([-1, 0.3, 0.9])).astype(float).round(3).tolist()
        [3.142, 1.266, 0.451]
    """
    floating(x, "acos")
    q = _ops.sqrt(_ops.divide(_ops.subtract(1.0, x), _ops.add(x, 1.0)))
    return _ops.multiply(_atan_abs(q), 2.0, name=name)


def atan2(y: BlobOrScalar, x: BlobOrScalar, name: Optional[str] = None) -> Blob:
    """The angle of the point (x, y): atan(y/x), moved by pi for x < 0; +-pi/2
    on the y axis and 0 at the origin.

    Example:
        >>> @flow.global_function()
        ... def job(y: tp.Numpy.Placeholder((3,)), x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.atan2(y, x)
        >>> job(np.float32([1, 1, -1]), np.float32([1, -1, -1])).astype(float).round(3).tolist()
        [0.785, 2.356, -2.356]
    """
    y, x = _ops._lift_pair(y, x, "atan2")
    floating(y, "atan2", "y")
    floating(x, "atan2", "x")
    x0 = _ops.equal(x, 0.0)
    q = atan(_ops.divide(y, _ops.where(x0, _const(x, 1.0), x)))
    half = _ops.multiply(_ops.sign(y), _pymath.pi / 2)
    left = _ops.where(_ops.less(y, 0.0), _ops.subtract(q, _pymath.pi), _ops.add(q, _pymath.pi))
    return _ops.where(_ops.greater(x, 0.0), q, _ops.where(x0, half, left), name=name)


# ---------------------------------------------------------------- integer-style division

def floordiv(x: BlobOrScalar, y: BlobOrScalar, name: Optional[str] = None) -> Blob:
    """The largest integer <= x / y (numpy's floor_divide); integer division by
    zero gives 0.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.floordiv(x, y)
        >>> job(np.float32([7, -7, 7.5]), np.float32([2, 2, -2])).tolist()
        [3.0, -4.0, -4.0]
    """
    x, y = _ops._lift_pair(x, y, "floordiv")
    _same_numeric(x, y, "floordiv")
    if x.dtype in _FLOATS:
        return _ops.floor(_ops.divide(x, y), name=name)
    q = _ops.divide(x, y)  # truncates toward zero
    r = _ops.subtract(x, _ops.multiply(q, y))
    return _ops.where(_wrong_sign(r, y), _ops.subtract(q, 1), q, name=name)


def mod(x: BlobOrScalar, y: BlobOrScalar, name: Optional[str] = None) -> Blob:
    """x - floordiv(x, y) * y: the remainder with the sign of y (numpy's mod,
    Python's %); integer mod by zero gives 0. Float results are exact for
    integers below 2^24 (float32) and within |x| * eps otherwise.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.mod(x, y)
        >>> job(np.float32([7, -7, 7.5]), np.float32([2, 2, -2])).tolist()
        [1.0, 1.0, -0.5]
    """
    x, y = _ops._lift_pair(x, y, "mod")
    _same_numeric(x, y, "mod")
    if x.dtype in _FLOATS:
        r = _ops.subtract(x, _ops.multiply(_ops.floor(_ops.divide(x, y)), y))
        return _ops.where(_wrong_sign(r, y), _ops.add(r, y), r, name=name)
    r = _ops.subtract(x, _ops.multiply(_ops.divide(x, y), y))
    r = _ops.where(_wrong_sign(r, y), _ops.add(r, y), r)
    return _ops.where(_ops.equal(y, 0), _ops.zeros_like(r), r, name=name)


def _same_numeric(x, y, api):
    for what, v in (("x", x), ("y", y)):
        if v.dtype not in _FLOATS + _INTS:
            _trace.fail(TypeError, f"{api}: {what} must be a numeric blob, got {v.dtype.name}")
    if x.dtype is not y.dtype:
        _trace.fail(TypeError, f"{api}: x and y must have the same dtype, got {x.dtype.name} and "
                    f"{y.dtype.name}")


def _wrong_sign(r, y):
    """r != 0 and its sign differs from y's."""
    zero = _const(r, 0)
    return _ops.logical_and(_ops.not_equal(r, zero),
                            _ops.not_equal(_ops.less(r, zero), _ops.less(y, zero)))


# ---------------------------------------------------------------- clipping, masks, sums

def clip_by_value(values: Blob, min_value: Optional[float] = None, max_value: Optional[float] = None,
                  name: Optional[str] = None) -> Blob:
    """min(max(values, min_value), max_value); either bound may be None.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.clip_by_value(x, min_value=0, max_value=2)
        >>> job(np.float32([-1, 0.5, 2, 3])).tolist()
        [0.0, 0.5, 2.0, 2.0]
    """
    api = "clip_by_value"
    blob(values, api, "values")
    if min_value is None and max_value is None:
        _trace.fail(ValueError, f"{api}: min_value and max_value cannot both be None")
    lo = None if min_value is None else number(min_value, api, "min_value")
    hi = None if max_value is None else number(max_value, api, "max_value")
    if lo is not None and hi is not None and lo > hi:
        _trace.fail(ValueError, f"{api}: min_value {min_value} is greater than max_value {max_value}")
    out = values
    if lo is not None:
        out = _ops.maximum(out, _int_if(min_value, values), name=name if hi is None else None)
    if hi is not None:
        out = _ops.minimum(out, _int_if(max_value, values), name=name)
    return out


def _int_if(v, x):
    """An int bound stays an int for integer blobs (exact), else a float."""
    return int(v) if x.dtype in _INTS and float(v).is_integer() else float(v)


def clamp(input: Blob, min: Optional[float] = None, max: Optional[float] = None,  # noqa: A002 - OneFlow's names
          name: Optional[str] = None) -> Blob:
    """clip_by_value under PyTorch's argument names.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.clamp(x, min=0)
        >>> job(np.float32([-1, 0.5, 2, 3])).tolist()
        [0.0, 0.5, 2.0, 3.0]
    """
    return clip_by_value(input, min, max, name=name)


def masked_fill(x: Blob, mask: Blob, value: float, name: Optional[str] = None) -> Blob:
    """x with `value` where mask is true (nonzero). x and mask broadcast
    against each other (numpy rules), so the result has their common shape,
    as in OneFlow (where(mask, value, x)).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2)), mask: tp.Numpy.Placeholder((2,), dtype=flow.int8)) -> tp.Numpy:
        ...     return flow.masked_fill(x, mask, -1)
        >>> job(np.float32([[1, 2], [3, 4]]), np.int8([0, 1])).tolist()
        [[1.0, -1.0], [3.0, -1.0]]
    """
    blob(x, "masked_fill", "x")
    blob(mask, "masked_fill", "mask")
    v = number(value, "masked_fill", "value")
    fill = _ops._scalar(value if x.dtype in _INTS and v.is_integer() else v, x.dtype, "masked_fill")
    return _ops.where(mask, fill, x, name=name)


def _triangle(x, diagonal, fill_value, api, lower):
    blob(x, api, "x")
    if len(x.shape) < 2:
        _trace.fail(ValueError, f"{api}: x must have rank >= 2 (the last two axes are the matrix), "
                    f"got shape {tuple(x.shape)}")
    if not isinstance(diagonal, numbers.Integral) or isinstance(diagonal, bool):
        _trace.fail(TypeError, f"{api}: diagonal must be an int, got {diagonal!r}")
    v = number(fill_value, api, "fill_value")
    rows, cols = x.shape[-2], x.shape[-1]
    i = _ops.make(_ops.K.iota, [], {"shape": [rows, cols], "dtype": _dtypes.int64.c, "axis": 0},
                  api=api)
    j = _ops.make(_ops.K.iota, [], {"shape": [rows, cols], "dtype": _dtypes.int64.c, "axis": 1},
                  api=api)
    k = _ops.subtract(j, i)  # the diagonal each element lies on
    keep = _ops.less_equal(k, int(diagonal)) if lower else _ops.greater_equal(k, int(diagonal))
    fill = _ops._scalar(fill_value if x.dtype in _INTS and v.is_integer() else v, x.dtype, api)
    return _ops.where(keep, x, fill)


def tril(x: Blob, diagonal: int = 0, fill_value: float = 0, name: Optional[str] = None) -> Blob:
    """x with the elements above the `diagonal`-th diagonal of its last two axes
    set to fill_value (diagonal > 0: above the main diagonal).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3, 3))) -> tp.Numpy:
        ...     return flow.math.tril(x)
        >>> job(np.ones((3, 3), np.float32)).tolist()
        [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    """
    return _ops.identity(_triangle(x, diagonal, fill_value, "tril", True), name=name)


def triu(x: Blob, diagonal: int = 0, fill_value: float = 0, name: Optional[str] = None) -> Blob:
    """x with the elements below the `diagonal`-th diagonal set to fill_value.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3, 3))) -> tp.Numpy:
        ...     return flow.math.triu(x, diagonal=1)
        >>> job(np.ones((3, 3), np.float32)).tolist()
        [[0.0, 1.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    """
    return _ops.identity(_triangle(x, diagonal, fill_value, "triu", False), name=name)


def add_n(inputs: Sequence[Blob], name: Optional[str] = None) -> Blob:
    """The elementwise sum of a list of blobs of one shape and dtype.

    Example:
        >>> @flow.global_function()
        ... def job(a: tp.Numpy.Placeholder((2,)), b: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.math.add_n([a, b, a])
        >>> job(np.float32([1, 2]), np.float32([10, 20])).tolist()
        [12.0, 24.0]
    """
    if not isinstance(inputs, (list, tuple)) or not inputs:
        _trace.fail(TypeError, f"add_n: inputs must be a non-empty list of Blobs, got {inputs!r}")
    for i, x in enumerate(inputs):
        blob(x, "add_n", f"inputs[{i}]")
        if tuple(x.shape) != tuple(inputs[0].shape) or x.dtype is not inputs[0].dtype:
            _trace.fail(ValueError, f"add_n: inputs[{i}] is {x.dtype.name}{list(x.shape)} but "
                        f"inputs[0] is {inputs[0].dtype.name}{list(inputs[0].shape)}; all must match")
    if len(inputs) == 1:
        return _ops.identity(inputs[0], name=name)
    out = inputs[0]
    for k, x in enumerate(inputs[1:]):
        out = _ops.add(out, x, name=name if k == len(inputs) - 2 else None)
    return out


# ---------------------------------------------------------------- reductions

def _bool_reduce(x, axis, keepdims, api, op):
    blob(x, api, "input_tensor")
    ax = axes(x, axis, api)
    t = _ops.cast(_ops._truth(x, api), _dtypes.int32)
    return _ops.not_equal(op(t, ax, keepdims), 0)


def reduce_any(input_tensor: Blob, axis: Axis = None, keepdims: bool = False,
               name: Optional[str] = None) -> Blob:
    """True where any element along `axis` is true (nonzero); a bool blob.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.reduce_any(x, axis=1)
        >>> job(np.float32([[0, 1], [0, 0]])).tolist()
        [True, False]
    """
    r = _bool_reduce(input_tensor, axis, keepdims, "reduce_any", _ops.reduce_max)
    return r if name is None else _ops.identity(r, name=name)


def reduce_all(input_tensor: Blob, axis: Axis = None, keepdims: bool = False,
               name: Optional[str] = None) -> Blob:
    """True where every element along `axis` is true (nonzero); a bool blob.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.reduce_all(x, axis=1)
        >>> job(np.float32([[2, 1], [0, 1]])).tolist()
        [True, False]
    """
    r = _bool_reduce(input_tensor, axis, keepdims, "reduce_all", _ops.reduce_min)
    return r if name is None else _ops.identity(r, name=name)


def _count(x, ax):
    n = 1
    for a in ax:
        n *= x.shape[a]
    return n


def reduce_logsumexp(input_tensor: Blob, axis: Axis = None, keepdims: bool = False,
                     name: Optional[str] = None) -> Blob:
    """log(sum(exp(x))) along `axis`, shifted by the max so it does not overflow.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.reduce_logsumexp(x, axis=1)
        >>> job(np.float32([[0, 0], [1000, 1000]])).astype(float).round(3).tolist()
        [0.693, 1000.693]
    """
    x = floating(input_tensor, "reduce_logsumexp", "input_tensor")
    ax = axes(x, axis, "reduce_logsumexp")
    m = _ops.reduce_max(x, ax, keepdims=True)
    m = _ops.where(_ops.less(_ops.abs(m), float("inf")), m, _const(m, 0.0))  # all -inf: shift 0
    s = _ops.reduce_sum(_ops.exp(_ops.subtract(x, m)), ax, keepdims=keepdims)
    if not keepdims:
        m = _ops.reshape(m, list(s.shape))
    return _ops.add(_ops.log(s), m, name=name)


def reduce_variance(input_tensor: Blob, axis: Axis = None, keepdims: bool = False,
                    name: Optional[str] = None) -> Blob:
    """The mean squared deviation from the mean along `axis` (numpy's var, ddof=0).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.reduce_variance(x, axis=1)
        >>> job(np.float32([[1, 3], [2, 2]])).tolist()
        [1.0, 0.0]
    """
    x = floating(input_tensor, "reduce_variance", "input_tensor")
    ax = axes(x, axis, "reduce_variance")
    d = _ops.subtract(x, _ops.reduce_mean(x, ax, keepdims=True))
    return _ops.reduce_mean(_ops.square(d), ax, keepdims=keepdims, name=name)


def reduce_std(input_tensor: Blob, axis: Axis = None, keepdims: bool = False,
               name: Optional[str] = None) -> Blob:
    """sqrt(reduce_variance) along `axis`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.math.reduce_std(x)
        >>> job(np.float32([1, 3, 1, 3])).tolist()
        [1.0]
    """
    floating(input_tensor, "reduce_std", "input_tensor")
    axes(input_tensor, axis, "reduce_std")
    return _ops.sqrt(reduce_variance(input_tensor, axis, keepdims), name=name)


def moments(x: Blob, axes: Sequence[int], keepdims: bool = False,  # noqa: F811 - OneFlow's argument name
            name: Optional[str] = None) -> Tuple[Blob, Blob]:
    """(mean, variance) of x along `axes`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     mean, variance = flow.nn.moments(x, axes=[0])
        ...     return flow.concat([mean, variance], axis=0)
        >>> job(np.float32([[1, 2], [3, 6]])).tolist()
        [2.0, 4.0, 1.0, 4.0]
    """
    floating(x, "moments")
    if axes is None:
        _trace.fail(TypeError, "moments: axes must be an int or a list of ints, got None")
    ax = _axes_of(x, axes, "moments")
    return (_ops.reduce_mean(x, ax, keepdims=keepdims),
            reduce_variance(x, ax, keepdims=keepdims))


_axes_of = axes


def l2_normalize(input: Blob, axis: Optional[int] = None, epsilon: float = 1e-12,  # noqa: A002
                 name: Optional[str] = None) -> Blob:
    """x / sqrt(max(sum(x^2 along axis), epsilon)) (all axes when None).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.math.l2_normalize(x)
        >>> job(np.float32([3, 4])).astype(float).round(3).tolist()
        [0.6, 0.8]
    """
    x = floating(input, "l2_normalize", "input")
    ax = axes(x, axis, "l2_normalize")
    eps = number(epsilon, "l2_normalize", "epsilon")
    ss = _ops.reduce_sum(_ops.square(x), ax, keepdims=True)
    return _ops.multiply(x, _ops.rsqrt(_ops.maximum(ss, eps)), name=name)


# ---------------------------------------------------------------- more of OneFlow's flow.math

def xdivy(x: BlobOrScalar, y: BlobOrScalar, name: Optional[str] = None) -> Blob:
    """x / y, and 0 where x == 0 (even where y is 0).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.xdivy(x, y)
        >>> job(np.float32([0, 2, 3]), np.float32([0, 4, 2])).tolist()
        [0.0, 0.5, 1.5]
    """
    return _zero_where_x_is_zero(x, y, _ops.divide, "xdivy", name)


def reciprocal_no_nan(x: Blob, name: Optional[str] = None) -> Blob:
    """1 / x, and 0 where x == 0.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.reciprocal_no_nan(x)
        >>> job(np.float32([0, 2, -4])).tolist()
        [0.0, 0.5, -0.25]
    """
    floating(x, "reciprocal_no_nan")
    zero = _ops.equal(x, 0.0)
    return _ops.where(zero, _const(x, 0.0), _ops.reciprocal(_ops.where(zero, _const(x, 1.0), x)), name=name)


def rint(x: Blob, name: Optional[str] = None) -> Blob:
    """x rounded to the nearest integer, halves to even (numpy.rint).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.rint(x)
        >>> job(np.float32([-1.5, 0.5, 2.5])).tolist()
        [-2.0, 0.0, 2.0]
    """
    floating(x, "rint")
    return _ops.round(x, name=name)


def polyval(coeffs: Sequence[float], x: Blob, name: Optional[str] = None) -> Blob:
    """coeffs[0] * x^(n-1) + ... + coeffs[n-1], by Horner's rule (numpy.polyval);
    zeros for an empty coeffs.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.polyval([1, 0, -1], x)   # x^2 - 1
        >>> job(np.float32([0, 1, 3])).tolist()
        [-1.0, 0.0, 8.0]
    """
    blob(x, "polyval")
    if not isinstance(coeffs, (list, tuple)):
        _trace.fail(TypeError, f"polyval: coeffs must be a list or tuple of numbers, got {type(coeffs).__name__}")
    cs = [number(c, "polyval", f"coeffs[{i}]") for i, c in enumerate(coeffs)]
    if not cs:
        return _ops.zeros_like(x, name=name)
    p = _ops.add(_ops.zeros_like(x), cs[0], name=name if len(cs) == 1 else None)
    for i, c in enumerate(cs[1:], 1):
        p = _ops.add(_ops.multiply(p, x), c, name=name if i == len(cs) - 1 else None)
    return p


def reduce_euclidean_norm(input_tensor: Blob, axis: Axis = None, keepdims: bool = False,
                          name: Optional[str] = None) -> Blob:
    """sqrt(sum(x^2)) along `axis` (all axes when None).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.reduce_euclidean_norm(x, axis=1)
        >>> job(np.float32([[3, 4], [0, 2]])).astype(float).round(3).tolist()
        [5.0, 2.0]
    """
    x = floating(input_tensor, "reduce_euclidean_norm", "input_tensor")
    ax = axes(x, axis, "reduce_euclidean_norm")
    return _ops.sqrt(_ops.reduce_sum(_ops.square(x), ax, keepdims=keepdims), name=name)


def two_stage_reduce_max(x: Blob, axis: Axis = None, keepdims: bool = False,
                         name: Optional[str] = None) -> Blob:
    """reduce_max (OneFlow splits it in two stages across devices; flowjit's
    distribution pass does that itself).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.two_stage_reduce_max(x, axis=0)
        >>> job(np.float32([[1, 5], [3, 2]])).tolist()
        [3.0, 5.0]
    """
    blob(x, "two_stage_reduce_max")
    return _ops.reduce_max(x, axes(x, axis, "two_stage_reduce_max"), keepdims, name=name)


def two_stage_reduce_min(x: Blob, axis: Axis = None, keepdims: bool = False,
                         name: Optional[str] = None) -> Blob:
    """reduce_min (OneFlow splits it in two stages across devices; flowjit's
    distribution pass does that itself).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.two_stage_reduce_min(x, axis=0)
        >>> job(np.float32([[1, 5], [3, 2]])).tolist()
        [1.0, 2.0]
    """
    blob(x, "two_stage_reduce_min")
    return _ops.reduce_min(x, axes(x, axis, "two_stage_reduce_min"), keepdims, name=name)


def sigmoid_v2(x: Blob, name: Optional[str] = None) -> Blob:
    """1 / (1 + exp(-x)), the same function as flow.math.sigmoid.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.sigmoid_v2(x)
        >>> job(np.float32([-1, 0, 2])).astype(float).round(3).tolist()
        [0.269, 0.5, 0.881]
    """
    return _ops.sigmoid(blob(x, "sigmoid_v2"), name=name)


def tanh_v2(x: Blob, name: Optional[str] = None) -> Blob:
    """The hyperbolic tangent, the same function as flow.math.tanh.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.tanh_v2(x)
        >>> job(np.float32([-1, 0, 2])).astype(float).round(3).tolist()
        [-0.762, 0.0, 0.964]
    """
    return _ops.tanh(blob(x, "tanh_v2"), name=name)


def sigmoid_grad(y: Blob, dy: Blob, name: Optional[str] = None) -> Blob:
    """The gradient through a sigmoid from its output y: dy * y * (1 - y).

    Example:
        >>> @flow.global_function()
        ... def job(y: tp.Numpy.Placeholder((2,)), dy: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.math.sigmoid_grad(y, dy)   # dy * y * (1 - y)
        >>> job(np.float32([0.5, 0.25]), np.float32([1, 2])).tolist()
        [0.25, 0.375]
    """
    floating(y, "sigmoid_grad", "y")
    floating(dy, "sigmoid_grad", "dy")
    return _ops.multiply(dy, _ops.multiply(y, _ops.subtract(1.0, y)), name=name)


_INV_SQRT2 = 1.0 / _pymath.sqrt(2.0)
_INV_SQRT2PI = 1.0 / _pymath.sqrt(2.0 * _pymath.pi)


def gelu_grad(x: Blob, dy: Blob, name: Optional[str] = None) -> Blob:
    """The gradient through gelu(x) = x Phi(x): dy * (Phi(x) + x phi(x)),
    Phi and phi the standard normal CDF and density.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), dy: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.gelu_grad(x, dy)
        >>> job(np.float32([-1, 0, 1]), np.ones(3, np.float32)).astype(float).round(3).tolist()
        [-0.083, 0.5, 1.083]
    """
    floating(x, "gelu_grad", "x")
    floating(dy, "gelu_grad", "dy")
    cdf = _ops.multiply(_ops.add(_ops.erf(_ops.multiply(x, _INV_SQRT2)), 1.0), 0.5)
    pdf = _ops.multiply(_ops.exp(_ops.multiply(_ops.square(x), -0.5)), _INV_SQRT2PI)
    return _ops.multiply(dy, _ops.add(cdf, _ops.multiply(x, pdf)), name=name)


# Stirling's series for log Gamma(y), y >= 15, whose next term is below 4e-18.
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
_HALF_LOG_2PI = 0.5 * _pymath.log(2.0 * _pymath.pi)
_SHIFT = 15


def _stirling(y):
    """log Gamma(y) for y >= 15."""
    head = _ops.add(_ops.subtract(_ops.multiply(_ops.subtract(y, 0.5), _ops.log(y)), y), _HALF_LOG_2PI)
    z = _ops.reciprocal(y)
    z2 = _ops.square(z)
    series = _const(y, _STIRLING[-1])
    for c in reversed(_STIRLING[:-1]):
        series = _ops.add(_ops.multiply(series, z2), c)
    return _ops.add(head, _ops.multiply(series, z))


def _lgamma_right(x):
    """log Gamma(x) for x >= 0.5: Stirling at x, or below 15 at x + 15 less
    log(x (x + 1) ... (x + 14)) (Gamma(x + n) = Gamma(x) x ... (x + n - 1))."""
    small = _ops.less(x, float(_SHIFT))
    xs = _ops.where(small, x, _const(x, 1.0))
    prod = xs
    for k in range(1, _SHIFT):
        prod = _ops.multiply(prod, _ops.add(xs, float(k)))
    near = _ops.subtract(_stirling(_ops.add(xs, float(_SHIFT))), _ops.log(prod))
    far = _stirling(_ops.maximum(x, float(_SHIFT)))
    return _ops.where(small, near, far)


def lgamma(x: Blob, name: Optional[str] = None) -> Blob:
    """log |Gamma(x)|: Stirling's series (shifted up past 15) for x >= 0.5,
    the reflection log(pi / |sin(pi x)|) - lgamma(1 - x) below; inf at 0 and
    the negative integers.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.lgamma(x)
        >>> job(np.float32([0.5, 3, 10])).astype(float).round(3).tolist()
        [0.572, 0.693, 12.802]
    """
    floating(x, "lgamma")
    left = _ops.less(x, 0.5)
    lg = _lgamma_right(_ops.where(left, _ops.subtract(1.0, x), x))   # >= 0.5 on both branches
    s = _ops.abs(_ops.sin(_ops.multiply(_ops.where(left, x, _const(x, 0.25)), _pymath.pi)))
    refl = _ops.subtract(_ops.subtract(_pymath.log(_pymath.pi), _ops.log(s)), lg)
    pole = _ops.logical_and(left, _ops.equal(_ops.floor(x), x))  # sin(pi x) rounds to ~1e-16 there
    return _ops.where(pole, _const(x, float("inf")), _ops.where(left, refl, lg), name=name)
