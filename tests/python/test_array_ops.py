"""Array ops (flow.pad, slice, concat, gather, sort, ...) against numpy.

Forward values against numpy on awkward shapes (size 1, odd, negative axes,
empty), gradients against float64 finite differences (test_autodiff.check),
fused kernels against FLOWJIT_DISABLE_FUSION=1, 2 and 4 CPU devices against
one, and the messages of bad arguments.
"""
import itertools

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from test_autodiff import check

_DT = {np.dtype(np.float64): flow.float64, np.dtype(np.float32): flow.float32,
       np.dtype(np.int32): flow.int32, np.dtype(np.int64): flow.int64, np.dtype(np.bool_): flow.bool}
_count = itertools.count()


@pytest.fixture(autouse=True)
def fresh_session():
    yield
    flow.clear_default_session()
    flow.config.cpu_device_num(1)


def run(f, *arrays):
    """f(*blobs) in a predict job fed `arrays`."""
    ns = {"_f": f, "tp": tp}
    params = []
    for i, a in enumerate(arrays):
        ns[f"_t{i}"] = tp.Numpy.Placeholder(a.shape, dtype=_DT[a.dtype])
        params.append(f"a{i}: _t{i}")
    name = f"array_job_{next(_count)}"
    exec(f"def {name}({', '.join(params)}) -> tp.Numpy:\n"  # noqa: S102
         f"    return _f({', '.join(f'a{i}' for i in range(len(arrays)))})\n", ns)
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64 if any(a.dtype == np.float64 for a in arrays) else flow.float32)
    return flow.global_function(type="predict", function_config=cfg)(ns[name])(*arrays)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- forward values

X = rnd(2, 3, 5)


@pytest.mark.parametrize("paddings,value", [
    ([(0, 0), (1, 2), (0, 1)], -1.5), ([(1, 1), (0, 0), (3, 0)], 0.0), ([(0, 0), (0, 0), (0, 0)], 2.0)])
def test_pad_constant(paddings, value):
    np.testing.assert_array_equal(run(lambda a: flow.pad(a, paddings, constant_value=value), X),
                                  np.pad(X, paddings, constant_values=value))


@pytest.mark.parametrize("mode,npmode", [("reflect", "reflect"), ("replicate", "edge")])
def test_pad_reflect_replicate(mode, npmode):
    p = [(0, 0), (2, 1), (3, 4)]
    np.testing.assert_array_equal(run(lambda a: flow.pad(a, p, mode=mode), X), np.pad(X, p, mode=npmode))


def test_pad2d_layers():
    x = rnd(1, 2, 4, 5)
    np.testing.assert_array_equal(run(lambda a: flow.reflection_pad2d(a, [1, 2, 3, 0]), x),
                                  np.pad(x, [(0, 0), (0, 0), (3, 0), (1, 2)], mode="reflect"))
    np.testing.assert_array_equal(run(lambda a: flow.replication_pad2d(a, 2), x),
                                  np.pad(x, [(0, 0), (0, 0), (2, 2), (2, 2)], mode="edge"))
    np.testing.assert_array_equal(run(lambda a: flow.constant_pad2d(a, [0, 1, 1, 0], 3.0), x),
                                  np.pad(x, [(0, 0), (0, 0), (1, 0), (0, 1)], constant_values=3.0))


def test_slice_and_slice_v2():
    np.testing.assert_array_equal(run(lambda a: flow.slice(a, [None, 1, 2], [-1, 2, None]), X), X[:, 1:3, 2:])
    for tup, ref in [
        ([(None, None, None), (2, None, -2), (1, 4, 2)], X[:, 2::-2, 1:4:2]),
        ([(1, 2, 1), (None, None, None), (-1, None, -1)], X[1:2, :, ::-1]),
        ([(None, None, None), (0, 0, 1)], X[:, 0:0]),
        ([(-5, 10, 3)], X[-5:10:3]),
    ]:
        np.testing.assert_array_equal(run(lambda a, t=tup: flow.slice_v2(a, t), X), ref)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_split_stack(axis):
    y = rnd(*[7 if d == axis % 3 else s for d, s in enumerate(X.shape)], seed=1)
    np.testing.assert_array_equal(run(lambda a, b: flow.concat([a, b, a], axis=axis), X, y),
                                  np.concatenate([X, y, X], axis=axis))
    np.testing.assert_array_equal(run(lambda a: flow.stack([a, a * 2.0], axis=axis), X),
                                  np.stack([X, X * 2], axis=axis))
    n = X.shape[axis]
    sizes = [1, n - 1]
    pieces = np.split(X, [1], axis=axis)
    for i in range(2):
        np.testing.assert_array_equal(run(lambda a, i=i: flow.split(a, sizes, axis=axis)[i], X), pieces[i])


