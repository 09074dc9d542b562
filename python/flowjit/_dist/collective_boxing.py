"""flow.config.collective_boxing: OneFlow's NCCL collective settings, accepted and ignored.

OneFlow fuses and schedules the NCCL collectives of its boxing ops with
these; flowjit's collectives between processes are its own (over the
rendezvous connections, see flow.env) and have none of these knobs. Each
setting is checked for type, recorded in flow.config.current_resource().ignored
and said once at FLOWJIT_DEBUG=1.
"""
import numbers

from .._core import log as _log

__all__ = ["enable_fusion", "num_callback_threads", "nccl_num_streams", "nccl_fusion_threshold_mb",
           "nccl_fusion_all_reduce_use_buffer", "nccl_fusion_all_reduce", "nccl_fusion_reduce_scatter",
           "nccl_fusion_all_gather", "nccl_fusion_reduce", "nccl_fusion_broadcast", "nccl_fusion_max_ops",
           "nccl_enable_all_to_all", "nccl_enable_mixed_fusion"]

_hints = {}
_said = set()
_WHY = "flowjit's collectives use no NCCL fusion or streams"


def _record(name, value):
    key = f"collective_boxing.{name}"
    _hints[key] = value
    _log.configure()
    if key not in _said and _log.logger.isEnabledFor(_log.logging.INFO):
        _said.add(key)
        _log.logger.info("config.%s(%r) is ignored: %s", key, value, _WHY)


def _flag_setter(name, default):
    def setter(val: bool = default) -> None:
        if not isinstance(val, bool):
            raise TypeError(f"config.collective_boxing.{name}: expected True or False, got {val!r}")
        _record(name, val)
    setter.__name__ = setter.__qualname__ = name
    setter.__doc__ = f"OneFlow's collective_boxing_conf.{name}, accepted and ignored ({_WHY})."
    return setter


def _int_setter(name):
    def setter(val: int) -> None:
        if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val < 0:
            raise ValueError(f"config.collective_boxing.{name}: expected a non-negative int, got {val!r}")
        _record(name, int(val))
    setter.__name__ = setter.__qualname__ = name
    setter.__doc__ = f"OneFlow's collective_boxing_conf.{name}, accepted and ignored ({_WHY})."
    return setter


enable_fusion = _flag_setter("enable_fusion", True)
num_callback_threads = _int_setter("num_callback_threads")
nccl_num_streams = _int_setter("nccl_num_streams")
nccl_fusion_threshold_mb = _int_setter("nccl_fusion_threshold_mb")
nccl_fusion_max_ops = _int_setter("nccl_fusion_max_ops")
nccl_fusion_all_reduce_use_buffer = _flag_setter("nccl_fusion_all_reduce_use_buffer", True)
nccl_fusion_all_reduce = _flag_setter("nccl_fusion_all_reduce", True)
nccl_fusion_reduce_scatter = _flag_setter("nccl_fusion_reduce_scatter", True)
nccl_fusion_all_gather = _flag_setter("nccl_fusion_all_gather", True)
nccl_fusion_reduce = _flag_setter("nccl_fusion_reduce", True)
nccl_fusion_broadcast = _flag_setter("nccl_fusion_broadcast", True)
nccl_enable_all_to_all = _flag_setter("nccl_enable_all_to_all", True)
nccl_enable_mixed_fusion = _flag_setter("nccl_enable_mixed_fusion", True)
