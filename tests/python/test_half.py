"""float16 and bfloat16 ([amp]): the dtypes through placeholders, casts, ops,
results and checkpoints, and OneFlow's automatic mixed precision.

References: numpy float32 computed on the half-rounded inputs, its result
rounded to the half type (float16 through numpy, bfloat16 through ml_dtypes).
flowjit computes each fused chain in float32 and rounds once when it stores,
so it may differ from the reference by the rounding of the stored result:
  float16: rtol 2e-3 (2^-9), bfloat16: rtol 1.6e-2 (2^-6), atol 1e-3 / 1e-2.
Casts and values passed through unchanged are compared bit for bit.
"""
import ml_dtypes
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from flowjit import optimizer as opt

# The references cast out-of-range and NaN values on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning",
                                        "ignore:invalid value encountered in cast:RuntimeWarning")
HALF = [(flow.float16, np.dtype(np.float16)), (flow.bfloat16, np.dtype(ml_dtypes.bfloat16))]
IDS = ["float16", "bfloat16"]
TOL = {"float16": dict(rtol=2e-3, atol=1e-3), "bfloat16": dict(rtol=1.6e-2, atol=1e-2)}


def predict(body, *arrays, ret=tp.Numpy):
    """Runs body on placeholders of the arrays' shapes and dtypes."""
    flow.clear_default_session()
    dts = {np.dtype(np.float16): flow.float16, np.dtype(ml_dtypes.bfloat16): flow.bfloat16,
           np.dtype(np.float32): flow.float32, np.dtype(np.float64): flow.float64,
           np.dtype(np.int32): flow.int32, np.dtype(np.int64): flow.int64}
    params = [tp.Numpy.Placeholder(a.shape, dtype=dts[a.dtype]) for a in arrays]

    if len(arrays) == 1:
        def job(x: params[0]) -> ret:
            return body(x)
    elif len(arrays) == 2:
        def job(x: params[0], y: params[1]) -> ret:
            return body(x, y)
    else:
        raise AssertionError("one or two arrays")
    return flow.global_function(type="predict")(job)(*arrays)


def special_floats():
    """Values that exercise rounding: ties, subnormals, overflow, NaN, signed zeros."""
    v = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 65504.0, 65519.9, 65520.0, 1e6, 1e-8, 6e-8,
         3e-8, 2.0 ** -24, 2.0 ** -25, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8,
         1.0 + 3 * 2.0 ** -8, 3.4e38, 3.39e38, 1e-39, 1e-45, 0.1, 1 / 3, -2.5e-5]
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.array(v, np.float32), bits.view(np.float32)])


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    # Every NaN is as good as any other NaN; everything else bit for bit.
    nan = np.isnan(a.astype(np.float32))
    np.testing.assert_array_equal(nan, np.isnan(b.astype(np.float32)))
    np.testing.assert_array_equal(a[~nan].view(np.uint16), b[~nan].view(np.uint16))


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_cast_from_float32_rounds_as_numpy(fdt, ndt):
    x = special_floats()
    same_bits(predict(lambda a: flow.cast(a, fdt), x), x.astype(ndt))


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_half_to_float32_and_back_is_exact(fdt, ndt):
    h = special_floats().astype(ndt)
    got = predict(lambda a: flow.cast(a, flow.float32), h)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(h.astype(np.float32)))
    ok = ~np.isnan(got)
    np.testing.assert_array_equal(got[ok].view(np.uint32), h.astype(np.float32)[ok].view(np.uint32))
    same_bits(predict(lambda a: flow.cast(flow.cast(a, flow.float32), fdt), h), h)
    same_bits(predict(lambda a: flow.identity(a), h), h)


