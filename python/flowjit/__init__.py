"""flowjit: OneFlow's job-function API on a JIT compiler that generates every
kernel with LLVM::

    import flowjit as flow
    import flowjit.typing as tp

    @flow.global_function(type="predict")
    def double(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x * 2

The docstrings' examples assume ``import numpy as np``, ``import flowjit as flow``
and ``import flowjit.typing as tp``; each starts from a fresh session.
"""

def _load_core():
    """Imports the C++ core. Another library of the process may bring its own
    LLVM (TensorFlow's libtensorflow_framework does): loaded first, its symbols
    would win over libLLVM's for _C and crash in the first compile. RTLD_DEEPBIND
    makes _C and what it loads prefer their own dependencies. (Not under
    AddressSanitizer, which refuses DEEPBIND; wheels link LLVM statically with
    hidden symbols and need none of this.)"""
    import os as _os
    import sys as _sys
    deep = getattr(_os, "RTLD_DEEPBIND", 0)
    if not deep or "asan" in _os.environ.get("LD_PRELOAD", "") or "flowjit._C" in _sys.modules:
        from . import _C as core
        return core
    old = _sys.getdlopenflags()
    _sys.setdlopenflags(old | deep)
    try:
        from . import _C as core
    finally:
        _sys.setdlopenflags(old)
    return core


_C = _load_core()
from ._core import process as _process  # noqa: E402
from ._core.dtypes import bfloat16, bool_, float16, float32, float64, int8, int32, int64, uint8  # noqa: F401
from . import typing  # noqa: F401
from ._core.blob import Blob  # noqa: F401
from ._core.job import FunctionConfig, JobFunction, function_config, global_function  # noqa: F401
from ._core.compiled import CompiledJob, Lowered, ProfileTable  # noqa: F401
from ._core.log import logger  # noqa: F401
from ._ops.builders import (argmax, broadcast_like, broadcast_to, cast, constant, expand_dims,  # noqa: F401
                            identity, matmul, one_hot, ones, ones_like, reshape, squeeze, transpose, where,
                            zeros, zeros_like)
from ._ops.array import (argsort, assign, concat, constant_pad2d, expand, flatten, gather,  # noqa: F401
                         gather_nd, pad, range, reflection_pad2d, replication_pad2d, scatter_nd, slice,
                         slice_v2, sort, split, stack, tile)
from ._core.variables import (constant_initializer, get_all_variables, get_variable,  # noqa: F401
                              glorot_normal_initializer, glorot_uniform_initializer, kaiming_initializer,
                              load_variables, manual_seed, ones_initializer, random_normal_initializer,
                              random_uniform_initializer, truncated_normal, truncated_normal_initializer,
                              variance_scaling_initializer, xavier_normal_initializer,
                              xavier_uniform_initializer, zeros_initializer)
from . import config, data, distribute, distributed, env, image, layers, math, nn, optimizer, scope  # noqa: F401
from . import checkpoint, train  # noqa: F401
from . import losses, regularizers  # noqa: F401
from ._core.legacy import FixedTensorDef, MirroredTensorDef, watch, watch_diff  # noqa: F401

name_scope = scope.namespace  # OneFlow's older name of flow.scope.namespace

float = float32  # noqa: A001 - OneFlow's names
double = float64
bool = bool_  # noqa: A001
char = int8

from ._version import __version__  # noqa: E402,F401 - written once, in _version.py
from ._core.log import install_core_sink as _install_core_sink  # noqa: E402
_install_core_sink(_C)  # the C++ core's diagnostics through logger "flowjit" too
CacheWarning = _C.CacheWarning  # the disk cache degraded (unwritable, damaged entry)


def clear_default_session():
    """Drops every variable and compiled job of the session (jobs recompile
    on their next call).

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2,), initializer=flow.ones_initializer())
        >>> _ = job()
        >>> flow.load_variables({"w": np.float32([5, 6])})
        >>> job().tolist()
        [5.0, 6.0]
        >>> flow.clear_default_session()   # drops w: the next call starts from its initializer
        >>> job().tolist()
        [1.0, 1.0]
    """
    _C.clear_session()


def sync_default_session():
    """Waits for every queued asynchronous job and callback; raises the first
    error any of them hit.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Callback[tp.Numpy]:
        ...     return x * 2
        >>> job(np.float32([1, 2]))(lambda y: print("callback", y.tolist()))
        >>> flow.sync_default_session()   # returns after the callback ran
        callback [2.0, 4.0]
    """
    _C.sync_session()


_process.register()  # at exit: finish async work, report errors nobody saw; os.fork


# ---------------------------------------------------------------- public names
# The public modules; dir() of each shows its API (its __all__), not what it
# imported (numbers, np, other flowjit modules).
_PUBLIC_MODULES = ("checkpoint", "config", "data", "distribute", "distributed", "env", "image", "layers", "losses", "math", "nn",
                   "optimizer", "regularizers", "scope", "train", "typing")


