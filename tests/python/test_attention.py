"""The attention kernel families (codegen/families/attention): scaled
dot-product attention with its softmax computed online, forward and
gradients against float64 numpy, causal and padding masks, sizes that cross
the kernels' key blocks, and the pass that forms it from the
matmul-softmax-matmul a transformer writes (jit/passes/attention)."""
import math

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


@pytest.fixture(autouse=True)
def fresh_session():
    flow.clear_default_session()
    yield
    flow.clear_default_session()


def rng(seed=0):
    return np.random.default_rng(seed)


def dt(a):
    return {np.dtype(np.float64): flow.double, np.dtype(np.int32): flow.int32}.get(a.dtype, flow.float)


def reference(q, k, v, bias, causal, scale):
    """Output and the pieces of the backward, in float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        s = s + bias.astype(np.float64)
    if causal:
        lq, lk = s.shape[-2:]
        s = np.where(np.arange(lk)[None, :] > np.arange(lq)[:, None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v, p


def reference_grads(q, k, v, bias, causal, scale, dy):
    out, p = reference(q, k, v, bias, causal, scale)
    dy = dy.astype(np.float64)
    dv = np.swapaxes(p, -1, -2) @ dy
    dp = dy @ np.swapaxes(v.astype(np.float64), -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ k.astype(np.float64) * scale
    dk = np.swapaxes(ds, -1, -2) @ q.astype(np.float64) * scale
    db = None
    if bias is not None:
        db = ds.sum(axis=tuple(range(ds.ndim - bias.ndim)))
        db = db.sum(axis=tuple(i for i, n in enumerate(bias.shape) if n == 1), keepdims=True)
    return dq, dk, dv, db


def sdpa_predict(q, k, v, mask=None, causal=False, scale=None):
    args = [q, k, v] + ([mask] if mask is not None else [])

    def body(*xs):
        return flow.nn.scaled_dot_product_attention(*xs[:3], attn_mask=xs[3] if len(xs) > 3 else None,
                                                    is_causal=causal, scale=scale)
    fn = {3: lambda a, b, c: body(a, b, c), 4: lambda a, b, c, m: body(a, b, c, m)}[len(args)]
    fn.__annotations__ = {n: tp.Numpy.Placeholder(x.shape, dtype=flow.bool if x.dtype == bool else dt(x))
                          for n, x in zip(["a", "b", "c", "m"], args)}
    fn.__annotations__["return"] = tp.Numpy
    fn.__name__ = "sdpa"
    job = flow.global_function()(fn)
    return job(*args), job


CASES = [  # batch dims, lq, lk, d, dv, causal, dtype
    ((2, 3), 37, 37, 8, 8, True, np.float32),
    ((2,), 70, 150, 5, 3, False, np.float32),   # several key blocks, odd head dims
    ((3,), 20, 9, 4, 6, True, np.float64),      # causal with lq > lk
    ((), 1, 130, 16, 16, False, np.float64),    # one query, rank-2 operands
]


def operands(r, batch, lq, lk, d, dv, dtype):
    """Random q, k, v of a case."""
    return tuple(r.standard_normal(batch + shape).astype(dtype) for shape in ((lq, d), (lk, d), (lk, dv)))


@pytest.mark.parametrize("batch,lq,lk,d,dv,causal,dtype", CASES)
def test_forward_matches_float64_numpy(batch, lq, lk, d, dv, causal, dtype):
    q, k, v = operands(rng(1), batch, lq, lk, d, dv, dtype)
    got, job = sdpa_predict(q, k, v, causal=causal)
    want, _ = reference(q, k, v, None, causal, 1 / math.sqrt(d))
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert got.dtype == dtype
    kernels = job.compiled_jobs()[0].as_text("kernels")
    assert "family attention" in kernels, kernels


def test_float_bias_and_bool_padding_mask():
    r = rng(2)
    B, H, T, D = 2, 2, 11, 4
    q, k, v = (r.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3))
    bias = r.standard_normal((T, T)).astype(np.float32)
    got, _ = sdpa_predict(q, k, v, bias, scale=0.3)
    np.testing.assert_allclose(got, reference(q, k, v, bias, False, 0.3)[0], rtol=2e-5, atol=2e-5)
    keep = np.ones((B, 1, 1, T), bool)
    keep[0, ..., 7:] = False
    keep[1, ..., 3:5] = False
    got, _ = sdpa_predict(q, k, v, keep, causal=True)
    want, _ = reference(q, k, v, np.where(keep, 0.0, -np.inf), True, 0.5)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def sgd_grads(q, k, v, bias, dy, causal, scale):
    """Gradients of sum(attention * dy) as variables' SGD steps (lr 1)."""
    names = ["q", "k", "v"] + (["bias"] if bias is not None else [])
    values = dict(zip(names, [q, k, v, bias]))

    def body(c: tp.Numpy.Placeholder(dy.shape, dtype=dt(dy))) -> tp.Numpy:
        w = [flow.get_variable(n, values[n].shape, dtype=dt(values[n]), initializer=flow.zeros_initializer())
             for n in names]
        y = flow.nn.scaled_dot_product_attention(w[0], w[1], w[2], attn_mask=w[3] if bias is not None else None,
                                                 is_causal=causal, scale=scale)
        loss = flow.math.reduce_sum(y * c)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return y
    job = flow.global_function(type="train")(body)
    flow.load_variables(values)
    out = job(dy)
    after = flow.get_all_variables()
    return out, [values[n] - np.array(after[n]) for n in names], job


