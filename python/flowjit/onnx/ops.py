"""flowjit IR ops as ONNX nodes: one rule per op kind (flowjit.onnx).

A rule gets the emitting context, the flowjit node and the ONNX names of its
operands, and returns the ONNX name of its result. Rules write ONNX's
standard domain at the context's opset (17 or newer); where ONNX's op differs
from flowjit's (clamped gathers, erfc, rsqrt, sliding
windows, interior padding) the rule composes standard ops so that the model
computes what flowjit computes."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .. import _C

K = _C.OpKind
D = _C.DType

_INT64_MIN = np.iinfo(np.int64).min


class Context:
    """The ONNX graph being written: its nodes, initializers and names."""

    def __init__(self, onnx: Any, opset: int, job_name: str):
        self.onnx = onnx
        self.opset = opset
        self.job_name = job_name
        self.nodes: List[Any] = []
        self.initializers: List[Any] = []
        self._used: set = set()
        self._consts: Dict[tuple, str] = {}

    # ---- names

    def name(self, hint: str) -> str:
        """A name no other value has, `hint` itself when it is free."""
        base = "".join(c if c.isalnum() or c in "-_./:" else "_" for c in hint) or "v"
        name, k = base, 0
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

    # ---- values

    def tensor(self, name: str, array: np.ndarray) -> Any:
        """A TensorProto of `array` (any flowjit dtype, bfloat16 included)."""
        t = self.onnx.TensorProto()
        t.name = name
        t.data_type = ONNX_DTYPES[_C.dtype_from_numpy(array.dtype)]
        t.dims.extend(int(d) for d in array.shape)
        t.raw_data = np.ascontiguousarray(array).tobytes()  # little-endian, as ONNX stores it
        return t

    def initializer(self, hint: str, array: np.ndarray) -> str:
        name = self.name(hint)
        self.initializers.append(self.tensor(name, array))
        return name

    def const(self, values: Any, dtype: Any = np.int64) -> str:
        """A constant (shapes, axes, scalars), one initializer per value."""
        a = np.asarray(values, dtype=dtype)
        key = (a.dtype.str, a.shape, a.tobytes())
        if key not in self._consts:
            self._consts[key] = self.initializer("const", a)
        return self._consts[key]

    def scalar(self, value: Any, dtype: Any) -> str:
        """A rank-0 constant of flowjit dtype `dtype`; a float for an
        integer dtype converts as flowjit's casts do (toward zero, saturated,
        NaN to 0)."""
        npd = _C.numpy_dtype(dtype)
        if np.issubdtype(npd, np.integer) and isinstance(value, float):
            info = np.iinfo(npd)
            value = (0 if value != value else info.min if value <= info.min
                     else info.max if value >= info.max else int(value))
        return self.const(value, npd)

    def op(self, op_type: str, inputs: Sequence[str], hint: Optional[str] = None, **attrs: Any) -> str:
        """Appends one ONNX node; returns the name of its (one) output."""
        out = self.name(hint or op_type.lower())
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def axes_op(self, op_type: str, x: str, axes: Sequence[int], since: int, **attrs: Any) -> str:
        """A reduction whose axes became an input at opset `since`."""
        if self.opset >= since:
            return self.op(op_type, [x, self.const(list(axes))], **attrs)
        return self.op(op_type, [x], axes=list(axes), **attrs)

    def unsupported(self, node: Any, why: str) -> NotImplementedError:
        return NotImplementedError(f"flowjit.onnx.export: job '{self.job_name}': op '{node.op_name}' "
                                   f"({node.dtype.name}{list(node.shape)}) {why}")


ONNX_DTYPES: Dict[Any, int] = {}


def _init_dtypes(onnx: Any) -> None:
    if not ONNX_DTYPES:
        P = onnx.TensorProto
        ONNX_DTYPES.update({D.bool: P.BOOL, D.int8: P.INT8, D.uint8: P.UINT8, D.int32: P.INT32,
                            D.int64: P.INT64, D.float32: P.FLOAT, D.float64: P.DOUBLE,
                            D.float16: P.FLOAT16, D.bfloat16: P.BFLOAT16})


_FLOATS = (D.float32, D.float64, D.float16, D.bfloat16)


def _attr(node: Any, key: str, default: Any = None) -> Any:
    v = node.attr(key)
    return default if v is None else v


def _spatial(node: Any, key: str, n: int, fill: int) -> List[int]:
    v = node.attr(key)
    return [fill] * n if v is None else list(v)


# ---------------------------------------------------------------- the rules

Rule = Callable[[Context, Any, List[str]], str]
RULES: Dict[Any, Rule] = {}


def rule(*kinds: Any) -> Callable[[Rule], Rule]:
    def add(fn: Rule) -> Rule:
        for k in kinds:
            RULES[k] = fn
        return fn
    return add


def _same(onnx_op: str) -> Rule:
    return lambda c, n, x: c.op(onnx_op, x)


for _k, _o in [(K.abs, "Abs"), (K.sign, "Sign"), (K.exp, "Exp"), (K.log, "Log"),
               (K.sqrt, "Sqrt"), (K.reciprocal, "Reciprocal"), (K.tanh, "Tanh"), (K.sigmoid, "Sigmoid"),
               (K.sin, "Sin"), (K.cos, "Cos"), (K.erf, "Erf"), (K.logical_not, "Not"),
               (K.add, "Add"), (K.sub, "Sub"), (K.mul, "Mul"), (K.div, "Div"), (K.pow, "Pow"),
               (K.maximum, "Max"), (K.minimum, "Min"), (K.equal, "Equal"), (K.less, "Less"),
               (K.less_equal, "LessOrEqual"), (K.greater, "Greater"),
               (K.greater_equal, "GreaterOrEqual"), (K.logical_and, "And"), (K.logical_or, "Or"),
               (K.where, "Where")]:
    RULES[_k] = _same(_o)


@rule(K.identity, K.check_index, K.check_finite)
def _identity(c, n, x):
    # ONNX has no run-time check: the value passes unchanged (a gather clamps).
    return x[0]


@rule(K.floor, K.ceil, K.round)
def _rounding(c, n, x):
    if n.dtype not in _FLOATS:
        return x[0]
    return c.op({K.floor: "Floor", K.ceil: "Ceil", K.round: "Round"}[n.op], x)  # Round: half to even


@rule(K.relu)
def _relu(c, n, x):
    return x[0] if n.dtype in (D.uint8, D.bool) else c.op("Relu", x)


@rule(K.neg)
def _neg(c, n, x):
    if n.dtype == D.uint8:  # ONNX negates signed numbers only: 0 - x wraps as flowjit's
        return c.op("Sub", [c.scalar(0, n.dtype), x[0]])
    return c.op("Neg", x)


@rule(K.rsqrt)
def _rsqrt(c, n, x):
    return c.op("Reciprocal", [c.op("Sqrt", x)])


@rule(K.square)
def _square(c, n, x):
    return c.op("Mul", [x[0], x[0]])


@rule(K.erfc)
def _erfc(c, n, x):
    return c.op("Sub", [c.scalar(1.0, n.dtype), c.op("Erf", x)])


@rule(K.not_equal)
def _not_equal(c, n, x):
    return c.op("Not", [c.op("Equal", x)])


@rule(K.cast)
def _cast(c, n, x):
    return c.op("Cast", x, to=ONNX_DTYPES[n.dtype])


# ---- sources

@rule(K.fill)
def _fill(c, n, x):
    shape = list(n.shape)
    value = c.scalar(n.attr("value"), n.dtype)
    if not shape:
        return value
    return c.op("Expand", [value, c.const(shape)])


@rule(K.iota)
def _iota(c, n, x):
    shape, axis = list(n.shape), n.attr("axis")
    line = [1] * len(shape)
    line[axis] = shape[axis]
    arange = np.arange(shape[axis]).astype(_C.numpy_dtype(n.dtype)).reshape(line)
    value = c.initializer("iota", arange)
    return value if line == shape else c.op("Expand", [value, c.const(shape)])


@rule(K.random_uniform, K.random_uniform_at, K.random_normal)
def _random(c, n, x):
    # The distribution, not flowjit's counter-based numbers.
    if n.dtype not in _FLOATS:
        raise c.unsupported(n, "draws integers; ONNX's random ops draw floats")
    kind = "RandomNormal" if n.op == K.random_normal else "RandomUniform"
    return c.op(kind, [], dtype=ONNX_DTYPES[n.dtype], shape=list(n.shape), seed=float(_attr(n, "seed", 0)))


# ---- reductions

@rule(K.reduce_sum, K.reduce_max, K.reduce_min, K.reduce_prod)
def _reduce(c, n, x):
    axes = list(n.attr("axes"))
    if not axes:
        return x[0]
    keep = int(bool(_attr(n, "keepdims", False)))
    op_type, since = {K.reduce_sum: ("ReduceSum", 13), K.reduce_max: ("ReduceMax", 18),
                      K.reduce_min: ("ReduceMin", 18), K.reduce_prod: ("ReduceProd", 18)}[n.op]
    if n.op in (K.reduce_sum, K.reduce_prod) and n.dtype in (D.int8, D.uint8):
        # ONNX sums and multiplies no 8-bit integers: in int32, wrapped back.
        wide = c.op("Cast", x, to=ONNX_DTYPES[D.int32])
        r = c.axes_op(op_type, wide, axes, since, keepdims=keep)
        return c.op("Cast", [r], to=ONNX_DTYPES[n.dtype])
    return c.axes_op(op_type, x[0], axes, since, keepdims=keep)


@rule(K.argmax, K.argmin)
def _arg(c, n, x):
    (axis,) = n.attr("axes")  # one axis (the factory's rule)
    op_type = "ArgMax" if n.op == K.argmax else "ArgMin"
    out = c.op(op_type, x, axis=axis, keepdims=int(bool(_attr(n, "keepdims", False))))  # the first extremum
    return out if n.dtype == D.int64 else c.op("Cast", [out], to=ONNX_DTYPES[n.dtype])


# ---- views

@rule(K.reshape)
def _reshape(c, n, x):
    shape = list(n.shape)
    attrs = {"allowzero": 1} if 0 in shape else {}
    return c.op("Reshape", [x[0], c.const(shape)], **attrs)


@rule(K.transpose)
def _transpose(c, n, x):
    return c.op("Transpose", x, perm=list(n.attr("perm")))


@rule(K.broadcast)
def _broadcast(c, n, x):
    return c.op("Expand", [x[0], c.const(list(n.shape))])


def _pad_value(c, node, dtype):
    return c.scalar(_attr(node, "pad_value", 0), dtype)  # an int stays exact for an integer x


@rule(K.pad)
def _pad(c, n, x, shapes=None):
    shape = list(shapes[0])
    rank = len(shape)
    lo = _spatial(n, "pads_lo", rank, 0)
    hi = _spatial(n, "pads_hi", rank, 0)
    interior = _spatial(n, "interior", rank, 0)
    value = _pad_value(c, n, n.dtype)
    v = x[0]
    for d in range(rank):
        p = interior[d]
        if p <= 0 or shape[d] <= 1:
            continue
        # Interior padding: each element followed by p pad values, the last's dropped.
        v = c.op("Unsqueeze", [v, c.const([d + 1])])
        pads = [0] * (2 * (rank + 1))
        pads[rank + 1 + d + 1] = p
        v = c.op("Pad", [v, c.const(pads), value], mode="constant")
        merged = shape[:d] + [shape[d] * (p + 1)] + shape[d + 1:]
        v = c.op("Reshape", [v, c.const(merged)])
        shape[d] = shape[d] * (p + 1) - p
        v = c.op("Slice", [v, c.const([0]), c.const([shape[d]]), c.const([d])])
    if any(lo) or any(hi):
        v = c.op("Pad", [v, c.const(lo + hi), value], mode="constant")
    return v


@rule(K.slice)
def _slice(c, n, x, shapes=None):
    begin = list(n.attr("begin"))
    out = list(n.shape)
    step = _spatial(n, "step", len(out), 1)
    # An end before index 0 (a negative step) must not read as "from the back".
    end = [b + e * s if b + e * s >= 0 else _INT64_MIN for b, e, s in zip(begin, out, step)]
    axes = list(range(len(out)))
    return c.op("Slice", [x[0], c.const(begin), c.const(end), c.const(axes), c.const(step)])


def _clamped_index(c, idx, limit):
    """idx as int64, clamped into [0, limit) as flowjit's gathers read it."""
    i64 = c.op("Cast", [idx], to=ONNX_DTYPES[D.int64])
    return c.op("Clip", [i64, c.const(0), c.const(max(limit - 1, 0))])


