"""Every VJP rule (jit/autodiff.cpp) against central finite differences in float64.

Technique, per case: a train job whose variables are loaded with
flow.load_variables, loss = reduce_sum(f(vars..., consts...) * c) with a fixed
random c (a placeholder), SGD with learning rate 1 and momentum 0: one step
gives the gradient as w_before - w_after (the loss has one element, shape
(1,) as OneFlow gives a full reduction, so the 1/N loss-instance scaling is 1). A predict job computes the same loss from
placeholders; its central differences are the reference. The forward value is
checked against numpy as well.
"""
import json
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

F64 = flow.float64
_DT = {np.dtype(np.float64): flow.float64, np.dtype(np.float32): flow.float32,
       np.dtype(np.int32): flow.int32, np.dtype(np.int64): flow.int64}


def _config():
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64)
    return cfg


def _make_job(name, kind, specs, body):
    """A job function `name` with one placeholder per (arg, shape, dtype) in specs."""
    ns = {"_body": body, "tp": tp}
    params = []
    for i, (arg, shape, dt) in enumerate(specs):
        ns[f"_a{i}"] = tp.Numpy.Placeholder(tuple(shape), dtype=dt)
        params.append(f"{arg}: _a{i}")
    args = ", ".join(a for a, _, _ in specs)
    exec(f"def {name}({', '.join(params)}) -> tp.Numpy:\n    return _body({args})\n", ns)  # noqa: S102
    return flow.global_function(type=kind, function_config=_config())(ns[name])


def _sgd1():
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0)


def autodiff_gradients(name, f, inputs, consts, c, wrt=None):
    """(loss, {i: gradient}) from one SGD(lr=1) step of a train job in which
    inputs[i] for i in `wrt` (all when None) are variables and the other
    inputs are placeholders."""
    wrt = list(range(len(inputs))) if wrt is None else list(wrt)
    var_names = {i: f"{name}_x{i}" for i in wrt}
    fed = [i for i in range(len(inputs)) if i not in var_names]
    specs = ([(f"x{i}", inputs[i].shape, F64) for i in fed]
             + [(f"k{j}", k.shape, _DT[k.dtype]) for j, k in enumerate(consts)] + [("c", c.shape, F64)])

    def body(*args):
        fed_blobs = dict(zip(fed, args[:len(fed)]))
        ks, cc = args[len(fed):-1], args[-1]
        xs = [fed_blobs[i] if i in fed_blobs else
              flow.get_variable(var_names[i], shape=inputs[i].shape, dtype=F64,
                                initializer=flow.constant_initializer(0.5))
              for i in range(len(inputs))]
        loss = flow.math.reduce_sum(f(*xs, *ks) * cc)
        _sgd1().minimize(loss)
        return loss

    suffix = "_".join(str(i) for i in wrt)
    train = _make_job(f"train_{name}_{suffix}", "train", specs, body)
    args = [inputs[i] for i in fed] + list(consts) + [c]
    train(*args)  # creates (and initializes) the variables
    flow.load_variables({var_names[i]: inputs[i] for i in wrt})
    loss = train(*args)
    after = flow.get_all_variables()
    return np.asarray(loss).item(), {i: inputs[i] - np.asarray(after[var_names[i]]) for i in wrt}


def finite_differences(name, f, inputs, consts, c, h):
    specs = ([(f"x{i}", x.shape, F64) for i, x in enumerate(inputs)]
             + [(f"k{i}", k.shape, _DT[k.dtype]) for i, k in enumerate(consts)] + [("c", c.shape, F64)])
    n = len(inputs)

    def body(*args):
        return flow.math.reduce_sum(f(*args[:n], *args[n:-1]) * args[-1])

    loss_job = _make_job(f"loss_{name}", "predict", specs, body)
    base = np.asarray(loss_job(*inputs, *consts, c)).item()
    grads = []
    for i, x in enumerate(inputs):
        g = np.zeros_like(x)
        for j in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[j] += h
            xm[j] -= h
            args_p = list(inputs)
            args_p[i] = xp
            args_m = list(inputs)
            args_m[i] = xm
            g[j] = (np.asarray(loss_job(*args_p, *consts, c)).item()
                    - np.asarray(loss_job(*args_m, *consts, c)).item()) / (2 * h)
        grads.append(g)
    return base, grads


