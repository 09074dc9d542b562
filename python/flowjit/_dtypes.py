"""flowjit's dtypes (flow.float, flow.int32, ...) and their numpy and IR forms."""
from typing import List, Union

import numpy as np

from . import _C


class DType:
    """An element type, as OneFlow names it (``flow.float``, ``flow.int32``...)."""

    __slots__ = ("name", "c", "np")

    def __init__(self, name, c, np_dtype):
        self.name = name
        self.c = c
        self.np = np.dtype(np_dtype)

    def __repr__(self):
        return f"flow.{self.name}"

    def __reduce__(self):
        return (from_name, (self.name,))


bool_ = DType("bool", _C.DType.bool, np.bool_)
int8 = DType("int8", _C.DType.int8, np.int8)
uint8 = DType("uint8", _C.DType.uint8, np.uint8)
int32 = DType("int32", _C.DType.int32, np.int32)
int64 = DType("int64", _C.DType.int64, np.int64)
float32 = DType("float32", _C.DType.float32, np.float32)
float64 = DType("float64", _C.DType.float64, np.float64)

#: What a `dtype` argument takes: a flow dtype, a numpy dtype or type, or a name ("float32").
DTypeLike = Union[DType, np.dtype, type, str]

ALL = (bool_, int8, uint8, int32, int64, float32, float64)
_BY_C = {d.c: d for d in ALL}
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"float": float32, "double": float64, "bool": bool_, "char": int8})


class _Unsupported:
    """A OneFlow dtype flowjit does not implement (float16): using it raises."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"flow.{self.name}"


float16 = _Unsupported("float16")


def dtypes() -> List[Union[DType, _Unsupported]]:
    """Every dtype object flowjit names (OneFlow's ``flow.dtypes()``): the
    seven it computes in, and flow.float16, which it only names (a job that
    uses it raises NotImplementedError). Aliases such as flow.float are the
    same objects as flow.float32 and are not repeated."""
    return list(ALL) + [float16]


def convert_oneflow_dtype_to_numpy_dtype(dtype: Union[DType, _Unsupported]) -> type:
    """The numpy scalar type of a flow dtype (``flow.float32`` -> ``np.float32``,
    ``flow.char`` -> ``np.int8``). flow.float16 maps to ``np.float16`` even
    though flowjit does not compute in it, so tests can build their inputs."""
    if isinstance(dtype, DType):
        return dtype.np.type
    if dtype is float16:
        return np.float16
    raise TypeError(f"convert_oneflow_dtype_to_numpy_dtype: expected a flow dtype such as flow.float32, "
                    f"got {dtype!r}")


def from_name(name):
    return _BY_NAME[name]


def from_c(c):
    return _BY_C[c]


def to_dtype(x, what="dtype"):
    """Accepts flow dtypes, numpy dtypes/types and their names."""
    if isinstance(x, DType):
        return x
    if isinstance(x, _Unsupported):
        raise NotImplementedError(f"{what}: flow.{x.name} is not supported by flowjit yet "
                                  "(supported: float32, float64, int8, uint8, int32, int64, bool)")
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    try:
        npd = np.dtype(x)
    except TypeError:
        raise TypeError(f"{what}: expected a flowjit dtype such as flow.float32, got {x!r}") from None
    for d in ALL:
        if d.np == npd:
            return d
    raise TypeError(f"{what}: numpy dtype {npd} has no flowjit equivalent")


def of_numpy(arr_dtype):
    for d in ALL:
        if d.np == arr_dtype:
            return d
    return None
