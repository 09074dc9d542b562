"""The op surface: thin builders of IR nodes, with OneFlow's signatures.

Every function checks its Python arguments, then asks the C++ factory for a
node; shape and dtype errors come back naming the op and the user's line.
"""
import numbers
from typing import Optional, Sequence, Union

import numpy as np

from .. import _C
from .._core import dtypes as _dtypes, trace as _trace
from .._core.blob import Blob
from .._core.dtypes import DTypeLike

#: A Blob or a Python number (which takes the Blob operand's dtype).
BlobOrScalar = Union[Blob, float, int, bool]
#: An axis argument: one axis, several, or None for all.
Axis = Union[int, Sequence[int], None]

K = _C.OpKind


def make(op, inputs, attrs=None, name=None, api=None):
    """Appends one node to the job being traced and returns its Blob."""
    api = api or op.name
    b = _trace.require_builder(f"flow.{api}")
    loc = _trace.user_location()
    for i, x in enumerate(inputs):
        if not isinstance(x, Blob):
            _trace.fail(TypeError, f"{api}: operand {i} must be a Blob, got {type(x).__name__}", loc)
        b.check_owned(x, api, loc)
    try:
        node = _C.make_node(op, [x._node for x in inputs], attrs or {}, loc[0], loc[1])
    except (TypeError, ValueError, NotImplementedError) as e:
        _trace.fail(type(e), str(e), loc)
    return b.new_blob(node, name, api)


def _scalar(value, dtype, api):
    """A rank-0 constant of `dtype` holding a Python or numpy scalar."""
    if isinstance(value, (bool, np.bool_)):
        v = 1.0 if value else 0.0
    elif isinstance(value, numbers.Number):
        v = float(value)
    else:
        _trace.fail(TypeError, f"{api}: expected a Blob or a Python number, got {type(value).__name__}"
                    + (" (numpy arrays must be passed to the job as placeholders)"
                       if isinstance(value, np.ndarray) else ""))
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and \
            dtype in (_dtypes.int8, _dtypes.uint8, _dtypes.int32, _dtypes.int64):
        info = np.iinfo(dtype.np)
        if not info.min <= int(value) <= info.max:
            # As numpy (NEP 50): the Python integer does not fit the blob's dtype;
            # wrapping it would compute with another number.
            _trace.fail(OverflowError, f"{api}: Python integer {int(value)} is out of bounds for "
                        f"{dtype!r} (range {info.min}..{info.max}); cast the blob first")
    return make(K.fill, [], {"value": _fill_value(v if not isinstance(value, numbers.Integral)
                                                  or isinstance(value, bool) else value, dtype),
                             "shape": [], "dtype": dtype.c}, api=api)


def _fill_value(value, dtype):
    """The fill attribute: an exact int for integer dtypes, else a float."""
    if dtype in (_dtypes.int8, _dtypes.uint8, _dtypes.int32, _dtypes.int64) and \
            isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return float(value)


def _lift_pair(x, y, api):
    """Blob-or-scalar operands to two Blobs; a scalar takes the Blob's dtype."""
    if isinstance(x, Blob) and isinstance(y, Blob):
        return x, y
    if isinstance(x, Blob):
        return x, _scalar(y, x.dtype, api)
    if isinstance(y, Blob):
        return _scalar(x, y.dtype, api), y
    _trace.fail(TypeError, f"{api}: at least one operand must be a Blob, got "
                f"{type(x).__name__} and {type(y).__name__}")


def _named(f, api, doc):
    """Gives a generated op function its public name and docstring, so
    help(), repr() and the API reference show ``exp(x, name=None)``, not the
    factory's inner function."""
    f.__name__ = api
    f.__qualname__ = api
    f.__doc__ = doc
    return f


# What each elementwise op computes (its docstring's first line).
_UNARY_DOCS = {
    "exp": "e raised to the power x", "log": "the natural logarithm of x",
    "sqrt": "the square root of x", "rsqrt": "1 / sqrt(x)", "square": "x * x",
    "abs": "the absolute value of x", "negative": "-x", "tanh": "the hyperbolic tangent of x",
    "sigmoid": "the logistic function 1 / (1 + exp(-x))", "relu": "max(x, 0)",
    "sign": "-1, 0 or 1 as x is negative, zero or positive", "floor": "the largest integer <= x",
    "ceil": "the smallest integer >= x", "round": "x rounded to the nearest integer, halves to even",
    "reciprocal": "1 / x", "sin": "the sine of x (radians)", "cos": "the cosine of x (radians)",
    "erf": "the error function of x", "erfc": "the complementary error function 1 - erf(x)",
}
_BINARY_DOCS = {
    "add": "x + y", "subtract": "x - y", "multiply": "x * y", "divide": "x / y",
    "pow": "x raised to the power y", "maximum": "the larger of x and y",
    "minimum": "the smaller of x and y", "equal": "x == y (a bool blob)",
    "not_equal": "x != y (a bool blob)", "less": "x < y (a bool blob)",
    "less_equal": "x <= y (a bool blob)", "greater": "x > y (a bool blob)",
    "greater_equal": "x >= y (a bool blob)",
}


