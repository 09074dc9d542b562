"""flow.user_op_builder: OneFlow's generic op builder over flowjit's ops.

    y = (flow.user_op_builder("my_relu").Op("relu").Input("in", [x]).Output("out")
         .Build().InferAndTryRun().RemoteBlobList()[0])

OneFlow builds any registered C++ "user op" by its type name. flowjit has no
such registry: it maps the op types of OneFlow's own Python ops (their
`.Op("...")` names, inputs, outputs and attributes, as in oneflow/python/ops)
onto the flowjit functions that compute the same thing, so a builder chain
traces the same IR as the function would. Attributes are checked against the
op's schema (OneFlow's attribute types). An op type flowjit does not map,
such as the test-only C++ ops of OneFlow's own build (TestSource, ccrelu,
...), raises NotImplementedError naming it.
"""
import numbers
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._core import dtypes as _dtypes
from .._core.blob import Blob

__all__ = ["user_op_builder", "consistent_user_op_builder", "user_op_module_builder",
           "consistent_user_op_module_builder", "find_or_create_module", "user_op_types", "UserOpConfBuilder",
           "UserOpModuleBuilder", "UserOp"]

# OneFlow's attribute type names (the deprecated third argument of Attr).
_TYPE_NAMES = {"AttrTypeInt32": "int", "AttrTypeInt64": "int", "AttrTypeBool": "bool",
               "AttrTypeFloat": "float", "AttrTypeDouble": "float", "AttrTypeString": "str",
               "AttrTypeShape": "shape", "AttrTypeDataType": "dtype", "AttrTypeListInt32": "ints",
               "AttrTypeListInt64": "ints", "AttrTypeListFloat": "floats", "AttrTypeListDataType": "dtypes",
               "AttrTypeListShape": "shapes", "AttrTypeListString": "strs"}

# OneFlow's test-only C++ ops (registered by its own test build only).
_TEST_ONLY_OPS = frozenset((
    "TestSource", "TestSourceMultiGpuFixedOutNum", "TestMultiOutputOrder", "TestMultiInput",
    "TestMultiInputGrad", "TestReshape", "TestReshape4KeepHeaderOnly", "TestReshapeLike4KeepHeaderOnly",
    "TestDynamicSource", "TestRandomSource", "TestDataTypeAttr", "TestListDataTypeAndListShapeAndListStringAttr",
    "ccrelu", "ccrelu_grad", "cpu_only_relu_test", "test_user_op_attr_auto_type", "TestSourceGpu"))


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_attr(kind, v):
    """The attribute value converted for its kind, or None when it does not fit."""
    if kind == "int":
        return int(v) if _is_int(v) else None
    if kind == "bool":
        return v if isinstance(v, bool) else None
    if kind == "float":
        return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else None
    if kind == "str":
        return v if isinstance(v, str) else None
    if kind in ("shape", "ints"):
        if isinstance(v, (list, tuple)) and all(_is_int(x) for x in v):
            return tuple(int(x) for x in v)
        return None
    if kind == "floats":
        if isinstance(v, (list, tuple)) and all(isinstance(x, numbers.Real) and not isinstance(x, bool)
                                                for x in v):
            return tuple(float(x) for x in v)
        return None
    if kind == "strs":
        return tuple(v) if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v) else None
    if kind == "dtype":
        try:
            return _dtypes.to_dtype(v, "attribute")
        except (TypeError, ValueError, NotImplementedError):
            return None
    if kind == "dtypes":
        if not isinstance(v, (list, tuple)):
            return None
        out = [_check_attr("dtype", x) for x in v]
        return None if any(x is None for x in out) else tuple(out)
    if kind == "shapes":
        if not isinstance(v, (list, tuple)):
            return None
        out = [_check_attr("shape", x) for x in v]
        return None if any(x is None for x in out) else tuple(out)
    raise AssertionError(kind)


_KIND_WORDS = {"int": "an int", "bool": "a bool", "float": "a number", "str": "a str",
               "shape": "a shape (list or tuple of ints)", "ints": "a list of ints",
               "floats": "a list of numbers", "strs": "a list of str", "dtype": "a flow dtype",
               "dtypes": "a list of flow dtypes", "shapes": "a list of shapes"}


class _Spec:
    """One op type: its inputs (name -> "one" | "list" | "opt"), outputs,
    attributes (name -> (kind, default)) and the function computing it from
    (inputs, attrs, output counts) to {output name: [blobs]}."""

    __slots__ = ("inputs", "outputs", "attrs", "fn", "doc")

    def __init__(self, inputs, outputs, attrs, fn, doc):
        self.inputs, self.outputs, self.attrs, self.fn, self.doc = inputs, outputs, attrs, fn, doc


