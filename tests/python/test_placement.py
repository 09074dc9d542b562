"""Placement per layer inside one job (flow.scope.placement around some
layers, another placement around others): 2 and 3 stages, a stage on 2
devices next to a stage on 1, predict and train (SGD with momentum, several
steps) equal to the one-device job; the segments each placement runs and
where their variables live; checkpoints of stage variables; errors for what
is not supported."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

BATCH = 8
STEPS = 4
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def one_device_after():
    yield
    flow.clear_default_session()
    flow.config.cpu_device_num(1)


def data(steps=STEPS):
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((BATCH, 12)).astype(np.float32),
             rng.integers(0, 4, BATCH).astype(np.int32)) for _ in range(steps)]


class _Nowhere:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _scope(where):
    return _Nowhere() if where is None else flow.scope.placement("cpu", where)


def mlp(x, places):
    """One dense layer per entry of `places` (a placement's device ids, or
    None for no scope); the last one has 4 units (the logits)."""
    init = flow.truncated_normal(0.1)
    units = [16, 8, 6][:len(places) - 1] + [4]
    for i, (where, n) in enumerate(zip(places, units)):
        with _scope(where):
            last = i == len(places) - 1
            x = flow.layers.dense(x, n, activation=None if last else flow.nn.relu,
                                  kernel_initializer=init, name=f"layer{i}")
    return x


def session(devices):
    flow.clear_default_session()
    flow.config.cpu_device_num(devices)


def make_train(places, momentum=0.9, name="train_job"):
    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((BATCH, 12), dtype=flow.float),
                  y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, mlp(x, places))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=momentum).minimize(loss)
        return loss

    train_job.__name__ = name
    return train_job


def make_predict(places):
    @flow.global_function(type="predict")
    def predict_job(x: tp.Numpy.Placeholder((BATCH, 12), dtype=flow.float)) -> tp.Numpy:
        return flow.nn.softmax(mlp(x, places))

    return predict_job


def train(devices, places, steps=STEPS):
    session(devices)
    job = make_train(places)
    losses = [job(x, y) for x, y in data(steps)]
    return losses, {k: np.array(v) for k, v in flow.get_all_variables().items()}, job


def assert_same_run(got, want):
    (gl, gv, _), (wl, wv, _) = got, want
    assert set(gv) == set(wv)
    for a, b in zip(gl, wl):
        np.testing.assert_allclose(a, b, **TOL)
    for k in wv:
        np.testing.assert_allclose(gv[k], wv[k], err_msg=k, **TOL)


def segments(job):
    (compiled,) = job.compiled_jobs()
    return compiled.segments


# ---------------------------------------------------------------- two stages

def test_two_stage_predict_equals_one_device():
    session(1)
    want = make_predict([None, None])(data(1)[0][0])
    session(2)
    job = make_predict(["0:0", "0:1"])
    got = job(data(1)[0][0])
    np.testing.assert_allclose(got, want, **TOL)
    segs = segments(job)
    assert [(s["placement"], s["devices"]) for s in segs] == [(0, [0]), (1, [1])]
    assert all(v.startswith("layer0") for v in segs[0]["variables"])
    assert all(v.startswith("layer1") for v in segs[1]["variables"])
    assert not any(s["distributed"] for s in segs)


def test_two_stage_train_equals_one_device():
    want = train(1, [None, None])
    got = train(2, ["0:0", "0:1"])
    assert_same_run(got, want)
    segs = segments(got[2])
    # forward 0, then forward 1 with its backward and update, then the
    # backward and update of stage 0 back on device 0
    assert [(s["placement"], s["level"]) for s in segs] == [(0, 1), (1, 2), (0, 3)]
    assert {v for v in segs[1]["variables"]} >= {"layer1-weight", "layer1-weight-momentum"}
    assert "layer0-weight-momentum" in segs[2]["variables"]
    assert not any(v.startswith("layer1") for v in segs[0]["variables"] + segs[2]["variables"])


def test_stages_in_reverse_device_order_and_a_predict_job_after_training():
    want = train(1, [None, None])
    got = train(2, ["0:1", "0:0"])
    assert_same_run(got, want)
    probs = make_predict(["0:1", "0:0"])(data(1)[0][0])
    session(1)
    one = make_predict([None, None])
    flow.load_variables(got[1])
    np.testing.assert_allclose(probs, one(data(1)[0][0]), **TOL)


def test_ops_outside_every_scope_follow_their_operands_or_the_scope_around_the_call():
    want = train(1, [None, None])
    got = train(2, [None, "0:1"])  # one scope in the body: the whole job runs on device 1
    assert_same_run(got, want)
    session(2)
    job = make_train([None, "0:1"], name="around")
    with flow.scope.placement("cpu", "0:0"):
        losses = [job(x, y) for x, y in data()]
    for a, b in zip(losses, want[0]):
        np.testing.assert_allclose(a, b, **TOL)
    assert {s["placement"] for s in segments(job)} == {0, 1}


# ---------------------------------------------------------------- three stages, a split stage

def test_three_stages_on_three_devices():
    want = train(1, [None, None, None])
    got = train(3, ["0:0", "0:1", "0:2"])
    assert_same_run(got, want)
    segs = segments(got[2])
    assert [s["placement"] for s in segs] == [0, 1, 2, 1, 0]
    assert [s["devices"] for s in segs[:3]] == [[0], [1], [2]]


def test_a_stage_on_two_devices_next_to_a_stage_on_one():
    want = train(1, [None, None])
    got = train(3, ["0:0-1", "0:2"])
    assert_same_run(got, want)
    segs = segments(got[2])
    assert [(s["devices"], s["distributed"]) for s in segs] == \
        [([0, 1], True), ([2], False), ([0, 1], True)]
    # the first stage's variables are replicated on its two devices only
    assert "layer0-weight" in segs[0]["variables"] and "layer0-weight" not in segs[1]["variables"]
    assert np.array(flow.get_all_variables()["layer0-weight"]).shape == (16, 12)


def test_a_stage_on_two_devices_after_a_stage_on_one_predict():
    session(1)
    want = make_predict([None, None])(data(1)[0][0])
    session(3)
    got = make_predict(["0:0", "0:1-2"])(data(1)[0][0])
    np.testing.assert_allclose(got, want, **TOL)


# ---------------------------------------------------------------- checkpoints

def test_checkpoint_of_stage_variables(tmp_path):
    steps = data(3)
    session(2)
    job = make_train(["0:0", "0:1"])
    for x, y in steps[:2]:
        job(x, y)
    flow.checkpoint.save(str(tmp_path / "ck"))
    after = job(*steps[2])
    final = {k: np.array(v) for k, v in flow.get_all_variables().items()}

    session(2)  # the staged job again, from the checkpoint
    job = make_train(["0:0", "0:1"])
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "ck")))
    np.testing.assert_allclose(job(*steps[2]), after, **TOL)

    session(1)  # and the one-device job from the same checkpoint
    one = make_train([None, None])
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "ck")))
    np.testing.assert_allclose(one(*steps[2]), after, **TOL)
    for k, v in flow.get_all_variables().items():
        np.testing.assert_allclose(np.array(v), final[k], err_msg=k, **TOL)


# ---------------------------------------------------------------- errors

def _predict_on(*places):
    @flow.global_function(type="predict")
    def placed(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        y = x
        for tag, where in places:
            with flow.scope.placement(tag, where):
                y = y * 2 + 1
        return y

    return placed


def test_a_gpu_stage_next_to_cpu_stages_is_not_supported():
    session(2)
    job = _predict_on(("cpu", "0:0"), ("gpu", "0:0"))
    with pytest.raises(NotImplementedError, match=r"job 'placed' places ops on different devices .*"
                       r"placement per layer runs on CPU devices only"):
        job(np.zeros(4, np.float32))


def test_a_device_outside_cpu_device_num_is_a_value_error():
    session(2)
    job = _predict_on(("cpu", "0:0"), ("cpu", "0:2"))
    with pytest.raises(ValueError, match=r"places ops on CPU device 2 .* "
                       r"flow.config.cpu_device_num\(2\) configures devices 0 to 1"):
        job(np.zeros(4, np.float32))
    session(2)
    other = _predict_on(("cpu", "0:0"), ("cpu", "1:0"))
    with pytest.raises(ValueError, match="places ops on machine 1 .* runs on one machine, 0"):
        other(np.zeros(4, np.float32))


def test_stages_need_the_consistent_view_and_whole_inputs():
    session(2)
    cfg = flow.function_config()
    cfg.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="predict", function_config=cfg)
    def mirrored(x: tp.ListNumpy.Placeholder((4,), dtype=flow.float)) -> tp.ListNumpy:
        with flow.scope.placement("cpu", "0:0"):
            y = x[0] + 1 if isinstance(x, list) else x + 1
        with flow.scope.placement("cpu", "0:1"):
            return y * 2

    with pytest.raises(NotImplementedError, match="mirrored view; placement per layer takes the consistent view"):
        mirrored([np.zeros(4, np.float32)] * 2)


def test_small_predict_jobs_on_two_stages_give_the_exact_values():
    session(2)
    job = _predict_on(("cpu", "0:0"), ("cpu", "0:1"), ("cpu", "0:0"))
    np.testing.assert_array_equal(job(np.arange(4, dtype=np.float32)),
                                  ((np.arange(4) * 2 + 1) * 2 + 1) * 2 + 1)
    assert [s["placement"] for s in segments(job)] == [0, 1, 0]


def test_a_variable_kept_on_a_stage_of_two_devices_is_not_laid_out_again_elsewhere():
    session(3)
    job = make_train(["0:0-1", "0:2"])
    job(*data(1)[0])
    over_all = make_predict([None, None])  # data parallel over the 3 devices
    with pytest.raises(ValueError, match=r"variable 'layer0-\w+' is used by jobs that lay it out differently "
                       r"over the devices \(broadcast over 2 device\(s\) before, broadcast over 3 device\(s\) now\)"):
        over_all(data(1)[0][0])
    other_pair = make_predict(["0:1-2", "0:0"])
    with pytest.raises(NotImplementedError, match=r"variable 'layer\d-\w+' is used by jobs spread over "
                       r"different devices .*stages placed on other devices"):
        other_pair(data(1)[0][0])


# ---------------------------------------------------------------- failed checks

@pytest.mark.parametrize("places", [["0:0", "0:1"], ["0:0-1", "0:2"], ["0:0", "0:1-2"], ["0:0", "0:1", "0:2"]],
                         ids=["2-stages", "split-first", "split-loss", "3-stages"])
def test_a_bad_label_in_a_staged_job_names_the_job_and_changes_no_variable(places):
    # [harden] The labels are checked in the last stage's segment; the step
    # counter's increment (and every other assign) runs only after it
    # (jit/stages.cpp), so a failed check leaves every variable as it was,
    # on every placement, and the next good steps train as if it had not run.
    steps = data(3)
    want_losses, want_vars, _ = train(1, [None] * len(places), steps=3)
    session(3)
    job = make_train(places)
    np.testing.assert_allclose(job(*steps[0]), want_losses[0], **TOL)
    before = {k: np.array(v) for k, v in flow.get_all_variables().items()}
    x, y = steps[1]
    bad = y.copy()
    bad[6] = 4  # in the second device's rows where the loss stage is split
    for _ in range(2):
        with pytest.raises(IndexError, match=r"^job 'train_job', test_placement.py:\d+: "
                           r"sparse_softmax_cross_entropy_with_logits: labels holds 4 at \[6\], "
                           r"outside the valid range \[0, 4\)$"):
            job(x, bad)
        after = {k: np.array(v) for k, v in flow.get_all_variables().items()}
        assert sorted(after) == sorted(before)
        for k in before:
            np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    for (x, y), want in zip(steps[1:], want_losses[1:]):
        np.testing.assert_allclose(job(x, y), want, **TOL)
    got = {k: np.array(v) for k, v in flow.get_all_variables().items()}
    for k in want_vars:
        np.testing.assert_allclose(got[k], want_vars[k], err_msg=k, **TOL)
