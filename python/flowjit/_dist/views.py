"""Logical views and layout casts (OneFlow's cast_to_current_logical_view,
parallel_cast, flow.advanced.distribute_*): what they mean on flowjit.

In flowjit a job has one logical view, its function_config's, and every blob
of the job is in it; the compiler chooses how each blob lies over the job's
devices. So a cast between views is the identity, a layout cast
(parallel_cast) changes no value and records the declared layout on the
result, and the distribute_* ops are their values: the parts of a balanced
split, copies, a sum, a concatenation. Shapes are static, so casting to a
static shape is a copy and resizing to a runtime size cannot be done.
"""
import numbers
from typing import Callable, List, Optional, Sequence, Tuple, Union

from .._ops import array as _array, composite as _composite, builders as _ops
from .._core import trace as _trace
from .. import distribute as _dist
from .._core.blob import Blob, _devices_of

__all__ = ["cast_to_current_logical_view", "parallel_cast", "hierarchical_parallel_cast",
           "cast_to_static_shape", "sync_dynamic_resize", "distribute_clone", "distribute_add",
           "distribute_split", "distribute_concat", "distribute_map"]


def _blob(x, api, what="x"):
    b = _trace.require_builder(f"flow.{api}")
    loc = _trace.user_location()
    if not isinstance(x, Blob):
        _trace.fail(TypeError, f"{api}: {what} must be a Blob, got {type(x).__name__}", loc)
    b.check_owned(x, api, loc)
    return x


def cast_to_current_logical_view(x: Blob) -> Blob:
    """`x` in the logical view of the code around the call. Every blob of a
    flowjit job is in the job's view, so this is `x` itself.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.cast_to_current_logical_view(x)
        >>> job(np.float32([1, 2])).tolist()
        [1.0, 2.0]
    """
    return _blob(x, "cast_to_current_logical_view")


def _layout(d, api, what):
    if d is None:
        return None
    if not isinstance(d, _dist.Distribute) or d.kind == "auto":
        _trace.fail(ValueError, f"{api}: {what} must be flow.distribute.split(axis), broadcast() or None, "
                    f"got {d!r}", _trace.user_location())
    return d


def parallel_cast(input: Blob, name: Optional[str] = None,  # noqa: A002 - OneFlow's name
                  distribute: Optional[_dist.Distribute] = None,
                  gradient_distribute: Optional[_dist.Distribute] = None) -> Blob:
    """A copy of `input` declared with layout `distribute` (and its gradient
    with `gradient_distribute`). Layouts never change values; flowjit's
    compiler chooses the layout of each value, and the result's
    ``distribute`` / ``split_axis`` say what was declared.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.parallel_cast(x, distribute=flow.distribute.broadcast()) * 2
        >>> job(np.float32([1, 2])).tolist()
        [2.0, 4.0]
    """
    x = _blob(input, "parallel_cast", "input")
    d = _layout(distribute, "parallel_cast", "distribute")
    _layout(gradient_distribute, "parallel_cast", "gradient_distribute")
    if d is not None and d.kind == "split" and not -x.ndim <= d.axis < max(x.ndim, 1):
        _trace.fail(ValueError, f"parallel_cast: blob '{x.name}' has shape {x.shape}, which has no axis "
                    f"{d.axis}", _trace.user_location())
    y = _ops.identity(x, name=name)
    if d is not None:
        y._distribute = _dist.split(d.axis % max(x.ndim, 1)) if d.kind == "split" else d
    return y


def _sbp(s, api, what):
    if isinstance(s, _dist.Distribute) and s.kind != "auto":
        return s
    if isinstance(s, str):
        t = s.strip()
        if t in ("B", "P"):
            return t
        if t.startswith("S(") and t.endswith(")") and t[2:-1].strip().lstrip("-").isdigit():
            return t
    _trace.fail(ValueError, f"hierarchical_parallel_cast: each entry of {what} must be \"S(axis)\", \"B\", "
                f"\"P\" or a flow.distribute split / broadcast, got {s!r}", _trace.user_location())


