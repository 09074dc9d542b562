"""flow.config: devices per machine and runtime threads."""
import numbers

from . import _C

_settings = {"cpu_device_num": 1, "gpu_device_num": 0}


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
    os.environ["FLOWJIT_DEBUG"] = "1" if flag else "0"
