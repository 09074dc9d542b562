"""OneFlow's older job-body forms: placeholders as parameter defaults
(``flow.FixedTensorDef``, ``flow.MirroredTensorDef``) and ``flow.watch``.

    @flow.global_function(func_config)
    def job(x=flow.FixedTensorDef((2, 3), dtype=flow.float)):
        y = flow.math.relu(x)
        flow.watch(y, lambda v: print(v.ndarray()))
        return y

    job(np.ones((2, 3), np.float32)).get().ndarray()
"""
from . import futures as _futures, dtypes as _dtypes, trace as _trace
from .. import typing as tp
from .blob import Blob

__all__ = ["FixedTensorDef", "MirroredTensorDef", "watch", "watch_diff"]


class FixedTensorDef(tp.Numpy.Placeholder):
    """A consistent-view placeholder (= tp.Numpy.Placeholder): one array of
    exactly this shape."""

    def __init__(self, shape, dtype=_dtypes.float32, batch_axis=0, name=None):
        super().__init__(shape, dtype, batch_axis)

    def _api(self):
        return "flow.FixedTensorDef"


class MirroredTensorDef(tp.ListNumpy.Placeholder):
    """A mirrored-view placeholder (= tp.ListNumpy.Placeholder): a list with
    one array per device, each within these bounds."""

    def __init__(self, shape, dtype=_dtypes.float32, batch_axis=0, name=None):
        super().__init__(shape, dtype, batch_axis)

    def _api(self):
        return "flow.MirroredTensorDef"


def watch(blob_watched, handler_or_prompt=None):
    """Calls `handler(value)` with the blob's value at every call of the job,
    in call order, on the callback thread. The value becomes one more output
    of the compiled job; nothing else about the program changes.

    As in OneFlow, the annotation of the handler's parameter says what it
    gets: ``tp.Numpy`` the array, ``tp.ListNumpy`` a list with one array per
    device, no annotation a local blob (an array with numpy(), ndarray(),
    numpy_list()). A synchronous call (numpy results) returns after its
    handlers ran; a handler's exception is reported at the next
    synchronous call or flow.sync_default_session(), like a callback's.
    Without a handler the value is printed (OneFlow's default).

    Example:
        >>> def show(v: tp.Numpy):
        ...     print("watched", v.tolist())
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     y = x * 2
        ...     flow.watch(y, show)
        ...     return y + 1
        >>> job(np.float32([1, 2])).tolist()
        watched [2.0, 4.0]
        [3.0, 5.0]
    """
    b = _trace.require_builder("flow.watch")
    loc = _trace.user_location()
    if not isinstance(blob_watched, Blob):
        _trace.fail(TypeError, f"flow.watch: expected a Blob to watch, got {type(blob_watched).__name__}", loc)
    b.check_owned(blob_watched, "flow.watch", loc)
    b.watches.append((blob_watched,) + _handler_and_form(handler_or_prompt, blob_watched.name, "flow.watch", loc))


def _handler_and_form(handler, prompt, api, loc):
    """The handler to call (a printing one for None or a prompt) and the form
    of the value it takes (_futures.watch_form)."""
    if handler is None or isinstance(handler, str):
        prompt = handler or prompt

        def handler(value: tp.Numpy):
            print(f"{prompt}: {value!r}")
    elif not callable(handler):
        _trace.fail(TypeError, f"{api}: the handler must be callable, got {type(handler).__name__}", loc)
    try:
        form = _futures.watch_form(handler, api)
    except TypeError as e:
        _trace.fail(TypeError, str(e), loc)
    return handler, form


