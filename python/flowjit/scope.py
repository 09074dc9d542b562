"""flow.scope: placement and logical views (consistent / mirrored)."""


class LogicalView:
    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"flow.scope.{self.kind}_view()"

    def __eq__(self, o):
        return isinstance(o, LogicalView) and o.kind == self.kind

    def __hash__(self):
        return hash(self.kind)


def consistent_view():
    """Placeholders are the whole logical batch; flowjit splits it over devices."""
    return LogicalView("consistent")


def mirrored_view():
    """Each device gets its own array (tp.ListNumpy placeholders)."""
    return LogicalView("mirrored")


class Placement:
    """Where ops traced inside the scope run: flow.scope.placement("cpu", "0:0")."""

    def __init__(self, device_tag, machine_device_ids):
        if device_tag not in ("cpu", "gpu"):
            raise ValueError(f"scope.placement: device_tag must be \"cpu\" or \"gpu\", got {device_tag!r}")
        if isinstance(machine_device_ids, str):
            machine_device_ids = [machine_device_ids]
        self.device_tag = device_tag
        self.devices = [parse_device_ids(s) for s in machine_device_ids]

    def __repr__(self):
        return f"flow.scope.placement({self.device_tag!r}, {self.devices!r})"

    def key(self):
        return self.device_tag, tuple((m, tuple(d)) for m, d in self.devices)

    def __eq__(self, o):
        return isinstance(o, Placement) and o.key() == self.key()

    def __hash__(self):
        return hash(self.key())

    def __enter__(self):
        _stack.append(self)
        from . import _trace
        b = _trace.current()
        if b is not None:  # a placement inside a job body places the job
            b.placements.append(self)
        return self

    def __exit__(self, *exc):
        _stack.pop()
        return False


_stack = []


def current_placement():
    return _stack[-1] if _stack else None


def parse_device_ids(s):
    """"0:0-3" -> (machine 0, devices [0, 1, 2, 3])."""
    if not isinstance(s, str) or ":" not in s:
        raise ValueError(f"scope.placement: expected \"machine:devices\" such as \"0:0\" or \"0:0-1\", got {s!r}")
    m, d = s.split(":", 1)
    try:
        machine = int(m)
        if "-" in d:
            lo, hi = (int(v) for v in d.split("-", 1))
            devs = list(range(lo, hi + 1))
        else:
            devs = [int(d)]
    except ValueError:
        raise ValueError(f"scope.placement: cannot parse device ids {s!r}") from None
    if not devs:
        raise ValueError(f"scope.placement: empty device range in {s!r}")
    return machine, devs


def placement(device_tag, machine_device_ids, hierarchy=None):
    return Placement(device_tag, machine_device_ids)
