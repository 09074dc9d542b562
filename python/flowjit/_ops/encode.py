"""OneFlow's categorical ordinal encoder: each distinct input value gets an
ordinal 1, 2, 3, ... in the order the values first appear, over all runs of
the jobs sharing the encoder's table; 0 stays 0.

OneFlow's kernel walks the inputs one by one through an open-addressing hash
table. flowjit has no sequential kernel, so the table is a sorted array and a
run is a fixed sequence of data-parallel steps over the n inputs (padded to
P, a power of two) and the table's C slots:

  1. sort (value, position) pairs: a bitonic network, log2(P)^2 / 2 stages
     of compare-and-swap between two views of the array (no gathers);
  2. look each sorted value up in the table (binary search: log2(C) gathers);
     a value not found, not 0, at the start of its run of equal values is
     new, and that entry holds its first position;
  3. mark the first occurrences of new values in input order (binary search
     of each input in the sorted values) and number them by a prefix sum:
     the k-th new value in order of appearance gets ordinal size + k;
  4. compact the new values in sorted order (binary search in the prefix sum
     of the marks) and merge them with the table (merge path: for each slot
     q, a binary search for how many old entries precede it);
  5. write the merged table and the new size back (flow.assign).

Work per run: O(P log^2 P + C log C) with small constants, all of it in
generated loops. The table variable keeps OneFlow's shape (2 * capacity,)
and dtype; its layout is ours: (key, ordinal) pairs sorted by key in the
first `size` slots, zeros after. A run that would need more than `capacity`
keys fails with an IndexError, where OneFlow's kernel aborts.
"""
from typing import Optional

import numpy as np

from .. import _C
from . import array as _array, builders as _ops
from .._core import dtypes as _dtypes, trace as _trace
from .._core.blob import Blob

K = _C.OpKind
_I = _dtypes.int32  # positions and counts


def _gather(params, index):
    """params[index] along axis 0, indices clamped into range (the callers'
    indices are in range wherever the result is used)."""
    return _ops.make(K.gather, [params, index], {"axis": 0, "batch_dims": 0}, api="categorical_ordinal_encode")


def _int(v, dtype=_I):
    return _ops._scalar(v, dtype, "categorical_ordinal_encode")


def _shift(x, d, fill):
    """y[k] = x[k - d] for k >= d, `fill` before (1-D)."""
    n = x.shape[0]
    if d >= n:
        return _ops.broadcast_to(_int(fill, x.dtype), [n])
    return _array._raw_pad(_array._slice_dim(x, 0, 0, n - d), [d], [0], fill, "categorical_ordinal_encode")


def _cumsum(x):
    """Inclusive prefix sum of a 1-D int blob (Hillis-Steele, log2 n steps)."""
    d = 1
    while d < x.shape[0]:
        x = _ops.add(x, _shift(x, d, 0))
        d *= 2
    return x


def _lower_bound(sorted_keys, keys, lo, hi, span):
    """The first position p in [lo, hi) with sorted_keys[p] >= keys (hi if
    none), per element: a binary search of span.bit_length() halvings, where
    span bounds hi - lo."""
    one = _int(1)
    for _ in range(max(1, int(span).bit_length())):
        active = _ops.less(lo, hi)
        mid = _ops.divide(_ops.add(lo, hi), _int(2))
        right = _ops.less(_gather(sorted_keys, mid), keys)
        lo = _ops.where(_ops.logical_and(active, right), _ops.add(mid, one), lo)
        hi = _ops.where(_ops.logical_and(active, _ops.logical_not(right)), mid, hi)
    return lo


