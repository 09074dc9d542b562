"""flow.train: OneFlow's older checkpoint API, ``flow.train.CheckPoint``.

    check_point = flow.train.CheckPoint()
    check_point.init()              # valid; see CheckPoint.init
    ...train...
    check_point.save("model")       # = flow.checkpoint.save("model")
    check_point.load("model")       # = flow.load_variables(flow.checkpoint.get("model")), checked

The checkpoints are flow.checkpoint's, i.e. OneFlow's on-disk layout.
"""
import os

import numpy as np

from . import _C, _dtypes, checkpoint

__all__ = ["CheckPoint"]


class CheckPoint:
    """Saves and loads all session variables (OneFlow's flow.train.CheckPoint)."""

    def init(self):
        """Does nothing, as in OneFlow since its new checkpoint (0.3, the
        default ``enable_legacy_model_io=False``), where ``init()`` "is not
        needed any more": a flowjit variable is initialized by its
        initializer when the first job naming it is traced, so there is
        nothing left to initialize, and values already trained or loaded are
        kept (init() never resets them). Variables of jobs traced later get
        their initializers as usual. To start over from the initializers,
        call flow.clear_default_session()."""

    def save(self, path):
        """Saves every session variable to the directory `path`
        (flow.checkpoint.save: OneFlow's layout, atomic, never overwrites a
        non-empty directory)."""
        checkpoint.save(path)

    def load(self, path):
        """Loads the checkpoint at `path` into the session.

        Every variable present both in the checkpoint and in the session is
        set; names only one side has are skipped, as in OneFlow. Shape and
        dtype of each common variable must match, else ValueError / TypeError
        naming the variable. Everything is read and checked before any
        variable changes, so a failed load leaves the session as it was.

        flowjit creates a job's variables when the job is first called (OneFlow
        creates them at session start), so a load that would set nothing
        because none of the checkpoint's variables exist yet raises instead
        of silently doing nothing: call the jobs once first."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"CheckPoint.load: path must be a str or os.PathLike, got {type(path).__name__}")
        path = os.fspath(path)
        _C.sync_session()

        def session_type(name):
            info = _C.variable_info(name)
            return None if info is None else (tuple(info[0]), _dtypes.from_c(info[1]).np)

        entries = checkpoint._scan(path, fallback=session_type)
        common = {}
        for name, e in entries.items():
            known = session_type(name)
            if known is None:
                continue
            shape, dtype = known
            if e.shape != shape:
                raise ValueError(f"CheckPoint.load: variable '{name}' has shape {shape} in the session "
                                 f"but {e.shape} in checkpoint '{path}'")
            if e.dtype != dtype:
                raise TypeError(f"CheckPoint.load: variable '{name}' is {np.dtype(dtype)} in the session "
                                f"but {e.dtype} in checkpoint '{path}'")
            common[name] = e
        if entries and not common:
            raise ValueError(f"CheckPoint.load: none of the {len(entries)} variables of checkpoint "
                             f"'{path}' exist in the session (it has {len(_C.variable_names())}); "
                             "flowjit creates a job's variables when the job is first called, so call "
                             "the jobs once before loading")
        values = checkpoint._read_all(common)
        from ._variables import load_variables
        load_variables(values, ignore_mismatch=False)
