"""flow.scope: placement, logical views (consistent / mirrored) and name spaces."""
import threading
from typing import Dict, List, Optional, Union

__all__ = ["consistent_view", "mirrored_view", "consistent_view_enabled", "mirrored_view_enabled",
           "placement", "namespace", "LogicalView", "Placement", "current_scope", "Scope", "ParallelDesc"]


class LogicalView:
    """A logical view of a job's blobs (flow.scope.consistent_view() or
    mirrored_view(); for function_config().default_logical_view)."""

    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"flow.scope.{self.kind}_view()"

    def __eq__(self, o):
        return isinstance(o, LogicalView) and o.kind == self.kind

    def __hash__(self):
        return hash(self.kind)


def consistent_view() -> LogicalView:
    """Placeholders are the whole logical batch; flowjit splits it over devices.

    Example:
        >>> config = flow.function_config()
        >>> _ = config.default_logical_view(flow.scope.consistent_view())
        >>> @flow.global_function(function_config=config)
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return x * 3
        >>> job(np.float32([1, 2])).tolist()
        [3.0, 6.0]
    """
    return LogicalView("consistent")


def mirrored_view() -> LogicalView:
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
        from . import _C
        from ._core import trace as _trace
        b = _trace.current()
        saved = None
        if b is not None:  # a placement inside a job body places the ops traced in it
            if self not in b.placements:
                b.placements.append(self)
            saved = _C.current_placement()
            _C.set_current_placement(b.placements.index(self))
        _stack.append((self, saved))
        return self

    def __exit__(self, *exc):
        _, saved = _stack.pop()
        if saved is not None:
            from . import _C
            _C.set_current_placement(saved)
        return False


_stack = []


def current_placement():
    return _stack[-1][0] if _stack else None


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


def placement(device_tag: str, machine_device_ids: Union[str, List[str]],
              hierarchy: Optional[List[int]] = None) -> Placement:
    """Where the ops traced inside ``with flow.scope.placement(...)`` run:
    `device_tag` "cpu" or "gpu", `machine_device_ids` such as "0:0" or "0:0-3"
    (machine 0, devices 0 to 3), or a list of those. `hierarchy` is accepted
    for OneFlow compatibility and ignored.

    Around a job call (or as function_config's default) it places the whole
    job. Inside a job body, scopes on different CPU device sets place each
    layer on its own (model parallel / pipeline placement): gradients and
    updates run where their layer runs, values pass between the device sets,
    and a set of several devices runs its layers data parallel. Each run is
    one batch (no micro-batches yet).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     with flow.scope.placement("cpu", "0:0"):   # machine 0, device 0
        ...         return x + 1
        >>> job(np.float32([1, 2])).tolist()
        [2.0, 3.0]
    """
    return Placement(device_tag, machine_device_ids)


# ---------------------------------------------------------------- logical view queries

def _current_view():
    """The logical view of the job being traced (its function_config's), or
    the default, consistent, outside a job body."""
    from ._core import trace as _trace
    b = _trace.current()
    view = b.config.get("default_logical_view") if b is not None else None
    return view if view is not None else consistent_view()


def consistent_view_enabled() -> bool:
    """True where the job being traced (or, outside one, the default) uses the consistent view."""
    return _current_view() == consistent_view()


def mirrored_view_enabled() -> bool:
    """True where the job being traced uses the mirrored view."""
    return _current_view() == mirrored_view()


# ---------------------------------------------------------------- name spaces

_names = threading.local()


def namespace_prefix():
    """"a-b-" inside flow.scope.namespace("a") and namespace("b"), else ""."""
    stack = getattr(_names, "stack", None)
    return "".join(f"{n}-" for n in stack) if stack else ""


class namespace:  # noqa: N801 - OneFlow's name
    """``with flow.scope.namespace("encoder"):`` prefixes the names of the
    variables (get_variable and layers) and ops traced inside with
    "encoder-", as OneFlow does; name spaces nest ("a-b-w")."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise TypeError(f"scope.namespace: name must be a non-empty string, got {name!r}")
        self.name = name

    def __enter__(self):
        stack = getattr(_names, "stack", None)
        if stack is None:
            stack = _names.stack = []
        stack.append(self.name)
        return self

    def __exit__(self, *exc):
        _names.stack.pop()
        return False

    def __repr__(self):
        return f"flow.scope.namespace({self.name!r})"


# ---------------------------------------------------------------- the current scope

class ParallelDesc:
    """The devices of a scope (OneFlow's ParallelDesc symbol): `device_tag`
    ("cpu" or "gpu"), `machine_id2device_id_list` ({machine: [devices]})
    and `parallel_num` (how many devices in all)."""

    def __init__(self, device_tag: str, devices: Dict[int, List[int]]):
        self.device_tag = device_tag
        self.machine_id2device_id_list = devices
        self.parallel_num = sum(len(d) for d in devices.values())

    def __repr__(self):
        return f"ParallelDesc({self.device_tag!r}, {self.machine_id2device_id_list!r})"


class Scope:
    """Where ops traced now would go (OneFlow's Scope): its devices
    (`device_parallel_desc_symbol`), whether the logical view is mirrored
    (`is_mirrored_view`), the name spaces entered (`name_scopes`) and the
    job being traced (`job_name`, None outside a job body)."""

    def __init__(self, parallel_desc: ParallelDesc, is_mirrored_view: bool, name_scopes: List[str],
                 job_name: Optional[str]):
        self.device_parallel_desc_symbol = parallel_desc
        self.is_mirrored_view = is_mirrored_view
        self.name_scopes = name_scopes
        self.job_name = job_name

    def __repr__(self):
        return (f"Scope(job={self.job_name!r}, {self.device_parallel_desc_symbol!r}, "
                f"mirrored={self.is_mirrored_view}, name_scopes={self.name_scopes!r})")


def current_scope() -> Scope:
    """The scope ops traced here would get: the innermost
    flow.scope.placement (else the job's default_placement_scope, else all
    CPU devices of machine 0), the job's logical view and the name spaces
    entered.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     print(type(flow.scope.current_scope()).__name__)
        ...     return x
        >>> job(np.float32([1])).tolist()
        Scope
        [1.0]
    """
    from ._core import trace as _trace
    from . import config
    b = _trace.current()
    p = current_placement()
    if p is None and b is not None:
        p = b.config.get("default_placement_scope")
    if p is None:
        p = Placement("cpu", f"0:0-{config.device_count() - 1}")
    devices = {}
    for m, devs in p.devices:
        devices.setdefault(m, []).extend(devs)
    return Scope(ParallelDesc(p.device_tag, devices), mirrored_view_enabled(),
                 list(getattr(_names, "stack", None) or []), b.job_name if b is not None else None)
