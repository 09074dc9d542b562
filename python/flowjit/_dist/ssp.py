"""OneFlow's stale-synchronous-parallel (SSP) variable proxy and the scope
attributes that configure it (flow.experimental.scope.config).

A proxy of variable W with buffer size k hands out two blobs: `ref`, W
itself (what flow.assign and the optimizer update), and `value`, W as it was
k - 1 steps earlier (OneFlow's ring buffer of k copies, whose reader lags its
writer by k - 1 steps). Our buffer is a hidden variable holding the last
k - 1 values of W, newest first, shifted by one at each run:

    value   = buffer[k - 2]             (W before the run k - 1 runs ago)
    buffer <- [W, buffer[0 : k - 2]]    (W as this run read it, before any update)

Before the first run the buffer holds nothing; a hidden flag tells the first
run to take W itself for every entry, so the first k runs see W's initial
value, as OneFlow's ring buffer starts full of it. With k == 1, value is W.

function_config().enable_ssp(True) puts a proxy behind every trainable
variable of a train job (OneFlow's AddSspVariableProxy pass), with k =
ssp_num_stages - ssp_stage_id of the scope the variable is requested in: the
forward pass computes with `value` while the optimizer updates W with the
gradient taken at `value`.
"""
from typing import Any, Dict, Optional, Tuple

from .. import _C
from .._ops import array as _array, builders as _ops
from .._core import dtypes as _dtypes, trace as _trace
from .._core.blob import Blob

K = _C.OpKind

# OneFlow's scope attributes (REGISTER_SCOPE_CONFIG_DEF) and their defaults.
SCOPE_DEFAULTS: Dict[str, Any] = {"ssp_num_stages": -1, "ssp_stage_id": -1, "quantization_aware_training": True,
                                  "checkpointing": False, "pipeline_stage_id_hint": 0}
_scope_stack = [dict(SCOPE_DEFAULTS)]


def scope_attr(name: str) -> Any:
    """The value of scope attribute `name` where the trace stands now."""
    return _scope_stack[-1][name]


class ScopeConfig:
    """The context of flow.experimental.scope.config: the scope attributes
    given are set inside the `with` block."""

    def __init__(self, attrs: Dict[str, Any]):
        self._attrs = attrs

    def __enter__(self) -> "ScopeConfig":
        _scope_stack.append({**_scope_stack[-1], **self._attrs})
        return self

    def __exit__(self, *exc) -> None:
        _scope_stack.pop()


def scope_config(**kwargs: Any) -> ScopeConfig:
    """Checks OneFlow scope attributes (name=value) against their types."""
    attrs = {}
    for name, value in kwargs.items():
        if name not in SCOPE_DEFAULTS:
            raise ValueError(f"experimental.scope.config: unknown scope attribute '{name}'; OneFlow's are "
                             + ", ".join(sorted(SCOPE_DEFAULTS)))
        kind = type(SCOPE_DEFAULTS[name])
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, (bool, int)):
            raise TypeError(f"experimental.scope.config: {name} must be {'True or False' if kind is bool else 'an int'}, "
                            f"got {value!r}")
        attrs[name] = value
    return ScopeConfig(attrs)


def _detached(var: Blob, b) -> Blob:
    """A second read of variable `var` that autodiff does not reach: the
    optimizer differentiates with respect to the variable's own node (the
    one in the builder's table), and this is another node."""
    node = _C.make_node(K.variable, [], {"name": var._node.attr("name"), "shape": list(var.shape),
                                         "dtype": var.dtype.c})
    return b.new_blob(node, None, "ssp_variable_proxy")


def _lagged(var: Blob, buffer_size: int, b, api: str) -> Blob:
    """var's value buffer_size - 1 runs ago, without a gradient; appends the
    assigns that shift the buffer."""
    if buffer_size == 1:
        return _detached(var, b)
    name = var._node.attr("name")
    n = b._counts.get(("ssp", name), 0)
    b._counts[("ssp", name)] = n + 1
    base = f"System-SspVariableProxy-{b.job_name}-{name}" + (f"-{n}" if n else "")
    from .._core.variables import ConstantInitializer
    loc = _trace.user_location()
    shape = tuple(var.shape)
    buf = b.variable(f"{base}-buffer", (buffer_size - 1,) + shape, var.dtype, ConstantInitializer(0), False, 0, loc)
    filled = b.variable(f"{base}-filled", (), _dtypes.int8, ConstantInitializer(0), False, 0, loc)
    now = _detached(var, b)
    full = _ops.broadcast_to(_ops.expand_dims(now, 0), list(buf.shape))
    past = _ops.where(_ops.cast(filled, _dtypes.bool_), buf, full)
    value = _ops.reshape(_array._slice_dim(past, 0, buffer_size - 2, buffer_size - 1, 1, api), list(shape))
    shifted = _ops.expand_dims(now, 0)
    if buffer_size > 2:
        shifted = _array.concat([shifted, _array._slice_dim(past, 0, 0, buffer_size - 2, 1, api)], axis=0)
    _array.assign(buf, shifted)
    _array.assign(filled, _ops.ones([], _dtypes.int8))
    return value


def _buffer_size(buffer_size: Any, api: str) -> int:
    if not _ops._is_int(buffer_size) or buffer_size < 1:
        _trace.fail(ValueError, f"{api}: buffer_size must be an int >= 1, got {buffer_size!r}")
    return int(buffer_size)


def ssp_variable_proxy(var: Blob, buffer_size: int = 1, name: Optional[str] = None) -> Tuple[Blob, Blob]:
    """(ref, value) of variable `var` (see the module docstring): ref is the
    variable, value its state buffer_size - 1 runs before this one, without
    a gradient."""
    api = "experimental.ssp_variable_proxy"
    b = _trace.require_builder(f"flow.{api}")
    if not isinstance(var, Blob) or var._node.op != K.variable:
        _trace.fail(TypeError, f"{api}: var must be a variable (flow.get_variable), got "
                    f"{var._node.op_name if isinstance(var, Blob) else type(var).__name__}")
    k = _buffer_size(buffer_size, api)
    value = _lagged(var, k, b, api)
    return var, _ops.identity(value, name=name) if name else value


def forward_value(var: Blob, b) -> Blob:
    """What the forward pass of an enable_ssp train job computes with in
    place of trainable variable `var`: its lagged value, through which the
    gradient reaches var (value + (var - var), the difference 0 for finite
    values)."""
    api = "function_config.enable_ssp"
    stages, stage = scope_attr("ssp_num_stages"), scope_attr("ssp_stage_id")
    if not 0 <= stage < stages:
        _trace.fail(ValueError, f"{api}: variable '{var.name}' is requested outside a flow.experimental."
                    f"scope.config(ssp_num_stages=S, ssp_stage_id=I) with 0 <= I < S (here S = {stages}, "
                    f"I = {stage})")
    k = stages - stage
    if k == 1:
        return var
    seen = b._counts.setdefault("ssp_values", {})
    name = var._node.attr("name")
    if name not in seen:
        seen[name] = _ops.add(_lagged(var, k, b, api), _ops.subtract(var, _detached(var, b)))
    return seen[name]