@rule(K.gather)
def _gather(c, n, x, shapes=None):
    p_shape, i_shape = list(shapes[0]), list(shapes[1])
    axis = int(_attr(n, "axis", 0))
    axis = axis + len(p_shape) if axis < 0 else axis
    b = int(_attr(n, "batch_dims", 0))
    idx = _clamped_index(c, x[1], p_shape[axis])
    if b == 0:
        return c.op("Gather", [x[0], idx], axis=axis)
    # batch_dims: p's first b dims pair with idx's; GatherND reads p[batch..., idx[batch..., j...]]
    # with the gathered axis first after the batch dims.
    p = x[0]
    if axis != b:
        p = c.op("Transpose", [p], perm=list(range(b)) + [axis] + [d for d in range(b, len(p_shape))
                                                                   if d != axis])
    g = c.op("GatherND", [p, c.op("Unsqueeze", [idx, c.const([-1])])], batch_dims=b)
    if axis == b:
        return g
    r, m = len(i_shape) - b, axis - b
    rest = len(p_shape) - axis - 1
    perm = (list(range(b)) + [b + r + j for j in range(m)] + [b + j for j in range(r)]
            + [b + r + m + j for j in range(rest)])
    return c.op("Transpose", [g], perm=perm)


@rule(K.gather_nd)
def _gather_nd(c, n, x, shapes=None):
    p_shape, i_shape = list(shapes[0]), list(shapes[1])
    k = i_shape[-1]
    i64 = c.op("Cast", [x[1]], to=ONNX_DTYPES[D.int64])
    lo = c.op("Max", [i64, c.const(0)])
    idx = c.op("Min", [lo, c.const([max(d - 1, 0) for d in p_shape[:k]])])
    return c.op("GatherND", [x[0], idx])


