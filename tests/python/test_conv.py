"""Convolutional networks (issue #11): conv, pooling, batch and layer norm,
dropout, their gradients, fusion, several devices and the error messages.

References are float64 numpy written here (direct loops over kernel taps);
gradients are checked against central finite differences with the harness of
test_autodiff (variables of a train job, SGD at lr 1)."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from test_autodiff import _make_job, check


# ---------------------------------------------------------------- numpy references

def np_conv(x, w, strides, pads_lo, pads_hi, dilations, groups):
    """Channels-first cross-correlation over any number of spatial dims."""
    s = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(pads_lo, pads_hi)))
    k = w.shape[2:]
    out = [(xp.shape[2 + i] - dilations[i] * (k[i] - 1) - 1) // strides[i] + 1 for i in range(s)]
    n, c = x.shape[:2]
    co, cg = w.shape[:2]
    cog = co // groups
    y = np.zeros((n, co, *out))
    for g in range(groups):
        for tap in np.ndindex(*k):
            sl = tuple(slice(tap[i] * dilations[i], tap[i] * dilations[i] + strides[i] * (out[i] - 1) + 1,
                             strides[i]) for i in range(s))
            patch = xp[(slice(None), slice(g * cg, (g + 1) * cg)) + sl]
            wt = w[(slice(g * cog, (g + 1) * cog), slice(None)) + tap]
            y[:, g * cog:(g + 1) * cog] += np.einsum("nc...,oc->no...", patch, wt)
    return y


def np_pool(x, k, strides, pads_lo, pads_hi, kind):
    s = x.ndim - 2
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(pads_lo, pads_hi)), constant_values=fill)
    ones = np.pad(np.ones(x.shape[2:]), list(zip(pads_lo, pads_hi)))
    out = [(xp.shape[2 + i] - k[i]) // strides[i] + 1 for i in range(s)]
    acc = np.full(x.shape[:2] + tuple(out), fill)
    count = np.zeros(out)
    for tap in np.ndindex(*k):
        sl = tuple(slice(tap[i], tap[i] + strides[i] * (out[i] - 1) + 1, strides[i]) for i in range(s))
        v = xp[(slice(None), slice(None)) + sl]
        acc = np.maximum(acc, v) if kind == "max" else acc + v
        count += ones[sl]
    return acc if kind == "max" else acc / count


def same_pads(size, k, stride, dilation=1):
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def predict(fn, *arrays):
    """fn over float32 placeholders shaped like `arrays`, in a predict job."""
    specs = [(f"a{i}", a.shape, flow.float32) for i, a in enumerate(arrays)]
    return _make_job("predict_case", "predict", specs, fn)(*arrays)


# ---------------------------------------------------------------- conv forward

CONV_CASES = [
    # (x shape, w shape, strides, padding (flow form), dilations, groups, data_format)
    ((2, 3, 7, 9), (4, 3, 3, 3), 1, [[0, 0], [0, 0], [1, 1], [1, 1]], 1, 1, "NCHW"),
    ((1, 4, 8, 7), (6, 2, 3, 2), (2, 3), [[0, 0], [0, 0], [2, 0], [0, 1]], (1, 2), 2, "NCHW"),
    ((3, 1, 28, 28), (8, 1, 5, 5), 1, "SAME", 1, 1, "NCHW"),
    ((2, 6, 5, 5), (6, 1, 3, 3), 1, "VALID", 1, 6, "NCHW"),          # depthwise
    ((2, 5, 9, 11), (3, 5, 1, 1), 1, "VALID", 1, 1, "NCHW"),         # 1x1: a plain matmul
    ((1, 3, 10, 10), (4, 3, 3, 3), 3, "SAME", 1, 1, "NCHW"),         # stride 3, batch 1
    ((2, 7, 6, 3), (4, 3, 2, 3), (2, 1), "SAME", 1, 1, "NHWC"),      # NHWC filters (Co, kh, kw, Cg)
    ((2, 6, 6, 4), (4, 3, 3, 2), 2, "SAME", 2, 2, "NHWC"),
]


def _flow_pads(x_cf, w_cf, strides, padding, dilations):
    s = x_cf.ndim - 2
    st = [strides] * s if isinstance(strides, int) else list(strides)
    dl = [dilations] * s if isinstance(dilations, int) else list(dilations)
    if padding == "VALID":
        return st, dl, [0] * s, [0] * s
    if padding == "SAME":
        p = [same_pads(x_cf.shape[2 + i], w_cf.shape[2 + i], st[i], dl[i]) for i in range(s)]
        return st, dl, [a for a, _ in p], [b for _, b in p]
    return st, dl, [q[0] for q in padding[2:]], [q[1] for q in padding[2:]]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv2d_forward_matches_numpy(case):
    xs, ws, strides, padding, dil, groups, fmt = CONV_CASES[case]
    rng = np.random.default_rng(case)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    y = predict(lambda a, b: flow.nn.conv2d(a, b, strides, padding, data_format=fmt, dilations=dil,
                                            groups=groups), x, w)
    x_cf = x if fmt == "NCHW" else x.transpose(0, 3, 1, 2)
    w_cf = w if fmt == "NCHW" else w.transpose(0, 3, 1, 2)
    st, dl, lo, hi = _flow_pads(x_cf, w_cf, strides, padding, dil)
    ref = np_conv(x_cf.astype(np.float64), w_cf.astype(np.float64), st, lo, hi, dl, groups)
    if fmt == "NHWC":
        ref = ref.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv1d_and_conv3d_forward():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 13)).astype(np.float32)
    w = rng.standard_normal((5, 3, 4)).astype(np.float32)
    y = predict(lambda a, b: flow.nn.conv1d(a, b, 2, [[0, 0], [0, 0], [1, 2]], dilations=2), x, w)
    np.testing.assert_allclose(y, np_conv(x.astype(np.float64), w, [2], [1], [2], [2], 1), rtol=1e-4, atol=1e-4)
    x3 = rng.standard_normal((1, 2, 4, 5, 3)).astype(np.float32)
    w3 = rng.standard_normal((3, 2, 2, 3, 2)).astype(np.float32)
    y3 = predict(lambda a, b: flow.nn.conv3d(a, b, 1, "SAME"), x3, w3)
    lo = [same_pads(4, 2, 1)[0], same_pads(5, 3, 1)[0], same_pads(3, 2, 1)[0]]
    hi = [same_pads(4, 2, 1)[1], same_pads(5, 3, 1)[1], same_pads(3, 2, 1)[1]]
    np.testing.assert_allclose(y3, np_conv(x3.astype(np.float64), w3, [1] * 3, lo, hi, [1] * 3, 1),
                               rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- gradients

GRAD_CASES = {
    "padded": ((2, 3, 5, 6), (4, 3, 3, 3), 1, [[0, 0], [0, 0], [1, 1], [1, 1]], 1, 1),
    "stride2_dilation_groups": ((2, 4, 5, 6), (4, 2, 3, 2), (2, 1), [[0, 0], [0, 0], [1, 1], [0, 0]], (1, 2), 2),
    "stride3_asymmetric": ((1, 2, 8, 7), (3, 2, 2, 3), 3, [[0, 0], [0, 0], [2, 0], [0, 1]], 1, 1),
    "depthwise_same": ((2, 3, 5, 5), (3, 1, 3, 3), 2, "SAME", 1, 3),
    # rows of 8+ elements: packed by contiguous runs, not gathers (forward and data gradient)
    "wide_rows": ((1, 2, 9, 19), (3, 2, 3, 3), 1, "SAME", 1, 1),
    # rows of a whole number of vectors on every host: each group of lines is
    # one masked load, the first one's lane 0 before the start of the input
    "rows_of_16": ((2, 3, 5, 16), (4, 3, 3, 3), 1, "SAME", 1, 1),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_conv2d_gradients(name):
    xs, ws, strides, padding, dil, groups = GRAD_CASES[name]
    rng = np.random.default_rng(len(name))
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    st, dl, lo, hi = _flow_pads(x, w, strides, padding, dil)
    check(f"conv_{name}", lambda a, b: flow.nn.conv2d(a, b, strides, padding, dilations=dil, groups=groups),
          lambda a, b: np_conv(a, b, st, lo, hi, dl, groups), [x, w], rtol=1e-5, atol=1e-7)


# float32 (8 or 16 lanes): a filter gradient's operands are packed along k,
# blocks of k covering one output row, two, or three and more (gathers: rows
# of 3, apart in memory by the vertical stride).
@pytest.mark.parametrize("xs, ws, sh", [((3, 8, 9, 3), (12, 8, 2, 1), 2), ((2, 4, 9, 14), (16, 4, 3, 3), 1),
                                        ((1, 3, 4, 40), (16, 3, 1, 3), 1)],
                         ids=["rows of 3", "rows of 12", "rows of 38"])
def test_float32_conv_gradients(xs, ws, sh):
    rng = np.random.default_rng(xs[-1])
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    out = (xs[0], ws[0], (xs[2] - ws[2]) // sh + 1, xs[3] - ws[3] + 1)
    c = rng.standard_normal(out).astype(np.float32)
    tag = f"f32grad{xs[-1]}"

    def step(cc):
        xv = flow.get_variable(f"{tag}_x", shape=xs, initializer=flow.zeros_initializer())
        wv = flow.get_variable(f"{tag}_w", shape=ws, initializer=flow.zeros_initializer())
        loss = flow.math.reduce_sum(flow.nn.conv2d(xv, wv, (sh, 1), "VALID") * cc)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss
    step.__name__ = tag
    step.__annotations__ = {"cc": tp.Numpy.Placeholder(out), "return": tp.Numpy}
    train = flow.global_function(type="train")(step)
    train(c)
    flow.load_variables({f"{tag}_x": x, f"{tag}_w": w})
    train(c)
    got = flow.get_all_variables()
    x64, w64, c64 = x.astype(np.float64), w.astype(np.float64), c.astype(np.float64)
    dw, dx = np.zeros(ws), np.zeros(xs)
    for kh in range(ws[2]):
        for kw in range(ws[3]):
            rows = slice(kh, kh + sh * (out[2] - 1) + 1, sh)
            patch = x64[:, :, rows, kw:kw + out[3]]
            dw[:, :, kh, kw] = np.einsum("nohw,nchw->oc", c64, patch)
            dx[:, :, rows, kw:kw + out[3]] += np.einsum("nohw,oc->nchw", c64, w64[:, :, kh, kw])
    np.testing.assert_allclose(got[f"{tag}_w"], w64 - dw, rtol=1e-4, atol=1e-4 * np.abs(dw).max())
    np.testing.assert_allclose(got[f"{tag}_x"], x64 - dx, rtol=1e-4, atol=1e-4 * np.abs(dx).max())


def test_conv2d_nhwc_gradients():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 5, 4, 3)), rng.standard_normal((2, 3, 2, 3))
    lo, hi = [same_pads(5, 3, 2)[0], same_pads(4, 2, 2)[0]], [same_pads(5, 3, 2)[1], same_pads(4, 2, 2)[1]]
    check("conv_nhwc", lambda a, b: flow.nn.conv2d(a, b, 2, "SAME", data_format="NHWC"),
          lambda a, b: np_conv(a.transpose(0, 3, 1, 2), b.transpose(0, 3, 1, 2), [2, 2], lo, hi, [1, 1],
                               1).transpose(0, 2, 3, 1), [x, w], rtol=1e-5, atol=1e-7)


POOL_CASES = {
    "max_2x3_padded": ("max", (2, 3, 5, 7), (2, 3), (2, 2), [[0, 0], [0, 0], [0, 1], [1, 1]], "NCHW"),
    "max_same_stride1": ("max", (1, 2, 4, 5), 3, 1, "SAME", "NCHW"),
    "avg_same": ("avg", (2, 3, 5, 7), 3, 2, "SAME", "NCHW"),
    "avg_valid_nhwc": ("avg", (2, 6, 5, 3), 2, 2, "VALID", "NHWC"),
    "max_same_nhwc": ("max", (2, 7, 6, 2), 2, 2, "SAME", "NHWC"),
    # windows that tile the input: a split and transpose instead of a window view
    "max_tiles": ("max", (2, 3, 4, 6), 2, 2, "VALID", "NCHW"),
    "avg_tiles_nhwc": ("avg", (2, 6, 4, 3), (3, 2), (3, 2), "SAME", "NHWC"),
}


@pytest.mark.parametrize("name", sorted(POOL_CASES))
def test_pool2d_forward_and_gradients(name):
    kind, xs, k, strides, padding, fmt = POOL_CASES[name]
    rng = np.random.default_rng(len(name) + 11)
    x = rng.permutation(np.prod(xs)).reshape(xs).astype(np.float64) / 7.0  # distinct: no ties in max
    kk = [k, k] if isinstance(k, int) else list(k)
    st = [strides, strides] if isinstance(strides, int) else list(strides)
    x_cf_shape = xs if fmt == "NCHW" else (xs[0], xs[3], xs[1], xs[2])
    if padding == "SAME":
        p = [same_pads(x_cf_shape[2 + i], kk[i], st[i]) for i in range(2)]
        lo, hi = [a for a, _ in p], [b for _, b in p]
    elif padding == "VALID":
        lo, hi = [0, 0], [0, 0]
    else:
        lo, hi = [q[0] for q in padding[2:]], [q[1] for q in padding[2:]]
    fn = flow.nn.max_pool2d if kind == "max" else flow.nn.avg_pool2d

    def ref(a):
        a_cf = a if fmt == "NCHW" else a.transpose(0, 3, 1, 2)
        r = np_pool(a_cf, kk, st, lo, hi, kind)
        return r if fmt == "NCHW" else r.transpose(0, 2, 3, 1)
    check(f"pool_{name}", lambda a: fn(a, k, strides, padding, data_format=fmt), ref, [x], rtol=1e-5, atol=1e-7)


def test_pooling_layers_use_keras_defaults():
    x = np.random.default_rng(1).standard_normal((2, 6, 6, 3)).astype(np.float32)
    y = predict(lambda a: flow.layers.max_pooling2d(a, 2, 2), x)  # valid, channels_last
    ref = np_pool(x.transpose(0, 3, 1, 2).astype(np.float64), [2, 2], [2, 2], [0, 0], [0, 0], "max")
    np.testing.assert_allclose(y, ref.transpose(0, 2, 3, 1), rtol=1e-6)


# ---------------------------------------------------------------- layers

def test_conv2d_layer_variables_bias_and_activation_fuse():
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)

    @flow.global_function(type="predict")
    def job(a: tp.Numpy.Placeholder((2, 3, 8, 8))) -> tp.Numpy:
        return flow.layers.conv2d(a, 4, 3, padding="SAME", activation=flow.nn.relu, name="c1",
                                  kernel_initializer=flow.random_normal_initializer(seed=1),
                                  bias_initializer=flow.random_normal_initializer(seed=2))

    y = job(x)
    v = flow.get_all_variables()
    assert v["c1-weight"].shape == (4, 3, 3, 3) and v["c1-bias"].shape == (4,)
    ref = np_conv(x.astype(np.float64), np.asarray(v["c1-weight"], np.float64), [1, 1], [1, 1], [1, 1],
                  [1, 1], 1) + np.asarray(v["c1-bias"]).reshape(1, 4, 1, 1)
    np.testing.assert_allclose(y, np.maximum(ref, 0), rtol=1e-4, atol=1e-5)
    plan = job.compiled_jobs()[0].fusion_plan
    assert "_conv_add_relu:" in plan, plan  # conv, bias and relu in one kernel


def test_conv_relu_maxpool_is_two_kernels_and_matches_unfused(monkeypatch):
    x = np.random.default_rng(4).standard_normal((2, 3, 9, 9)).astype(np.float32)
    out = {}
    for fused in (True, False):
        if fused:
            monkeypatch.delenv("FLOWJIT_DISABLE_FUSION", raising=False)
        else:
            monkeypatch.setenv("FLOWJIT_DISABLE_FUSION", "1")
        flow.clear_default_session()

        @flow.global_function(type="predict")
        def job(a: tp.Numpy.Placeholder((2, 3, 9, 9))) -> tp.Numpy:
            c = flow.layers.conv2d(a, 5, 3, padding="SAME", activation=flow.nn.relu, name="c",
                                   kernel_initializer=flow.random_normal_initializer(seed=3),
                                   bias_initializer=flow.random_normal_initializer(seed=4))
            return flow.nn.max_pool2d(c, 2, 2, "SAME")
        out[fused] = job(x)
        out[fused, "k"] = job.compiled_jobs()[0].num_kernels
    assert out[True, "k"] == 2  # conv+bias+relu, then max-pool
    assert out[False, "k"] > 2
    np.testing.assert_allclose(out[True], out[False], rtol=1e-6, atol=1e-6)


def np_batch_norm(x, axis, gamma, beta, eps):
    axes = tuple(d for d in range(x.ndim) if d != axis)
    shape = [1] * x.ndim
    shape[axis] = -1
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma.reshape(shape) + beta.reshape(shape), mean, var


def test_batch_normalization_train_updates_moving_statistics_and_predict_uses_them():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 3, 5, 5)) * 2 + 1).astype(np.float32)

    @flow.global_function(type="train")
    def train(a: tp.Numpy.Placeholder((4, 3, 5, 5))) -> tp.Numpy:
        y = flow.layers.batch_normalization(a, axis=1, momentum=0.9, epsilon=1e-3, name="bn")
        loss = flow.math.reduce_mean(flow.math.square(y))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]), momentum=0).minimize(loss)
        return y

    @flow.global_function(type="predict")
    def infer(a: tp.Numpy.Placeholder((4, 3, 5, 5))) -> tp.Numpy:
        return flow.layers.batch_normalization(a, axis=1, momentum=0.9, epsilon=1e-3, name="bn")

    y = train(x)
    ref, mean, var = np_batch_norm(x.astype(np.float64), 1, np.ones(3), np.zeros(3), 1e-3)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    v = flow.get_all_variables()
    n = 4 * 5 * 5
    np.testing.assert_allclose(v["bn-moving_mean"], 0.1 * mean.ravel(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v["bn-moving_variance"], 0.9 + 0.1 * var.ravel() * n / (n - 1), rtol=1e-5)
    assert set(k for k in v if k.startswith("bn-")) == {"bn-gamma", "bn-beta", "bn-moving_mean",
                                                        "bn-moving_variance"}
    p = infer(x)
    mm, mv = np.asarray(v["bn-moving_mean"]), np.asarray(v["bn-moving_variance"])
    ref_p = (x - mm.reshape(1, 3, 1, 1)) / np.sqrt(mv.reshape(1, 3, 1, 1) + 1e-3)
    np.testing.assert_allclose(p, ref_p, rtol=1e-4, atol=1e-4)


def test_batch_normalization_gradient_matches_finite_differences():
    """d(sum(bn(x) * c))/dx in train mode, against float64 differences of numpy's formula."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 2, 3))
    c = rng.standard_normal(x.shape)
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64)

    @flow.global_function(type="train", function_config=cfg)
    def train(cc: tp.Numpy.Placeholder(x.shape, dtype=flow.float64)) -> tp.Numpy:
        a = flow.get_variable("x", shape=x.shape, dtype=flow.float64, initializer=flow.constant_initializer(0))
        y = flow.layers.batch_normalization(a, axis=-1, epsilon=1e-3, name="bn", trainable=False)
        loss = flow.math.reduce_sum(y * cc)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss

    train(c)
    flow.load_variables({"x": x})
    train(c)
    grad = x - np.asarray(flow.get_all_variables()["x"])

    def f(z):
        return np.sum(np_batch_norm(z, 3, np.ones(3), np.zeros(3), 1e-3)[0] * c)
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = 1e-6
        fd[i] = (f(x + e) - f(x - e)) / 2e-6
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)


