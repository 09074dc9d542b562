"""flowjit.onnx.export: the seed MLP, LeNet and the transformer LM as ONNX
models that pass onnx.checker and give, in ONNX Runtime, flowjit's outputs
within float32 tolerance; every op rule against flowjit on the same inputs;
dtypes, names and the error for an op without a mapping."""
import inspect
import os
import sys
import typing
from pathlib import Path
from typing import Tuple

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from flowjit import _C
from flowjit._ops import builders as _ops

onnx = pytest.importorskip("onnx", reason="onnx is a test requirement (tools/dev.sh installs it)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a test requirement (tools/dev.sh installs it)")
import flowjit.onnx as fo  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
K = _C.OpKind
F32 = dict(rtol=1e-5, atol=1e-5)  # float32 tolerance: ONNX Runtime sums in another order


def session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def run_onnx(model, *args):
    s = session(model)
    return s.run(None, {i.name: a for i, a in zip(s.get_inputs(), args)})


def assert_same(job, *args, tol=F32, **export_args):
    """Exports `job`, runs the model in ONNX Runtime and compares each output
    with the job's own (same dtype and shape; floats within `tol`)."""
    model = fo.export(job, **export_args)
    got = run_onnx(model, *args)
    ref = job(*args)
    ref = list(ref) if isinstance(ref, tuple) else [ref]
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert (g.dtype, g.shape) == (r.dtype, r.shape), (i, g.dtype, r.dtype, g.shape, r.shape)
        if np.issubdtype(r.dtype, np.floating):
            np.testing.assert_allclose(g, r, err_msg=f"output {i}", **tol)
        else:
            np.testing.assert_array_equal(g, r, err_msg=f"output {i}")
    return model


def op_types(model):
    return {n.op_type for n in model.graph.node}


# ---------------------------------------------------------------- the three models

def test_seed_mlp(rng, tmp_path):
    import train_mnist as seed
    images = rng.random((seed.BATCH_SIZE, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, seed.BATCH_SIZE).astype(np.int32)
    for _ in range(3):
        seed.train_job(images, labels)
    path = tmp_path / "mlp.onnx"
    model = fo.export(seed.eval_job, path)
    loaded = onnx.load(str(path))
    onnx.checker.check_model(loaded, full_check=True)
    assert loaded.opset_import[0].version >= 17
    (inp,), (out,) = loaded.graph.input, loaded.graph.output
    assert inp.name == "images" and [d.dim_value for d in inp.type.tensor_type.shape.dim] == [100, 1, 28, 28]
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert out.type.tensor_type.elem_type == onnx.TensorProto.INT32
    # The variables are initializers with their trained values.
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in loaded.graph.initializer}
    trained = flow.get_all_variables()
    for name in ("hidden-weight", "hidden-bias", "output-weight", "output-bias"):
        np.testing.assert_array_equal(inits[name], trained[name])
    np.testing.assert_array_equal(run_onnx(model, images)[0], seed.eval_job(images))
    # The train job's forward: its loss before the next update.
    train_model = fo.export(seed.train_job)
    assert [i.name for i in train_model.graph.input] == ["images", "labels"]
    assert [o.name for o in train_model.graph.output] == ["softmax_loss"]
    got = run_onnx(train_model, images, labels)[0]
    np.testing.assert_allclose(got, seed.train_job(images, labels), rtol=1e-5, atol=1e-4)


