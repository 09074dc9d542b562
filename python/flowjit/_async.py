"""Asynchronous job results: futures for tp.Callback jobs and error reporting."""
import threading

from . import _C


def annotate_error(exc, job_name):
    """Marks an exception raised by an async job or its callback with the job's name."""
    note = f"raised asynchronously by job '{job_name}' or its callback; reported at the next " \
           "synchronous call or flow.sync_default_session()"
    try:
        exc.add_note(note)
    except AttributeError:  # Python < 3.11
        exc.args = (f"{exc.args[0] if exc.args else ''} [{note}]",) + tuple(exc.args[1:])


class Future:
    """What a tp.Callback job returns at once: call it with the callback.

    The job is already queued; the callback runs on the callback thread, in
    call order, when the job has finished. A callback attached after the job
    finished still runs on the callback thread (queued behind the callbacks
    already waiting there), never on the caller's thread, so that its errors
    are reported like every other callback's: at the next sync point.
    """

    __slots__ = ("_lock", "_callback", "_result", "_done", "_job")

    def __init__(self, job):
        self._lock = threading.Lock()
        self._callback = None
        self._result = None
        self._done = False
        self._job = job

    def __call__(self, callback):
        if not callable(callback):
            raise TypeError(f"job '{self._job}': the result of a tp.Callback job takes a callable, "
                            f"got {type(callback).__name__}")
        with self._lock:
            if self._callback is not None:
                raise RuntimeError(f"job '{self._job}': a callback was already attached to this call")
            self._callback = callback
            ready = self._done
        if ready:
            _C.post_callback(self._invoke, self._job)
        return None

    def _deliver(self, result):
        """Runs on the callback thread when the job is done."""
        with self._lock:
            self._result = result
            self._done = True
            has_cb = self._callback is not None
        if has_cb:
            self._invoke()

    def _invoke(self):
        cb, res = self._callback, self._result
        self._result = None
        cb(res)