def test_float64_to_float16_rounds_once():
    # 1 + 2^-11 + 2^-40 is just above a tie: rounding through float32 would
    # give the tie and round down to 1; numpy's direct conversion rounds up.
    x = np.array([1 + 2.0 ** -11 + 2.0 ** -40, -(1 + 2.0 ** -11 + 2.0 ** -40), 1e300, 1e-300])
    same_bits(predict(lambda a: flow.cast(a, flow.float16), x), x.astype(np.float16))


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_integer_casts(fdt, ndt):
    i = np.array([0, 1, -7, 255, 2049, 70000, -(2 ** 31)], np.int32)
    same_bits(predict(lambda a: flow.cast(a, fdt), i), i.astype(np.float32).astype(ndt))
    h = np.array([0.5, -1.5, 2.5, 300.0, -0.0, 7.9], ndt)
    got = predict(lambda a: flow.cast(a, flow.int32), h)
    np.testing.assert_array_equal(got, np.trunc(h.astype(np.float32)).astype(np.int32))


UNARY = {
    "exp": (flow.math.exp, np.exp), "log": (flow.math.log, np.log), "sqrt": (flow.math.sqrt, np.sqrt),
    "tanh": (flow.math.tanh, np.tanh), "sigmoid": (flow.math.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
    "relu": (flow.nn.relu, lambda v: np.maximum(v, 0)), "neg": (flow.math.negative, np.negative),
    "abs": (flow.math.abs, np.abs), "square": (flow.math.square, np.square),
}


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, fdt, ndt):
    f, ref = UNARY[op]
    x = np.random.default_rng(1).uniform(0.05, 4, (7, 33)).astype(ndt)
    if op in ("neg", "abs", "relu", "tanh", "sigmoid"):
        x = (x.astype(np.float32) - 2).astype(ndt)
    got = predict(f, x)
    assert got.dtype == ndt and got.shape == x.shape
    want = ref(x.astype(np.float32)).astype(ndt)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), **TOL[ndt.name])


BINARY = {"add": (flow.math.add, np.add), "sub": (flow.math.subtract, np.subtract),
          "mul": (flow.math.multiply, np.multiply), "div": (flow.math.divide, np.divide),
          "maximum": (flow.math.maximum, np.maximum), "minimum": (flow.math.minimum, np.minimum)}


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_with_broadcast(op, fdt, ndt):
    f, ref = BINARY[op]
    rng = np.random.default_rng(2)
    x = rng.uniform(-3, 3, (5, 17)).astype(ndt)
    y = rng.uniform(0.5, 3, (17,)).astype(ndt)
    got = predict(f, x, y)
    assert got.dtype == ndt
    want = ref(x.astype(np.float32), y.astype(np.float32)).astype(ndt)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), **TOL[ndt.name])


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_reductions_accumulate_in_float32(fdt, ndt):
    # 4096 ones: a float16 accumulator stops at 2048 (2048 + 1 rounds to 2048).
    ones = np.ones((3, 4096), ndt)
    got = predict(lambda a: flow.math.reduce_sum(a, axis=1), ones)
    assert got.dtype == ndt
    np.testing.assert_array_equal(got.astype(np.float32), [4096, 4096, 4096])
    x = np.random.default_rng(3).uniform(-2, 2, (9, 1000)).astype(ndt)
    xf = x.astype(np.float32)
    for f, ref in ((lambda a: flow.math.reduce_mean(a, axis=1), lambda v: v.mean(1)),
                   (lambda a: flow.math.reduce_max(a, axis=1), lambda v: v.max(1)),
                   (lambda a: flow.math.reduce_min(a, axis=0), lambda v: v.min(0))):
        np.testing.assert_allclose(predict(f, x).astype(np.float32), ref(xf).astype(ndt).astype(np.float32),
                                   **TOL[ndt.name])


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_matmul_and_softmax(fdt, ndt):
    rng = np.random.default_rng(4)
    a = rng.uniform(-1, 1, (33, 70)).astype(ndt)
    b = rng.uniform(-1, 1, (70, 17)).astype(ndt)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(ndt).astype(np.float32)
    got = predict(lambda x, y: flow.matmul(x, y), a, b)
    assert got.dtype == ndt
    np.testing.assert_allclose(got.astype(np.float32), want, **TOL[ndt.name])
    got = predict(lambda x, y: flow.matmul(x, y, transpose_b=True), a, np.ascontiguousarray(b.T))
    np.testing.assert_allclose(got.astype(np.float32), want, **TOL[ndt.name])
    sm = predict(lambda x: flow.nn.softmax(x), a)
    e = np.exp(a.astype(np.float32) - a.astype(np.float32).max(1, keepdims=True))
    np.testing.assert_allclose(sm.astype(np.float32), (e / e.sum(1, keepdims=True)), **TOL[ndt.name])