@rule(K.window)
def _window(c, n, x, shapes=None):
    in_shape = list(shapes[0])
    window = list(n.attr("window"))
    s = len(window)
    lead = len(in_shape) - s
    strides = _spatial(n, "strides", s, 1)
    dil = _spatial(n, "dilations", s, 1)
    lo = _spatial(n, "pads_lo", s, 0)
    hi = _spatial(n, "pads_hi", s, 0)
    out = list(n.shape)[lead:lead + s]
    v = x[0]
    if any(lo) or any(hi):
        v = c.op("Pad", [v, c.const([0] * lead + lo + [0] * lead + hi), _pad_value(c, n, n.dtype)],
                 mode="constant")
    # Spatial dim i becomes (out_i, k_i) through a gather of o * stride + t * dilation,
    # the last dim first so that the earlier ones keep their axis.
    for i in reversed(range(s)):
        idx = (np.arange(out[i])[:, None] * strides[i] + np.arange(window[i])[None, :] * dil[i])
        v = c.op("Gather", [v, c.const(idx)], axis=lead + i)
    perm = list(range(lead)) + [lead + 2 * i for i in range(s)] + [lead + 2 * i + 1 for i in range(s)]
    return c.op("Transpose", [v], perm=perm)


# ---- contractions

@rule(K.matmul)
def _matmul(c, n, x, shapes=None):
    ta, tb = bool(_attr(n, "transpose_a", False)), bool(_attr(n, "transpose_b", False))
    rank_a, rank_b = len(shapes[0]), len(shapes[1])
    if rank_a == 2 and rank_b == 2 and n.dtype in _FLOATS:
        return c.op("Gemm", x, transA=int(ta), transB=int(tb))

    def t(v, rank):
        return c.op("Transpose", [v], perm=list(range(rank - 2)) + [rank - 1, rank - 2])

    a = t(x[0], rank_a) if ta else x[0]
    b = t(x[1], rank_b) if tb else x[1]
    return c.op("MatMul", [a, b])


