"""Variables: get_variable, initializers, and the session's variable store.

Variables live in the session by name and are shared by every job that names
them. A variable is created (and initialized, by a small generated kernel) the
first time a successfully traced job names it; tracing that fails creates
nothing.
"""
import math
import numbers
import zlib
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from .. import _C
from . import dtypes as _dtypes, trace as _trace
from .blob import Blob
from .dtypes import DTypeLike
from ..distribute import Distribute
from ..regularizers import Regularizer

_global_seed = [0]


def manual_seed(seed: int) -> None:
    """Sets the seed from which variables without an explicit seed derive theirs.

    Example:
        >>> flow.manual_seed(42)
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(3,), initializer=flow.random_normal_initializer())
        >>> first = job()
        >>> flow.clear_default_session(); flow.manual_seed(42)
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(3,), initializer=flow.random_normal_initializer())
        >>> bool((job() == first).all())   # the same seed, the same initial values
        True
    """
    if not isinstance(seed, numbers.Integral):
        raise TypeError(f"manual_seed: expected an int, got {type(seed).__name__}")
    _global_seed[0] = int(seed)


def _derived_seed(name, seed):
    if seed is not None:
        return int(seed) & 0x7FFFFFFFFFFFFFFF
    return (zlib.crc32(name.encode()) ^ (_global_seed[0] * 0x9E3779B1)) & 0x7FFFFFFFFFFFFFFF


# ---------------------------------------------------------------- initializers

class Initializer:
    """Builds the value of a new variable as IR (so it runs as generated code)."""

    def build(self, ops, shape, dtype, seed):
        raise NotImplementedError

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()))
        return f"{type(self).__name__}({fields})"


class ConstantInitializer(Initializer):
    def __init__(self, value=0.0, dtype=None):
        if not isinstance(value, numbers.Number):
            raise TypeError(f"constant_initializer: value must be a number, got {value!r}")
        self.value = float(value)

    def build(self, ops, shape, dtype, seed):
        return ops.constant(self.value, dtype, list(shape))


class RandomUniformInitializer(Initializer):
    def __init__(self, minval=0.0, maxval=1.0, seed=None, dtype=None):
        if not maxval >= minval:
            raise ValueError(f"random_uniform_initializer: maxval ({maxval}) must be >= minval ({minval})")
        self.minval, self.maxval, self.seed = float(minval), float(maxval), seed

    def build(self, ops, shape, dtype, seed):
        if dtype in _dtypes.FLOATS:
            u = ops._random(_C.OpKind.random_uniform, shape, dtype, seed)
            return ops.add(ops.multiply(u, self.maxval - self.minval), self.minval)
        if dtype is _dtypes.bool_:
            _trace.fail(TypeError, "random_uniform_initializer: cannot initialize a bool variable")
        # Integers uniform in [minval, maxval) (OneFlow's random_uniform_int_conf).
        lo, hi = math.ceil(self.minval), math.ceil(self.maxval)
        if hi <= lo:
            _trace.fail(ValueError, f"random_uniform_initializer: no integer lies in [{self.minval}, "
                        f"{self.maxval}) for a {dtype!r} variable")
        u = ops._random(_C.OpKind.random_uniform, shape, _dtypes.float64, seed)
        v = ops.minimum(ops.floor(ops.add(ops.multiply(u, float(hi - lo)), float(lo))), float(hi - 1))
        return ops.cast(v, dtype)


class RandomNormalInitializer(Initializer):
    def __init__(self, mean=0.0, stddev=1.0, seed=None, dtype=None):
        if stddev < 0:
            raise ValueError(f"random_normal_initializer: stddev must be >= 0, got {stddev}")
        self.mean, self.stddev, self.seed = float(mean), float(stddev), seed

    def build(self, ops, shape, dtype, seed):
        z = ops._random(_C.OpKind.random_normal, shape, dtype, seed)
        return ops.add(ops.multiply(z, self.stddev), self.mean)


