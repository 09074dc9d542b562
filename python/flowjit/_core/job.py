"""Job functions: @global_function, function_config, tracing and calling."""
import functools
import inspect
import numbers
import os
import threading
import typing
import weakref
from typing import Callable, Optional, Union

import numpy as np

from .. import _C
from . import (futures as _futures, dtypes as _dtypes, function_settings as _function_settings,
               compiled as _compiled, log as _log, trace as _trace)
from .._dist import devices as _devices
from .._ops import builders as _ops
from .. import typing as tp
from .blob import Blob

K = _C.OpKind


# ---------------------------------------------------------------- config

class FunctionConfig:
    """Settings of a job function (OneFlow's flow.function_config()).

    Besides the methods below, OneFlow's tuning settings (enable_inplace,
    enable_fuse_cast_scale, prune_parallel_cast_ops, concurrency_width,
    indexed_slices_optimizer_conf, the cudnn_* and all_reduce_* settings, ...;
    the table is flowjit._core.function_settings.HINTS) are accepted as hints:
    checked for type, kept (``function_desc`` shows them) and ignored, each
    said once at FLOWJIT_DEBUG=1 with the reason. ``function_desc`` is a
    read-only view of the settings.

    Example:
        >>> config = flow.function_config()
        >>> _ = config.default_data_type(flow.float)   # each setter returns the config
        >>> _ = config.default_logical_view(flow.scope.consistent_view())
        >>> @flow.global_function(type="predict", function_config=config)
        ... def double(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return x * 2
        >>> double(np.array([1.5, -2.0], np.float32))
        array([ 3., -4.], dtype=float32)
    """

    _SETTINGS = ("default_data_type", "default_logical_view", "default_placement_scope",
                 "default_distribute_strategy", "recompile_limit", "allow_cpu_fallback", "train",
                 "enable_tensor_float_32_compute", "enable_auto_mixed_precision", "check_numerics",
                 "enable_qat", "qat")
    # OneFlow settings that flowjit does not implement, with the reason.
    _ONEFLOW_ONLY = {
        "enable_tensorrt": "TensorRT is not used",
        "default_initializer_conf": "a variable without an initializer gets get_variable's default; pass "
                                    "initializer= to get_variable or the layer",
        "exp_run_conf": "OneFlow's experiment-runner settings have no counterpart",
        "static_mem_alloc_policy_white_list": "flowjit plans memory itself and has no allocation policies",
        "static_mem_alloc_algo_white_list": "flowjit plans memory itself and has no allocation policies",
    }
    _said = set()

    def __init__(self):
        object.__setattr__(self, "_values", {"default_data_type": _dtypes.float32})

    def default_data_type(self, dtype: _dtypes.DTypeLike) -> "FunctionConfig":
        """The dtype of placeholders and variables that do not name one (flow.float by default)."""
        self._values["default_data_type"] = _dtypes.to_dtype(dtype, "function_config.default_data_type")
        return self

    def default_logical_view(self, view) -> "FunctionConfig":
        """flow.scope.consistent_view() (the default) or mirrored_view()."""
        from .. import scope
        if not isinstance(view, scope.LogicalView):
            raise TypeError("function_config.default_logical_view: expected flow.scope.consistent_view() "
                            f"or flow.scope.mirrored_view(), got {view!r}")
        self._values["default_logical_view"] = view
        return self

    def default_placement_scope(self, placement) -> "FunctionConfig":
        """Where the whole job runs: flow.scope.placement(...)."""
        from .. import scope
        if not isinstance(placement, scope.Placement):
            raise TypeError("function_config.default_placement_scope: expected flow.scope.placement(...), "
                            f"got {placement!r}")
        self._values["default_placement_scope"] = placement
        return self

    def default_distribute_strategy(self, strategy) -> "FunctionConfig":
        """OneFlow 0.1-0.2's default_logical_view: flow.distribute.consistent_strategy()
        or mirrored_strategy()."""
        from .. import scope
        if not isinstance(strategy, scope.LogicalView):
            raise TypeError("function_config.default_distribute_strategy: expected flow.distribute."
                            f"consistent_strategy() or flow.distribute.mirrored_strategy(), got {strategy!r}")
        self._values["default_logical_view"] = strategy
        return self

    def recompile_limit(self, n: int) -> "FunctionConfig":
        """How many signatures the job may compile before a new one raises."""
        if not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"function_config.recompile_limit: expected a positive int, got {n!r}")
        self._values["recompile_limit"] = int(n)
        return self

    def allow_cpu_fallback(self, flag: bool = True) -> "FunctionConfig":
        """A job placed on a GPU runs on the CPU (with one warning) where the GPU
        cannot be used (no CUDA driver, no such GPU), instead of raising."""
        self._values["allow_cpu_fallback"] = self._flag("allow_cpu_fallback", flag)
        return self

    @property
    def train(self):
        """OneFlow 0.1-0.2's training settings (primary_lr, model_update_conf),
        used with flow.losses.add_loss; see flowjit._core.train_conf."""
        from .train_conf import TrainConfig
        conf = self._values.get("train")
        if conf is None:
            conf = self._values["train"] = TrainConfig()
        return conf

    @property
    def function_desc(self) -> _function_settings.FunctionDesc:
        """A read-only view of these settings (``.enable_inplace`` and so on:
        the value set, or OneFlow's default)."""
        return _function_settings.FunctionDesc(self)

    @property
    def qat(self) -> _function_settings.QatConfig:
        """Quantization-aware training settings (kept; see :meth:`enable_qat`)."""
        return _function_settings.QatConfig(self)

    def enable_tensor_float_32_compute(self, flag: bool = True) -> "FunctionConfig":
        """Lets float32 matmuls of jobs placed on a GPU use TF32 tensor cores
        (FLOWJIT_ALLOW_TF32=1 for this job's config; False turns it off for
        them whatever the environment says). CPU jobs always compute in full
        float32."""
        self._values["enable_tensor_float_32_compute"] = self._flag("enable_tensor_float_32_compute", flag)
        return self

    def check_numerics(self, flag: bool = True) -> "FunctionConfig":
        """Debugging aid, off by default (like torch.autograd.detect_anomaly):
        every floating-point value a kernel of the job stores is checked, and
        the first kernel that produces a NaN or an infinity stops the run
        with a FloatingPointError naming the kernel, the op that computed
        the value, its source line and the element. Later kernels of that
        run (optimizer updates among them) do not run. Costs a compare per
        stored element; the compiled code differs, so it compiles apart."""
        self._values["check_numerics"] = self._flag("check_numerics", flag)
        return self

    def enable_auto_mixed_precision(self, flag: bool = True, dtype: Optional[_dtypes.DTypeLike] = None
                                    ) -> "FunctionConfig":
        """OneFlow's automatic mixed precision: matmuls and convolutions run in a
        half type, the elementwise ops between them follow their inputs, and
        reductions, softmax, the losses, the normalizations' statistics, exp
        and log stay in float32 (OneFlow's allow/infer/deny lists; casts only
        at the boundaries). Variables, their gradients and the optimizer's
        state stay float32; combine it with a ``loss_scale_policy`` on the
        optimizer (``flow.optimizer.loss_scale.dynamic_loss_scale(...)``)
        when float16 gradients could underflow.

        ``dtype`` (a flowjit extension) picks the half type: by default
        bfloat16 on the CPU (float32's range: no loss scaling needed) and
        float16 on a GPU, as OneFlow does; ``dtype=flow.float16`` asks for
        float16 on the CPU too.

        Example::

            config = flow.function_config()
            config.enable_auto_mixed_precision(True)
        """
        on = self._flag("enable_auto_mixed_precision", flag)
        half = None
        if dtype is not None:
            half = _dtypes.to_dtype(dtype, "enable_auto_mixed_precision: dtype")
            if half not in _dtypes.HALF:
                raise ValueError("enable_auto_mixed_precision: dtype must be flow.float16 or flow.bfloat16, "
                                 f"got flow.{half.name}")
        self._values["enable_auto_mixed_precision"] = on
        self._values["mixed_precision_dtype"] = half
        return self

    def enable_qat(self, flag: bool = True) -> "FunctionConfig":
        """False is accepted; True raises NotImplementedError: flowjit has no
        quantization-aware training (no fake-quantization ops to insert)."""
        if self._flag("enable_qat", flag):
            raise NotImplementedError("function_config.enable_qat(True): flowjit has no quantization-aware "
                                      "training (it inserts no fake quantization), so a job would train "
                                      "unquantized; this is refused")
        self._values["enable_quantization_aware_training"] = False
        return self

    enable_quantization_aware_training = enable_qat

    def _hint(self, name, value):
        self._values[name] = _function_settings.check_hint(name, value)
        _log.configure()
        if name not in FunctionConfig._said and _log.logger.isEnabledFor(_log.logging.INFO):
            FunctionConfig._said.add(name)
            why = _function_settings.HINTS[name][3]
            if why.startswith(_function_settings.USED):
                _log.logger.info("function_config.%s(%r): %s", name, value, why[len(_function_settings.USED):])
            else:
                _log.logger.info("function_config.%s(%r) is ignored: %s", name, value, why)
        return self

    @staticmethod
    def _flag(name, flag):
        if not isinstance(flag, bool):
            raise TypeError(f"function_config.{name}: expected True or False, got {flag!r}")
        return flag

    def get(self, key: str, default=None):
        """The value set for `key`, else `default`."""
        return self._values.get(key, default)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        hint = _function_settings.HINTS.get(name)
        if hint is not None:
            default = hint[1]

            def setter(*value):
                if len(value) > 1 or (not value and default is None):
                    raise TypeError(f"function_config.{name}: expected one value, got {len(value)}")
                return self._hint(name, value[0] if value else default)
            setter.__name__ = setter.__qualname__ = name
            used = hint[3].startswith(_function_settings.USED)
            setter.__doc__ = (f"OneFlow's {name}: {hint[3][len(_function_settings.USED):]}." if used else
                              f"OneFlow's {name}, accepted as a hint and ignored: {hint[3]}.")
            return setter
        why = self._ONEFLOW_ONLY.get(name)
        if why:
            raise NotImplementedError(f"function_config.{name} is a OneFlow setting that flowjit does not "
                                      f"implement ({why})")
        raise AttributeError(f"function_config has no setting '{name}'; flowjit's settings are: "
                             + ", ".join(self._SETTINGS) + ", and OneFlow's tuning hints: "
                             + ", ".join(sorted(_function_settings.HINTS)))

    def __setattr__(self, name, value):
        raise AttributeError(f"function_config settings are methods: call config.{name}(value)")

    def key(self) -> tuple:
        """The settings as a hashable value (part of a compiled job's signature)."""
        return tuple(sorted((k, repr(v)) for k, v in self._values.items()))


