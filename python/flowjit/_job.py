"""Job functions: @global_function, function_config, tracing and calling."""
import functools
import inspect
import numbers
import os
import threading
import typing

import numpy as np

from . import _C, _async, _devices, _dtypes, _ops, _trace
from . import typing as tp
from ._blob import Blob

K = _C.OpKind


# ---------------------------------------------------------------- config

class FunctionConfig:
    """Settings of a job function (OneFlow's flow.function_config())."""

    _SETTINGS = ("default_data_type", "default_logical_view", "default_placement_scope",
                 "default_distribute_strategy", "recompile_limit", "allow_cpu_fallback")
    # OneFlow settings that flowjit does not implement, with the reason.
    _ONEFLOW_ONLY = {
        "enable_inplace": "flowjit plans memory reuse itself",
        "enable_fuse_model_update_ops": "flowjit always fuses optimizer updates",
        "enable_fuse_add_to_output": "flowjit fuses elementwise epilogues itself",
        "enable_auto_mixed_precision": "mixed precision is not supported yet",
        "enable_xla_jit": "flowjit is its own JIT",
        "enable_tensorrt": "TensorRT is not used",
        "cudnn_conv_heuristic_search_algo": "flowjit has no cuDNN convolutions",
        "train": "use flow.optimizer.*.minimize(loss) in the job body",
    }

    def __init__(self):
        object.__setattr__(self, "_values", {"default_data_type": _dtypes.float32})

    def default_data_type(self, dtype):
        self._values["default_data_type"] = _dtypes.to_dtype(dtype, "function_config.default_data_type")
        return self

    def default_logical_view(self, view):
        from . import scope
        if not isinstance(view, scope.LogicalView):
            raise TypeError("function_config.default_logical_view: expected flow.scope.consistent_view() "
                            f"or flow.scope.mirrored_view(), got {view!r}")
        self._values["default_logical_view"] = view
        return self

    def default_placement_scope(self, placement):
        from . import scope
        if not isinstance(placement, scope.Placement):
            raise TypeError("function_config.default_placement_scope: expected flow.scope.placement(...), "
                            f"got {placement!r}")
        self._values["default_placement_scope"] = placement
        return self

    def default_distribute_strategy(self, strategy):
        self._values["default_distribute_strategy"] = strategy
        return self

    def recompile_limit(self, n):
        if not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"function_config.recompile_limit: expected a positive int, got {n!r}")
        self._values["recompile_limit"] = int(n)
        return self

    def allow_cpu_fallback(self, flag=True):
        """A job placed on a GPU runs on the CPU (with one warning) where the GPU
        cannot be used (no CUDA driver, no such GPU), instead of raising."""
        if not isinstance(flag, bool):
            raise TypeError(f"function_config.allow_cpu_fallback: expected True or False, got {flag!r}")
        self._values["allow_cpu_fallback"] = flag
        return self

    def get(self, key, default=None):
        return self._values.get(key, default)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        why = self._ONEFLOW_ONLY.get(name)
        if why:
            raise NotImplementedError(f"function_config.{name} is a OneFlow setting that flowjit does not "
                                      f"implement ({why})")
        raise AttributeError(f"function_config has no setting '{name}'; flowjit's settings are: "
                             + ", ".join(self._SETTINGS))

    def __setattr__(self, name, value):
        raise AttributeError(f"function_config settings are methods: call config.{name}(value)")

    def key(self):
        return tuple(sorted((k, repr(v)) for k, v in self._values.items()))