# Each elementwise op's docstring example: an input, and what it prints
# (rounded to 3 decimals where the result is not exact).
_UNARY_EXAMPLES = {
    "exp": ("[0, 1, 2]", "[1.0, 2.718, 7.389]"), "log": ("[1, 2, 10]", "[0.0, 0.693, 2.303]"),
    "sqrt": ("[0, 2, 9]", "[0.0, 1.414, 3.0]"), "rsqrt": ("[1, 2, 4]", "[1.0, 0.707, 0.5]"),
    "square": ("[-2, 0.5, 3]", "[4.0, 0.25, 9.0]"), "abs": ("[-2, 0.5, 3]", "[2.0, 0.5, 3.0]"),
    "negative": ("[-2, 0.5, 3]", "[2.0, -0.5, -3.0]"), "tanh": ("[-1, 0, 2]", "[-0.762, 0.0, 0.964]"),
    "sigmoid": ("[-1, 0, 2]", "[0.269, 0.5, 0.881]"), "relu": ("[-2, 0.5, 3]", "[0.0, 0.5, 3.0]"),
    "sign": ("[-2, 0, 3]", "[-1.0, 0.0, 1.0]"), "floor": ("[-1.5, 0.5, 2.7]", "[-2.0, 0.0, 2.0]"),
    "ceil": ("[-1.5, 0.5, 2.7]", "[-1.0, 1.0, 3.0]"), "round": ("[-1.5, 0.5, 2.7]", "[-2.0, 0.0, 3.0]"),
    "reciprocal": ("[-2, 0.5, 4]", "[-0.5, 2.0, 0.25]"), "sin": ("[0, 1, 3]", "[0.0, 0.841, 0.141]"),
    "cos": ("[0, 1, 3]", "[1.0, 0.54, -0.99]"), "erf": ("[-1, 0, 0.5]", "[-0.843, 0.0, 0.52]"),
    "erfc": ("[-1, 0, 0.5]", "[1.843, 1.0, 0.48]"),
}

# The ops whose example rounds (the others' results are exact).
_INEXACT = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "erf", "erfc"}


def _example(module, api, shapes, args, call, result, rounded):
    """An ``Example:`` section: a predict job applying ``flow.<module>.<api>``
    to placeholders of `shapes`, called on `args`, and what it prints."""
    params = ", ".join(f"{n}: tp.Numpy.Placeholder({s})" for n, s in shapes)
    return (f"\n\nExample:\n    >>> @flow.global_function()\n    ... def job({params}) -> tp.Numpy:\n"
            f"    ...     return flow.{module}.{api}({call})\n"
            f"    >>> job({args}){'.astype(float).round(3)' if rounded else ''}.tolist()\n    {result}")


def _unary(op, api):
    def f(x: Blob, name: Optional[str] = None) -> Blob:
        return make(op, [x], name=name, api=api)
    x, out = _UNARY_EXAMPLES[api]
    return _named(f, api, f"Elementwise {_UNARY_DOCS[api]}.\n\n"
                  f"x is a Blob; `name` names the result (default: generated)."
                  + _example("math", api, [("x", "(3,)")], f"np.float32({x})", "x", out,
                             api in _INEXACT))


# What each binary op's example prints for x = [1, 2, 3] and y = [2, 2, 2].
_BINARY_EXAMPLES = {
    "add": "[3.0, 4.0, 5.0]", "subtract": "[-1.0, 0.0, 1.0]", "multiply": "[2.0, 4.0, 6.0]",
    "divide": "[0.5, 1.0, 1.5]", "pow": "[1.0, 4.0, 9.0]", "maximum": "[2.0, 2.0, 3.0]",
    "minimum": "[1.0, 2.0, 2.0]", "equal": "[False, True, False]", "not_equal": "[True, False, True]",
    "less": "[True, False, False]", "less_equal": "[True, True, False]",
    "greater": "[False, False, True]", "greater_equal": "[False, True, True]",
}


