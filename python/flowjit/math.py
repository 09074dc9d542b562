"""flow.math: elementwise math, comparisons and reductions.

The docstrings' examples assume ``import numpy as np``, ``import flowjit as flow``
and ``import flowjit.typing as tp``; each starts from a fresh session.
"""
from ._ops.builders import (abs, add, argmax, argmin, ceil, cos, divide, equal, erf, erfc, exp,  # noqa: F401
                            floor, greater, greater_equal, less, less_equal, log, logical_and, logical_not,
                            logical_or, maximum, minimum, multiply, negative, not_equal, pow, reciprocal,
                            reduce_max, reduce_mean, reduce_min, reduce_prod, reduce_sum, relu, round, rsqrt,
                            sigmoid, sign, sin, sqrt, square, subtract, tanh)
from typing import Optional

from ._ops import builders as _ops
from ._core.blob import Blob
from ._ops.builders import BlobOrScalar as _BlobOrScalar


def squared_difference(x: _BlobOrScalar, y: _BlobOrScalar, name: Optional[str] = None) -> Blob:
    """(x - y) ** 2, elementwise.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.squared_difference(x, y)
        >>> job(np.float32([1, 2, 3]), np.float32([3, 2, 1])).tolist()
        [4.0, 0.0, 4.0]
    """
    return _ops.square(_ops.subtract(x, y), name=name)


def softplus(x: Blob, name: Optional[str] = None) -> Blob:
    """log(1 + exp(x)), computed without overflow.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.softplus(x)
        >>> job(np.float32([-100, 0, 100])).astype(float).round(3).tolist()
        [0.0, 0.693, 100.0]
    """
    return _ops.add(_ops.maximum(x, 0.0), _ops.log(_ops.add(_ops.exp(_ops.negative(_ops.abs(x))), 1.0)),
                    name=name)


# Math composed of primitive ops (issue #12).
from ._ops.composite import (acos, acosh, add_n, asin, asinh, atan, atan2, atanh,  # noqa: E402,F401
                             clip_by_value, cosh, expm1, floordiv, l2_normalize, log1p, log_sigmoid, mod,
                             reduce_all, reduce_any, reduce_logsumexp, reduce_std, reduce_variance, sinh, tan,
                             tril, triu, xlogy)
clip = clip_by_value

# Array ops of flow.math (issue #12).
from ._ops.array import in_top_k, top_k, unsorted_segment_sum, unsorted_segment_sum_like  # noqa: E402,F401

# GELU is flow.math.gelu in OneFlow; flow.nn.gelu is the same function.
from ._ops.activations import gelu  # noqa: E402,F401

# More of OneFlow's flow.math (issue [conformance]).
from ._ops.composite import (gelu_grad, lgamma, polyval, reciprocal_no_nan,  # noqa: E402,F401
                             reduce_euclidean_norm, rint, sigmoid_grad, sigmoid_v2, tanh_v2,
                             two_stage_reduce_max, two_stage_reduce_min, xdivy)
from ._ops.array import (broadcast_to_compatible_with, reduced_shape_elem_cnt,  # noqa: E402,F401
                         unsorted_batch_segment_sum)
from ._ops.fused import fused_scale_tril, fused_scale_tril_softmax_dropout  # noqa: E402,F401