_SPECS: Dict[str, _Spec] = {}


def _op(type_name, inputs, outputs, attrs=None, doc=""):
    def register(fn):
        _SPECS[type_name] = _Spec(dict(inputs), tuple(outputs), dict(attrs or {}), fn, doc)
        return fn
    return register


def _flow():
    import flowjit
    return flowjit


# ---------------------------------------------------------------- elementwise

_UNARY_MATH = ("abs acos acosh asin asinh atan atanh ceil cos cosh erf erfc exp expm1 floor lgamma log "
               "log1p log_sigmoid negative reciprocal reciprocal_no_nan rint round rsqrt sign sin sinh "
               "softplus sqrt square tan tanh").split()


def _register_unary(type_name, fn_name):
    @_op(type_name, {"x": "one"}, ["y"], doc=f"flow.math.{fn_name}")
    def _(i, a, n):
        return {"y": [_resolve(f"flow.math.{fn_name}")(i["x"][0])]}


for _name in _UNARY_MATH:
    _register_unary(_name, _name)
_register_unary("sigmoid_v2", "sigmoid")


def _register_in_out(type_name, get, attrs=None, call=None):
    @_op(type_name, {"in": "one"}, ["out"], attrs, doc=get)
    def _(i, a, n):
        fn = _resolve(get)
        return {"out": [call(fn, i["in"][0], a) if call else fn(i["in"][0])]}


def _resolve(path):
    """The flowjit function at "flow.a.b" (NotImplementedError when flowjit lacks it)."""
    obj = _flow()
    for part in path.split(".")[1:]:
        if not hasattr(obj, part):
            raise NotImplementedError(f"user op: {path} is not implemented by flowjit yet")
        obj = getattr(obj, part)
    return obj


_register_in_out("relu", "flow.math.relu")
_register_in_out("sigmoid", "flow.math.sigmoid")
_register_in_out("gelu", "flow.math.gelu")
_register_in_out("softmax", "flow.nn.softmax")
_register_in_out("identity", "flow.identity")
_register_in_out("amp_white_identity", "flow.identity")
_register_in_out("hardsigmoid", "flow.nn.hardsigmoid")
_register_in_out("hardswish", "flow.nn.hardswish")
_register_in_out("elu", "flow.nn.elu", {"alpha": ("float", 1.0)}, lambda f, x, a: f(x, alpha=a["alpha"]))
_register_in_out("hardtanh", "flow.nn.hardtanh", {"min_val": ("float", -1.0), "max_val": ("float", 1.0)},
                 lambda f, x, a: f(x, min_val=a["min_val"], max_val=a["max_val"]))
_register_in_out("cast", "flow.cast", {"dtype": ("dtype", None)}, lambda f, x, a: f(x, a["dtype"]))
_register_in_out("reshape", "flow.reshape", {"shape": ("shape", None)}, lambda f, x, a: f(x, a["shape"]))
_register_in_out("expand_dims", "flow.expand_dims", {"axis": ("int", None)},
                 lambda f, x, a: f(x, a["axis"]))
_register_in_out("squeeze", "flow.squeeze", {"axes": ("ints", None)}, lambda f, x, a: f(x, list(a["axes"])))
_register_in_out("flatten", "flow.flatten", {"start_dim": ("int", 0), "end_dim": ("int", -1)},
                 lambda f, x, a: f(x, a["start_dim"], a["end_dim"]))
_register_in_out("scalar_pow", "flow.math.pow", {"exponent": ("float", None)},
                 lambda f, x, a: f(x, a["exponent"]))
_register_in_out("argmax", "flow.math.argmax")
_register_in_out("tril", "flow.math.tril",
                 {"diagonal": ("int", 0), "is_floating_fill_value": ("bool", False),
                  "floating_fill_value": ("float", 0.0), "integer_fill_value": ("int", 0)},
                 lambda f, x, a: f(x, a["diagonal"], a["floating_fill_value"] if a["is_floating_fill_value"]
                                   else a["integer_fill_value"]))

_SCALAR_ATTRS = {"has_int_operand": ("bool", False), "has_float_operand": ("bool", False),
                 "int_operand": ("int", 0), "float_operand": ("float", 0.0)}


def _scalar_operand(type_name, a):
    if a["has_int_operand"] == a["has_float_operand"]:
        raise ValueError(f"user op {type_name}: exactly one of has_int_operand and has_float_operand must "
                         f"be True, got {a['has_int_operand']} and {a['has_float_operand']}")
    return a["int_operand"] if a["has_int_operand"] else a["float_operand"]