def test_concat_empty_bool_and_int():
    np.testing.assert_array_equal(
        run(lambda a: flow.concat([a, flow.slice_v2(a, [(None, None, None), (0, 0, 1)])], axis=1), X), X)
    b1 = X > 0
    np.testing.assert_array_equal(run(lambda a, b: flow.concat([a, b], axis=2), b1, b1 & False),
                                  np.concatenate([b1, b1 & False], 2))
    i = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(run(lambda a: flow.concat([a, a], axis=0), i), np.concatenate([i, i], 0))


def test_flatten_expand_tile_range():
    np.testing.assert_array_equal(run(lambda a: flow.flatten(a, 1), X), X.reshape(2, 15))
    np.testing.assert_array_equal(run(lambda a: flow.flatten(a), X), X.reshape(30))
    x = rnd(3, 1)
    np.testing.assert_array_equal(run(lambda a: flow.expand(a, [2, -1, 4]), x), np.broadcast_to(x, (2, 3, 4)))
    np.testing.assert_array_equal(run(lambda a: flow.tile(a, [2, 1, 3]), X), np.tile(X, [2, 1, 3]))
    np.testing.assert_array_equal(run(lambda a: flow.tile(a, [2, 3]), x), np.tile(x, [2, 3]))
    np.testing.assert_allclose(run(lambda a: a + flow.cast(flow.range(5), flow.float), rnd(5)),
                               rnd(5) + np.arange(5, dtype=np.float32), rtol=1e-6)
    np.testing.assert_allclose(run(lambda a: a + flow.range(1.0, 3.0, 0.5), rnd(4)),
                               rnd(4) + np.arange(1.0, 3.0, 0.5), rtol=1e-6)
    np.testing.assert_array_equal(run(lambda a: a + flow.range(10, 1, -3, dtype=flow.int32),
                                      np.zeros(3, np.int32)), np.arange(10, 1, -3))


@pytest.mark.parametrize("axis,batch_dims", [(0, 0), (1, 0), (-1, 0), (1, 1), (2, 1)])
def test_gather(axis, batch_dims):
    p = rnd(3, 4, 5)
    ax = axis % 3
    ishape = (3, 6) if batch_dims else (2, 3)
    idx = np.random.default_rng(2).integers(0, p.shape[ax], ishape).astype(np.int32)
    got = run(lambda a, i: flow.gather(a, i, axis=axis, batch_dims=batch_dims), p, idx)
    if batch_dims == 0:
        want = np.take(p, idx, axis=ax)
    else:
        want = np.stack([np.take(p[b], idx[b], axis=ax - 1) for b in range(3)])
    np.testing.assert_array_equal(got, want)


def test_gather_out_of_range_indices_are_an_error():
    # (They were clamped; tests/python/test_harden_run.py covers the checks.)
    p = rnd(4, 3)
    idx = np.array([0, 1, 3, 9], np.int64)
    with pytest.raises(IndexError, match=r"gather: indices holds 9 at \[3\], outside the valid range \[0, 4\)"):
        run(lambda a, i: flow.gather(a, i), p, idx)


def test_gather_fuses_with_computed_index_and_consumer():
    p = rnd(6, 8)
    x = np.array([0.2, 5.7, 3.1], np.float32)
    got = run(lambda a, f: flow.math.tanh(flow.gather(a * 2.0, flow.cast(f, flow.int32))), p, x)
    np.testing.assert_allclose(got, np.tanh(2 * p[x.astype(np.int32)]), rtol=1e-6)