class TruncatedNormalInitializer(Initializer):
    """Normal values truncated to two standard deviations around the mean."""

    def __init__(self, mean=0.0, stddev=1.0, seed=None, dtype=None):
        if stddev < 0:
            raise ValueError(f"truncated_normal_initializer: stddev must be >= 0, got {stddev}")
        self.mean, self.stddev, self.seed = float(mean), float(stddev), seed

    def build(self, ops, shape, dtype, seed):
        z = ops._random(_C.OpKind.truncated_normal, shape, dtype, seed)
        return ops.add(ops.multiply(z, self.stddev), self.mean)


def _fans(shape, data_format=""):
    shape = list(shape)
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if data_format == "NHWC" and len(shape) > 2:
        receptive = int(np.prod(shape[1:-1]))
        return shape[-1] * receptive, shape[0] * receptive
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


class VarianceScalingInitializer(Initializer):
    """std = sqrt(scale / n) with n the fan in, fan out or their mean."""

    _modes = ("fan_in", "fan_out", "fan_avg")
    _dists = ("truncated_normal", "random_normal", "random_uniform")

    def __init__(self, scale=1.0, mode="fan_in", distribution="truncated_normal", data_format="",
                 seed=None):
        if scale <= 0:
            raise ValueError(f"variance_scaling_initializer: scale must be positive, got {scale}")
        if mode not in self._modes:
            raise ValueError(f"variance_scaling_initializer: mode must be one of {self._modes}, got {mode!r}")
        if distribution not in self._dists:
            raise ValueError(f"variance_scaling_initializer: distribution must be one of "
                             f"{self._dists}, got {distribution!r}")
        self.scale, self.mode, self.distribution = float(scale), mode, distribution
        self.data_format, self.seed = data_format, seed

    def build(self, ops, shape, dtype, seed):
        fan_in, fan_out = _fans(shape, self.data_format)
        n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[self.mode]
        var = self.scale / max(1.0, n)
        if self.distribution == "random_uniform":
            limit = math.sqrt(3.0 * var)
            return RandomUniformInitializer(-limit, limit).build(ops, shape, dtype, seed)
        if self.distribution == "random_normal":
            return RandomNormalInitializer(0.0, math.sqrt(var)).build(ops, shape, dtype, seed)
        # The std of a normal truncated at 2 sigma is 0.8796 of the untruncated one.
        return TruncatedNormalInitializer(0.0, math.sqrt(var) / 0.87962566103423978).build(
            ops, shape, dtype, seed)


class KaimingInitializer(Initializer):
    def __init__(self, distribution="random_normal", mode="fan_in", nonlinearity="leaky_relu",
                 negative_slope=0.0, data_format="NCHW", seed=None):
        gains = {"linear": 1.0, "sigmoid": 1.0, "conv2d": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0),
                 "leaky_relu": math.sqrt(2.0 / (1 + negative_slope ** 2))}
        if nonlinearity not in gains:
            raise ValueError(f"kaiming_initializer: nonlinearity must be one of {sorted(gains)}, "
                             f"got {nonlinearity!r}")
        if mode not in ("fan_in", "fan_out"):
            raise ValueError(f"kaiming_initializer: mode must be 'fan_in' or 'fan_out', got {mode!r}")
        if distribution not in ("random_normal", "random_uniform"):
            raise ValueError("kaiming_initializer: distribution must be 'random_normal' or "
                             f"'random_uniform', got {distribution!r}")
        self.gain = gains[nonlinearity]
        self.distribution, self.mode, self.data_format, self.seed = distribution, mode, data_format, seed

    def build(self, ops, shape, dtype, seed):
        fan_in, fan_out = _fans(shape, self.data_format)
        std = self.gain / math.sqrt(max(1, fan_in if self.mode == "fan_in" else fan_out))
        if self.distribution == "random_uniform":
            b = math.sqrt(3.0) * std
            return RandomUniformInitializer(-b, b).build(ops, shape, dtype, seed)
        return RandomNormalInitializer(0.0, std).build(ops, shape, dtype, seed)