@pytest.mark.parametrize("batch,lq,lk,d,dv,causal,dtype", CASES)
def test_gradients_match_float64_numpy(batch, lq, lk, d, dv, causal, dtype):
    r = rng(3)
    q, k, v = operands(r, batch, lq, lk, d, dv, dtype)
    bias = r.standard_normal((lq, lk)).astype(dtype)  # a learned bias: its gradient is summed over batch
    dy = r.standard_normal(batch + (lq, dv)).astype(dtype)
    scale = 0.7
    out, grads, job = sgd_grads(q, k, v, bias, dy, causal, scale)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(out, reference(q, k, v, bias, causal, scale)[0], rtol=tol, atol=tol)
    for got, want, what in zip(grads, reference_grads(q, k, v, bias, causal, scale, dy), "q k v bias".split()):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"d{what}")
    kernels = job.compiled_jobs()[0].as_text("kernels")
    for family in ("attention", "attention_grad"):
        assert f"family {family} " in kernels, kernels


def lm_attention(x, T, D, mask_rank, dropout=0.0):
    """examples/transformer_lm.py's attention over x [B, H, T, D]."""
    s = flow.math.multiply(flow.matmul(x, x * 0.5, transpose_b=True), 1.0 / math.sqrt(D))
    rows = flow.reshape(flow.range(T), [T, 1])
    cols = flow.reshape(flow.range(T), [1, T])
    bias = flow.math.multiply(flow.cast(flow.math.greater(cols, rows), flow.float32), -1e9)
    if mask_rank == 4:
        bias = flow.reshape(bias, [1, 1, T, T])
    p = flow.nn.softmax(flow.math.add(s, bias), axis=-1)
    if dropout:
        p = flow.nn.dropout(p, rate=dropout)
    return flow.matmul(p, x + 1.0)


@pytest.mark.parametrize("mask_rank", [2, 4])
def test_the_transformer_pattern_becomes_one_attention_kernel(mask_rank, monkeypatch):
    """With FLOWJIT_FUSE_ATTENTION=1 (the default fuses only score matrices
    of 256 MiB and more); the iota mask of -1e9 becomes the causal flag."""
    monkeypatch.setenv("FLOWJIT_FUSE_ATTENTION", "1")
    B, H, T, D = 2, 3, 19, 8
    x = rng(4).standard_normal((B, H, T, D)).astype(np.float32)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((B, H, T, D))) -> tp.Numpy:
        return lm_attention(x, T, D, mask_rank)
    got = job(x)
    bias = np.where(np.arange(T)[None, :] > np.arange(T)[:, None], -1e9, 0.0)
    want, _ = reference(x, x * 0.5, x + 1.0, bias, False, 1 / math.sqrt(D))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    kernels = job.compiled_jobs()[0].as_text("kernels")
    assert kernels.count("family attention ") == 1 and "softmax" not in kernels, kernels
    assert "causal" in job.compiled_jobs()[0].as_text("plan"), "the mask was not seen as causal"


