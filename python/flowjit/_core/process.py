"""The process's edges (issue [harden]): interpreter exit and os.fork().

Exit: queued asynchronous jobs and callbacks finish first (as before). An
error one of them raised that no sync point reported is not dropped: it is
printed to stderr with its traceback (as Python prints an exception it
cannot raise anywhere, threading.excepthook's way) and the process exits
with status 1 after the interpreter has finalized, so a script whose
training callback failed does not look successful to a shell or CI.

Fork: os.fork() first waits for queued jobs and callbacks (so no worker
thread holds a lock the child would inherit); the child, which has none of
the parent's threads, starts new worker and callback threads on its first
asynchronous call, and runs synchronous calls as the parent does.
"""
import os
import sys
import traceback

from .. import _C


def at_exit():
    _C.shutdown_session()
    errors = _C.take_pending_errors()
    if not errors:
        return
    try:
        n = len(errors)
        what = "1 error" if n == 1 else f"{n} errors"
        print(f"flowjit: {what} raised by asynchronous jobs or their callbacks never reached a sync "
              "point (a synchronous call or flow.sync_default_session()); exiting with status 1:",
              file=sys.stderr)
        for e in errors:
            traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
        sys.stderr.flush()
    finally:
        _C.fail_exit_status()


def register():
    import atexit
    atexit.register(at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_C.before_fork, after_in_child=_C.after_fork_in_child)
