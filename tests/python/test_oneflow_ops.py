"""OneFlow's other ops (issue [conformance]): constant_like, scatters into a
tensor, diag, dim_gather, reverse, segment sums, top_k's OneFlow signature,
flow.math extras and flow.random, against numpy;
gradients against float64 finite differences (test_autodiff.check)."""
import itertools
import math

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from test_autodiff import check

_DT = {np.dtype(np.float64): flow.float64, np.dtype(np.float32): flow.float32,
       np.dtype(np.int32): flow.int32, np.dtype(np.int64): flow.int64, np.dtype(np.int8): flow.int8,
       np.dtype(np.bool_): flow.bool}
_count = itertools.count()


@pytest.fixture(autouse=True)
def fresh_session():
    yield
    flow.clear_default_session()


def run(f, *arrays, raw=False):
    """f(*blobs) in a predict job fed `arrays`; its result as numpy (a list
    when f returns several)."""
    ns = {"_f": f, "tp": tp}
    params = []
    for i, a in enumerate(arrays):
        ns[f"_t{i}"] = tp.Numpy.Placeholder(a.shape, dtype=_DT[a.dtype])
        params.append(f"a{i}: _t{i}")
    name = f"oneflow_ops_job_{next(_count)}"
    exec(f"def {name}({', '.join(params)}):\n"  # noqa: S102
         f"    return _f({', '.join(f'a{i}' for i in range(len(arrays)))})\n", ns)
    cfg = flow.function_config()
    cfg.default_data_type(flow.float64 if any(a.dtype == np.float64 for a in arrays) else flow.float32)
    job = flow.global_function(type="predict", function_config=cfg)(ns[name])
    out = job(*arrays).get()
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) else out.numpy()


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- constants and shapes

@pytest.mark.parametrize("dtype,np_dtype", [(None, np.float32), (flow.float64, np.float64),
                                            (flow.int8, np.int8), (flow.int64, np.int64)])
def test_constant_like(dtype, np_dtype):
    x = rnd(3, 4)
    y = run(lambda a: flow.constant_like(a, 6.0, dtype=dtype), x)
    assert y.dtype == np_dtype and y.shape == (3, 4)
    np.testing.assert_array_equal(y, np.full((3, 4), 6, np_dtype))


def test_constant_scalar_and_elem_cnt():
    x = rnd(3, 4, 5)
    c, n, m = run(lambda a: (flow.constant_scalar(2.5, flow.float), flow.elem_cnt(a),
                             flow.math.reduced_shape_elem_cnt(a, axis=[0, 1])), x)
    np.testing.assert_array_equal(c, [2.5])
    assert n.dtype == np.int32 and n.tolist() == [60] and m.tolist() == [12]


def test_broadcast_to_compatible_with():
    x = rnd(5, 1)
    y = run(lambda a: flow.broadcast_to_compatible_with(a, [flow.zeros([4, 5, 1]), flow.zeros([1, 2])]), x)
    np.testing.assert_array_equal(y, np.broadcast_to(x, (4, 5, 2)))
    check("broadcast_to_compatible_with",
          lambda a: flow.math.broadcast_to_compatible_with(a, [flow.zeros([3, 2, 4], flow.float64)]),
          lambda a: np.broadcast_to(a, (3, 2, 4)), [rnd(2, 1)])


def test_broadcast_to_compatible_with_rejects_incompatible():
    with pytest.raises(ValueError, match=r"do not broadcast \(dim 1: 3 vs 4\)"):
        run(lambda a: flow.broadcast_to_compatible_with(a, [flow.zeros([2, 4])]), rnd(2, 3))


def test_reshape_like_reverse_identity_n():
    x = rnd(2, 3, 4)
    r, rv, i0, i1 = run(lambda a: (flow.reshape_like(a, flow.zeros([6, 4])), flow.reverse(a, [0, -1]),
                                  *flow.identity_n([a, a + 1])), x)
    np.testing.assert_array_equal(r, x.reshape(6, 4))
    np.testing.assert_array_equal(rv, x[::-1, :, ::-1])
    np.testing.assert_array_equal(i1, x + 1)
    check("reverse", lambda a: flow.reverse(a, 1), lambda a: a[:, ::-1], [rnd(3, 4)])


def test_zero_pad2d_and_same_padding():
    x = rnd(1, 2, 3, 4)
    z, s_up, s_lo = run(lambda a: (flow.zero_pad2d(a, [1, 2, 0, 3]),
                                   flow.same_padding(a, "SAME_UPPER", "NCHW", [2, 2], [1, 1], [1, 1]),
                                   flow.same_padding(a, "same_lower", "NCHW", [2, 2], [1, 1], [1, 1])), x)
    np.testing.assert_array_equal(z, np.pad(x, [(0, 0), (0, 0), (0, 3), (1, 2)]))
    np.testing.assert_array_equal(s_up, np.pad(x, [(0, 0), (0, 0), (0, 1), (0, 1)]))
    np.testing.assert_array_equal(s_lo, np.pad(x, [(0, 0), (0, 0), (1, 0), (1, 0)]))


