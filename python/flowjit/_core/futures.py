"""Asynchronous job results: futures for tp.Callback jobs and for jobs without
return annotations (OneFlow 0.1-0.2), flow.watch delivery, error reporting."""
import inspect
import threading
from typing import List, Optional

import numpy as np

from .. import _C


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
        note_callback_thread()
        with self._lock:
            self._result = result
            self._done = True
            has_cb = self._callback is not None
        if has_cb:
            self._invoke()

    def _invoke(self):
        note_callback_thread()
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
    ``numpy_list()`` / ``ndarray_list()`` the list, one array per device.

    Otherwise it behaves as its array, as OneFlow's local blob does: numpy
    functions accept it (``__array__``), attributes and methods of the array
    (``shape``, ``size``, ``tolist()``, ``astype()``, ...) are the array's,
    and indexing, ``len``, iteration, arithmetic and comparisons work on the
    array. For a per-device value over several devices these raise the
    ValueError of ``numpy()``: say which device's array is meant."""

    __slots__ = ("_value", "_per_device", "_job")

    def __init__(self, value, job):
        self._per_device = isinstance(value, list)
        self._value = value
        self._job = job

    def numpy(self, rank: Optional[int] = None) -> np.ndarray:
        """The array (of a per-device value: device `rank`'s, or the only device's)."""
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

    def numpy_list(self) -> List[np.ndarray]:
        """One array per device (a whole value: a list of one)."""
        return list(self._value) if self._per_device else [self._value]

    ndarray = numpy
    ndarray_list = numpy_list

    @property
    def is_dynamic(self) -> bool:
        """False: flowjit's blobs have static shapes."""
        return False

    def parallel_num(self) -> int:
        """How many devices hold a part of this value."""
        return len(self._value) if self._per_device else 1

    @property
    def shape(self):
        """The array's shape (of a per-device value: the first device's)."""
        return self.numpy_list()[0].shape

    @property
    def dtype(self):
        """The array's numpy dtype."""
        return self.numpy_list()[0].dtype

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.numpy(), name)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __len__(self):
        return len(self.numpy())

    def __iter__(self):
        return iter(self.numpy())

    def __getitem__(self, index):
        return self.numpy()[index]

    def __bool__(self):
        return bool(self.numpy())

    def __float__(self):
        return float(self.numpy())

    def __int__(self):
        return int(self.numpy())

    def __index__(self):
        return self.numpy().__index__()

    __hash__ = None  # == compares elementwise, as the array's

    def __repr__(self):
        return f"LocalBlob({self._value!r})"


def _unwrap(x):
    return x.numpy() if isinstance(x, LocalBlob) else x


def _array_method(name):
    def method(self, *args):
        return getattr(self.numpy(), name)(*(_unwrap(a) for a in args))

    method.__name__ = name
    method.__doc__ = f"numpy.ndarray.{name} of the array."
    return method


# The array's operators (binary ones with LocalBlob operands unwrapped).
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
              "lshift", "rshift"):
    for _form in ("__{}__", "__r{}__"):
        setattr(LocalBlob, _form.format(_name), _array_method(_form.format(_name)))
for _name in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__neg__", "__pos__", "__abs__",
              "__invert__", "__divmod__", "__contains__"):
    setattr(LocalBlob, _name, _array_method(_name))
del _name, _form


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
        note_callback_thread()
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
    """The value a flow.watch handler without a parameter annotation gets
    (OneFlow's local blob): a numpy array, with the local-blob methods
    numpy(), ndarray(), numpy_list() and ndarray_list() too. A per-device
    value (mirrored view) is the devices' arrays concatenated along axis 0,
    as in OneFlow; numpy_list() gives them one per device."""

    def numpy(self, rank: Optional[int] = None) -> np.ndarray:
        """The array (with `rank`: that device's part)."""
        if rank is None:
            return np.asarray(self)
        parts = self.numpy_list()
        if not isinstance(rank, int) or not 0 <= rank < len(parts):
            raise ValueError(f"rank must be an int in [0, {len(parts)}), got {rank!r}")
        return parts[rank]

    def numpy_list(self) -> List[np.ndarray]:
        """One array per device (a whole value: a list of one)."""
        parts = getattr(self, "_parts", None)
        return [np.asarray(self)] if parts is None else list(parts)

    ndarray = numpy
    ndarray_list = numpy_list

    @property
    def is_dynamic(self) -> bool:
        """False: flowjit's blobs have static shapes."""
        return False

    def parallel_num(self) -> int:
        """How many devices hold a part of this value."""
        return len(self.numpy_list())