def function_config() -> FunctionConfig:
    """A new set of settings for :func:`global_function`'s `function_config`.

    Example:
        >>> config = flow.function_config()
        >>> _ = config.default_data_type(flow.float64)   # for constants given no dtype
        >>> @flow.global_function(function_config=config)
        ... def job() -> tp.Numpy:
        ...     return flow.zeros([2])
        >>> job().dtype
        dtype('float64')
    """
    return FunctionConfig()


# ---------------------------------------------------------------- tracing state

class JobBuilder:
    """Everything a trace collects: parameters, variables, the optimizer."""

    def __init__(self, job_name, job_type, config):
        self.job_name = job_name
        self.type = job_type
        self.config = config
        self.default_dtype = config.get("default_data_type", _dtypes.float32)
        self.params = []
        self.variables = {}  # name -> (blob, trainable)
        self.pending = {}    # name -> (shape, dtype, initializer, seed, trainable)
        self.minimize = None  # (optimizer, [loss blobs], loc)
        self.split_vars = {}  # name -> declared split axis (flow.distribute.split)
        self.effects = []     # assign nodes a layer asked for (batch norm's moving statistics)
        self.placements = []  # flow.scope.placement scopes entered while tracing
        self.watches = []     # (blob, handler, form) of flow.watch, in trace order
        self.watch_diffs = []  # (blob, handler, form) of flow.watch_diff: gradient outputs after the watches
        self.added_losses = []  # flow.losses.add_loss (minimized with function_config().train)
        self.regularizers = {}  # variable name -> (blob, flow.regularizers.Regularizer)
        self.data_sources = []  # flow.data.ofrecord_reader sources: their fields are parameters after the user's
        # In the mirrored view over several devices: (devices of every process,
        # this process's first, its count), how a data op's batch is cut.
        self.data_split = None
        self.finished = False
        self._counts = {}

    def new_blob(self, node, name, api):
        if name is None:
            n = self._counts.get(api, 0)
            self._counts[api] = n + 1
            name = f"{api}_{n}"
        from .. import scope
        return Blob(node, self, scope.namespace_prefix() + name)

    def check_owned(self, blob, api, loc):
        if blob._builder is not self:
            other = blob._builder.job_name if blob._builder else "?"
            _trace.fail(RuntimeError, f"{api}: blob '{blob.name}' belongs to job '{other}', whose "
                        "tracing has finished; a blob can only be used inside the job function "
                        "that created it", loc)

    def placeholder(self, index, name, shape, dtype):
        node = _C.make_node(K.parameter, [], {"name": name, "index": index, "shape": list(shape),
                                              "dtype": dtype.c})
        self.params.append(node)
        return Blob(node, self, name)

    def data_placeholder(self, index, name, shape, dtype, api):
        """A parameter a data op fills (flow.data's readers), `shape` the
        whole batch's: in the consistent view the runtime splits it as it
        splits the user's inputs; in the mirrored view each device gets its
        rows, so the batch must divide among every device of every process."""
        if self.data_split:
            total = self.data_split[0]
            if not shape or shape[0] % total:
                _trace.fail(ValueError, f"{api}: in the mirrored view each of the {total} devices reads its "
                            f"own rows of the batch, so batch_size must be a multiple of {total}; got "
                            f"{shape[0] if shape else shape}")
            shape = [shape[0] // total, *shape[1:]]
        return self.placeholder(index, name, shape, dtype)

    def variable(self, name, shape, dtype, initializer, trainable, seed, loc, distribute=None):
        if distribute is not None:
            from .. import distribute as _dist
            if not isinstance(distribute, _dist.Distribute):
                _trace.fail(TypeError, f"get_variable: distribute of '{name}' must be flow.distribute."
                            f"split(axis), broadcast() or auto(), got {distribute!r}", loc)
            if distribute.kind == "split":
                self.declare_split(name, shape, distribute, loc)
        if name in self.variables:
            blob, _ = self.variables[name]
            if blob.shape != shape or blob.dtype is not dtype:
                _trace.fail(ValueError, f"get_variable: variable '{name}' was already requested in this "
                            f"job as {blob.dtype!r}{blob.shape}, now as {dtype!r}{shape}", loc)
            return blob
        info = _C.variable_info(name)
        if info is not None:
            vshape, vdt, _, _ = info
            if tuple(vshape) != shape or _dtypes.from_c(vdt) is not dtype:
                _trace.fail(ValueError, f"get_variable: variable '{name}' exists in the session as "
                            f"{_dtypes.from_c(vdt)!r}{tuple(vshape)} but is requested as "
                            f"{dtype!r}{shape}; two jobs or layers use the same name with different "
                            "shapes", loc)
            # As in OneFlow, trainable is the requesting job's: a variable an
            # eval job created with trainable=False is trained by a train job
            # that asks for it with trainable=True.
        else:
            self.pending[name] = (shape, dtype, initializer, seed, trainable)
        node = _C.make_node(K.variable, [], {"name": name, "shape": list(shape), "dtype": dtype.c},
                            loc[0], loc[1])
        blob = Blob(node, self, name)
        self.variables[name] = (blob, trainable)
        return blob

    def declare_split(self, name, shape, distribute, loc, api="get_variable"):
        """Variable `name` lies split over the job's devices along distribute.axis."""
        axis = distribute.axis + len(shape) if distribute.axis < 0 else distribute.axis
        if not 0 <= axis < len(shape):
            _trace.fail(ValueError, f"{api}: '{name}' has shape {shape} but is declared "
                        f"{distribute!r}", loc)
        prev = self.split_vars.get(name)
        if prev is not None and prev != axis:
            _trace.fail(ValueError, f"{api}: '{name}' is declared split({prev}) and "
                        f"split({axis}) in the same job", loc)
        self.split_vars[name] = axis

    def train_step(self):
        from .variables import ConstantInitializer
        name = f"System-Train-TrainStep-{self.job_name}"
        return self.variable(name, (), _dtypes.int64, ConstantInitializer(0), False, 0,
                             _trace.user_location())


def _create_pending_variables(builder):
    """Creates and initializes the variables a successful trace asked for."""
    if not builder.pending:
        return
    init = JobBuilder(f"{builder.job_name}.init", "predict", builder.config)
    _trace.push(init)
    effects = []
    try:
        for name, (shape, dtype, initializer, seed, trainable) in sorted(builder.pending.items()):
            var = _C.make_node(K.variable, [], {"name": name, "shape": list(shape), "dtype": dtype.c})
            value = initializer.build(_ops, shape, dtype, seed)
            if value.dtype is not dtype:
                value = _ops.cast(value, dtype)
            if value.shape != shape:
                value = _ops.broadcast_to(value, list(shape))
            effects.append(_C.make_node(K.assign, [var, value._node], {}))
    finally:
        _trace.pop()
    for name, (shape, dtype, initializer, seed, trainable) in builder.pending.items():
        _C.create_variable(name, list(shape), dtype.c, trainable)
    req = _C.CompileRequest()
    req.name, req.effects, req.run_once = init.job_name, effects, True
    req.source, req.signature = getattr(builder, "source", ""), "init:" + ",".join(sorted(builder.pending))
    compiled = _C.compile_job(req)
    compiled.try_run(())
    for name in builder.pending:
        _C.mark_initialized(name)
    builder.pending.clear()


# ---------------------------------------------------------------- results

_LEAVES = (tp.Numpy, tp.ListNumpy, tp.ListListNumpy)


def _result_spec(ann, job):
    """Validates a return annotation; returns a normalized spec tree."""
    if ann is inspect.Signature.empty or ann is None or ann is type(None):
        return ("none",)
    if ann in _LEAVES:
        return ("leaf", ann)
    if isinstance(ann, tp._Generic):
        if ann.name == "Callback":
            raise TypeError(f"job '{job}': tp.Callback cannot be nested in another annotation")
        return ("bundle", _result_spec(ann.arg, job))
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is tuple:
        return ("tuple", [_result_spec(a, job) for a in args])
    if origin is list:
        return ("list", _result_spec(args[0], job) if args else ("leaf", tp.Numpy))
    if origin is dict:
        return ("dict", _result_spec(args[1], job) if len(args) == 2 else ("leaf", tp.Numpy))
    raise TypeError(f"job '{job}': unsupported return annotation {ann!r}; use tp.Numpy, tp.ListNumpy, "
                    "typing.Tuple[...], typing.List[...], typing.Dict[str, ...], tp.Bundle[...], "
                    "tp.Callback[...] or None")


def _flatten_result(value, spec, job, out):
    """Appends the blobs of `value` to `out`; returns the rebuild template."""
    kind = spec[0]
    if kind == "none":
        if value is not None:
            raise TypeError(f"job '{job}' is annotated to return None but returned {type(value).__name__}")
        return ("none",)
    if kind == "leaf":
        leaf = spec[1]
        if leaf is tp.ListListNumpy:
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, Blob) for v in value):
                raise TypeError(f"job '{job}': a tp.ListListNumpy result must be a list of blobs")
            out.extend(value)
            return ("listlist", len(value))
        if not isinstance(value, Blob):
            raise TypeError(f"job '{job}': expected a Blob for the {leaf.__name__} result, got "
                            f"{type(value).__name__}")
        out.append(value)
        return ("list1",) if leaf is tp.ListNumpy else ("one",)
    if kind == "bundle":
        return _flatten_bundle(value, spec[1], job, out)
    if kind == "tuple":
        if not isinstance(value, tuple) or len(value) != len(spec[1]):
            raise TypeError(f"job '{job}': annotated to return a tuple of {len(spec[1])} but returned "
                            f"{_describe(value)}")
        return ("tuple", [_flatten_result(v, s, job, out) for v, s in zip(value, spec[1])])
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"job '{job}': annotated to return a list but returned {_describe(value)}")
        return ("list", [_flatten_result(v, spec[1], job, out) for v in value])
    if kind == "dict":
        if not isinstance(value, dict):
            raise TypeError(f"job '{job}': annotated to return a dict but returned {_describe(value)}")
        return ("dict", [(k, _flatten_result(v, spec[1], job, out)) for k, v in value.items()])
    raise AssertionError(kind)