def test_layer_norm_forward_and_gradient():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 4, 5))

    def ref(a):
        m = a.mean(axis=(1, 2), keepdims=True)
        return (a - m) / np.sqrt(a.var(axis=(1, 2), keepdims=True) + 1e-5)
    check("layer_norm", lambda a: flow.layers.layer_norm(a, begin_norm_axis=1, trainable=False, name="ln"),
          ref, [x], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- dropout

def test_dropout_masks_scale_change_per_step_and_repeat_across_sessions():
    x = np.ones((64, 50), np.float32)

    def make():
        @flow.global_function(type="train")
        def train(a: tp.Numpy.Placeholder((64, 50))) -> tp.Numpy:
            w = flow.get_variable("w", shape=(50,), initializer=flow.constant_initializer(1.0))
            y = flow.nn.dropout(a * w, rate=0.3, seed=7)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                               momentum=0).minimize(flow.math.reduce_sum(y))
            return y
        return train

    train = make()
    a, b = train(x), train(x)
    for y in (a, b):
        kept = y != 0
        assert 0.6 < kept.mean() < 0.8
        np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
    assert (a != b).any()  # a new mask every step
    flow.clear_default_session()
    train2 = make()
    np.testing.assert_array_equal(train2(x), a)  # the same seed and step: the same mask

    @flow.global_function(type="predict")
    def infer(a: tp.Numpy.Placeholder((64, 50))) -> tp.Numpy:
        return flow.nn.dropout(a, rate=0.3)
    np.testing.assert_array_equal(infer(x), x)