# What a watch handler's parameter annotation asks for (OneFlow's rule):
# tp.Numpy the array, tp.ListNumpy one array per device, none a local blob.
_WATCH_FORMS = ("numpy", "list", "local")


def watch_form(handler, api: str) -> str:
    """Which form of the watched value `handler` takes, from the annotation of
    its one parameter; raises TypeError for another annotation or a handler
    that does not take exactly one argument."""
    from .. import typing as tp
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):  # a builtin such as print: no signature to read
        return "local"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not positional and not any(p.kind == p.VAR_POSITIONAL for p in params) or len(required) > 1:
        raise TypeError(f"{api}: the handler must take one argument (the watched value); it takes "
                        f"({', '.join(p.name for p in params)})")
    if not positional:
        return "local"
    ann = positional[0].annotation
    if isinstance(ann, str):  # from __future__ import annotations
        try:
            ann = eval(ann, getattr(handler, "__globals__", {}))  # noqa: S307 - the user's annotation
        except Exception as e:  # noqa: BLE001 - reported below with the text
            raise TypeError(f"{api}: the handler's parameter annotation {ann!r} cannot be resolved: "
                            f"{e}") from e
    if ann is inspect.Parameter.empty:
        return "local"
    if ann is tp.Numpy:
        return "numpy"
    if ann is tp.ListNumpy:
        return "list"
    raise TypeError(f"{api}: the handler's parameter is annotated {ann!r}; a watch handler takes "
                    "tp.Numpy (the array), tp.ListNumpy (one array per device) or no annotation "
                    "(a local blob)")


def _watched_value(v, form):
    if form == "list":
        return [np.asarray(x).view(WatchedValue) for x in v] if isinstance(v, list) \
            else [np.asarray(v).view(WatchedValue)]
    if isinstance(v, list):
        parts = [np.asarray(x) for x in v]
        whole = (parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)).view(WatchedValue)
        whole._parts = parts
        return whole
    return np.asarray(v).view(WatchedValue)


def run_watch_handlers(watches, values, job):
    """On the callback thread: each handler with its value, in trace order.
    `watches` holds (blob name, handler, form) with form from watch_form.
    A handler's exception is kept for the next sync point, like a
    callback's; the other handlers still run."""
    note_callback_thread()
    for (blob_name, handler, form), v in zip(watches, values):
        arg = _watched_value(v, form)
        try:
            handler(arg)
        except Exception as e:  # noqa: BLE001 - reported at the next sync point, never lost
            annotate_error(e, job)
            try:
                e.add_note(f"raised by the flow.watch handler of blob '{blob_name}'")
            except AttributeError:
                pass
            _C.record_async_error(e)


# The ident of the callback thread, once anything ran there (a synchronous
# call made on that thread must not wait for that thread).
_callback_thread = [None]


def note_callback_thread() -> None:
    """Records that the calling thread is the callback thread."""
    _callback_thread[0] = threading.get_ident()


def on_callback_thread() -> bool:
    """Whether the calling thread is the callback thread (as far as known)."""
    return _callback_thread[0] == threading.get_ident()


def run_watch_handlers_and_wait(watches, values, job):
    """On the caller's thread of a synchronous call: queues the watch handlers
    on the callback thread behind the callbacks already queued and waits
    for them, so that they have seen this call's values when the call
    returns (as a OneFlow job's watchers have when its result is pulled).
    On the callback thread itself it only queues them."""
    if on_callback_thread():
        _C.post_callback(lambda: run_watch_handlers(watches, values, job), job)
        return
    done = threading.Event()

    def run():
        try:
            run_watch_handlers(watches, values, job)
        finally:
            done.set()

    _C.post_callback(run, job)
    done.wait()