def check(name, f, ref, inputs, consts=(), h=1e-6, rtol=1e-6, atol=1e-8, each=True):
    """Autodiff gradients of sum(f * c) vs finite differences; forward vs numpy `ref`.

    All differentiable inputs are variables of one train job; with several
    inputs and each=True, also each in turn is the job's only variable (the
    others fed as placeholders: the rules then run with one operand constant).
    """
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    inputs = [np.ascontiguousarray(x, dtype=np.float64) for x in inputs]
    consts = [np.ascontiguousarray(k) for k in consts]
    expected_out = np.asarray(ref(*inputs, *consts), dtype=np.float64)
    c = rng.standard_normal(expected_out.shape)
    expected_loss = float(np.sum(expected_out * c))
    base, fd = finite_differences(name, f, inputs, consts, c, h)
    np.testing.assert_allclose(base, expected_loss, rtol=1e-9, atol=1e-12, err_msg=f"{name}: predict forward")
    groups = [None] + ([[i] for i in range(len(inputs))] if each and len(inputs) > 1 else [])
    result = None
    for wrt in groups:
        loss, grads = autodiff_gradients(name, f, inputs, consts, c, wrt)
        np.testing.assert_allclose(loss, expected_loss, rtol=1e-9, atol=1e-12, err_msg=f"{name}: train forward")
        for i, g in grads.items():
            scale = max(1.0, float(np.abs(fd[i]).max()))
            np.testing.assert_allclose(g, fd[i], rtol=rtol, atol=atol * scale,
                                       err_msg=f"{name}: gradient of input {i} "
                                               f"({'all inputs variables' if wrt is None else 'only variable'})")
        if wrt is None:
            result = [grads[i] for i in range(len(inputs))]
    return result


# ---------------------------------------------------------------- inputs

def _rng(tag):
    return np.random.default_rng(zlib.crc32(tag.encode()))


def normal(tag, shape):
    return _rng(tag).standard_normal(shape)


def positive(tag, shape):
    return _rng(tag).uniform(0.5, 2.0, shape)


def away_from_zero(tag, shape):
    """|x| >= 0.2: clear of the kinks of relu and abs and the pole of 1/x."""
    r = _rng(tag)
    return np.where(r.random(shape) < 0.5, -1.0, 1.0) * r.uniform(0.2, 1.5, shape)


def distinct(tag, shape):
    """All values at least ~0.1 apart (no ties for max/min)."""
    n = int(np.prod(shape))
    return (_rng(tag).permutation(n) * 0.15 - 0.07 * n).reshape(shape)


def separated_pair(tag, sa, sb):
    """Two operands whose broadcast values differ by >= 0.1 everywhere."""
    r = _rng(tag)
    a = r.standard_normal(sa)
    while True:
        b = r.standard_normal(sb)
        if np.abs(np.broadcast_arrays(a, b)[0] - np.broadcast_arrays(a, b)[1]).min() > 0.1:
            return a, b


m = flow.math

# ---------------------------------------------------------------- unary

UNARY = [
    ("exp", m.exp, np.exp, normal),
    ("log", m.log, np.log, positive),
    ("sqrt", m.sqrt, np.sqrt, positive),
    ("rsqrt", m.rsqrt, lambda x: 1 / np.sqrt(x), positive),
    ("square", m.square, np.square, normal),
    ("reciprocal", m.reciprocal, np.reciprocal, away_from_zero),
    ("tanh", m.tanh, np.tanh, normal),
    ("sigmoid", m.sigmoid, lambda x: 1 / (1 + np.exp(-x)), normal),
    ("relu", flow.nn.relu, lambda x: np.maximum(x, 0), away_from_zero),
    ("abs", m.abs, np.abs, away_from_zero),
    ("neg", m.negative, np.negative, normal),
    ("sin", m.sin, np.sin, normal),
    ("cos", m.cos, np.cos, normal),
    ("identity", flow.identity, lambda x: x, normal),
]


@pytest.mark.parametrize("name,op,ref,gen", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, op, ref, gen):
    check(name, op, ref, [gen(name, (3, 4))])


def test_unary_operator_sugar():
    # Blob operators (-x, abs(x), x ** 2.0) go through the same rules.
    check("sugar", lambda x: -abs(x) + x ** 2.0, lambda x: -np.abs(x) + x ** 2,
          [away_from_zero("sugar", (2, 5))])


