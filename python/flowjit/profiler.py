"""flow.profiler: OneFlow's NVTX range markers, accepted by flowjit.

flowjit emits no NVTX ranges (its own profile is FLOWJIT_PROFILE=1 with
flow.export_chrome_trace). range_push/range_pop keep their ranges on a
stack, so an unbalanced pop is reported; nvtx_start/nvtx_end return their
blob unchanged (an identity in the job).
"""
from typing import List, Optional

from ._core.blob import Blob

__all__ = ["range_push", "range_pop", "nvtx_start", "nvtx_end"]

_ranges: List[str] = []


def range_push(range_name: str) -> None:
    """Opens a named range (no NVTX marker is emitted)."""
    if not isinstance(range_name, str):
        raise TypeError(f"profiler.range_push: expected a range name, got {range_name!r}")
    _ranges.append(range_name)


def range_pop() -> None:
    """Closes the range range_push opened last (RuntimeError when none is open)."""
    if not _ranges:
        raise RuntimeError("profiler.range_pop: no range is open (range_push opens one)")
    _ranges.pop()


def _mark(x, mark_prefix, name, api):
    from ._ops import builders as _ops
    if not isinstance(mark_prefix, str):
        raise TypeError(f"profiler.{api}: mark_prefix must be a string, got {mark_prefix!r}")
    return _ops.identity(x, name=name)


def nvtx_start(x: Blob, mark_prefix: str, name: Optional[str] = None) -> Blob:
    """Marks where a range of the job begins: returns `x` unchanged (an
    identity; flowjit emits no NVTX marker, its kernels are named in the
    FLOWJIT_PROFILE trace instead)."""
    return _mark(x, mark_prefix, name, "nvtx_start")


def nvtx_end(x: Blob, mark_prefix: str, name: Optional[str] = None) -> Blob:
    """Marks where a range of the job ends: returns `x` unchanged (see nvtx_start)."""
    return _mark(x, mark_prefix, name, "nvtx_end")