def function_config():
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
        self.placements = []  # flow.scope.placement scopes entered while tracing
        self.finished = False
        self._counts = {}

    def new_blob(self, node, name, api):
        if name is None:
            n = self._counts.get(api, 0)
            self._counts[api] = n + 1
            name = f"{api}_{n}"
        return Blob(node, self, name)

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

    def variable(self, name, shape, dtype, initializer, trainable, seed, loc, distribute=None):
        if distribute is not None:
            from . import distribute as _dist
            if not isinstance(distribute, _dist.Distribute):
                _trace.fail(TypeError, f"get_variable: distribute of '{name}' must be flow.distribute."
                            f"split(axis), broadcast() or auto(), got {distribute!r}", loc)
            if distribute.kind == "split":
                axis = distribute.axis + len(shape) if distribute.axis < 0 else distribute.axis
                if not 0 <= axis < len(shape):
                    _trace.fail(ValueError, f"get_variable: '{name}' has shape {shape} but is declared "
                                f"{distribute!r}", loc)
                prev = self.split_vars.get(name)
                if prev is not None and prev != axis:
                    _trace.fail(ValueError, f"get_variable: '{name}' is declared split({prev}) and "
                                f"split({axis}) in the same job", loc)
                self.split_vars[name] = axis
        if name in self.variables:
            blob, _ = self.variables[name]
            if blob.shape != shape or blob.dtype is not dtype:
                _trace.fail(ValueError, f"get_variable: variable '{name}' was already requested in this "
                            f"job as {blob.dtype!r}{blob.shape}, now as {dtype!r}{shape}", loc)
            return blob
        info = _C.variable_info(name)
        if info is not None:
            vshape, vdt, vtrain, _ = info
            if tuple(vshape) != shape or _dtypes.from_c(vdt) is not dtype:
                _trace.fail(ValueError, f"get_variable: variable '{name}' exists in the session as "
                            f"{_dtypes.from_c(vdt)!r}{tuple(vshape)} but is requested as "
                            f"{dtype!r}{shape}; two jobs or layers use the same name with different "
                            "shapes", loc)
            trainable = bool(vtrain) and trainable
        else:
            self.pending[name] = (shape, dtype, initializer, seed, trainable)
        node = _C.make_node(K.variable, [], {"name": name, "shape": list(shape), "dtype": dtype.c},
                            loc[0], loc[1])
        blob = Blob(node, self, name)
        self.variables[name] = (blob, trainable)
        return blob

    def train_step(self):
        from ._variables import ConstantInitializer
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
    signature = "init:" + ",".join(sorted(builder.pending))
    compiled = _C.compile_job(init.job_name, False, [], [], effects, [], None, None, [], None,
                              getattr(builder, "source", ""), signature, {})
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


def _describe(v):
    if isinstance(v, tuple):
        return f"a tuple of {len(v)}"
    return type(v).__name__


def _check_result_groups(job, template, groups):
    """Per-device results (mirrored view) must be annotated tp.ListNumpy."""
    it = iter(groups)

    def walk(t):
        k = t[0]
        if k == "one":
            if next(it):
                raise TypeError(f"job '{job}': in the mirrored view a result computed from per-device "
                                "inputs has one value per device; annotate it tp.ListNumpy")
        elif k == "list1":
            next(it)
        elif k == "listlist":
            for _ in range(t[1]):
                if next(it):
                    raise NotImplementedError(f"job '{job}': tp.ListListNumpy results in the mirrored "
                                              "view with several devices are not supported yet")
        elif k in ("tuple", "list"):
            for s in t[1]:
                walk(s)
        elif k == "dict":
            for _, s in t[1]:
                walk(s)

    walk(template)


def _builder_for(template, devices=1):
    """A function from the list of results (an array, or a list of one array
    per device) to the result structure."""
    kind = template[0]
    if kind == "one":
        return lambda outs: outs[0]
    if kind == "none":
        return lambda outs: None

    def build(t, it):
        k = t[0]
        if k == "one":
            return next(it)
        if k == "list1":
            v = next(it)
            # A value that does not depend on per-device inputs is the same on
            # every device.
            return v if isinstance(v, list) else [v] * devices
        if k == "listlist":
            return [[next(it) for _ in range(t[1])]]
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
    __slots__ = ("job", "build", "flatten_args")

    def __init__(self, job, build):
        self.job = job
        self.build = build


