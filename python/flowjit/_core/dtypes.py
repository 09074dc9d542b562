"""flowjit's dtypes (flow.float, flow.int32, ...) and their numpy and IR forms."""
from typing import List, Union

import numpy as np

from .. import _C


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
#: IEEE half precision: stored in 2 bytes, computed in float32 (numpy's float16).
float16 = DType("float16", _C.DType.float16, np.float16)


def _bfloat16_numpy():
    # numpy has no bfloat16; ml_dtypes (which JAX and TensorFlow use) adds it.
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


_BF16_NP = _bfloat16_numpy()
#: bfloat16 (float32's range, 8 bits of precision): stored in 2 bytes, computed
#: in float32; numpy arrays of it are ml_dtypes.bfloat16 arrays.
bfloat16 = DType("bfloat16", _C.DType.bfloat16, _BF16_NP if _BF16_NP is not None else np.void)

#: What a `dtype` argument takes: a flow dtype, a numpy dtype or type, or a name ("float32").
DTypeLike = Union[DType, np.dtype, type, str]

ALL = (bool_, int8, uint8, int32, int64, float32, float64, float16, bfloat16)
HALF = (float16, bfloat16)
#: The floating-point dtypes (the half ones compute in float32).
FLOATS = (float32, float64, float16, bfloat16)
_BY_C = {d.c: d for d in ALL}
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"float": float32, "double": float64, "bool": bool_, "char": int8, "half": float16})


def dtypes() -> List[DType]:
    """Every dtype object flowjit names (OneFlow's ``flow.dtypes()``). Aliases
    such as flow.float are the same objects as flow.float32 and are not
    repeated.

    Example:
        >>> flow.float32 in flow.dtypes(), len(flow.dtypes()) == len(set(flow.dtypes()))
        (True, True)
    """
    return list(ALL)


def convert_oneflow_dtype_to_numpy_dtype(dtype: DType) -> type:
    """The numpy scalar type of a flow dtype (``flow.float32`` -> ``np.float32``,
    ``flow.char`` -> ``np.int8``, ``flow.bfloat16`` -> ``ml_dtypes.bfloat16``).

    Example:
        >>> flow.convert_oneflow_dtype_to_numpy_dtype(flow.float32), flow.convert_oneflow_dtype_to_numpy_dtype(flow.char)
        (<class 'numpy.float32'>, <class 'numpy.int8'>)
    """
    if isinstance(dtype, DType):
        return _numpy_of(dtype).type
    raise TypeError(f"convert_oneflow_dtype_to_numpy_dtype: expected a flow dtype such as flow.float32, "
                    f"got {dtype!r}")


def _numpy_of(d):
    if d is bfloat16 and _BF16_NP is None:
        raise NotImplementedError("flow.bfloat16 arrays need the ml_dtypes package (numpy has no "
                                  "bfloat16): pip install ml_dtypes")
    return d.np


def from_name(name):
    return _BY_NAME[name]


def from_c(c):
    return _BY_C[c]


def to_dtype(x, what="dtype"):
    """Accepts flow dtypes, numpy dtypes/types and their names."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    try:
        npd = np.dtype(x)
    except TypeError:
        raise TypeError(f"{what}: expected a flowjit dtype such as flow.float32, got {x!r}") from None
    d = of_numpy(npd)
    if d is None:
        raise TypeError(f"{what}: numpy dtype {npd} has no flowjit equivalent")
    return d


def of_numpy(arr_dtype):
    for d in ALL:
        if d.np == arr_dtype and (d is not bfloat16 or _BF16_NP is not None):
            return d
    return None