def _binary(op, api):
    def f(x: BlobOrScalar, y: BlobOrScalar, name: Optional[str] = None) -> Blob:
        a, b = _lift_pair(x, y, api)
        return make(op, [a, b], name=name, api=api)
    return _named(f, api, f"Elementwise {_BINARY_DOCS[api]}, with numpy broadcasting.\n\n"
                  "One of x and y may be a Python number; it takes the other operand's dtype."
                  + _example("math", api, [("x", "(3,)"), ("y", "(3,)")],
                             "np.float32([1, 2, 3]), np.float32([2, 2, 2])", "x, y",
                             _BINARY_EXAMPLES[api], api == "pow"))


exp = _unary(K.exp, "exp")
log = _unary(K.log, "log")
sqrt = _unary(K.sqrt, "sqrt")
rsqrt = _unary(K.rsqrt, "rsqrt")
square = _unary(K.square, "square")
abs = _unary(K.abs, "abs")  # noqa: A001 - OneFlow's name
negative = _unary(K.neg, "negative")
tanh = _unary(K.tanh, "tanh")
sigmoid = _unary(K.sigmoid, "sigmoid")
relu = _unary(K.relu, "relu")
sign = _unary(K.sign, "sign")
floor = _unary(K.floor, "floor")
ceil = _unary(K.ceil, "ceil")
round = _unary(K.round, "round")  # noqa: A001
reciprocal = _unary(K.reciprocal, "reciprocal")
sin = _unary(K.sin, "sin")
cos = _unary(K.cos, "cos")
erf = _unary(K.erf, "erf")
erfc = _unary(K.erfc, "erfc")


def _truth(x, api):
    """x as a bool Blob: numbers are tested against zero (numpy's logical_* rule)."""
    if isinstance(x, Blob) and x.dtype is not _dtypes.bool_:
        return make(K.not_equal, [x, _scalar(0, x.dtype, api)], api=api)
    return x


def logical_not(x: Blob, name: Optional[str] = None) -> Blob:
    """Elementwise not; a numeric x counts as true where it is nonzero.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.logical_not(x)
        >>> job(np.float32([0, 1, -2])).tolist()
        [True, False, False]
    """
    return make(K.logical_not, [_truth(x, "logical_not")], name=name, api="logical_not")

add = _binary(K.add, "add")
subtract = _binary(K.sub, "subtract")
multiply = _binary(K.mul, "multiply")
divide = _binary(K.div, "divide")
pow = _binary(K.pow, "pow")  # noqa: A001
maximum = _binary(K.maximum, "maximum")
minimum = _binary(K.minimum, "minimum")
equal = _binary(K.equal, "equal")
not_equal = _binary(K.not_equal, "not_equal")
less = _binary(K.less, "less")
less_equal = _binary(K.less_equal, "less_equal")
greater = _binary(K.greater, "greater")
greater_equal = _binary(K.greater_equal, "greater_equal")


def _logical(op, api):
    def f(x: BlobOrScalar, y: BlobOrScalar, name: Optional[str] = None) -> Blob:
        a, b = _lift_pair(_truth(x, api), _truth(y, api), api)
        return make(op, [a, b], name=name, api=api)
    return _named(f, api, f"Elementwise {api.replace('logical_', 'logical ')} of x and y (a bool "
                  "blob); numbers count as true where nonzero."
                  + _example("math", api, [("x", "(3,)"), ("y", "(3,)")],
                             "np.float32([0, 1, 2]), np.float32([0, 0, 3])", "x, y",
                             {"logical_and": "[False, False, True]",
                              "logical_or": "[False, True, True]"}[api], False))


logical_and = _logical(K.logical_and, "logical_and")
logical_or = _logical(K.logical_or, "logical_or")


def identity(x: Blob, name: Optional[str] = None) -> Blob:
    """A copy of x (a new value the job can return).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.identity(x)
        >>> job(np.float32([1, 2])).tolist()
        [1.0, 2.0]
    """
    return make(K.identity, [x], name=name, api="identity")


def _dtype(dtype, api):
    """dtype as a flow DType; a bad one fails naming the job and the user's line."""
    try:
        return _dtypes.to_dtype(dtype, api)
    except (TypeError, NotImplementedError) as e:
        _trace.fail(type(e), str(e))


