"""Blob: a value of the job being traced (OneFlow's BlobDef), its placement
(ParallelConf) and flow.Size."""
import numbers
from typing import Any, Iterable, List, Optional

from .. import _C, scope
from . import dtypes as _dtypes

# OneFlow's value of split_axis for a blob that is not split.
INVALID_SPLIT_AXIS = -22


class Size(tuple):
    """A shape: a tuple of non-negative ints (OneFlow's flow.Size), with
    numel() and a keyword-friendly index()."""

    def __new__(cls, dims: Iterable[int] = ()):
        try:
            items = tuple(dims)
        except TypeError:
            raise TypeError(f"flow.Size: expected a sequence of ints, got {type(dims).__name__}") from None
        for d in items:
            if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 0:
                raise ValueError(f"flow.Size: every extent must be a non-negative int, got {d!r} in "
                                 f"{items!r}")
        return super().__new__(cls, (int(d) for d in items))

    def numel(self) -> int:
        """The number of elements of a tensor of this shape (1 for ())."""
        n = 1
        for d in self:
            n *= d
        return n

    def index(self, value: int, start: int = 0, end: Optional[int] = None) -> int:  # type: ignore[override]
        """The first axis in [start, end) whose extent is `value` (ValueError if none)."""
        return super().index(value, start, len(self) if end is None else end)

    def __repr__(self):
        return f"flow.Size({list(self)})"


class ParallelConf:
    """Where a blob lives (OneFlow's parallel_conf): a device tag and the
    devices, "machine:devices" strings such as "0:0-1"."""

    def __init__(self, device_tag: str, device_names: List[str]):
        self._tag = device_tag
        self._names = list(device_names)

    def device_tag(self) -> str:
        """"cpu" or "gpu"."""
        return self._tag

    def device_name(self, i: Optional[int] = None) -> Any:
        """The device strings (with `i`: the i-th)."""
        return list(self._names) if i is None else self._names[i]

    def __repr__(self):
        return f"ParallelConf(device_tag={self._tag!r}, device_name={self._names!r})"


def _devices_of(placement):
    if placement is not None:
        names = [f"{m}:{d[0]}" if len(d) == 1 else f"{m}:{d[0]}-{d[-1]}" for m, d in placement.devices]
        return placement.device_tag, names, sum(len(d) for _, d in placement.devices)
    from .._dist import devices as _devices
    local = _devices.local_device_count()
    _, procs = _devices.process_info()
    names = [f"{m}:0" if local == 1 else f"{m}:0-{local - 1}" for m in range(procs)]
    return "cpu", names, local * procs