def constant_initializer(value: float = 0, dtype: Optional[DTypeLike] = None) -> Initializer:
    """Every element equal to `value`.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2, 2), initializer=flow.constant_initializer(0.5))
        >>> job().tolist()
        [[0.5, 0.5], [0.5, 0.5]]
    """
    return ConstantInitializer(value, dtype)


def zeros_initializer(dtype: Optional[DTypeLike] = None) -> Initializer:
    """Every element 0.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2, 2), initializer=flow.zeros_initializer())
        >>> job().tolist()
        [[0.0, 0.0], [0.0, 0.0]]
    """
    return ConstantInitializer(0.0, dtype)


def ones_initializer(dtype: Optional[DTypeLike] = None) -> Initializer:
    """Every element 1.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2, 2), initializer=flow.ones_initializer())
        >>> job().tolist()
        [[1.0, 1.0], [1.0, 1.0]]
    """
    return ConstantInitializer(1.0, dtype)


def random_uniform_initializer(minval: float = 0, maxval: float = 1, dtype: Optional[DTypeLike] = None,
                               seed: Optional[int] = None) -> Initializer:
    """Uniform values in [minval, maxval).

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(1000,), initializer=flow.random_uniform_initializer(-1, 1, seed=1))
        >>> w = job()
        >>> bool(w.min() >= -1), bool(w.max() < 1)
        (True, True)
    """
    return RandomUniformInitializer(minval, maxval, seed, dtype)


def random_normal_initializer(mean: float = 0.0, stddev: float = 1.0, seed: Optional[int] = None,
                              dtype: Optional[DTypeLike] = None) -> Initializer:
    """Normal values with the given mean and standard deviation.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(10000,), initializer=flow.random_normal_initializer(stddev=2.0, seed=1))
        >>> round(float(job().std()), 1)
        2.0
    """
    return RandomNormalInitializer(mean, stddev, seed, dtype)


def truncated_normal_initializer(mean: float = 0.0, stddev: float = 1.0, seed: Optional[int] = None,
                                 dtype: Optional[DTypeLike] = None) -> Initializer:
    """Normal values redrawn until within two standard deviations of the mean.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(1000,), initializer=flow.truncated_normal_initializer(stddev=1.0, seed=1))
        >>> bool(abs(job()).max() <= 2)
        True
    """
    return TruncatedNormalInitializer(mean, stddev, seed, dtype)


def truncated_normal(stddev: float = 1.0, seed: Optional[int] = None) -> Initializer:
    """Shorthand for truncated_normal_initializer(0, stddev).

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(1000,), initializer=flow.truncated_normal(0.1, seed=1))
        >>> bool(abs(job()).max() <= 0.2)
        True
    """
    return TruncatedNormalInitializer(0.0, stddev, seed)


def glorot_uniform_initializer(data_format: str = "") -> Initializer:
    """Glorot (Xavier) uniform: U(-b, b) with b = sqrt(6 / (fan_in + fan_out)).

    `data_format` ("NCHW"/"NHWC", or "" for a dense weight) says where a
    convolution weight's channels are when counting fans.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(100, 50), initializer=flow.glorot_uniform_initializer())
        >>> bool(abs(job()).max() <= (6 / 150) ** 0.5)
        True
    """
    return VarianceScalingInitializer(1.0, "fan_avg", "random_uniform", data_format)


def glorot_normal_initializer(data_format: str = "") -> Initializer:
    """Glorot (Xavier) normal: N(0, 2 / (fan_in + fan_out)).

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(100, 100), initializer=flow.glorot_normal_initializer())
        >>> round(float(job().std()), 2)   # sqrt(2 / 200)
        0.1
    """
    return VarianceScalingInitializer(1.0, "fan_avg", "random_normal", data_format)