_register_in_out("scalar_add", "flow.math.add", _SCALAR_ATTRS,
                 lambda f, x, a: f(x, _scalar_operand("scalar_add", a)))
_register_in_out("scalar_mul", "flow.math.multiply", _SCALAR_ATTRS,
                 lambda f, x, a: f(x, _scalar_operand("scalar_mul", a)))


def _register_binary(type_name, fn_name, ins=("x", "y"), out="z"):
    @_op(type_name, {ins[0]: "one", ins[1]: "one"}, [out], doc=f"flow.math.{fn_name}")
    def _(i, a, n):
        return {out: [_resolve(f"flow.math.{fn_name}")(i[ins[0]][0], i[ins[1]][0])]}


for _name, _fn in (("broadcast_add", "add"), ("broadcast_sub", "subtract"), ("broadcast_mul", "multiply"),
                   ("broadcast_div", "divide"), ("broadcast_floor_mod", "mod"), ("broadcast_equal", "equal"),
                   ("broadcast_not_equal", "not_equal"), ("broadcast_less", "less"),
                   ("broadcast_less_equal", "less_equal"), ("broadcast_greater", "greater"),
                   ("broadcast_greater_equal", "greater_equal"), ("broadcast_logical_and", "logical_and"),
                   ("broadcast_minimum", "minimum"), ("broadcast_maximum", "maximum"),
                   ("elementwise_minimum", "minimum"), ("elementwise_maximum", "maximum"),
                   ("pow", "pow"), ("floordiv", "floordiv"), ("xdivy", "xdivy"), ("xlogy", "xlogy")):
    _register_binary(_name, _fn)
_register_binary("multiply", "multiply", out="out")
for _name, _fn in (("scalar_add_by_tensor", "add"), ("scalar_sub_by_tensor", "subtract"),
                   ("scalar_mul_by_tensor", "multiply"), ("scalar_div_by_tensor", "divide")):
    _register_binary(_name, _fn, ins=("x", "scalar"), out="y")


@_op("leaky_relu", {"x": "one"}, ["y"], {"alpha": ("float", None)}, doc="flow.nn.leaky_relu")
def _leaky_relu(i, a, n):
    return {"y": [_flow().nn.leaky_relu(i["x"][0], alpha=a["alpha"])]}


@_op("clip_by_scalar", {"x": "one"}, ["y"],
     {"floating_min": ("float", 0.0), "integral_min": ("int", 0), "floating_max": ("float", 0.0),
      "integral_max": ("int", 0)}, doc="flow.math.clip_by_value")
def _clip(i, a, n):
    x = i["x"][0]
    f = x.dtype in _dtypes.FLOATS
    lo = a["floating_min"] if f else a["integral_min"]
    hi = a["floating_max"] if f else a["integral_max"]
    return {"y": [_flow().math.clip_by_value(x, lo, hi)]}


@_op("clip_by_scalar_min", {"x": "one"}, ["y"], {"floating_min": ("float", 0.0), "integral_min": ("int", 0)},
     doc="flow.math.clip_by_value")
def _clip_min(i, a, n):
    x = i["x"][0]
    f = x.dtype in _dtypes.FLOATS
    return {"y": [_flow().math.clip_by_value(x, min_value=a["floating_min"] if f else a["integral_min"])]}


@_op("clip_by_scalar_max", {"x": "one"}, ["y"], {"floating_max": ("float", 0.0), "integral_max": ("int", 0)},
     doc="flow.math.clip_by_value")
def _clip_max(i, a, n):
    x = i["x"][0]
    f = x.dtype in _dtypes.FLOATS
    return {"y": [_flow().math.clip_by_value(x, max_value=a["floating_max"] if f else a["integral_max"])]}


@_op("where", {"condition": "one", "x": "one", "y": "one"}, ["out"], doc="flow.where")
def _where(i, a, n):
    return {"out": [_flow().where(i["condition"][0], i["x"][0], i["y"][0])]}


# ---------------------------------------------------------------- shapes, lists, linear algebra

@_op("transpose", {"input": "one"}, ["output"], {"perm": ("ints", None)}, doc="flow.transpose")
def _transpose(i, a, n):
    return {"output": [_flow().transpose(i["input"][0], perm=list(a["perm"]))]}


@_op("reshape_like", {"in": "one", "like": "one"}, ["out"], doc="flow.reshape_like")
def _reshape_like(i, a, n):
    return {"out": [_flow().reshape_like(i["in"][0], i["like"][0])]}