@pytest.mark.parametrize("T,fused", [(16, False), (511, False), (512, True)])
def test_by_default_only_long_sequences_fuse(T, fused, monkeypatch):
    """512 keys a query and more: the attention family; fewer: the unfused
    matmuls, faster there (jit/passes/attention.h)."""
    monkeypatch.delenv("FLOWJIT_FUSE_ATTENTION", raising=False)
    B, H, D = 1, 1, 4
    x = rng(8).standard_normal((B, H, T, D)).astype(np.float32)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((B, H, T, D))) -> tp.Numpy:
        return lm_attention(x, T, D, 2)
    got = job(x)
    assert ("family attention" in job.compiled_jobs()[0].as_text("kernels")) == fused
    bias = np.where(np.arange(T)[None, :] > np.arange(T)[:, None], -1e9, 0.0)
    want, _ = reference(x, x * 0.5, x + 1.0, bias, False, 1 / math.sqrt(D))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_by_default_a_dropout_attention_fuses_only_when_much_longer(monkeypatch):
    """With dropout the kernels draw each number three times: at 512 keys the
    composition stays (jit/passes/attention.h, kLongDroppedScores)."""
    monkeypatch.delenv("FLOWJIT_FUSE_ATTENTION", raising=False)
    T, D = 512, 4

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((1, 1, T, D))) -> tp.Numpy:
        w = flow.get_variable("w", (D,), initializer=flow.ones_initializer())
        y = lm_attention(x * w, T, D, 2, dropout=0.1)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(flow.math.reduce_sum(y))
        return y
    job(rng(9).standard_normal((1, 1, T, D)).astype(np.float32))
    assert "family attention" not in job.compiled_jobs()[0].as_text("kernels")


def test_the_pattern_trains_like_the_composition(monkeypatch):
    """One SGD step of a weight in front of the transformer's attention gives
    the same weight fused and unfused."""
    B, H, T, D = 2, 2, 70, 8
    x = rng(7).standard_normal((B, H, T, D)).astype(np.float32)

    def step(mode):
        monkeypatch.setenv("FLOWJIT_FUSE_ATTENTION", mode)
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((B, H, T, D))) -> tp.Numpy:
            w = flow.get_variable("w", (D,), initializer=flow.ones_initializer())
            y = lm_attention(x * w, T, D, 4)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(
                flow.math.reduce_sum(y * y))
            return y
        y = job(x)
        fused = "family attention" in job.compiled_jobs()[0].as_text("kernels")
        return y, np.array(flow.get_all_variables()["w"]), fused
    y1, w1, f1 = step("1")
    y0, w0, f0 = step("0")
    assert f1 and not f0
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w1, w0, rtol=1e-4, atol=1e-5)
    assert np.abs(w1 - 1).max() > 1e-3  # the step moved the weight


def test_scores_used_twice_stay_unfused(monkeypatch):
    monkeypatch.setenv("FLOWJIT_FUSE_ATTENTION", "1")
    B, H, T, D = 1, 2, 6, 4
    x = rng(5).standard_normal((B, H, T, D)).astype(np.float32)

    @flow.global_function()
    def twice(x: tp.Numpy.Placeholder((B, H, T, D))) -> tp.Numpy:
        p = flow.nn.softmax(flow.matmul(x, x, transpose_b=True))
        return flow.matmul(p, x) + flow.math.reduce_sum(p, axis=-1, keepdims=True)
    want, p = reference(x, x, x, None, False, 1.0)
    np.testing.assert_allclose(twice(x), want + p.sum(-1, keepdims=True), rtol=2e-5, atol=2e-5)
    assert "family attention" not in twice.compiled_jobs()[0].as_text("kernels")