xavier_uniform_initializer = glorot_uniform_initializer
xavier_normal_initializer = glorot_normal_initializer


def variance_scaling_initializer(scale: float = 1.0, mode: str = "fan_in",
                                 distribution: str = "truncated_normal", data_format: str = "",
                                 seed: Optional[int] = None) -> Initializer:
    """Values with standard deviation sqrt(scale / n), n being the fan in, the
    fan out or their mean (`mode` "fan_in", "fan_out", "fan_avg"), drawn from
    `distribution` ("truncated_normal", "random_normal", "random_uniform").

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(200, 200), initializer=flow.variance_scaling_initializer(2.0, "fan_in", "random_normal"))
        >>> round(float(job().std()), 2)   # sqrt(2 / 200)
        0.1
    """
    return VarianceScalingInitializer(scale, mode, distribution, data_format, seed)


def kaiming_initializer(shape: Optional[Sequence[int]] = None, distribution: str = "random_normal",
                        mode: str = "fan_in", nonlinearity: str = "leaky_relu", negative_slope: float = 0.0,
                        data_format: str = "NCHW") -> Initializer:
    """He (Kaiming) initialization: standard deviation gain / sqrt(fan), the
    gain following `nonlinearity` (and `negative_slope` for leaky_relu).

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(200, 200), initializer=flow.kaiming_initializer(nonlinearity="relu"))
        >>> round(float(job().std()), 2)   # sqrt(2 / 200)
        0.1
    """
    return KaimingInitializer(distribution, mode, nonlinearity, negative_slope, data_format)


# ---------------------------------------------------------------- get_variable

def get_variable(name: str, shape: Optional[Sequence[int]] = None, dtype: Optional[DTypeLike] = None,
                 initializer: Optional[Initializer] = None, regularizer: Optional[Regularizer] = None,
                 trainable: Optional[bool] = None, model_name: Optional[str] = None,
                 random_seed: Optional[int] = None, distribute: Optional[Distribute] = None,
                 reuse: bool = True, parallel_distribution: Optional[Sequence[Any]] = None,
                 nd_sbp: Optional[Sequence[Any]] = None) -> Blob:
    """The session variable `name` as a Blob of the job being traced.

    It is created with `initializer` (zeros by default) the first time a job
    naming it is traced successfully; later jobs see its current value.
    `parallel_distribution` (OneFlow 0.4-0.5; `nd_sbp` later) is its SBP on
    a device hierarchy: ``[]`` or ``["B"]`` lays it whole on each device,
    ``["S(k)"]`` as ``distribute=flow.distribute.split(k)``.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(2,), initializer=flow.constant_initializer(3.0))
        ...     return x * w
        >>> job(np.float32([1, 2])).tolist()
        [3.0, 6.0]
    """
    b = _trace.require_builder("flow.get_variable")
    loc = _trace.user_location()
    if parallel_distribution is not None or nd_sbp is not None:
        from ..distribute import _from_sbp
        sbp = _from_sbp("get_variable", parallel_distribution if parallel_distribution is not None else nd_sbp, loc)
        if distribute is None:
            distribute = sbp
    if not isinstance(name, str) or not name:
        _trace.fail(TypeError, f"get_variable: name must be a non-empty string, got {name!r}", loc)
    if shape is None:
        _trace.fail(ValueError, f"get_variable: variable '{name}' needs a shape", loc)
    if isinstance(shape, list):
        shape = tuple(shape)
    if not isinstance(shape, tuple) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in shape):
        _trace.fail(ValueError, f"get_variable: shape of '{name}' must be a tuple of non-negative "
                    f"ints, got {shape!r}", loc)
    dt = _dtypes.to_dtype(dtype, "get_variable dtype") if dtype is not None else b.default_dtype
    from .. import regularizers, scope
    if regularizer is not None and not isinstance(regularizer, regularizers.Regularizer):
        _trace.fail(TypeError, f"get_variable: regularizer of '{name}' must come from flow.regularizers "
                    f"(l1, l2 or l1_l2), got {regularizer!r}", loc)
    name = scope.namespace_prefix() + name
    if initializer is None:
        initializer = ConstantInitializer(0.0)
    if not isinstance(initializer, Initializer):
        _trace.fail(TypeError, f"get_variable: initializer must be a flow initializer (e.g. "
                    f"flow.random_normal_initializer()), got {initializer!r}", loc)
    trainable = True if trainable is None else bool(trainable)
    seed = getattr(initializer, "seed", None)
    if seed is None:
        seed = random_seed
    blob = b.variable(name, tuple(int(d) for d in shape), dt, initializer, trainable,
                      _derived_seed(name, seed), loc, distribute)
    if regularizer is not None and name not in b.regularizers:
        if dt not in _dtypes.FLOATS:
            _trace.fail(TypeError, f"get_variable: '{name}' is {dt!r}, and only float variables can "
                        "be regularized", loc)
        b.regularizers[name] = (blob, regularizer)
    if trainable and b.type == "train" and b.config.get("enable_ssp") and dt in _dtypes.FLOATS:
        from .._dist import ssp as _ssp
        blob = _ssp.forward_value(blob, b)  # OneFlow's AddSspVariableProxy pass
    return blob


