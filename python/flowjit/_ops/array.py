"""Array ops with OneFlow's names: pads, slices, joins, gathers, scatters, sorts.

pad (constant), slice and gather are IR views (ir/array.h) that fusion reads
through offsets, guarded and indirect coordinates; the others are built from
them and from elementwise ops and reductions, so each is differentiated,
distributed and fused through its parts:
  concat          the sum of each input padded into its range (one loop kernel)
  split, stack    slices; expand_dims + concat
  reflect/replicate pads   concats of (reversed) slices
  scatter_nd, unsorted_segment_sum   one segment_sum kernel (a kernel family:
                  codegen/families/segment_sum), also the gradient of gathers
  sort, argsort, top_k     ranks by comparison: rank(i) = #{j: x_j < x_i} +
                  #{j < i: x_j == x_i} (NaN the largest), then a segment sum
                  to the order and a gather of the values; O(n^2) per row
Index rule: gathers clamp an index into [0, extent); scatters and segment sums
drop entries whose index is out of range.
"""
import builtins as _b
import math as _math
import numbers
from typing import Any, List, Optional, Sequence, Union

import numpy as np

from .. import _C
from .._core import dtypes as _dtypes, trace as _trace
from . import builders as _ops
from .._core.blob import Blob
from .._core.dtypes import DTypeLike

K = _C.OpKind


def _blob(x, api, what="input"):
    if not isinstance(x, Blob):
        _trace.fail(TypeError, f"{api}: {what} must be a Blob, got {type(x).__name__}")
    return x


def _axis(x, axis, api, extra=0, what="axis"):
    r = len(x.shape) + extra
    if not _ops._is_int(axis):
        _trace.fail(TypeError, f"{api}: {what} must be an int, got {axis!r}")
    axis = int(axis)
    if not -r <= axis < max(r, 1):
        _trace.fail(ValueError, f"{api}: {what} {axis} is out of range for a rank-{len(x.shape)} input "
                    f"(expected {-r} <= {what} < {max(r, 1)})")
    return axis % r if r else 0


def _iota(shape, axis, dtype):
    return _ops.make(K.iota, [], {"shape": list(shape), "dtype": dtype.c, "axis": int(axis)}, api="iota")


def _raw_slice(x, begin, step, shape, api):
    return _ops.make(K.slice, [x], {"begin": list(begin), "step": list(step), "shape": list(shape)}, api=api)


_INTS = (_dtypes.int8, _dtypes.uint8, _dtypes.int32, _dtypes.int64)


def _pad_value(value, dtype, api):
    """The pad attribute: an exact int for integer dtypes (a float rounds
    int64 beyond 2^53; a float value is truncated, as int() does), else a float."""
    if not isinstance(value, (numbers.Real, np.bool_)):
        _trace.fail(TypeError, f"{api}: the pad value must be a number, got {type(value).__name__}")
    if dtype not in _INTS:
        return float(value)
    if not isinstance(value, numbers.Integral) and not _math.isfinite(value):
        _trace.fail(ValueError, f"{api}: the pad value {value} is not finite, so {dtype!r} has no such "
                    f"value")
    v = int(value)
    info = np.iinfo(dtype.np)
    if not info.min <= v <= info.max:
        _trace.fail(OverflowError, f"{api}: the pad value {v} is out of bounds for {dtype!r} (range "
                    f"{info.min}..{info.max})")
    return v


def _raw_pad(x, lo, hi, value, api, name=None):
    v = _pad_value(value, x.dtype, api)
    return _ops.make(K.pad, [x], {"pads_lo": list(lo), "pads_hi": list(hi), "pad_value": v}, name=name,
                     api=api)


def _slice_dim(x, axis, start, stop, step=1, api="slice"):
    """x[..., start:stop:step, ...] along one axis (Python's rules on the bounds)."""
    shape = list(x.shape)
    r = _b.range(*_b.slice(start, stop, step).indices(shape[axis]))
    begin = [0] * len(shape)
    steps = [1] * len(shape)
    begin[axis] = r.start if len(r) else 0
    steps[axis] = step
    shape[axis] = len(r)
    return _raw_slice(x, begin, steps, shape, api)


# ---------------------------------------------------------------- pads

def _pairs(paddings, rank, api):
    try:
        pairs = [(int(a), int(b)) for a, b in paddings]
    except (TypeError, ValueError):
        _trace.fail(TypeError, f"{api}: paddings must be a list of (before, after) int pairs, got {paddings!r}")
    if len(pairs) != rank:
        _trace.fail(ValueError, f"{api}: paddings has {len(pairs)} pairs but the input has rank {rank}")
    for d, (a, b) in enumerate(pairs):
        if a < 0 or b < 0:
            _trace.fail(ValueError, f"{api}: paddings of dim {d} must be >= 0, got ({a}, {b})")
    return pairs


def pad(x: Blob, paddings: Sequence[Any], constant_value: float = 0, mode: str = "constant",
        name: Optional[str] = None) -> Blob:
    """x padded by paddings[d] = (before, after) elements along each dim d:
    `constant_value` (mode "constant"), the mirror image without the edge
    ("reflect") or the edge repeated ("replicate"/"symmetric" is not).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.pad(x, [(0, 1), (1, 0)], constant_value=9)
        >>> job(np.float32([[1, 2], [3, 4]])).tolist()
        [[9.0, 1.0, 2.0], [9.0, 3.0, 4.0], [9.0, 9.0, 9.0]]
    """
    x = _blob(x, "pad")
    pairs = _pairs(paddings, len(x.shape), "pad")
    mode = str(mode).lower()
    if mode == "constant":
        return _raw_pad(x, [a for a, _ in pairs], [b for _, b in pairs], constant_value, "pad", name)
    if mode not in ("reflect", "replicate", "edge"):
        _trace.fail(ValueError, f"pad: mode must be 'constant', 'reflect' or 'replicate', got {mode!r}")
    y = x
    for d, (lo, hi) in enumerate(pairs):
        if lo == 0 and hi == 0:
            continue
        n = y.shape[d]
        if mode == "reflect":
            if lo >= n or hi >= n:
                _trace.fail(ValueError, f"pad: reflect padding ({lo}, {hi}) of dim {d} must be smaller than "
                            f"its extent {n}")
            parts = [_slice_dim(y, d, lo, 0, -1, "pad")] if lo else []
            parts.append(y)
            if hi:
                stop = n - 2 - hi
                parts.append(_slice_dim(y, d, n - 2, stop if stop >= 0 else None, -1, "pad"))
        else:
            if n == 0:
                _trace.fail(ValueError, f"pad: cannot replicate the edge of the empty dim {d}")
            parts = []
            for count, at in ((lo, 0), (0, None), (hi, n - 1)):
                if at is None:
                    parts.append(y)
                elif count:
                    edge = _slice_dim(y, d, at, at + 1, 1, "pad")
                    s = list(y.shape)
                    s[d] = count
                    parts.append(_ops.broadcast_to(edge, s))
        y = concat(parts, axis=d)
    return _ops.identity(y, name=name) if name else y


def _pad2d(x, padding, api):
    x = _blob(x, api)
    if len(x.shape) != 4:
        _trace.fail(ValueError, f"{api}: input must be NCHW (rank 4), got shape {tuple(x.shape)}")
    p = [int(padding)] * 4 if _ops._is_int(padding) else _ops._int_list(padding, api, "padding")
    if len(p) != 4:
        _trace.fail(ValueError, f"{api}: padding must be an int or [left, right, top, bottom], got {padding!r}")
    return [(0, 0), (0, 0), (p[2], p[3]), (p[0], p[1])]


def constant_pad2d(x: Blob, padding: Union[int, Sequence[int]], constant_value: float = 0,
                   name: Optional[str] = None) -> Blob:
    """NCHW x padded by padding = [left, right, top, bottom] with a constant.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 1, 2))) -> tp.Numpy:
        ...     return flow.constant_pad2d(x, [1, 0, 0, 1], constant_value=7)
        >>> job(np.float32([[[[1, 2]]]])).tolist()
        [[[[7.0, 1.0, 2.0], [7.0, 7.0, 7.0]]]]
    """
    return pad(x, _pad2d(x, padding, "constant_pad2d"), constant_value, "constant", name)


def reflection_pad2d(x: Blob, padding: Union[int, Sequence[int]], name: Optional[str] = None) -> Blob:
    """NCHW x padded by [left, right, top, bottom] mirror images.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 1, 3))) -> tp.Numpy:
        ...     return flow.reflection_pad2d(x, [1, 1, 0, 0])
        >>> job(np.float32([[[[1, 2, 3]]]])).tolist()
        [[[[2.0, 1.0, 2.0, 3.0, 2.0]]]]
    """
    return pad(x, _pad2d(x, padding, "reflection_pad2d"), 0, "reflect", name)