def test_gather_nd_and_scatter_nd():
    p = rnd(3, 4, 2)
    idx = np.array([[[0, 1], [2, 3]], [[1, 0], [2, 2]], [[0, 0], [1, 3]]], np.int32)  # [3, 2, K=2]
    np.testing.assert_array_equal(run(lambda a, i: flow.gather_nd(a, i), p, idx), p[idx[..., 0], idx[..., 1]])
    idx1 = np.array([[2], [0]], np.int32)
    np.testing.assert_array_equal(run(lambda a, i: flow.gather_nd(a, i), p, idx1), p[[2, 0]])
    upd = rnd(3, 2, 2, seed=3)
    want = np.zeros((3, 4, 2), np.float32)
    np.add.at(want, (idx[..., 0], idx[..., 1]), upd)
    np.testing.assert_allclose(run(lambda i, u: flow.scatter_nd(i, u, [3, 4, 2]), idx, upd), want, rtol=1e-6)


def test_unsorted_segment_sum():
    d = rnd(5, 3)
    ids = np.array([1, 3, 1, 2, 0], np.int32)
    want = np.zeros((4, 3), np.float32)
    for i, s in enumerate(ids):
        want[s] += d[i]
    np.testing.assert_allclose(run(lambda a, i: flow.math.unsorted_segment_sum(a, i, 4), d, ids), want, rtol=1e-6)
    # An id outside [0, num_segments) is an error (negative ones too, unlike TensorFlow).
    with pytest.raises(IndexError, match=r"unsorted_segment_sum: segment_ids holds -1 at \[3\]"):
        run(lambda a, i: flow.math.unsorted_segment_sum(a, i, 4), d, np.array([1, 3, 1, -1, 0], np.int32))
    ids2 = np.array([2, 0, 2], np.int64)
    want2 = np.zeros((5, 3), np.float32)
    for j, s in enumerate(ids2):
        want2[:, s] += d[:, j]
    np.testing.assert_allclose(run(lambda a, i: flow.math.unsorted_segment_sum(a, i, 3, axis=1), d, ids2),
                               want2, rtol=1e-6)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_sort_argsort(axis):
    x = np.round(rnd(4, 7, 3), 1)  # ties
    np.testing.assert_array_equal(run(lambda a: flow.sort(a, axis=axis), x), np.sort(x, axis=axis))
    np.testing.assert_array_equal(run(lambda a: flow.argsort(a, axis=axis), x),
                                  np.argsort(x, axis=axis, kind="stable"))
    np.testing.assert_array_equal(run(lambda a: flow.sort(a, axis=axis, direction="DESCENDING"), x),
                                  -np.sort(-x, axis=axis))
    np.testing.assert_array_equal(run(lambda a: flow.argsort(a, axis=axis, direction="DESCENDING"), x),
                                  np.argsort(-x, axis=axis, kind="stable"))


def test_top_k_and_in_top_k():
    x = rnd(5, 9)
    # OneFlow's signature: top_k(input, axis=-1, k=1, sorted=True)
    np.testing.assert_array_equal(run(lambda a: flow.math.top_k(a, k=3), x), np.argsort(-x, axis=-1)[:, :3])
    np.testing.assert_array_equal(run(lambda a: flow.math.top_k(a, k=1), rnd(1)), [0])
    np.testing.assert_array_equal(run(lambda a: flow.math.top_k(a), x), np.argsort(-x, axis=-1)[:, :1])
    np.testing.assert_array_equal(run(lambda a: flow.math.top_k(a, 0, 2), x), np.argsort(-x, axis=0)[:2, :])
    # a k larger than the axis gives all of its indices
    np.testing.assert_array_equal(run(lambda a: flow.math.top_k(a, k=20), x), np.argsort(-x, axis=-1))
    t = np.array([0, 4, 8, 2, 100], np.int32)
    order = np.argsort(-x, axis=-1)
    want = np.array([t[i] in order[i, :4] for i in range(5)])
    np.testing.assert_array_equal(run(lambda p, tt: flow.math.in_top_k(tt, p, 4), x, t), want)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 4, 5), (5, 6)), ((3, 4, 5), (2, 1, 5, 6)),
                                             ((4, 5), (3, 5, 2)), ((2, 1, 3, 4), (1, 5, 4, 2))])
