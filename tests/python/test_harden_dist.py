"""[harden] A failed check in a job spread over several devices: the devices
all-gather their status buffers before the first variable update and at the
end (jit/fusion/schedule.cpp), so every device stops at the same launch, no
device's variables change, the error names the position in the whole batch,
and the next step trains on as if the failed one had not been called.
(Several processes: tests/python/test_multiprocess.py.)"""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

BATCH = 8
CLASSES = 5


@pytest.fixture(autouse=True)
def one_device_after():
    yield
    flow.clear_default_session()
    flow.config.cpu_device_num(1)


def _data(steps):
    rng = np.random.default_rng(3)
    return [(rng.random((BATCH, 6), dtype=np.float32), rng.integers(0, CLASSES, BATCH).astype(np.int32))
            for _ in range(steps)]


def _train(devices, split=False, mirrored=False):
    flow.clear_default_session()
    flow.config.cpu_device_num(devices)
    cfg = flow.function_config()
    cfg.default_logical_view(flow.scope.mirrored_view() if mirrored else flow.scope.consistent_view())
    per = BATCH // devices if mirrored else BATCH
    Input = tp.ListNumpy if mirrored else tp.Numpy

    @flow.global_function(type="train", function_config=cfg)
    def dist_step(x: Input.Placeholder((per, 6)), y: Input.Placeholder((per,), dtype=flow.int32)) -> Input:
        init = flow.truncated_normal(0.1)
        h = flow.layers.dense(x, 8, activation=flow.nn.relu, kernel_initializer=init, name="hidden",
                              model_distribute=flow.distribute.split(axis=0) if split else None)
        logits = flow.layers.dense(h, CLASSES, kernel_initializer=init, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.01]),
                            do_bias_correction=True).minimize(loss)
        return loss

    if not mirrored:
        return dist_step
    return lambda x, y: np.concatenate(dist_step(np.split(x, devices), np.split(y, devices)))


def _variables():
    return {k: np.array(v) for k, v in flow.get_all_variables().items()}


@pytest.mark.parametrize("split", [False, True], ids=["broadcast", "split-weight"])
def test_a_bad_label_on_one_device_changes_no_device_and_names_the_logical_position(split):
    data = _data(3)
    one = _train(1, split)
    want_losses = [one(x, y) for x, y in data]
    want = _variables()

    step = _train(2, split)
    np.testing.assert_allclose(step(*data[0]), want_losses[0], rtol=1e-5, atol=1e-6)
    before = _variables()
    x, y = data[1]
    bad = y.copy()
    bad[6] = CLASSES  # row 6 of 8: the second device's half, its local row 2
    for _ in range(2):  # and again: the communicator was not aborted
        with pytest.raises(IndexError, match=r"job 'dist_step', test_harden_dist.py:\d+: "
                           r"sparse_softmax_cross_entropy_with_logits: labels holds 5 at \[6\], "
                           r"outside the valid range \[0, 5\)"):
            step(x, bad)
        after = _variables()
        assert sorted(after) == sorted(before)
        for k in before:  # weights, Adam's moments, the step counter
            np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    # The next good steps: as on one device that never saw the bad one. (A
    # device that had applied the failed update alone would hold other
    # replicas and make the next gradients differ.)
    for (x, y), want_loss in zip(data[1:], want_losses[1:]):
        np.testing.assert_allclose(step(x, y), want_loss, rtol=1e-5, atol=1e-6)
    got = _variables()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_bad_label_on_the_first_device_of_two_and_on_both():
    data = _data(1)
    step = _train(2)
    x, y = data[0]
    step(x, y)
    before = _variables()
    bad = y.copy()
    bad[1] = -1
    bad[5] = 7
    # Both devices fail: the first device's is reported, and nothing changes.
    with pytest.raises(IndexError, match=r"labels holds -1 at \[1\], outside the valid range \[0, 5\)"):
        step(x, bad)
    bad[1] = y[1]
    with pytest.raises(IndexError, match=r"labels holds 7 at \[5\], outside the valid range \[0, 5\)"):
        step(x, bad)
    for k, v in _variables().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_mirrored_view_names_the_device_whose_input_holds_the_bad_label():
    data = _data(2)
    step = _train(2, mirrored=True)
    step(*data[0])
    before = _variables()
    x, y = data[1]
    bad = y.copy()
    bad[6] = CLASSES
    with pytest.raises(IndexError, match=r"labels holds 5 at \[2\] on device 1, outside the valid range"):
        step(x, bad)
    for k, v in _variables().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    step(x, y)
    assert any(not np.array_equal(v, before[k]) for k, v in _variables().items())


def test_a_predict_job_reports_the_logical_position_and_train_jobs_still_run():
    flow.clear_default_session()
    flow.config.cpu_device_num(2)

    @flow.global_function()
    def ce(y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32), z: tp.Numpy.Placeholder((BATCH, 3))) -> tp.Numpy:
        return flow.nn.sparse_softmax_cross_entropy_with_logits(y, z)

    y = np.zeros(BATCH, np.int32)
    y[7] = 3
    with pytest.raises(IndexError, match=r"labels holds 3 at \[7\], outside the valid range \[0, 3\)"):
        ce(y, np.zeros((BATCH, 3), np.float32))
    assert ce(np.ones(BATCH, np.int32), np.zeros((BATCH, 3), np.float32)).shape == (BATCH,)