def cast(x: Blob, dtype: DTypeLike, name: Optional[str] = None) -> Blob:
    """x converted to `dtype` (floats to ints truncate and saturate).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.cast(x, flow.int32)
        >>> job(np.float32([-1.7, 0.5, 2.9])).tolist()
        [-1, 0, 2]
    """
    d = _dtype(dtype, "cast")
    return make(K.cast, [x], {"dtype": d.c}, name=name, api="cast")


def where(condition: Blob, x: Optional[BlobOrScalar] = None, y: Optional[BlobOrScalar] = None,
          name: Optional[str] = None) -> Blob:
    """Elementwise choice: x where condition, else y (numpy broadcasting).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.where(x > 0, x, 0.5 * x)
        >>> job(np.float32([-2, 1, 3])).tolist()
        [-1.0, 1.0, 3.0]
    """
    if x is None or y is None:
        _trace.fail(NotImplementedError, "where: the one-argument form (indices of true elements) "
                    "has a data-dependent shape and is not supported; pass x and y")
    if not isinstance(condition, Blob):
        _trace.fail(TypeError, "where: condition must be a Blob")
    if condition.dtype is not _dtypes.bool_:
        condition = make(K.not_equal, [condition, _scalar(0, condition.dtype, "where")], api="where")
    if not isinstance(x, Blob) and not isinstance(y, Blob):
        # numpy's where(c, 1.0, 0.0): both branches are scalars of one dtype
        both_int = all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
                       for v in (x, y))
        x = _scalar(x, _dtypes.int32 if both_int else _default_dtype(), "where")
    a, b = _lift_pair(x, y, "where")
    return make(K.where, [condition, a, b], name=name, api="where")


# ---------------------------------------------------------------- reductions

def _axes(x, axis, api):
    if axis is None:
        return list(range(len(x.shape)))
    if isinstance(axis, numbers.Integral):
        return [int(axis)]
    if isinstance(axis, (list, tuple)) and all(isinstance(a, numbers.Integral) for a in axis):
        return [int(a) for a in axis]
    _trace.fail(TypeError, f"{api}: axis must be None, an int or a list of ints, got {axis!r}")


def _reduces_all(x, axes, keepdims):
    """Whether a reduction over `axes` leaves no axis of x: OneFlow gives such
    a result the shape (1,), not (), when keepdims is false."""
    r = len(x.shape) if isinstance(x, Blob) else 0
    return not keepdims and r > 0 and len({a % r for a in axes if -r <= a < r}) == r


def _reduce(op, api):
    def f(input_tensor: Blob, axis: Axis = None, keepdims: bool = False,
          name: Optional[str] = None) -> Blob:
        axes = _axes(input_tensor, axis, api)
        if _reduces_all(input_tensor, axes, keepdims):
            out = make(op, [input_tensor], {"axes": axes, "keepdims": False}, api=api)
            return reshape(out, [1], name=name)
        return make(op, [input_tensor], {"axes": axes, "keepdims": bool(keepdims)}, name=name, api=api)
    what = {"reduce_sum": "The sum", "reduce_max": "The largest element",
            "reduce_min": "The smallest element", "reduce_prod": "The product"}[api]
    return _named(f, api, f"{what} of input_tensor's elements over `axis` (an int or a list; "
                  "all axes when None).\n\nThe reduced axes are dropped unless keepdims, which "
                  "keeps them with extent 1; with every axis dropped the result has shape (1,), "
                  "as in OneFlow."
                  + _example("math", api, [("x", "(2, 3)")], "np.float32([[1, 2, 3], [4, 5, 6]])",
                             "x, axis=1", {"reduce_sum": "[6.0, 15.0]", "reduce_max": "[3.0, 6.0]",
                                           "reduce_min": "[1.0, 4.0]", "reduce_prod": "[6.0, 120.0]"}[api],
                             False))


reduce_sum = _reduce(K.reduce_sum, "reduce_sum")
reduce_max = _reduce(K.reduce_max, "reduce_max")
reduce_min = _reduce(K.reduce_min, "reduce_min")
reduce_prod = _reduce(K.reduce_prod, "reduce_prod")