def test_cast_chain_float64_float32_float64():
    # x (f64) -> f32 -> square -> f64: the gradient flows back through both casts.
    # float32 rounding limits the finite differences: h = 1e-2 on a quadratic
    # has no truncation error, and leaves ~1e-5 relative rounding error.
    x = normal("cast", (3, 4))

    def f(v):
        return flow.cast(m.square(flow.cast(v, flow.float32)), flow.float64)

    def ref(v):
        return np.square(v.astype(np.float32)).astype(np.float64)

    grads = check("cast", f, ref, [x], h=1e-2, rtol=1e-3, atol=1e-4)
    # and against the analytic 2 * x * c, at float32 precision
    c = np.random.default_rng(zlib.crc32(b"cast")).standard_normal((3, 4))
    np.testing.assert_allclose(grads[0], 2 * x * c, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- binary, broadcasting

BROADCAST_SHAPES = [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((3, 4), ())]


def _binary_inputs(op, tag, sa, sb):
    if op == "div":
        return normal(tag + "a", sa), away_from_zero(tag + "b", sb)
    if op == "pow":
        return positive(tag + "a", sa), normal(tag + "b", sb)
    if op in ("maximum", "minimum"):
        return separated_pair(tag, sa, sb)
    return normal(tag + "a", sa), normal(tag + "b", sb)


BINARY = {
    "add": (m.add, np.add),
    "sub": (m.subtract, np.subtract),
    "mul": (m.multiply, np.multiply),
    "div": (m.divide, np.divide),
    "pow": (m.pow, np.power),
    "maximum": (m.maximum, np.maximum),
    "minimum": (m.minimum, np.minimum),
}


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}".replace(" ", ""))
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(op, shapes):
    sa, sb = shapes
    tag = f"{op}_{len(sa)}{len(sb)}{sa[-1]}{sb[-1] if sb else 0}"
    a, b = _binary_inputs(op, tag, sa, sb)
    fn, ref = BINARY[op]
    check(tag, fn, ref, [a, b])
    # and with the operands swapped (the broadcast one first)
    b2, a2 = _binary_inputs(op, tag + "s", sb, sa)
    check(tag + "_swapped", fn, ref, [b2, a2])


def test_same_variable_used_twice():
    # Gradient accumulation: x reaches the loss along three paths.
    check("reuse", lambda x: x * x + m.exp(x) * x, lambda x: x * x + np.exp(x) * x, [normal("reuse", (3, 4))])


def test_where_with_broadcasting():
    k = normal("where_k", (3, 4))
    x, y = normal("where_x", (3, 4)), normal("where_y", (4,))
    check("where", lambda a, b, kk: flow.where(kk > 0, a, b), lambda a, b, kk: np.where(kk > 0, a, b),
          [x, y], [k])
    # operands broadcast the other way round
    x2, y2 = normal("where_x2", (3, 1)), normal("where_y2", (3, 4))
    check("where2", lambda a, b, kk: flow.where(kk > 0, a, b), lambda a, b, kk: np.where(kk > 0, a, b),
          [x2, y2], [k])


# ---------------------------------------------------------------- reductions

REDUCTIONS = [
    ("sum_all", m.reduce_sum, np.sum, None, False, normal),
    ("sum_1", m.reduce_sum, np.sum, 1, False, normal),
    ("sum_02_keep", m.reduce_sum, np.sum, [0, 2], True, normal),
    ("sum_neg1", m.reduce_sum, np.sum, -1, False, normal),
    ("mean_all", m.reduce_mean, np.mean, None, False, normal),
    ("mean_1_keep", m.reduce_mean, np.mean, 1, True, normal),
    ("mean_02", m.reduce_mean, np.mean, [0, 2], False, normal),
    ("max_2", m.reduce_max, np.max, 2, False, distinct),
    ("max_all", m.reduce_max, np.max, None, False, distinct),
    ("max_01_keep", m.reduce_max, np.max, [0, 1], True, distinct),
    ("min_0", m.reduce_min, np.min, 0, False, distinct),
    ("min_2_keep", m.reduce_min, np.min, 2, True, distinct),
    ("prod_1", m.reduce_prod, np.prod, 1, False, away_from_zero),
    ("prod_all", m.reduce_prod, np.prod, None, False, away_from_zero),
    ("prod_2_keep", m.reduce_prod, np.prod, 2, True, away_from_zero),
]


