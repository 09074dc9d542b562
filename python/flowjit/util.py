"""flow.util: small helpers OneFlow exports (unique names)."""
import itertools
import threading

__all__ = ["unique_str"]

_counters = {}
_lock = threading.Lock()


def unique_str(prefix: str) -> str:
    """A name made of `prefix` and a number, different from every other
    unique_str answer of this process ("Module_0", "Module_1", ...)."""
    if not isinstance(prefix, str):
        raise TypeError(f"util.unique_str: expected a string prefix, got {prefix!r}")
    with _lock:
        counter = _counters.setdefault(prefix, itertools.count())
        return f"{prefix}{next(counter)}"
