"""flow.random: random draws inside a job (OneFlow's flow.random.*).

Every draw is a counter-based uniform source (random_uniform_at): element i
of a draw depends only on its seed and on i plus an offset. The offset is a
per-job counter variable that the job advances on every call, so each call
draws new numbers from one compiled kernel, and a seed (explicit, or derived
from flow.manual_seed, the job and the op's position in it) makes the stream
reproducible.

The docstrings' examples assume ``import numpy as np``, ``import flowjit as flow``
and ``import flowjit.typing as tp``; each starts from a fresh session.
"""
import numbers
import random as _pyrandom
from typing import Optional, Tuple

from . import _C
from ._core import dtypes as _dtypes, trace as _trace
from ._ops import builders as _ops
from ._ops.array import _sorted, assign, gather
from ._core.blob import Blob
from ._core.dtypes import DTypeLike

__all__ = ["bernoulli", "CoinFlip", "coin_flip", "gen_seed", "generate_random_batch_permutation_indices",
           "shuffle"]

K = _C.OpKind
_COUNTER = "random_counter"


def _seed(b, seed, api):
    """An explicit seed, or one derived from flow.manual_seed, the job and the
    op's position among the job's random ops."""
    from ._core.variables import _derived_seed
    n = b._counts.get("random_op", 0)
    b._counts["random_op"] = n + 1
    if seed is not None:
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
            _trace.fail(TypeError, f"{api}: seed must be an int or None, got {seed!r}")
        return int(seed) & 0x7FFFFFFFFFFFFFFF
    return _derived_seed(f"{b.job_name}/random/{n}", None)


def _counter(b):
    """The job's call counter (int64, shape ()), advanced once per call."""
    from ._core.variables import ConstantInitializer
    name = f"System-Random-Counter-{b.job_name}"
    c = b.variable(name, (), _dtypes.int64, ConstantInitializer(0), False, 0, _trace.user_location())
    if not b._counts.get(_COUNTER):
        b._counts[_COUNTER] = 1
        assign(c, _ops.add(c, _ops.constant(1, dtype=_dtypes.int64)))
    return c


def _uniform(shape, dtype, seed, api):
    """Uniform [0, 1) numbers of `shape`, new on every call of the job."""
    b = _trace.require_builder(f"flow.random.{api}")
    s = _seed(b, seed, api)
    numel = 1
    for d in shape:
        numel *= int(d)
    offset = _ops.multiply(_counter(b), _ops.constant(max(numel, 1), dtype=_dtypes.int64))
    return _ops.make(K.random_uniform_at, [offset], {"shape": [int(d) for d in shape], "dtype": dtype.c,
                                                     "seed": s}, api=api)


def bernoulli(x: Blob, seed: Optional[int] = None, dtype: Optional[DTypeLike] = None,
              name: str = "Bernoulli") -> Blob:
    """1 with probability x (elementwise, x in [0, 1]), else 0; of x's dtype
    unless `dtype` is given.

    Example:
        >>> @flow.global_function()
        ... def job(p: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.random.bernoulli(p, seed=1)
        >>> job(np.float32([0, 1, 0, 1])).tolist()   # probabilities 0 and 1 are certain
        [0.0, 1.0, 0.0, 1.0]
    """
    if not isinstance(x, Blob):
        _trace.fail(TypeError, f"bernoulli: x must be a Blob, got {type(x).__name__}")
    if x.dtype not in _dtypes.FLOATS:
        _trace.fail(TypeError, f"bernoulli: x must hold probabilities as float32 or float64, got {x.dtype.name}")
    d = _ops._dtype(dtype, "bernoulli") if dtype is not None else x.dtype
    u = _uniform(list(x.shape), x.dtype, seed, "bernoulli")
    return _ops.cast(_ops.less(u, x), d)


def coin_flip(batch_size: int = 1, seed: Optional[int] = None, probability: float = 0.5,
              name: str = "CoinFlip") -> Blob:
    """batch_size int8 values, each 1 with `probability`, else 0.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.random.coin_flip(1000, seed=1, probability=0.5)
        >>> flips = job()
        >>> flips.dtype, set(flips.tolist()), bool(400 < flips.sum() < 600)
        (dtype('int8'), {0, 1}, True)
    """
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 0:
        _trace.fail(ValueError, f"coin_flip: batch_size must be an int >= 0, got {batch_size!r}")
    if not isinstance(probability, numbers.Real) or not 0.0 <= float(probability) <= 1.0:
        _trace.fail(ValueError, f"coin_flip: probability must be a number in [0, 1], got {probability!r}")
    u = _uniform([int(batch_size)], _dtypes.float32, seed, "coin_flip")
    return _ops.cast(_ops.less(u, float(probability)), _dtypes.int8)


CoinFlip = coin_flip  # OneFlow exports both names


def generate_random_batch_permutation_indices(value: Blob, seed: Optional[int] = None,
                                              name: Optional[str] = None) -> Blob:
    """A random permutation of 0 .. value.shape[0] - 1 (int32), new on every
    call: the order that sorts as many uniform draws.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((5, 2))) -> tp.Numpy:
        ...     return flow.random.generate_random_batch_permutation_indices(x, seed=1)
        >>> sorted(job(np.zeros((5, 2), np.float32)).tolist())
        [0, 1, 2, 3, 4]
    """
    api = "generate_random_batch_permutation_indices"
    if not isinstance(value, Blob):
        _trace.fail(TypeError, f"{api}: value must be a Blob, got {type(value).__name__}")
    if not value.shape:
        _trace.fail(ValueError, f"{api}: value must have a batch axis (rank >= 1)")
    keys = _uniform([value.shape[0]], _dtypes.float32, seed, api)
    perm = _sorted(keys, 0, "ASCENDING", api, False)
    return _ops.identity(perm, name=name) if name else perm


def shuffle(value: Blob, seed: Optional[int] = None, name: Optional[str] = None) -> Blob:
    """value with its slices along axis 0 in a random order, new on every call.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.random.shuffle(x, seed=1)
        >>> sorted(job(np.float32([1, 2, 3, 4])).tolist())   # the same values, in some order
        [1.0, 2.0, 3.0, 4.0]
    """
    perm = generate_random_batch_permutation_indices(value, seed)
    return gather(value, perm, axis=0, name=name)


def gen_seed(seed: Optional[int] = None) -> Tuple[int, bool]:
    """(seed, True): the given seed, or a fresh random one when None (how
    OneFlow's random ops pick theirs in the consistent view).

    Example:
        >>> flow.random.gen_seed(7)
        (7, True)
    """
    if seed is None:
        return _pyrandom.randint(0, 2 ** 63 - 1), True
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"gen_seed: seed must be an int or None, got {seed!r}")
    return int(seed), True
