"""Asynchronous job results: futures for tp.Callback jobs and for jobs without
return annotations (OneFlow 0.1-0.2), flow.watch delivery, error reporting."""
import threading

import numpy as np

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


# ---------------------------------------------------------------- OneFlow 0.1-0.2 results

class LocalBlob:
    """A result of a job without return annotations (OneFlow's local blob):
    the value of one returned blob, on the host.

    A whole value (the consistent view) is one array; a per-device value
    (mirrored view) is one array per device. ``numpy()`` / ``ndarray()`` give
    the array (of a per-device value: the one device's, or device `rank`'s);
    ``numpy_list()`` / ``ndarray_list()`` the list, one array per device."""

    __slots__ = ("_value", "_per_device", "_job")

    def __init__(self, value, job):
        self._per_device = isinstance(value, list)
        self._value = value
        self._job = job

    def numpy(self, rank=None):
        if not self._per_device:
            if rank not in (None, 0):
                raise ValueError(f"job '{self._job}': this result is one whole value, so it has no "
                                 f"device {rank}; call numpy() without a rank")
            return self._value
        if rank is None:
            if len(self._value) != 1:
                raise ValueError(f"job '{self._job}': this result has one value per device "
                                 f"({len(self._value)} devices); use numpy_list() or numpy(rank)")
            return self._value[0]
        if not isinstance(rank, int) or not 0 <= rank < len(self._value):
            raise ValueError(f"job '{self._job}': rank must be an int in [0, {len(self._value)}), got {rank!r}")
        return self._value[rank]

    def numpy_list(self):
        return list(self._value) if self._per_device else [self._value]

    ndarray = numpy
    ndarray_list = numpy_list

    @property
    def shape(self):
        return self.numpy_list()[0].shape

    @property
    def dtype(self):
        return self.numpy_list()[0].dtype

    def __repr__(self):
        return f"LocalBlob({self._value!r})"


class LegacyFuture:
    """What a job without return annotations returns at once (OneFlow 0.1-0.2).

    ``.get()`` waits for the job and gives its result: a LocalBlob, or the
    tuple, list or dict of LocalBlobs the job returned. ``.async_get(cb)``
    passes that result to ``cb`` on the callback thread, in call order, and
    returns at once. As in OneFlow a result is taken once: one get() or one
    async_get(), and a second raises."""

    __slots__ = ("_future", "_event", "_taken", "_job")

    def __init__(self, job):
        self._job = job
        self._future = Future(job)
        self._event = threading.Event()
        self._taken = None

    def _take(self, how):
        with self._future._lock:
            if self._taken is not None:
                raise RuntimeError(f"job '{self._job}': the result of this call was already taken with "
                                   f"{self._taken}; a job's result is given once (call the job again "
                                   "for another)")
            self._taken = how

    def _deliver(self, result):
        """On the callback thread."""
        with self._future._lock:
            self._future._result = result
            self._future._done = True
            has_cb = self._future._callback is not None
        self._event.set()
        if has_cb:
            self._future._invoke()

    def get(self):
        """Waits for the job; its result (errors of this or earlier async jobs raise here)."""
        self._take(".get()")
        if not self._event.is_set():
            _C.sync_session()  # raises the job's error, if it failed
        else:
            _C.raise_pending_errors()  # a synchronous point: earlier async errors surface here
        if not self._event.is_set():
            raise RuntimeError(f"job '{self._job}': .get() cannot wait here: it was called on the callback "
                               "thread (inside a callback or watch handler), which would have to run the "
                               "job's own delivery first; use .async_get(callback) there")
        with self._future._lock:
            res, self._future._result = self._future._result, None
        return res

    def async_get(self, callback):
        """Calls callback(result) on the callback thread when the job is done; returns None."""
        if not callable(callback):
            raise TypeError(f"job '{self._job}': async_get takes a callable, got {type(callback).__name__}")
        self._take(".async_get()")
        self._future(callback)

    def __repr__(self):
        state = "done" if self._event.is_set() else "pending"
        return f"<flowjit result of job '{self._job}' ({state})>"


# ---------------------------------------------------------------- flow.watch delivery

class WatchedValue(np.ndarray):
    """The value a flow.watch handler gets: a numpy array, with OneFlow 0.2's
    local-blob methods numpy() and ndarray() too."""

    def numpy(self):
        return np.asarray(self)

    ndarray = numpy


def run_watch_handlers(watches, values, job):
    """On the callback thread: each handler with its value, in trace order.
    A handler's exception is kept for the next sync point, like a
    callback's; the other handlers still run."""
    for (blob_name, handler), v in zip(watches, values):
        arg = [np.asarray(x).view(WatchedValue) for x in v] if isinstance(v, list) \
            else np.asarray(v).view(WatchedValue)
        try:
            handler(arg)
        except Exception as e:  # noqa: BLE001 - reported at the next sync point, never lost
            annotate_error(e, job)
            try:
                e.add_note(f"raised by the flow.watch handler of blob '{blob_name}'")
            except AttributeError:
                pass
            _C.record_async_error(e)