def _flatten_bundle(value, leaf_spec, job, out):
    if isinstance(value, Blob):
        return _flatten_result(value, leaf_spec, job, out)
    if isinstance(value, tuple):
        return ("tuple", [_flatten_bundle(v, leaf_spec, job, out) for v in value])
    if isinstance(value, list):
        return ("list", [_flatten_bundle(v, leaf_spec, job, out) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, _flatten_bundle(v, leaf_spec, job, out)) for k, v in value.items()])
    raise TypeError(f"job '{job}': a tp.Bundle result may contain only blobs, tuples, lists and dicts, "
                    f"got {type(value).__name__}")


def _flatten_legacy(value, job, out):
    """A job without return annotations (OneFlow 0.1-0.2): blobs, and tuples,
    lists and dicts of them, come back as LocalBlobs in the same structure."""
    if isinstance(value, Blob):
        out.append(value)
        return ("local",)
    if isinstance(value, tuple):
        return ("tuple", [_flatten_legacy(v, job, out) for v in value])
    if isinstance(value, list):
        return ("list", [_flatten_legacy(v, job, out) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, _flatten_legacy(v, job, out)) for k, v in value.items()])
    raise TypeError(f"job '{job}' has no return annotation, so it may return None, a Blob, or tuples, "
                    f"lists and dicts of Blobs; it returned {type(value).__name__}")


def _describe(v):
    if isinstance(v, tuple):
        return f"a tuple of {len(v)}"
    return type(v).__name__