# ---------------------------------------------------------------- several devices

@pytest.mark.parametrize("devices", [2, 4])
def test_conv_bn_pool_train_step_on_several_devices_matches_one(devices):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((8, 2, 6, 6)).astype(np.float32)
    labels = rng.integers(0, 3, 8).astype(np.int32)

    def run(n):
        flow.clear_default_session()
        flow.config.cpu_device_num(n)

        @flow.global_function(type="train")
        def train(a: tp.Numpy.Placeholder((8, 2, 6, 6)), lab: tp.Numpy.Placeholder((8,), dtype=flow.int32)
                  ) -> tp.Numpy:
            init = flow.random_normal_initializer(stddev=0.3, seed=1)
            c = flow.layers.conv2d(a, 4, 3, padding="SAME", kernel_initializer=init, name="c")
            c = flow.nn.relu(flow.layers.batch_normalization(c, axis=1, name="bn"))
            p = flow.nn.avg_pool2d(flow.nn.max_pool2d(c, 2, 1, "SAME"), 2, 2, "VALID")
            logits = flow.layers.dense(flow.reshape(p, [8, -1]), 3, kernel_initializer=init, name="d")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(lab, logits)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
            return loss
        losses = [train(x, labels) for _ in range(3)]
        return losses, flow.get_all_variables()

    try:
        want_l, want_v = run(1)
        got_l, got_v = run(devices)
    finally:
        flow.clear_default_session()
        flow.config.cpu_device_num(1)
    for a, b in zip(got_l, want_l):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    for k in want_v:
        np.testing.assert_allclose(got_v[k], want_v[k], rtol=2e-5, atol=2e-6, err_msg=k)