def _public_names(module):
    names = getattr(module, "__all__", None)
    if names is None:  # a module without __all__ yet: its names, less the modules it imported
        import types
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and not isinstance(v, types.ModuleType)]
    return sorted(set(names))


def _install_dir(module):
    module.__dir__ = lambda: _public_names(module)


for _name in _PUBLIC_MODULES:
    _install_dir(globals()[_name])


def __getattr__(name):
    # flowjit's own __all__ is computed when asked for, since several modules
    # add top-level names (OneFlow exports ops both as flow.x and flow.math.x).
    if name == "__all__":
        import types
        return sorted(n for n, v in globals().items()
                      if not n.startswith("_") and (n in _PUBLIC_MODULES or not isinstance(v, types.ModuleType)))
    raise AttributeError(f"module 'flowjit' has no attribute '{name}'")

# Where OneFlow exports these at the top level (flow.clip, flow.masked_fill, ...).
from ._ops.composite import clamp, clip_by_value, masked_fill  # noqa: E402,F401
from ._ops.losses import smooth_l1_loss  # noqa: E402,F401
clip = clip_by_value


def export_chrome_trace(path: str) -> str:
    """Writes the compile stages and kernel launches (FLOWJIT_PROFILE=1) of
    every job function compiled in this session as one Chrome/Perfetto trace
    JSON file; returns the path.

    Example:
        >>> import json, os, tempfile
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return x + 1
        >>> _ = job(np.float32([1, 2]))
        >>> path = flow.export_chrome_trace(os.path.join(tempfile.mkdtemp(), "trace.json"))
        >>> "traceEvents" in json.load(open(path))
        True
    """
    from ._core import compiled as _compiled, job as _jobmod
    jobs = [c for j in sorted(_jobmod._defined_jobs, key=lambda j: (j._source, j._name))
            for c in j.compiled_jobs()]
    return _compiled.export_chrome_trace(path, jobs)

# Logical views, layout casts and shapes (OneFlow's advanced/distribute_ops, flow.Size).
from ._dist.views import (cast_to_current_logical_view, cast_to_static_shape,  # noqa: E402,F401
                          hierarchical_parallel_cast, parallel_cast, sync_dynamic_resize)
from ._core.blob import INVALID_SPLIT_AXIS, Size  # noqa: E402,F401
from . import advanced  # noqa: E402,F401
_PUBLIC_MODULES += ("advanced",)
_install_dir(advanced)

# OneFlow's session queries, dtype helpers and support modules (flow.unittest, flow.sysconfig, ...).
from ._core.dtypes import convert_oneflow_dtype_to_numpy_dtype, dtypes  # noqa: E402,F401
from ._core.session import (Generator, current_global_function_desc, current_machine_id,  # noqa: E402,F401
                            current_scope, default_generator, eager_execution_enabled, enable_eager_execution,
                            is_deprecated)
from .config import current_resource  # noqa: E402,F401
from . import deprecated, profiler, sysconfig, unittest, util  # noqa: E402,F401
_PUBLIC_MODULES += ("deprecated", "profiler", "sysconfig", "unittest", "util")
for _name in ("deprecated", "profiler", "sysconfig", "unittest", "util"):
    _install_dir(globals()[_name])

# OneFlow's other top-level ops, flow.random and flow.linalg (issue [conformance]).
from ._ops.builders import constant_like, constant_scalar  # noqa: E402,F401
from ._ops.array import (acc, amp_white_identity, argwhere, broadcast_to_compatible_with,  # noqa: E402,F401
                         diag, dim_gather, elem_cnt, count_not_finite, identity_n, multi_count_not_finite,
                         nonzero, pack, repeat, reshape_like, reverse, same_padding, tensor_scatter_nd_add,
                         tensor_scatter_nd_update, unpack, unsorted_batch_segment_sum, zero_pad2d,
                         dynamic_reshape, pad_grad, unsorted_segment_sum, unsorted_segment_sum_like,
                         categorical_ordinal_encode, slice_update)
from . import linalg, random  # noqa: E402,F401
_PUBLIC_MODULES += ("linalg", "random")
for _name in ("linalg", "random"):
    _install_dir(globals()[_name])
in_top_k = math.in_top_k
clip_by_scalar = clip_by_value

# flow.ctc_loss (OneFlow's top-level name; nn holds ctc_greedy_decoder).
from ._ops.ctc import ctc_loss  # noqa: E402,F401

# flow.user_op_builder: OneFlow's generic op builder over flowjit's ops (issue [conformance]).
from ._ops.user_op import (consistent_user_op_builder, consistent_user_op_module_builder,  # noqa: E402,F401
                           find_or_create_module, user_op_builder, user_op_module_builder, user_op_types)

# flow.experimental: OneFlow's lazy unique/indexed-slices ops (issue [conformance]).
from . import experimental  # noqa: E402,F401
_PUBLIC_MODULES += ("experimental",)
_install_dir(experimental)

# OneFlow's older placement names and job-set settings (issue [conformance]).
from ._core.legacy import (device_prior_placement, empty_initializer, fixed_placement,  # noqa: E402,F401
                           inter_job_reuse_mem_strategy)
