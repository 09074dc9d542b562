"""flow.categorical_ordinal_encode and flow.layers.categorical_ordinal_encoder
against a sequential reference (OneFlow's CPU kernel): ordinals 1, 2, ... by
first appearance, kept across runs and jobs, 0 for 0; the capacity limit and
the argument checks."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


def _reference(state, x):
    out = np.zeros_like(x)
    for i, v in enumerate(x.ravel()):
        if v != 0:
            out.flat[i] = state.setdefault(int(v), len(state) + 1)
    return out


def test_the_docstring_example():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3, 3), dtype=flow.int32)) -> tp.Numpy:
        return flow.layers.categorical_ordinal_encoder(x, 16)

    x = np.array([[7, 0, 2], [1, 7, 2], [0, 1, 7]], np.int32)
    np.testing.assert_array_equal(job(x), [[1, 0, 2], [3, 1, 2], [0, 3, 1]])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n", [1, 6, 37])
def test_runs_match_the_sequential_encoder(dtype, n):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(n)
    tokens = rng.integers(info.min, info.max, 60, dtype=dtype)
    tokens[:4] = [0, info.max, info.min, -1]

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((n,), dtype=dtype)) -> tp.Numpy:
        return flow.layers.categorical_ordinal_encoder(x, capacity=64, name="enc")

    state = {}
    for _ in range(12):
        x = tokens[rng.integers(0, tokens.size, n)]
        y = job(x)
        assert y.dtype == dtype and y.shape == x.shape
        np.testing.assert_array_equal(y, _reference(state, x))
    v = flow.get_all_variables()
    assert v["enc-Size"][0] == len(state)
    pairs = v["enc-Table"].reshape(64, 2)[:len(state)]
    assert sorted(state.items()) == [tuple(p) for p in pairs.tolist()]  # our layout: sorted (key, ordinal)


def test_the_state_is_shared_by_jobs_and_separate_per_encoder():
    @flow.global_function()
    def two(x: tp.Numpy.Placeholder((4,), dtype=flow.int64)) -> tp.Numpy:
        a = flow.layers.categorical_ordinal_encoder(x, 8, name="a")
        b = flow.layers.categorical_ordinal_encoder(flow.math.negative(x), 8, name="b")
        return flow.concat([a, b], axis=0)

    @flow.global_function()
    def only_a(x: tp.Numpy.Placeholder((2,), dtype=flow.int64)) -> tp.Numpy:
        return flow.layers.categorical_ordinal_encoder(x, 8, name="a")

    np.testing.assert_array_equal(two(np.array([5, 9, 5, 3], np.int64)), [1, 2, 1, 3] * 2)
    np.testing.assert_array_equal(only_a(np.array([4, 9], np.int64)), [4, 2])
    np.testing.assert_array_equal(two(np.array([4, 6, 3, 0], np.int64)), [4, 5, 3, 0, 4, 5, 3, 0])


def test_explicit_state_variables():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((5,), dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("T", shape=(12,), dtype=flow.int32, initializer=flow.constant_initializer(0),
                                  trainable=False)
        size = flow.get_variable("S", shape=(1,), dtype=flow.int32, initializer=flow.constant_initializer(0),
                                 trainable=False)
        return flow.categorical_ordinal_encode(table, size, x, name="Encode")

    np.testing.assert_array_equal(job(np.array([30, 10, 30, 20, 0], np.int32)), [1, 2, 1, 3, 0])
    np.testing.assert_array_equal(job(np.array([20, 40, 50, 60, 40], np.int32)), [3, 4, 5, 6, 4])
    assert flow.get_all_variables()["S"][0] == 6
    # a seventh value does not fit the capacity 6: the run fails and says so
    with pytest.raises(IndexError, match="categorical_ordinal_encode: the number of distinct values "
                                         r"\(capacity 6\)"):
        job(np.array([70, 10, 20, 30, 40], np.int32))


def test_argument_checks():
    def trace(body, dtype=flow.int32):
        @flow.global_function()
        def job(x: tp.Numpy.Placeholder((3,), dtype=dtype)) -> tp.Numpy:
            return body(x)
        return job(np.zeros(3, dtype.np if hasattr(dtype, "np") else np.float32))

    with pytest.raises(TypeError, match="input_tensor must be int32 or int64, got flow.float32"):
        trace(lambda x: flow.layers.categorical_ordinal_encoder(x, 4), flow.float32)
    with pytest.raises(ValueError, match="capacity must be an int >= 1, got 0"):
        trace(lambda x: flow.layers.categorical_ordinal_encoder(x, 0))
    with pytest.raises(ValueError, match="hash_precomputed must be True"):
        trace(lambda x: flow.layers.categorical_ordinal_encoder(x, 4, hash_precomputed=False))

    def wrong_dtype(x):
        t = flow.get_variable("T64", shape=(8,), dtype=flow.int64, trainable=False)
        s = flow.get_variable("S64", shape=(1,), dtype=flow.int64, trainable=False)
        return flow.categorical_ordinal_encode(t, s, x)

    with pytest.raises(TypeError, match=r"table \(flow.int64\) and size \(flow.int64\) must have the input's "
                                        r"dtype flow.int32"):
        trace(wrong_dtype)

    def not_a_variable(x):
        return flow.categorical_ordinal_encode(flow.zeros((8,), flow.int32), flow.zeros((1,), flow.int32), x)

    with pytest.raises(TypeError, match="table must be a variable"):
        trace(not_a_variable)