def _check_result_groups(job, template, groups, ranks):
    """A per-device result (mirrored view) annotated tp.Numpy is the devices'
    arrays joined along axis 0, as in OneFlow; a 0-d one has no axis 0."""
    it = iter(zip(groups, ranks))

    def walk(t):
        k = t[0]
        if k == "one":
            per_device, rank = next(it)
            if per_device and rank == 0:
                raise TypeError(f"job '{job}': in the mirrored view a result computed from per-device "
                                "inputs has one value per device, and a 0-d one cannot be joined into "
                                "one array along axis 0; annotate it tp.ListNumpy")
        elif k in ("list1", "local"):
            next(it)
        elif k == "listlist":
            for _ in range(t[1]):
                if next(it)[0]:
                    raise NotImplementedError(f"job '{job}': tp.ListListNumpy results in the mirrored "
                                              "view with several devices are not supported yet")
        elif k in ("tuple", "list"):
            for s in t[1]:
                walk(s)
        elif k == "dict":
            for _, s in t[1]:
                walk(s)

    walk(template)


def _joined(v):
    """A tp.Numpy result: per-device arrays (a list) joined along axis 0."""
    return v if not isinstance(v, list) else v[0] if len(v) == 1 else np.concatenate(v, axis=0)


def _builder_for(template, devices=1, job="?"):
    """A function from the list of results (an array, or a list of one array
    per device) to the result structure."""
    kind = template[0]
    if kind == "one":
        return lambda outs: _joined(outs[0])
    if kind == "none":
        return lambda outs: None

    def build(t, it):
        k = t[0]
        if k == "one":
            return _joined(next(it))
        if k == "list1":
            v = next(it)
            # A value that does not depend on per-device inputs is the same on
            # every device.
            return v if isinstance(v, list) else [v] * devices
        if k == "listlist":
            return [[next(it) for _ in range(t[1])]]
        if k == "local":
            return _futures.LocalBlob(next(it), job)
        if k == "none":
            return None
        if k == "tuple":
            return tuple(build(s, it) for s in t[1])
        if k == "list":
            return [build(s, it) for s in t[1]]
        if k == "dict":
            return {key: build(s, it) for key, s in t[1]}
        raise AssertionError(k)

    return lambda outs: build(template, iter(outs))


# ---------------------------------------------------------------- job functions

class _Compiled:
    """A compiled signature of a job: how to run it and to build its result.

    `mode` is "sync" (numpy results), "callback" (tp.Callback) or "legacy"
    (no return annotation: a LegacyFuture). The last len(watches) outputs
    of the program are the values flow.watch asked for; their handlers run
    on the callback thread."""

    __slots__ = ("job", "build", "mode", "watches", "n_user", "name", "view", "feeds", "data_split")

    def __init__(self, job, build, mode="sync", watches=(), n_user=None, name="?", view=None):
        self.job = job
        self.feeds = []  # native readers of the job's data ops (flow.data.ofrecord_reader), in parameter order
        self.data_split = None  # JobBuilder.data_split: how the readers' batches are cut
        self.view = view  # the _compiled.CompiledJob users look into
        self.build = build
        self.mode = mode
        self.watches = list(watches)
        self.n_user = n_user
        self.name = name

    def sync_result(self, outs):
        """On the caller's thread: the result, once the watch handlers have
        run on the callback thread (behind the callbacks queued before)."""
        if self.watches:
            watched = list(outs[self.n_user:])
            outs = outs[:self.n_user]
            _futures.run_watch_handlers_and_wait(self.watches, watched, self.name)
        return self.build(outs)

    def async_result(self, outs):
        """On the callback thread: watch handlers run first, then the result."""
        if self.watches:
            _futures.run_watch_handlers(self.watches, list(outs[self.n_user:]), self.name)
            outs = outs[:self.n_user]
        return self.build(outs)