def watch_diff(blob_watched, handler_or_prompt=None):
    """Calls `handler(gradient)` with the gradient of the job's loss with
    respect to the blob (as OneFlow's backward pass sees it: the loss seeded
    with ones) at every call of a train job, in call order, on the callback
    thread. The gradient becomes one more output of the compiled job.

    Example:
        >>> def show(g: tp.Numpy):
        ...     print("gradient", g.tolist())
        >>> @flow.global_function(type="train")
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(2,), initializer=flow.ones_initializer())
        ...     y = x * w
        ...     flow.watch_diff(y, show)
        ...     loss = flow.math.reduce_sum(y * y)
        ...     flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        ...     return loss
        >>> job(np.float32([1, 3])).tolist()   # d(sum y^2)/dy = 2y
        gradient [2.0, 6.0]
        [10.0]
    """
    b = _trace.require_builder("flow.watch_diff")
    loc = _trace.user_location()
    if not isinstance(blob_watched, Blob):
        _trace.fail(TypeError, f"flow.watch_diff: expected a Blob to watch, got {type(blob_watched).__name__}", loc)
    b.check_owned(blob_watched, "flow.watch_diff", loc)
    if b.type != "train":
        # An optimizer's minimize later in the body makes it a train job (OneFlow);
        # JobFunction checks at the end of the trace (predict_watch_diff_error).
        b._counts.setdefault("predict_watch_diff", loc)
    if blob_watched.dtype is _dtypes.bool_:
        _trace.fail(TypeError, f"flow.watch_diff: blob '{blob_watched.name}' is {blob_watched.dtype!r}; only "
                    "number blobs have gradients (integer ones as OneFlow carries them through casts)", loc)
    b.watch_diffs.append((blob_watched,) + _handler_and_form(handler_or_prompt, f"{blob_watched.name} diff",
                                                             "flow.watch_diff", loc))

def predict_watch_diff_error(b):
    """At the end of a trace: flow.watch_diff in a job that stayed a predict
    job (no optimizer's minimize) is an error at the watch_diff's line."""
    loc = b._counts.get("predict_watch_diff")
    if loc is not None and b.type != "train":
        _trace.fail(ValueError, f"flow.watch_diff: job '{b.job_name}' is a predict job; gradients exist only "
                    "in train jobs (type=\"train\" or an optimizer's minimize in the job)", loc)


def fixed_placement(device_tag: str, machine_device_ids, hierarchy=None):
    """OneFlow's deprecated name of :func:`flowjit.scope.placement` (also
    ``flow.device_prior_placement``); warns once with DeprecationWarning.

    Example:
        >>> import warnings
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     with warnings.catch_warnings():
        ...         warnings.simplefilter("ignore", DeprecationWarning)
        ...         with flow.fixed_placement("cpu", "0:0"):
        ...             return x + 1
        >>> job(np.float32([1, 2])).tolist()
        [2.0, 3.0]
    """
    import warnings

    from .. import scope
    warnings.warn("flow.fixed_placement/flow.device_prior_placement will be removed; use "
                  "flow.scope.placement", DeprecationWarning, stacklevel=2)
    return scope.placement(device_tag, machine_device_ids, hierarchy)


device_prior_placement = fixed_placement


def empty_initializer(dtype=None):
    """OneFlow's ``empty_initializer``: a variable whose first value does not
    matter (it is loaded or assigned before use). flowjit fills it with zeros,
    so a job that reads it anyway stays deterministic.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2,), initializer=flow.empty_initializer())
        >>> job().tolist()   # zeros in flowjit
        [0.0, 0.0]
    """
    from .variables import zeros_initializer
    return zeros_initializer(dtype)


_REUSE_STRATEGIES = ("mem_sharing_priority", "parallelism_priority", "custom_parallelism")


def inter_job_reuse_mem_strategy(strategy_str: str, job_set=None, **kwargs) -> None:
    """OneFlow's memory-sharing strategy between the jobs of a job set:
    checked and accepted. flowjit gives each compiled job its own arena, so
    the strategy changes nothing it computes (said once at FLOWJIT_DEBUG=1).

    Example:
        >>> flow.inter_job_reuse_mem_strategy("mem_sharing_priority")   # accepted, changes nothing
    """
    from . import log as _log
    if strategy_str not in _REUSE_STRATEGIES:
        raise ValueError(f"inter_job_reuse_mem_strategy: expected one of {_REUSE_STRATEGIES}, "
                         f"got {strategy_str!r}")
    _log.configure()
    _log.logger.info("inter_job_reuse_mem_strategy(%r) is ignored: flowjit gives each job its own arena",
                     strategy_str)