def replication_pad2d(x: Blob, padding: Union[int, Sequence[int]], name: Optional[str] = None) -> Blob:
    """NCHW x padded by [left, right, top, bottom] copies of the edge.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 1, 3))) -> tp.Numpy:
        ...     return flow.replication_pad2d(x, [1, 1, 0, 0])
        >>> job(np.float32([[[[1, 2, 3]]]])).tolist()
        [[[[1.0, 1.0, 2.0, 3.0, 3.0]]]]
    """
    return pad(x, _pad2d(x, padding, "replication_pad2d"), 0, "replicate", name)


# ---------------------------------------------------------------- slices

def slice(x: Blob, begin: Sequence[Optional[int]], size: Sequence[int], name: Optional[str] = None) -> Blob:  # noqa: A001 - OneFlow's name
    """x[begin[d] : begin[d] + size[d]] along each dim; a None begin is 0 and
    a None or -1 size runs to the end.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.slice(x, begin=[0, 1], size=[2, 2])
        >>> job(np.float32([[1, 2, 3], [4, 5, 6]])).tolist()
        [[2.0, 3.0], [5.0, 6.0]]
    """
    x = _blob(x, "slice")
    shape = list(x.shape)
    if not isinstance(begin, (list, tuple)) or not isinstance(size, (list, tuple)):
        _trace.fail(TypeError, f"slice: begin and size must be lists, got {begin!r} and {size!r}")
    if len(begin) != len(shape) or len(size) != len(shape):
        _trace.fail(ValueError, f"slice: begin ({len(begin)} entries) and size ({len(size)}) must have one "
                    f"entry per dim of the rank-{len(shape)} input")
    b = [0 if v is None else int(v) for v in begin]
    s = [shape[d] - b[d] if v is None or v == -1 else int(v) for d, v in enumerate(size)]
    return _ops.make(K.slice, [x], {"begin": b, "step": [1] * len(shape), "shape": s}, name=name, api="slice")


def slice_v2(x: Blob, slice_tup_list: Sequence[Sequence[Optional[int]]], name: Optional[str] = None) -> Blob:
    """x[start:stop:step] per dim, slice_tup_list[d] = (start, stop, step) with
    Python's rules (None bounds, negative values count from the end, negative
    steps walk backwards); missing trailing dims are whole.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 4))) -> tp.Numpy:
        ...     return flow.slice_v2(x, [(None, None, None), (None, None, -2)])   # x[:, ::-2]
        >>> job(np.float32([[1, 2, 3, 4], [5, 6, 7, 8]])).tolist()
        [[4.0, 2.0], [8.0, 6.0]]
    """
    x = _blob(x, "slice_v2")
    shape = list(x.shape)
    if not isinstance(slice_tup_list, (list, tuple)) or len(slice_tup_list) > len(shape):
        _trace.fail(ValueError, f"slice_v2: slice_tup_list must be a list of at most {len(shape)} "
                    f"(start, stop, step) tuples, got {slice_tup_list!r}")
    begin, step, out = [], [], []
    for d, n in enumerate(shape):
        t = tuple(slice_tup_list[d]) if d < len(slice_tup_list) else (None, None, None)
        if len(t) != 3:
            _trace.fail(ValueError, f"slice_v2: entry {d} must be (start, stop, step), got {t!r}")
        st = 1 if t[2] is None else int(t[2])
        if st == 0:
            _trace.fail(ValueError, f"slice_v2: step of dim {d} must not be 0")
        r = _b.range(*_b.slice(t[0], t[1], st).indices(n))
        begin.append(r.start if len(r) else 0)
        step.append(st)
        out.append(len(r))
    return _ops.make(K.slice, [x], {"begin": begin, "step": step, "shape": out}, name=name, api="slice_v2")


def _slice_ranges(slice_tup_list, shape, api):
    """One range of positions per dim for slice_tup_list[d] = (start, stop,
    step), with OneFlow's checks: start in [-n, n), stop in [-n-1, n], a
    step other than 0; missing trailing dims are whole."""
    if not isinstance(slice_tup_list, (list, tuple)) or len(slice_tup_list) > len(shape):
        _trace.fail(ValueError, f"{api}: slice_tup_list must be a list of at most {len(shape)} "
                    f"(start, stop, step) tuples, got {slice_tup_list!r}")
    out = []
    for d, n in enumerate(shape):
        t = slice_tup_list[d] if d < len(slice_tup_list) else (None, None, None)
        if not isinstance(t, (list, tuple)) or len(t) != 3 or \
                not all(v is None or _ops._is_int(v) for v in t):
            _trace.fail(ValueError, f"{api}: entry {d} must be (start, stop, step) of ints or None, got {t!r}")
        start, stop, step = (None if v is None else int(v) for v in t)
        step = 1 if step is None else step
        if step == 0:
            _trace.fail(ValueError, f"{api}: step of dim {d} must not be 0")
        if start is not None and not -n <= start < n:
            _trace.fail(ValueError, f"{api}: start {start} of dim {d} must be in [-{n}, {n})")
        if stop is not None and not -n - 1 <= stop <= n:
            _trace.fail(ValueError, f"{api}: stop {stop} of dim {d} must be in [-{n + 1}, {n}]")
        out.append(_b.range(*_b.slice(start, stop, step).indices(n)))
    return out


def _spread(u, ranges, shape, value):
    """u (one entry per position of ranges[d] along each dim d) placed at
    those positions of a blob of `shape`, `value` elsewhere: reversed along
    a dim with a negative step, strided by interleaving pads, then padded
    to its place."""
    lo, hi = [], []
    for d, r in enumerate(ranges):
        if r.step < 0:
            u = _slice_dim(u, d, None, None, -1, "slice_update")
            r = r[::-1]
        m, s = len(r), r.step
        if s > 1 and m > 1:
            dims = list(u.shape)
            u = _ops.reshape(u, dims[:d + 1] + [1] + dims[d + 1:])
            p = [0] * len(u.shape)
            u = _raw_pad(u, [0] * len(u.shape), p[:d + 1] + [s - 1] + p[d + 2:], value, "slice_update")
            u = _ops.reshape(u, dims[:d] + [m * s] + dims[d + 1:])
            u = _slice_dim(u, d, 0, (m - 1) * s + 1, 1, "slice_update")
        lo.append(r.start)
        hi.append(shape[d] - r.start - u.shape[d])
    return _raw_pad(u, lo, hi, value, "slice_update")


def slice_update(x: Blob, update: Blob, slice_tup_list: Sequence[Sequence[Optional[int]]],
                 name: Optional[str] = None) -> Blob:
    """x with its slice x[start:stop:step, ...] replaced by `update`
    (slice_tup_list[d] = (start, stop, step) per dim, as in slice_v2; the
    update has the slice's shape). The result is a new blob; the gradient
    reaches x outside the slice and `update` inside it.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,)), u: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.slice_update(x, u, [(1, 3, 1)])
        >>> job(np.float32([1, 2, 3, 4]), np.float32([0, 0])).tolist()
        [1.0, 0.0, 0.0, 4.0]
    """
    x = _blob(x, "slice_update", "x")
    update = _blob(update, "slice_update", "update")
    if update.dtype is not x.dtype:
        _trace.fail(TypeError, f"slice_update: update is {update.dtype!r} but x is {x.dtype!r}")
    shape = list(x.shape)
    ranges = _slice_ranges(slice_tup_list, shape, "slice_update")
    want = [len(r) for r in ranges]
    if list(update.shape) != want:
        _trace.fail(ValueError, f"slice_update: update has shape {tuple(update.shape)} but the slice "
                    f"{list(slice_tup_list)} of x {tuple(shape)} has shape {tuple(want)}")
    if 0 in want:
        return _ops.identity(x, name=name)
    hit = _spread(_ops.ones(want, _dtypes.bool_), ranges, shape, 0)
    return _ops.where(hit, _spread(update, ranges, shape, 0), x, name=name)


