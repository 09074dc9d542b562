"""flow.slice_update against numpy's x[slices] = update: strided, negative
and reversed slices, float and int dtypes, its gradient, and OneFlow's
argument checks."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


def _update(x, update, tups):
    @flow.global_function(type="predict")
    def job(a: tp.Numpy.Placeholder(x.shape, dtype=x.dtype),
            b: tp.Numpy.Placeholder(update.shape, dtype=update.dtype)) -> tp.Numpy:
        return flow.slice_update(a, b, tups)

    return job(x, update)


@pytest.mark.parametrize("shape,tups", [
    ((10, 5, 4), [(5, None, None), (None, -1, None), (None, None, 2)]),
    ((9, 7), [(1, 8, 3), (2, 3, 5)]),
    ((9, 7), [(8, 0, -3), (None, None, -1)]),
    ((9, 7), [(-4, None, None)]),         # trailing dims whole
    ((5,), [(4, None, -2)]),
    ((6, 3), [(0, 6, 7), (1, 2, None)]),   # a step past the end: one row
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_slice_update_matches_numpy(rng, shape, tups, dtype):
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    sl = tuple(slice(*t) for t in tups)
    update = (rng.standard_normal(x[sl].shape) * 10).astype(dtype)
    want = x.copy()
    want[sl] = update
    got = _update(x, update, tups)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_slice_update_of_an_empty_slice_is_x(rng):
    x = rng.standard_normal((4, 3)).astype(np.float32)

    @flow.global_function(type="predict")
    def job(a: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        return flow.slice_update(a, flow.zeros((0, 3)), [(2, 2, 1)])

    np.testing.assert_array_equal(job(x), x)


def test_slice_update_gradient_splits_between_x_and_update(rng):
    x = rng.standard_normal((2, 7)).astype(np.float32)
    update = rng.standard_normal((2, 3)).astype(np.float32)
    seen = {}

    @flow.global_function(type="train")
    def train(a: tp.Numpy.Placeholder(x.shape), b: tp.Numpy.Placeholder(update.shape)) -> tp.Numpy:
        va = flow.get_variable("a", shape=x.shape, initializer=flow.zeros_initializer())
        vb = flow.get_variable("b", shape=update.shape, initializer=flow.zeros_initializer())
        a, b = a + va, b + vb
        flow.watch_diff(a, lambda d: seen.__setitem__("a", d))
        flow.watch_diff(b, lambda d: seen.__setitem__("b", d))
        # weights 1..14 tell the gradient of each position apart
        w = flow.reshape(flow.range(1, 15, dtype=flow.float32), (2, 7))
        y = flow.slice_update(a, b, [(None, None, None), (1, 6, 2)])
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])).minimize(
            flow.math.reduce_sum(y * w))
        return y

    y = train(x, update)
    flow.sync_default_session()
    want = x.copy()
    want[:, 1:6:2] = update
    np.testing.assert_array_equal(y, want)
    w = np.arange(1, 15, dtype=np.float32).reshape(2, 7)
    da = w.copy()
    da[:, 1:6:2] = 0
    np.testing.assert_array_equal(seen["a"], da)
    np.testing.assert_array_equal(seen["b"], w[:, 1:6:2])


@pytest.mark.parametrize("tups,shape,err", [
    ([(1, 4, 0)], (3,), "step of dim 0 must not be 0"),
    ([(5, None, None)], (1,), r"start 5 of dim 0 must be in \[-5, 5\)"),
    ([(None, 7, None)], (5,), r"stop 7 of dim 0 must be in \[-6, 5\]"),
    ([(1, 4, 1)], (2,), r"update has shape \(2,\) but the slice"),
    ([(1, 4, 1), (0, 1, 1)], (3,), "at most 1"),
])
def test_slice_update_checks_its_arguments(tups, shape, err):
    x = np.zeros(5, np.float32)
    with pytest.raises(ValueError, match=err):
        _update(x, np.zeros(shape, np.float32), tups)


def test_slice_update_refuses_another_dtype():
    with pytest.raises(TypeError, match="update is flow.int32 but x is flow.float32"):
        _update(np.zeros(5, np.float32), np.zeros(3, np.int32), [(1, 4, 1)])
