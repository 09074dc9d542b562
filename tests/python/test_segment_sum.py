"""The segment_sum kernel family (codegen/families/segment_sum): the
scatters (unsorted_segment_sum, unsorted_batch_segment_sum, scatter_nd) and
the gradients of gather and gather_nd, against numpy; one kernel per sum,
whatever the table size; data-parallel gradients over 2 devices."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


@pytest.fixture(autouse=True)
def fresh_session():
    flow.clear_default_session()
    yield
    flow.clear_default_session()
    flow.config.cpu_device_num(1)


def rng(seed=0):
    return np.random.default_rng(seed)


def placeholder(a):
    dtype = {np.dtype(np.int32): flow.int32, np.dtype(np.int64): flow.int64,
             np.dtype(np.float64): flow.double}.get(a.dtype, flow.float)
    return tp.Numpy.Placeholder(a.shape, dtype=dtype)


def annotated(body, arrays, ret=tp.Numpy):
    """body(*blobs) as a job function of len(arrays) placeholders."""
    jobs = {1: lambda x0: body(x0), 2: lambda x0, x1: body(x0, x1),
            3: lambda x0, x1, x2: body(x0, x1, x2)}
    job = jobs[len(arrays)]
    job.__annotations__ = {f"x{i}": placeholder(a) for i, a in enumerate(arrays)}
    job.__annotations__["return"] = ret
    job.__name__ = "job"
    return job


def predict(fn, *arrays):
    flow.clear_default_session()
    return flow.global_function()(annotated(fn, arrays))(*arrays)


def segment_sum_ref(data, ids, segments, axis=0):
    out_shape = data.shape[:axis] + (segments,) + data.shape[axis + ids.ndim:]
    out = np.zeros(out_shape, data.dtype)
    d = np.moveaxis(data.reshape(data.shape[:axis] + (-1,) + data.shape[axis + ids.ndim:]), axis, 0)
    o = np.moveaxis(out, axis, 0)
    np.add.at(o, ids.ravel(), d)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("axis,ids_shape", [(0, (7,)), (1, (3, 4)), (2, (5,))])
def test_unsorted_segment_sum_matches_numpy(dtype, axis, ids_shape):
    shape = [2, 3, 5, 4][:axis] + list(ids_shape) + [6]
    data = (rng(1).standard_normal(shape) * 8).astype(dtype)
    ids = rng(2).integers(0, 4, ids_shape).astype(np.int32)
    got = predict(lambda d, i: flow.math.unsorted_segment_sum(d, i, num_segments=4, axis=axis), data, ids)
    want = segment_sum_ref(data, ids, 4, axis)
    if dtype == np.int32:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-5)


def test_int64_ids_a_wide_inner_dim_and_empty_segments():
    # inner 1000 > one chunk on every host: several tasks per row
    data = rng(3).standard_normal((9, 1000)).astype(np.float32)
    ids = np.int64([5, 0, 5, 5, 2, 0, 7, 7, 5])
    got = predict(lambda d, i: flow.math.unsorted_segment_sum(d, i, num_segments=8), data, ids)
    np.testing.assert_allclose(got, segment_sum_ref(data, ids, 8), rtol=1e-6, atol=1e-6)
    assert not got[[1, 3, 4, 6]].any()


def test_out_of_range_segment_ids_are_an_error_of_the_run():
    data = np.ones((3, 2), np.float32)
    with pytest.raises(Exception, match="segment_ids"):
        predict(lambda d, i: flow.math.unsorted_segment_sum(d, i, num_segments=2), data, np.int32([0, 2, 1]))


def test_unsorted_batch_segment_sum_and_scatter_nd():
    data = rng(4).standard_normal((3, 5, 2)).astype(np.float32)
    ids = rng(5).integers(0, 4, (3, 5)).astype(np.int32)
    got = predict(lambda d, i: flow.math.unsorted_batch_segment_sum(d, i, num_segments=4), data, ids)
    want = np.stack([segment_sum_ref(data[b], ids[b], 4) for b in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    idx = np.int32([[1, 2], [0, 0], [1, 2], [2, 1]])
    upd = rng(6).standard_normal((4, 3)).astype(np.float32)
    got = predict(lambda i, u: flow.scatter_nd(i, u, [3, 3, 3]), idx, upd)
    want = np.zeros((3, 3, 3), np.float32)
    np.add.at(want, (idx[:, 0], idx[:, 1]), upd)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def sgd_step(build, table, *inputs):
    """The table after one SGD step with learning rate 1: table - gradient."""
    flow.clear_default_session()

    def body(*xs):
        w = flow.get_variable("table", table.shape, initializer=flow.zeros_initializer())
        loss = build(w, *xs)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss
    f = flow.global_function(type="train")(annotated(body, inputs))
    flow.load_variables({"table": table})
    f(*inputs)
    return table - np.array(flow.get_all_variables()["table"])


@pytest.mark.parametrize("axis,batch_dims", [(0, 0), (1, 0), (1, 1), (2, 1)])
def test_gather_gradient_is_a_segment_sum(axis, batch_dims):
    table = rng(7).standard_normal((3, 4, 5)).astype(np.float32)
    ishape = (3, 6) if batch_dims else (2, 3)
    idx = rng(8).integers(0, table.shape[axis], ishape).astype(np.int32)
    out_shape = table.shape[:axis] + ishape[batch_dims:] + table.shape[axis + 1:]
    weight = rng(9).standard_normal(out_shape).astype(np.float32)
    grad = sgd_step(lambda w, i, c: flow.math.reduce_sum(
        flow.gather(w, i, axis=axis, batch_dims=batch_dims) * c), table, idx, weight)
    want = np.zeros_like(table)
    if batch_dims == 0:
        t = np.moveaxis(want, axis, 0)
        np.add.at(t, idx.ravel(), np.moveaxis(weight.reshape(
            table.shape[:axis] + (-1,) + table.shape[axis + 1:]), axis, 0))
    else:
        for b in range(3):
            t = np.moveaxis(want[b], axis - 1, 0)
            np.add.at(t, idx[b], np.moveaxis(weight[b], axis - 1, 0))
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-5)


def test_gather_nd_gradient():
    table = rng(10).standard_normal((4, 5, 3)).astype(np.float32)
    idx = np.int32([[1, 2], [3, 4], [1, 2], [0, 0], [3, 4]])
    weight = rng(11).standard_normal((5, 3)).astype(np.float32)
    grad = sgd_step(lambda w, i, c: flow.math.reduce_sum(flow.gather_nd(w, i) * c), table, idx, weight)
    want = np.zeros_like(table)
    np.add.at(want, (idx[:, 0], idx[:, 1]), weight)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)


def test_segment_sum_gradient_flows_to_data():
    data = rng(12).standard_normal((6, 4)).astype(np.float32)
    ids = np.int32([2, 0, 2, 1, 1, 2])
    weight = rng(13).standard_normal((3, 4)).astype(np.float32)
    grad = sgd_step(lambda w, i, c: flow.math.reduce_sum(
        flow.math.unsorted_segment_sum(w, i, num_segments=3) * c), data, ids, weight)
    np.testing.assert_allclose(grad, weight[ids], rtol=1e-6)


def test_an_embedding_gradient_is_one_kernel_whatever_the_table():
    """The gradient of a (30, 150, 100) table gathered by 800 ids along axis 1
    (the case that once crashed) is one segment_sum kernel that reads the
    incoming gradient once, not a compare-and-sum over table rows x ids."""
    table = rng(14).standard_normal((30, 150, 100)).astype(np.float32)
    idx = rng(15).integers(0, 150, (800,)).astype(np.int32)
    grad = sgd_step(lambda w, i: flow.math.reduce_sum(flow.gather(w, i, axis=1)), table, idx)
    counts = np.bincount(idx, minlength=150).astype(np.float32)
    np.testing.assert_allclose(grad, np.broadcast_to(counts[None, :, None], table.shape), rtol=1e-6)


def test_a_tall_narrow_table_is_summed_in_blocks_of_segments():
    """40000 x 2: the CPU kernel zeroes and fills it in several blocks of
    segments (parallel tasks), each scanning every id."""
    table = np.zeros((40000, 2), np.float32)
    idx = rng(22).integers(0, 40000, (3000,)).astype(np.int32)
    idx[:50] = 39999  # a duplicate in the last block
    weight = rng(23).standard_normal((3000, 2)).astype(np.float32)
    grad = sgd_step(lambda w, i, c: flow.math.reduce_sum(flow.gather(w, i) * c), table, idx, weight)
    want = np.zeros_like(table)
    np.add.at(want, idx, weight)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)


def test_the_kernel_is_a_family_kernel_in_the_dumps():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(ids: tp.Numpy.Placeholder((64,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable("emb", (1000, 16), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(flow.gather(w, ids))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    ids = np.arange(64, dtype=np.int32)
    text = job.compile(ids).as_text("kernels")
    assert "family segment_sum params=[1,1,64,1000,16," in text  # then the args of data, ids, out
    # the gradient reads dy (64 x 16) and the ids; no kernel spans table rows x ids
    assert "domain=[64,1000" not in text and "domain=[1000,64" not in text
    job(ids)


def test_data_parallel_embedding_gradient_over_two_devices_matches_one():
    ids = rng(16).integers(0, 40, (32, 5)).astype(np.int32)
    labels = rng(17).integers(0, 3, (32,)).astype(np.int32)

    def train(devices):
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)
        cfg = flow.function_config()
        cfg.default_logical_view(flow.scope.consistent_view())

        @flow.global_function(type="train", function_config=cfg)
        def job(i: tp.Numpy.Placeholder((32, 5), dtype=flow.int32),
                y: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> tp.Numpy:
            w = flow.get_variable("emb", (40, 8), initializer=flow.random_normal_initializer(seed=3))
            h = flow.math.reduce_mean(flow.gather(w, i), axis=1)
            logits = flow.layers.dense(h, 3, kernel_initializer=flow.random_normal_initializer(seed=4),
                                       name="out")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
            return loss

        for _ in range(3):
            job(ids, labels)
        return np.array(flow.get_all_variables()["emb"])

    one, two = train(1), train(2)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


def test_half_tables_accumulate_in_float32():
    import ml_dtypes
    data = rng(18).standard_normal((50, 8)).astype(ml_dtypes.bfloat16)
    ids = np.zeros(50, np.int32)  # 50 rows into one segment
    flow.clear_default_session()

    @flow.global_function()
    def job(d: tp.Numpy.Placeholder((50, 8), dtype=flow.bfloat16),
            i: tp.Numpy.Placeholder((50,), dtype=flow.int32)) -> tp.Numpy:
        return flow.math.unsorted_segment_sum(d, i, num_segments=2)

    got = job(data, ids)
    want = data.astype(np.float32).sum(0)
    # one rounding to bfloat16 at the end (not 50 along the way)
    np.testing.assert_array_equal(got[0], want.astype(ml_dtypes.bfloat16))


def test_exported_to_c_bit_for_bit(tmp_path):
    """A family kernel is an ordinary CPU kernel of the exported library."""
    import shutil
    if shutil.which("cc") is None:
        pytest.skip("exports link with a C compiler (cc)")
    import test_export as E
    import flowjit.export

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((6, 40)), i: tp.Numpy.Placeholder((6,), dtype=flow.int32)) -> tp.Numpy:
        return flow.math.unsorted_segment_sum(flow.math.exp(x), i, num_segments=3)

    x = rng(19).standard_normal((6, 40)).astype(np.float32)
    i = np.int32([2, 0, 2, 1, 1, 2])
    want = job(x, i)
    lib = flowjit.export.export([job], str(tmp_path / "seg.so"))
    E.assert_bits(E.run_c(lib, lib.jobs[0], tmp_path, [x, i]), want)


@pytest.mark.parametrize("axis,ids_shape,shape", [(0, (6,), (6, 4)), (1, (5,), (2, 5, 3)), (1, (2, 3), (2, 2, 3, 4))])
def test_onnx_export_matches_onnxruntime(tmp_path, axis, ids_shape, shape):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import flowjit.onnx

    data = rng(20).standard_normal(shape).astype(np.float32)
    ids = rng(21).integers(0, 3, ids_shape).astype(np.int32)
    job = flow.global_function()(annotated(
        lambda d, i: flow.math.unsorted_segment_sum(d, i, num_segments=3, axis=axis), (data, ids)))
    want = job(data, ids)
    path = str(tmp_path / "seg.onnx")
    flowjit.onnx.export(job, path)
    sess = ort.InferenceSession(path)
    got = sess.run(None, dict(zip([a.name for a in sess.get_inputs()], [data, ids])))[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