def split(x: Blob, num_or_size_splits: Union[int, Sequence[int]], axis: int = 0,
          name: Optional[str] = None) -> List[Blob]:
    """x cut along `axis` into num equal pieces or pieces of the given sizes
    (one size may be -1: the rest); returns a list.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((5,))) -> tp.Numpy:
        ...     a, b = flow.split(x, [2, -1])
        ...     return b
        >>> job(np.float32([1, 2, 3, 4, 5])).tolist()
        [3.0, 4.0, 5.0]
    """
    x = _blob(x, "split")
    axis = _axis(x, 0 if axis is None else axis, "split")
    n = x.shape[axis]
    if _ops._is_int(num_or_size_splits):
        k = int(num_or_size_splits)
        if k <= 0 or n % k:
            _trace.fail(ValueError, f"split: dim {axis} of extent {n} does not split into {k} equal pieces")
        sizes = [n // k] * k
    else:
        sizes = _ops._int_list(num_or_size_splits, "split", "num_or_size_splits")
        if sizes.count(-1) == 1:
            sizes[sizes.index(-1)] = n - (sum(sizes) + 1)
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            _trace.fail(ValueError, f"split: sizes {num_or_size_splits} do not add up to the extent {n} "
                        f"of dim {axis}")
    out, at = [], 0
    for s in sizes:
        out.append(_slice_dim(x, axis, at, at + s, 1, "split"))
        at += s
    return out


# ---------------------------------------------------------------- joins

def concat(values: Sequence[Blob], axis: int = 0, max_dim_size: Optional[int] = None,
           name: Optional[str] = None) -> Blob:
    """The inputs joined along `axis`: the sum of each padded into its range.

    Example:
        >>> @flow.global_function()
        ... def job(a: tp.Numpy.Placeholder((1, 2)), b: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.concat([a, b], axis=0)
        >>> job(np.float32([[1, 2]]), np.float32([[3, 4], [5, 6]])).tolist()
        [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    """
    if isinstance(values, Blob) or not isinstance(values, (list, tuple)) or not values:
        _trace.fail(TypeError, "concat: values must be a non-empty list of Blobs")
    for i, v in enumerate(values):
        _blob(v, "concat", f"values[{i}]")
    first = values[0]
    axis = _axis(first, axis, "concat")
    for i, v in enumerate(values):
        if v.dtype is not first.dtype:
            _trace.fail(TypeError, f"concat: values[{i}] is {v.dtype!r} but values[0] is {first.dtype!r}")
        ok = len(v.shape) == len(first.shape) and all(
            a == b for d, (a, b) in enumerate(zip(v.shape, first.shape)) if d != axis)
        if not ok:
            _trace.fail(ValueError, f"concat: values[{i}] has shape {tuple(v.shape)} but values[0] has "
                        f"{tuple(first.shape)}; all dims but {axis} must agree")
    total = sum(v.shape[axis] for v in values)
    parts = [v for v in values if v.shape[axis] > 0] or [values[0]]
    if len(parts) == 1:
        return _ops.identity(parts[0], name=name)
    boolean = first.dtype is _dtypes.bool_
    at, acc = 0, None
    for v in values:
        n = v.shape[axis]
        if n == 0:
            continue
        lo = [0] * len(v.shape)
        hi = [0] * len(v.shape)
        lo[axis], hi[axis] = at, total - at - n
        # Float parts are padded with -0.0: x + -0.0 == x for every x (-0.0,
        # NaN and inf too), where a +0.0 pad turned -0.0 into +0.0.
        p = _raw_pad(v, lo, hi, -0.0 if v.dtype in _dtypes.FLOATS else 0, "concat")
        acc = p if acc is None else (_ops.logical_or(acc, p) if boolean else _ops.add(acc, p))
        at += n
    return _ops.identity(acc, name=name) if name else acc


def stack(values: Sequence[Blob], axis: int = 0, name: Optional[str] = None) -> Blob:
    """The inputs (all of one shape) joined along a new axis.

    Example:
        >>> @flow.global_function()
        ... def job(a: tp.Numpy.Placeholder((2,)), b: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.stack([a, b], axis=1)
        >>> job(np.float32([1, 2]), np.float32([3, 4])).tolist()
        [[1.0, 3.0], [2.0, 4.0]]
    """
    if isinstance(values, Blob) or not isinstance(values, (list, tuple)) or not values:
        _trace.fail(TypeError, "stack: values must be a non-empty list of Blobs")
    for i, v in enumerate(values):
        _blob(v, "stack", f"values[{i}]")
        if tuple(v.shape) != tuple(values[0].shape):
            _trace.fail(ValueError, f"stack: values[{i}] has shape {tuple(v.shape)} but values[0] has "
                        f"{tuple(values[0].shape)}")
    axis = _axis(values[0], axis, "stack", extra=1)
    return concat([_ops.expand_dims(v, axis) for v in values], axis=axis, name=name)


def flatten(input: Blob, start_dim: int = 0, end_dim: int = -1, name: Optional[str] = None) -> Blob:
    """input with dims start_dim..end_dim merged into one.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3, 4))) -> tp.Numpy:
        ...     return flow.flatten(x, start_dim=1)
        >>> job(np.zeros((2, 3, 4), np.float32)).shape
        (2, 12)
    """
    x = _blob(input, "flatten")
    r = len(x.shape)
    if r == 0:
        return _ops.reshape(x, [1], name=name)
    s = _axis(x, start_dim, "flatten", what="start_dim")
    e = _axis(x, end_dim, "flatten", what="end_dim")
    if s > e:
        _trace.fail(ValueError, f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = list(x.shape)
    n = 1
    for d in shape[s:e + 1]:
        n *= d
    return _ops.reshape(x, shape[:s] + [n] + shape[e + 1:], name=name)


def expand(x: Blob, expand_size: Sequence[int], name: Optional[str] = None) -> Blob:
    """x broadcast to expand_size; -1 keeps x's extent, new dims go first.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2))) -> tp.Numpy:
        ...     return flow.expand(x, [2, -1])
        >>> job(np.float32([[1, 2]])).tolist()
        [[1.0, 2.0], [1.0, 2.0]]
    """
    x = _blob(x, "expand")
    size = _ops._int_list(expand_size, "expand", "expand_size")
    r, k = len(x.shape), len(size)
    if k < r:
        _trace.fail(ValueError, f"expand: expand_size {size} has fewer dims than the input {tuple(x.shape)}")
    out = []
    for i, s in enumerate(size):
        j = i - (k - r)
        if s == -1:
            if j < 0:
                _trace.fail(ValueError, f"expand: -1 in expand_size {size} at a new dim {i}")
            s = x.shape[j]
        if j >= 0 and x.shape[j] not in (1, s):
            _trace.fail(ValueError, f"expand: dim {j} of the input {tuple(x.shape)} has extent "
                        f"{x.shape[j]}, which cannot expand to {s}")
        out.append(s)
    return _ops.broadcast_to(x, out, name=name)


def tile(input: Blob, multiples: Sequence[int], name: Optional[str] = None) -> Blob:
    """input repeated multiples[d] times along each dim (numpy.tile).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.tile(x, [3])
        >>> job(np.float32([1, 2])).tolist()
        [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    """
    x = _blob(input, "tile")
    reps = _ops._int_list(multiples, "tile", "multiples")
    if any(m < 0 for m in reps):
        _trace.fail(ValueError, f"tile: multiples must be >= 0, got {reps}")
    shape = list(x.shape)
    r = max(len(shape), len(reps))
    shape = [1] * (r - len(shape)) + shape
    reps = [1] * (r - len(reps)) + reps
    inter, wide, out = [], [], []
    for m, d in zip(reps, shape):
        inter += [1, d]
        wide += [m, d]
        out.append(m * d)
    y = _ops.broadcast_to(_ops.reshape(x, inter), wide)
    return _ops.reshape(_ops.identity(y), out, name=name)


def range(start: float, limit: Optional[float] = None, delta: float = 1, dtype: Optional[DTypeLike] = None,  # noqa: A001 - OneFlow's name
          name: Optional[str] = None) -> Blob:
    """start, start + delta, ... below limit (numpy.arange); int64 for ints.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.range(1, 10, 3)
        >>> job().tolist()
        [1, 4, 7]
    """
    if limit is None:
        start, limit = 0, start
    for what, v in (("start", start), ("limit", limit), ("delta", delta)):
        if not isinstance(v, numbers.Real) or isinstance(v, bool):
            _trace.fail(TypeError, f"range: {what} must be a number, got {v!r}")
        if not _math.isfinite(v):
            _trace.fail(ValueError, f"range: {what} must be finite, got {v!r}")
    if delta == 0:
        _trace.fail(ValueError, "range: delta must not be 0")
    ints = all(_ops._is_int(v) for v in (start, limit, delta))
    d = _ops._dtype(dtype, "range") if dtype is not None else (_dtypes.int64 if ints else _dtypes.float32)
    n = max(0, _math.ceil((limit - start) / delta))
    i = _iota([n], 0, d)
    if delta != 1:
        i = _ops.multiply(i, delta)
    if start != 0:
        i = _ops.add(i, start)
    return _ops.identity(i, name=name) if name else i


# ---------------------------------------------------------------- gathers and scatters

def gather(params: Blob, indices: Blob, validate_indices: Optional[bool] = None, axis: Optional[int] = None,
           batch_dims: int = 0, name: Optional[str] = None) -> Blob:
    """params indexed along `axis` by integer `indices` (TensorFlow's rule:
    shape params[:axis] + indices[batch_dims:] + params[axis+1:]); an index
    outside [0, params.shape[axis]) is an error of the run. As in OneFlow,
    ``axis == batch_dims > 0`` is a batch gather over all but the last axis
    of `indices` when those match params' leading axes, whatever batch_dims
    says (BERT's ``gather(seq, positions, axis=2, batch_dims=2)``).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3, 2)), i: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.gather(x, i)   # rows i of x
        >>> job(np.float32([[1, 2], [3, 4], [5, 6]]), np.int32([2, 0])).tolist()
        [[5.0, 6.0], [1.0, 2.0]]
    """
    _blob(params, "gather", "params")
    _blob(indices, "gather", "indices")
    ax = batch_dims if axis is None else axis
    if not _ops._is_int(ax) or not _ops._is_int(batch_dims):
        _trace.fail(TypeError, f"gather: axis and batch_dims must be ints, got {axis!r} and {batch_dims!r}")
    rank = len(params.shape)
    nb = len(indices.shape) - 1
    if (batch_dims > 0 and ax % max(rank, 1) == batch_dims and nb >= 1 and batch_dims != nb
            and nb < rank and tuple(indices.shape[:nb]) == tuple(params.shape[:nb])):
        # OneFlow's rule: gather with axis == batch_dims > 0 is its batch_gather,
        # whose batch axes are all but the last of `indices` whatever batch_dims
        # says (BERT's gather(seq, positions, axis=2, batch_dims=2) of a
        # (B, S, H) and a (B, P) blob is (B, P, H)). Where batch_dims is that
        # count it is TensorFlow's rule too.
        ax = batch_dims = nb
    if -rank <= ax < rank:
        indices = _ops.checked_index(indices, params.shape[ax % rank], "gather: indices", "gather")
    return _ops.make(K.gather, [params, indices], {"axis": int(ax), "batch_dims": int(batch_dims)},
                     name=name, api="gather")


def gather_nd(params: Blob, indices: Blob, name: Optional[str] = None) -> Blob:
    """params[indices[..., 0], ..., indices[..., K-1]] (K = indices.shape[-1]);
    an index outside its dim is an error of the run.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2)), i: tp.Numpy.Placeholder((2, 2), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.gather_nd(x, i)   # x[1, 0] and x[0, 1]
        >>> job(np.float32([[1, 2], [3, 4]]), np.int32([[1, 0], [0, 1]])).tolist()
        [3.0, 2.0]
    """
    _blob(params, "gather_nd", "params")
    _blob(indices, "gather_nd", "indices")
    k = indices.shape[-1] if indices.shape else 0
    if 1 <= k <= len(params.shape):
        # The kernels check each component against its own dim.
        indices = _ops.checked_index(indices, max(params.shape[:k]), "gather_nd: indices",
                                     "gather_nd")
    return _ops.make(K.gather_nd, [params, indices], name=name, api="gather_nd")


def _check_index(x, api, what="indices"):
    _blob(x, api, what)
    if x.dtype not in (_dtypes.int8, _dtypes.uint8, _dtypes.int32, _dtypes.int64):
        _trace.fail(TypeError, f"{api}: {what} must be an integer tensor (int32 or int64), got {x.dtype!r}")


def _segment_sum(data, ids, axis, batch_dims, num_segments, api):
    """The segment_sum op (ir/ops.def): data's dims from `axis` indexed by
    ids (after its `batch_dims` leading dims) summed into num_segments."""
    return _ops.make(K.segment_sum, [data, ids],
                     {"axis": int(axis), "batch_dims": int(batch_dims), "num_segments": int(num_segments)},
                     api=api)


def scatter_nd(indices: Blob, updates: Blob, shape: Sequence[int], name: Optional[str] = None) -> Blob:
    """A zero tensor of `shape` with updates[j...] added at position
    indices[j...] (shape [..., K]); duplicate indices add up, out-of-range
    ones are an error of the run.

    Example:
        >>> @flow.global_function()
        ... def job(i: tp.Numpy.Placeholder((2, 1), dtype=flow.int32), u: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.scatter_nd(i, u, [4])
        >>> job(np.int32([[1], [3]]), np.float32([5, 6])).tolist()
        [0.0, 5.0, 0.0, 6.0]
    """
    _check_index(indices, "scatter_nd")
    _blob(updates, "scatter_nd", "updates")
    shape = _ops._int_list(shape, "scatter_nd")
    ishape, ushape = list(indices.shape), list(updates.shape)
    if not ishape:
        _trace.fail(ValueError, "scatter_nd: indices must have rank >= 1")
    k = ishape[-1]
    lead = ishape[:-1]
    if not 1 <= k <= len(shape) or ushape != lead + shape[k:]:
        _trace.fail(ValueError, f"scatter_nd: updates have shape {tuple(ushape)} but indices "
                    f"{tuple(ishape)} into shape {tuple(shape)} need updates of shape "
                    f"{tuple(lead + shape[k:])}")
    # The K components flattened into one int64 id over shape[:K].
    flat, segments = None, 1
    for c in _b.range(k - 1, -1, -1):
        comp = _slice_dim(indices, len(ishape) - 1, c, c + 1, 1, "scatter_nd")
        comp = _ops.checked_index(comp, shape[c], f"scatter_nd: indices[..., {c}]", "scatter_nd")
        comp = _ops.cast(_ops.reshape(comp, lead), _dtypes.int64)
        if segments != 1:
            comp = _ops.multiply(comp, _ops._scalar(segments, _dtypes.int64, "scatter_nd"))
        flat = comp if flat is None else _ops.add(flat, comp)
        segments *= shape[c]
    out = _segment_sum(updates, flat, 0, 0, segments, "scatter_nd")
    return _ops.reshape(out, shape, name=name)


def unsorted_segment_sum(data: Blob, segment_ids: Blob, num_segments: int, axis: int = 0,
                         name: Optional[str] = None) -> Blob:
    """out[..., s, ...] = sum of data[..., i..., ...] over the i with
    segment_ids[i...] == s; segment_ids index data from `axis`; an id outside
    [0, num_segments) is an error of the run.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,)), s: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.math.unsorted_segment_sum(x, s, num_segments=3)
        >>> job(np.float32([1, 2, 3, 4]), np.int32([0, 2, 0, 2])).tolist()
        [4.0, 0.0, 6.0]
    """
    _blob(data, "unsorted_segment_sum", "data")
    _check_index(segment_ids, "unsorted_segment_sum", "segment_ids")
    axis = _axis(data, axis, "unsorted_segment_sum")
    ds, ids = list(data.shape), list(segment_ids.shape)
    m = len(ids)
    if ds[axis:axis + m] != ids:
        _trace.fail(ValueError, f"unsorted_segment_sum: segment_ids of shape {tuple(ids)} must match dims "
                    f"{axis}.. of data {tuple(ds)}")
    if not _ops._is_int(num_segments) or num_segments < 0:
        _trace.fail(ValueError, f"unsorted_segment_sum: num_segments must be an int >= 0, got {num_segments!r}")
    segment_ids = _ops.checked_index(segment_ids, int(num_segments),
                                     "unsorted_segment_sum: segment_ids", "unsorted_segment_sum")
    out = _segment_sum(data, segment_ids, axis, 0, int(num_segments), "unsorted_segment_sum")
    return _ops.identity(out, name=name) if name else out


def unsorted_segment_sum_like(data: Blob, segment_ids: Blob, like: Blob, axis: int = 0,
                              name: Optional[str] = None) -> Blob:
    """unsorted_segment_sum with num_segments = like.shape[axis].

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,)), s: tp.Numpy.Placeholder((4,), dtype=flow.int32),
        ...         like: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.math.unsorted_segment_sum_like(x, s, like)
        >>> job(np.float32([1, 2, 3, 4]), np.int32([0, 2, 0, 2]), np.zeros(3, np.float32)).tolist()
        [4.0, 0.0, 6.0]
    """
    return unsorted_segment_sum(data, segment_ids, like.shape[axis], axis, name)


# ---------------------------------------------------------------- sorting by comparison

def _last(x, axis, api):
    """x with `axis` moved last, and the permutation that moves it back."""
    r = len(x.shape)
    axis = _axis(x, axis, api)
    if axis == r - 1:
        return x, None
    perm = [d for d in _b.range(r) if d != axis] + [axis]
    inv = [perm.index(d) for d in _b.range(r)]
    return _ops.transpose(x, perm), inv


def _ranks(x, descending):
    """rank of each element along the last dim: the number of elements before
    it in the sorted order (ties in index order), int32.

    The order is numpy's total order: -inf < ... < -0.0 == 0.0 < ... < inf <
    NaN, every NaN equal (so NaNs keep their index order); descending is its
    reverse, NaN first (TensorFlow's top_k)."""
    n = x.shape[-1]
    xi = _ops.expand_dims(x, -1)   # [..., i, 1]
    xj = _ops.expand_dims(x, -2)   # [..., 1, j]
    before = _ops.greater(xj, xi) if descending else _ops.less(xj, xi)
    tie = _ops.equal(xj, xi)
    if x.dtype in _dtypes.FLOATS:
        # Comparisons with NaN are false: NaN (x != x) sorts after every number.
        ni, nj = _ops.not_equal(xi, xi), _ops.not_equal(xj, xj)
        nan_before = _ops.logical_and(nj, _ops.logical_not(ni)) if descending else \
            _ops.logical_and(ni, _ops.logical_not(nj))
        before = _ops.logical_or(before, nan_before)
        tie = _ops.logical_or(tie, _ops.logical_and(ni, nj))
    earlier = _ops.less(_iota([n, n], 1, _dtypes.int32), _iota([n, n], 0, _dtypes.int32))  # j < i
    ahead = _ops.logical_or(before, _ops.logical_and(tie, earlier))
    return _ops.reduce_sum(_ops.cast(ahead, _dtypes.int32), -1)


def _by_rank(rank):
    """out[..., r] = i where rank[..., i] == r (int32)."""
    n, r = rank.shape[-1], len(rank.shape)
    idx = _iota(list(rank.shape), r - 1, _dtypes.int32)
    return _segment_sum(idx, rank, r - 1, r - 1, n, "sort")


def _direction(direction, api):
    d = str(direction).upper()
    if d not in ("ASCENDING", "DESCENDING"):
        _trace.fail(ValueError, f"{api}: direction must be 'ASCENDING' or 'DESCENDING', got {direction!r}")
    return d == "DESCENDING"


def _sorted(x, axis, direction, api, want_values):
    _blob(x, api)
    if not x.shape:
        _trace.fail(ValueError, f"{api}: input must have rank >= 1")
    if x.dtype is _dtypes.bool_:
        _trace.fail(TypeError, f"{api}: cannot sort a bool tensor; cast it first")
    y, inv = _last(x, axis, api)
    order = _by_rank(_ranks(y, _direction(direction, api)))
    if want_values:
        # A gather moves the values exactly (NaN, infinities and -0.0 too).
        r = len(y.shape)
        order = _ops.make(K.gather, [y, order], {"axis": r - 1, "batch_dims": r - 1}, api=api)
    return order if inv is None else _ops.transpose(order, inv)


def sort(input: Blob, axis: int = -1, direction: str = "ASCENDING", name: Optional[str] = None) -> Blob:
    """input sorted along `axis` (ties keep their order).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.sort(x, direction="DESCENDING")
        >>> job(np.float32([3, 1, 4, 2])).tolist()
        [4.0, 3.0, 2.0, 1.0]
    """
    out = _sorted(input, axis, direction, "sort", True)
    return _ops.identity(out, name=name) if name else out


def argsort(input: Blob, axis: int = -1, direction: str = "ASCENDING", name: Optional[str] = None) -> Blob:
    """int32 indices that sort input along `axis` (stable).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.argsort(x)
        >>> job(np.float32([3, 1, 4, 2])).tolist()
        [1, 3, 0, 2]
    """
    out = _sorted(input, axis, direction, "argsort", False)
    return _ops.identity(out, name=name) if name else out


def top_k(input: Blob, axis: int = -1, k: int = 1, sorted: bool = True,  # noqa: A002 - OneFlow's names
          name: Optional[str] = None) -> Blob:
    """int32 indices of the k largest entries along `axis`, largest first, ties
    in index order (OneFlow's top_k returns the indices); a k larger than the
    axis gives all of them. Note OneFlow's argument order: top_k(x, axis, k).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.math.top_k(x, k=2)
        >>> job(np.float32([3, 1, 4, 2])).tolist()
        [2, 0]
    """
    _blob(input, "top_k")
    if not input.shape:
        _trace.fail(ValueError, "top_k: input must have rank >= 1")
    if not _ops._is_int(axis):
        _trace.fail(TypeError, f"top_k: axis must be an int, got {axis!r}")
    r = len(input.shape)
    if not -r <= axis < r:
        _trace.fail(ValueError, f"top_k: axis {axis} is out of range for a rank-{r} input (expected {-r} <= "
                    f"axis < {r}; the signature is top_k(input, axis=-1, k=1, sorted=True))")
    if not _ops._is_int(k) or k < 0:
        _trace.fail(ValueError, f"top_k: k must be an int >= 0, got {k!r}")
    ax = axis % r
    y, inv = _last(input, ax, "top_k")
    idx = _sorted(y, -1, "DESCENDING", "top_k", False)
    out = _slice_dim(idx, r - 1, 0, _b.min(int(k), y.shape[-1]), 1, "top_k")
    if inv is not None:
        out = _ops.transpose(out, inv)
    return _ops.identity(out, name=name) if name else out


def in_top_k(targets: Blob, predictions: Blob, k: int, name: Optional[str] = None) -> Blob:
    """Whether predictions[i, targets[i]] is among the k largest of row i
    (ties with the k-th count as in), bool [N]. As in OneFlow and TensorFlow,
    a row with a non-finite prediction (NaN or infinity) or a target outside
    [0, C) gives False.

    Example:
        >>> @flow.global_function()
        ... def job(t: tp.Numpy.Placeholder((2,), dtype=flow.int32), p: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.math.in_top_k(t, p, k=2)
        >>> job(np.int32([0, 1]), np.float32([[0.1, 0.5, 0.4], [0.2, 0.7, 0.1]])).tolist()
        [False, True]
    """
    _check_index(targets, "in_top_k", "targets")
    _blob(predictions, "in_top_k", "predictions")
    if len(predictions.shape) != 2 or list(targets.shape) != [predictions.shape[0]]:
        _trace.fail(ValueError, f"in_top_k: predictions must be [N, C] and targets [N], got "
                    f"{tuple(predictions.shape)} and {tuple(targets.shape)}")
    if not _ops._is_int(k):
        _trace.fail(TypeError, f"in_top_k: k must be an int, got {k!r}")
    c = predictions.shape[1]
    valid = _ops.logical_and(_ops.greater_equal(targets, _ops._scalar(0, targets.dtype, "in_top_k")),
                             _ops.less(targets, _ops._scalar(c, targets.dtype, "in_top_k")))
    # NaN < inf is false: a row is finite where every |prediction| < inf.
    finite = _ops.reduce_min(_ops.cast(_ops.less(_ops.abs(predictions), float("inf")), _dtypes.int32), [1])
    valid = _ops.logical_and(valid, _ops.equal(finite, _ops._scalar(1, _dtypes.int32, "in_top_k")))
    # Targets outside [0, C) are documented as "not in the top k" (valid is
    # false there): this gather reads them clamped instead of checking them.
    t = _ops.make(K.gather, [predictions, targets], {"axis": 1, "batch_dims": 1}, api="in_top_k")
    above = _ops.greater(predictions, _ops.expand_dims(t, -1))
    count = _ops.reduce_sum(_ops.cast(above, _dtypes.int32), -1)
    out = _ops.logical_and(valid, _ops.less(count, _ops._scalar(int(k), _dtypes.int32, "in_top_k")))
    return _ops.identity(out, name=name) if name else out


# ---------------------------------------------------------------- state

def assign(ref: Blob, value: Blob, dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> None:
    """Writes value into the variable `ref` when the job runs (after every
    read of its old value).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     v = flow.get_variable("v", shape=(2,), initializer=flow.zeros_initializer())
        ...     old = flow.identity(v)
        ...     flow.assign(v, x)
        ...     return old
        >>> job(np.float32([1, 2])).tolist(), job(np.float32([3, 4])).tolist()
        ([0.0, 0.0], [1.0, 2.0])
    """
    b = _trace.require_builder("flow.assign")
    _blob(ref, "assign", "ref")
    _blob(value, "assign", "value")
    if ref._node.op != K.variable:
        _trace.fail(TypeError, f"assign: ref must be a variable (flow.get_variable), got the result of "
                    f"{ref._node.op_name}")
    if tuple(value.shape) != tuple(ref.shape):
        value = _ops.broadcast_to(value, list(ref.shape))
    if value.dtype is not ref.dtype:
        value = _ops.cast(value, ref.dtype)
    try:
        b.effects.append(_C.make_node(K.assign, [ref._node, value._node], {}))
    except (TypeError, ValueError) as e:
        _trace.fail(type(e), str(e))


# ---------------------------------------------------------------- OneFlow's other array ops
#
# Compositions of the views and elementwise ops above, so each gets its
# gradient, fusion and distribution from its parts.

def broadcast_to_compatible_with(x: Blob, compatible: Sequence[Blob], name: Optional[str] = None) -> Blob:
    """x broadcast (numpy rules) to the shape that x and every blob of
    `compatible` broadcast to together (only their shapes are read).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2)), y: tp.Numpy.Placeholder((3, 1))) -> tp.Numpy:
        ...     return flow.broadcast_to_compatible_with(x, [y])
        >>> job(np.float32([[1, 2]]), np.zeros((3, 1), np.float32)).tolist()
        [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]
    """
    api = "broadcast_to_compatible_with"
    _blob(x, api, "x")
    if isinstance(compatible, Blob) or not isinstance(compatible, (list, tuple)):
        _trace.fail(TypeError, f"{api}: compatible must be a list of Blobs, got {type(compatible).__name__}")
    shape = list(x.shape)
    for i, c in enumerate(compatible):
        _blob(c, api, f"compatible[{i}]")
        other = list(c.shape)
        r = max(len(shape), len(other))
        a, b = [1] * (r - len(shape)) + shape, [1] * (r - len(other)) + other
        out = []
        for d, (p, q) in enumerate(zip(a, b)):
            if p != q and 1 not in (p, q):
                _trace.fail(ValueError, f"{api}: shape {tuple(shape)} and compatible[{i}]'s shape {tuple(other)} "
                            f"do not broadcast (dim {d}: {p} vs {q})")
            out.append(q if p == 1 else p)
        shape = out
    if shape == list(x.shape):
        return _ops.identity(x, name=name)
    return _ops.broadcast_to(x, shape, name=name)


def _scatter_checks(params, indices, updates, api):
    _blob(params, api, "params")
    _check_index(indices, api)
    _blob(updates, api, "updates")
    if updates.dtype is not params.dtype:
        _trace.fail(TypeError, f"{api}: updates are {updates.dtype.name} but params are {params.dtype.name}")


def tensor_scatter_nd_add(params: Blob, indices: Blob, updates: Blob, name: Optional[str] = None) -> Blob:
    """params with updates[j...] added at position indices[j...] (shape
    [..., K]); duplicate indices add up; an out-of-range index is an error
    of the run.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), i: tp.Numpy.Placeholder((2, 1), dtype=flow.int32),
        ...         u: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.tensor_scatter_nd_add(x, i, u)
        >>> job(np.float32([1, 1, 1]), np.int32([[0], [0]]), np.float32([5, 6])).tolist()
        [12.0, 1.0, 1.0]
    """
    api = "tensor_scatter_nd_add"
    _scatter_checks(params, indices, updates, api)
    s = scatter_nd(indices, updates, list(params.shape))
    return _ops.add(params, s, name=name)


def tensor_scatter_nd_update(params: Blob, indices: Blob, updates: Blob, name: Optional[str] = None) -> Blob:
    """params with the slice at indices[j...] replaced by updates[j...]
    (indices of shape [..., K]); where an index repeats, the last of its
    updates (in row-major order of indices) is written. The gradient goes to
    params where nothing was written and to each written update.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), i: tp.Numpy.Placeholder((2, 1), dtype=flow.int32),
        ...         u: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.tensor_scatter_nd_update(x, i, u)
        >>> job(np.float32([1, 1, 1]), np.int32([[2], [0]]), np.float32([5, 6])).tolist()
        [6.0, 1.0, 5.0]
    """
    api = "tensor_scatter_nd_update"
    _scatter_checks(params, indices, updates, api)
    ishape = list(indices.shape)
    if not ishape:
        _trace.fail(ValueError, f"{api}: indices must have rank >= 1")
    k = ishape[-1]
    n = 1
    for d in ishape[:-1]:
        n *= d
    flat = _ops.reshape(indices, [n, k])
    if n > 1:
        # keep[j]: no later row j' > j has the same index (so the last one wins)
        same = _ops.reduce_min(_ops.cast(_ops.equal(_ops.expand_dims(flat, 1), _ops.expand_dims(flat, 0)),
                                         _dtypes.int32), [2])                    # [j, j']
        later = _ops.greater(_iota([n, n], 1, _dtypes.int32), _iota([n, n], 0, _dtypes.int32))
        shadowed = _ops.reduce_max(_ops.cast(_ops.logical_and(_ops.equal(same, 1), later), _dtypes.int32), [1])
        keep = _ops.reshape(_ops.equal(shadowed, 0), ishape[:-1])
    else:
        keep = _ops.constant(True, _dtypes.bool_, ishape[:-1])
    ushape = list(updates.shape)
    keep_u = _ops.reshape(keep, ishape[:-1] + [1] * (len(ushape) - len(ishape) + 1))
    zero = _ops._scalar(0, updates.dtype, api)
    written = scatter_nd(indices, _ops.where(keep_u, updates, zero), list(params.shape))
    hit = scatter_nd(indices, _ops.broadcast_to(_ops.cast(keep_u, _dtypes.int32), ushape), list(params.shape))
    return _ops.where(_ops.greater(hit, 0), written, params, name=name)


def zero_pad2d(x: Blob, padding: Union[int, Sequence[int]], name: Optional[str] = None) -> Blob:
    """NCHW x padded with zeros by padding = [left, right, top, bottom] (an
    int pads all four sides).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 1, 1))) -> tp.Numpy:
        ...     return flow.zero_pad2d(x, 1)
        >>> job(np.float32([[[[5]]]])).tolist()
        [[[[0.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 0.0]]]]
    """
    return pad(x, _pad2d(x, padding, "zero_pad2d"), 0, "constant", name)


def same_padding(x: Blob, padding: str, data_format: str, kernel_size: Sequence[int], strides: Sequence[int],
                 dilation_rate: Sequence[int], name: Optional[str] = None) -> Blob:
    """x zero-padded so that a convolution with these kernel sizes, strides
    and dilations gives ceil(in / stride) outputs per spatial dim; the odd
    pixel goes after ("SAME_UPPER") or before ("SAME_LOWER").

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 4, 4))) -> tp.Numpy:
        ...     return flow.same_padding(x, "SAME_UPPER", "NCHW", kernel_size=[3, 3], strides=[1, 1],
        ...                              dilation_rate=[1, 1])
        >>> job(np.ones((1, 1, 4, 4), np.float32)).shape
        (1, 1, 6, 6)
    """
    api = "same_padding"
    _blob(x, api, "x")
    mode = str(padding).upper()
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        _trace.fail(ValueError, f"{api}: padding must be 'SAME_UPPER' or 'SAME_LOWER', got {padding!r}")
    nsp = len(x.shape) - 2
    if nsp < 1:
        _trace.fail(ValueError, f"{api}: x must have a batch, a channel and spatial dims, got shape {tuple(x.shape)}")
    lists = {}
    for what, v in (("kernel_size", kernel_size), ("strides", strides), ("dilation_rate", dilation_rate)):
        v = _ops._int_list(v, api, what)
        if len(v) != nsp or any(e < 1 for e in v):
            _trace.fail(ValueError, f"{api}: {what} must be {nsp} positive ints (one per spatial dim), got {v}")
        lists[what] = v
    first = 2 if str(data_format).upper().startswith("NC") else 1
    pairs = [(0, 0)] * len(x.shape)
    for i in _b.range(nsp):
        n = x.shape[first + i]
        k, s, d = lists["kernel_size"][i], lists["strides"][i], lists["dilation_rate"][i]
        out = (n + s - 1) // s
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        lo = total // 2 if mode == "SAME_UPPER" else total - total // 2
        pairs[first + i] = (lo, total - lo)
    return pad(x, pairs, 0, "constant", name)


def reshape_like(x: Blob, like: Blob, name: Optional[str] = None) -> Blob:
    """x reshaped to like's shape (the sizes must agree; like's values are not read).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,)), like: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.reshape_like(x, like)
        >>> job(np.float32([1, 2, 3, 4]), np.zeros((2, 2), np.float32)).tolist()
        [[1.0, 2.0], [3.0, 4.0]]
    """
    _blob(x, "reshape_like", "x")
    _blob(like, "reshape_like", "like")
    return _ops.reshape(x, list(like.shape), name=name)


def reverse(input: Blob, axis: Union[int, Sequence[int]], name: Optional[str] = None) -> Blob:
    """input with the order of its elements reversed along each axis of `axis`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.reverse(x, axis=1)
        >>> job(np.float32([[1, 2, 3], [4, 5, 6]])).tolist()
        [[3.0, 2.0, 1.0], [6.0, 5.0, 4.0]]
    """
    x = _blob(input, "reverse")
    axes = _ops._int_list(axis, "reverse", "axis")
    tups = [(None, None, None)] * len(x.shape)
    for a in axes:
        tups[_axis(x, a, "reverse")] = (None, None, -1)
    return slice_v2(x, tups, name=name)


def dim_gather(input: Blob, dim: int, index: Blob, name: Optional[str] = None) -> Blob:
    """out[i...] = input[i...] with coordinate `dim` replaced by index[i...]
    (numpy.take_along_axis; index has input's rank and extents no larger
    than input's); an index outside input's dim is an error of the run.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3)), i: tp.Numpy.Placeholder((2, 1), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.dim_gather(x, 1, i)   # x[r, i[r, 0]] for each row r
        >>> job(np.float32([[1, 2, 3], [4, 5, 6]]), np.int32([[2], [0]])).tolist()
        [[3.0], [4.0]]
    """
    api = "dim_gather"
    x = _blob(input, api)
    _check_index(index, api, "index")
    r = len(x.shape)
    dim = _axis(x, dim, api, what="dim")
    ishape = list(index.shape)
    if len(ishape) != r or any(ishape[d] > x.shape[d] for d in _b.range(r) if d != dim):
        _trace.fail(ValueError, f"{api}: index of shape {tuple(ishape)} must have the rank of input "
                    f"{tuple(x.shape)} and no larger extents outside dim {dim}")
    idx = _ops.checked_index(index, x.shape[dim], f"{api}: index", api)
    coords = [idx if d == dim else _iota(ishape, d, index.dtype) for d in _b.range(r)]
    return _ops.make(K.gather_nd, [x, stack(coords, axis=r)], name=name, api=api)


def identity_n(inputs: Sequence[Blob], name: Optional[str] = None) -> List[Blob]:
    """A copy of each blob of `inputs`, as a list.

    Example:
        >>> @flow.global_function()
        ... def job(a: tp.Numpy.Placeholder((1,)), b: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     c, d = flow.identity_n([a, b])
        ...     return c + d
        >>> job(np.float32([1]), np.float32([2])).tolist()
        [3.0]
    """
    if isinstance(inputs, Blob) or not isinstance(inputs, (list, tuple)):
        _trace.fail(TypeError, f"identity_n: inputs must be a list of Blobs, got {type(inputs).__name__}")
    return [_ops.identity(_blob(x, "identity_n", f"inputs[{i}]")) for i, x in enumerate(inputs)]


def amp_white_identity(x: Blob, name: Optional[str] = None) -> Blob:
    """x unchanged: OneFlow marks with it a value mixed precision may run in
    half precision. flowjit's pass decides from the ops themselves (matmuls
    and convolutions, and the elementwise ops fed by them), so the mark
    changes nothing.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.amp_white_identity(x)
        >>> job(np.float32([1, 2])).tolist()
        [1.0, 2.0]
    """
    return _ops.identity(_blob(x, "amp_white_identity", "x"), name=name)


def elem_cnt(inputs: Blob, dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> Blob:
    """The number of elements of `inputs`, a shape (1,) blob (int32 unless
    dtype is given).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.elem_cnt(x)
        >>> job(np.zeros((2, 3), np.float32)).tolist()
        [6]
    """
    return reduced_shape_elem_cnt(inputs, None, dtype, name)


def reduced_shape_elem_cnt(input_blob: Blob, axis: Optional[Sequence[int]] = None,
                           dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> Blob:
    """The product of input_blob's extents along `axis` (all when None), a
    shape (1,) blob (int32 unless dtype is given).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3, 4))) -> tp.Numpy:
        ...     return flow.math.reduced_shape_elem_cnt(x, axis=[1, 2])
        >>> job(np.zeros((2, 3, 4), np.float32)).tolist()
        [12]
    """
    x = _blob(input_blob, "reduced_shape_elem_cnt", "input_blob")
    axes = _b.range(len(x.shape)) if axis is None else \
        [_axis(x, a, "reduced_shape_elem_cnt") for a in _ops._int_list(axis, "reduced_shape_elem_cnt", "axis")]
    n = 1
    for a in set(axes):
        n *= x.shape[a]
    d = _ops._dtype(dtype, "elem_cnt") if dtype is not None else _dtypes.int32
    return _ops.constant(n, d, [1], name)


def _not_finite(x, api):
    _blob(x, api, "x")
    if x.dtype not in _dtypes.FLOATS:
        _trace.fail(TypeError, f"{api}: x must be a floating-point blob, got {x.dtype.name}")
    # NaN < inf is false, so this counts NaNs and both infinities.
    bad = _ops.logical_not(_ops.less(_ops.abs(x), float("inf")))
    return _ops.reduce_sum(_ops.cast(bad, _dtypes.int64), list(_b.range(len(x.shape))), keepdims=False)


def count_not_finite(x: Blob, name: Optional[str] = None) -> Blob:
    """The number of NaNs and infinities in x, an int64 blob of shape (1,).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.count_not_finite(x)
        >>> job(np.float32([1, np.nan, np.inf])).tolist()
        [2]
    """
    out = _ops.reshape(_not_finite(x, "count_not_finite"), [1])
    return _ops.identity(out, name=name) if name else out


def multi_count_not_finite(x: Optional[Sequence[Blob]] = None, name: Optional[str] = None) -> Blob:
    """The number of NaNs and infinities in all the blobs of x together, an
    int64 blob of shape (1,).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,)), y: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.multi_count_not_finite([x, y])
        >>> job(np.float32([1, np.nan]), np.float32([-np.inf, 2])).tolist()
        [2]
    """
    if isinstance(x, Blob) or not isinstance(x, (list, tuple)) or not x:
        _trace.fail(TypeError, "multi_count_not_finite: x must be a non-empty list of Blobs")
    total = None
    for i, v in enumerate(x):
        c = _ops.reshape(_not_finite(_blob(v, "multi_count_not_finite", f"x[{i}]"), "multi_count_not_finite"), [1])
        total = c if total is None else _ops.add(total, c)
    return _ops.identity(total, name=name) if name else total


def diag(input: Blob, diagonal: int = 0, name: Optional[str] = None) -> Blob:
    """For a vector: the square matrix with input on its `diagonal`-th
    diagonal (above the main one when > 0) and zeros elsewhere. For a
    matrix: the vector of its `diagonal`-th diagonal.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.diag(x)
        >>> job(np.float32([1, 2])).tolist()
        [[1.0, 0.0], [0.0, 2.0]]
    """
    x = _blob(input, "diag")
    if not _ops._is_int(diagonal):
        _trace.fail(TypeError, f"diag: diagonal must be an int, got {diagonal!r}")
    d = int(diagonal)
    if len(x.shape) == 1:
        n = x.shape[0]
        m = n + _b.abs(d)
        col = _raw_pad(x, [0], [m - n], 0, "diag")
        # d >= 0: out[i, i + d] = x[i] (x along rows); d < 0: out[j - d, j] = x[j] (along columns)
        src = _ops.reshape(col, [m, 1] if d >= 0 else [1, m])
        on = _ops.equal(_ops.subtract(_iota([m, m], 1, _dtypes.int64), _iota([m, m], 0, _dtypes.int64)), d)
        zero = _ops._scalar(0, x.dtype, "diag")
        return _ops.where(on, _ops.broadcast_to(src, [m, m]), zero, name=name)
    if len(x.shape) == 2:
        r, c = x.shape
        n = _b.max(0, _b.min(r, c - d) if d >= 0 else _b.min(r + d, c))
        flat = _ops.reshape(x, [r * c])
        begin = d if d >= 0 else -d * c
        if n == 0:
            return _ops.zeros([0], x.dtype, name=name)
        return _raw_slice(flat, [begin], [c + 1], [n], "diag") if name is None else \
            _ops.identity(_raw_slice(flat, [begin], [c + 1], [n], "diag"), name=name)
    _trace.fail(ValueError, f"diag: input must be a vector or a matrix, got shape {tuple(x.shape)}")


def _dynamic_shape(api):
    _trace.fail(NotImplementedError, f"{api}: the result's shape depends on the values of the input "
                "(a dynamic blob in OneFlow); flowjit compiles every blob with a static shape and "
                "has no dynamic blobs")


def argwhere(condition: Blob, dtype: Optional[DTypeLike] = None, name: Optional[str] = None) -> Blob:
    """Not supported: the coordinates of condition's nonzero elements form a
    blob whose shape depends on the data, which flowjit cannot compile.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.argwhere(x)
        >>> job(np.float32([0, 1]))
        Traceback (most recent call last):
        NotImplementedError: ...
    """
    _dynamic_shape("argwhere")


def nonzero(a: Blob, name: Optional[str] = None) -> Blob:
    """Not supported: the indices of a's nonzero elements form a blob whose
    shape depends on the data, which flowjit cannot compile.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.nonzero(x)
        >>> job(np.float32([0, 1]))
        Traceback (most recent call last):
        NotImplementedError: ...
    """
    _dynamic_shape("nonzero")


def _micro_batches(api):
    _trace.fail(NotImplementedError, f"{api}: OneFlow runs the ops after it once per micro-batch (a "
                "piece of the batch axis); flowjit would need to evaluate that part of the job once "
                "per piece, which it cannot yet")


# repeat/acc: OneFlow runs the ops between them once per micro-batch step
# (repeat_num steps, each seeing the same input) and acc sums the steps. With
# deterministic ops in between every step computes the same value, so the
# sum is acc_num times one step; a random op in between would draw anew at
# each step, which one evaluation cannot reproduce, so acc refuses it.
_RANDOM_OPS = (K.random_uniform, K.random_normal, K.truncated_normal, K.random_uniform_at)


def _repeats(b):
    """The job's repeat outputs: a list of (node, repeat_num)."""
    return b._counts.setdefault("repeat_nodes", [])


def repeat(input: Blob, repeat_num: int, name: Optional[str] = None) -> Blob:
    """input handed to `repeat_num` micro-batch steps of the ops that follow,
    up to an acc(..., repeat_num), which sums them (OneFlow's time axis).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.acc(flow.repeat(x, 3) * 2, 3)   # three steps of x * 2, summed
        >>> job(np.float32([1, 2])).tolist()
        [6.0, 12.0]
    """
    x = _blob(input, "repeat")
    if not _ops._is_int(repeat_num) or repeat_num < 1:
        _trace.fail(ValueError, f"repeat: repeat_num must be an int >= 1, got {repeat_num!r}")
    out = _ops.identity(x, name=name)
    _repeats(_trace.require_builder("flow.repeat")).append((out._node, int(repeat_num)))
    return out


def acc(one: Blob, max_acc_num: int, name: Optional[str] = None) -> Blob:
    """The sum of `one` over the max_acc_num micro-batch steps that a
    repeat(..., max_acc_num) upstream of it started: max_acc_num times one
    step's value, since the ops in between are deterministic (a random op
    between repeat and acc raises NotImplementedError).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.acc(flow.repeat(x, 4), 4)
        >>> job(np.float32([1, 2])).tolist()
        [4.0, 8.0]
    """
    x = _blob(one, "acc", "one")
    if not _ops._is_int(max_acc_num) or max_acc_num < 1:
        _trace.fail(ValueError, f"acc: max_acc_num must be an int >= 1, got {max_acc_num!r}")
    reps = _repeats(_trace.require_builder("flow.acc"))
    found, seen, todo = set(), [], [x._node]
    while todo:
        node = todo.pop()
        if any(node.same(s) for s in seen):
            continue
        seen.append(node)
        hit = [n for r, n in reps if node.same(r)]
        if hit:
            found.update(hit)
            continue
        if node.op in _RANDOM_OPS:
            _trace.fail(NotImplementedError, f"acc: a random op ({node.op_name}) lies between repeat and "
                        "acc; OneFlow draws it anew at each micro-batch step, and flowjit evaluates the "
                        "steps once")
        todo.extend(node.inputs)
    if not found:
        _trace.fail(ValueError, "acc: its input does not come from a flow.repeat, so there are no "
                    "micro-batch steps to accumulate")
    if found != {int(max_acc_num)}:
        _trace.fail(ValueError, f"acc: max_acc_num {max_acc_num} differs from the repeat_num "
                    f"{sorted(found)} of the repeat upstream")
    return _ops.multiply(x, _ops._scalar(int(max_acc_num), x.dtype, "acc"), name=name)


def pack(input: Blob, pack_num: int, name: Optional[str] = None) -> Blob:
    """Not supported: OneFlow's pack joins `pack_num` micro-batch executions'
    pieces, which flowjit does not have.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.pack(x, 2)
        >>> job(np.float32([0, 1]))
        Traceback (most recent call last):
        NotImplementedError: ...
    """
    _micro_batches("pack")


def unpack(input: Blob, unpack_num: int, name: Optional[str] = None) -> Blob:
    """Not supported: OneFlow's unpack splits its input over `unpack_num`
    micro-batch executions, which flowjit does not have.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.unpack(x, 2)
        >>> job(np.float32([0, 1]))
        Traceback (most recent call last):
        NotImplementedError: ...
    """
    _micro_batches("unpack")


def unsorted_batch_segment_sum(data: Blob, segment_ids: Blob, num_segments: int,
                               name: Optional[str] = None) -> Blob:
    """unsorted_segment_sum within each batch: segment_ids of shape [B..., N]
    index the axis after data's batch axes [B...]; the result is
    [B..., num_segments, rest...]. An id outside [0, num_segments) is an
    error of the run.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 3)), s: tp.Numpy.Placeholder((1, 3), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.math.unsorted_batch_segment_sum(x, s, num_segments=2)
        >>> job(np.float32([[1, 2, 3]]), np.int32([[1, 0, 1]])).tolist()
        [[2.0, 4.0]]
    """
    api = "unsorted_batch_segment_sum"
    _blob(data, api, "data")
    _check_index(segment_ids, api, "segment_ids")
    ids, ds = list(segment_ids.shape), list(data.shape)
    k = len(ids)
    if k < 1 or ds[:k] != ids:
        _trace.fail(ValueError, f"{api}: segment_ids of shape {tuple(ids)} must match the leading dims of "
                    f"data {tuple(ds)}")
    if not _ops._is_int(num_segments) or num_segments < 0:
        _trace.fail(ValueError, f"{api}: num_segments must be an int >= 0, got {num_segments!r}")
    segment_ids = _ops.checked_index(segment_ids, int(num_segments), f"{api}: segment_ids", api)
    out = _segment_sum(data, segment_ids, k - 1, k - 1, int(num_segments), api)
    return _ops.identity(out, name=name) if name else out


def pad_grad(x: Blob, paddings: Sequence[Any], constant_value: float = 0, name: Optional[str] = None) -> Blob:
    """The gradient of pad: x (the padded blob's gradient) with
    paddings[d] = (before, after) elements cut off each dim d.

    Example:
        >>> @flow.global_function()
        ... def job(g: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.pad_grad(g, [(1, 2)])
        >>> job(np.float32([1, 2, 3, 4])).tolist()
        [2.0]
    """
    x = _blob(x, "pad_grad")
    pairs = _pairs(paddings, len(x.shape), "pad_grad")
    begin, shape = [], []
    for d, (lo, hi) in enumerate(pairs):
        if lo + hi > x.shape[d]:
            _trace.fail(ValueError, f"pad_grad: paddings ({lo}, {hi}) of dim {d} exceed its extent {x.shape[d]}")
        begin.append(lo)
        shape.append(x.shape[d] - lo - hi)
    return _ops.make(K.slice, [x], {"begin": begin, "step": [1] * len(shape), "shape": shape}, name=name,
                     api="pad_grad")


def dynamic_reshape(x: Blob, shape: Sequence[int], name: Optional[str] = None) -> Blob:
    """x reshaped to `shape` (one extent may be -1). OneFlow's dynamic blobs
    take their concrete shape here: a job compiles once per concrete input
    shape, so this is reshape.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.dynamic_reshape(x, [-1])
        >>> job(np.float32([[1, 2, 3], [4, 5, 6]])).tolist()
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    """
    return _ops.reshape(_blob(x, "dynamic_reshape", "x"), shape, name=name)


def categorical_ordinal_encode(table: Blob, size: Blob, input_tensor: Blob, hash_precomputed: bool = True,
                               name: Optional[str] = None) -> Blob:
    """The ordinal of each element of input_tensor: 1, 2, ... for distinct
    values in the order they first appear (across runs), 0 for 0; `table`
    (2 * capacity,) and `size` (1,) are the encoder's state variables (see
    flowjit._ops.encode).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,), dtype=flow.int64)) -> tp.Numpy:
        ...     table = flow.get_variable("table", shape=(16,), dtype=flow.int64, initializer=flow.zeros_initializer(),
        ...                               trainable=False)
        ...     size = flow.get_variable("size", shape=(1,), dtype=flow.int64, initializer=flow.zeros_initializer(),
        ...                              trainable=False)
        ...     return flow.categorical_ordinal_encode(table, size, x)
        >>> job(np.int64([9, 4, 9])).tolist(), job(np.int64([4, 6, 0])).tolist()
        ([1, 2, 1], [2, 3, 0])
    """
    from . import encode as _encode
    return _encode.categorical_ordinal_encode(table, size, input_tensor, hash_precomputed, name)