class JobFunction:
    """A traced, compiled, cached job: call it with numpy arrays.

    ``@flow.global_function`` makes one. The first call of each placeholder
    signature traces the function and compiles it; later calls run the
    compiled code.

    Example:
        >>> @flow.global_function(type="predict")
        ... def scale(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return x * 10
        >>> scale(np.array([1, 2, 3], np.float32))
        array([10., 20., 30.], dtype=float32)
        >>> scale.job_name, len(scale.compiled_jobs())   # one signature compiled
        ('scale', 1)
    """

    def __init__(self, fn, job_type, config):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._type_given = job_type  # None: "train" when function_config().train is set
        self._config = config if config is not None else FunctionConfig()
        self._name = fn.__name__
        self._source = f"{os.path.basename(fn.__code__.co_filename)}:{fn.__code__.co_firstlineno}"
        # The job's parameters as the user wrote them (names, and the tuple
        # structure of typing.Tuple ones); self._params has one entry per
        # placeholder, which is what the compiled program takes.
        self._arg_names, self._arg_trees = [], []
        self._params = self._parse_params(fn)
        self._has_tuples = any(t is not None for t in self._arg_trees)
        ann = self._annotations(fn).get("return", inspect.Signature.empty)
        self._legacy = ann is inspect.Signature.empty  # OneFlow 0.1-0.2: results via .get()
        self._async = isinstance(ann, tp._Generic) and ann.name == "Callback"
        if ann is tp.Callback:
            raise TypeError(f"job '{self._name}': tp.Callback needs the result type, e.g. "
                            "tp.Callback[tp.Numpy]")
        self._ret = _result_spec(ann.arg if self._async else ann, self._name)
        self._cache = {}
        self._fast = None
        self._generation = None
        self._numpy_only = all(p.kind == "Numpy" for _, p in self._params)
        self._misses = []
        self._warned_recompile = False
        self._compile_lock = threading.Lock()
        self._tracing_thread = None  # the thread tracing this job, while it does
        self._defined_in = _C.session_generation()
        _defined_jobs.add(self)

    @property
    def _type(self):
        if self._type_given is not None:
            return self._type_given
        train = self._config.get("train")
        return "train" if train is not None and train.is_set() else "predict"

    @staticmethod
    def _annotations(fn):
        ann = dict(getattr(fn, "__annotations__", {}))
        for k, v in list(ann.items()):
            if isinstance(v, str):  # from __future__ import annotations
                ann[k] = eval(v, fn.__globals__)  # noqa: S307 - the user's own annotation text
        return ann

    def _parse_params(self, fn):
        ann = self._annotations(fn)
        params = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise TypeError(f"job '{self._name}': parameter '{p.name}' must be a plain positional "
                                "parameter (no *args, **kwargs or keyword-only parameters)")
            a = ann.get(p.name)
            if a is None and isinstance(p.default, tp._Placeholder):
                a = p.default  # OneFlow 0.1-0.2: def job(x=flow.FixedTensorDef((2, 3))):
            self._arg_names.append(p.name)
            self._arg_trees.append(self._param_tree(p.name, a, a, params))
        return params

    def _param_tree(self, pname, a, whole, params):
        """Appends the placeholders of annotation `a` (a placeholder, or a
        typing.Tuple of them, nested at will) to `params`; returns the shape
        of the argument: None for one placeholder, else a list of subtrees."""
        if isinstance(a, tp._Placeholder):
            params.append((pname, a))
            return None
        if typing.get_origin(a) is tuple:
            items = typing.get_args(a)
            if not items or Ellipsis in items:
                raise TypeError(f"job '{self._name}': parameter '{pname}' is annotated {whole!r}; a "
                                "typing.Tuple of placeholders needs one placeholder per element (no "
                                "empty tuple, no '...')")
            return [self._param_tree(f"{pname}_{i}", x, whole, params) for i, x in enumerate(items)]
        raise TypeError(f"job '{self._name}': parameter '{pname}' needs a placeholder annotation "
                        "such as tp.Numpy.Placeholder((100, 784), dtype=flow.float) or a typing.Tuple "
                        f"of them, got {'no annotation' if a is None else repr(a)}")

    def _flatten_args(self, args):
        """The call's arguments with every typing.Tuple parameter's tuple
        spliced in: one argument per placeholder."""
        if len(args) != len(self._arg_trees):
            n = len(self._arg_trees)
            names = ", ".join(self._arg_names)
            raise TypeError(f"job '{self._name}' takes {n} argument{'s' if n != 1 else ''} ({names}) "
                            f"but {len(args)} {'were' if len(args) != 1 else 'was'} given")
        flat = []

        def walk(tree, a, pname):
            if tree is None:
                flat.append(a)
                return
            if not isinstance(a, (tuple, list)) or len(a) != len(tree):
                got = f"a {type(a).__name__} of {len(a)}" if isinstance(a, (tuple, list)) \
                    else type(a).__name__
                raise TypeError(f"job '{self._name}': parameter '{pname}' is annotated as a typing.Tuple "
                                f"of {len(tree)} placeholders, so it takes a tuple of {len(tree)} "
                                f"arrays; got {got}")
            for i, (t, x) in enumerate(zip(tree, a)):
                walk(t, x, f"{pname}[{i}]")

        for tree, a, pname in zip(self._arg_trees, args, self._arg_names):
            walk(tree, a, pname)
        return tuple(flat)

    def _group_blobs(self, blobs):
        """The inverse of _flatten_args on the traced blobs: a tuple of blobs
        for each typing.Tuple parameter."""
        it = iter(blobs)

        def build(tree):
            if tree is None:
                return next(it)
            return tuple(build(t) for t in tree)

        return [build(t) for t in self._arg_trees]

    @property
    def job_name(self):
        return self._name

    def __repr__(self):
        return f"<flowjit job '{self._name}' ({self._type}) from {self._source}>"

    # ---- calling

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._bind_kwargs(args, kwargs)
        if self._has_tuples:
            args = self._flatten_args(args)
        fast = self._fast
        if fast is not None and self._generation == _C.session_generation():
            outs = fast.job.try_run(args)
            if outs is not None:
                return fast.sync_result(outs)
        return self._call_slow(args)

    def _bind_kwargs(self, args, kwargs):
        names = list(self._arg_names)
        dup = sorted(set(names[:len(args)]) & set(kwargs))
        if dup:
            raise TypeError(f"job '{self._name}' got multiple values for argument '{dup[0]}'")
        full = list(args)
        for n in names[len(args):]:
            if n not in kwargs:
                raise TypeError(f"job '{self._name}' is missing argument '{n}'")
            full.append(kwargs.pop(n))
        if kwargs:
            raise TypeError(f"job '{self._name}' got unexpected argument(s) {sorted(kwargs)}; its "
                            f"parameters are {names}")
        return tuple(full)

    def _check_args(self, args):
        """Validates the call; returns (signature key, flat arrays)."""
        n = len(self._params)
        if len(args) != n:
            names = ", ".join(nm for nm, _ in self._params)
            raise TypeError(f"job '{self._name}' takes {n} argument{'s' if n != 1 else ''} ({names}) "
                            f"but {len(args)} {'were' if len(args) != 1 else 'was'} given")
        key, flat = [], []
        split = self._mirrored_parts()
        for (pname, ph), a in zip(self._params, args):
            if ph.kind == "Numpy":
                a = self._check_array(pname, ph, a, exact=True)
                if split:
                    parts = self._split_rows(pname, a, split)
                    key.append(tuple(x.shape for x in parts))
                    flat.extend(parts)
                    continue
                key.append(a.shape)
                flat.append(a)
            elif ph.kind == "ListNumpy":
                arrs = self._check_list(pname, ph, a)
                arrs = [self._check_array(f"{pname}[{i}]", ph, x, exact=False) for i, x in enumerate(arrs)]
                key.append(tuple(x.shape for x in arrs))
                flat.extend(arrs)
            else:  # ListListNumpy
                per_device = self._check_list(pname, ph, a)
                shapes = []
                for d, lst in enumerate(per_device):
                    if not isinstance(lst, (list, tuple)):
                        raise TypeError(f"job '{self._name}': parameter '{pname}' ({ph!r}) expects, per "
                                        f"device, a list of arrays; element {d} is {type(lst).__name__}")
                    lst = [self._check_array(f"{pname}[{d}][{i}]", ph, x, exact=False)
                           for i, x in enumerate(lst)]
                    flat.extend(lst)
                    shapes.append(tuple(x.shape for x in lst))
                key.append(tuple(shapes))
        return tuple(key), flat

    def _mirrored_parts(self):
        """In the mirrored view over several devices, how many: a tp.Numpy
        argument is then cut along axis 0 into one part per device (OneFlow's
        consistent input seen from the mirrored view). Else 0."""
        from .. import scope
        if self._config.get("default_logical_view") != scope.mirrored_view():
            return 0
        n = _devices.list_arrays(self._name, self._config)
        return n if n > 1 else 0

    def _data_split(self):
        """How a data op's batch is cut in the mirrored view over several
        devices (JobBuilder.data_split), else None: every process reads the
        same whole batch and keeps its devices' rows, as a user's program
        would cut its own batch."""
        from .. import scope
        if self._config.get("default_logical_view") != scope.mirrored_view():
            return None
        local = _devices.list_arrays(self._name, self._config)
        rank, procs = _devices.process_info()
        return (local * procs, rank * local, local) if local * procs > 1 else None

    def _split_rows(self, pname, a, parts):
        if a.ndim == 0 or a.shape[0] % parts:
            raise ValueError(f"job '{self._name}': parameter '{pname}' is a tp.Numpy placeholder in the "
                             f"mirrored view over {parts} devices, so its array is cut along axis 0 into "
                             f"{parts} equal parts, one per device; shape {a.shape} cannot be (use "
                             "tp.ListNumpy.Placeholder to give each device its own array)")
        return np.split(a, parts)

    def _check_list(self, pname, ph, a):
        ndev = _devices.list_arrays(self._name, self._config)
        if not isinstance(a, (list, tuple)):
            raise TypeError(f"job '{self._name}': parameter '{pname}' ({ph!r}) expects a list with one "
                            f"array per device ({ndev}), got {type(a).__name__}")
        if len(a) != ndev:
            raise ValueError(f"job '{self._name}': parameter '{pname}' ({ph!r}) expects {ndev} "
                             f"element(s), one per device, but got {len(a)}")
        return list(a)

    def _check_array(self, pname, ph, a, exact):
        """Checks one argument against its placeholder; returns it as a numpy
        array (a view of the caller's memory for __dlpack__ / __array__ objects)."""
        if isinstance(a, np.generic) and ph.shape == ():
            # A numpy scalar (np.float32(0.5)) is a 0-d array for a 0-d
            # placeholder; its dtype is checked as an array's.
            a = np.asarray(a)
        if not isinstance(a, np.ndarray):
            a = _interop_array(self._name, pname, a)
        if not isinstance(a, np.ndarray):
            hint = ""
            if isinstance(a, (np.generic, numbers.Number)):
                hint = f"; a scalar must be passed as a 0-d array, e.g. np.array({a!r}, dtype=np." \
                       f"{ph.dtype.np})"
            elif isinstance(a, (list, tuple)) and ph.kind == "Numpy":
                hint = f"; convert it with np.array(..., dtype=np.{ph.dtype.np})"
            raise TypeError(f"job '{self._name}': parameter '{pname}' expects a numpy array "
                            f"({ph!r}) but got {type(a).__name__}{hint} (an object with __dlpack__ "
                            "or __array__ is accepted too)")
        if a.dtype != ph.dtype.np:
            raise TypeError(f"job '{self._name}': parameter '{pname}' is declared {ph.dtype.np} but the "
                            f"array is {a.dtype}; convert it with {pname.split('[')[0]}.astype(np."
                            f"{ph.dtype.np})")
        if exact:
            if a.shape != ph.shape:
                raise ValueError(f"job '{self._name}': parameter '{pname}' is declared with shape "
                                 f"{ph.shape} but the array has shape {a.shape}; a tp.Numpy placeholder "
                                 "needs exactly its declared shape (use tp.ListNumpy.Placeholder for "
                                 "varying sizes)")
        else:
            if not fits_dynamic_bound(a.shape, ph.shape):
                raise ValueError(f"job '{self._name}': parameter '{pname}' has shape {a.shape}, which "
                                 f"is not within the declared bounds {ph.shape} (same rank and at most "
                                 f"{_elements(ph.shape)} elements, as OneFlow's dynamic blobs)")
        return a

    def _prepare_session(self):
        _devices.ensure_configured()
        gen = _C.session_generation()
        if self._generation != gen:
            self._cache.clear()
            self._fast = None
            self._generation = gen

    def _compiled_for(self, key, flat):
        compiled = self._cache.get(key)
        if compiled is None:
            # One trace per signature even when several threads call at once.
            self._refuse_reentry()
            with self._compile_lock:
                compiled = self._cache.get(key)
                if compiled is None:
                    compiled = self._compile(key, flat)
        return compiled

    def _call_slow(self, args):
        self._prepare_session()
        key, flat = self._check_args(args)
        compiled = self._cache.get(key)
        if compiled is None:  # (not self._compiled_for: warnings count the frames up to the call)
            self._refuse_reentry()
            with self._compile_lock:
                compiled = self._cache.get(key)
                if compiled is None:
                    compiled = self._compile(key, flat)
        flat_t = tuple(flat)
        for reader in compiled.feeds:  # the data ops' next batch: parameters after the user's
            if compiled.data_split is None:
                flat_t += tuple(reader.next())
                continue
            local = compiled.data_split[2]  # the mirrored view: the reader decodes this process's rows
            for a in reader.next():
                flat_t += tuple(np.split(a, local))
        if compiled.mode != "sync":
            fut = _futures.Future(self._name) if compiled.mode == "callback" else _futures.LegacyFuture(self._name)
            finish = compiled.async_result
            ok = compiled.job.try_run_async(flat_t, lambda outs: fut._deliver(finish(outs)))
            if not ok:
                raise RuntimeError(f"job '{self._name}': internal error: arguments rejected after "
                                   "validation")
            return fut
        outs = compiled.job.try_run(flat_t)
        if outs is None and compiled.job.stale:  # cleared by another thread since the compile
            raise RuntimeError(f"job '{self._name}': flow.clear_default_session() ran (in another "
                               "thread) before this call could run; nothing ran (call the job again "
                               "to recompile it)")
        if outs is None:
            raise RuntimeError(f"job '{self._name}': internal error: arguments rejected after validation")
        return compiled.sync_result(outs)

    def _trace_declared(self):
        """Compiles the job for its declared shapes (a tp.ListNumpy placeholder
        at its bounds) unless it already ran in this session, so that its
        variables, optimizer state included, exist: what OneFlow does for every
        defined job when its session starts. Checkpoint loading calls this."""
        if self._defined_in != _C.session_generation():
            return  # defined before flow.clear_default_session(): not part of this session
        self._prepare_session()
        if self._cache:
            return

        class _Shape:
            def __init__(self, shape):
                self.shape = shape

        key, flat = [], []
        split = self._mirrored_parts()
        for name, ph in self._params:
            if ph.kind == "Numpy" and split:
                if not ph.shape or ph.shape[0] % split:
                    return  # the call will say why
                part = (ph.shape[0] // split,) + ph.shape[1:]
                key.append(tuple(part for _ in range(split)))
                flat.extend(_Shape(part) for _ in range(split))
            elif ph.kind == "Numpy":
                key.append(ph.shape)
                flat.append(_Shape(ph.shape))
            elif ph.kind == "ListNumpy":
                n = _devices.list_arrays(self._name, self._config)
                key.append(tuple(ph.shape for _ in range(n)))
                flat.extend(_Shape(ph.shape) for _ in range(n))
            else:
                return  # how many arrays per device is known only from a call
        try:
            self._compiled_for(tuple(key), flat)
        except Exception as e:
            try:
                e.add_note(f"while tracing job '{self._name}' for its declared shapes, which flowjit does "
                           "for every defined job before a checkpoint is initialized or loaded")
            except AttributeError:
                pass
            raise

    # ---- tracing and compiling

    def _refuse_reentry(self):
        """A job called from its own body while it is traced would wait for
        its own trace forever (the compile lock): say so instead."""
        if self._tracing_thread == threading.get_ident():
            raise RuntimeError(f"job '{self._name}' ({self._source}) called itself while it was "
                               "being traced; a job function cannot call itself (call another job "
                               "outside the job function, or factor the shared part into a plain "
                               "Python function)")

    def _compile(self, key, flat, keep_text=False):
        self._tracing_thread = threading.get_ident()
        try:
            return self._compile_traced(key, flat, keep_text)
        finally:
            self._tracing_thread = None

    def _compile_traced(self, key, flat, keep_text=False):
        self._note_miss(key)
        tid = threading.get_native_id()
        t_trace = _compiled.now_ns()
        builder = JobBuilder(self._name, self._type, self._config)
        builder.source = self._source
        builder.data_split = self._data_split()
        blobs = []
        flat_shapes = [x.shape for x in flat]
        it = iter(flat_shapes)
        index = 0
        for (pname, ph), k in zip(self._params, key):
            if ph.kind == "Numpy" and not _is_split_key(k):
                blobs.append(builder.placeholder(index, pname, next(it), ph.dtype))
                index += 1
            elif ph.kind in ("Numpy", "ListNumpy"):
                shapes = [next(it) for _ in k]
                if len(set(shapes)) != 1:
                    raise NotImplementedError(
                        f"job '{self._name}': parameter '{pname}' got arrays of different shapes "
                        f"{shapes} for the devices; the devices of a mirrored job share one compiled "
                        "program, so every device's array needs the same shape")
                blobs.append(builder.placeholder(index, pname, shapes[0], ph.dtype))
                index += 1
            else:
                if len(k) > 1:
                    raise NotImplementedError(
                        f"job '{self._name}': parameter '{pname}' is a tp.ListListNumpy placeholder over "
                        f"{len(k)} devices; several devices take tp.ListNumpy (mirrored view) or "
                        "tp.Numpy (consistent view) placeholders")
                inner = []
                for i, _ in enumerate(k[0]):
                    inner.append(builder.placeholder(index, f"{pname}_{i}", next(it), ph.dtype))
                    index += 1
                blobs.append(inner)
        if self._has_tuples:
            blobs = self._group_blobs(blobs)
        _trace.push(builder)
        try:
            result = self._fn(*blobs)
            self._finish_training(builder)
            from . import legacy as _legacy
            _legacy.predict_watch_diff_error(builder)
        finally:
            _trace.pop()
            builder.finished = True
        outs = []
        if self._legacy and result is not None:
            template = _flatten_legacy(result, self._name, outs)
        else:
            template = _flatten_result(result, self._ret, self._name, outs)
        for o in outs:
            builder.check_owned(o, "return", _trace.user_location())
        n_user = len(outs)
        outs.extend(blob for blob, _, _ in builder.watches)
        if builder.type == "train" and builder.minimize is None:
            raise TypeError(f"job '{self._name}' is declared type=\"train\" but never calls an "
                            "optimizer's minimize(loss), e.g. flow.optimizer.SGD(flow.optimizer."
                            "PiecewiseConstantScheduler([], [0.1])).minimize(loss)")
        stages = [_compiled.Stage("trace", t_trace, _compiled.now_ns() - t_trace, tid)]
        t_init = _compiled.now_ns()
        _create_pending_variables(builder)
        if builder.variables:
            stages.append(_compiled.Stage("initialize variables", t_init, _compiled.now_ns() - t_init, tid))
        losses, lr, step, opt = [], None, None, None
        trainable = []
        if builder.minimize is not None:
            optimizer, loss_blobs, lr_blob, step_blob = builder.minimize
            losses = [b._node for b in loss_blobs]
            lr, step = lr_blob._node, step_blob._node
            opt = optimizer._config()
            names = optimizer._variables_filter()
            trainable = [b._node for n, (b, t) in sorted(builder.variables.items())
                         if t and (names is None or n in names)]
        sig = ";".join(f"{ph.kind}:{ph.dtype.name}{k}" for (_, ph), k in zip(self._params, key))
        # A tp.Numpy parameter cut into per-device parts is a per-device input.
        params = [(n, tp.ListNumpy.Placeholder(ph.shape, ph.dtype)) if ph.kind == "Numpy" and _is_split_key(k)
                  else (n, ph) for (n, ph), k in zip(self._params, key)]
        dist = _devices.distribution(self._name, self._config, builder, params)
        # A reader's batch is the same whatever the devices and in every
        # process (the same files, seed and order): in the consistent view it
        # is an input like the user's, split by the runtime; in the mirrored
        # view each device's rows were cut while tracing (data_placeholder).
        settings = {"keep_text": keep_text or bool(os.environ.get("FLOWJIT_KEEP_TEXT")),
                    "check_numerics": bool(self._config.get("check_numerics", False)),
                    # Ctrl-C stops a compile on the main thread (signals go there).
                    "interruptible": threading.current_thread() is threading.main_thread()}
        settings.update(_devices.job_target(self._name, self._config, builder, params))
        if self._config.get("enable_auto_mixed_precision", False):
            half = self._config.get("mixed_precision_dtype") or (
                _dtypes.float16 if settings.get("device") == "gpu" else _dtypes.bfloat16)
            settings["mixed_precision"] = half.name
        t_compile = _compiled.now_ns()
        req = _C.CompileRequest()
        req.name, req.train, req.source, req.signature = self._name, builder.type == "train", self._source, sig
        req.params, req.outputs, req.effects = builder.params, [o._node for o in outs], list(builder.effects)
        req.losses, req.lr, req.step, req.trainable, req.optimizer = losses, lr, step, trainable, opt
        req.watched_grads = [blob._node for blob, _, _ in builder.watch_diffs]
        req.settings, req.distribution = settings, dist
        with _tf32_for(self._config, settings):
            job = _C.compile_job(req)
        t_done = _compiled.now_ns()
        stages.append(_compiled.Stage("compile" + (" (disk cache hit)" if job.from_disk_cache else ""),
                                     t_compile, t_done - t_compile, tid))
        if not job.from_disk_cache:
            # compile_job's own split: the pass pipeline, then code generation.
            passes_ns = int(job.seconds_passes * 1e9)
            codegen_ns = int(job.seconds_codegen * 1e9)
            stages.append(_compiled.Stage("codegen", max(t_compile, t_done - codegen_ns), codegen_ns, tid))
            if passes_ns:
                stages.append(_compiled.Stage("passes", t_compile, passes_ns, tid))
        _log.info("%s [%s]: compiled in %.1f ms (%s)", self._name, sig, (t_done - t_trace) / 1e6,
                         "disk cache hit" if job.from_disk_cache else f"{job.num_kernels} kernels")
        if not job.from_disk_cache and _log.debug_level() >= 1:
            _log_cache_miss(job, self._name, sig, self._source)
        per_device = _devices.list_arrays(self._name, self._config) if dist and dist["mirrored"] else 1
        _check_result_groups(self._name, template, list(job.output_groups)[:n_user], [o.ndim for o in outs[:n_user]])
        mode = "callback" if self._async else "legacy" if template[0] != "none" and self._legacy else "sync"
        compiled = _Compiled(job, _builder_for(template, per_device, self._name), mode,
                             [(blob.name, handler, form)
                              for blob, handler, form in builder.watches + builder.watch_diffs],
                             n_user, self._name,
                             _compiled.CompiledJob(job, self._name, sig, stages))
        compiled.feeds = [src.open(builder.data_split) for src in builder.data_sources if src.fields]
        compiled.data_split = builder.data_split
        self._cache[key] = compiled
        if (self._numpy_only and mode == "sync" and not any(_is_split_key(k) for k in key)
                and not compiled.feeds):
            self._fast = compiled
        return compiled

    def _finish_training(self, builder):
        """At the end of the body, still tracing: OneFlow 0.1-0.2's losses
        (flow.losses.add_loss with function_config().train) become an
        optimizer's minimize, and regularizers join the minimized losses."""
        train = self._config.get("train")
        if builder.added_losses:
            if train is None or not train.is_set():
                _trace.fail(TypeError, f"flow.losses.add_loss: job '{self._name}' has no training "
                            "settings; set function_config().train.primary_lr(...) and .model_update_conf"
                            "({...}), or call an optimizer's minimize(loss) instead", _trace.user_location())
            train.optimizer(self._name).minimize(builder.added_losses)
        elif builder.type == "train" and builder.minimize is None and train is not None and train.is_set():
            raise TypeError(f"job '{self._name}' has function_config().train settings but never calls "
                            "flow.losses.add_loss(loss), so there is nothing to minimize")
        if builder.minimize is not None and builder.regularizers:
            from .._ops import builders as ops
            optimizer, losses, lr, step = builder.minimize
            trained = optimizer._variables_filter()
            by_dtype = {}
            for name, (blob, reg) in sorted(builder.regularizers.items()):
                if not builder.variables[name][1] or (trained is not None and name not in trained):
                    continue  # OneFlow regularizes the gradients the loss produces only
                p = reg.penalty(ops, blob)
                if p is not None:
                    by_dtype[p.dtype] = p if p.dtype not in by_dtype else ops.add(by_dtype[p.dtype], p)
            builder.minimize = (optimizer, list(losses) + list(by_dtype.values()), lr, step)

    def _note_miss(self, key):
        limit = self._config.get("recompile_limit", 8)
        if self._cache:
            self._misses.append(key)
            nearest = next(iter(self._cache))
            diffs = [f"{n}: {a} vs cached {b}" for (n, _), a, b in zip(self._params, key, nearest) if a != b]
            why = "; ".join(diffs) or "the session changed"
            _log.info("%s: cache miss, recompiling because %s", self._name, why)
            if len(self._cache) >= limit and not self._warned_recompile:
                import warnings
                warnings.warn(f"job '{self._name}' has been compiled {len(self._cache) + 1} times (limit "
                              f"{limit}); the last recompile was because {why}. Each new concrete shape "
                              "of a tp.ListNumpy placeholder compiles once: pad inputs to a few fixed "
                              "shapes to avoid this.", RuntimeWarning, stacklevel=5)
                self._warned_recompile = True

    # ---- introspection (tests, debugging)

    def compiled_jobs(self) -> "typing.List[_compiled.CompiledJob]":
        """The compiled signatures of this job, oldest first."""
        return [c.view for c in self._cache.values()]

    def lower(self, *args_or_shapes) -> "_compiled.Lowered":
        """Binds the job to one signature without tracing or running it, as
        jax.jit(f).lower(...): each argument is an array (or an object with
        ``__dlpack__`` or ``__array__``), a shape, or None for the declared shape; no
        arguments means all declared shapes. .compile() on the result traces
        and compiles."""
        self._prepare_session()
        key, flat = _compiled.lower_args(self, args_or_shapes)
        return _compiled.Lowered(self, key, flat)

    def compile(self, *args_or_shapes) -> "_compiled.CompiledJob":
        """``job.lower(*args_or_shapes).compile()``: traces and compiles without
        running (a train job updates no variable), keeping the LLVM IR and
        assembly text; returns the compiled job to look into. Later calls
        with this signature run it without compiling again."""
        return self.lower(*args_or_shapes).compile()

    def _compile_only(self, key, flat):
        self._prepare_session()
        compiled = self._cache.get(key)
        if compiled is None:
            with self._compile_lock:
                compiled = self._cache.get(key)
                if compiled is None:
                    compiled = self._compile(key, flat, keep_text=True)
        return compiled.view

    def profile(self) -> "_compiled.ProfileTable":
        """The per-kernel profile (FLOWJIT_PROFILE=1) of this job's only or
        newest compiled signature."""
        if not self._cache:
            raise RuntimeError(f"job '{self._name}' has not been compiled yet: call it (with "
                               "FLOWJIT_PROFILE=1 set) before asking for its profile")
        return list(self._cache.values())[-1].view.profile()

    def export(self, path: "typing.Union[str, os.PathLike]", **kwargs: typing.Any) -> typing.Any:
        """``flowjit.export.export(self, path, **kwargs)``: this job (a train
        job: its forward) as a shared library with a C header, holding the
        variables' current values; returns the ExportedLibrary."""
        from .. import export as _export
        return _export.export(self, path, **kwargs)

    def export_chrome_trace(self, path: str) -> str:
        """Writes this job's compile stages and kernel launches (FLOWJIT_PROFILE=1)
        as a Chrome/Perfetto trace JSON file; returns the path."""
        return _compiled.export_chrome_trace(path, self.compiled_jobs())


def _is_split_key(k):
    """Whether a tp.Numpy parameter's signature entry is per-device parts
    (a tuple of shapes) rather than one shape (a tuple of ints)."""
    return bool(k) and isinstance(k[0], tuple)


def _interop_array(job, pname, a):
    """A numpy view of an array from another library (PyTorch, JAX, CuPy on
    the host...): through DLPack when it has __dlpack__, else __array__.
    Returns `a` unchanged when it is neither (the caller reports that). No
    copy is made where the layout allows; the runtime copies strided views
    into C order itself."""
    if isinstance(a, (np.generic, numbers.Number, list, tuple, str, bytes)) or a is None:
        return a
    if hasattr(a, "__dlpack__"):
        try:
            return np.from_dlpack(a)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            where = ""
            dev = getattr(a, "__dlpack_device__", None)
            if dev is not None:
                try:
                    kind, ordinal = dev()
                    if int(kind) != 1:  # kDLCPU
                        where = (f" (it is on DLPack device type {int(kind)}:{ordinal}, not the host; "
                                 "move it to the CPU first)")
                except Exception:  # noqa: BLE001 - only for the message
                    pass
            if not hasattr(a, "__array__") or where:
                raise TypeError(f"job '{job}': parameter '{pname}' got a {type(a).__name__} that numpy "
                                f"cannot read through DLPack{where}: {e}") from e
    if hasattr(a, "__array__"):
        try:
            return np.asarray(a)
        except Exception as e:  # noqa: BLE001 - any library's conversion error
            raise TypeError(f"job '{job}': parameter '{pname}' got a {type(a).__name__} whose "
                            f"__array__ failed: {e}") from e
    return a


# Job functions defined in this process (the ones defined since the last
# flow.clear_default_session() are the session's: see trace_defined_jobs).
_defined_jobs = weakref.WeakSet()


def _elements(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def fits_dynamic_bound(shape, bound):
    """OneFlow's rule for a ListNumpy (dynamic) placeholder: the same rank and
    at most as many elements as the declared shape, in any extents."""
    return len(shape) == len(bound) and _elements(shape) <= _elements(bound)


def trace_defined_jobs():
    """Compiles every job function of the session that has not run yet, so
    that all their variables exist, as when a OneFlow session starts. Used
    before a checkpoint is initialized, loaded or saved."""
    for job in sorted(_defined_jobs, key=lambda j: (j._source, j._name)):
        job._trace_declared()


class _tf32_for:
    """While compiling a job placed on a GPU: FLOWJIT_ALLOW_TF32 as its
    function_config's enable_tensor_float_32_compute says (the GPU target
    reads it at compile time). One lock around every such compile, so
    concurrent compiles never see each other's setting."""

    _lock = threading.Lock()

    def __init__(self, config, settings):
        flag = config.get("enable_tensor_float_32_compute")
        self.value = None if flag is None or settings.get("device") != "gpu" else ("1" if flag else "0")

    def __enter__(self):
        if self.value is not None:
            self._lock.acquire()
            self.saved = os.environ.get("FLOWJIT_ALLOW_TF32")
            os.environ["FLOWJIT_ALLOW_TF32"] = self.value

    def __exit__(self, *exc):
        if self.value is not None:
            if self.saved is None:
                os.environ.pop("FLOWJIT_ALLOW_TF32", None)
            else:
                os.environ["FLOWJIT_ALLOW_TF32"] = self.saved
            self._lock.release()
        return False


def _log_cache_miss(job, name, sig, source):
    """FLOWJIT_DEBUG=1: why the disk cache had no entry for a job compiled
    afresh (which part of the key differs from what other processes cached)."""
    from ..cache import explain
    d = explain.cache_dir_of_job()
    if d is None:
        return
    try:
        why = explain.explain_miss(job, name, sig, source, d)
    except OSError as e:  # an unreadable cache is the compiler's to report
        why = f"the cache {d} could not be read ({e})"
    _log.info("%s [%s]: disk cache miss: %s", name, sig, why)


def global_function(type: Union[str, FunctionConfig, Callable, None] = None,  # noqa: A002 - OneFlow's name
                    function_config: Optional[FunctionConfig] = None
                    ) -> Union[JobFunction, Callable[[Callable], JobFunction]]:
    """Decorates a job function: ``@flow.global_function(type="train", function_config=cfg)``.

    Without `type` a job is "predict", or "train" when its function_config
    sets train.primary_lr / model_update_conf (OneFlow 0.1-0.2, where
    ``@flow.global_function(func_config)`` was the form).

    Example:
        >>> @flow.global_function(type="predict")
        ... def double(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return x * 2
        >>> double(np.float32([1, 2, 3])).tolist()   # the first call traces and compiles
        [2.0, 4.0, 6.0]
    """
    if callable(type) and not isinstance(type, (str, FunctionConfig)):
        return JobFunction(type, None, None)  # used without parentheses
    if isinstance(type, FunctionConfig):  # older positional form: global_function(config)
        type, function_config = None, type
    if type not in ("train", "predict", None):
        raise ValueError(f"global_function: type must be \"train\" or \"predict\", got {type!r}")
    if function_config is not None and not isinstance(function_config, FunctionConfig):
        raise TypeError("global_function: function_config must come from flow.function_config(), got "
                        f"{function_config!r}")

    def decorate(fn):
        if not callable(fn):
            raise TypeError(f"global_function decorates a function, got {fn!r}")
        return JobFunction(fn, type, function_config)

    return decorate