def _sort_pairs(x, i):
    """(x, i) sorted by x, then i: a bitonic sorting network over P = 2^m
    entries. Each merge starts with a 'flip' stage (entry t of a block meets
    entry k-1-t), so all compare-and-swaps point the same way."""
    p = x.shape[0]

    def swap(xa, ia, xb, ib):
        s = _ops.logical_or(_ops.less(xb, xa), _ops.logical_and(_ops.equal(xb, xa), _ops.less(ib, ia)))
        return (_ops.where(s, xb, xa), _ops.where(s, ib, ia), _ops.where(s, xa, xb), _ops.where(s, ia, ib))

    def rev(v):
        return _array._slice_dim(v, 1, None, None, -1, "categorical_ordinal_encode")

    k = 2
    while k <= p:
        h = k // 2
        xv, iv = _ops.reshape(x, [p // k, k]), _ops.reshape(i, [p // k, k])
        lx, li, hx, hi = swap(_array._slice_dim(xv, 1, 0, h), _array._slice_dim(iv, 1, 0, h),
                              rev(_array._slice_dim(xv, 1, h, k)), rev(_array._slice_dim(iv, 1, h, k)))
        x = _ops.reshape(_array.concat([lx, rev(hx)], axis=1), [p])
        i = _ops.reshape(_array.concat([li, rev(hi)], axis=1), [p])
        j = k // 4
        while j >= 1:
            xv, iv = _ops.reshape(x, [p // (2 * j), 2, j]), _ops.reshape(i, [p // (2 * j), 2, j])
            lx, li, hx, hi = swap(_array._slice_dim(xv, 1, 0, 1), _array._slice_dim(iv, 1, 0, 1),
                                  _array._slice_dim(xv, 1, 1, 2), _array._slice_dim(iv, 1, 1, 2))
            x = _ops.reshape(_array.concat([lx, hx], axis=1), [p])
            i = _ops.reshape(_array.concat([li, hi], axis=1), [p])
            j //= 2
        k *= 2
    return x, i


def categorical_ordinal_encode(table: Blob, size: Blob, input_tensor: Blob, hash_precomputed: bool = True,
                               name: Optional[str] = None) -> Blob:
    """The ordinal of each element of input_tensor (int32 or int64): 1, 2,
    ... for distinct values in the order they first appear, across runs,
    and 0 for 0. `table` (shape (2 * capacity,)) and `size` (shape (1,)),
    variables of the input's dtype initialized to 0, hold the encoder's
    state; the run updates them. More than `capacity` distinct values is an
    error of the run. hash_precomputed must be True (as in OneFlow)."""
    api = "categorical_ordinal_encode"
    for what, v in (("table", table), ("size", size), ("input_tensor", input_tensor)):
        if not isinstance(v, Blob):
            _trace.fail(TypeError, f"{api}: {what} must be a Blob, got {type(v).__name__}")
    for what, v in (("table", table), ("size", size)):
        if v._node.op != K.variable:
            _trace.fail(TypeError, f"{api}: {what} must be a variable (flow.get_variable), got the result "
                        f"of {v._node.op_name}")
    dt = input_tensor.dtype
    if dt not in (_dtypes.int32, _dtypes.int64):
        _trace.fail(TypeError, f"{api}: input_tensor must be int32 or int64, got {dt!r}")
    if table.dtype is not dt or size.dtype is not dt:
        _trace.fail(TypeError, f"{api}: table ({table.dtype!r}) and size ({size.dtype!r}) must have the "
                    f"input's dtype {dt!r}")
    if len(table.shape) != 1 or table.shape[0] % 2 or table.shape[0] == 0 or tuple(size.shape) != (1,):
        _trace.fail(ValueError, f"{api}: table must have shape (2 * capacity,) and size (1,), got "
                    f"{tuple(table.shape)} and {tuple(size.shape)}")
    if hash_precomputed is not True:
        _trace.fail(ValueError, f"{api}: hash_precomputed must be True (OneFlow supports only that mode)")
    cap = table.shape[0] // 2
    n = 1
    for d in input_tensor.shape:
        n *= d
    if n == 0:
        return _ops.identity(input_tensor, name=name)
    if cap >= 2 ** 30 or n >= 2 ** 30:
        _trace.fail(ValueError, f"{api}: capacity {cap} and {n} inputs must stay below 2^30")
    p = 1 << max(1, (n - 1).bit_length())
    zero, one = _int(0), _int(1)
    # The table: sorted keys and their ordinals in slots [0, s).
    pairs = _ops.reshape(table, [cap, 2])
    keys = _ops.reshape(_array._slice_dim(pairs, 1, 0, 1), [cap])
    vals = _ops.reshape(_array._slice_dim(pairs, 1, 1, 2), [cap])
    s = _ops.cast(_ops.reshape(size, []), _I)

    # 1. the inputs sorted, padded with (max, n..P-1), which sort last.
    x = _ops.reshape(input_tensor, [n])
    if p > n:
        x = _array.concat([x, _ops.broadcast_to(_int(int(np.iinfo(dt.np).max), dt), [p - n])])
    xs, pos = _sort_pairs(x, _array._iota([p], 0, _I))

    # 2. lookup of the sorted values; the new values' first entries.
    at = _lower_bound(keys, xs, _ops.broadcast_to(zero, [p]), _ops.broadcast_to(s, [p]), cap)
    found = _ops.logical_and(_ops.less(at, s), _ops.equal(_gather(keys, at), xs))
    start = _ops.logical_or(_ops.not_equal(xs, _shift(xs, 1, 0)),
                            _ops.equal(_array._iota([p], 0, _I), zero))
    new = _ops.logical_and(_ops.logical_and(start, _ops.logical_not(found)),
                           _ops.logical_and(_ops.less(pos, _int(n)), _ops.not_equal(xs, _int(0, dt))))
    new_i = _ops.cast(new, _I)
    upto = _cumsum(new_i)                       # new values at or before each sorted entry
    count = _ops.reshape(_array._slice_dim(upto, 0, p - 1, p), [])
    grown = _ops.checked_index(_ops.add(s, count), cap + 1,
                               f"{api}: the number of distinct values (capacity {cap})", api)

    # 3. each input's run of equal sorted values; its first occurrence; the
    #    ordinal of a new value: s + 1 + the number of new values before its
    #    first occurrence in input order.
    head = _lower_bound(xs, x if p == n else _array._slice_dim(x, 0, 0, n), _ops.broadcast_to(zero, [n]),
                        _ops.broadcast_to(_int(p), [n]), p)
    first = _gather(pos, head)                  # the position of the value's first occurrence
    is_first_new = _ops.logical_and(_gather(new, head), _ops.equal(first, _array._iota([n], 0, _I)))
    marks = _ops.cast(is_first_new, _I)
    before = _ops.subtract(_cumsum(marks), marks)   # new values that appear earlier
    ordinal_new = _ops.add(_ops.add(s, one), _gather(before, first))
    ordinal = _ops.where(_gather(found, head), _ops.cast(_gather(vals, _gather(at, head)), _I), ordinal_new)
    xn = x if p == n else _array._slice_dim(x, 0, 0, n)
    out = _ops.where(_ops.equal(xn, _int(0, dt)), zero, ordinal)

    # 4. the new values compacted in key order, then merged with the table.
    c = _array._iota([p], 0, _I)
    src = _lower_bound(upto, _ops.add(c, one), _ops.broadcast_to(zero, [p]), _ops.broadcast_to(_int(p), [p]), p)
    new_keys = _gather(xs, src)
    new_vals = _ops.add(_ops.add(s, one), _gather(before, _gather(pos, src)))
    q = _array._iota([cap], 0, _I)
    lo = _ops.maximum(_ops.subtract(q, count), zero)
    hi = _ops.minimum(q, s)
    for _ in range(cap.bit_length()):
        active = _ops.less(lo, hi)
        mid = _ops.divide(_ops.add(lo, hi), _int(2))
        right = _ops.less(_gather(keys, mid), _gather(new_keys, _ops.subtract(_ops.subtract(q, mid), one)))
        lo = _ops.where(_ops.logical_and(active, right), _ops.add(mid, one), lo)
        hi = _ops.where(_ops.logical_and(active, _ops.logical_not(right)), mid, hi)
    b = _ops.subtract(q, lo)
    old = _ops.logical_and(_ops.less(lo, s), _ops.logical_or(
        _ops.greater_equal(b, count), _ops.less(_gather(keys, lo), _gather(new_keys, b))))
    used = _ops.less(q, _ops.add(s, count))
    z = _int(0, dt)
    mk = _ops.where(used, _ops.where(old, _gather(keys, lo), _gather(new_keys, b)), z)
    mv = _ops.where(used, _ops.where(old, _gather(vals, lo), _ops.cast(_gather(new_vals, b), dt)), z)

    # 5. the state written back (after every read of the old one).
    _array.assign(table, _ops.reshape(_array.stack([mk, mv], axis=1), [2 * cap]))
    _array.assign(size, _ops.reshape(_ops.cast(grown, dt), [1]))
    return _ops.reshape(_ops.cast(out, dt), list(input_tensor.shape), name=name)


def categorical_ordinal_encoder(input_tensor: Blob, capacity: int, hash_precomputed: bool = True,
                                name: str = "CategoricalOrdinalEncoder") -> Blob:
    """categorical_ordinal_encode with its state in variables of its own:
    `<name>-Table` (shape (2 * capacity,)) and `<name>-Size` (shape (1,)), of
    the input's dtype, not trainable (OneFlow's layer).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.layers.categorical_ordinal_encoder(x, capacity=8)
        >>> job(np.int32([7, 3, 7, 0])).tolist(), job(np.int32([5, 3, 5, 5])).tolist()
        ([1, 2, 1, 0], [3, 2, 3, 3])
    """
    from .. import scope
    from .._core.variables import ConstantInitializer, get_variable
    if not _ops._is_int(capacity) or capacity < 1:
        _trace.fail(ValueError, f"layers.categorical_ordinal_encoder: capacity must be an int >= 1, got "
                    f"{capacity!r}")
    if not isinstance(input_tensor, Blob):
        _trace.fail(TypeError, "layers.categorical_ordinal_encoder: input_tensor must be a Blob")
    dt = input_tensor.dtype
    with scope.namespace(name):
        table = get_variable("Table", shape=(2 * int(capacity),), dtype=dt, initializer=ConstantInitializer(0),
                             trainable=False, reuse=False)
        size = get_variable("Size", shape=(1,), dtype=dt, initializer=ConstantInitializer(0), trainable=False,
                            reuse=False)
        return categorical_ordinal_encode(table, size, input_tensor, hash_precomputed, name="Encode")
