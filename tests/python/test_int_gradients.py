"""Gradients through integer blobs, as OneFlow's kernels carry them: a float
variable cast to an integer type, computed on in that type and cast back (or
minimized as an integer loss) gets the integer chain's gradient, and
flow.watch_diff of an integer blob sees it. Ops that only add, multiply,
select or move values pass integer gradients; others (comparisons, gather's
indices, argmax) stop them, as for floats."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

SHAPE = (3, 4)


def _run(body, x, int_loss=False):
    flow.clear_default_session()
    got = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder(SHAPE)) -> tp.Numpy:
        v = flow.get_variable("v", shape=(1,), initializer=flow.zeros_initializer())
        xi = flow.cast(x + v, flow.int32)
        out = body(xi)
        loss = out if int_loss else flow.cast(out, flow.float)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1e-3]), momentum=0).minimize(loss)
        flow.watch_diff(xi, lambda d: got.setdefault("x_diff", d))
        flow.watch_diff(out, lambda d: got.setdefault("out_diff", d))
        return out

    out = job(x)
    return out, got["x_diff"], got["out_diff"], flow.get_all_variables()["v"].numpy()


def test_multiply_in_int32_has_oneflows_gradients():
    x = np.arange(12, dtype=np.float32).reshape(SHAPE)
    out, x_diff, out_diff, v = _run(lambda xi: xi * xi, x)
    np.testing.assert_array_equal(out, (x * x).astype(np.int32))
    assert x_diff.dtype == np.int32 and out_diff.dtype == np.int32
    np.testing.assert_array_equal(out_diff, np.ones(SHAPE))
    np.testing.assert_array_equal(x_diff, 2 * x)
    # the float variable gets the sum of the integer gradient (mean over the loss's 12 elements)
    np.testing.assert_allclose(v, [-1e-3 * (2 * x).sum() / 12], rtol=1e-6)


def test_an_integer_loss_is_minimized():
    x = np.arange(12, dtype=np.float32).reshape(SHAPE)
    out, x_diff, _, v = _run(lambda xi: flow.math.tril(xi * 3), x, int_loss=True)
    np.testing.assert_array_equal(x_diff, np.tril(np.full(SHAPE, 3)))
    assert v[0] < 0


def test_integer_gradients_stop_at_comparisons():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder(SHAPE)) -> tp.Numpy:
        v = flow.get_variable("w", shape=(1,), initializer=flow.ones_initializer())
        xi = flow.cast(x * v, flow.int32)
        loss = flow.cast(flow.math.greater(xi, 3), flow.float) + v * 0.0
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
        return loss

    job(np.ones(SHAPE, np.float32))
    assert flow.get_all_variables()["w"].numpy()[0] == 1.0  # only the (zero) float path reached it


def test_watch_diff_of_a_bool_blob_is_refused():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder(SHAPE)) -> tp.Numpy:
        v = flow.get_variable("u", shape=(1,), initializer=flow.zeros_initializer())
        loss = x + v
        flow.watch_diff(flow.math.greater(x, 0.0), print)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
        return loss

    with pytest.raises(TypeError, match=r"flow\.watch_diff: blob .* is flow\.bool; only number blobs have "
                                        r"gradients"):
        job(np.ones(SHAPE, np.float32))
