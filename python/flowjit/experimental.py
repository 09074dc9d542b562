"""flow.experimental: the lazy ops OneFlow 0.4-0.5 exported under this name
(unique_with_counts, indexed_slices_reduce_sum, square_sum, ssp_variable_proxy)
and its scope attributes (scope.config).

OneFlow's unique ops give *dynamic* results: the first ``num_unique`` rows of
a static-size output are the answer, the rest undefined. flowjit keeps that
layout (the rest is zero) and computes it from ordinary ops over the n x n
table of which elements are equal, so the cost is O(n^2) in the number of
elements: fine for the sizes these ops see (ids of one batch), not for
millions of ids.
"""
from typing import Any, Optional, Tuple

from ._ops import array as _array, builders as _ops
from ._core import dtypes as _dtypes, trace as _trace
from ._dist import ssp as _ssp
from ._core.blob import Blob

__all__ = ["indexed_slices_reduce_sum", "scope", "square_sum", "ssp_variable_proxy", "unique_with_counts"]


class scope:  # noqa: N801 - OneFlow's name (flow.experimental.scope.config)
    """OneFlow's scope attributes: ``with flow.experimental.scope.config(
    ssp_num_stages=4, ssp_stage_id=0):`` sets them for the ops and variables
    traced inside the block."""

    @staticmethod
    def config(**kwargs: Any) -> _ssp.ScopeConfig:
        """A context that sets OneFlow scope attributes: ``ssp_num_stages`` and
        ``ssp_stage_id`` (ints; they size the SSP proxies of
        function_config().enable_ssp), ``quantization_aware_training``,
        ``checkpointing`` (bools) and ``pipeline_stage_id_hint`` (an int),
        the last three accepted without effect."""
        return _ssp.scope_config(**kwargs)


def ssp_variable_proxy(var: Blob, buffer_size: int = 1, name: Optional[str] = None) -> Tuple[Blob, Blob]:
    """OneFlow's SSP variable proxy of variable `var`: ``(ref, value)``. ref is
    the variable itself (assign to it, train it); value is what the variable
    held buffer_size - 1 runs before this one (its initial value in the
    first buffer_size runs), without a gradient. With buffer_size 1, value
    is the variable as this run reads it.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     v = flow.get_variable("v", shape=(1,), initializer=flow.zeros_initializer())
        ...     ref, value = flow.experimental.ssp_variable_proxy(v, buffer_size=2)
        ...     flow.assign(ref, x)
        ...     return value   # what v held one run before this one
        >>> [job(np.float32([k])).tolist() for k in (1, 2, 3)]
        [[0.0], [0.0], [1.0]]
    """
    return _ssp.ssp_variable_proxy(var, buffer_size, name)


def square_sum(x: Blob, name: Optional[str] = None) -> Blob:
    """The sum of the squares of every element of x, shape (1,) (OneFlow's
    ``square_sum``).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.experimental.square_sum(x)
        >>> job(np.float32([1, 2, 3])).tolist()
        [14.0]
    """
    return _ops.reduce_sum(_ops.square(x), name=name)


def _first_occurrences(x: Blob, api: str):
    """For a 1-D blob x of n elements: (eq, is_first, rank) with eq[i, j] =
    x[i] == x[j] (float), is_first[j] = 1 where x[j] appears for the first
    time, rank[j] = how many first occurrences come before j (float, exact
    up to 2^24 elements)."""
    if not isinstance(x, Blob) or len(x.shape) != 1:
        _trace.fail(ValueError, f"{api}: expects a 1-D blob, got "
                    f"{x.shape if isinstance(x, Blob) else type(x).__name__}")
    n = x.shape[0]
    if n == 0:
        _trace.fail(ValueError, f"{api}: the input has no element")
    f = _dtypes.float64 if n >= (1 << 24) else _dtypes.float32
    eq = _ops.cast(_ops.equal(_ops.reshape(x, [n, 1]), _ops.reshape(x, [1, n])), f)  # [i, j]
    pos = _array.range(n, dtype=_dtypes.int32)
    before = _ops.cast(_ops.less(_ops.reshape(pos, [1, n]), _ops.reshape(pos, [n, 1])), f)  # [i, j]: j < i
    earlier = _ops.reduce_sum(eq * before, axis=1)  # equal elements before i
    is_first = _ops.cast(_ops.equal(earlier, 0.0), f)  # [n]
    rank = _ops.matmul(before, _ops.reshape(is_first, [n, 1]))  # [n, 1]: first occurrences before j
    return eq, is_first, _ops.reshape(rank, [n]), f


def _slots(x: Blob, api: str):
    """(eq, is_first, rank, slot_of, gather) where slot_of[i] is the output row
    of x[i]'s value and gather[k, j] = 1 when j is the first occurrence that
    fills row k."""
    eq, is_first, rank, f = _first_occurrences(x, api)
    n = x.shape[0]
    # The first occurrence of x[i]'s value is the j with eq[i, j] and is_first[j].
    firsts = eq * _ops.reshape(is_first, [1, n])  # [i, j]
    slot_of = _ops.reduce_sum(firsts * _ops.reshape(rank, [1, n]), axis=1)  # [n]
    rows = _ops.cast(_array.range(n, dtype=_dtypes.int32), f)
    gather = _ops.cast(_ops.equal(_ops.reshape(rows, [n, 1]), _ops.reshape(rank, [1, n])), f) * \
        _ops.reshape(is_first, [1, n])  # [k, j]
    return eq, is_first, slot_of, gather, f


