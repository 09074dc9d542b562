"""flow.deprecated: OneFlow's deprecated helpers that its op tests still use.

``flow.deprecated.nn.Module`` is the base class of OneFlow's old op
modules: a named callable whose ``forward`` does the work and which counts
its calls (``call_seq_no``), so each call can name its ops apart.
"""
import types
import sys
from typing import Any, Optional

from . import util

__all__ = ["nn"]


class Module:
    """A named callable that counts its calls: subclasses define
    ``forward(*args)``; calling the module runs forward and then adds one
    to ``call_seq_no``. Do not override ``__call__``."""

    def __init__(self, name: Optional[str] = None):
        self.module_name_ = util.unique_str("Module_") if name is None else name
        self.call_seq_no_ = 0

    @property
    def module_name(self) -> str:
        """The module's name (given, or a unique "Module_<n>")."""
        return self.module_name_

    @property
    def call_seq_no(self) -> int:
        """How many calls have finished."""
        return self.call_seq_no_

    def forward(self, *args: Any) -> Any:
        """What a call computes (subclasses define it)."""
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args):
        if type(self).__call__ is not Module.__call__:
            raise TypeError(f"{type(self).__name__} overrides __call__; define forward() instead")
        out = self.forward(*args)
        self.call_seq_no_ += 1
        return out


nn = types.ModuleType("flowjit.deprecated.nn", "OneFlow's deprecated module base class (Module).")
nn.Module = Module
nn.__all__ = ["Module"]
Module.__module__ = "flowjit.deprecated.nn"

sys.modules[nn.__name__] = nn