@_op("broadcast_like", {"x": "one", "like": "one"}, ["y"], {"broadcast_axes": ("ints", ())},
     doc="flow.broadcast_like")
def _broadcast_like(i, a, n):
    axes = list(a["broadcast_axes"]) or None
    return {"y": [_flow().broadcast_like(i["x"][0], i["like"][0], broadcast_axes=axes)]}


@_op("add_n", {"in": "list"}, ["out"], doc="flow.math.add_n")
def _add_n(i, a, n):
    return {"out": [_flow().math.add_n(i["in"])]}


@_op("concat", {"in": "list"}, ["out"], {"axis": ("int", 0), "max_dim_size": ("int", 0)}, doc="flow.concat")
def _concat(i, a, n):
    return {"out": [_flow().concat(i["in"], axis=a["axis"])]}


_MATMUL_ATTRS = {"transpose_a": ("bool", False), "transpose_b": ("bool", False), "alpha": ("float", 1.0)}


def _register_matmul(type_name):
    @_op(type_name, {"a": "one", "b": "one"}, ["out"], _MATMUL_ATTRS, doc="flow.matmul")
    def _(i, a, n):
        return {"out": [_flow().matmul(i["a"][0], i["b"][0], transpose_a=a["transpose_a"],
                                       transpose_b=a["transpose_b"], alpha=a["alpha"])]}


for _name in ("matmul", "batch_matmul", "broadcast_matmul"):
    _register_matmul(_name)


@_op("gather", {"in": "one", "indices": "one"}, ["out"], {"axis": ("int", 0)}, doc="flow.gather")
def _gather(i, a, n):
    return {"out": [_flow().gather(i["in"][0], i["indices"][0], axis=a["axis"])]}


@_op("reduce_sum", {"input_tensor": "one"}, ["output_tensor"], {"axis": ("ints", None), "keepdims": ("bool", False)},
     doc="flow.math.reduce_sum")
def _reduce_sum(i, a, n):
    axis = list(a["axis"]) or None
    return {"output_tensor": [_flow().math.reduce_sum(i["input_tensor"][0], axis=axis, keepdims=a["keepdims"])]}


@_op("reduce_sum_like", {"x": "one", "like": "one"}, ["y"], {"axis": ("ints", None)},
     doc="flow.math.reduce_sum then flow.reshape_like")
def _reduce_sum_like(i, a, n):
    x, like = i["x"][0], i["like"][0]
    axis = list(a["axis"])
    y = _flow().math.reduce_sum(x, axis=axis) if axis else x
    return {"y": [_flow().reshape_like(y, like)]}


@_op("split_like", {"in": "one", "like": "list"}, ["out"], {"axis": ("int", None)}, doc="flow.slice")
def _split_like(i, a, n):
    x, likes = i["in"][0], i["like"]
    axis = a["axis"] + len(x.shape) if a["axis"] < 0 else a["axis"]
    if not 0 <= axis < len(x.shape):
        raise ValueError(f"user op split_like: axis {a['axis']} is out of range for input of shape "
                         f"{tuple(x.shape)}")
    sizes = [like.shape[axis] if len(like.shape) > axis else None for like in likes]
    if None in sizes or sum(sizes) != x.shape[axis]:
        raise ValueError(f"user op split_like: the likes' sizes along axis {axis} "
                         f"({[tuple(like.shape) for like in likes]}) must add up to the input's "
                         f"{x.shape[axis]} (input shape {tuple(x.shape)})")
    if n["out"] != len(likes):
        raise ValueError(f"user op split_like: Output('out', {n['out']}) but {len(likes)} likes were given")
    outs, start = [], 0
    for s in sizes:
        begin = [0] * len(x.shape)
        begin[axis] = start
        size = list(x.shape)
        size[axis] = s
        outs.append(_flow().slice(x, begin, size))
        start += s
    return {"out": outs}


# ---------------------------------------------------------------- numerics, loss scaling

def _count_not_finite(x):
    flow = _flow()
    big = 1.7976931348623157e308 if x.dtype == _dtypes.float64 else 3.4028234663852886e38
    bad = flow.math.logical_not(flow.math.less_equal(flow.math.abs(x), big))
    return flow.math.reduce_sum(flow.cast(flow.reshape(bad, (-1,)), _dtypes.int64), axis=[0], keepdims=True)


@_op("count_not_finite", {"x": "one"}, ["y"], doc="(|x| <= max) counted")
def _count(i, a, n):
    return {"y": [_count_not_finite(i["x"][0])]}


