"""flow.config: devices per machine and runtime threads."""
import numbers

from . import _C

__all__ = ["cpu_device_num", "gpu_device_num", "device_count", "cpu_threads", "enable_debug_mode",
           "enable_legacy_model_io", "enable_model_io_v2"]

_settings = {"cpu_device_num": 1, "gpu_device_num": 0, "legacy_model_io": False, "model_io_v2": False}


def _count(name, n):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"config.{name}: expected a non-negative int, got {n!r}")
    return int(n)


def cpu_device_num(n):
    """CPU devices per machine (each with its own arena; they share the cores)."""
    n = _count("cpu_device_num", n)
    if n < 1:
        raise ValueError("config.cpu_device_num: at least one CPU device is needed")
    _settings["cpu_device_num"] = n


def gpu_device_num(n):
    """GPUs per machine that jobs may be placed on (flow.scope.placement("gpu", "0:0")).

    Jobs still run on the CPU unless they are placed on a GPU; 0 (the default)
    configures none, and then a GPU placement is checked against the driver
    only. Whether the GPUs exist is checked when a job placed on one is first
    called (no driver or no GPU: RuntimeError, or the CPU with
    function_config.allow_cpu_fallback(True)), so this may be set on any
    machine.
    """
    _settings["gpu_device_num"] = _count("gpu_device_num", n)


def device_count():
    """Devices a mirrored placeholder expects one array for: the CPU devices,
    where jobs run unless placed on a GPU (a job placed on a GPU runs on one)."""
    return _settings["cpu_device_num"]


def cpu_threads(n):
    """Threads the kernels may use (0: all cores)."""
    _C.set_num_threads(_count("cpu_threads", n))


def enable_debug_mode(flag=True):
    """Same as FLOWJIT_DEBUG=1 for jobs compiled afterwards."""
    import os
    from . import _log
    os.environ["FLOWJIT_DEBUG"] = "1" if flag else "0"
    _log.configure()


def _flag(name, val):
    if not isinstance(val, bool):
        raise TypeError(f"config.{name}: expected True or False, got {val!r}")
    return val


def enable_legacy_model_io(val=True):
    """Accepted for OneFlow scripts; flowjit has one checkpoint format for both.

    OneFlow's legacy model IO (0.1-0.2) initialized variables in
    CheckPoint().init() and read checkpoints without `meta` files; flowjit's
    CheckPoint().init() and load() trace the defined jobs (so their variables
    exist with their initial values) and read directories without `meta`
    using the variables' own shapes, so either setting behaves the same."""
    _settings["legacy_model_io"] = _flag("enable_legacy_model_io", val)


def enable_model_io_v2(val=True):
    """Accepted for OneFlow scripts (its 0.3-0.4 switch to the new checkpoint
    API, which is flowjit's only one)."""
    _settings["model_io_v2"] = _flag("enable_model_io_v2", val)