# ---------------------------------------------------------------- errors

def _trace_error(body, shape=(2, 3, 8, 8)):
    @flow.global_function(type="predict")
    def job(a: tp.Numpy.Placeholder(shape)) -> tp.Numpy:
        return body(a)
    return lambda: job(np.zeros(shape, np.float32))


@pytest.mark.parametrize("body, exc, message", [
    (lambda a: flow.nn.conv2d(a, flow.ones((4, 3, 11, 3)), 1, "VALID"), ValueError,
     "conv: the kernel spans 11 positions along spatial dim 0 (extent 11, dilation 1) but the padded input "
     "has only 8 (8 + padding 0 + 0)"),
    (lambda a: flow.nn.conv2d(a, flow.ones((4, 1, 3, 3)), 1, "VALID", groups=2), ValueError,
     "conv2d: input channels (3) are not divisible by groups (2)"),
    (lambda a: flow.nn.conv2d(a, flow.ones((4, 3, 3, 3)), 1, "VALID", data_format="NCWH"), ValueError,
     "conv2d: data_format must be one of"),
    (lambda a: flow.nn.conv2d(flow.reshape(a, [2, 3, 64]), flow.ones((4, 3, 3)), 1, "VALID"), ValueError,
     "conv2d: input must have rank 4 (batch, channels and 2 spatial dims), got shape (2, 3, 64)"),
    (lambda a: flow.nn.conv2d(a, flow.ones((4, 3, 3, 3)), 1, "FULL"), ValueError,
     "conv2d: padding must be 'SAME', 'SAME_LOWER', 'SAME_UPPER', 'VALID' or explicit pads, got 'FULL'"),
    (lambda a: flow.nn.max_pool2d(a, 9, 1, "VALID"), ValueError,
     "max_pool2d: ksize 9 is larger than the padded input (8 + padding 0 + 0) along spatial dim 0"),
    (lambda a: flow.layers.conv2d(a, 4, 3, groups=2, name="bad"), ValueError,
     "conv2d 'bad': input channels (3) are not divisible by groups (2)"),
])
def test_errors_name_the_op_and_the_argument(body, exc, message):
    with pytest.raises(exc) as e:
        _trace_error(body)()
    assert message in str(e.value)
    assert "test_conv.py" in str(e.value)  # the user's source line