@_op("multi_count_not_finite", {"x": "list"}, ["y"], doc="(|x| <= max) counted")
def _multi_count(i, a, n):
    return {"y": [_flow().math.add_n([_count_not_finite(x) for x in i["x"]])
                  if len(i["x"]) > 1 else _count_not_finite(i["x"][0])]}


@_op("multi_square_sum", {"x": "list"}, ["y"], doc="sum of flow.math.reduce_sum(x * x)")
def _multi_square_sum(i, a, n):
    flow = _flow()
    parts = [flow.math.reduce_sum(flow.math.square(flow.reshape(x, (-1,))), axis=[0], keepdims=True)
             for x in i["x"]]
    return {"y": [flow.math.add_n(parts) if len(parts) > 1 else parts[0]]}


@_op("fused_cast_scale", {"x": "one", "scale_by_tensor": "one"}, ["y"], {"scale": ("float", 1.0)},
     doc="flow.cast then two products")
def _fused_cast_scale(i, a, n):
    flow = _flow()
    s = i["scale_by_tensor"][0]
    y = flow.math.multiply(flow.cast(i["x"][0], s.dtype), flow.reshape(s, ()))
    return {"y": [flow.math.multiply(y, a["scale"]) if a["scale"] != 1.0 else y]}


@_op("dynamic_loss_scale_schedule",
     {"count_not_finite": "one", "loss_scale": "one", "good_step_counter": "one"}, [],
     {"increment_period": ("int", None), "multiplier": ("float", None)}, doc="flow.assign")
def _dynamic_loss_scale_schedule(i, a, n):
    """OneFlow's rule: no inf/nan counted -> one more good step, and after
    increment_period good steps the scale grows by multiplier (at most the
    largest float32) and the count restarts; otherwise the count restarts and
    the scale shrinks by multiplier (not below 1). Both variables are
    assigned in place."""
    flow = _flow()
    count, scale, good = i["count_not_finite"][0], i["loss_scale"][0], i["good_step_counter"][0]
    finite = flow.math.equal(count, 0)
    good1 = flow.math.add(good, 1)
    due = flow.math.greater_equal(good1, a["increment_period"])
    s = flow.cast(scale, _dtypes.float64)
    grown = flow.math.minimum(flow.math.multiply(s, a["multiplier"]), 3.4028234663852886e38)
    shrunk = flow.math.maximum(flow.math.divide(s, a["multiplier"]), 1.0)
    new_scale = flow.where(finite, flow.where(due, grown, s), shrunk)
    zero = flow.math.multiply(good, 0)
    new_good = flow.where(finite, flow.where(due, zero, good1), zero)
    flow.assign(scale, flow.cast(new_scale, scale.dtype))
    flow.assign(good, new_good)
    return {}


# ---------------------------------------------------------------- the builder

class UserOp:
    """A built user op; InferAndTryRun() traces it into the job."""

    def __init__(self, name: str, type_name: str, spec: _Spec, inputs: Dict[str, List[Blob]],
                 outputs: Dict[str, int], attrs: Dict[str, Any]) -> None:
        self.op_name, self.op_type_name = name, type_name
        self._spec, self._inputs, self._outputs, self._attrs = spec, inputs, outputs, attrs
        self._results: Optional[Dict[str, List[Blob]]] = None

    def InferAndTryRun(self) -> "UserOp":  # noqa: N802 - OneFlow's name
        """Traces the op into the job being built (once). Its output blobs
        are named after the op (within the current flow.scope.namespace)."""
        if self._results is None:
            from .._core import trace as _trace
            from .. import scope
            _trace.require_builder(f"user op '{self.op_name}' ({self.op_type_name})")
            res = self._spec.fn(self._inputs, self._attrs, self._outputs)
            for k, blobs in res.items():
                if k in self._outputs and len(blobs) != self._outputs[k]:
                    raise ValueError(f"user op '{self.op_name}' ({self.op_type_name}): Output({k!r}, "
                                     f"{self._outputs[k]}) but the op makes {len(blobs)}")
                for b in blobs:
                    if not any(b is x for xs in self._inputs.values() for x in xs):
                        b._name = scope.namespace_prefix() + self.op_name
            self._results = res
        return self

    def _need_run(self):
        if self._results is None:
            raise RuntimeError(f"user op '{self.op_name}' ({self.op_type_name}): call InferAndTryRun() "
                               "before asking for its outputs")
        return self._results

    def RemoteBlobList(self) -> Tuple[Blob, ...]:  # noqa: N802
        """The outputs, in the order their Output() calls were made."""
        res = self._need_run()
        return tuple(b for k in self._outputs for b in res[k])

    def RemoteBlobDict(self) -> Dict[str, List[Blob]]:  # noqa: N802
        """{output name: [blobs]}."""
        res = self._need_run()
        return {k: list(res[k]) for k in self._outputs}

    def SoleOutputBlob(self) -> Blob:  # noqa: N802
        """The one output (ValueError when there is not exactly one)."""
        blobs = self.RemoteBlobList()
        if len(blobs) != 1:
            raise ValueError(f"user op '{self.op_name}' ({self.op_type_name}) has {len(blobs)} outputs, "
                             "not one; use RemoteBlobList()")
        return blobs[0]


