"""Several devices: the seed's MLP and OneFlow's mixed_parallel_mlp on 1, 2
and 4 CPU devices (consistent view, data parallel and with the second layer
split; mirrored view) give the variables of the single-device run; layouts
and collectives (every dtype, odd sizes); error paths."""
from typing import Tuple

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

BATCH = 100
STEPS = 4


@pytest.fixture(autouse=True)
def one_device_after():
    yield
    flow.clear_default_session()
    flow.config.cpu_device_num(1)


def seed_data(steps=STEPS, batch=BATCH):
    rng = np.random.default_rng(7)
    return [(rng.random((batch, 1, 28, 28), dtype=np.float32),
             rng.integers(0, 10, batch).astype(np.int32)) for _ in range(steps)]


def mlp(images, split_second=False):
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, kernel_initializer=initializer,
                               name="hidden")
    return flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="output",
                             model_distribute=flow.distribute.split(axis=0) if split_second else None)


def train_consistent(devices, split_second=False, optimizer="sgd", units_check=None):
    flow.clear_default_session()
    flow.config.cpu_device_num(devices)
    cfg = flow.function_config()
    cfg.default_logical_view(flow.scope.consistent_view())

    @flow.global_function(type="train", function_config=cfg)
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images, split_second))
        sched = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
        if optimizer == "sgd":
            flow.optimizer.SGD(sched, momentum=0).minimize(loss)
        else:
            flow.optimizer.Adam(sched, do_bias_correction=True).minimize(loss)
        return loss

    losses = [train_job(x, y) for x, y in seed_data()]
    return losses, {k: np.array(v) for k, v in flow.get_all_variables().items()}, train_job


def train_mirrored(devices):
    flow.clear_default_session()
    flow.config.cpu_device_num(devices)
    cfg = flow.function_config()
    cfg.default_logical_view(flow.scope.mirrored_view())
    per = BATCH // devices

    @flow.global_function(type="train", function_config=cfg)
    def train_job(images: tp.ListNumpy.Placeholder((per, 1, 28, 28), dtype=flow.float),
                  labels: tp.ListNumpy.Placeholder((per,), dtype=flow.int32)) -> tp.ListNumpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    losses = []
    for x, y in seed_data():
        per_device = train_job(np.split(x, devices), np.split(y, devices))
        assert isinstance(per_device, list) and len(per_device) == devices
        losses.append(np.concatenate(per_device))
    return losses, {k: np.array(v) for k, v in flow.get_all_variables().items()}, train_job


def assert_same_variables(got, want, rtol=1e-5, atol=1e-6):
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.fixture(scope="module")
def single_device():
    losses, variables, _ = train_consistent(1)
    flow.clear_default_session()
    return losses, variables