@pytest.mark.parametrize("causal, T, dtype", [(True, 70, np.float32), (False, 37, np.float64)])
def test_dropout_in_the_kernels_trains_like_the_composition(causal, T, dtype, monkeypatch):
    """flow.nn.dropout between the softmax and the second matmul fuses into
    the attention kernels, which draw flow.nn.dropout's own mask: two SGD
    steps (a new mask each) of weights on q, k, v and a learned bias give
    what the unfused composition gives, and so does
    scaled_dot_product_attention(dropout_p=...)."""
    B, H, D = 2, 3, 8
    x = rng(11).standard_normal((B, H, T, D)).astype(dtype)
    fdt = dt(x)

    def run(mode, sdpa):
        monkeypatch.setenv("FLOWJIT_FUSE_ATTENTION", mode)
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((B, H, T, D), dtype=fdt)) -> tp.Numpy:
            w = [flow.get_variable(f"w{i}", (D,), dtype=fdt, initializer=flow.ones_initializer())
                 for i in range(3)]
            bias = flow.get_variable("bias", (1, H, 1, T), dtype=fdt, initializer=flow.zeros_initializer())
            q, k, v = x * w[0], x * w[1] * 0.5, x * w[2] + 1.0
            if sdpa:
                y = flow.nn.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.3,
                                                         is_causal=causal, scale=0.35)
            else:
                if causal:  # the mask in the bias (the pattern takes one bias)
                    rows = flow.reshape(flow.range(T), [T, 1])
                    cols = flow.reshape(flow.range(T), [1, T])
                    bias = bias + flow.math.multiply(flow.cast(flow.math.greater(cols, rows), fdt), -1e9)
                s = flow.math.multiply(flow.matmul(q, k, transpose_b=True), 0.35) + bias
                y = flow.matmul(flow.nn.dropout(flow.nn.softmax(s), rate=0.3), v)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]), momentum=0).minimize(
                flow.math.reduce_sum(y * y))
            return y
        ys = [job(x) for _ in range(2)]
        fused = "family attention" in job.compiled_jobs()[0].as_text("kernels")
        return ys, flow.get_all_variables(), fused
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    y0, v0, f0 = run("0", False)
    assert not f0
    assert not np.allclose(y0[0], y0[1], atol=1e-2)  # a new mask (and weights) each step
    for mode, sdpa in (("1", False), ("0", True)):
        y1, v1, f1 = run(mode, sdpa)
        assert f1
        for a, b in zip(y1, y0):
            np.testing.assert_allclose(a, b, **tol)
        for name in ("w0", "w1", "w2", "bias"):
            np.testing.assert_allclose(np.array(v1[name]), np.array(v0[name]), **tol)
            assert np.abs(np.array(v1[name]) - (name != "bias")).max() > 1e-4, name  # it moved


@pytest.mark.parametrize("fill", [float("-inf"), -10000.0])
def test_oneflow_gpt_attention_fuses(fill, monkeypatch):
    """OneFlow's GPT writes its attention as
    fused_self_attention_query_mul_key_and_value (matmul with alpha),
    fused_scale_tril_softmax_dropout (a second scale, the causal where,
    softmax, dropout) and a matmul: one attention op, causal, with the two
    scales multiplied and the dropout in the kernels; training matches the
    composition."""
    S, N, H, HS = 40, 2, 3, 4
    h = rng(12).standard_normal((S, N, H * 3 * HS)).astype(np.float32)

    def run(mode):
        monkeypatch.setenv("FLOWJIT_FUSE_ATTENTION", mode)
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(h: tp.Numpy.Placeholder((S, N, H * 3 * HS))) -> tp.Numpy:
            w = flow.get_variable("w", (H * 3 * HS,), initializer=flow.ones_initializer())
            qmk, v = flow.nn.fused_self_attention_query_mul_key_and_value(h * w, HS, alpha=0.5)
            p = flow.math.fused_scale_tril_softmax_dropout(qmk, diagonal=0, fill_value=fill, scale=0.8,
                                                           rate=0.2)
            y = flow.matmul(p, v)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]), momentum=0).minimize(
                flow.math.reduce_sum(y * y))
            return y
        ys = [job(h) for _ in range(2)]
        return ys, np.array(flow.get_all_variables()["w"]), job.compiled_jobs()[0].as_text("plan")
    y0, w0, k0 = run("0")
    y1, w1, k1 = run("1")
    assert "attention of" not in k0
    assert "causal, dropout 0.2" in k1
    for a, b in zip(y1, y0):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w1, w0, rtol=1e-4, atol=1e-4)
    assert np.abs(w1 - 1).max() > 1e-4