def _pick(gather: Blob, values: Blob, f) -> Blob:
    """rows of `values` (n, ...) chosen by the 0/1 matrix gather (n, n), in values' dtype."""
    n = gather.shape[0]
    flat = _ops.reshape(values, [n, -1]) if len(values.shape) > 1 else _ops.reshape(values, [n, 1])
    wide = _dtypes.float64 if values.dtype in (_dtypes.int32, _dtypes.int64, _dtypes.float64) else f
    picked = _ops.matmul(_ops.cast(gather, wide), _ops.cast(flat, wide))
    return _ops.cast(_ops.reshape(picked, list(values.shape)), values.dtype)


def unique_with_counts(x: Blob, out_idx: _dtypes.DTypeLike = _dtypes.int32,
                       name: Optional[str] = None) -> Tuple[Blob, Blob, Blob, Blob]:
    """OneFlow's ``unique_with_counts`` of a 1-D blob: ``(y, idx, count,
    num_unique)``. The first ``num_unique`` elements of y are x's distinct
    values in the order they first appear, ``y[idx] == x``, ``count[k]`` is how
    often ``y[k]`` occurs; y and count have x's size, the rest is zero.
    idx, count and num_unique (shape (1,)) have dtype ``out_idx``.

    Example:
        >>> from typing import Tuple
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((5,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        ...     return flow.experimental.unique_with_counts(x)
        >>> y, idx, count, n = job(np.int32([7, 3, 7, 7, 5]))
        >>> y[:n[0]].tolist(), idx.tolist(), count[:n[0]].tolist()
        ([7, 3, 5], [0, 1, 0, 0, 2], [3, 1, 1])
    """
    api = "experimental.unique_with_counts"
    odt = _dtypes.to_dtype(out_idx, f"{api} out_idx")
    if odt not in (_dtypes.int32, _dtypes.int64):
        _trace.fail(TypeError, f"{api}: out_idx must be flow.int32 or flow.int64, got {odt!r}")
    eq, is_first, slot_of, gather, f = _slots(x, api)
    y = _pick(gather, x, f)
    occurrences = _ops.reduce_sum(eq, axis=0)  # [j]: how often x[j]'s value occurs
    count = _ops.cast(_ops.reshape(_ops.matmul(gather, _ops.reshape(occurrences, [-1, 1])), [-1]), odt)
    num_unique = _ops.cast(_ops.reduce_sum(is_first), odt)
    idx = _ops.cast(slot_of, odt)
    if name:
        y = _ops.identity(y, name=name)
    return y, idx, count, num_unique


def indexed_slices_reduce_sum(indices: Blob, values: Blob,
                              name: Optional[str] = None) -> Tuple[Blob, Blob, Blob]:
    """OneFlow's ``indexed_slices_reduce_sum``: the rows of values (n, m) that
    share an index summed. Returns ``(y_indices (n,), y_values (n, m),
    num_unique (1,) int64)``; the first ``num_unique`` entries hold each
    distinct index (in first-appearance order) and its summed row.

    Example:
        >>> from typing import Tuple
        >>> @flow.global_function()
        ... def job(i: tp.Numpy.Placeholder((3,), dtype=flow.int32),
        ...         v: tp.Numpy.Placeholder((3, 2))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        ...     return flow.experimental.indexed_slices_reduce_sum(i, v)
        >>> idx, rows, n = job(np.int32([4, 1, 4]), np.float32([[1, 1], [2, 2], [3, 3]]))
        >>> idx[:n[0]].tolist(), rows[:n[0]].tolist()
        ([4, 1], [[4.0, 4.0], [2.0, 2.0]])
    """
    api = "experimental.indexed_slices_reduce_sum"
    if not isinstance(values, Blob) or not isinstance(indices, Blob) or len(values.shape) < 1 \
            or values.shape[0] != (indices.shape[0] if indices.shape else -1):
        _trace.fail(ValueError, f"{api}: values must have one row per index, got indices "
                    f"{getattr(indices, 'shape', None)} and values {getattr(values, 'shape', None)}")
    if indices.dtype not in (_dtypes.int32, _dtypes.int64):
        _trace.fail(TypeError, f"{api}: indices must be int32 or int64, got {indices.dtype!r}")
    if values.dtype not in _dtypes.FLOATS:
        _trace.fail(TypeError, f"{api}: values must be float32 or float64, got {values.dtype!r}")
    eq, is_first, slot_of, gather, f = _slots(indices, api)
    y_indices = _pick(gather, indices, f)
    n = indices.shape[0]
    rows = _ops.cast(_array.range(n, dtype=_dtypes.int32), f)
    scatter = _ops.cast(_ops.equal(_ops.reshape(rows, [n, 1]), _ops.reshape(slot_of, [1, n])),
                        values.dtype)  # [k, i]: x[i] goes to row k
    y_values = _ops.reshape(_ops.matmul(scatter, _ops.reshape(values, [n, -1])), list(values.shape))
    num_unique = _ops.cast(_ops.reduce_sum(is_first), _dtypes.int64)
    if name:
        y_values = _ops.identity(y_values, name=name)
    return y_indices, y_values, num_unique
