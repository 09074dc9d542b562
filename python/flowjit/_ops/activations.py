"""Activations of flow.nn (and flow.math), composed of primitive ops."""
from typing import Optional

from . import builders as _ops
from .._core import trace as _trace
from .._core.blob import Blob
from .composite import _const, expm1, floating, log1p, number


def leaky_relu(x: Blob, alpha: float = 0.2, name: Optional[str] = None) -> Blob:
    """x where x > 0, else alpha * x.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.leaky_relu(x)
        >>> job(np.float32([-2, 0.5, 3])).astype(float).round(3).tolist()
        [-0.4, 0.5, 3.0]
    """
    floating(x, "leaky_relu")
    a = number(alpha, "leaky_relu", "alpha")
    return _ops.where(_ops.greater(x, 0.0), x, _ops.multiply(x, a), name=name)


def elu(x: Blob, alpha: float = 1.0, name: Optional[str] = None) -> Blob:
    """x where x > 0, else alpha * (exp(x) - 1).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.elu(x)
        >>> job(np.float32([-2, 0.5, 3])).astype(float).round(3).tolist()
        [-0.865, 0.5, 3.0]
    """
    floating(x, "elu")
    a = number(alpha, "elu", "alpha")
    neg = _ops.multiply(expm1(_ops.minimum(x, 0.0)), a)
    return _ops.where(_ops.greater(x, 0.0), x, neg, name=name)


def relu6(x: Blob, name: Optional[str] = None) -> Blob:
    """min(max(x, 0), 6).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.relu6(x)
        >>> job(np.float32([-2, 0.5, 8])).tolist()
        [0.0, 0.5, 6.0]
    """
    floating(x, "relu6")
    return _ops.minimum(_ops.maximum(x, 0.0), 6.0, name=name)


def hardtanh(x: Blob, min_val: float = -1.0, max_val: float = 1.0, name: Optional[str] = None) -> Blob:
    """x clipped to [min_val, max_val].

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.hardtanh(x)
        >>> job(np.float32([-2, 0.5, 3])).tolist()
        [-1.0, 0.5, 1.0]
    """
    floating(x, "hardtanh")
    lo, hi = number(min_val, "hardtanh", "min_val"), number(max_val, "hardtanh", "max_val")
    if lo > hi:
        _trace.fail(ValueError, f"hardtanh: min_val {min_val} is greater than max_val {max_val}")
    return _ops.minimum(_ops.maximum(x, lo), hi, name=name)


def hardsigmoid(x: Blob, name: Optional[str] = None) -> Blob:
    """relu6(x + 3) / 6: 0 below -3, 1 above 3, linear between.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.hardsigmoid(x)
        >>> job(np.float32([-4, 0, 1.5])).astype(float).round(3).tolist()
        [0.0, 0.5, 0.75]
    """
    floating(x, "hardsigmoid")
    return _ops.multiply(_ops.minimum(_ops.maximum(_ops.add(x, 3.0), 0.0), 6.0), 1.0 / 6.0, name=name)


def hardswish(x: Blob, name: Optional[str] = None) -> Blob:
    """x * relu6(x + 3) / 6.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.hardswish(x)
        >>> job(np.float32([-1, 0, 1.5])).astype(float).round(3).tolist()
        [-0.333, 0.0, 1.125]
    """
    floating(x, "hardswish")
    r = _ops.minimum(_ops.maximum(_ops.add(x, 3.0), 0.0), 6.0)
    return _ops.multiply(_ops.multiply(x, r), 1.0 / 6.0, name=name)


def swish(x: Blob, beta: float = 1.0, name: Optional[str] = None) -> Blob:
    """x * sigmoid(beta * x).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.swish(x)
        >>> job(np.float32([-2, 0, 3])).astype(float).round(3).tolist()
        [-0.238, 0.0, 2.858]
    """
    floating(x, "swish")
    b = number(beta, "swish", "beta")
    z = x if b == 1.0 else _ops.multiply(x, b)
    return _ops.multiply(x, _ops.sigmoid(z), name=name)


def gelu(x: Blob, name: Optional[str] = None) -> Blob:
    """OneFlow's exact GELU, 0.5 x (1 + erf(x / sqrt(2))), computed as
    0.5 x erfc(-x / sqrt(2)), the same function without the cancellation of
    1 + erf for negative x (so gelu(-10) keeps its relative accuracy).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.gelu(x)
        >>> job(np.float32([-1.5, 0, 3])).astype(float).round(3).tolist()
        [-0.1, 0.0, 2.996]
    """
    floating(x, "gelu")
    return _ops.multiply(_ops.multiply(x, 0.5), _ops.erfc(_ops.multiply(x, -0.7071067811865476)),
                         name=name)


def silu(x: Blob, name: Optional[str] = None) -> Blob:
    """swish with beta = 1: x * sigmoid(x).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.silu(x)
        >>> job(np.float32([-2, 0, 3])).astype(float).round(3).tolist()
        [-0.238, 0.0, 2.858]
    """
    floating(x, "silu")
    return _ops.multiply(x, _ops.sigmoid(x), name=name)


def _softplus(x):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|))."""
    return _ops.add(_ops.maximum(x, 0.0), log1p(_ops.exp(_ops.negative(_ops.abs(x)))))


def mish(x: Blob, name: Optional[str] = None) -> Blob:
    """x * tanh(softplus(x)).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.mish(x)
        >>> job(np.float32([-1, 0, 3])).astype(float).round(3).tolist()
        [-0.303, 0.0, 2.987]
    """
    floating(x, "mish")
    return _ops.multiply(x, _ops.tanh(_softplus(x)), name=name)


def softsign(x: Blob, name: Optional[str] = None) -> Blob:
    """x / (1 + |x|).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.softsign(x)
        >>> job(np.float32([-3, 0, 1])).tolist()
        [-0.75, 0.0, 0.5]
    """
    floating(x, "softsign")
    return _ops.divide(x, _ops.add(_ops.abs(x), 1.0), name=name)


def prelu(inputs: Blob, alpha: Blob, name: Optional[str] = None) -> Blob:
    """max(x, 0) + alpha * min(x, 0) with a blob alpha (broadcast against x)."""
    floating(inputs, "prelu", "inputs")
    floating(alpha, "prelu", "alpha")
    x = inputs
    return _ops.where(_ops.greater(x, _const(x, 0.0)), x, _ops.multiply(alpha, x), name=name)