def test_dropout_statistics_in_the_kernel():
    """With q = k = 0 every probability is 1 / Lk, and v the identity reads
    out z / Lk: each weight is dropped (0) or kept and scaled by
    1 / (1 - p), dropped at rate p, and each step draws a new mask."""
    B, L, p = 4, 96, 0.3
    q = np.zeros((B, L, L), np.float32)
    eye = np.broadcast_to(np.eye(L, dtype=np.float32), (B, L, L)).copy()

    @flow.global_function(type="train")
    def job(q: tp.Numpy.Placeholder((B, L, L)), v: tp.Numpy.Placeholder((B, L, L))) -> tp.Numpy:
        w = flow.get_variable("w", (L,), initializer=flow.ones_initializer())
        y = flow.nn.scaled_dot_product_attention(q * w, q, v, dropout_p=p)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(flow.math.reduce_sum(y))
        return y
    z1, z2 = job(q, eye) * L, job(q, eye) * L
    assert "family attention" in job.compiled_jobs()[0].as_text("kernels")
    for z in (z1, z2):
        kept = np.isclose(z, 1 / (1 - p), rtol=1e-5)
        assert (kept | (z == 0)).all()
        assert abs(1 - kept.mean() - p) < 0.02, kept.mean()
    assert (z1 != z2).mean() > 0.3  # about 2 p (1 - p) of the weights differ


def test_bad_operands_are_clear_errors():
    q = np.zeros((2, 5, 4), np.float32)
    with pytest.raises(ValueError, match="scaled_dot_product_attention: expected query"):
        sdpa_predict(q, np.zeros((2, 5, 3), np.float32), q)
    with pytest.raises(ValueError, match="attn_mask of shape"):
        sdpa_predict(q, q, q, np.zeros((3, 5), np.float32))
    with pytest.raises(TypeError, match="floating-point"):
        sdpa_predict(q.astype(np.int32), q, q)


@pytest.mark.parametrize("dropout", [0.0, 0.25])
def test_data_parallel_attention_over_two_devices_matches_one(dropout):
    """The batch split over 2 devices (jit/distribute: attention splits along
    q's batch dim, a bias of extent 1 there stays whole; with dropout every
    device computes the whole, so the mask is the one device's)."""
    x = rng(9).standard_normal((8, 2, 12, 4)).astype(np.float32)
    keep = np.ones((8, 1, 1, 12), bool)
    keep[::3, ..., 9:] = False

    def train(devices):
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)
        cfg = flow.function_config()
        cfg.default_logical_view(flow.scope.consistent_view())

        @flow.global_function(type="train", function_config=cfg)
        def job(x: tp.Numpy.Placeholder((8, 2, 12, 4)),
                m: tp.Numpy.Placeholder((8, 1, 1, 12), dtype=flow.bool)) -> tp.Numpy:
            w = flow.get_variable("w", (4, 4), initializer=flow.random_normal_initializer(seed=5))
            q = flow.matmul(x, w)
            y = flow.nn.scaled_dot_product_attention(q, x, x * 2.0, attn_mask=m, is_causal=True,
                                                     dropout_p=dropout)
            loss = flow.math.reduce_mean(y * y)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
            return loss

        losses = [job(x, keep) for _ in range(3)]
        if not dropout:
            assert losses[2] < losses[0]  # it trains
        return np.array(losses), np.array(flow.get_all_variables()["w"])

    try:
        (l1, w1), (l2, w2) = train(1), train(2)
    finally:
        flow.config.cpu_device_num(1)
    np.testing.assert_allclose(l2, l1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w2, w1, rtol=1e-5, atol=1e-6)


def test_dropout_trains_in_the_kernels_and_predict_ignores_it():
    x = rng(10).standard_normal((2, 6, 4)).astype(np.float32)

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 6, 4))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.ones_initializer())
        y = flow.nn.scaled_dot_product_attention(x * w, x, x, dropout_p=0.5, is_causal=True)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(flow.math.reduce_sum(y))
        return y
    y = train(x)
    assert "family attention" in train.compiled_jobs()[0].as_text("kernels")
    assert np.isfinite(y).all()
    assert not np.allclose(y, reference(x, x, x, None, True, 0.5)[0], atol=1e-3)  # some weights dropped
    # the first query sees only the first key: kept (scaled by 2) or dropped
    assert np.all(np.isclose(y[:, 0], 2 * x[:, 0], atol=1e-5) | np.isclose(y[:, 0], 0, atol=1e-6))

    flow.clear_default_session()

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((2, 6, 4))) -> tp.Numpy:
        return flow.nn.scaled_dot_product_attention(x, x, x, dropout_p=0.5, is_causal=True)
    np.testing.assert_allclose(predict(x), reference(x, x, x, None, True, 0.5)[0], rtol=2e-5, atol=2e-5)