@rule(K.conv)
def _conv(c, n, x, shapes=None):
    w_shape = list(shapes[1])
    s = len(w_shape) - 2
    y = c.op("Conv", x, kernel_shape=w_shape[2:], strides=_spatial(n, "strides", s, 1),
             dilations=_spatial(n, "dilations", s, 1),
             pads=_spatial(n, "pads_lo", s, 0) + _spatial(n, "pads_hi", s, 0),
             group=int(_attr(n, "groups", 1)))
    # ONNX's [N, Co, out...] to flowjit's [N, groups, Co/groups, prod(out)].
    return c.op("Reshape", [y, c.const(list(n.shape))])


# ---- composites

@rule(K.softmax, K.log_softmax)
def _softmax(c, n, x):
    return c.op("Softmax" if n.op == K.softmax else "LogSoftmax", x, axis=int(_attr(n, "axis", -1)))


@rule(K.sparse_softmax_cross_entropy)
def _sparse_ce(c, n, x):
    labels, logits = x
    # -log_softmax(logits)[..., label], per label.
    logp = c.op("LogSoftmax", [logits], axis=-1)
    idx = c.op("Unsqueeze", [c.op("Cast", [labels], to=ONNX_DTYPES[D.int64]), c.const([-1])])
    picked = c.op("GatherElements", [logp, idx], axis=-1)
    return c.op("Neg", [c.op("Squeeze", [picked, c.const([-1])])])