class UserOpConfBuilder:
    """OneFlow's UserOpConfBuilder: Op(type), Input(name, blobs),
    Output(name, num), Attr(name, value), Build()."""

    def __init__(self, op_name: Optional[str], api: str = "user_op_builder") -> None:
        if op_name is not None and not isinstance(op_name, str):
            raise TypeError(f"flow.{api}: the op name must be a str, got {op_name!r}")
        self._name, self._api = op_name or "UserOp", api
        self._type: Optional[str] = None
        self._spec: Optional[_Spec] = None
        self._inputs: Dict[str, List[Blob]] = {}
        self._input_sizes: Dict[str, int] = {}
        self._outputs: Dict[str, int] = {}
        self._attrs: Dict[str, Any] = {}

    def _where(self):
        return f"flow.{self._api}({self._name!r})" + (f".Op({self._type!r})" if self._type else "")

    def OpName(self, op_name: str) -> "UserOpConfBuilder":  # noqa: N802
        """Renames the op."""
        if not isinstance(op_name, str):
            raise TypeError(f"{self._where()}.OpName: expected a str, got {op_name!r}")
        self._name = op_name
        return self

    def Op(self, op_type_name: str) -> "UserOpConfBuilder":  # noqa: N802
        """Chooses the op type (one of OneFlow's user op type names)."""
        if not isinstance(op_type_name, str):
            raise TypeError(f"{self._where()}.Op: the op type must be a str, got {op_type_name!r}")
        spec = _SPECS.get(op_type_name)
        if spec is None:
            if op_type_name in _TEST_ONLY_OPS:
                raise NotImplementedError(
                    f"{self._where()}.Op({op_type_name!r}): '{op_type_name}' is a test-only C++ op of "
                    "OneFlow's own build (registered by its test kernels), not part of OneFlow's API; "
                    "flowjit has no such op")
            raise NotImplementedError(
                f"{self._where()}.Op({op_type_name!r}): flowjit does not map the OneFlow op type "
                f"'{op_type_name}'. It maps {len(_SPECS)} types of OneFlow's Python ops "
                "(flow.user_op_types() lists them); for other ops call the flowjit function "
                "(flow.math.*, flow.nn.*, flow.layers.*), whose OneFlow counterpart in "
                "oneflow/python/ops/*.py names the op type it builds")
        self._type, self._spec = op_type_name, spec
        return self

    def _need_op(self, what):
        if self._spec is None:
            raise ValueError(f"{self._where()}.{what}: call .Op(type_name) first")
        return self._spec

    def Input(self, input_name: str, input_blob_list: Sequence[Blob]) -> "UserOpConfBuilder":  # noqa: N802
        """Gives the op's input `input_name` (a list of blobs)."""
        spec = self._need_op("Input")
        if input_name not in spec.inputs:
            raise ValueError(f"{self._where()}.Input({input_name!r}): op '{self._type}' has inputs "
                             f"{', '.join(spec.inputs) or '(none)'}")
        if isinstance(input_blob_list, Blob) or not isinstance(input_blob_list, (list, tuple)):
            raise TypeError(f"{self._where()}.Input({input_name!r}): expected a list of blobs, got "
                            f"{type(input_blob_list).__name__}")
        for b in input_blob_list:
            if not isinstance(b, Blob):
                raise TypeError(f"{self._where()}.Input({input_name!r}): expected blobs, got "
                                f"{type(b).__name__}")
        if spec.inputs[input_name] != "list" and len(input_blob_list) != 1:
            raise ValueError(f"{self._where()}.Input({input_name!r}): takes one blob, got "
                             f"{len(input_blob_list)}")
        if not input_blob_list:
            raise ValueError(f"{self._where()}.Input({input_name!r}): needs at least one blob")
        self._inputs[input_name] = list(input_blob_list)
        return self

    def InputSize(self, input_name: str, input_blob_size: int) -> "UserOpConfBuilder":  # noqa: N802
        """Declares how many blobs input `input_name` will take (an op
        module's blobs come with each call's Input)."""
        spec = self._need_op("InputSize")
        if input_name not in spec.inputs:
            raise ValueError(f"{self._where()}.InputSize({input_name!r}): op '{self._type}' has inputs "
                             f"{', '.join(spec.inputs) or '(none)'}")
        if not _is_int(input_blob_size) or input_blob_size < 1:
            raise ValueError(f"{self._where()}.InputSize({input_name!r}, n): n must be a positive int, got "
                             f"{input_blob_size!r}")
        self._input_sizes[input_name] = int(input_blob_size)
        return self

    def Output(self, output_name: str, num: int = 1) -> "UserOpConfBuilder":  # noqa: N802
        """Asks for `num` blobs of output `output_name`."""
        spec = self._need_op("Output")
        if output_name not in spec.outputs:
            raise ValueError(f"{self._where()}.Output({output_name!r}): op '{self._type}' has outputs "
                             f"{', '.join(spec.outputs) or '(none)'}")
        if not _is_int(num) or num < 1:
            raise ValueError(f"{self._where()}.Output({output_name!r}, num): num must be a positive int, "
                             f"got {num!r}")
        self._outputs[output_name] = int(num)
        return self

    def Attr(self, attr_name: str, attr_value: Any,  # noqa: N802
             attr_type_name: Optional[str] = None) -> "UserOpConfBuilder":
        """Sets an attribute; its type comes from the op's schema (the
        third argument, OneFlow's deprecated type name, is checked against
        it when given)."""
        spec = self._need_op("Attr")
        if attr_name not in spec.attrs:
            raise ValueError(f"{self._where()}.Attr({attr_name!r}): op '{self._type}' has attributes "
                             f"{', '.join(spec.attrs) or '(none)'}")
        kind = spec.attrs[attr_name][0]
        if attr_type_name is not None and _TYPE_NAMES.get(attr_type_name) != kind:
            raise TypeError(f"{self._where()}.Attr({attr_name!r}, ..., {attr_type_name!r}): the attribute "
                            f"is {_KIND_WORDS[kind]}")
        v = _check_attr(kind, attr_value)
        if v is None:
            raise TypeError(f"{self._where()}.Attr({attr_name!r}): expected {_KIND_WORDS[kind]}, got "
                            f"{attr_value!r}")
        self._attrs[attr_name] = v
        return self

    def Build(self) -> UserOp:  # noqa: N802
        """Checks that every input and required attribute is given."""
        spec = self._need_op("Build")
        missing = [k for k, how in spec.inputs.items() if how != "opt" and k not in self._inputs]
        if missing:
            raise ValueError(f"{self._where()}.Build: input {missing[0]!r} is not given (Input(name, blobs))")
        for k, size in self._input_sizes.items():
            if len(self._inputs[k]) != size:
                raise ValueError(f"{self._where()}.Build: InputSize({k!r}, {size}) but Input({k!r}) got "
                                 f"{len(self._inputs[k])} blobs")
        attrs = {}
        for k, (kind, default) in spec.attrs.items():
            if k in self._attrs:
                attrs[k] = self._attrs[k]
            elif default is None:
                raise ValueError(f"{self._where()}.Build: attribute {k!r} ({_KIND_WORDS[kind]}) is required")
            else:
                attrs[k] = default
        return UserOp(self._name, self._type, spec, dict(self._inputs), dict(self._outputs), attrs)


