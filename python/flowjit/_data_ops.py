"""Data ops inside a job (OneFlow's flow.data.*): decode_random.

decode_random is what OneFlow's model programs read instead of a data set
(``--use_synthetic_data`` in its CNN and Wide&Deep programs): a batch drawn
from an initializer, new at every call of the job. The draw is generated
code, like flow.random's: a counter-based uniform source whose offset the job
advances on every call (flowjit.random), shaped by the initializer.
"""
import numbers
from typing import Any, Optional, Sequence

from . import _C, _dtypes, _ops, _trace
from ._blob import Blob
from ._dtypes import DTypeLike

K = _C.OpKind


class _PerCallOps:
    """The op module an initializer builds with (`init.build(ops, ...)`),
    with its random sources replaced by ones that draw anew on every call."""

    def __init__(self, seed, api):
        self._seed, self._api, self._draws = seed, api, 0

    def __getattr__(self, name):
        return getattr(_ops, name)

    def _uniform(self, shape, dtype):
        from . import random as _random
        self._draws += 1
        return _random._uniform(list(shape), dtype, (self._seed + 7919 * self._draws) & 0x7FFFFFFFFFFFFFFF,
                                self._api)

    def _normal(self, shape, dtype):
        # Box-Muller on two per-call uniform draws, in float64 so log(u) of the
        # smallest u stays finite.
        u1 = self._uniform(shape, _dtypes.float64)
        u2 = self._uniform(shape, _dtypes.float64)
        r = _ops.sqrt(_ops.multiply(_ops.log(_ops.subtract(1.0, u1)), -2.0))
        return _ops.multiply(r, _ops.cos(_ops.multiply(u2, 6.283185307179586)))

    def _random(self, op, shape, dtype, seed):
        if op == K.random_uniform:
            return self._uniform(shape, dtype)
        if op == K.random_normal:
            return _ops.cast(self._normal(shape, dtype), dtype)
        if op == K.truncated_normal:
            # Redraw where |z| > 2 (the truncation of flow.truncated_normal):
            # four candidates, all outside with probability 0.0455^4 < 5e-6,
            # the last clipped.
            z = self._normal(shape, dtype)
            for _ in range(3):
                z = _ops.where(_ops.less_equal(_ops.abs(z), 2.0), z, self._normal(shape, dtype))
            return _ops.cast(_ops.minimum(_ops.maximum(z, -2.0), 2.0), dtype)
        _trace.fail(NotImplementedError, f"{self._api}: the initializer draws from {op.name}, which has no "
                    "per-call form")


def decode_random(shape: Sequence[int], dtype: DTypeLike, batch_size: int = 1, initializer: Optional[Any] = None,
                  tick: Optional[Blob] = None, name: Optional[str] = None) -> Blob:
    """A ``(batch_size, *shape)`` blob of `dtype` drawn from `initializer`
    (default ``flow.random_uniform_initializer()``: uniform in [0, 1)), new
    at every call of the job, as OneFlow's DecodeRandom op. `tick` (an op
    this one waits for in OneFlow's graph) changes nothing here: each call
    draws once."""
    api = "data.decode_random"
    b = _trace.require_builder(f"flow.{api}")
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in shape):
        _trace.fail(TypeError, f"{api}: shape must be a list or tuple of ints >= 0, got {shape!r}")
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
        _trace.fail(ValueError, f"{api}: batch_size must be an int >= 1, got {batch_size!r}")
    if tick is not None and not isinstance(tick, Blob):
        _trace.fail(TypeError, f"{api}: tick must be a Blob or None, got {type(tick).__name__}")
    dt = _ops._dtype(dtype, api)
    from . import _variables
    from .random import _seed
    init = initializer if initializer is not None else _variables.RandomUniformInitializer()
    if not isinstance(init, _variables.Initializer):
        _trace.fail(TypeError, f"{api}: initializer must be a flow initializer (flow.random_uniform_initializer(), "
                    f"flow.zeros_initializer(), ...), got {init!r}")
    seed = _seed(b, getattr(init, "seed", None), api)
    out = init.build(_PerCallOps(seed, api), [int(batch_size)] + [int(d) for d in shape], dt, seed)
    if out.dtype is not dt:
        out = _ops.cast(out, dt)
    return _ops.identity(out, name=name) if name else out