def reduce_mean(input_tensor: Blob, axis: Axis = None, keepdims: bool = False, name: Optional[str] = None) -> Blob:
    """Mean over `axis` (all axes when None).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.math.reduce_mean(x, axis=0)
        >>> job(np.float32([[1, 2, 3], [3, 4, 5]])).tolist()
        [2.0, 3.0, 4.0]
    """
    x = input_tensor
    axes = _axes(x, axis, "reduce_mean")
    if x.dtype not in _dtypes.FLOATS:
        _trace.fail(TypeError, f"reduce_mean: expected a floating-point blob, got {x.dtype!r}")
    s = reduce_sum(x, axes, keepdims)
    n = 1
    for a in axes:
        n *= x.shape[a]
    return multiply(s, 1.0 / n if n else float("nan"), name=name)


def _arg_reduce(op, api, input, axis, dtype, name):
    d = _dtype(dtype or _dtypes.int32, api)
    ax = -1 if axis is None else axis
    if not _is_int(ax):
        _trace.fail(TypeError, f"{api}: axis must be an int, got {axis!r}")
    if isinstance(input, Blob) and len(input.shape) == 1:  # OneFlow: shape (1,), not ()
        out = make(op, [input], {"axes": [int(ax)], "keepdims": False, "dtype": d.c}, api=api)
        return reshape(out, [1], name=name)
    return make(op, [input], {"axes": [int(ax)], "keepdims": False, "dtype": d.c}, name=name, api=api)


def argmax(input: Blob, axis: Optional[int] = -1, dtype: Optional[DTypeLike] = None,
           name: Optional[str] = None) -> Blob:
    """Index of the largest element along `axis` (int32 unless dtype is given);
    a 1-D input gives shape (1,), as in OneFlow.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.math.argmax(x)   # along the last axis
        >>> job(np.float32([[1, 5, 3], [9, 4, 5]])).tolist()
        [1, 0]
    """
    return _arg_reduce(K.argmax, "argmax", input, axis, dtype, name)


def argmin(input: Blob, axis: Optional[int] = -1, dtype: Optional[DTypeLike] = None,
           name: Optional[str] = None) -> Blob:
    """Index of the smallest element along `axis` (int32 unless dtype is given);
    a 1-D input gives shape (1,), as in OneFlow.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.math.argmin(x, axis=1)
        >>> job(np.float32([[1, 5, 3], [9, 4, 5]])).tolist()
        [0, 1]
    """
    return _arg_reduce(K.argmin, "argmin", input, axis, dtype, name)


# ---------------------------------------------------------------- shapes

def _is_int(d):
    return isinstance(d, numbers.Integral) and not isinstance(d, (bool, np.bool_))


def _int_list(shape, api, what="shape"):
    if _is_int(shape):
        return [int(shape)]
    if isinstance(shape, (list, tuple)) and all(_is_int(d) for d in shape):
        return [int(d) for d in shape]
    _trace.fail(TypeError, f"{api}: {what} must be a list or tuple of ints, got {shape!r}")


def reshape(x: Blob, shape: Sequence[int], name: Optional[str] = None) -> Blob:
    """x with a new shape of the same size; one extent may be -1.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.reshape(x, [3, -1])
        >>> job(np.float32([[1, 2, 3], [4, 5, 6]])).tolist()
        [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    """
    return make(K.reshape, [x], {"shape": _int_list(shape, "reshape")}, name=name, api="reshape")


def transpose(a: Blob, perm: Optional[Sequence[int]] = None, conjugate: bool = False,
              batch_axis_non_change: bool = False, name: Optional[str] = None) -> Blob:
    """a with its axes permuted (reversed when perm is None).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.transpose(x, perm=[1, 0])
        >>> job(np.float32([[1, 2, 3], [4, 5, 6]])).tolist()
        [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
    """
    if conjugate:
        _trace.fail(NotImplementedError, "transpose: conjugate=True needs complex dtypes, which "
                    "flowjit does not have")
    if perm is None:
        perm = list(range(len(a.shape)))[::-1]
    return make(K.transpose, [a], {"perm": _int_list(perm, "transpose", "perm")}, name=name,
                api="transpose")


def expand_dims(input: Blob, axis: int, name: Optional[str] = None) -> Blob:
    """input with an extent-1 axis inserted at `axis`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.expand_dims(x, axis=1)
        >>> job(np.zeros((2, 3), np.float32)).shape
        (2, 1, 3)
    """
    shape = list(input.shape)
    r = len(shape) + 1
    if not _is_int(axis):
        _trace.fail(TypeError, f"expand_dims: axis must be an int, got {axis!r}")
    axis = int(axis)
    if not -r <= axis < r:
        _trace.fail(ValueError, f"expand_dims: axis {axis} is out of range for rank {len(shape)}")
    shape.insert(axis if axis >= 0 else axis + r, 1)
    return reshape(input, shape, name=name)


