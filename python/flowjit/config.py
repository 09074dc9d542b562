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
    """GPU devices per machine."""
    n = _count("gpu_device_num", n)
    if n > 0:
        raise NotImplementedError("config.gpu_device_num: the GPU backend is not implemented yet; jobs "
                                  "run on the CPU (gpu_device_num(0))")
    _settings["gpu_device_num"] = n


def device_count():
    """Devices a mirrored placeholder expects one array for."""
    return _settings["gpu_device_num"] or _settings["cpu_device_num"]


def cpu_threads(n):
    """Threads the kernels may use (0: all cores)."""
    _C.set_num_threads(_count("cpu_threads", n))


def enable_debug_mode(flag=True):
    """Same as FLOWJIT_DEBUG=1 for jobs compiled afterwards."""
    import os
    os.environ["FLOWJIT_DEBUG"] = "1" if flag else "0"