# ---------------------------------------------------------------- session access

class VariableValue(np.ndarray):
    """A numpy copy of a variable's value; `.numpy()` is accepted as in OneFlow."""

    def numpy(self):
        return np.asarray(self)


def get_all_variables() -> Dict[str, "VariableValue"]:
    """{name: value} of every variable in the session (copies).

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2,), initializer=flow.ones_initializer())
        >>> _ = job()
        >>> flow.get_all_variables()["w"].numpy().tolist()
        [1.0, 1.0]
    """
    return {n: _C.variable_value(n).view(VariableValue) for n in _C.variable_names()}


def _as_array(v, name):
    if hasattr(v, "numpy") and not isinstance(v, np.ndarray):
        v = v.numpy()
    if not isinstance(v, np.ndarray):
        raise TypeError(f"load_variables: the value for '{name}' must be a numpy array, got "
                        f"{type(v).__name__}")
    return v


def load_variables(value_dict: Mapping[str, Any], ignore_mismatch: bool = True) -> None:
    """Sets session variables from {name: array}. Names the session does not
    have are skipped when ignore_mismatch is true and an error otherwise;
    shape and dtype must match exactly. Nothing changes if any check fails.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2,), initializer=flow.zeros_initializer())
        >>> _ = job()
        >>> flow.load_variables({"w": np.float32([4, 5])})
        >>> job().tolist()
        [4.0, 5.0]
    """
    if not isinstance(value_dict, dict):
        raise TypeError(f"load_variables: expected a dict of name -> array, got {type(value_dict).__name__}")
    if any(_C.variable_info(name) is None for name in value_dict):
        from .job import trace_defined_jobs
        trace_defined_jobs()  # as in OneFlow, the session's jobs have all their variables by now
    staged = []
    for name, v in value_dict.items():
        info = _C.variable_info(name)
        if info is None:
            if ignore_mismatch:
                continue
            raise ValueError(f"load_variables: the session has no variable named '{name}' "
                             "(pass ignore_mismatch=True to skip unknown names)")
        arr = _as_array(v, name)
        shape, cdt = info[0], info[1]
        dt = _dtypes.from_c(cdt)
        if arr.shape != tuple(shape):
            raise ValueError(f"load_variables: variable '{name}' has shape {tuple(shape)} but the "
                             f"value has shape {arr.shape}")
        if arr.dtype != dt.np:
            raise TypeError(f"load_variables: variable '{name}' is {dt.np} but the value is "
                            f"{arr.dtype}; convert it with .astype(np.{dt.np})")
        staged.append((name, arr))
    for name, arr in staged:
        _C.set_variable_value(name, arr)