def test_dropout_rate_outside_range_is_an_error():
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))
        y = flow.nn.dropout(a * w, rate=1.0)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(
            flow.math.reduce_sum(y))
        return y
    with pytest.raises(ValueError, match=r"dropout: rate must be a number in \[0, 1\), got 1.0"):
        job(np.zeros((2, 3), np.float32))


# ---------------------------------------------------------------- a ResNet block

def _np_conv3x3_backward(x, w, dy):
    """Gradients of a stride-1, pad-1, 3x3 convolution."""
    w_t = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    dx = np_conv(dy, w_t, [1, 1], [1, 1], [1, 1], [1, 1], 1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    dw = np.zeros_like(w)
    for kh in range(3):
        for kw in range(3):
            dw[:, :, kh, kw] = np.einsum("nohw,nchw->oc", dy, xp[:, :, kh:kh + h, kw:kw + wd])
    return dx, dw


def _np_bn_forward(x, gamma, beta, eps):
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    var = x.var(axis=(0, 2, 3), keepdims=True)
    xhat = (x - mu) / np.sqrt(var + eps)
    return xhat * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1), (xhat, var)


def _np_bn_backward(dy, gamma, cache, eps):
    xhat, var = cache
    n = dy.shape[0] * dy.shape[2] * dy.shape[3]
    dxhat = dy * gamma.reshape(1, -1, 1, 1)
    s1 = dxhat.sum(axis=(0, 2, 3), keepdims=True)
    s2 = (dxhat * xhat).sum(axis=(0, 2, 3), keepdims=True)
    dx = (n * dxhat - s1 - xhat * s2) / (n * np.sqrt(var + eps))
    return dx, (dy * xhat).sum(axis=(0, 2, 3)), dy.sum(axis=(0, 2, 3))


