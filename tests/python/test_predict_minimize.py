"""OneFlow's minimize in a job declared type="predict": it sets the job's
train_conf, so the job trains (and flow.watch_diff before it gets its
gradient); a watch_diff in a job that never minimizes is still an error."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


def test_minimize_makes_a_predict_job_train():
    seen = []

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))
        h = x * w
        flow.watch_diff(h, seen.append)
        loss = flow.math.reduce_sum(h * h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    x = np.array([1.0, 2.0, 3.0], np.float32)
    assert job(x) == 14.0
    flow.sync_default_session()
    np.testing.assert_array_equal(seen[0], 2 * x)
    np.testing.assert_allclose(flow.get_all_variables()["w"], 1.0 - 0.1 * 2 * x * x, rtol=1e-6)


def test_watch_diff_without_minimize_is_refused_at_its_line():
    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        flow.watch_diff(x * 2.0, print)  # WATCH-LINE
        return x

    with pytest.raises(ValueError, match=r"^job 'job', test_predict_minimize\.py:\d+: flow\.watch_diff: job 'job' "
                                         r"is a predict job; gradients exist only in train jobs"):
        job(np.ones(2, np.float32))
