"""flow.config: session-wide settings (devices per machine, threads, OneFlow's runtime knobs).

Settings that only tune OneFlow's own runtime (RDMA, NCCL streams, memory
reserves, thread pools of its actor system) have nothing to act on in
flowjit: they are accepted, checked for type, recorded in
:func:`current_resource`, and said once at ``FLOWJIT_DEBUG=1``.
``flow.config.collective_boxing.*`` are such settings too.

The docstrings' examples assume ``import numpy as np``, ``import flowjit as flow``
and ``import flowjit.typing as tp``; each starts from a fresh session.
"""
import dataclasses
import numbers
import os

from . import _C
from ._dist import collective_boxing  # noqa: F401
from ._core import log as _log

__all__ = ["cpu_device_num", "gpu_device_num", "device_count", "cpu_threads", "enable_debug_mode",
           "enable_legacy_model_io", "enable_model_io_v2", "legacy_model_io_enabled", "machine_num",
           "load_library", "load_library_now", "compute_thread_pool_size", "enable_tensor_float_32_compute",
           "comm_net_worker_num", "max_mdsave_worker_num", "enable_numa_aware_cuda_malloc_host",
           "rdma_mem_block_mbyte", "rdma_recv_msg_buf_mbyte", "reserved_host_mem_mbyte",
           "reserved_device_mem_mbyte", "use_rdma", "thread_enable_local_message_queue",
           "enable_mem_chain_merge", "nccl_use_compute_stream", "disable_group_boxing_by_dst_parallel",
           "collect_act_event", "collective_boxing", "Resource", "current_resource"]

_settings = {"cpu_device_num": 1, "gpu_device_num": 0, "legacy_model_io": False, "model_io_v2": False,
             "machine_num": None}
_hints = {}   # OneFlow runtime settings flowjit accepts and ignores: name -> value
_said = set()


def _count(name, n):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"config.{name}: expected a non-negative int, got {n!r}")
    return int(n)


def _flag(name, val):
    if not isinstance(val, bool):
        raise TypeError(f"config.{name}: expected True or False, got {val!r}")
    return val


def _hint(name: str, value, why: str) -> None:
    """Records a OneFlow runtime setting flowjit ignores; says so once at FLOWJIT_DEBUG=1."""
    _hints[name] = value
    _log.configure()
    if name not in _said and _log.logger.isEnabledFor(_log.logging.INFO):
        _said.add(name)
        _log.logger.info("config.%s(%r) is ignored: %s", name, value, why)


def cpu_device_num(n: int) -> None:
    """CPU devices per machine (each with its own arena; they share the cores)."""
    n = _count("cpu_device_num", n)
    if n < 1:
        raise ValueError("config.cpu_device_num: at least one CPU device is needed")
    _settings["cpu_device_num"] = n


def gpu_device_num(n: int) -> None:
    """GPUs per machine that jobs may be placed on (flow.scope.placement("gpu", "0:0")).

    Jobs still run on the CPU unless they are placed on a GPU; 0 (the default)
    configures none, and then a GPU placement is checked against the driver
    only. Whether the GPUs exist is checked when a job placed on one is first
    called (no driver or no GPU: RuntimeError, or the CPU with
    function_config.allow_cpu_fallback(True)), so this may be set on any
    machine.
    """
    _settings["gpu_device_num"] = _count("gpu_device_num", n)


def device_count() -> int:
    """Devices a mirrored placeholder expects one array for: the CPU devices,
    where jobs run unless placed on a GPU (a job placed on a GPU runs on one)."""
    return _settings["cpu_device_num"]


def cpu_threads(n: int) -> None:
    """Threads the kernels may use (0: all cores)."""
    _C.set_num_threads(_count("cpu_threads", n))


def compute_thread_pool_size(n: int) -> None:
    """OneFlow's size of the thread pool its CPU kernels run on: in flowjit
    the same as :func:`cpu_threads` (0: all cores)."""
    cpu_threads(n)


def enable_debug_mode(flag: bool = True) -> None:
    """Same as FLOWJIT_DEBUG=1 for jobs compiled afterwards."""
    os.environ["FLOWJIT_DEBUG"] = "1" if flag else "0"
    _log.configure()


def enable_legacy_model_io(val: bool = True) -> None:
    """Accepted for OneFlow scripts; flowjit has one checkpoint format for both.

    OneFlow's legacy model IO (0.1-0.2) initialized variables in
    CheckPoint().init() and read checkpoints without `meta` files; flowjit's
    CheckPoint().init() and load() trace the defined jobs (so their variables
    exist with their initial values) and read directories without `meta`
    using the variables' own shapes, so either setting behaves the same."""
    _settings["legacy_model_io"] = _flag("enable_legacy_model_io", val)


def legacy_model_io_enabled() -> bool:
    """What :func:`enable_legacy_model_io` last set (False by default)."""
    return _settings["legacy_model_io"]


def enable_model_io_v2(val: bool = True) -> None:
    """Accepted for OneFlow scripts (its 0.3-0.4 switch to the new checkpoint
    API, which is flowjit's only one)."""
    _settings["model_io_v2"] = _flag("enable_model_io_v2", val)