def test_batched_matmul_broadcasts(a_shape, b_shape):
    a, b = rnd(*a_shape), rnd(*b_shape, seed=1)
    np.testing.assert_allclose(run(lambda x, y: flow.matmul(x, y), a, b), np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_assign_writes_a_variable():
    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        v = flow.get_variable("assigned", shape=(3,), initializer=flow.zeros_initializer(), trainable=False)
        flow.assign(v, x * 2.0)
        return v + 0.0

    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(job(x), np.zeros(3))
    np.testing.assert_array_equal(job(x), 2 * x)


# ---------------------------------------------------------------- gradients (float64)

def _i(a):
    return np.asarray(a, np.int32)


GRADS = {
    "pad": (lambda x: flow.pad(x, [(1, 0), (2, 1)], constant_value=3.0),
            lambda x: np.pad(x, [(1, 0), (2, 1)], constant_values=3.0), [(3, 4)], []),
    "pad_reflect": (lambda x: flow.pad(x, [(2, 1), (1, 1)], mode="reflect"),
                    lambda x: np.pad(x, [(2, 1), (1, 1)], mode="reflect"), [(3, 4)], []),
    "pad_replicate": (lambda x: flow.pad(x, [(0, 2), (1, 0)], mode="replicate"),
                      lambda x: np.pad(x, [(0, 2), (1, 0)], mode="edge"), [(3, 1)], []),
    "slice_v2": (lambda x: flow.slice_v2(x, [(None, None, -2), (1, 4, 2)]), lambda x: x[::-2, 1:4:2], [(5, 4)], []),
    "concat": (lambda x, y: flow.concat([x, y, x], axis=-1), lambda x, y: np.concatenate([x, y, x], -1),
               [(2, 3), (2, 1)], []),
    "stack": (lambda x, y: flow.stack([x, y], axis=1), lambda x, y: np.stack([x, y], 1), [(3,), (3,)], []),
    "split": (lambda x: flow.split(x, 3, axis=0)[1] * flow.split(x, 3, axis=0)[2],
              lambda x: x[1:2] * x[2:3], [(3, 2)], []),
    "tile": (lambda x: flow.tile(x, [2, 3]), lambda x: np.tile(x, [2, 3]), [(2, 1)], []),
    "expand": (lambda x: flow.expand(x, [2, 3, -1]), lambda x: np.broadcast_to(x, (2, 3, 2)), [(1, 2)], []),
    "gather": (lambda x, i: flow.gather(x, i, axis=1), lambda x, i: np.take(x, i, axis=1),
               [(2, 4)], [_i([[3, 0, 3], [1, 2, 0]])]),
    "gather_batch": (lambda x, i: flow.gather(x, i, axis=1, batch_dims=1),
                     lambda x, i: np.stack([x[b][i[b]] for b in range(2)]), [(2, 3, 2)], [_i([[2, 2], [0, 1]])]),
    "gather_nd": (lambda x, i: flow.gather_nd(x, i), lambda x, i: x[i[..., 0], i[..., 1]],
                  [(3, 2, 2)], [_i([[0, 1], [2, 1], [0, 1]])]),
    "scatter_nd": (lambda u, i: flow.scatter_nd(i, u, [4, 2]),
                   lambda u, i: np.stack([u[i[:, 0] == r].sum(0) for r in range(4)]), [(3, 2)], [_i([[1], [3], [1]])]),
    "segment_sum": (lambda d, i: flow.math.unsorted_segment_sum(d, i, 3),
                    lambda d, i: np.stack([d[i == s].sum(0) for s in range(3)]), [(4, 2)], [_i([2, 0, 2, 1])]),
    "sort": (lambda x: flow.sort(x, axis=0), lambda x: np.sort(x, axis=0), [(4, 2)], []),
    "batched_matmul": (lambda a, b: flow.matmul(a, b), np.matmul, [(2, 1, 2, 3), (3, 3, 2)], []),
}


@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradients(name):
    f, ref, shapes, consts = GRADS[name]
    rng = np.random.default_rng(len(name))
    inputs = [rng.standard_normal(s) for s in shapes]
    check(f"arr_{name}", f, ref, inputs, consts, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- fused vs unfused, devices

def _model(x, i):
    """Pads, slices, a concat, a gather with its gradient path, a sort."""
    h = flow.concat([flow.pad(x, [(0, 0), (1, 1)]), flow.slice_v2(x, [(None, None, None), (None, None, -1)])], -1)
    g = flow.gather(h, i, axis=0)
    s = flow.sort(g, axis=-1)
    return flow.math.reduce_sum(s * s, axis=-1) + flow.math.reduce_sum(flow.math.tanh(g), axis=-1)


def _train_model(devices, monkeypatch, fused=True):
    flow.clear_default_session()
    flow.config.cpu_device_num(devices)
    if fused:
        monkeypatch.delenv("FLOWJIT_DISABLE_FUSION", raising=False)
    else:
        monkeypatch.setenv("FLOWJIT_DISABLE_FUSION", "1")

    @flow.global_function(type="train")
    def job(i: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        x = flow.get_variable("table", shape=(6, 5), initializer=flow.random_normal_initializer(seed=1))
        loss = _model(x, i)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    i = np.array([0, 5, 2, 2, 1, 4, 3, 5], np.int32)
    losses = [job(i) for _ in range(3)]
    return losses, np.array(flow.get_all_variables()["table"])


def test_fused_matches_unfused(monkeypatch):
    lf, vf = _train_model(1, monkeypatch, fused=True)
    lu, vu = _train_model(1, monkeypatch, fused=False)
    for a, b in zip(lf, lu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(vf, vu, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [2, 4])
def test_devices_match_one(devices, monkeypatch):
    l1, v1 = _train_model(1, monkeypatch)
    ln, vn = _train_model(devices, monkeypatch)
    for a, b in zip(l1, ln):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(vn, v1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [2, 4])
def test_predict_ops_on_devices(devices):
    p = rnd(8, 6)
    idx = np.array([[1, 0], [5, 5], [2, 3], [0, 1], [4, 4], [3, 2], [1, 1], [0, 5]], np.int32)

    def f(a, i):
        return (flow.gather(a, i, axis=1, batch_dims=1)
                + flow.slice(flow.pad(a, [(0, 0), (2, 0)], constant_value=1.0), [0, 0], [8, 2]))

    want = run(f, p, idx)
    flow.clear_default_session()
    flow.config.cpu_device_num(devices)
    np.testing.assert_allclose(run(f, p, idx), want, rtol=1e-6)


# ---------------------------------------------------------------- kernels

def test_concat_is_one_kernel():
    @flow.global_function(type="predict")
    def job(a: tp.Numpy.Placeholder((4, 3)), b: tp.Numpy.Placeholder((4, 5))) -> tp.Numpy:
        return flow.math.relu(flow.concat([a, b * 2.0], axis=1))

    a, b = rnd(4, 3), rnd(4, 5, seed=1)
    np.testing.assert_allclose(job(a, b), np.maximum(np.concatenate([a, 2 * b], 1), 0))
    cj = job.compiled_jobs()[0]
    # b * 2 is stored (a pad reads its operand from memory), then the pads,
    # the sum and the relu are one loop kernel with guarded loads.
    assert cj.num_kernels == 2, cj.fusion_plan
    assert "coord(" in cj.kernels, cj.kernels


def test_gather_is_an_indirect_load_in_the_consumer_kernel():
    @flow.global_function(type="predict")
    def job(p: tp.Numpy.Placeholder((5, 4)), i: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> tp.Numpy:
        return flow.math.exp(flow.gather(p, i)) + 1.0

    p = rnd(5, 4)
    i = np.array([4, 0, 2], np.int32)
    np.testing.assert_allclose(job(p, i), np.exp(p[i]) + 1, rtol=1e-6)
    cj = job.compiled_jobs()[0]
    assert cj.num_kernels == 1, cj.fusion_plan
    assert "indirect($" in cj.kernels, cj.kernels


# ---------------------------------------------------------------- errors

def _fails(f, arrays, exc, match):
    with pytest.raises(exc, match=match):
        run(f, *arrays)


def test_bad_arguments():
    x = X
    i = np.array([0, 1], np.int32)
    _fails(lambda a: flow.pad(a, [(1, 1)]), [x], ValueError, r"pad: paddings has 1 pairs but the input has rank 3")
    _fails(lambda a: flow.pad(a, [(0, 0), (0, 0), (-1, 0)]), [x], ValueError, r"paddings of dim 2 must be >= 0")
    _fails(lambda a: flow.pad(a, [(0, 0), (3, 0), (0, 0)], mode="reflect"), [x], ValueError,
           r"reflect padding \(3, 0\) of dim 1 must be smaller than its extent 3")
    _fails(lambda a: flow.pad(a, [(0, 0)] * 3, mode="wrap"), [x], ValueError, r"pad: mode must be")
    _fails(lambda a: flow.slice(a, [0, 2, 0], [2, 2, 5]), [x], ValueError,
           r"slice: dim 1 reads 2 elements from 2 in steps of 1 \(up to 3\), outside the input extent 3")
    _fails(lambda a: flow.slice_v2(a, [(None, None, 0)]), [x], ValueError, r"slice_v2: step of dim 0 must not be 0")
    _fails(lambda a: flow.concat([a, flow.transpose(a)], axis=0), [x], ValueError,
           r"concat: values\[1\] has shape \(5, 3, 2\) but values\[0\] has \(2, 3, 5\)")
    _fails(lambda a: flow.concat([a, flow.cast(a, flow.int32)]), [x], TypeError, r"concat: values\[1\] is")
    _fails(lambda a: flow.concat([a], axis=3), [x], ValueError, r"concat: axis 3 is out of range for a rank-3")
    _fails(lambda a: flow.split(a, 2, axis=1), [x], ValueError,
           r"split: dim 1 of extent 3 does not split into 2 equal pieces")
    _fails(lambda a, j: flow.gather(a, flow.cast(j, flow.float)), [x, i], TypeError,
           r"gather: indices must be an integer tensor \(int32 or int64\), got f32\[2\]")
    _fails(lambda a, j: flow.gather(a, j, axis=3), [x, i], ValueError, r"gather: axis 3 is out of range for params")
    _fails(lambda a, j: flow.gather(flow.transpose(a), j, axis=1, batch_dims=1), [x, i], ValueError,
           r"gather: batch dim 0 of indices i32\[2\] is 2 but params f32\[5,3,2\] have 5")
    _fails(lambda a, j: flow.gather(a, j, axis=0, batch_dims=1), [x, i], ValueError,
           r"gather: batch_dims 1 must be in \[0, 0\]")
    _fails(lambda a, j: flow.gather_nd(a, flow.reshape(flow.concat([j, j]), [1, 4])), [x, i], ValueError,
           r"gather_nd: the last dim of indices i32\[1,4\] indexes 4 dims, but params f32\[2,3,5\] have 3")
    _fails(lambda a, j: flow.scatter_nd(flow.reshape(j, [2, 1]), a, [4, 4, 5]), [x, i], ValueError,
           r"scatter_nd: updates have shape \(2, 3, 5\) but indices \(2, 1\) into shape \(4, 4, 5\) need updates of shape \(2, 4, 5\)")
    _fails(lambda a: flow.math.top_k(a, k=-1), [x], ValueError, r"top_k: k must be an int >= 0, got -1")
    # the old positional top_k(x, k) now passes k as OneFlow's axis: the error names the signature
    _fails(lambda a: flow.math.top_k(a, 6), [x], ValueError,
           r"top_k: axis 6 is out of range for a rank-3 input .*top_k\(input, axis=-1, k=1, sorted=True\)")
    _fails(lambda a: flow.sort(a, direction="UP"), [x], ValueError, r"sort: direction must be")
    _fails(lambda a: flow.expand(a, [2, 4, 5]), [x], ValueError, r"expand: dim 1 of the input")
    _fails(lambda a, b: flow.matmul(a, b), [rnd(2, 3, 4), rnd(3, 4, 2)], ValueError,
           r"matmul: batch dimensions differ and cannot be broadcast together \(numpy rules\): "
           r"a is \(2, 3, 4\), b is \(3, 4, 2\)")
    _fails(lambda a: flow.assign(a, a), [x], TypeError, r"assign: ref must be a variable")