# ---------------------------------------------------------------- gathers and scatters

def test_tensor_scatter_nd_add_and_update():
    p = rnd(6, 3)
    idx = np.array([[4], [1], [4]], np.int32)
    u = rnd(3, 3, seed=1)
    add, upd = run(lambda a, i, b: (flow.tensor_scatter_nd_add(a, i, b), flow.tensor_scatter_nd_update(a, i, b)),
                   p, idx, u)
    ref_add = p.copy()
    np.add.at(ref_add, idx[:, 0], u)
    ref_upd = p.copy()
    ref_upd[1], ref_upd[4] = u[1], u[2]  # the last of a repeated index wins
    np.testing.assert_allclose(add, ref_add, rtol=1e-6)
    np.testing.assert_array_equal(upd, ref_upd)


def test_tensor_scatter_nd_update_gradient():
    idx = np.array([[0, 1], [2, 0]], np.int32)

    def ref(p, u, i):
        out = p.copy()
        out[i[:, 0], i[:, 1]] = u
        return out
    check("tensor_scatter_nd_update", lambda p, u, i: flow.tensor_scatter_nd_update(p, i, u), ref,
          [rnd(3, 2), rnd(2, seed=2)], consts=[idx])


def test_dim_gather():
    x = rnd(3, 4)
    idx = np.array([[0, 3], [2, 2], [1, 0]], np.int32)
    y = run(lambda a, i: flow.dim_gather(a, 1, i), x, idx)
    np.testing.assert_array_equal(y, np.take_along_axis(x, idx, 1))
    idx0 = np.array([[2, 0, 1, 2]], np.int64)
    np.testing.assert_array_equal(run(lambda a, i: flow.dim_gather(a, 0, i), x, idx0),
                                  np.take_along_axis(x, idx0, 0))
    check("dim_gather", lambda a, i: flow.dim_gather(a, 1, i),
          lambda a, i: np.take_along_axis(a, i, 1), [rnd(3, 4)], consts=[idx])


@pytest.mark.parametrize("shape,d", [((3,), 0), ((3,), 2), ((3,), -1), ((3, 3), 0), ((3, 4), 2),
                                     ((3, 4), -1), ((4, 3), -2)])
def test_diag(shape, d):
    x = rnd(*shape)
    np.testing.assert_array_equal(run(lambda a: flow.diag(a, d), x), np.diag(x, d))
    check(f"diag_{len(shape)}_{shape[-1]}_{d + 5}", lambda a: flow.diag(a, d), lambda a: np.diag(a, d), [x])


def test_unsorted_batch_segment_sum():
    data = rnd(2, 5, 3)
    ids = np.array([[0, 2, 2, 1, 0], [3, 3, 0, 1, 1]], np.int32)
    y = run(lambda a, i: flow.math.unsorted_batch_segment_sum(a, i, 4), data, ids)
    ref = np.zeros((2, 4, 3), np.float32)
    for b in range(2):
        np.add.at(ref[b], ids[b], data[b])
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


def test_count_not_finite():
    x = rnd(4, 5)
    x[0, 1], x[2, 2], x[3, 0] = np.nan, np.inf, -np.inf
    y2 = rnd(3).astype(np.float64)
    y2[1] = np.nan
    c, m = run(lambda a, b: (flow.count_not_finite(a), flow.multi_count_not_finite([a, b, a])), x, y2)
    assert c.dtype == np.int64 and c.tolist() == [3] and m.tolist() == [7]


# ---------------------------------------------------------------- sorting and one_hot

def test_top_k_oneflow_signature():
    x = (rnd(4, 6) * 10).round()  # ties: the lower index first
    np.testing.assert_array_equal(run(lambda a: flow.math.top_k(a, -1, 3), x),
                                  np.argsort(-x, axis=-1, kind="stable")[:, :3])
    np.testing.assert_array_equal(run(lambda a: flow.math.top_k(a, 0, 2), x),
                                  np.argsort(-x, axis=0, kind="stable")[:2])
    np.testing.assert_array_equal(run(lambda a: flow.math.top_k(a, k=10), x),
                                  np.argsort(-x, axis=-1, kind="stable"))
    with pytest.raises(ValueError, match="top_k: axis 3 is out of range"):
        run(lambda a: flow.math.top_k(a, 3), x)


