"""flow.experimental's lazy ops (OneFlow 0.4-0.5): unique_with_counts,
indexed_slices_reduce_sum and square_sum against numpy, in OneFlow's dynamic
result layout (the first num_unique rows are the answer)."""
import typing

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.int64])
def test_unique_with_counts(dtype):
    rng = np.random.default_rng(3)
    x = rng.integers(-5, 20, 300).astype(dtype)

    @flow.global_function(type="predict")
    def uniq(x: tp.Numpy.Placeholder(x.shape, dtype=dtype)) -> typing.Tuple[tp.Numpy, tp.Numpy, tp.Numpy,
                                                                     tp.Numpy]:
        return flow.experimental.unique_with_counts(x)

    y, idx, count, num = uniq(x)
    n = int(num.item())
    ref, first, ref_count = np.unique(x, return_index=True, return_counts=True)
    assert n == ref.size and num.shape == (1,) and idx.dtype == np.int32 and count.dtype == np.int32
    order = np.argsort(first)  # first-appearance order
    np.testing.assert_array_equal(y[:n], ref[order])
    np.testing.assert_array_equal(count[:n], ref_count[order])
    np.testing.assert_array_equal(y[:n][idx], x)
    assert y.dtype == x.dtype and y.shape == x.shape


def test_indexed_slices_reduce_sum():
    rng = np.random.default_rng(4)
    ind = rng.integers(0, 12, 200).astype(np.int32)
    val = rng.standard_normal((200, 5)).astype(np.float32)

    @flow.global_function(type="predict")
    def isrs(i: tp.Numpy.Placeholder(ind.shape, dtype=flow.int32),
             v: tp.Numpy.Placeholder(val.shape)) -> typing.Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        return flow.experimental.indexed_slices_reduce_sum(i, v)

    yi, yv, num = isrs(ind, val)
    n = int(num.item())
    assert num.dtype == np.int64 and n == np.unique(ind).size
    for k in range(n):
        np.testing.assert_allclose(yv[k], val[ind == yi[k]].sum(0), rtol=1e-5, atol=1e-5)
    assert sorted(yi[:n].tolist()) == sorted(np.unique(ind).tolist())


def test_square_sum_and_bad_input():
    x = np.linspace(-1, 1, 30).astype(np.float32).reshape(5, 6)

    @flow.global_function(type="predict")
    def ss(x: tp.Numpy.Placeholder((5, 6))) -> tp.Numpy:
        return flow.experimental.square_sum(x)

    out = ss(x)
    assert out.shape == (1,)
    np.testing.assert_allclose(out[0], (x.astype(np.float64) ** 2).sum(), rtol=1e-5)

    @flow.global_function(type="predict")
    def bad(x: tp.Numpy.Placeholder((5, 6))) -> typing.Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        return flow.experimental.unique_with_counts(x)

    with pytest.raises(ValueError, match="expects a 1-D blob"):
        bad(x)


def test_an_op_outside_a_job_is_not_implemented_as_in_oneflow():
    with pytest.raises(NotImplementedError, match="no eager mode"):
        flow.math.exp(1.0)


def test_older_placement_names_empty_initializer_and_reuse_strategy():
    with pytest.warns(DeprecationWarning, match="flow.scope.placement"):
        p = flow.fixed_placement("cpu", "0:0")

    @flow.global_function(type="predict")
    def placed(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        with p:
            w = flow.get_variable("empty_w", shape=(3,), initializer=flow.empty_initializer())
            return x + w

    np.testing.assert_array_equal(placed(np.ones(3, np.float32)), np.ones(3))
    assert flow.device_prior_placement is flow.fixed_placement
    flow.inter_job_reuse_mem_strategy("mem_sharing_priority")
    with pytest.raises(ValueError, match="expected one of"):
        flow.inter_job_reuse_mem_strategy("fastest")
