"""sort, argsort and top_k follow numpy's total order on floats (NaN, +-inf, -0.0)."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

SPECIAL = np.array([3, np.nan, 1, -np.inf, 2, -0.0, 0.0, np.inf, np.nan, -0.0, -5], np.float64)


def _run(body, x, fusion=True, monkeypatch=None):
    if not fusion:
        monkeypatch.setenv("FLOWJIT_DISABLE_FUSION", "1")

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder(x.shape, dtype=getattr(flow, x.dtype.name))) -> tp.Numpy:
        return body(a)
    return job(x)


def _descending_order(row):
    """Stable, NaN first (TensorFlow's top_k), -0.0 == 0.0."""
    def key(i):
        return (False, 0.0) if np.isnan(row[i]) else (True, -row[i])
    return sorted(range(len(row)), key=key)


def _same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("fusion", [True, False])
def test_sort_and_argsort_ascending_match_numpy(dtype, fusion, monkeypatch):
    x = SPECIAL.astype(dtype)
    order = np.argsort(x, kind="stable")
    got = _run(lambda a: flow.argsort(a), x, fusion, monkeypatch)
    np.testing.assert_array_equal(got, order)
    # the values move exactly: -0.0 keeps its sign, NaN its place
    _same_bits(_run(lambda a: flow.sort(a), x, fusion, monkeypatch), x[order])


def test_sort_descending_puts_nan_first():
    x = SPECIAL.astype(np.float32)
    order = _descending_order(x)
    np.testing.assert_array_equal(_run(lambda a: flow.argsort(a, direction="DESCENDING"), x), order)
    _same_bits(_run(lambda a: flow.sort(a, direction="DESCENDING"), x), x[order])


def test_top_k_treats_nan_as_largest():
    x = np.array([3, np.nan, 1, -np.inf, 2], np.float32)
    np.testing.assert_array_equal(_run(lambda a: flow.math.top_k(a, k=3), x), [1, 0, 4])
    x = SPECIAL.astype(np.float32)
    np.testing.assert_array_equal(_run(lambda a: flow.math.top_k(a, k=5), x), _descending_order(x)[:5])


def test_sort_along_a_leading_axis_of_a_matrix():
    x = np.stack([SPECIAL, SPECIAL[::-1], -SPECIAL]).T.astype(np.float32)   # (11, 3)
    order = np.argsort(x, axis=0, kind="stable")
    np.testing.assert_array_equal(_run(lambda a: flow.argsort(a, axis=0), x), order)
    _same_bits(_run(lambda a: flow.sort(a, axis=0), x), np.take_along_axis(x, order, 0))


def test_all_nan_row_keeps_index_order():
    x = np.full((2, 4), np.nan, np.float32)
    np.testing.assert_array_equal(_run(lambda a: flow.argsort(a), x), [[0, 1, 2, 3]] * 2)
    np.testing.assert_array_equal(_run(lambda a: flow.math.top_k(a, k=2), x), [[0, 1]] * 2)


def test_int64_sort_is_exact_beyond_2_53():
    x = np.array([2 ** 62 + 1, 2 ** 62, -(2 ** 63), 2 ** 63 - 1, 2 ** 62 + 1], np.int64)
    np.testing.assert_array_equal(_run(lambda a: flow.sort(a), x), np.sort(x))
    np.testing.assert_array_equal(_run(lambda a: flow.argsort(a), x), np.argsort(x, kind="stable"))