def user_op_builder(op_name: str) -> UserOpConfBuilder:
    """OneFlow's flow.user_op_builder(name): builds one of the OneFlow op
    types flowjit maps (flow.user_op_types()) in the job being traced.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     op = flow.user_op_builder("my_relu").Op("relu").Input("in", [x]).Output("out").Build()
        ...     return op.InferAndTryRun().SoleOutputBlob()
        >>> job(np.float32([-1, 0, 2])).tolist()
        [0.0, 0.0, 2.0]
    """
    return UserOpConfBuilder(op_name)


def consistent_user_op_builder(op_name: str) -> UserOpConfBuilder:
    """As user_op_builder (flowjit's ops have one meaning in either view).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     op = flow.consistent_user_op_builder("my_relu").Op("relu").Input("in", [x]).Output("out").Build()
        ...     return op.InferAndTryRun().SoleOutputBlob()
        >>> job(np.float32([-1, 0, 2])).tolist()
        [0.0, 0.0, 2.0]
    """
    return UserOpConfBuilder(op_name, "consistent_user_op_builder")


class UserOpModule:
    """A lazy-mode op module's kernel state: OneFlow keeps none in lazy mode."""

    def __init__(self) -> None:
        self.opkernel_object = None

    def InitOpKernel(self) -> None:  # noqa: N802 - OneFlow's name
        """Lazy mode: the op has no kernel object to create (as OneFlow's
        LazyUserOpModule)."""
        self.opkernel_object = None