@pytest.mark.parametrize("name,op,ref,axis,keep,gen", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduction(name, op, ref, axis, keep, gen):
    x = gen(name, (2, 3, 4))
    np_axis = tuple(axis) if isinstance(axis, list) else axis
    check(name, lambda v: op(v, axis=axis, keepdims=keep), lambda v: ref(v, axis=np_axis, keepdims=keep), [x])


# ---------------------------------------------------------------- shapes

def test_reshape():
    check("reshape", lambda v: flow.reshape(v, [2, 6]) * flow.reshape(v, [2, 6]),
          lambda v: v.reshape(2, 6) ** 2, [normal("reshape", (3, 4))])
    check("reshape_m1", lambda v: flow.reshape(v, [-1]), lambda v: v.reshape(-1), [normal("reshape2", (2, 3, 2))])


def test_transpose():
    check("transpose", lambda v: flow.transpose(v, perm=[2, 0, 1]), lambda v: v.transpose(2, 0, 1),
          [normal("transpose", (2, 3, 4))])
    check("transpose_rev", lambda v: flow.transpose(v), lambda v: v.T, [normal("transpose2", (3, 4))])


def test_broadcast_to():
    check("bcast", lambda v: flow.broadcast_to(v, [2, 3, 4]), lambda v: np.broadcast_to(v, (2, 3, 4)),
          [normal("bcast", (3, 1))])
    check("bcast2", lambda v: flow.broadcast_to(v, [3, 4]), lambda v: np.broadcast_to(v, (3, 4)),
          [normal("bcast2", (4,))])


# ---------------------------------------------------------------- matmul

def _op(x, t):
    return np.swapaxes(x, -1, -2) if t else x


MATMUL = []
for ta in (False, True):
    for tb in (False, True):
        MATMUL.append(("2d", (3, 4), (4, 5), ta, tb))
        MATMUL.append(("batched", (2, 3, 4), (2, 4, 5), ta, tb))
        MATMUL.append(("shared_b", (2, 3, 4), (4, 5), ta, tb))


@pytest.mark.parametrize("kind,sa,sb,ta,tb", MATMUL,
                         ids=[f"{k}-ta{int(a)}-tb{int(b)}" for k, _, _, a, b in MATMUL])
def test_matmul(kind, sa, sb, ta, tb):
    sa = sa[:-2] + sa[-2:][::-1] if ta else sa
    sb = sb[:-2] + sb[-2:][::-1] if tb else sb
    tag = f"mm_{kind}_{int(ta)}{int(tb)}"
    a, b = normal(tag + "a", sa), normal(tag + "b", sb)
    check(tag, lambda x, y: flow.matmul(x, y, transpose_a=ta, transpose_b=tb),
          lambda x, y: np.matmul(_op(x, ta), _op(y, tb)), [a, b])


def test_matmul_same_operand():
    # x^T x: both operands are the same variable.
    check("mm_gram", lambda x: flow.matmul(x, x, transpose_a=True), lambda x: x.T @ x, [normal("gram", (4, 3))])


# ---------------------------------------------------------------- nn

def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def np_sparse_ce(labels, logits):
    return -np.take_along_axis(np_log_softmax(logits), labels[:, None].astype(np.int64), axis=-1)[:, 0]


def test_softmax():
    check("softmax", lambda v: flow.nn.softmax(v), np_softmax, [normal("softmax", (3, 5))])
    check("softmax_ax0", lambda v: flow.nn.softmax(v, axis=0), lambda v: np_softmax(v, 0),
          [normal("softmax0", (3, 5))])
    check("softmax_3d", lambda v: flow.nn.softmax(v, axis=1), lambda v: np_softmax(v, 1),
          [normal("softmax3", (2, 3, 4))])


def test_log_softmax():
    check("logsoftmax", lambda v: flow.nn.log_softmax(v), np_log_softmax, [normal("logsoftmax", (3, 5))])
    check("logsoftmax_ax0", lambda v: flow.nn.log_softmax(v, axis=0), lambda v: np_log_softmax(v, 0),
          [normal("logsoftmax0", (3, 5))])


def test_sparse_softmax_cross_entropy():
    labels = np.array([0, 4, 2, 2], dtype=np.int32)
    check("sce", lambda v, lab: flow.nn.sparse_softmax_cross_entropy_with_logits(lab, v),
          lambda v, lab: np_sparse_ce(lab, v), [normal("sce", (4, 5))], [labels])


def test_one_hot_gradient_flows_to_values_only():
    idx = np.array([1, 0, 3, 3], dtype=np.int32)
    check("onehot", lambda v, i: flow.one_hot(i, 5, dtype=flow.float64) * v,
          lambda v, i: np.eye(5)[i] * v, [normal("onehot", (4, 5))], [idx])


def test_one_hot_no_gradient_through_integer_indices():
    # w reaches the loss twice: through cast -> int32 -> one_hot (no gradient,
    # as in OneFlow) and through w * d. Only the second contributes.
    w0 = np.array([0.3, 1.7, 2.2, 4.6])
    d = np.array([0.5, -1.0, 2.0, 0.25])
    c = normal("onehot_c", (4, 5))

    def f(w, dd, cc):
        oh = flow.one_hot(flow.cast(w, flow.int32), 5, dtype=flow.float64)
        return flow.math.reduce_sum(oh * cc) + flow.math.reduce_sum(w * dd)

    loss, grads = autodiff_gradients("onehot_int", lambda w, dd, cc: f(w, dd, cc), [w0], [d, c],
                                     np.array(1.0))
    expected = np.sum(np.eye(5)[w0.astype(np.int64)] * c) + np.sum(w0 * d)
    np.testing.assert_allclose(loss, expected, rtol=1e-12)
    np.testing.assert_allclose(grads[0], d, rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------- compositions

def test_mlp_composition():
    x = normal("mlp_x", (5, 6))
    labels = np.array([0, 2, 1, 1, 2], dtype=np.int32)
    w1, b1 = normal("mlp_w1", (6, 7)) * 0.5, normal("mlp_b1", (7,)) * 0.1
    w2, b2 = normal("mlp_w2", (3, 7)) * 0.5, normal("mlp_b2", (3,)) * 0.1

    def f(w1_, b1_, w2_, b2_, xx, lab):
        h = flow.math.tanh(flow.matmul(xx, w1_) + b1_)
        logits = flow.matmul(h, w2_, transpose_b=True) + b2_
        return flow.nn.sparse_softmax_cross_entropy_with_logits(lab, logits)

    def ref(w1_, b1_, w2_, b2_, xx, lab):
        h = np.tanh(xx @ w1_ + b1_)
        return np_sparse_ce(lab, h @ w2_.T + b2_)

    check("mlp", f, ref, [w1, b1, w2, b2], [x, labels])


def test_mlp_relu_sigmoid_softmax_composition():
    x = normal("mlp2_x", (4, 5))
    w1 = normal("mlp2_w1", (5, 6))
    w2 = normal("mlp2_w2", (6, 3))

    def f(a, b, xx):
        h = flow.nn.relu(flow.matmul(xx, a))
        return flow.nn.softmax(flow.math.sigmoid(flow.matmul(h, b)) * 3.0)

    def ref(a, b, xx):
        h = np.maximum(xx @ a, 0)
        return np_softmax(3.0 / (1 + np.exp(-(h @ b))))

    check("mlp2", f, ref, [w1, w2], [x])


# ---------------------------------------------------------------- variables updated jointly

_MUTUAL = textwrap.dedent("""
    import json
    import numpy as np
    import flowjit as flow
    import flowjit.typing as tp
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64)

    @flow.global_function(type="train", function_config=cfg)
    def job(c: tp.Numpy.Placeholder((3,), dtype=flow.float64)) -> tp.Numpy:
        a = flow.get_variable("a", shape=(3,), dtype=flow.float64,
                              initializer=flow.constant_initializer(0.5))
        b = flow.get_variable("b", shape=(3,), dtype=flow.float64,
                              initializer=flow.constant_initializer(2.0))
        loss = flow.math.reduce_sum({expr})
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]),
                           momentum=0).minimize(loss)
        return loss

    job(np.array([1.0, -1.0, 3.0]))
    v = flow.get_all_variables()
    print(json.dumps([v["a"].tolist(), v["b"].tolist()]))
""")


def test_two_variables_whose_updates_read_each_other():
    # d/da sum(a*b*c) = b*c reads b, d/db = a*c reads a, so neither assign
    # can be stored in place before the other kernel has read the old value
    # (fusion defers them). This crashed jit::fuse (a heap overrun, fixed in
    # d778d87); it runs in a child process so that a regression fails this
    # test instead of killing the test run.
    proc = subprocess.run([sys.executable, "-c", _MUTUAL.replace("{expr}", "a * b * c")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"child exited with {proc.returncode}: {proc.stderr[-2000:]}"
    a, b = (np.array(v) for v in json.loads(proc.stdout.strip().splitlines()[-1]))
    c = np.array([1.0, -1.0, 3.0])
    np.testing.assert_allclose(a, 0.5 - 2.0 * c, rtol=1e-12)
    np.testing.assert_allclose(b, 2.0 - 0.5 * c, rtol=1e-12)