# bfloat16 matmuls run on the host's vdpbf16ps (AVX512-BF16) micro-kernel
# where it has one, else as float32 matmuls behind conversions; either way
# the float32 sum of each output is rounded to bfloat16 once. Bound per
# element: half a bfloat16 ulp of the exact result (2^-9 of it) for that
# rounding, plus k float32 roundings of the sum's magnitudes (|a| @ |b|).
BF16_MATMULS = flow._C.build_info()["bf16_matmuls"]


@pytest.mark.parametrize("m,n,k,ta,tb", [
    (1, 1, 1, False, False), (5, 17, 1, True, False), (13, 33, 3, False, True),
    (12, 32, 2, True, True), (100, 136, 73, False, True), (37, 45, 73, True, False),
    (64, 200, 2051, False, False), (257, 100, 1025, True, True)])
def test_bfloat16_matmuls_round_the_float32_sum_once(m, n, k, ta, tb):
    bf = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(m * 1000 + k)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(bf)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(bf)
    got = predict(lambda x, y: flow.matmul(x, y, transpose_a=ta, transpose_b=tb), a, b)
    assert got.dtype == bf and got.shape == (m, n)
    A, B = a.astype(np.float64), b.astype(np.float64)
    A, B = (A.T if ta else A), (B.T if tb else B)
    exact = A @ B
    bound = np.abs(exact) * 2.0 ** -8 + k * 2.0 ** -23 * (np.abs(A) @ np.abs(B)) + 1e-30
    err = np.abs(got.astype(np.float64) - exact)
    assert (err <= bound).all(), (err / bound).max()


def test_bfloat16_batched_matmul_with_an_epilogue_and_special_values():
    bf = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(11)
    a = rng.standard_normal((3, 20, 70)).astype(bf)
    b = rng.standard_normal((3, 70, 40)).astype(bf)
    a[0, 3, 5] = np.nan      # row 3 of batch 0: NaN
    a[1, 7, 9] = np.inf      # times a zero column of b: NaN in that one column
    b[1, 9, :] = 0
    b[1, 9, 11] = 2.0        # ... and +inf in column 11
    bias = rng.standard_normal((40,)).astype(bf)

    flow.clear_default_session()

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder(a.shape, dtype=flow.bfloat16),
            y: tp.Numpy.Placeholder(b.shape, dtype=flow.bfloat16),
            c: tp.Numpy.Placeholder(bias.shape, dtype=flow.bfloat16)) -> tp.Numpy:
        return flow.nn.relu(flow.matmul(x, y) + c)
    got = job(a, b, bias).astype(np.float64)
    with np.errstate(invalid="ignore"):
        prod = np.matmul(a.astype(np.float64), b.astype(np.float64))
    mm = prod.astype(np.float32).astype(bf).astype(np.float64)  # the matmul's value, bfloat16
    want = np.maximum(mm + bias.astype(np.float64), 0)
    assert np.isnan(got[0, 3]).all() and not np.isnan(np.delete(got[0], 3, axis=0)).any()
    assert np.isposinf(got[1, 7, 11]) and np.isnan(np.delete(got[1, 7], 11)).all()
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=2 ** -7, atol=0.05)


