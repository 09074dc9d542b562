"""Blob: a value of the job being traced (OneFlow's BlobDef)."""
from . import _dtypes


class Blob:
    """A symbolic tensor inside a job function: it has a shape, a dtype and a
    name, but no data. Operators build IR nodes."""

    __slots__ = ("_node", "_builder", "_name", "__weakref__")

    def __init__(self, node, builder, name):
        self._node = node
        self._builder = builder
        self._name = name

    @property
    def shape(self):
        return self._node.shape

    @property
    def dtype(self):
        return _dtypes.from_c(self._node.dtype)

    @property
    def name(self):
        return self._name

    @property
    def logical_blob_name(self):
        return self._name

    @property
    def ndim(self):
        return len(self._node.shape)

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
    from . import _ops as ops
    return ops