def test_in_top_k_non_finite_rows_are_false():
    p = rnd(4, 5)
    p[1, 2] = np.inf                     # a row holding an infinity
    p[2, 0] = np.nan                     # and one holding a NaN
    t = np.array([0, 2, 3, 4], np.int32)
    y = run(lambda a, b: flow.math.in_top_k(a, b, 2), t, p)
    ref = [(p[i] > p[i, t[i]]).sum() < 2 for i in range(4)]
    ref[1] = ref[2] = False
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_one_hot_axis(axis):
    i = np.array([[0, 2], [3, 1]], np.int32)
    y = run(lambda a: flow.one_hot(a, 4, on_value=2, off_value=-1, axis=axis), i)
    ref = np.where(np.eye(4, dtype=bool)[i], 2.0, -1.0)
    np.testing.assert_array_equal(y, np.moveaxis(ref, -1, axis))


def test_masked_fill_broadcasts_x():
    x = rnd(2, 4)
    mask = np.array([[[1, 0, 0, 1]], [[0, 0, 1, 0]]], np.int8)
    y = run(lambda a, m: flow.masked_fill(a, m, 7.0), x, mask)
    np.testing.assert_array_equal(y, np.where(mask != 0, 7.0, np.broadcast_to(x, (2, 2, 4))))


# ---------------------------------------------------------------- flow.math

def test_math_extras():
    x = np.array([0.0, -1.5, 2.5, 0.5, 3.0], np.float64)
    y = np.array([0.0, 2.0, 0.0, 4.0, -1.0], np.float64)
    got = run(lambda a, b: (flow.math.xdivy(a, b), flow.math.reciprocal_no_nan(b), flow.math.rint(a),
                            flow.math.polyval([1.0, 3.0, -2.0], a), flow.math.reduce_euclidean_norm(a),
                            flow.math.two_stage_reduce_max(a), flow.math.two_stage_reduce_min(a, 0, True),
                            flow.math.sigmoid_v2(a), flow.math.tanh_v2(a),
                            flow.math.sigmoid_grad(flow.math.sigmoid(a), b)), x, y)
    with np.errstate(divide="ignore", invalid="ignore"):
        xdivy = np.where(x == 0, 0, x / y)
        rec = np.where(y == 0, 0, 1 / y)
    sig = 1 / (1 + np.exp(-x))
    refs = [xdivy, rec, np.rint(x), np.polyval([1.0, 3.0, -2.0], x), np.sqrt((x * x).sum()),
            x.max(), [x.min()], sig, np.tanh(x), y * sig * (1 - sig)]
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_gelu_grad_matches_autodiff_of_gelu():
    x = np.linspace(-3, 3, 13)
    dy = np.cos(x)
    g = run(lambda a, b: flow.math.gelu_grad(a, b), x, dy)
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    np.testing.assert_allclose(g, dy * (cdf + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)), rtol=1e-12)


def test_lgamma():
    x = np.array([0.1, 0.5, 1.0, 2.0, 3.7, 10.0, 171.5, -0.5, -2.3, 0.0, -3.0])
    y = run(lambda a: flow.math.lgamma(a), x)
    ref = [math.lgamma(v) if not (v <= 0 and v == int(v)) else np.inf for v in x]
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    check("lgamma", lambda a: flow.math.lgamma(a), lambda a: np.vectorize(math.lgamma)(a),
          [np.array([0.3, 1.7, 4.2, -1.4])], rtol=1e-5)


def test_fused_scale_tril():
    x = rnd(2, 4, 4)
    y = run(lambda a: flow.math.fused_scale_tril(a, diagonal=1, fill_value=-9.0, scale=2.0), x)
    keep = np.tril(np.ones((4, 4), bool), 1)
    np.testing.assert_array_equal(y, np.where(keep, x * 2, np.float32(-9.0)))


def test_linalg_matmul():
    a, b = rnd(3, 4), rnd(4, 2, seed=1)
    np.testing.assert_allclose(run(lambda x, y: flow.linalg.matmul(x, y), a, b), a @ b, rtol=1e-5)


# ---------------------------------------------------------------- flow.random

def _random_job(f, shape, dtype=flow.float32):
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(shape, dtype=dtype)) -> tp.Numpy:
        return f(x)
    return job


def test_bernoulli_extremes_and_rate():
    job = _random_job(lambda x: flow.random.bernoulli(x), (200, 50))
    np.testing.assert_array_equal(job(np.ones((200, 50), np.float32)), 1)
    np.testing.assert_array_equal(job(np.zeros((200, 50), np.float32)), 0)
    a, b = job(np.full((200, 50), 0.3, np.float32)), job(np.full((200, 50), 0.3, np.float32))
    assert abs(a.mean() - 0.3) < 0.02 and not np.array_equal(a, b)   # new draws every call