def test_bfloat16_matmul_kernel_follows_the_host():
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def mm(x: tp.Numpy.Placeholder((48, 64), dtype=flow.bfloat16),
           y: tp.Numpy.Placeholder((64, 96), dtype=flow.bfloat16)) -> tp.Numpy:
        return flow.matmul(x, y)

    compiled = mm.compile()
    asm = compiled.as_text("assembly")
    assert ("vdpbf16ps" in asm) == BF16_MATMULS, BF16_MATMULS
    # Without the instructions the matmul kernel reads float32 conversions.
    kept = "matmul(%x, %y) {transpose_a=false, transpose_b=false} : bf16[48,96]"
    assert (kept in compiled.as_text("optimized")) == BF16_MATMULS


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_conv2d(fdt, ndt):
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (2, 3, 9, 9)).astype(ndt)
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(ndt)
    got = predict(lambda a, b: flow.nn.conv2d(a, b, strides=1, padding="SAME"), x, w)
    assert got.dtype == ndt and got.shape == (2, 4, 9, 9)
    got32 = predict(lambda a, b: flow.nn.conv2d(a, b, strides=1, padding="SAME"),
                    x.astype(np.float32), w.astype(np.float32))
    np.testing.assert_allclose(got.astype(np.float32), got32.astype(ndt).astype(np.float32),
                               **TOL[ndt.name])


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_data_movement_is_exact(fdt, ndt):
    x = special_floats()[:60].astype(ndt).reshape(6, 10)
    same_bits(predict(lambda a: flow.transpose(a, perm=[1, 0]), x), x.T.copy())
    same_bits(predict(lambda a: flow.concat([a, a], axis=0), x), np.concatenate([x, x]))
    same_bits(predict(lambda a: flow.reshape(a, [3, 20]), x), x.reshape(3, 20))
    idx = np.array([5, 0, 3], np.int32)
    same_bits(predict(lambda a, i: flow.gather(a, i), x, idx), x[idx])


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_half_variables_train_and_checkpoint(tmp_path, fdt, ndt):
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 4), dtype=fdt)) -> tp.Numpy:
        w = flow.get_variable("hw", shape=(4, 3), dtype=fdt, initializer=flow.ones_initializer())
        loss = flow.math.reduce_mean(flow.math.square(flow.matmul(x, w)))
        opt.SGD(0.01, momentum=0).minimize(loss)
        return loss

    x = np.random.default_rng(6).uniform(-1, 1, (8, 4)).astype(ndt)
    l0 = job(x)
    assert l0.dtype == ndt
    for _ in range(20):
        last = job(x)
    assert float(last.astype(np.float32).item()) < float(l0.astype(np.float32).item())
    w = flow.get_all_variables()["hw"].numpy()
    assert w.dtype == ndt and not np.all(w.astype(np.float32) == 1)
    ckpt = flow.train.CheckPoint()
    ckpt.save(str(tmp_path / "ck"))
    meta = (tmp_path / "ck" / "hw" / "meta").read_text()
    assert meta.endswith("data_type: kFloat16\n" if fdt is flow.float16 else "data_type: kBFloat16\n")
    flow.load_variables({"hw": np.zeros((4, 3), ndt)})
    ckpt.load(str(tmp_path / "ck"))
    same_bits(flow.get_all_variables()["hw"].numpy(), w)


def test_placeholder_dtype_mismatch_is_named():
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((3,), dtype=flow.bfloat16)) -> tp.Numpy:
        return x + x

    with pytest.raises(TypeError, match=r"bfloat16"):
        job(np.ones(3, np.float16))
    np.testing.assert_array_equal(job(np.ones(3, ml_dtypes.bfloat16)).astype(np.float32), [2, 2, 2])


# ---------------------------------------------------------------- automatic mixed precision

def _mlp_jobs(amp_dtype, loss_scale=None):
    flow.clear_default_session()
    cfg = flow.function_config()
    if amp_dtype is not None:
        cfg.enable_auto_mixed_precision(True, dtype=amp_dtype)

    @flow.global_function(type="train", function_config=cfg)
    def train(x: tp.Numpy.Placeholder((64, 20)), y: tp.Numpy.Placeholder((64,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 32, activation=flow.nn.relu, name="h",
                              kernel_initializer=flow.random_normal_initializer(stddev=0.3, seed=1))
        logits = flow.layers.dense(h, 3, name="o",
                                   kernel_initializer=flow.random_normal_initializer(stddev=0.3, seed=2))
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        kw = {} if loss_scale is None else {"loss_scale_policy": loss_scale}
        opt.SGD(0.2, momentum=0.9, **kw).minimize(loss)
        return loss

    return train


def _data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 20)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1).astype(np.int32)
    return x, y