def squeeze(input: Blob, axis: Axis = None, name: Optional[str] = None) -> Blob:
    """input without extent-1 axes (only those in `axis` when given); when
    that would leave no axis the result has shape (1,), as in OneFlow.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 1, 3, 1))) -> tp.Numpy:
        ...     return flow.squeeze(x, axis=[1])
        >>> job(np.zeros((2, 1, 3, 1), np.float32)).shape
        (2, 3, 1)
    """
    shape = list(input.shape)
    r = len(shape)
    if axis is None:
        axes = range(r)
    else:
        axes = []
        for a in _int_list(axis, "squeeze", "axis"):
            if not -r <= a < r:
                _trace.fail(ValueError, f"squeeze: axis {a} is out of range for a rank-{r} input "
                            f"(expected {-r} <= axis < {r})")
            axes.append(a % r)
    for a in axes:
        if axis is not None and shape[a] != 1:
            _trace.fail(ValueError, f"squeeze: axis {a} has extent {shape[a]}, not 1")
    keep = [d for i, d in enumerate(shape) if not (i in axes and d == 1)]
    if not keep and shape:
        keep = [1]  # OneFlow keeps one axis when every axis is squeezed away
    return reshape(input, keep, name=name)


def broadcast_to(x: Blob, shape: Sequence[int], name: Optional[str] = None) -> Blob:
    """x broadcast (numpy rules) to `shape`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.broadcast_to(x, [2, 3])
        >>> job(np.float32([1, 2, 3])).tolist()
        [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    """
    return make(K.broadcast, [x], {"shape": _int_list(shape, "broadcast_to")}, name=name,
                api="broadcast_to")


def broadcast_like(x: Blob, like: Blob, broadcast_axes: Optional[Sequence[int]] = None,
                   name: Optional[str] = None) -> Blob:
    """x broadcast to the shape of `like`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2)), like: tp.Numpy.Placeholder((3, 2))) -> tp.Numpy:
        ...     return flow.broadcast_like(x, like)
        >>> job(np.float32([[1, 2]]), np.zeros((3, 2), np.float32)).tolist()
        [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]
    """
    return broadcast_to(x, list(like.shape), name=name)


def _matmul_batches(a, b):
    """a and b with their batch axes broadcast to one shape (numpy rules).
    A 2-D b stays shared; fusion copies a broadcast operand, since the GEMM
    reads each operand's batch as one stride."""
    if not isinstance(a, Blob) or not isinstance(b, Blob) or len(a.shape) < 2 or len(b.shape) < 2:
        return a, b
    ra, rb = len(a.shape), len(b.shape)
    if rb == 2 or (ra == rb and a.shape[:-2] == b.shape[:-2]):
        return a, b
    ba, bb = list(a.shape[:-2]), list(b.shape[:-2])
    r = max(len(ba), len(bb))
    ba, bb = [1] * (r - len(ba)) + ba, [1] * (r - len(bb)) + bb
    batch = []
    for x, y in zip(ba, bb):
        if x != y and 1 not in (x, y):
            _trace.fail(ValueError, f"matmul: batch dimensions differ and cannot be broadcast together "
                        f"(numpy rules): a is {tuple(a.shape)}, b is {tuple(b.shape)}")
        batch.append(max(x, y) if 0 not in (x, y) else 0)

    def widen(x):
        full = batch + list(x.shape[-2:])
        if list(x.shape) == full:
            return x
        return broadcast_to(x, full)
    return widen(a), widen(b)


def matmul(a: Blob, b: Blob, transpose_a: bool = False, transpose_b: bool = False, alpha: float = 1.0,
           name: Optional[str] = None) -> Blob:
    """a @ b with optional transposes of the last two axes; b may be 2-D
    while a is batched, and batch axes broadcast (numpy.matmul).

    Example:
        >>> @flow.global_function()
        ... def job(a: tp.Numpy.Placeholder((2, 3)), b: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.matmul(a, b, transpose_b=True)   # a @ b.T
        >>> job(np.float32([[1, 2, 3], [4, 5, 6]]), np.float32([[1, 0, 0], [1, 1, 1]])).tolist()
        [[1.0, 6.0], [4.0, 15.0]]
    """
    a, b = _matmul_batches(a, b)
    out = make(K.matmul, [a, b], {"transpose_a": bool(transpose_a),
                                  "transpose_b": bool(transpose_b)}, name=name, api="matmul")
    if alpha != 1.0:
        out = multiply(out, float(alpha))
    return out


