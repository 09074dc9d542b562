"""flow.distribute: how a variable or blob is laid out over devices."""


class Distribute:
    def __init__(self, kind, axis=None):
        self.kind, self.axis = kind, axis

    def __repr__(self):
        return f"flow.distribute.{self.kind}({'' if self.axis is None else self.axis})"

    def __eq__(self, o):
        return isinstance(o, Distribute) and (o.kind, o.axis) == (self.kind, self.axis)

    def __hash__(self):
        return hash((self.kind, self.axis))


def split(axis):
    """Each device holds a slice along `axis`."""
    if not isinstance(axis, int):
        raise TypeError(f"distribute.split: axis must be an int, got {axis!r}")
    return Distribute("split", axis)


def broadcast():
    """Every device holds the whole value."""
    return Distribute("broadcast")


def auto():
    """flowjit chooses."""
    return Distribute("auto")
