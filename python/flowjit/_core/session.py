"""OneFlow's session-level queries on flowjit: eager mode (there is none), the
job being traced, the machine, deprecated names, and random generators."""
import numbers
import secrets
from typing import Any, Optional

from . import trace as _trace
from .. import scope
from .function_settings import FunctionDesc


def eager_execution_enabled() -> bool:
    """False: flowjit runs OneFlow's lazy job functions only (each
    @global_function is traced once and compiled), never eagerly.

    Example:
        >>> flow.eager_execution_enabled()
        False
    """
    return False


def enable_eager_execution(val: bool = True) -> None:
    """False is accepted (lazy execution is flowjit's only mode); True raises
    NotImplementedError, since flowjit has no eager mode.

    Example:
        >>> flow.enable_eager_execution(False)   # lazy execution, flowjit's only mode
        >>> flow.enable_eager_execution(True)
        Traceback (most recent call last):
        NotImplementedError: ...
    """
    if not isinstance(val, bool):
        raise TypeError(f"enable_eager_execution: expected True or False, got {val!r}")
    if val:
        raise NotImplementedError("enable_eager_execution(True): flowjit has no eager mode; it traces and "
                                  "compiles @flow.global_function jobs (lazy mode) only")


def current_global_function_desc() -> FunctionDesc:
    """The settings of the job being traced, as a read-only FunctionDesc
    (``IsTrainable()``: whether it is a "train" job). Only inside a job
    function while it is traced; elsewhere RuntimeError.

    Example:
        >>> @flow.global_function(type="predict")
        ... def job(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     print("trainable:", flow.current_global_function_desc().IsTrainable())
        ...     return x
        >>> job(np.float32([1])).tolist()
        trainable: False
        [1.0]
    """
    b = _trace.current()
    if b is None:
        raise RuntimeError("current_global_function_desc() can only be used inside a function decorated "
                           "with @flow.global_function, while it is being traced")
    return FunctionDesc(b.config, b.job_name, b.type)


def current_scope() -> scope.Scope:
    """OneFlow's deprecated name of :func:`flowjit.scope.current_scope`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     print(flow.current_scope() is not None)
        ...     return x
        >>> job(np.float32([1])).tolist()
        True
        [1.0]
    """
    return scope.current_scope()


def current_machine_id() -> int:
    """This process's machine id: its rank in the job (flow.env.get_rank(),
    0 when it runs alone; flowjit runs one process per machine).

    Example:
        >>> flow.current_machine_id()   # a process that runs alone
        0
    """
    from .. import env
    return env.get_rank()


# Where OneFlow marked an API deprecated and flowjit has it too (module path, name).
_DEPRECATED = (("", "current_scope"), ("distribute", "mirrored_strategy"),
               ("distribute", "consistent_strategy"), ("distribute", "mirrored_strategy_enabled"),
               ("distribute", "consistent_strategy_enabled"), ("env", "grpc_use_no_signal"),
               ("", "fixed_placement"), ("", "device_prior_placement"), ("data", "decode_ofrecord"),
               ("optimizer", "PolynomialSchduler"))


def is_deprecated(func_or_class: Any) -> bool:
    """Whether `func_or_class` is one of the APIs OneFlow marked deprecated
    (flow.current_scope for flow.scope.current_scope, the ``*_strategy`` names
    of flow.distribute,
    flow.env.grpc_use_no_signal, ...).

    Example:
        >>> flow.is_deprecated(flow.current_scope), flow.is_deprecated(flow.scope.current_scope)
        (True, False)
    """
    import flowjit
    for module, name in _DEPRECATED:
        owner = getattr(flowjit, module, None) if module else flowjit
        if owner is not None and getattr(owner, name, None) is func_or_class and func_or_class is not None:
            return True
    return False


# ---------------------------------------------------------------- generators

def _check_device(device, api):
    """'auto', 'cpu', 'cuda' or 'gpu', with an optional ':index'; the kind."""
    from .. import _C, config
    if not isinstance(device, str):
        raise TypeError(f"{api}: device must be a string such as 'cpu' or 'cuda:0', got {device!r}")
    kind, _, index = device.partition(":")
    if kind not in ("auto", "cpu", "cuda", "gpu") or (kind == "auto" and index):
        raise ValueError(f"{api}: device {device!r} is unimplemented; expected 'auto', 'cpu[:i]' or 'cuda[:i]'")
    if index:
        if not index.isdigit():
            raise ValueError(f"{api}: device index in {device!r} must be a non-negative integer")
        if kind == "cpu":
            n = config._settings["cpu_device_num"]
        else:
            visible = len(_C.gpu_devices()) if _C.gpu_status()["available"] else 0
            n = max(1, config._settings["gpu_device_num"], visible)
        if int(index) >= n:
            raise ValueError(f"{api}: check_failed: device {device!r} does not exist ({n} {kind} device(s); "
                             "see flow.config.cpu_device_num / gpu_device_num)")
    return kind


class Generator:
    """A random generator's seed (OneFlow's flow.Generator(device)).

    flowjit's random numbers (variable initializers) come from the session
    seed (flow.manual_seed, the default generator's) or from an initializer's
    own `seed` argument; a Generator made here is used by nothing by itself:
    it holds a seed, which a script may pass on as such an argument. `device` is
    'auto', 'cpu' or 'cuda' (all generators of one seed give the same
    numbers on every device)."""

    def __init__(self, device: Optional[str] = None):
        self.device = _check_device("auto" if device is None else device, "Generator")
        self._seed = secrets.randbits(62) + 1

    def manual_seed(self, seed: int) -> "Generator":
        """Sets the seed."""
        self._seed = _check_seed(seed, "Generator.manual_seed")
        return self

    def initial_seed(self) -> int:
        """The seed."""
        return self._seed

    def seed(self) -> int:
        """Sets a fresh, nondeterministic seed and returns it."""
        self.manual_seed(secrets.randbits(62) + 1)
        return self.initial_seed()

    def __repr__(self):
        return f"<flow.Generator device={self.device!r} seed={self.initial_seed()}>"


class _DefaultGenerator(Generator):
    """The session's generator: its seed is flow.manual_seed's."""

    def __init__(self, device):
        self.device = device

    def manual_seed(self, seed: int) -> "Generator":
        from . import variables as _variables
        _variables.manual_seed(_check_seed(seed, "default_generator().manual_seed"))
        return self

    def initial_seed(self) -> int:
        from . import variables as _variables
        return _variables._global_seed[0]


def _check_seed(seed, api):
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{api}: expected an int, got {seed!r}")
    return int(seed)


def default_generator(device: Optional[str] = None) -> Generator:
    """The session's generator for `device` ('auto', 'cpu', 'cuda[:i]'):
    its seed is the one flow.manual_seed sets, which every variable
    initializer without its own seed derives its seed from; one seed for
    all devices.

    Example:
        >>> flow.manual_seed(5)
        >>> flow.default_generator().initial_seed()
        5
    """
    return _DefaultGenerator(_check_device("auto" if device is None else device, "default_generator"))