def hierarchical_parallel_cast(input: Blob, parallel_distribution: Sequence[Union[str, _dist.Distribute]],  # noqa: A002
                               grad_mode: Optional[str] = None,
                               grad_parallel_distribution: Optional[Sequence[Union[str, _dist.Distribute]]] = None,
                               name: Optional[str] = None) -> Blob:
    """parallel_cast over a device hierarchy: one layout per level ("S(0)",
    "B", "P"). A copy of `input`; the layouts are checked and, as every
    layout in flowjit, chosen by the compiler.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.hierarchical_parallel_cast(x, ["B"]) + 1
        >>> job(np.float32([1, 2])).tolist()
        [2.0, 3.0]
    """
    x = _blob(input, "hierarchical_parallel_cast", "input")
    if isinstance(parallel_distribution, (str, _dist.Distribute)) or not isinstance(
            parallel_distribution, (list, tuple)) or not parallel_distribution:
        _trace.fail(TypeError, "hierarchical_parallel_cast: parallel_distribution must be a non-empty list "
                    f"such as [\"S(0)\", \"B\"], got {parallel_distribution!r}", _trace.user_location())
    for s in parallel_distribution:
        _sbp(s, "hierarchical_parallel_cast", "parallel_distribution")
    for s in grad_parallel_distribution or ():
        _sbp(s, "hierarchical_parallel_cast", "grad_parallel_distribution")
    if grad_mode not in (None, "restore", "same", "manual"):
        _trace.fail(ValueError, "hierarchical_parallel_cast: grad_mode must be \"restore\", \"same\" or "
                    f"\"manual\", got {grad_mode!r}", _trace.user_location())
    return _ops.identity(x, name=name)


def cast_to_static_shape(x: Blob, name: Optional[str] = None) -> Blob:
    """A copy of `x` with a static shape; flowjit's shapes are all static.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.cast_to_static_shape(x)
        >>> job(np.float32([1, 2])).tolist()
        [1.0, 2.0]
    """
    return _ops.identity(_blob(x, "cast_to_static_shape"), name=name)


def sync_dynamic_resize(inputs: Blob, size: Blob, name: Optional[str] = None) -> Blob:
    """OneFlow's resize of a dynamic blob's first axis to a runtime size.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,)), n: tp.Numpy.Placeholder((1,), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.sync_dynamic_resize(x, n)
        >>> job(np.float32([1, 2, 3, 4]), np.int32([2]))
        Traceback (most recent call last):
        NotImplementedError: ...
    """
    _blob(inputs, "sync_dynamic_resize", "inputs")
    _trace.fail(NotImplementedError, "sync_dynamic_resize: flowjit has no dynamic shapes (every blob's "
                "shape is known when the job is traced), so a blob cannot take a size computed at run "
                "time; slice it to a known size with flow.slice instead", _trace.user_location())


# ---------------------------------------------------------------- flow.advanced.distribute_*

def _parallel_num():
    from .. import scope
    b = _trace.current()
    placement = scope.current_placement()
    if placement is None and b is not None:
        placement = b.config.get("default_placement_scope")
    return _devices_of(placement)[2]


def _balanced(n, parts):
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def distribute_clone(x: Blob, name: Optional[str] = None) -> Tuple[Blob, ...]:
    """One copy of `x` per device of the current placement.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     copies = flow.advanced.distribute_clone(x)   # one per device (one here)
        ...     return flow.advanced.distribute_add([c * 2 for c in copies])
        >>> job(np.float32([1, 2])).tolist()
        [2.0, 4.0]
    """
    x = _blob(x, "advanced.distribute_clone")
    n = _parallel_num()
    return tuple(_ops.identity(x, name=None if name is None else f"{name}_out_{i}") for i in range(n))