class Blob:
    """A symbolic tensor inside a job function: it has a shape, a dtype and a
    name, but no data. Operators build IR nodes.

    Layout attributes (OneFlow's): ``distribute`` is what was declared
    (flow.distribute.split on a variable, ``with_distribute``), auto where
    nothing was; ``split_axis`` adds what is known while tracing (see there).
    Shapes are static (``is_dynamic`` False).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     y = flow.math.relu(x) * 2 + 1   # ops and operators on blobs give blobs
        ...     print(y)                        # while tracing: no data yet
        ...     print(y.shape, y.dtype, len(y))
        ...     return y                        # the call returns its value as numpy
        >>> job(np.float32([[1, -2, 3], [-4, 5, -6]]))   # traced (and printing) on this first call
        Blob(name='add_1', shape=(2, 3), dtype=flow.float32, job='job')
        (2, 3) flow.float32 2
        array([[ 3.,  1.,  7.],
               [ 1., 11.,  1.]], dtype=float32)
        >>> job(np.float32([[0, 0, 0], [1, 1, 1]]))      # later calls only run the compiled job
        array([[1., 1., 1.],
               [3., 3., 3.]], dtype=float32)
    """

    __slots__ = ("_node", "_builder", "_name", "_placement", "_distribute", "__weakref__")

    def __init__(self, node, builder, name):
        self._node = node
        self._builder = builder
        self._name = name
        self._placement = scope.current_placement()
        self._distribute = None

    @property
    def shape(self):
        """The static shape, a tuple of ints."""
        return self._node.shape

    @property
    def dtype(self):
        """The flowjit dtype (flow.float32, ...)."""
        return _dtypes.from_c(self._node.dtype)

    @property
    def name(self):
        """The blob's name in its job (the op's name)."""
        return self._name

    @property
    def op_name(self) -> str:
        """The name of the op that produced the blob (= name)."""
        return self._name

    @property
    def blob_name(self) -> str:
        """The output's name within its op: "out" (a flowjit op has one output)."""
        return "out"

    @property
    def logical_blob_name(self) -> str:
        """"op_name/blob_name", as in OneFlow."""
        return f"{self._name}/out"

    unique_name = logical_blob_name

    @property
    def job_name(self) -> str:
        """The job being traced when the blob was made."""
        return self._builder.job_name if self._builder is not None else "?"

    @property
    def ndim(self):
        """The rank."""
        return len(self._node.shape)

    @property
    def is_dynamic(self) -> bool:
        """False: flowjit's shapes are static (a tp.ListNumpy argument of
        another shape compiles the job again)."""
        return False

    @property
    def is_tensor_list(self) -> bool:
        """False: flowjit has no tensor lists."""
        return False

    @property
    def disable_boxing(self) -> bool:
        """False: values move between layouts wherever the compiler needs it."""
        return False

    @property
    def parallel_conf(self) -> ParallelConf:
        """The devices the blob lives on: the placement scope it was made in,
        else the job's devices (flow.config.cpu_device_num CPUs)."""
        tag, names, _ = _devices_of(self._placement or self._job_placement())
        return ParallelConf(tag, names)

    @property
    def parallel_size(self) -> int:
        """How many devices hold (a part of) the blob."""
        return _devices_of(self._placement or self._job_placement())[2]

    def _job_placement(self):
        b = self._builder
        return b.config.get("default_placement_scope") if b is not None else None

    @property
    def distribute(self):
        """The declared layout over devices (flow.distribute.split(axis) or
        broadcast()), else flow.distribute.auto()."""
        from .. import distribute as _dist
        if self._distribute is not None:
            return self._distribute
        axis = self._builder.split_vars.get(self._name) if self._builder is not None and \
            self._is_variable() else None
        return _dist.split(axis) if axis is not None else _dist.auto()

    @property
    def split_axis(self) -> int:
        """The axis along which the blob lies split over the job's devices, as
        far as it is known while tracing (OneFlow's split_axis): a declared
        split (a variable's distribute=, with_distribute, parallel_cast), a
        placeholder of a consistent job on several devices (split along axis
        0 where its first extent divides, see jit/distribute.h). Else
        flow.INVALID_SPLIT_AXIS: not split, or laid out by the compiler after
        tracing."""
        d = self.distribute
        if d.kind == "split":
            return d.axis
        if d.kind == "auto" and self._node.op == _C.OpKind.parameter and self.ndim > 0 \
                and self._builder is not None \
                and self._builder.config.get("default_logical_view", scope.consistent_view()) \
                == scope.consistent_view():
            parts = self.parallel_size
            if parts > 1 and self.shape[0] % parts == 0:
                return 0
        return INVALID_SPLIT_AXIS

    def _is_variable(self):
        entry = self._builder.variables.get(self._name) if self._builder is not None else None
        return entry is not None and entry[0]._node is self._node

    def with_distribute(self, distribute) -> "Blob":
        """The same value declared with layout `distribute` (a hint, as in
        OneFlow: values are unchanged). On a variable, split(axis) is the
        variable's layout over several devices, as get_variable's distribute=."""
        from . import trace as _trace
        from .. import distribute as _dist
        loc = _trace.user_location()
        if not isinstance(distribute, _dist.Distribute):
            _trace.fail(TypeError, f"with_distribute: expected flow.distribute.split(axis), broadcast() "
                        f"or auto(), got {distribute!r}", loc)
        if distribute.kind == "split" and not -self.ndim <= distribute.axis < max(self.ndim, 1):
            _trace.fail(ValueError, f"with_distribute: blob '{self._name}' has shape {self.shape}, which "
                        f"has no axis {distribute.axis}", loc)
        if distribute.kind == "split" and distribute.axis < 0:
            distribute = _dist.split(distribute.axis + self.ndim)
        if self._builder is not None and self._is_variable() and distribute.kind == "split":
            self._builder.declare_split(self._name, self.shape, distribute, loc, "with_distribute")
        view = Blob(self._node, self._builder, self._name)
        view._placement = self._placement
        view._distribute = distribute
        return view

    def with_split_distribute(self, axis: int) -> "Blob":
        """with_distribute(flow.distribute.split(axis))."""
        from .. import distribute as _dist
        return self.with_distribute(_dist.split(axis))

    def with_broadcast_distribute(self) -> "Blob":
        """with_distribute(flow.distribute.broadcast())."""
        from .. import distribute as _dist
        return self.with_distribute(_dist.broadcast())

    def with_gradient_distribute(self, distribute) -> "Blob":
        """flow.parallel_cast(self, gradient_distribute=distribute)."""
        from .._dist import views as _views
        return _views.parallel_cast(self, gradient_distribute=distribute)

    def __repr__(self):
        job = self._builder.job_name if self._builder is not None else "?"
        return f"Blob(name={self._name!r}, shape={self.shape}, dtype={self.dtype!r}, job={job!r})"

    def __bool__(self):
        raise TypeError(f"blob '{self._name}' has no value while the job is being traced, so it "
                        "cannot be used as a Python bool (use flow.where for data-dependent choices)")

    def __array__(self, *args, **kwargs):
        raise TypeError(f"blob '{self._name}' has no data while the job is being traced; return it "
                        "from the job function to get a numpy array")

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d blob")
        return self.shape[0]

    __hash__ = object.__hash__

    # Arithmetic and comparison operators (numpy broadcasting).
    def __add__(self, o): return _ops().add(self, o)
    def __radd__(self, o): return _ops().add(o, self)
    def __sub__(self, o): return _ops().subtract(self, o)
    def __rsub__(self, o): return _ops().subtract(o, self)
    def __mul__(self, o): return _ops().multiply(self, o)
    def __rmul__(self, o): return _ops().multiply(o, self)
    def __truediv__(self, o): return _ops().divide(self, o)
    def __rtruediv__(self, o): return _ops().divide(o, self)
    def __floordiv__(self, o): return _composite().floordiv(self, o)
    def __rfloordiv__(self, o): return _composite().floordiv(o, self)
    def __mod__(self, o): return _exact_mod(self, o)
    def __rmod__(self, o): return _exact_mod(o, self)
    def __pow__(self, o): return _ops().pow(self, o)
    def __rpow__(self, o): return _ops().pow(o, self)
    def __neg__(self): return _ops().negative(self)
    def __abs__(self): return _ops().abs(self)
    def __lt__(self, o): return _ops().less(self, o)
    def __le__(self, o): return _ops().less_equal(self, o)
    def __gt__(self, o): return _ops().greater(self, o)
    def __ge__(self, o): return _ops().greater_equal(self, o)
    def __eq__(self, o): return _ops().equal(self, o)
    def __ne__(self, o): return _ops().not_equal(self, o)
    def __and__(self, o): return _ops().logical_and(self, o)
    def __or__(self, o): return _ops().logical_or(self, o)
    def __invert__(self): return _ops().logical_not(self)


def _ops():
    from .._ops import builders as ops
    return ops


def _composite():
    from .._ops import composite
    return composite


def _exact_mod(x, y):
    """x % y (flow.math.mod: the sign of y), for float32 computed in float64,
    where x - floor(x / y) * y is exact, so the result is numpy's to the last
    bit (in float32 the product rounds: errors of 1 ulp of x near 0)."""
    ops, composite = _ops(), _composite()
    xb, yb = ops._lift_pair(x, y, "mod")
    if xb.dtype is _dtypes.float32 and yb.dtype is _dtypes.float32:
        r = composite.mod(ops.cast(xb, _dtypes.float64), ops.cast(yb, _dtypes.float64))
        return ops.cast(r, _dtypes.float32)
    return composite.mod(xb, yb)