# ---------------------------------------------------------------- nn

def _axis_attr(x, axis):
    return -1 if axis is None else int(axis)


def softmax(logits: Blob, axis: Optional[int] = None, name: Optional[str] = None) -> Blob:
    """exp(logits) normalized along `axis` (the last axis when None).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.nn.softmax(x)
        >>> job(np.float32([[0, 0, 0], [1, 2, 3]])).astype(float).round(3).tolist()
        [[0.333, 0.333, 0.333], [0.09, 0.245, 0.665]]
    """
    return make(K.softmax, [logits], {"axis": _axis_attr(logits, axis)}, name=name, api="softmax")


def log_softmax(logits: Blob, axis: Optional[int] = None, name: Optional[str] = None) -> Blob:
    """log(softmax(logits)) computed stably.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.nn.log_softmax(x)
        >>> job(np.float32([[0, 0], [0, 1000]])).astype(float).round(3).tolist()
        [[-0.693, -0.693], [-1000.0, 0.0]]
    """
    return make(K.log_softmax, [logits], {"axis": _axis_attr(logits, axis)}, name=name,
                api="log_softmax")


_INDEX_DTYPES = ("int8", "uint8", "int32", "int64")


def checked_index(x: Blob, limit: int, what: str, api: str) -> Blob:
    """x read through a check_index node: a run in which an element of x is
    outside [0, limit) raises IndexError naming the job, `what`, the value and
    its position (the kernels report it; nothing is clamped silently).
    Anything that is not an integer Blob is returned as it is, for the op to
    report."""
    if not isinstance(x, Blob) or x.dtype.name not in _INDEX_DTYPES or \
            not isinstance(limit, numbers.Integral) or limit < 0:
        return x
    return make(K.check_index, [x], {"limit": int(limit), "what": what}, api=api)


def sparse_softmax_cross_entropy_with_logits(labels: Blob, logits: Blob, name: Optional[str] = None) -> Blob:
    """Per-sample cross entropy: -log softmax(logits)[label]; shape logits.shape[:-1].
    Labels of shape logits.shape[:-1] + (1,) are taken as logits.shape[:-1], as OneFlow does.
    A label outside [0, classes) is an error of the run.

    Example:
        >>> @flow.global_function()
        ... def job(labels: tp.Numpy.Placeholder((2,), dtype=flow.int32), logits: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        >>> job(np.int32([0, 2]), np.float32([[0, 0, 0], [1, 2, 3]])).astype(float).round(3).tolist()
        [1.099, 0.408]
    """
    api = "sparse_softmax_cross_entropy_with_logits"
    if (isinstance(labels, Blob) and isinstance(logits, Blob) and len(labels.shape) == len(logits.shape)
            and labels.shape and labels.shape[-1] == 1):
        labels = reshape(labels, list(labels.shape[:-1]))  # OneFlow takes (N, 1) labels as (N,)
    if isinstance(logits, Blob) and logits.shape:
        labels = checked_index(labels, logits.shape[-1], f"{api}: labels", api)
    return make(K.sparse_softmax_cross_entropy, [labels, logits], name=name, api=api)


def softmax_cross_entropy_with_logits(labels: Blob, logits: Blob, name: Optional[str] = None) -> Blob:
    """Per-sample cross entropy against dense label distributions.

    Example:
        >>> @flow.global_function()
        ... def job(labels: tp.Numpy.Placeholder((1, 2)), logits: tp.Numpy.Placeholder((1, 2))) -> tp.Numpy:
        ...     return flow.nn.softmax_cross_entropy_with_logits(labels, logits)
        >>> job(np.float32([[0.5, 0.5]]), np.float32([[0, 0]])).astype(float).round(3).tolist()
        [0.693]
    """
    return negative(reduce_sum(multiply(labels, log_softmax(logits)), axis=-1), name=name)