class JobFunction:
    """A traced, compiled, cached job: call it with numpy arrays."""

    def __init__(self, fn, job_type, config):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._type = job_type
        self._config = config if config is not None else FunctionConfig()
        self._name = fn.__name__
        self._source = f"{os.path.basename(fn.__code__.co_filename)}:{fn.__code__.co_firstlineno}"
        self._params = self._parse_params(fn)
        ann = self._annotations(fn).get("return", inspect.Signature.empty)
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
            if not isinstance(a, tp._Placeholder):
                raise TypeError(f"job '{self._name}': parameter '{p.name}' needs a placeholder annotation "
                                "such as tp.Numpy.Placeholder((100, 784), dtype=flow.float), got "
                                f"{'no annotation' if a is None else repr(a)}")
            params.append((p.name, a))
        return params

    @property
    def job_name(self):
        return self._name

    def __repr__(self):
        return f"<flowjit job '{self._name}' ({self._type}) from {self._source}>"

    # ---- calling

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._bind_kwargs(args, kwargs)
        fast = self._fast
        if fast is not None and not self._async and self._generation == _C.session_generation():
            outs = fast.job.try_run(args)
            if outs is not None:
                return fast.build(outs)
        return self._call_slow(args)

    def _bind_kwargs(self, args, kwargs):
        names = [n for n, _ in self._params]
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
        for (pname, ph), a in zip(self._params, args):
            if ph.kind == "Numpy":
                self._check_array(pname, ph, a, exact=True)
                key.append(a.shape)
                flat.append(a)
            elif ph.kind == "ListNumpy":
                arrs = self._check_list(pname, ph, a)
                for i, x in enumerate(arrs):
                    self._check_array(f"{pname}[{i}]", ph, x, exact=False)
                key.append(tuple(x.shape for x in arrs))
                flat.extend(arrs)
            else:  # ListListNumpy
                per_device = self._check_list(pname, ph, a)
                shapes = []
                for d, lst in enumerate(per_device):
                    if not isinstance(lst, (list, tuple)):
                        raise TypeError(f"job '{self._name}': parameter '{pname}' ({ph!r}) expects, per "
                                        f"device, a list of arrays; element {d} is {type(lst).__name__}")
                    for i, x in enumerate(lst):
                        self._check_array(f"{pname}[{d}][{i}]", ph, x, exact=False)
                        flat.append(x)
                    shapes.append(tuple(x.shape for x in lst))
                key.append(tuple(shapes))
        return tuple(key), flat

    def _check_list(self, pname, ph, a):
        from . import config
        ndev = config.device_count()
        if not isinstance(a, (list, tuple)):
            raise TypeError(f"job '{self._name}': parameter '{pname}' ({ph!r}) expects a list with one "
                            f"array per device ({ndev}), got {type(a).__name__}")
        if len(a) != ndev:
            raise ValueError(f"job '{self._name}': parameter '{pname}' ({ph!r}) expects {ndev} "
                             f"element(s), one per device, but got {len(a)}")
        return list(a)

    def _check_array(self, pname, ph, a, exact):
        if not isinstance(a, np.ndarray):
            hint = ""
            if isinstance(a, (np.generic, numbers.Number)):
                hint = f"; a scalar must be passed as a 0-d array, e.g. np.array({a!r}, dtype=np." \
                       f"{ph.dtype.np})"
            elif isinstance(a, (list, tuple)) and ph.kind == "Numpy":
                hint = f"; convert it with np.array(..., dtype=np.{ph.dtype.np})"
            raise TypeError(f"job '{self._name}': parameter '{pname}' expects a numpy array "
                            f"({ph!r}) but got {type(a).__name__}{hint}")
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
            if a.ndim != len(ph.shape) or any(s > b for s, b in zip(a.shape, ph.shape)):
                raise ValueError(f"job '{self._name}': parameter '{pname}' has shape {a.shape}, which "
                                 f"is not within the declared bounds {ph.shape} (same rank, each extent "
                                 "at most the bound)")

    def _call_slow(self, args):
        _devices.ensure_configured()
        gen = _C.session_generation()
        if self._generation != gen:
            self._cache.clear()
            self._fast = None
            self._generation = gen
        key, flat = self._check_args(args)
        compiled = self._cache.get(key)
        if compiled is None:
            # One trace per signature even when several threads call at once.
            with self._compile_lock:
                compiled = self._cache.get(key)
                if compiled is None:
                    compiled = self._compile(key, flat)
        flat_t = tuple(flat)
        if self._async:
            fut = _async.Future(self._name)
            build = compiled.build
            ok = compiled.job.try_run_async(flat_t, lambda outs: fut._deliver(build(outs)))
            if not ok:
                raise RuntimeError(f"job '{self._name}': internal error: arguments rejected after "
                                   "validation")
            return fut
        outs = compiled.job.try_run(flat_t)
        if outs is None:
            raise RuntimeError(f"job '{self._name}': internal error: arguments rejected after validation")
        return compiled.build(outs)

    # ---- tracing and compiling

    def _compile(self, key, flat):
        self._note_miss(key)
        builder = JobBuilder(self._name, self._type, self._config)
        builder.source = self._source
        blobs = []
        flat_shapes = [x.shape for x in flat]
        it = iter(flat_shapes)
        index = 0
        for (pname, ph), k in zip(self._params, key):
            if ph.kind == "Numpy":
                blobs.append(builder.placeholder(index, pname, next(it), ph.dtype))
                index += 1
            elif ph.kind == "ListNumpy":
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
        _trace.push(builder)
        try:
            result = self._fn(*blobs)
        finally:
            _trace.pop()
            builder.finished = True
        outs = []
        template = _flatten_result(result, self._ret, self._name, outs)
        for o in outs:
            builder.check_owned(o, "return", _trace.user_location())
        if self._type == "train" and builder.minimize is None:
            raise TypeError(f"job '{self._name}' is declared type=\"train\" but never calls an "
                            "optimizer's minimize(loss), e.g. flow.optimizer.SGD(flow.optimizer."
                            "PiecewiseConstantScheduler([], [0.1])).minimize(loss)")
        _create_pending_variables(builder)
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
        dist = _devices.distribution(self._name, self._config, builder, self._params)
        settings = {"keep_text": bool(os.environ.get("FLOWJIT_KEEP_TEXT"))}
        settings.update(_devices.job_target(self._name, self._config, builder, self._params))
        job = _C.compile_job(self._name, self._type == "train", builder.params, [o._node for o in outs],
                             [], losses, lr, step, trainable, opt, self._source, sig, settings, dist)
        per_device = _C.device_info()["local_devices"] if dist and dist["mirrored"] else 1
        _check_result_groups(self._name, template, list(job.output_groups))
        compiled = _Compiled(job, _builder_for(template, per_device))
        self._cache[key] = compiled
        if self._numpy_only:
            self._fast = compiled
        return compiled

    def _note_miss(self, key):
        limit = self._config.get("recompile_limit", 8)
        if self._cache:
            self._misses.append(key)
            nearest = next(iter(self._cache))
            diffs = [f"{n}: {a} vs cached {b}" for (n, _), a, b in zip(self._params, key, nearest) if a != b]
            why = "; ".join(diffs) or "the session changed"
            if int(os.environ.get("FLOWJIT_DEBUG", "0") or 0) >= 1:
                import sys
                print(f"[flowjit] {self._name}: cache miss, recompiling because {why}", file=sys.stderr)
            if len(self._cache) >= limit and not self._warned_recompile:
                import warnings
                warnings.warn(f"job '{self._name}' has been compiled {len(self._cache) + 1} times (limit "
                              f"{limit}); the last recompile was because {why}. Each new concrete shape "
                              "of a tp.ListNumpy placeholder compiles once: pad inputs to a few fixed "
                              "shapes to avoid this.", RuntimeWarning, stacklevel=4)
                self._warned_recompile = True

    # ---- introspection (tests, debugging)

    def compiled_jobs(self):
        return [c.job for c in self._cache.values()]


def global_function(type="predict", function_config=None):  # noqa: A002 - OneFlow's name
    """Decorates a job function: ``@flow.global_function(type="train", function_config=cfg)``."""
    if callable(type) and not isinstance(type, (str, FunctionConfig)):
        return JobFunction(type, "predict", None)  # used without parentheses
    if isinstance(type, FunctionConfig):  # older positional form: global_function(config)
        type, function_config = "predict", type
    if type not in ("train", "predict"):
        raise ValueError(f"global_function: type must be \"train\" or \"predict\", got {type!r}")
    if function_config is not None and not isinstance(function_config, FunctionConfig):
        raise TypeError("global_function: function_config must come from flow.function_config(), got "
                        f"{function_config!r}")

    def decorate(fn):
        if not callable(fn):
            raise TypeError(f"global_function decorates a function, got {fn!r}")
        return JobFunction(fn, type, function_config)

    return decorate
