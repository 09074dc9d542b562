"""OneFlow's remaining lazy nn / layers names ([conformance]): conv2d with a
bias, compat_conv2d, transposed convolutions, the functional normalizations,
GroupNorm / InstanceNorm, upsample_2d, PixelShuffle, the margin losses,
softmax_cross_entropy_with_logits' gradient, the fused ops and
random_mask_like.

References are float64 numpy written here; flowjit's gradients (one SGD step
at learning rate 1 in a train job) are checked against central finite
differences of those references."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from test_conv import np_conv


def _make_job(name, kind, specs, body):
    """A float64 job `name` with one placeholder per (arg, shape, dtype) in specs."""
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64)
    ns = {"_body": body, "tp": tp}
    params = []
    for i, (arg, shape, dt) in enumerate(specs):
        ns[f"_a{i}"] = tp.Numpy.Placeholder(tuple(shape), dtype=dt)
        params.append(f"{arg}: _a{i}")
    args = ", ".join(a for a, _, _ in specs)
    exec(f"def {name}({', '.join(params)}) -> tp.Numpy:\n    return _body({args})\n", ns)  # noqa: S102
    return flow.global_function(type=kind, function_config=cfg)(ns[name])


def autodiff_gradients(name, f, inputs, consts, c, wrt=None):
    """(loss, {i: gradient of sum(f * c)}) for the inputs in `wrt` (all when
    None), which are variables of a train job (the others placeholders)."""
    wrt = list(range(len(inputs))) if wrt is None else list(wrt)
    var_names = {i: f"{name}_x{i}" for i in wrt}
    fed = [i for i in range(len(inputs)) if i not in var_names]
    specs = ([(f"x{i}", inputs[i].shape, flow.float64) for i in fed]
             + [(f"k{j}", k.shape, flow.float64) for j, k in enumerate(consts)] + [("c", c.shape, flow.float64)])

    def body(*args):
        fed_blobs = dict(zip(fed, args[:len(fed)]))
        ks, cc = args[len(fed):-1], args[-1]
        xs = [fed_blobs[i] if i in fed_blobs else
              flow.get_variable(var_names[i], shape=inputs[i].shape, dtype=flow.float64,
                                initializer=flow.constant_initializer(0.5))
              for i in range(len(inputs))]
        loss = flow.math.reduce_sum(f(*xs, *ks) * cc)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss

    train = _make_job(f"train_{name}", "train", specs, body)
    args = [inputs[i] for i in fed] + list(consts) + [c]
    train(*args)  # creates the variables
    flow.load_variables({var_names[i]: inputs[i] for i in wrt})
    loss = train(*args)
    after = flow.get_all_variables()
    return float(np.sum(loss)), {i: inputs[i] - np.asarray(after[var_names[i]]) for i in wrt}


def check(name, f, ref, inputs, consts=(), h=1e-6, rtol=1e-6, atol=1e-8, each=True):
    """f's forward against numpy `ref`, and the gradients of sum(f * c) against
    central differences of sum(ref * c)."""
    del each
    inputs = [np.ascontiguousarray(x, dtype=np.float64) for x in inputs]
    consts = [np.ascontiguousarray(k, dtype=np.float64) for k in consts]
    expected = np.asarray(ref(*inputs, *consts), dtype=np.float64)
    c = np.random.default_rng(len(name)).standard_normal(expected.shape)
    loss, grads = autodiff_gradients(name, f, inputs, consts, c)
    np.testing.assert_allclose(loss, float(np.sum(expected * c)), rtol=1e-9, atol=1e-12, err_msg=f"{name}: forward")
    for i, x in enumerate(inputs):
        fd = np.zeros_like(x)
        for j in np.ndindex(x.shape):
            xp, xm = list(inputs), list(inputs)
            xp[i], xm[i] = x.copy(), x.copy()
            xp[i][j] += h
            xm[i][j] -= h
            fd[j] = (np.sum(ref(*xp, *consts) * c) - np.sum(ref(*xm, *consts) * c)) / (2 * h)
        scale = max(1.0, float(np.abs(fd).max()))
        np.testing.assert_allclose(grads[i], fd, rtol=rtol, atol=atol * scale, err_msg=f"{name}: gradient {i}")


def predict64(fn, *arrays):
    """fn over float64 placeholders shaped like `arrays`, in a predict job."""
    specs = [(f"a{i}", a.shape, flow.float64) for i, a in enumerate(arrays)]
    return _make_job("predict_case", "predict", specs, fn)(*[np.asarray(a, np.float64) for a in arrays])


def rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- convolutions

def test_conv2d_bias_forward_and_gradients():
    r = rng(1)
    x, w, b = r.standard_normal((2, 4, 6, 5)), r.standard_normal((6, 2, 3, 3)), r.standard_normal(6)

    def ref(x, w, b):
        return np_conv(x, w, [1, 2], [1, 0], [1, 1], [1, 1], 2) + b[None, :, None, None]
    check("conv2d_bias", lambda x, w, b: flow.nn.conv2d(x, w, [1, 2], [[0, 0], [0, 0], [1, 1], [0, 1]], bias=b,
                                                        groups=2), ref, [x, w, b])


def test_conv2d_bias_nhwc_positional():
    r = rng(2)
    x, w, b = r.standard_normal((1, 5, 5, 3)), r.standard_normal((4, 3, 3, 3)), r.standard_normal(4)
    y = predict64(lambda x, w, b: flow.nn.conv2d(x, w, 1, "VALID", b, "NHWC"), x, w, b)
    ref = np_conv(x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), [1, 1], [0, 0], [0, 0], [1, 1], 1)
    np.testing.assert_allclose(y, (ref + b[None, :, None, None]).transpose(0, 2, 3, 1), rtol=1e-12, atol=1e-12)


def test_compat_conv2d_same_pads_after():
    r = rng(3)
    x, w = r.standard_normal((1, 2, 6, 6)), r.standard_normal((3, 2, 2, 2))
    y = predict64(lambda x, w: flow.nn.compat_conv2d(x, w, 2, "same"), x, w)
    # TensorFlow's SAME: 6 -> 3 outputs need (3 - 1) * 2 + 2 - 6 = 0 pads here; a
    # stride 1 case needs one, placed after.
    np.testing.assert_allclose(y, np_conv(x, w, [2, 2], [0, 0], [0, 0], [1, 1], 1), rtol=1e-12, atol=1e-12)
    y1 = predict64(lambda x, w: flow.nn.compat_conv2d(x, w, 1, "SAME"), x, w)
    np.testing.assert_allclose(y1, np_conv(x, w, [1, 1], [0, 0], [1, 1], [1, 1], 1), rtol=1e-12, atol=1e-12)


def np_deconv(x, w, s, d, pb, out):
    """Transposed convolution, channels first: out[o] += x[i] w[k] for o = i s + k d - pb."""
    n, _, h, wd = x.shape
    _, co, kh, kw = w.shape
    y = np.zeros((n, co, out[0], out[1]))
    for i in range(h):
        for j in range(wd):
            for a in range(kh):
                for b in range(kw):
                    oh, ow = i * s[0] + a * d[0] - pb[0], j * s[1] + b * d[1] - pb[1]
                    if 0 <= oh < out[0] and 0 <= ow < out[1]:
                        y[:, :, oh, ow] += x[:, :, i, j] @ w[:, :, a, b]
    return y


@pytest.mark.parametrize("padding,out,pb,dil", [("VALID", (9, 11), (0, 0), 1), ("SAME", (8, 10), (0, 0), 1),
                                                ("VALID", (10, 12), (0, 0), 1), ("SAME", (7, 9), (1, 1), 1),
                                                ("VALID", (11, 13), (0, 0), 2)])
def test_conv2d_transpose_matches_numpy_with_gradients(padding, out, pb, dil):
    r = rng(4)
    x, w = r.standard_normal((2, 3, 4, 5)), r.standard_normal((3, 2, 3, 3))
    check(f"deconv_{padding}_{out[0]}_{dil}",
          lambda a, b: flow.nn.conv2d_transpose(a, b, output_shape=(2, 2) + out, strides=2, padding=padding,
                                                dilations=dil),
          lambda a, b: np_deconv(a, b, (2, 2), (dil, dil), pb, out), [x, w])


def test_conv2d_transpose_nhwc():
    r = rng(5)
    x, w = r.standard_normal((1, 3, 4, 2)), r.standard_normal((2, 3, 3, 5))  # (Ci, kh, kw, Co)
    y = predict64(lambda a, b: flow.nn.conv2d_transpose(input=a, filters=b, output_shape=(1, 7, 9, 5),
                                                        strides=2, padding="VALID", data_format="NHWC"), x, w)
    ref = np_deconv(x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), (2, 2), (1, 1), (0, 0), (7, 9))
    np.testing.assert_allclose(y, ref.transpose(0, 2, 3, 1), rtol=1e-12, atol=1e-12)


def test_torch_conv2d_transpose_padding_and_output_padding():
    r = rng(6)
    x, w = r.standard_normal((1, 2, 3, 3)), r.standard_normal((2, 3, 3, 3))
    # torch: padding 1 (padding_needed 2), output_padding 1 -> (3 - 1) * 2 - 2 + 3 + 1 = 6
    y = predict64(lambda a, b: flow.nn.torch_conv2d_transpose(a, b, output_padding=(1, 1), strides=2,
                                                              padding_needed=(2, 2)), x, w)
    np.testing.assert_allclose(y, np_deconv(x, w, (2, 2), (1, 1), (1, 1), (6, 6)), rtol=1e-12, atol=1e-12)
    # more padding than the filter reaches: the spread input itself is cut
    x6 = r.standard_normal((1, 2, 6, 6))  # out (6 - 1) - 6 + 3 = 2
    y2 = predict64(lambda a, b: flow.nn.torch_conv2d_transpose(a, b, strides=1, padding_needed=(6, 6)), x6, w)
    np.testing.assert_allclose(y2, np_deconv(x6, w, (1, 1), (1, 1), (3, 3), (2, 2)), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- losses

def test_margin_ranking_loss():
    r = rng(7)
    a, b = r.standard_normal((4, 3)), r.standard_normal((4, 3))
    t = np.sign(r.standard_normal((4, 3)))
    check("margin_ranking", lambda a, b, t: flow.nn.MarginRankingLoss(a, b, t, margin=0.3, reduction="none"),
          lambda a, b, t: np.maximum(0.3 - t * (a - b), 0), [a, b], consts=[t])
    y = predict64(lambda a, b, t: flow.nn.MarginRankingLoss(a, b, t, margin=0.3), a, b, t)
    np.testing.assert_allclose(y, np.maximum(0.3 - t * (a - b), 0).mean(), rtol=1e-12)


@pytest.mark.parametrize("p,swap", [(2.0, False), (1.5, True)])
def test_triplet_margin_loss(p, swap):
    r = rng(8)
    a, pos, neg = r.random((3, 4)), r.random((3, 4)), r.random((3, 4))

    def dist(x, y):
        return (np.abs(x - y + 1e-6) ** p).sum(-1) ** (1 / p)

    def ref(a, pos, neg):
        d2 = dist(a, neg)
        if swap:
            d2 = np.minimum(d2, dist(pos, neg))
        return np.maximum(1.0 + dist(a, pos) - d2, 0)
    check(f"triplet_{int(p * 10)}_{swap}", lambda a, pos, neg: flow.nn.TripletMarginLoss(a, pos, neg, p=p, swap=swap,
                                                                               reduction="none"),
          ref, [a, pos, neg], h=1e-7, rtol=1e-5)
    s = predict64(lambda a, pos, neg: flow.nn.TripletMarginLoss(a, pos, neg, p=p, swap=swap, reduction="sum"),
                  a, pos, neg)
    np.testing.assert_allclose(s, ref(a, pos, neg).sum(), rtol=1e-12)


def test_softmax_cross_entropy_gradient_is_softmax_minus_labels():
    r = rng(9)
    x, labels = r.standard_normal((3, 5)), r.random((3, 5))  # rows do not sum to 1
    c = r.standard_normal(3)
    loss, g = autodiff_gradients("sce", lambda x, l: flow.nn.softmax_cross_entropy_with_logits(l, x),
                                 [x, labels], [], c, wrt=[0])
    p = np.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(loss, (-(labels * np.log(p)).sum(1) * c).sum(), rtol=1e-12)
    np.testing.assert_allclose(g[0], (p - labels) * c[:, None], rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- normalization

def test_functional_batch_normalization():
    r = rng(10)
    x = r.standard_normal((2, 3, 4))
    m, v, o, s = r.standard_normal(3), r.random(3) + 0.5, r.standard_normal(3), r.standard_normal(3)

    def ref(x, m, v, o, s):
        return (x - m[:, None]) / np.sqrt(v[:, None] + 1e-3) * s[:, None] + o[:, None]
    check("nn_batch_norm", lambda x, m, v, o, s: flow.nn.batch_normalization(x, m, v, o, s, 1e-3, axis=1),
          ref, [x, m, v, o, s], each=False)


def np_layer_norm(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def test_functional_layer_norm():
    r = rng(11)
    x, g, b = r.standard_normal((2, 3, 4)), r.standard_normal((3, 4)), r.standard_normal((3, 4))
    check("nn_layer_norm", lambda x, g, b: flow.nn.layer_norm(x, g, b, begin_norm_axis=1, begin_params_axis=1),
          lambda x, g, b: np_layer_norm(x, (1, 2), 1e-5) * g + b, [x, g, b], each=False)
    y = predict64(lambda x: flow.nn.layer_norm(x, begin_norm_axis=-1), x)
    np.testing.assert_allclose(y, np_layer_norm(x, (2,), 1e-5), rtol=1e-10, atol=1e-12)


def test_group_and_instance_norm():
    r = rng(12)
    x = r.standard_normal((2, 4, 3, 3))
    y = predict64(lambda x: flow.nn.GroupNorm(x, num_groups=2, eps=1e-5), x)
    ref = np_layer_norm(x.reshape(2, 2, -1), (2,), 1e-5).reshape(x.shape)
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-12)
    y2 = predict64(lambda x: flow.nn.InstanceNorm2d(x, affine=False), x)
    np.testing.assert_allclose(y2, np_layer_norm(x, (2, 3), 1e-5), rtol=1e-10, atol=1e-12)
    x1 = r.standard_normal((2, 3, 5))
    y1 = predict64(lambda x: flow.nn.InstanceNorm1d(x), x1)
    np.testing.assert_allclose(y1, np_layer_norm(x1, (2,), 1e-5), rtol=1e-10, atol=1e-12)


def test_layer_norm_grad_functions_match_autodiff():
    r = rng(13)
    x, dy = r.standard_normal((3, 5)), r.standard_normal((3, 5))
    mean = x.mean(1)
    inv = 1 / np.sqrt(x.var(1) + 1e-5)
    dx = predict64(lambda dy, x, m, iv: flow.layers.layer_norm_grad(dy, x, m, iv, begin_norm_axis=1),
                   dy, x, mean, inv)
    # the gradient of sum(layer_norm(x) * dy), from autodiff
    _, g = autodiff_gradients("ln_grad", lambda x, d: flow.nn.layer_norm(x, begin_norm_axis=1), [x, dy], [],
                              dy, wrt=[0])
    np.testing.assert_allclose(dx, g[0], rtol=1e-9, atol=1e-12)
    gamma = r.standard_normal(5)
    norm = np_layer_norm(x, (1,), 1e-5)
    job = _make_job("ln_param_grad", "predict", [("a", dy.shape, flow.float64), ("b", norm.shape, flow.float64),
                                                 ("c", gamma.shape, flow.float64)],
                    lambda a, b, c: flow.layers.layer_norm_param_grad(a, b, c, begin_params_axis=1)[2])
    np.testing.assert_allclose(job(dy, norm, gamma), (dy * norm).sum(0), rtol=1e-12)


# ---------------------------------------------------------------- resampling

def np_bilinear_matrix(n, s, align):
    m = n * s
    a = np.zeros((m, n))
    for o in range(m):
        src = o * (n - 1) / (m - 1) if align else max((o + 0.5) / s - 0.5, 0)
        lo = min(int(np.floor(src)), n - 1)
        hi = min(lo + 1, n - 1)
        a[o, lo] += 1 - (src - lo)
        a[o, hi] += src - lo
    return a


@pytest.mark.parametrize("interp,align,fmt", [("nearest", False, "NCHW"), ("bilinear", False, "NHWC"),
                                              ("bilinear", True, "NCHW")])
def test_upsample_2d(interp, align, fmt):
    r = rng(14)
    x = r.standard_normal((1, 2, 3, 4))

    def ref(x):
        if interp == "nearest":
            y = x.repeat(2, axis=2).repeat(3, axis=3)
        else:
            y = np.einsum("oh,nchw,pw->ncop", np_bilinear_matrix(3, 2, align), x, np_bilinear_matrix(4, 3, align))
        return y if fmt == "NCHW" else y.transpose(0, 2, 3, 1)
    xin = x if fmt == "NCHW" else x.transpose(0, 2, 3, 1)
    check(f"upsample_{interp}_{align}_{fmt}",
          lambda a: flow.layers.upsample_2d(a, size=(2, 3), align_corners=align, data_format=fmt,
                                            interpolation=interp),
          lambda a: ref(a if fmt == "NCHW" else a.transpose(0, 3, 1, 2)), [xin])


def test_pixel_shuffle():
    x = np.arange(2 * 12 * 2 * 3, dtype=np.float64).reshape(2, 12, 2, 3)
    y = predict64(lambda a: flow.nn.PixelShufflev2(a, 2, 3), x)
    ref = x.reshape(2, 2, 2, 3, 2, 3).transpose(0, 1, 4, 2, 5, 3).reshape(2, 2, 4, 9)
    np.testing.assert_array_equal(y, ref)
    assert y[0, 0, 1, 2] == x[0, 1 * 3 + 2, 0, 0]  # channel i * w + j -> pixel (i, j)
    x4 = x[:, :8]
    np.testing.assert_array_equal(predict64(lambda a: flow.nn.PixelShuffle(a, 2), x4),
                                  x4.reshape(2, 2, 2, 2, 2, 3).transpose(0, 1, 4, 2, 5, 3).reshape(2, 2, 4, 6))


# ---------------------------------------------------------------- fused ops

def test_fused_bias_add_gelu_and_scale_tril():
    import math  # noqa: PLC0415
    erf = np.vectorize(math.erf)
    r = rng(15)
    x, b = r.standard_normal((2, 3, 4)), r.standard_normal(3)
    y = predict64(lambda x, b: flow.nn.fused_bias_add_gelu(x, b, data_format="NCHW"), x, b)
    z = x + b[None, :, None]
    np.testing.assert_allclose(y, 0.5 * z * (1 + erf(z / np.sqrt(2))), rtol=1e-10, atol=1e-12)
    check("fused_scale_tril", lambda x: flow.nn.fused_scale_tril(x, diagonal=1, fill_value=-3.0, scale=0.5),
          lambda x: np.where(np.tril(np.ones((3, 4)), 1) > 0, x * 0.5, -3.0), [x])


def test_softmax_grad_and_self_attention():
    r = rng(16)
    logits, dy = r.standard_normal((3, 5)), r.standard_normal((3, 5))
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = predict64(lambda y, d: flow.nn.softmax_grad(y, d), p, dy)
    np.testing.assert_allclose(g, p * (dy - (dy * p).sum(1, keepdims=True)), rtol=1e-12, atol=1e-14)
    s, n, heads, hs = 4, 2, 3, 2
    h = r.standard_normal((s, n, heads * 3 * hs))
    qmk = predict64(lambda h: flow.nn.fused_self_attention_query_mul_key_and_value(h, hs, alpha=0.5)[0], h)
    hh = h.reshape(s, n, heads, 3 * hs)
    q, k = (hh[..., i * hs:(i + 1) * hs].transpose(1, 2, 0, 3) for i in range(2))
    np.testing.assert_allclose(qmk, 0.5 * q @ k.transpose(0, 1, 3, 2), rtol=1e-12, atol=1e-12)


def test_random_mask_like_rate_and_new_masks():
    @flow.global_function()
    def mask_job(x: tp.Numpy.Placeholder((200, 100))) -> tp.Numpy:
        return flow.nn.random_mask_like(x, rate=0.3, seed=7)

    x = np.zeros((200, 100), np.float32)
    m1, m2 = mask_job(x), mask_job(x)
    assert m1.dtype == np.int8 and set(np.unique(m1)) <= {0, 1}
    assert abs(1 - m1.mean() - 0.3) < 0.02
    assert not np.array_equal(m1, m2)  # every run draws new numbers


def test_fused_bias_add_dropout_matches_dropout_with_the_same_seed():
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64)

    @flow.global_function(type="train", function_config=cfg)
    def drop_job(x: tp.Numpy.Placeholder((4, 3, 5), dtype=flow.float64),
                 b: tp.Numpy.Placeholder((3,), dtype=flow.float64)) -> tp.Numpy:
        v = flow.get_variable("fbd_v", shape=(1,), dtype=flow.float64, initializer=flow.zeros_initializer())
        xv = x + v
        y1 = flow.nn.fused_bias_add_dropout(xv, b, data_format="NCHW", rate=0.5, seed=3)
        y2 = flow.nn.dropout(flow.nn.bias_add(xv, b, data_format="NCHW"), rate=0.5, seed=3)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]), momentum=0).minimize(
            flow.math.reduce_sum(y1 + y2))
        return flow.concat([y1, y2], axis=0)

    x = rng(17).random((4, 3, 5)) + 1
    out = drop_job(x, np.ones(3))
    np.testing.assert_array_equal(out[:4], out[4:])
    assert 0 < np.count_nonzero(out[:4]) < out[:4].size


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("fn,exc,text", [
    (lambda a: flow.nn.conv2d(a, flow.ones((4, 3, 3, 3), dtype=flow.float64), 1, "VALID",
                              bias=flow.ones((3,), dtype=flow.float64)), ValueError, "bias must have shape (4,)"),
    (lambda a: flow.nn.conv2d_transpose(a, flow.ones((3, 2, 3, 3), dtype=flow.float64), output_shape=(2, 2, 5, 5),
                                        strides=2), ValueError, "a VALID convolution of an output of extent 5"),
    (lambda a: flow.nn.conv2d_transpose(a, flow.ones((3, 2, 3, 3), dtype=flow.float64)), ValueError,
     "output_shape must list 4 extents"),
    (lambda a: flow.layers.upsample_2d(a, interpolation="bicubic"), ValueError, "'nearest' or 'bilinear'"),
    (lambda a: flow.nn.GroupNorm(a, num_groups=2), ValueError, "divisor of the 3 channels"),
    (lambda a: flow.nn.PixelShufflev2(a, 2, 2), ValueError, "not divisible by"),
])
def test_errors(fn, exc, text):
    with pytest.raises(exc, match=None) as info:
        predict64(fn, np.zeros((2, 3, 4, 4)))
    assert text in str(info.value)


# ---------------------------------------------------------------- CTC

def np_ctc(lp, targets, in_len, tgt_len, blank):
    """-log p(target | lp) per sample, by the alpha recursion over probabilities."""
    losses = []
    for b in range(lp.shape[1]):
        ext = [blank]
        for t in targets[b, :tgt_len[b]]:
            ext += [int(t), blank]
        p = np.exp(lp[:in_len[b], b])
        a = np.zeros(len(ext))
        a[0] = p[0, ext[0]]
        if len(ext) > 1:
            a[1] = p[0, ext[1]]
        for t in range(1, in_len[b]):
            prev = a.copy()
            for s in range(len(ext)):
                v = prev[s] + (prev[s - 1] if s > 0 else 0)
                if s > 1 and ext[s] != ext[s - 2]:
                    v += prev[s - 2]
                a[s] = v * p[t, ext[s]]
        total = a[-1] + (a[-2] if len(ext) > 1 else 0)
        losses.append(-np.log(total) if total > 0 else np.inf)
    return np.array(losses)


def _ctc_job(name, shape, n, s, fn):
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64)
    grads = {}

    def body(x, t, a, b):
        v = flow.get_variable(f"{name}_v", shape=shape, dtype=flow.float64, initializer=flow.zeros_initializer())
        xv = x + v
        flow.watch_diff(xv, lambda g: grads.setdefault("g", np.array(g)))
        loss = fn(xv, t, a, b)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]), momentum=0).minimize(loss)
        return loss
    job = _make_job(name, "train", [("x", shape, flow.float64), ("t", (n, s), flow.int32),
                                    ("a", (n,), flow.int32), ("b", (n,), flow.int32)], body)
    return job, grads


@pytest.mark.parametrize("reduction,zero_infinity", [("none", False), ("mean", True), ("sum", False)])
def test_ctc_loss_matches_numpy_with_oneflows_gradient(reduction, zero_infinity):
    r = rng(18)
    T, n, c, s = 7, 3, 4, 3
    logits = r.standard_normal((T, n, c))
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    targets = np.array([[1, 2, 2], [3, 1, 0], [1, 1, 1]], np.int32)
    in_len = np.array([7, 5, 4], np.int32)
    tgt_len = np.array([3, 2, 3], np.int32)  # sample 2 needs 5 steps for 1 _ 1 _ 1: impossible in 4
    job, grads = _ctc_job(f"ctc_{reduction}", lp.shape, n, s,
                          lambda x, t, a, b: flow.ctc_loss(x, t, a, b, blank=0, reduction=reduction,
                                                           zero_infinity=zero_infinity))
    out = np.asarray(job(lp, targets, in_len, tgt_len)).ravel()
    ref = np_ctc(lp, targets, in_len, tgt_len, 0)
    assert np.isinf(ref[2])
    if zero_infinity:
        ref[2] = 0.0
    weights = np.ones(n) if reduction != "mean" else 1.0 / np.maximum(tgt_len, 1) / n
    want = {"none": ref, "mean": [np.sum(ref * weights)], "sum": [ref.sum()]}[reduction]
    np.testing.assert_allclose(out, want, rtol=1e-9)
    g = grads["g"]
    # OneFlow's gradient: exp(log_probs) - posterior over a sample's steps (the
    # gradient with respect to logits under log_softmax), 0 after its end.
    h = 1e-6
    for b in (0, 1):
        fd = np.zeros((T, c))
        for t in range(T):
            for k in range(c):
                lpp, lpm = lp.copy(), lp.copy()
                lpp[t, b, k] += h
                lpm[t, b, k] -= h
                fd[t, k] = (np_ctc(lpp, targets, in_len, tgt_len, 0)[b] - np_ctc(lpm, targets, in_len, tgt_len, 0)[b]) / (2 * h)
        want_g = (fd + np.exp(lp[:, b]) * (np.arange(T) < in_len[b])[:, None]) * weights[b]
        np.testing.assert_allclose(g[:, b], want_g, rtol=1e-5, atol=1e-7)
    if zero_infinity:
        assert np.all(g[:, 2] == 0)
    else:
        assert np.all(np.isnan(g[:4, 2])) and np.all(g[4:, 2] == 0)


def test_ctc_greedy_decoder():
    lp = np.log(np.full((6, 2, 4), 0.1))
    best = np.array([[1, 1, 3, 1, 2, 2], [3, 2, 2, 0, 3, 1]])  # class 3 is the blank
    for t in range(6):
        for b in range(2):
            lp[t, b, best[b, t]] = np.log(0.7)
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64)

    @flow.global_function(function_config=cfg)
    def greedy(x: tp.Numpy.Placeholder((6, 2, 4), dtype=flow.float64),
               n: tp.Numpy.Placeholder((2,), dtype=flow.int64)) -> tp.Numpy:
        return flow.concat(list(flow.nn.ctc_greedy_decoder(x, n, merge_repeated=True)[:1]), axis=0)

    dec = greedy(lp, np.array([6, 4], np.int64))
    assert dec.dtype == np.int64
    np.testing.assert_array_equal(dec, [[1, 1, 2, 0, 0, 0], [2, 0, 0, 0, 0, 0]])

    @flow.global_function(function_config=cfg)
    def greedy_all(x: tp.Numpy.Placeholder((6, 2, 4), dtype=flow.float64),
                   n: tp.Numpy.Placeholder((2,), dtype=flow.int64)) -> tp.Numpy:
        d, s = flow.nn.ctc_greedy_decoder(x, n, merge_repeated=False)
        return flow.concat([flow.cast(d, flow.float64), s], axis=1)

    out = greedy_all(lp, np.array([6, 4], np.int64))
    np.testing.assert_array_equal(out[:, :6], [[1, 1, 1, 2, 2, 0], [2, 2, 0, 0, 0, 0]])
    np.testing.assert_allclose(out[:, 6], [-6 * np.log(0.7), -4 * np.log(0.7)], rtol=1e-12)