def _np_resnet_block_step(p, x, c, lr, eps):
    """One SGD step of relu(bn2(conv2(relu(bn1(conv1(x))))) + x) with loss sum(out * c)."""
    z1 = np_conv(x, p["w1"], [1, 1], [1, 1], [1, 1], [1, 1], 1)
    b1, cache1 = _np_bn_forward(z1, p["g1"], p["b1"], eps)
    h1 = np.maximum(b1, 0)
    z2 = np_conv(h1, p["w2"], [1, 1], [1, 1], [1, 1], [1, 1], 1)
    b2, cache2 = _np_bn_forward(z2, p["g2"], p["b2"], eps)
    pre = b2 + x
    out = np.maximum(pre, 0)
    loss = np.sum(out * c)
    d = c * (pre > 0)
    dz2, dg2, db2 = _np_bn_backward(d, p["g2"], cache2, eps)
    dh1, dw2 = _np_conv3x3_backward(h1, p["w2"], dz2)
    dz1, dg1, db1 = _np_bn_backward(dh1 * (b1 > 0), p["g1"], cache1, eps)
    _, dw1 = _np_conv3x3_backward(x, p["w1"], dz1)
    grads = {"w1": dw1, "g1": dg1, "b1": db1, "w2": dw2, "g2": dg2, "b2": db2}
    return loss, {k: p[k] - lr * grads[k] for k in p}