def one_hot(indices: Blob, depth: int, on_value: float = 1, off_value: float = 0, axis: int = -1,
            dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> Blob:
    """One-hot encoding of integer `indices` along a new axis (`axis`, the
    last when -1): on_value where the position equals the index, else
    off_value.

    Example:
        >>> @flow.global_function()
        ... def job(i: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.one_hot(i, depth=3)
        >>> job(np.int32([2, 0, 1])).tolist()
        [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    """
    d = _dtype(dtype or _dtypes.float32, "one_hot")
    if not _is_int(axis):
        _trace.fail(TypeError, f"one_hot: axis must be an int, got {axis!r}")
    r = len(indices.shape) + 1 if isinstance(indices, Blob) else 1
    if not -r <= axis < r:
        _trace.fail(ValueError, f"one_hot: axis {axis} is out of range for a rank-{r} result "
                    f"(expected {-r} <= axis < {r})")
    if isinstance(depth, numbers.Integral):
        indices = checked_index(indices, depth, "one_hot: indices", "one_hot")
    last = axis % r == r - 1
    out = make(K.one_hot, [indices], {"depth": int(depth), "dtype": d.c,
                                      "on_value": float(on_value), "off_value": float(off_value)},
               name=name if last else None, api="one_hot")
    if last:
        return out
    perm = list(range(r - 1))
    perm.insert(axis % r, r - 1)
    return transpose(out, perm, name=name)


# ---------------------------------------------------------------- constants

def _default_dtype():
    b = _trace.current()
    return b.default_dtype if b is not None else _dtypes.float32


def constant(value: float, dtype: Optional[DTypeLike] = None, shape: Optional[Sequence[int]] = None,
             name: Optional[str] = None) -> Blob:
    """A blob of `shape` filled with the scalar `value`.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.constant(2.5, dtype=flow.float32, shape=[2, 2])
        >>> job().tolist()
        [[2.5, 2.5], [2.5, 2.5]]
    """
    if not isinstance(value, (numbers.Number, np.bool_)):
        _trace.fail(TypeError, f"constant: value must be a scalar number, got {type(value).__name__}")
    d = _dtype(dtype, "constant") if dtype is not None else (
        _default_dtype() if isinstance(value, float) else _dtypes.int32
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) else _default_dtype())
    s = [] if shape is None else _int_list(shape, "constant")
    return make(K.fill, [], {"value": _fill_value(value, d), "shape": s, "dtype": d.c}, name=name,
                api="constant")


def zeros(shape: Sequence[int], dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> Blob:
    """A blob of zeros.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.zeros([2, 3], dtype=flow.int32)
        >>> job().tolist()
        [[0, 0, 0], [0, 0, 0]]
    """
    return constant(0.0, dtype or _default_dtype(), shape, name)


def ones(shape: Sequence[int], dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> Blob:
    """A blob of ones.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.ones([3])
        >>> job().tolist()
        [1.0, 1.0, 1.0]
    """
    return constant(1.0, dtype or _default_dtype(), shape, name)


def zeros_like(like: Blob, dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> Blob:
    """Zeros of like's shape (and dtype unless `dtype` is given).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.zeros_like(x)
        >>> job(np.int32([5, 6])).tolist()
        [0, 0]
    """
    return constant(0.0, dtype or like.dtype, list(like.shape), name)


def ones_like(like: Blob, dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> Blob:
    """Ones of like's shape (and dtype unless `dtype` is given).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.ones_like(x)
        >>> job(np.float32([5, 6])).tolist()
        [1.0, 1.0]
    """
    return constant(1.0, dtype or like.dtype, list(like.shape), name)


def constant_like(like: Blob, value: Union[int, float], dtype: Optional[DTypeLike] = None,
                  name: Optional[str] = None) -> Blob:
    """A blob of like's shape filled with `value`, of like's dtype unless
    `dtype` is given (like's values are not read).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.constant_like(x, 7, dtype=flow.int32)
        >>> job(np.float32([5, 6])).tolist()
        [7, 7]
    """
    if not isinstance(like, Blob):
        _trace.fail(TypeError, f"constant_like: like must be a Blob, got {type(like).__name__}")
    if not isinstance(value, (numbers.Real, np.bool_)):
        _trace.fail(TypeError, f"constant_like: value must be an int or a float, got {type(value).__name__}")
    return constant(value, dtype or like.dtype, list(like.shape), name)


def constant_scalar(value: Union[int, float], dtype: Optional[DTypeLike] = None,
                    name: Optional[str] = None) -> Blob:
    """A blob of shape (1,) holding `value` (OneFlow's scalar constant).

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.constant_scalar(3.5, dtype=flow.float32)
        >>> job().tolist()
        [3.5]
    """
    return constant(value, dtype, [1], name)


def _random(op, shape, dtype, seed):
    """A random source of `shape` (counter-based: element i depends only on i and seed)."""
    d = _dtype(dtype, "random")
    return make(op, [], {"shape": [int(s) for s in shape], "dtype": d.c, "seed": int(seed)},
                api=op.name)