def enable_tensor_float_32_compute(val: bool = True) -> None:
    """Whether float32 matmuls of jobs placed on a GPU may use TF32 tensor
    cores: sets FLOWJIT_ALLOW_TF32 for jobs compiled afterwards (a job's own
    function_config().enable_tensor_float_32_compute wins). Unlike OneFlow,
    flowjit leaves TF32 off unless asked; CPU jobs always compute in full
    float32."""
    os.environ["FLOWJIT_ALLOW_TF32"] = "1" if _flag("enable_tensor_float_32_compute", val) else "0"


def machine_num(n: int) -> None:
    """The number of machines of the job. flowjit takes it from flow.env
    (flow.env.machine or the launcher's variables, one process per machine);
    a value here that differs from that raises ValueError."""
    n = _count("machine_num", n)
    if n < 1:
        raise ValueError("config.machine_num: at least one machine is needed")
    from . import env
    have = env.get_world_size()
    if n != have:
        raise ValueError(f"config.machine_num({n}): this job runs over {have} process(es), one per machine; "
                         "set the machines with flow.env.machine([...]) or a launcher (see flow.env)")
    _settings["machine_num"] = n


def load_library(path: str) -> None:
    """OneFlow loads a shared library of custom C++ ops here; flowjit
    generates every kernel from its own op list and cannot load foreign
    kernels, so this raises NotImplementedError."""
    if not isinstance(path, str):
        raise TypeError(f"config.load_library: expected the path of a shared library, got {path!r}")
    raise NotImplementedError(f"config.load_library({path!r}): flowjit cannot load custom C++ ops; every "
                              "kernel is generated from flowjit's own op list")


def load_library_now(path: str) -> None:
    """Same as :func:`load_library` (raises NotImplementedError)."""
    load_library(path)


def _int_hint(name, why):
    def setter(val: int) -> None:
        _hint(name, _count(name, val), why)
    setter.__name__ = setter.__qualname__ = name
    setter.__doc__ = f"OneFlow runtime setting, accepted and ignored: {why}."
    return setter


def _bool_hint(name, why, default):
    def setter(val: bool = default) -> None:
        _hint(name, _flag(name, val), why)
    setter.__name__ = setter.__qualname__ = name
    setter.__doc__ = f"OneFlow runtime setting, accepted and ignored: {why}."
    return setter


_NO_COMM_NET = "flowjit's processes talk over the TCP connections of its own rendezvous, not OneFlow's CommNet"
_NO_RDMA = "flowjit does not use RDMA"
_NO_NCCL = "flowjit's GPU jobs run on one GPU each and use no NCCL streams"

comm_net_worker_num = _int_hint("comm_net_worker_num", _NO_COMM_NET)
max_mdsave_worker_num = _int_hint("max_mdsave_worker_num", "flowjit saves checkpoints from the calling thread")
rdma_mem_block_mbyte = _int_hint("rdma_mem_block_mbyte", _NO_RDMA)
rdma_recv_msg_buf_mbyte = _int_hint("rdma_recv_msg_buf_mbyte", _NO_RDMA)
reserved_host_mem_mbyte = _int_hint("reserved_host_mem_mbyte",
                                    "flowjit allocates host memory per job, not from a reserved pool")
reserved_device_mem_mbyte = _int_hint("reserved_device_mem_mbyte",
                                      "flowjit allocates device memory per job, not from a reserved pool")
use_rdma = _bool_hint("use_rdma", _NO_RDMA, True)
thread_enable_local_message_queue = _bool_hint("thread_enable_local_message_queue",
                                               "flowjit has no actor threads with message queues", True)
enable_numa_aware_cuda_malloc_host = _bool_hint("enable_numa_aware_cuda_malloc_host",
                                                "deprecated in OneFlow itself, without effect", True)
enable_mem_chain_merge = _bool_hint("enable_mem_chain_merge", "flowjit plans memory reuse itself", True)
nccl_use_compute_stream = _bool_hint("nccl_use_compute_stream", _NO_NCCL, False)
disable_group_boxing_by_dst_parallel = _bool_hint(
    "disable_group_boxing_by_dst_parallel", "flowjit has no boxing ops to group", False)
collect_act_event = _bool_hint("collect_act_event",
                               "flowjit has no actors; FLOWJIT_PROFILE=1 records its kernel launches", True)


@dataclasses.dataclass(frozen=True)
class Resource:
    """The session's resources as configured (OneFlow's ``flow.current_resource()``):
    machines, devices per machine, kernel threads, and the OneFlow runtime
    settings flowjit accepted and ignores (`ignored`)."""

    machine_num: int
    cpu_device_num: int
    gpu_device_num: int
    compute_thread_pool_size: int
    enable_legacy_model_io: bool
    enable_model_io_v2: bool
    enable_debug_mode: bool
    ignored: dict


def current_resource() -> Resource:
    """The session's resources (see :class:`Resource`).

    Example:
        >>> flow.current_resource().machine_num   # a process that runs alone
        1
    """
    from ._core import log
    from . import env
    return Resource(machine_num=env.get_world_size(), cpu_device_num=_settings["cpu_device_num"],
                    gpu_device_num=_settings["gpu_device_num"], compute_thread_pool_size=_C.num_threads(),
                    enable_legacy_model_io=_settings["legacy_model_io"],
                    enable_model_io_v2=_settings["model_io_v2"], enable_debug_mode=log.debug_level() > 0,
                    ignored=dict(_hints, **collective_boxing._hints))