def test_resnet_block_trains_like_a_float64_numpy_reference():
    """conv-BN-ReLU-conv-BN + residual, 64 channels, 3x3, three SGD steps."""
    rng = np.random.default_rng(10)
    shape, eps, lr = (2, 64, 5, 5), 1e-5, 2.0 ** -7  # exact in float32, as OneFlow keeps rates
    x = rng.standard_normal(shape)
    c = rng.standard_normal(shape)
    p = {"w1": rng.standard_normal((64, 64, 3, 3)) * 0.05, "w2": rng.standard_normal((64, 64, 3, 3)) * 0.05,
         "g1": 1 + 0.1 * rng.standard_normal(64), "b1": 0.1 * rng.standard_normal(64),
         "g2": 1 + 0.1 * rng.standard_normal(64), "b2": 0.1 * rng.standard_normal(64)}
    names = {"w1": "conv1-weight", "w2": "conv2-weight", "g1": "bn1-gamma", "b1": "bn1-beta",
             "g2": "bn2-gamma", "b2": "bn2-beta"}
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64)

    @flow.global_function(type="train", function_config=cfg)
    def train(a: tp.Numpy.Placeholder(shape, dtype=flow.float64),
              cc: tp.Numpy.Placeholder(shape, dtype=flow.float64)) -> tp.Numpy:
        h = flow.layers.conv2d(a, 64, 3, padding="SAME", use_bias=False, name="conv1")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, epsilon=eps, name="bn1"))
        h = flow.layers.conv2d(h, 64, 3, padding="SAME", use_bias=False, name="conv2")
        h = flow.layers.batch_normalization(h, axis=1, epsilon=eps, name="bn2")
        loss = flow.math.reduce_sum(flow.nn.relu(h + a) * cc)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0).minimize(loss)
        return loss

    train(x, c)  # creates the variables
    flow.load_variables({names[k]: v for k, v in p.items()})
    for step in range(3):
        want_loss, p = _np_resnet_block_step(p, x, c, lr, eps)
        got_loss = train(x, c)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-9, err_msg=f"loss of step {step}")
        got = flow.get_all_variables()
        for k, v in p.items():
            np.testing.assert_allclose(got[names[k]], v, rtol=1e-8, atol=1e-10, err_msg=f"{k} after step {step}")


