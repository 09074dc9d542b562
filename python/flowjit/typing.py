"""Job function annotations: placeholders for parameters, result kinds for returns.

Parameters::

    def job(x: tp.Numpy.Placeholder((100, 784), dtype=flow.float)) -> tp.Numpy: ...

``Numpy.Placeholder`` takes one array of exactly the declared shape.
``ListNumpy.Placeholder`` takes a list with one array per device whose shape
fits the declared shape: the same rank and at most as many elements, in any
extents, as OneFlow's dynamic blobs (each new concrete shape compiles once).
``ListListNumpy.Placeholder`` takes, per device, a list of such arrays; the
job body receives a Python list of Blobs. A parameter annotated
``typing.Tuple[<placeholder>, ...]`` takes a tuple (or list) of such
arguments, one per element, and the body receives a tuple of Blobs.

Returns: ``tp.Numpy``, ``tp.ListNumpy`` (one array per device),
``tp.ListListNumpy``, ``typing.Tuple[...]``, ``typing.List[...]``,
``typing.Dict[str, ...]``, ``tp.Bundle[...]`` (any nesting of those),
``None``, and ``tp.Callback[T]`` for an asynchronous call delivering T.
"""
import numbers
from typing import Optional, Sequence

from ._core import dtypes as _dtypes


class _Placeholder:
    kind = "?"

    def __init__(self, shape: Sequence[int], dtype: _dtypes.DTypeLike = _dtypes.float32, batch_axis: int = 0,
                 name: Optional[str] = None):
        if isinstance(shape, list):
            shape = tuple(shape)
        if not isinstance(shape, tuple):
            raise TypeError(f"{self._api()}: shape must be a tuple of positive ints, got {shape!r}")
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d <= 0:
                raise ValueError(f"{self._api()}: shape must be a tuple of positive ints, got "
                                 f"{shape!r} (extent {d!r} is not a positive int)")
        self.shape = tuple(int(d) for d in shape)
        self.dtype = _dtypes.to_dtype(dtype, f"{self._api()} dtype")
        if batch_axis is not None and (isinstance(batch_axis, bool) or not isinstance(batch_axis, numbers.Integral)
                                       or not -len(shape) <= batch_axis < max(1, len(shape))):
            raise ValueError(f"{self._api()}: batch_axis must be None or an axis of the rank-{len(shape)} "
                             f"shape {shape}, got {batch_axis!r}")
        self.batch_axis = batch_axis
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{self._api()}: name must be a string, got {name!r}")
        self.name = name  # accepted for OneFlow's input_blob_def; the parameter's name names the blob

    def _api(self):
        return f"tp.{self.kind}.Placeholder"

    def __repr__(self):
        return f"{self._api()}({self.shape}, dtype={self.dtype!r})"


class Numpy:
    """A numpy array: as a parameter annotation use ``Numpy.Placeholder``;
    as a return annotation, ``tp.Numpy`` means one array.

    Example:
        >>> @flow.global_function()
        ... def row_sums(x: tp.Numpy.Placeholder((2, 2), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.math.reduce_sum(x, axis=1)
        >>> row_sums(np.int32([[1, 2], [3, 4]]))
        array([3, 7], dtype=int32)
        >>> row_sums(np.int32([1, 2]))   # a Numpy placeholder takes exactly its shape
        Traceback (most recent call last):
        ValueError: job 'row_sums': parameter 'x' is declared with shape (2, 2) but the array has ...
    """

    class Placeholder(_Placeholder):
        kind = "Numpy"


class ListNumpy:
    """A list of numpy arrays, one per device. A ``ListNumpy.Placeholder``
    takes arrays of any shape of its rank with at most its elements
    (OneFlow's dynamic blobs); each new shape compiles once.

    Example:
        >>> @flow.global_function()
        ... def plus_one(x: tp.ListNumpy.Placeholder((4,))) -> tp.ListNumpy:
        ...     return x + 1
        >>> plus_one([np.float32([1, 2])])
        [array([2., 3.], dtype=float32)]
        >>> plus_one([np.float32([1, 2, 3])])
        [array([2., 3., 4.], dtype=float32)]
    """

    class Placeholder(_Placeholder):
        kind = "ListNumpy"


class ListListNumpy:
    """Per device, a list of numpy arrays."""

    class Placeholder(_Placeholder):
        kind = "ListListNumpy"


class _Generic:
    def __init__(self, name, arg):
        self.name = name
        self.arg = arg

    def __repr__(self):
        return f"tp.{self.name}[{self.arg!r}]"


class Bundle:
    """``Bundle[T]``: any nesting of tuples, lists and dicts whose leaves are T.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Bundle[tp.Numpy]:
        ...     return {"x": x, "pair": (x + 1, x * 2)}
        >>> out = job(np.float32([1, 2]))
        >>> out["x"]
        array([1., 2.], dtype=float32)
        >>> out["pair"]
        (array([2., 3.], dtype=float32), array([2., 4.], dtype=float32))
    """

    def __class_getitem__(cls, item):
        return _Generic("Bundle", item)


class Callback:
    """``Callback[T]``: the call returns at once; pass it a function taking T.

    Example:
        >>> @flow.global_function()
        ... def double(x: tp.Numpy.Placeholder((3,))) -> tp.Callback[tp.Numpy]:
        ...     return x * 2
        >>> results = []
        >>> double(np.ones(3, np.float32))(results.append)   # queued; returns at once
        >>> flow.sync_default_session()                       # waits for every queued call
        >>> results
        [array([2., 2., 2.], dtype=float32)]
    """

    def __class_getitem__(cls, item):
        return _Generic("Callback", item)


__all__ = ["Numpy", "ListNumpy", "ListListNumpy", "Bundle", "Callback"]