@pytest.mark.parametrize("devices", [2, 4])
def test_data_parallel_matches_one_device(single_device, devices):
    losses, variables, job = train_consistent(devices)
    assert_same_variables(variables, single_device[1])
    for got, want in zip(losses, single_device[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    dist = job.compiled_jobs()[0].distribution
    assert "input 0: S(0)" in dist and "variable hidden-weight: B" in dist


def test_second_layer_split_matches_one_device(single_device):
    losses, variables, job = train_consistent(2, split_second=True)
    assert_same_variables(variables, single_device[1])
    dist = job.compiled_jobs()[0].distribution
    assert "variable output-weight: S(0)" in dist
    # the gradient of the split weight is reduce-scattered, not all-reduced
    assert "-> S(0)" in dist


def test_split_that_does_not_divide_warns_and_keeps_the_variable_whole(single_device):
    with pytest.warns(UserWarning, match="does not divide into 4 equal pieces"):
        _, variables, _ = train_consistent(4, split_second=True)
    assert_same_variables(variables, single_device[1])


def test_mirrored_view_matches_one_device(single_device):
    losses, variables, _ = train_mirrored(2)
    assert_same_variables(variables, single_device[1])
    for got, want in zip(losses, single_device[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_adam_with_a_split_variable_matches_one_device():
    _, want, _ = train_consistent(1, optimizer="adam")
    _, got, _ = train_consistent(2, split_second=True, optimizer="adam")
    # Adam divides by sqrt(v): where a gradient nearly cancels (sums taken in
    # another order on two devices), its rounding moves the step by up to lr.
    assert_same_variables(got, want, atol=3e-4)


def test_mixed_parallel_mlp_example_trains_on_two_devices(monkeypatch):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "mixed_parallel_mlp.py")
    spec = importlib.util.spec_from_file_location("mixed_parallel_mlp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    flow.config.cpu_device_num(2)
    data = seed_data(steps=3)
    two = [mod.train_job(x, y) for x, y in data]
    got = {k: np.array(v) for k, v in flow.get_all_variables().items()}
    assert "dense2-weight" in got
    flow.clear_default_session()
    flow.config.cpu_device_num(1)
    one = [mod.train_job(x, y) for x, y in data]
    want = {k: np.array(v) for k, v in flow.get_all_variables().items()}
    assert_same_variables(got, want)
    np.testing.assert_allclose(two[-1], one[-1], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- layouts and collectives

DTYPES = [(flow.float32, np.float32), (flow.float64, np.float64), (flow.int32, np.int32),
          (flow.int64, np.int64), (flow.int8, np.int8)]


@pytest.mark.parametrize("fdt,ndt", DTYPES)
@pytest.mark.parametrize("rows,cols", [(2, 1), (4, 7), (6, 1000), (8, 33)])
def test_collectives_of_a_predict_job(fdt, ndt, rows, cols):
    """sum over the split axis: all_reduce; max over it: all_gather; the
    rows themselves come back in place; a split along the other axis is
    gathered again."""
    flow.config.cpu_device_num(2)

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((rows, cols), dtype=fdt)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy,
                                                                        tp.Numpy]:
        total = flow.math.reduce_sum(x, axis=0)
        biggest = flow.math.reduce_max(x, axis=0)
        doubled = x + x
        return total, biggest, doubled, flow.transpose(x, perm=[1, 0])

    rng = np.random.default_rng(rows * cols)
    x = rng.integers(-50, 50, (rows, cols)).astype(ndt)
    total, biggest, doubled, xt = job(x)
    np.testing.assert_array_equal(total, x.sum(axis=0, dtype=ndt))
    np.testing.assert_array_equal(biggest, x.max(axis=0))
    np.testing.assert_array_equal(doubled, x + x)
    np.testing.assert_array_equal(xt, x.T)
    dist = job.compiled_jobs()[0].distribution
    assert "input 0: S(0)" in dist


def test_an_odd_batch_stays_whole_on_every_device():
    flow.config.cpu_device_num(2)

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((5, 3), dtype=flow.float)) -> tp.Numpy:
        return flow.math.reduce_sum(x * 2.0, axis=0)

    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_allclose(job(x), (x * 2).sum(axis=0))
    assert "input 0: B" in job.compiled_jobs()[0].distribution


def test_variables_move_between_one_and_several_device_jobs():
    """Values written on the host (load_variables) reach the devices; values
    the devices train come back for get_all_variables and checkpoints."""
    flow.config.cpu_device_num(2)

    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((4, 4), dtype=flow.float)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(4,), initializer=flow.zeros_initializer(),
                              distribute=flow.distribute.split(0))
        loss = flow.math.reduce_mean(flow.math.square(x - w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
        return loss

    x = np.ones((4, 4), dtype=np.float32)
    train_job(x)
    # the gradient of mean((1 - w)^2) at w = 0 is -2/4 per element
    np.testing.assert_allclose(flow.get_all_variables()["w"], np.full(4, 0.25, np.float32), rtol=1e-6)
    flow.load_variables({"w": np.full(4, 1.0, np.float32)})
    loss = train_job(x)
    np.testing.assert_allclose(loss, 0.0, atol=1e-7)
    np.testing.assert_allclose(flow.get_all_variables()["w"], np.ones(4, np.float32))
    assert "variable w: S(0)" in train_job.compiled_jobs()[0].distribution


def test_async_callbacks_on_several_devices():
    flow.config.cpu_device_num(2)
    got = []

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((4, 2), dtype=flow.float)) -> tp.Callback[tp.Numpy]:
        return flow.math.reduce_sum(x, axis=0)

    for i in range(3):
        job(np.full((4, 2), i, np.float32))(got.append)
    flow.sync_default_session()
    for i, v in enumerate(got):
        np.testing.assert_allclose(v, np.full(2, 4.0 * i))


# ---------------------------------------------------------------- errors

def test_mirrored_view_cuts_a_numpy_argument_by_rows_per_device():
    # OneFlow: a tp.Numpy placeholder of a mirrored job is split along axis 0,
    # one part per device, and a tp.Numpy result joins the devices' rows.
    flow.config.cpu_device_num(2)
    cfg = flow.function_config()
    cfg.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x * 2.0 + 1

    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(job(x), x * 2 + 1)


def test_mirrored_view_wants_one_array_per_device():
    flow.config.cpu_device_num(2)
    cfg = flow.function_config()
    cfg.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.ListNumpy.Placeholder((4,), dtype=flow.float)) -> tp.ListNumpy:
        return x + 1

    with pytest.raises(ValueError, match="expects 2 element"):
        job([np.zeros(4, np.float32)])
    out = job([np.zeros(4, np.float32), np.ones(4, np.float32)])
    np.testing.assert_allclose(out[0], np.ones(4))
    np.testing.assert_allclose(out[1], np.full(4, 2.0))


def test_mirrored_numpy_result_joins_the_devices_rows():
    flow.config.cpu_device_num(2)
    cfg = flow.function_config()
    cfg.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.ListNumpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x + 1

    out = job([np.zeros(4, np.float32), np.full(4, 5.0, np.float32)])
    np.testing.assert_allclose(out, np.concatenate([np.ones(4), np.full(4, 6.0)]))


def test_placement_on_a_subset_of_devices_is_refused():
    flow.config.cpu_device_num(4)
    cfg = flow.function_config()
    cfg.default_placement_scope(flow.scope.placement("cpu", "0:0-1"))

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x + 1

    with pytest.raises(NotImplementedError, match="placed on 2 devices"):
        job(np.zeros(4, np.float32))


def test_placement_on_one_device_runs_there():
    flow.config.cpu_device_num(2)
    cfg = flow.function_config()
    cfg.default_placement_scope(flow.scope.placement("cpu", "0:0"))

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x + 1

    np.testing.assert_allclose(job(np.zeros(4, np.float32)), np.ones(4))
    assert not job.compiled_jobs()[0].distributed


def test_placement_on_all_devices_is_the_default():
    flow.config.cpu_device_num(2)
    cfg = flow.function_config()
    cfg.default_placement_scope(flow.scope.placement("cpu", "0:0-1"))

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x + 1

    np.testing.assert_allclose(job(np.zeros(4, np.float32)), np.ones(4))
    assert job.compiled_jobs()[0].distributed


def test_placement_scope_in_the_job_body():
    flow.config.cpu_device_num(2)

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0"):
            return x + 1

    np.testing.assert_allclose(job(np.zeros(4, np.float32)), np.ones(4))
    assert not job.compiled_jobs()[0].distributed

    @flow.global_function(type="predict")
    def mixed(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0"):
            y = x + 1
        with flow.scope.placement("cpu", "0:0-1"):
            return y * 2

    # Different device sets in one body place each part on its own
    # (tests/python/test_placement.py): device 0, then both devices.
    np.testing.assert_allclose(mixed(np.zeros(4, np.float32)), np.full(4, 2.0))
    assert [s["devices"] for s in mixed.compiled_jobs()[0].segments] == [[0], [0, 1]]


def test_placement_over_a_list_of_machines_counts_their_devices():
    flow.config.cpu_device_num(2)
    cfg = flow.function_config()
    cfg.default_placement_scope(flow.scope.placement("cpu", ["0:0-1", "1:0-1"]))

    @flow.global_function(type="predict", function_config=cfg)
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x + 1

    with pytest.raises(NotImplementedError, match=r"placed on 4 devices .* has 2 \(2 per process x 1"):
        job(np.zeros(4, np.float32))


def test_bad_distribute_argument():
    flow.config.cpu_device_num(2)

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x + flow.get_variable("v", shape=(4,), distribute="split")

    with pytest.raises(TypeError, match="distribute of 'v' must be flow.distribute"):
        job(np.zeros(4, np.float32))


def test_checkpoint_of_a_two_device_run_loads_on_one_device(tmp_path, single_device):
    """Saved after 2 of 4 steps on 2 devices (second layer split), loaded on
    1 device, the last 2 steps end where the single-device run ends."""
    flow.clear_default_session()
    flow.config.cpu_device_num(2)

    def make():
        @flow.global_function(type="train")
        def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                      labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images, True))
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
            return loss
        return train_job

    job = make()
    data = seed_data()
    for x, y in data[:2]:
        job(x, y)
    ckpt = flow.train.CheckPoint()
    ckpt.save(str(tmp_path / "ckpt"))
    flow.clear_default_session()
    flow.config.cpu_device_num(1)
    job = make()
    job(*data[0])  # creates the variables; the checkpoint overwrites them
    ckpt.load(str(tmp_path / "ckpt"))
    for x, y in data[2:]:
        job(x, y)
    got = {k: np.array(v) for k, v in flow.get_all_variables().items()}
    assert_same_variables(got, single_device[1])


def test_list_list_numpy_over_several_devices_is_refused():
    flow.config.cpu_device_num(2)

    @flow.global_function(type="predict")
    def job(xs: tp.ListListNumpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return xs[0] + 1

    with pytest.raises(NotImplementedError, match="ListListNumpy placeholder over 2 devices"):
        job([[np.zeros(4, np.float32)], [np.zeros(4, np.float32)]])


def test_an_eval_job_without_distribute_uses_the_declared_split():
    flow.config.cpu_device_num(2)

    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((4, 4), dtype=flow.float)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(4, 4), initializer=flow.ones_initializer(),
                              distribute=flow.distribute.split(0))
        loss = flow.math.reduce_mean(flow.matmul(x, w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def eval_job(x: tp.Numpy.Placeholder((4, 4), dtype=flow.float)) -> tp.Numpy:
        return flow.matmul(x, flow.get_variable("w", shape=(4, 4)))

    @flow.global_function(type="predict")
    def other_split(x: tp.Numpy.Placeholder((4, 4), dtype=flow.float)) -> tp.Numpy:
        return flow.matmul(x, flow.get_variable("w", shape=(4, 4), distribute=flow.distribute.split(1)))

    x = np.ones((4, 4), np.float32)
    train_job(x)
    w = flow.get_all_variables()["w"]
    np.testing.assert_allclose(eval_job(x), x @ w, rtol=1e-6)
    assert "variable w: S(0)" in eval_job.compiled_jobs()[0].distribution
    with pytest.raises(ValueError, match="one layout per session"):
        other_split(x)