def test_lenet(rng):
    import lenet_train
    train_job = lenet_train.define_jobs("sgd")

    @flow.global_function(type="predict")
    def lenet_logits(images: tp.Numpy.Placeholder((100, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return lenet_train.lenet(images)

    @flow.global_function(type="predict")
    def lenet_loss(images: tp.Numpy.Placeholder((100, 1, 28, 28), dtype=flow.float),
                   labels: tp.Numpy.Placeholder((100,), dtype=flow.int32)) -> tp.Numpy:
        return flow.nn.sparse_softmax_cross_entropy_with_logits(labels, lenet_train.lenet(images))

    images = rng.random((100, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, 100).astype(np.int32)
    train_job(images, labels)
    model = assert_same(lenet_logits, images, tol=dict(rtol=1e-4, atol=1e-4))
    assert {"Conv", "Gemm", "ReduceMax", "Relu"} <= op_types(model)
    assert_same(lenet_train.define_eval(), images)
    # The train job's forward is the predict graph: its dropout is the identity.
    train_model = fo.export(train_job)
    assert "RandomUniform" not in op_types(train_model)
    np.testing.assert_allclose(run_onnx(train_model, images, labels)[0], lenet_loss(images, labels),
                               rtol=1e-4, atol=1e-4)


def test_transformer_lm(rng):
    import transformer_lm as lm
    cfg = lm.Config(batch=2, context=16, width=32, heads=2, layers=2, steps=10, warmup=1)
    train_job, eval_job = lm.make_jobs(cfg)
    tokens = rng.integers(0, lm.VOCAB, (cfg.batch, cfg.context)).astype(np.int32)
    targets = rng.integers(0, lm.VOCAB, (cfg.batch, cfg.context)).astype(np.int32)
    train_job(tokens, targets)
    train_job(tokens, targets)
    model = assert_same(eval_job, tokens, targets)
    assert {"Gather", "MatMul", "Softmax", "Erf", "LogSoftmax", "GatherElements"} <= op_types(model)
    # The train job's forward (dropout off) computes the same loss.
    got = run_onnx(fo.export(train_job), tokens, targets)[0]
    np.testing.assert_allclose(got, eval_job(tokens, targets), **F32)


def test_a_job_never_called_exports_its_initial_variables(rng):
    @flow.global_function()
    def fresh(x: tp.Numpy.Placeholder((4, 8))) -> tp.Numpy:
        return flow.layers.dense(x, 3, kernel_initializer=flow.random_normal_initializer(), name="fresh")

    model = fo.export(fresh)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(run_onnx(model, x)[0], fresh(x), **F32)
    assert {t.name for t in model.graph.initializer} >= {"fresh-weight", "fresh-bias"}


def test_train_forward_exports_no_optimizer_state():
    import train_mnist as seed
    model = fo.export(seed.train_job)
    names = {t.name for t in model.graph.initializer}
    assert "hidden-weight" in names and not any("momentum" in n or "TrainStep" in n for n in names)


def test_training_true_keeps_dropout_as_onnx_random(rng):
    @flow.global_function(type="train")
    def dropped(x: tp.Numpy.Placeholder((8, 16))) -> tp.Numpy:
        h = flow.nn.dropout(flow.layers.dense(x, 16, name="dd"), rate=0.5)
        loss = flow.math.reduce_mean(flow.math.square(h))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    assert "RandomUniform" not in op_types(fo.export(dropped))
    model = fo.export(dropped, training=True)
    assert "RandomUniform" in op_types(model)
    out = run_onnx(model, rng.standard_normal((8, 16)).astype(np.float32))[0]
    assert out.shape == (1,) and np.isfinite(out).all()


# ---------------------------------------------------------------- op rules

X = np.random.default_rng(7).standard_normal((2, 3, 7, 9)).astype(np.float32)
X4 = tp.Numpy.Placeholder((2, 3, 7, 9))


def test_elementwise_ops():
    @flow.global_function()
    def elementwise(x: X4) -> tp.Numpy:
        m = flow.math
        ax = m.abs(x) + 0.1
        parts = [m.erfc(x), m.rsqrt(ax), m.round(x * 3), m.sign(x), m.floor(x), m.ceil(x), m.pow(ax, x),
                 m.sigmoid(x), m.tanh(x), m.sin(x), m.cos(x), m.exp(x), m.log(ax), m.sqrt(ax), m.square(x),
                 m.reciprocal(ax), m.erf(x), m.negative(x), m.maximum(x, 0.2), m.minimum(x, 0.1),
                 m.divide(x, ax), flow.nn.relu(x), m.subtract(x, 1.0),
                 flow.where(m.logical_or(m.not_equal(x, 0.5), m.logical_not(m.less_equal(x, 0.0))),
                            x, ax),
                 flow.where(m.logical_and(m.greater_equal(x, -0.5), m.less(x, 0.5)), x, ax),
                 flow.where(m.equal(m.greater(x, 0.0), m.greater(ax, 0.5)), x, ax)]
        s = parts[0]
        for p in parts[1:]:
            s = s + p
        return s

    assert_same(elementwise, X)


def test_reductions_and_softmax():
    @flow.global_function()
    def reductions(x: X4) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy,
                                   tp.Numpy, tp.Numpy, tp.Numpy]:
        m = flow.math
        keep = _ops.make(K.argmax, [x], {"axes": [3], "keepdims": True, "dtype": _C.DType.int64})
        return (m.reduce_prod(x, axis=[1], keepdims=True), m.reduce_min(x, axis=[0, 2]), m.reduce_max(x, axis=3),
                m.argmax(x, axis=1), m.argmin(x, axis=-1), m.reduce_mean(x),
                m.reduce_sum(x, axis=[1, 3], keepdims=True), keep, flow.nn.softmax(x, axis=2),
                flow.nn.log_softmax(x, axis=1))

    for opset in (17, 18):
        assert_same(reductions, X, opset=opset)


def test_pools_use_windows():
    @flow.global_function()
    def pools(x: X4) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        return (flow.nn.max_pool2d(x, 3, 2, "SAME"), flow.nn.avg_pool2d(x, 3, 2, "VALID"),
                flow.nn.max_pool2d(x, 2, 1, [[0, 0], [0, 0], [1, 0], [0, 1]]))

    assert "window" in pools.compile().as_text("traced")
    assert_same(pools, X)


def test_views_and_gathers():
    @flow.global_function()
    def views(x: X4, i: tp.Numpy.Placeholder((2, 4), dtype=flow.int32),
              j: tp.Numpy.Placeholder((5, 2), dtype=flow.int64)) -> Tuple[
                  tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy,
                  tp.Numpy, tp.Numpy]:
        interior = _ops.make(K.pad, [x], {"pads_lo": [0, 1, 1, 0], "pads_hi": [1, 0, 0, 2],
                                          "interior": [1, 0, 2, 0], "pad_value": -2.0})
        strided = _ops.make(K.slice, [x], {"begin": [1, 2, 6, 8], "step": [-1, -1, -3, -2],
                                           "shape": [2, 3, 3, 5]})
        batched = _ops.make(K.gather, [x, i], {"axis": 2, "batch_dims": 1})
        return (flow.pad(x, [[0, 0], [1, 2], [0, 1], [3, 0]], constant_value=1.5), interior,
                flow.reverse(x, axis=[1, 3]), strided, flow.slice(x, [0, 1, 2, 3], [2, 2, 3, 4]),
                flow.gather(x, i, axis=2), batched, flow.gather(x, i, axis=1, batch_dims=1),
                flow.gather_nd(x, j), flow.one_hot(i, depth=5, on_value=3.0, off_value=-1.0),
                flow.transpose(flow.reshape(x, [6, 63]), perm=[1, 0]))

    i = np.array([[0, 2, 1, 2], [2, 1, 0, 0]], np.int32)
    j = np.array([[0, 1], [1, 2], [1, 0], [0, 2], [1, 1]], np.int64)
    assert_same(views, X, i, j)


def test_convolutions_and_normalization(rng):
    @flow.global_function()
    def nets(x: tp.Numpy.Placeholder((2, 4, 10)), y: tp.Numpy.Placeholder((2, 4, 5, 6, 7))) -> Tuple[
            tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        w = flow.get_variable("c1w", shape=(6, 2, 3), initializer=flow.random_normal_initializer())
        grouped = flow.nn.conv1d(x, w, 2, "SAME", dilations=2, groups=2)
        c3 = flow.layers.conv3d(y, 3, 3, padding="VALID", name="c3")
        ln = flow.layers.layer_norm(x, begin_norm_axis=1, name="ln")
        bn = flow.layers.batch_normalization(x, axis=1, name="bn")
        iota = flow.range(10, dtype=flow.float32) + flow.cast(flow.range(0, 20, 2, dtype=flow.int32), flow.float32)
        return grouped, c3, ln, bn, iota + x

    x = rng.standard_normal((2, 4, 10)).astype(np.float32)
    y = rng.standard_normal((2, 4, 5, 6, 7)).astype(np.float32)
    assert_same(nets, x, y, tol=dict(rtol=1e-4, atol=1e-4))


# ---------------------------------------------------------------- dtypes and names

@pytest.mark.parametrize("dtype", [flow.float64, flow.float16, flow.int32, flow.int64, flow.int8, flow.uint8])
def test_dtypes(dtype, rng):
    @flow.global_function()
    def typed(a: tp.Numpy.Placeholder((4, 5), dtype=dtype), b: tp.Numpy.Placeholder((4, 5), dtype=dtype)) -> Tuple[
            tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        s = flow.math.add(a, b)
        return (s, flow.math.greater(a, b), flow.math.reduce_sum(flow.math.multiply(a, b), axis=1),
                flow.cast(s, flow.float32), flow.math.maximum(a, b))

    npd = _C.numpy_dtype(dtype.c)
    a = rng.integers(0, 6, (4, 5)).astype(npd)
    b = rng.integers(0, 6, (4, 5)).astype(npd)
    model = assert_same(typed, a, b, tol=dict(rtol=1e-3, atol=1e-3))
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(npd))
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [elem, elem]
    outs = [o.type.tensor_type.elem_type for o in model.graph.output]
    assert outs == [elem, onnx.TensorProto.BOOL, elem, onnx.TensorProto.FLOAT, elem]


def test_integer_views(rng):
    @flow.global_function()
    def int_views(a: tp.Numpy.Placeholder((3, 4), dtype=flow.int64),
                  i: tp.Numpy.Placeholder((3, 4), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        return (flow.pad(a, [[1, 0], [0, 2]], constant_value=2 ** 60 + 1), flow.pad(i, [[0, 1], [2, 0]]),
                flow.math.negative(flow.reverse(a, axis=1)))

    a = rng.integers(-(2 ** 40), 2 ** 40, (3, 4))
    assert_same(int_views, a, rng.integers(-9, 9, (3, 4)).astype(np.int32))


def test_bfloat16_passes_the_checker():
    @flow.global_function()
    def bf(x: tp.Numpy.Placeholder((3, 4), dtype=flow.bfloat16)) -> tp.Numpy:
        w = flow.get_variable("bfw", shape=(4, 2), dtype=flow.bfloat16, initializer=flow.ones_initializer())
        return flow.matmul(x, w)

    model = fo.export(bf)  # checked; ONNX Runtime's CPU kernels have few bfloat16 ops
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    (w,) = model.graph.initializer
    assert w.name == "bfw" and w.data_type == onnx.TensorProto.BFLOAT16 and list(w.dims) == [4, 2]


def test_names_of_inputs_and_outputs(rng):
    @flow.global_function()
    def named(first: tp.Numpy.Placeholder((2, 3)), unused: tp.Numpy.Placeholder((5,), dtype=flow.int32),
              pair: Tuple[tp.Numpy.Placeholder((3,)), tp.Numpy.Placeholder((3,))]) -> Tuple[tp.Numpy, tp.Numpy]:
        return flow.math.add(first, pair[0], name="total"), flow.identity(pair[1], name="second")

    model = fo.export(named)
    assert [i.name for i in model.graph.input] == ["first", "unused", "pair_0", "pair_1"]
    assert [o.name for o in model.graph.output] == ["total", "second"]
    model = fo.export(named, output_names=["y0", "y1"])
    assert [o.name for o in model.graph.output] == ["y0", "y1"]
    args = [rng.standard_normal((2, 3)).astype(np.float32), np.zeros(5, np.int32),
            rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    got = run_onnx(model, *args)
    ref = named(args[0], args[1], (args[2], args[3]))
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, **F32)


# ---------------------------------------------------------------- errors

def test_an_op_without_a_mapping_is_named():
    @flow.global_function()
    def noisy(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return x + _ops.make(K.truncated_normal, [], {"shape": [3], "dtype": _C.DType.float32})

    with pytest.raises(NotImplementedError) as e:
        fo.export(noisy)
    msg = str(e.value)
    assert "job 'noisy'" in msg and "op 'truncated_normal' (float32[3])" in msg
    assert "truncated normal" in msg and "supported_ops()" in msg
    assert "truncated_normal" not in fo.supported_ops()


def test_bad_arguments():
    import train_mnist as seed
    with pytest.raises(TypeError, match="@flow.global_function"):
        fo.export(lambda x: x)
    with pytest.raises(ValueError, match="opset must be an int from 17"):
        fo.export(seed.eval_job, opset=16)
    with pytest.raises(ValueError, match="has 1 result"):
        fo.export(seed.eval_job, output_names=["a", "b"])


def test_the_example_models_need_only_mapped_ops():
    assert {"conv", "matmul", "reduce_max", "sparse_softmax_cross_entropy", "gather", "softmax", "erfc",
            "rsqrt", "iota", "argmax", "window", "pad", "slice"} <= set(fo.supported_ops())


# ---------------------------------------------------------------- docs

def test_the_module_is_documented():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    import flowjit_names
    for name in flowjit_names.public_names(fo):
        v = getattr(fo, name)
        if callable(v):
            assert inspect.getdoc(v), name
            hints = typing.get_type_hints(v)
            params = [p for p in inspect.signature(v).parameters]
            assert all(p in hints for p in params) and "return" in hints, (name, hints)
    pages = {p.read_text().split(".. flowjit-module:: ")[1].strip(): p.stem
             for p in (ROOT / "docs" / "api").glob("*.rst")}
    assert pages.get("flowjit.onnx") == "onnx"
    assert "api/onnx" in (ROOT / "docs" / "reference.rst").read_text()
    assert os.path.exists(ROOT / "docs" / "guides" / "onnx.rst")


def test_the_docstring_example_runs():
    import doctest
    import importlib.util
    spec = importlib.util.spec_from_file_location("flowjit_docs_conf", ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    test = doctest.DocTestParser().get_doctest(inspect.getdoc(fo.export), {}, "export", None, 0)
    exec(conf.doctest_global_setup, test.globs)
    report = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, out=report.append)
    assert runner.failures == 0 and runner.tries >= 4, "".join(report)


def test_large_weights_go_beside_the_model(tmp_path, monkeypatch, rng):
    import train_mnist as seed
    monkeypatch.setattr(fo, "_EXTERNAL_BYTES", 1000)
    with pytest.raises(ValueError, match="give a path"):
        fo.export(seed.eval_job)
    path = tmp_path / "mlp.onnx"
    fo.export(seed.eval_job, path)
    assert (tmp_path / "mlp.onnx.data").stat().st_size > 784 * 512 * 4
    assert path.stat().st_size < 100_000
    images = rng.random((100, 1, 28, 28), dtype=np.float32)
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(s.run(None, {"images": images})[0], seed.eval_job(images))


def test_scaled_dot_product_attention(rng):
    """The attention op (its rows end with the log-sum-exp, sliced off) as
    MatMul, Softmax and a causal Where."""
    @flow.global_function()
    def attend(q: tp.Numpy.Placeholder((2, 3, 7, 4)), k: tp.Numpy.Placeholder((2, 3, 9, 4)),
               m: tp.Numpy.Placeholder((2, 1, 1, 9), dtype=flow.bool)) -> Tuple[tp.Numpy, tp.Numpy]:
        return (flow.nn.scaled_dot_product_attention(q, k, k * 2.0, is_causal=True),
                flow.nn.scaled_dot_product_attention(q, k, k, attn_mask=m, scale=0.3))

    q = rng.standard_normal((2, 3, 7, 4)).astype(np.float32)
    k = rng.standard_normal((2, 3, 9, 4)).astype(np.float32)
    m = np.ones((2, 1, 1, 9), bool)
    m[1, ..., 5:] = False
    model = assert_same(attend, q, k, m)
    assert {"Softmax", "Where", "ReduceLogSumExp"} <= op_types(model)


def test_attention_dropout_exports_as_onnx_random(rng):
    """A train job's attention with dropout (its kernels draw the mask) keeps
    it with training=True, as the distribution, like flow.nn.dropout."""
    @flow.global_function(type="train")
    def attend(q: tp.Numpy.Placeholder((2, 5, 4))) -> tp.Numpy:
        w = flow.get_variable("aw", (4,), initializer=flow.ones_initializer())
        y = flow.nn.scaled_dot_product_attention(q * w, q, q, dropout_p=0.5, is_causal=True)
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return y

    q = rng.standard_normal((2, 5, 4)).astype(np.float32)
    assert "RandomUniform" not in op_types(fo.export(attend))
    model = fo.export(attend, training=True)
    assert {"RandomUniform", "GreaterOrEqual"} <= op_types(model)
    y = run_onnx(model, q)[0]
    # the first query sees only the first key: kept (scaled by 2) or dropped
    assert np.all(np.isclose(y[:, 0], 2 * q[:, 0], atol=1e-5) | np.isclose(y[:, 0], 0, atol=1e-6))