def distribute_split(x: Blob, axis: int = 0, name: Optional[str] = None) -> Tuple[Blob, ...]:
    """`x` cut along `axis` into one part per device of the current placement,
    as evenly as possible (the first parts one longer).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     parts = flow.advanced.distribute_split(x, axis=0)   # one part per device
        ...     return flow.advanced.distribute_concat([p + 1 for p in parts], axis=0)
        >>> job(np.float32([1, 2, 3, 4])).tolist()
        [2.0, 3.0, 4.0, 5.0]
    """
    x = _blob(x, "advanced.distribute_split")
    n = _parallel_num()
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or not -x.ndim <= axis < x.ndim:
        _trace.fail(ValueError, f"advanced.distribute_split: axis must be an axis of the rank-{x.ndim} blob "
                    f"'{x.name}', got {axis!r}", _trace.user_location())
    axis = int(axis) % x.ndim
    if x.shape[axis] < n:
        _trace.fail(ValueError, f"advanced.distribute_split: blob '{x.name}' has {x.shape[axis]} rows along "
                    f"axis {axis}, fewer than the {n} devices", _trace.user_location())
    if n == 1:
        return (_ops.identity(x, name=name),)
    return tuple(_array.split(x, _balanced(x.shape[axis], n), axis=axis, name=name))


def _parts(xs, api):
    if isinstance(xs, Blob) or not isinstance(xs, (list, tuple)) or not xs:
        _trace.fail(TypeError, f"{api}: xs must be a non-empty list of Blobs, one per device",
                    _trace.user_location())
    for i, x in enumerate(xs):
        _blob(x, api, f"xs[{i}]")
    n = _parallel_num()
    if len(xs) != n:
        _trace.fail(ValueError, f"{api}: the current placement has {n} device(s) but {len(xs)} blobs were "
                    "given; give one per device", _trace.user_location())
    return list(xs)


def distribute_add(xs: Sequence[Blob], name: Optional[str] = None) -> Blob:
    """The sum of one blob per device of the current placement.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.advanced.distribute_add(flow.advanced.distribute_clone(x))
        >>> job(np.float32([1, 2])).tolist()   # the sum over one device
        [1.0, 2.0]
    """
    xs = _parts(xs, "advanced.distribute_add")
    return _ops.identity(xs[0], name=name) if len(xs) == 1 else _composite.add_n(xs, name=name)


def distribute_concat(xs: Sequence[Blob], axis: int = 0, name: Optional[str] = None) -> Blob:
    """One blob per device of the current placement joined along `axis`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.advanced.distribute_concat(flow.advanced.distribute_split(x, axis=1), axis=1)
        >>> job(np.float32([[1, 2], [3, 4]])).tolist()
        [[1.0, 2.0], [3.0, 4.0]]
    """
    xs = _parts(xs, "advanced.distribute_concat")
    return _ops.identity(xs[0], name=name) if len(xs) == 1 else _array.concat(xs, axis=axis, name=name)


def distribute_map(xs: Union[Blob, Sequence[Blob]], f: Callable[..., Union[Blob, Sequence[Blob]]],
                   axis: int = 0) -> Union[Blob, Tuple[Blob, ...]]:
    """f applied to the parts of `xs` (each split along `axis`, one part per
    device of the current placement), the results joined along `axis`:
    f(x_part_0, y_part_0, ...), ... . Returns one blob where f returns one
    blob, else a tuple.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,)), y: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.advanced.distribute_map([x, y], lambda a, b: a * b)   # per device part
        >>> job(np.float32([1, 2, 3, 4]), np.float32([2, 2, 2, 2])).tolist()
        [2.0, 4.0, 6.0, 8.0]
    """
    seq = list(xs) if isinstance(xs, (list, tuple)) else [xs]
    if not seq:
        _trace.fail(TypeError, "advanced.distribute_map: xs must be a Blob or a non-empty list of Blobs",
                    _trace.user_location())
    if not callable(f):
        _trace.fail(TypeError, f"advanced.distribute_map: f must be callable, got {type(f).__name__}",
                    _trace.user_location())
    parts = [distribute_split(x, axis=axis) for x in seq]
    results: List[Tuple[Blob, ...]] = []
    single = True
    for args in zip(*parts):
        r = f(*args)
        if isinstance(r, Blob):
            r = (r,)
        else:
            single = False
            if not isinstance(r, (list, tuple)) or not all(isinstance(v, Blob) for v in r):
                _trace.fail(TypeError, "advanced.distribute_map: f must return a Blob or a tuple of Blobs, "
                            f"got {type(r).__name__}", _trace.user_location())
        results.append(tuple(r))
    joined = tuple(distribute_concat(list(col), axis=axis) for col in zip(*results))
    return joined[0] if single else joined