@rule(K.one_hot)
def _one_hot(c, n, x):
    depth = int(n.attr("depth"))
    idx = c.op("Unsqueeze", [c.op("Cast", x, to=ONNX_DTYPES[D.int64]), c.const([-1])])
    hot = c.op("Equal", [idx, c.const(np.arange(depth))])  # an index outside [0, depth): all off
    return c.op("Where", [hot, c.scalar(float(n.attr("on_value")), n.dtype),
                          c.scalar(float(n.attr("off_value")), n.dtype)])


@rule(K.segment_sum)
def _segment_sum(c, n, x, shapes=None):
    """ScatterND with reduction "add" into zeros of num_segments + 1 rows: an
    id out of range (flowjit drops it, ONNX would refuse it) goes to the extra
    row, which is sliced off. data's indexed dims move first for ScatterND."""
    d_shape, i_shape = list(shapes[0]), list(shapes[1])
    axis, segments = int(n.attr("axis")), int(n.attr("num_segments"))
    b = int(_attr(n, "batch_dims", 0))
    if b:
        raise c.unsupported(n, f"has {b} batch dims; only segment sums without batch dims export")
    m = len(i_shape)
    outer, inner = d_shape[:axis], d_shape[axis + m:]
    data = x[0]
    if axis:
        data = c.op("Transpose", [data], perm=list(range(axis, axis + m)) + list(range(axis))
                    + list(range(axis + m, len(d_shape))))
    ids = c.op("Cast", [x[1]], to=ONNX_DTYPES[D.int64])
    ok = c.op("And", [c.op("GreaterOrEqual", [ids, c.const(0)]), c.op("Less", [ids, c.const(segments)])])
    ids = c.op("Unsqueeze", [c.op("Where", [ok, ids, c.const(segments)]), c.const([-1])])
    zeros = c.op("Expand", [c.scalar(0, n.dtype), c.const([segments + 1] + outer + inner)])
    out = c.op("ScatterND", [zeros, ids, data], reduction="add")
    out = c.op("Slice", [out, c.const([0]), c.const([segments]), c.const([0])])
    if axis:
        out = c.op("Transpose", [out], perm=list(range(1, axis + 1)) + [0]
                   + list(range(axis + 1, len(outer) + 1 + len(inner))))
    return out


@rule(K.attention)
def _attention(c, n, x, shapes=None):
    """softmax(q @ kt * scale + bias, keys after the query masked when
    causal) @ v, then each row's log-sum-exp as one more column: the op's
    layout (ir/ops.def), of which the job reads a slice. A dropout is
    exported as its distribution, as the random ops are."""
    q, kt, v, bias = x[:4]
    lq, lk = int(shapes[0][-2]), int(shapes[1][-1])
    s = c.op("MatMul", [q, kt])
    s = c.op("Add", [c.op("Mul", [s, c.scalar(float(n.attr("scale")), n.dtype)]), bias])
    if n.attr("causal"):
        above = np.triu(np.ones((lq, lk), np.bool_), 1)
        s = c.op("Where", [c.const(above, np.bool_), c.scalar(float("-inf"), n.dtype), s])
    p = c.op("Softmax", [s], axis=-1)
    rate = float(_attr(n, "dropout", 0.0))
    if rate > 0:
        u = c.op("RandomUniform", [], dtype=ONNX_DTYPES[n.dtype],
                 shape=[int(d) for d in shapes[0][:-1]] + [lk], seed=float(_attr(n, "seed", 0)))
        keep = c.op("GreaterOrEqual", [u, c.scalar(rate, n.dtype)])
        p = c.op("Where", [keep, c.op("Mul", [p, c.scalar(1.0 / (1.0 - rate), n.dtype)]),
                           c.scalar(0.0, n.dtype)])
    out = c.op("MatMul", [p, v])
    lse = c.axes_op("ReduceLogSumExp", s, [-1], since=18, keepdims=1)
    return c.op("Concat", [out, lse], axis=-1)


# Rules that also read their operands' shapes.
SHAPED = {K.pad, K.slice, K.gather, K.gather_nd, K.window, K.matmul, K.conv, K.segment_sum,
          K.attention}

# Ops that never reach an exported graph's results, or that ONNX cannot say.
WHY_NOT = {
    K.truncated_normal: "draws from a truncated normal distribution, which ONNX has no op for",
    K.unwindow: "is a gradient's view and never part of a forward graph",
    K.conv_data_grad: "is a gradient and never part of a forward graph",
    K.conv_filter_grad: "is a gradient and never part of a forward graph",
    K.attention_grad: "is a gradient and never part of a forward graph",
    K.assign: "is an effect (a variable update), not a value",
}