class UserOpModuleBuilder(UserOpConfBuilder):
    """A builder whose op type is fixed, reused by a flow.deprecated.nn.Module
    for each of its calls: OpName(...).Input(...).Build().InferAndTryRun()."""

    def __init__(self, op_type_name: str, api: str) -> None:
        super().__init__(op_type_name, api)
        super().Op(op_type_name)
        self._module = UserOpModule()

    @property
    def user_op_module(self) -> UserOpModule:
        """The module's kernel state (InitOpKernel())."""
        return self._module

    def Op(self, op_type_name: str) -> "UserOpConfBuilder":  # noqa: N802
        """An op module's type is fixed when it is made."""
        raise ValueError(f"{self._where()}: a user op module builder cannot change its op type "
                         f"(.Op({op_type_name!r}))")


def user_op_module_builder(op_type_name: str) -> UserOpModuleBuilder:
    """OneFlow's op module builder, lazy mode: a reusable builder of one op type.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,)), y: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     builder = flow.user_op_module_builder("add_n")
        ...     builder.InputSize("in", 2).Output("out")
        ...     builder.user_op_module.InitOpKernel()
        ...     op = builder.OpName("add").Input("in", [x, y]).Build()
        ...     return op.InferAndTryRun().SoleOutputBlob()
        >>> job(np.float32([1, 2]), np.float32([10, 20])).tolist()
        [11.0, 22.0]
    """
    return UserOpModuleBuilder(op_type_name, "user_op_module_builder")


def consistent_user_op_module_builder(op_type_name: str) -> UserOpModuleBuilder:
    """As user_op_module_builder (flowjit's ops have one meaning in either view).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,)), y: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     builder = flow.consistent_user_op_module_builder("add_n")
        ...     builder.InputSize("in", 2).Output("out")
        ...     builder.user_op_module.InitOpKernel()
        ...     op = builder.OpName("add").Input("in", [x, y]).Build()
        ...     return op.InferAndTryRun().SoleOutputBlob()
        >>> job(np.float32([1, 2]), np.float32([10, 20])).tolist()
        [11.0, 22.0]
    """
    return UserOpModuleBuilder(op_type_name, "consistent_user_op_module_builder")


def find_or_create_module(module_name: str, create: Any, reuse: bool = False) -> Any:
    """The job's module named `module_name` (within the current namespace),
    made by `create()` the first time; asking twice for one name needs
    reuse=True (OneFlow's flow.find_or_create_module).

    Example:
        >>> class Scale(flow.deprecated.nn.Module):
        ...     def forward(self, x):
        ...         return x * 10
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     scale = flow.find_or_create_module("scale", Scale)
        ...     again = flow.find_or_create_module("scale", Scale, reuse=True)   # the same module
        ...     return again(scale(x))
        >>> job(np.float32([1, 2])).tolist()
        [100.0, 200.0]
    """
    from .._core import trace as _trace
    from .. import deprecated, scope
    b = _trace.require_builder("flow.find_or_create_module")
    if not isinstance(module_name, str) or not module_name:
        raise TypeError(f"flow.find_or_create_module: module_name must be a non-empty str, got {module_name!r}")
    if not callable(create):
        raise TypeError(f"flow.find_or_create_module: create must be callable, got {create!r}")
    modules = b.__dict__.setdefault("_user_op_modules", {})
    key = scope.namespace_prefix() + module_name
    if key in modules:
        if not reuse:
            raise ValueError(f"flow.find_or_create_module: module '{key}' already exists in job "
                             f"'{b.job_name}'; pass reuse=True to use it again")
        return modules[key]
    module = create()
    if not isinstance(module, deprecated.nn.Module):
        raise TypeError(f"flow.find_or_create_module: create() must return a flow.deprecated.nn.Module, got "
                        f"{type(module).__name__}")
    modules[key] = module
    return module


def user_op_types() -> List[str]:
    """The OneFlow op type names user_op_builder maps, sorted.

    Example:
        >>> "relu" in flow.user_op_types(), "matmul" in flow.user_op_types()
        (True, True)
    """
    return sorted(_SPECS)

