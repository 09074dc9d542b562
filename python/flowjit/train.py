"""flow.train: OneFlow's older checkpoint API, ``flow.train.CheckPoint`` and
``flow.train.SimpleCheckPointManager``.

    check_point = flow.train.CheckPoint()
    check_point.init()              # the defined jobs' variables, initialized
    ...train...
    check_point.save("model")       # = flow.checkpoint.save("model")
    check_point.load("model")       # = flow.load_variables(flow.checkpoint.get("model")), checked

The checkpoints are flow.checkpoint's, i.e. OneFlow's on-disk layout. As in
OneFlow, where a session creates every defined job's variables when it
starts, init(), load() and save() first trace the job functions defined
since the last flow.clear_default_session() that have not run yet (for
their declared shapes), so they work before the first call.
"""
import datetime
import os

import numpy as np

from . import _C, checkpoint
from ._core import dtypes as _dtypes

__all__ = ["CheckPoint", "SimpleCheckPointManager"]


class CheckPoint:
    """Saves and loads all session variables (OneFlow's flow.train.CheckPoint)."""

    def init(self):
        """Creates the variables of every defined job not called yet, with
        their initializers' values (tracing those jobs), as OneFlow's
        session start does. Values already trained or loaded are kept
        (init() never resets them, as in OneFlow since 0.3); to start over
        from the initializers, call flow.clear_default_session()."""
        from ._core.job import trace_defined_jobs
        trace_defined_jobs()

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

        The defined jobs not called yet are traced first, so their variables
        exist (OneFlow creates them at session start); a load that would
        still set nothing because none of the checkpoint's variables exist
        raises instead of silently doing nothing."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"CheckPoint.load: path must be a str or os.PathLike, got {type(path).__name__}")
        path = os.fspath(path)
        from ._core.job import trace_defined_jobs
        trace_defined_jobs()
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
        from ._core.variables import load_variables
        load_variables(values, ignore_mismatch=False)


class SimpleCheckPointManager:
    """Checkpoints in one directory, one sub-directory each, named `prefix`
    plus the time saved (OneFlow's flow.train.SimpleCheckPointManager).

        manager = flow.train.SimpleCheckPointManager("checkpoints")
        manager.initialize_or_restore()   # the latest checkpoint, or a first one of the initial values
        ...train...
        manager.save()
    """

    def __init__(self, root_path, prefix="snapshot_"):
        if not isinstance(root_path, (str, os.PathLike)):
            raise TypeError("SimpleCheckPointManager: root_path must be a str or os.PathLike, got "
                            f"{type(root_path).__name__}")
        if not isinstance(prefix, str):
            raise TypeError(f"SimpleCheckPointManager: prefix must be a str, got {type(prefix).__name__}")
        root_path = os.fspath(root_path)
        if os.path.exists(root_path) and not os.path.isdir(root_path):
            raise NotADirectoryError(f"SimpleCheckPointManager: '{root_path}' is not a directory")
        os.makedirs(root_path, exist_ok=True)
        self._root, self._prefix = root_path, prefix

    def list_checkpoints(self):
        """The names of the complete checkpoints, oldest first."""
        def complete(name):
            return name.startswith(self._prefix) and os.path.isfile(
                os.path.join(self._root, name, checkpoint.SNAPSHOT_DONE_FILENAME))
        return sorted(n for n in os.listdir(self._root) if complete(n))

    def latest_checkpoint(self):
        """The newest checkpoint's name, or None."""
        names = self.list_checkpoints()
        return names[-1] if names else None

    def initialize_or_restore(self):
        """Loads the latest checkpoint into the session; with none, saves the
        initial values as the first."""
        name = self.latest_checkpoint()
        if name is None:
            self.save()
        else:
            from ._core.variables import load_variables
            load_variables(checkpoint.get(os.path.join(self._root, name)))

    def save(self):
        """Saves every session variable as a new checkpoint; returns its name."""
        name = self._prefix + datetime.datetime.now().strftime("%Y%m%d_%H%M%S_%f")
        latest = self.latest_checkpoint()
        if latest is not None and name <= latest:  # names must sort in the order saved
            name = latest + "_1"
        checkpoint.save(os.path.join(self._root, name))
        return name