def test_bernoulli_seed_reproduces():
    def draw():
        return _random_job(lambda x: flow.random.bernoulli(x, seed=7), (64,))(np.full(64, 0.5, np.float32))
    np.testing.assert_array_equal(draw(), draw())


def test_shuffle_and_permutation():
    x = np.arange(40, dtype=np.int32).reshape(20, 2)
    job = _random_job(lambda a: flow.random.shuffle(a), (20, 2), flow.int32)
    y1, y2 = job(x), job(x)
    assert not np.array_equal(y1, x) and not np.array_equal(y1, y2)
    np.testing.assert_array_equal(np.sort(y1[:, 0]), x[:, 0])
    np.testing.assert_array_equal(y1[:, 1], y1[:, 0] + 1)   # rows move whole
    perm = _random_job(lambda a: flow.random.generate_random_batch_permutation_indices(a), (20, 2),
                       flow.int32)(x)
    assert perm.dtype == np.int32 and sorted(perm.tolist()) == list(range(20))


def test_coin_flip_and_gen_seed():
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.random.coin_flip(4000, probability=0.25)
    y = job()
    assert y.dtype == np.int8 and set(np.unique(y)) <= {0, 1} and abs(y.mean() - 0.25) < 0.03
    assert flow.random.gen_seed(5) == (5, True)


# ---------------------------------------------------------------- unsupported

@pytest.mark.parametrize("f,what", [(lambda a: flow.argwhere(a), "argwhere"),
                                    (lambda a: flow.nonzero(a), "nonzero"),
                                    (lambda a: flow.unpack(a, 3), "unpack"),
                                    (lambda a: flow.pack(a, 3), "pack")])
def test_unsupported_ops_say_why(f, what):
    with pytest.raises(NotImplementedError, match=f"{what}: "):
        run(f, rnd(3))


# ---------------------------------------------------------------- regression

def test_gather_large_axis1():
    """gather along axis 1 of (30, 150, 100) by 800 indices (2.4M outputs)."""
    p = np.random.default_rng(3).random((30, 150, 100), dtype=np.float32)
    i = np.random.default_rng(4).integers(0, 150, 800).astype(np.int32)
    np.testing.assert_array_equal(run(lambda a, b: flow.gather(a, b, axis=1), p, i), np.take(p, i, axis=1))


def test_pad_grad_dynamic_reshape_and_aliases():
    x = rnd(4, 5)
    g, r, c = run(lambda a: (flow.pad_grad(a, [(1, 2), (0, 3)]), flow.dynamic_reshape(a, [-1, 2]),
                             flow.clip_by_scalar(a, -0.5, 0.5)), x)
    np.testing.assert_array_equal(g, x[1:2, 0:2])
    np.testing.assert_array_equal(r, x.reshape(-1, 2))
    np.testing.assert_array_equal(c, np.clip(x, -0.5, 0.5))
    ids = np.array([1, 0, 1, 2], np.int32)
    np.testing.assert_allclose(run(lambda a, i: flow.unsorted_segment_sum(a, i, 3), x, ids),
                               np.stack([x[1], x[0] + x[2], x[3]]), rtol=1e-6)


def test_argmax_of_a_vector_and_squeeze_to_nothing_give_shape_1():
    v = rnd(7)
    am, an, sq = run(lambda a: (flow.math.argmax(a), flow.math.argmin(a), flow.squeeze(flow.reshape(flow.slice(a, [0], [1]), [1, 1]))),
                     v)
    assert am.shape == an.shape == sq.shape == (1,)
    assert am.tolist() == [int(np.argmax(v))] and an.tolist() == [int(np.argmin(v))] and sq.tolist() == [v[0]]


def test_repeat_acc():
    x = rnd(4, 3)
    y = run(lambda a: flow.acc(flow.math.square(flow.repeat(a, 5)) + 1.0, 5), x)
    np.testing.assert_allclose(y, (x * x + 1) * 5, rtol=1e-6)
    with pytest.raises(ValueError, match="acc: max_acc_num 3 differs from the repeat_num"):
        run(lambda a: flow.acc(flow.repeat(a, 5), 3), x)
    with pytest.raises(ValueError, match="does not come from a flow.repeat"):
        run(lambda a: flow.acc(a, 2), x)
    with pytest.raises(NotImplementedError, match=r"acc: a random op \(random_uniform_at\)"):
        run(lambda a: flow.acc(flow.random.bernoulli(flow.math.sigmoid(flow.repeat(a, 2))), 2), x)