@pytest.mark.parametrize("amp", [flow.bfloat16, flow.float16], ids=["bfloat16", "float16"])
def test_amp_trains_like_float32_with_float32_master_weights(amp):
    x, y = _data()
    ref = _mlp_jobs(None)
    ref_losses = [float(ref(x, y).mean()) for _ in range(60)]
    job = _mlp_jobs(amp)
    losses = [float(job(x, y).mean()) for _ in range(60)]
    assert losses[-1] < 0.5 * losses[0]
    assert abs(losses[-1] - ref_losses[-1]) < 0.05 + 0.1 * ref_losses[-1]
    for name, v in flow.get_all_variables().items():
        assert v.numpy().dtype in (np.float32, np.int64), name
    text = job.compile().as_text("optimized")
    half = "bf16" if amp is flow.bfloat16 else "f16"
    assert f"{{dtype={half}}}" in text  # the casts the pass inserted


def test_amp_keeps_losses_and_reductions_in_float32():
    flow.clear_default_session()
    cfg = flow.function_config()
    cfg.enable_auto_mixed_precision(True)

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.Numpy.Placeholder((4, 8)), w: tp.Numpy.Placeholder((8, 5))) -> tp.Numpy:
        return flow.math.reduce_sum(flow.nn.softmax(flow.matmul(x, w) + 1.0), axis=1)

    rng = np.random.default_rng(8)
    x, w = rng.normal(size=(4, 8)).astype(np.float32), rng.normal(size=(8, 5)).astype(np.float32)
    got = job(x, w)
    assert got.dtype == np.float32  # results keep their dtype
    np.testing.assert_allclose(got, np.ones(4), rtol=1e-6)  # softmax normalised in float32
    text = job.compile().as_text("optimized")
    assert "matmul" in text and "{dtype=bf16}" in text


def test_amp_float16_dynamic_loss_scale_skips_overflowing_steps():
    """A loss scale of 2^40 overflows float16's gradients: the first steps
    are skipped (weights unchanged) and the scale halves each time until the
    gradients are finite again."""
    x, y = _data()
    job = _mlp_jobs(flow.float16, opt.loss_scale.dynamic_loss_scale(
        initial_loss_scale=2.0 ** 40, increment_period=1000, multiplier=2.0))
    job(x, y)
    w0 = flow.get_all_variables()["h-weight"].numpy().copy()
    scale = flow.get_all_variables()[opt.LOSS_SCALE_VARIABLE].numpy()[0]
    assert scale < 2.0 ** 40  # the first step overflowed
    job(x, y)
    w1 = flow.get_all_variables()["h-weight"].numpy()
    new_scale = flow.get_all_variables()[opt.LOSS_SCALE_VARIABLE].numpy()[0]
    if new_scale < scale:
        np.testing.assert_array_equal(w1, w0)  # a skipped step changes no weight
    for _ in range(40):
        job(x, y)
    final = flow.get_all_variables()[opt.LOSS_SCALE_VARIABLE].numpy()[0]
    assert final <= 2.0 ** 24  # float16 gradients are finite from here on
    assert not np.array_equal(flow.get_all_variables()["h-weight"].numpy(), w0)


@pytest.mark.parametrize("fdt,ndt", HALF, ids=IDS)
def test_a_cast_out_of_a_half_type_reads_the_rounded_value(fdt, ndt):
    """A fused reduction or chain holds its half result in a float32
    register; a cast to float32 in the same kernel must still see the value
    the half type holds (what OneFlow's fp16 reduce_sum tests compare)."""
    x = np.random.default_rng(9).uniform(0, 1, (4, 67)).astype(ndt)
    got = predict(lambda a: flow.cast(flow.math.reduce_sum(a * 1.5, axis=1), flow.float32), x)
    want = (x.astype(np.float32) * 1.5).astype(ndt).astype(np.float32).sum(1).astype(ndt).astype(np.float32)
    np.testing.assert_array_equal(got.astype(ndt).astype(np.float32), got)  # representable in the half type
    np.testing.assert_allclose(got, want, **TOL[ndt.name])
