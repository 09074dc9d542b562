"""flow.distribute: how a variable or blob is laid out over devices, and
OneFlow 0.1-0.2's distribute strategies (the logical views of later releases)."""

__all__ = ["split", "broadcast", "auto", "consistent_strategy", "mirrored_strategy",
           "consistent_strategy_enabled", "mirrored_strategy_enabled", "Distribute",
           "assert_is_valid_distribute"]


class Distribute:
    """How a variable or blob lies across devices: made by :func:`split`,
    :func:`broadcast` or :func:`auto`."""

    def __init__(self, kind, axis=None):
        self.kind, self.axis = kind, axis

    def __repr__(self):
        return f"flow.distribute.{self.kind}({'' if self.axis is None else self.axis})"

    def __eq__(self, o):
        return isinstance(o, Distribute) and (o.kind, o.axis) == (self.kind, self.axis)

    def __hash__(self):
        return hash((self.kind, self.axis))


def split(axis):
    """Each device holds a slice along `axis`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(4, 2), initializer=flow.ones_initializer(),
        ...                           distribute=flow.distribute.split(0))   # rows spread over the devices
        ...     return x + w
        >>> job(np.zeros((4, 2), np.float32))[0].tolist()
        [1.0, 1.0]
    """
    if not isinstance(axis, int):
        raise TypeError(f"distribute.split: axis must be an int, got {axis!r}")
    return Distribute("split", axis)


def broadcast():
    """Every device holds the whole value.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.parallel_cast(x, distribute=flow.distribute.broadcast()) + 1   # a copy on every device
        >>> job(np.float32([1, 2])).tolist()
        [2.0, 3.0]
    """
    return Distribute("broadcast")


def _from_sbp(api, sbp, loc=None):
    """OneFlow's SBP list (``parallel_distribution=`` / ``nd_sbp=``: strings
    "B", "S(k)" or "P", or split()/broadcast() objects, one per axis of the
    placement's hierarchy) as a Distribute, or None for an empty list."""
    from ._core import trace as _trace
    if isinstance(sbp, (str, Distribute)):
        sbp = [sbp]
    if not isinstance(sbp, (list, tuple)):
        _trace.fail(TypeError, f"{api}: parallel_distribution must be a list of SBP strings (\"B\", \"S(0)\"), "
                    f"got {sbp!r}", loc)
    if not sbp:
        return None
    if len(sbp) > 1:
        _trace.fail(NotImplementedError, f"{api}: parallel_distribution {list(sbp)!r} lays a blob out on a "
                    f"{len(sbp)}-D device hierarchy; flowjit places jobs on a flat list of devices (one SBP)", loc)
    s = sbp[0]
    if isinstance(s, Distribute):
        return s
    text = str(s).replace(" ", "")
    if text == "B":
        return Distribute("broadcast")
    if text.startswith("S(") and text.endswith(")") and text[2:-1].lstrip("-").isdigit():
        return Distribute("split", int(text[2:-1]))
    _trace.fail(NotImplementedError if text == "P" else ValueError,
                f"{api}: parallel_distribution entry {s!r}: flowjit lays variables out as \"B\" or \"S(k)\"", loc)


def auto():
    """flowjit chooses."""
    return Distribute("auto")


def consistent_strategy():
    """OneFlow 0.1-0.2's name of the consistent view: for
    function_config().default_distribute_strategy(...)."""
    from . import scope
    return scope.consistent_view()


def mirrored_strategy():
    """OneFlow 0.1-0.2's name of the mirrored view."""
    from . import scope
    return scope.mirrored_view()


def consistent_strategy_enabled():
    """= flow.scope.consistent_view_enabled()."""
    from . import scope
    return scope.consistent_view_enabled()


def mirrored_strategy_enabled():
    """= flow.scope.mirrored_view_enabled()."""
    from . import scope
    return scope.mirrored_view_enabled()


def assert_is_valid_distribute(distribute: Distribute) -> None:
    """Raises TypeError unless `distribute` is flow.distribute.split(axis),
    broadcast() or auto()."""
    if not isinstance(distribute, Distribute):
        raise TypeError("not a valid distribute: expected flow.distribute.split(axis), broadcast() or "
                        f"auto(), got {distribute!r}")