def test_bias_add_batch_norm_inference_and_residual_fuse_into_the_conv():
    """nn.conv2d + nn.bias_add + predict-mode batch norm + residual + relu in
    the user's NCHW code: one convolution kernel with all of it as epilogue."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)

    @flow.global_function(type="predict")
    def job(a: tp.Numpy.Placeholder((2, 4, 6, 6)), k: tp.Numpy.Placeholder((4, 4, 3, 3))) -> tp.Numpy:
        bias = flow.get_variable("bias", shape=(4,), initializer=flow.random_normal_initializer(seed=5))
        y = flow.nn.bias_add(flow.nn.conv2d(a, k, 1, "SAME"), bias, data_format="NCHW")
        y = flow.layers.batch_normalization(y, axis=1, name="bn", training=False)
        return flow.nn.relu(y + a)

    got = job(x, w)
    v = flow.get_all_variables()
    ref = np_conv(x.astype(np.float64), w, [1, 1], [1, 1], [1, 1], [1, 1], 1) + \
        np.asarray(v["bias"]).reshape(1, 4, 1, 1)
    ref = (ref - 0.0) / np.sqrt(1.0 + 1e-3)  # fresh moving statistics: mean 0, variance 1
    np.testing.assert_allclose(got, np.maximum(ref + x, 0), rtol=1e-4, atol=1e-5)
    plan = job.compiled_jobs()[0].fusion_plan
    conv_kernels = [line for line in plan.splitlines() if "conv" in line.split(":")[0]]
    assert len(conv_kernels) == 1, plan
    assert "_conv_add_sub_rsqrt:" in plan, plan  # bias, then the normalization, in the conv epilogue
    assert job.compiled_jobs()[0].num_kernels <= 2, plan  # and at most a copy into the result
