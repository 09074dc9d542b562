"""Every op's layout rule against one device: predict and train jobs built
from each op (broadcasts, reductions over every axis, reshapes, transposes,
matmuls with every transpose flag, softmax along either axis, one_hot,
where, argmax), run on 1, 2, 3 and 4 CPU devices, return the same values."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

R, C = 12, 6  # rows divide 2, 3 and 4; columns divide 2 and 3


@pytest.fixture(autouse=True)
def one_device_after():
    yield
    flow.clear_default_session()
    flow.config.cpu_device_num(1)


def _cases():
    m = flow.math
    return {
        "broadcast_bias": lambda x, v: x + v,
        "broadcast_col": lambda x, v: x * flow.reshape(flow.math.reduce_sum(x, axis=1), [R, 1]),
        "sum_rows": lambda x, v: m.reduce_sum(x, axis=0),
        "sum_cols_keep": lambda x, v: m.reduce_sum(x, axis=1, keepdims=True),
        "sum_all": lambda x, v: m.reduce_sum(x),
        "mean_rows_sq": lambda x, v: m.reduce_mean(m.square(x - m.reduce_mean(x, axis=0)), axis=0),
        "max_rows": lambda x, v: m.reduce_max(x, axis=0),
        "min_cols": lambda x, v: m.reduce_min(x, axis=1),
        "prod_rows": lambda x, v: m.reduce_prod(x * 0.1 + 1.0, axis=0),
        "argmax_rows": lambda x, v: flow.cast(flow.math.argmax(flow.transpose(x, perm=[1, 0])), flow.float),
        "argmax_cols": lambda x, v: flow.cast(flow.math.argmax(x), flow.float),
        "reshape_flat": lambda x, v: flow.reshape(x, [R * C]) * 2.0,
        "reshape_3d": lambda x, v: m.reduce_sum(flow.reshape(x, [R // 2, 2, C]), axis=1),
        "reshape_merge_rows": lambda x, v: flow.reshape(x, [R // 2, 2 * C]),
        "transpose": lambda x, v: flow.transpose(x, perm=[1, 0]) + 1.0,
        "matmul_xw": lambda x, v: flow.matmul(x, flow.reshape(v, [C, 1]) * flow.ones((C, 4))),
        "matmul_xtx": lambda x, v: flow.matmul(x, x, transpose_a=True),
        "matmul_xxt": lambda x, v: flow.matmul(x, x, transpose_b=True),
        "matmul_tt": lambda x, v: flow.matmul(flow.transpose(x, perm=[1, 0]),
                                              flow.transpose(x, perm=[1, 0]), transpose_b=True),
        "softmax_cols": lambda x, v: flow.nn.softmax(x),
        "softmax_rows": lambda x, v: flow.nn.softmax(x, axis=0),
        "log_softmax": lambda x, v: flow.nn.log_softmax(x),
        "where": lambda x, v: flow.where(x > 0.5, x, x * 0.0 + v),
        "one_hot": lambda x, v: flow.one_hot(flow.math.argmax(x), depth=C, dtype=flow.float) * x,
        "exp_tanh_chain": lambda x, v: m.tanh(m.exp(x) - 1.0) / (x + 2.0),
    }


CASES = sorted(_cases())


def run_case(name, devices):
    flow.clear_default_session()
    flow.config.cpu_device_num(devices)
    fn = _cases()[name]

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((R, C), dtype=flow.float)) -> tp.Numpy:
        v = flow.get_variable("v", shape=(C,), initializer=flow.random_uniform_initializer())
        return fn(x, v)

    x = np.random.default_rng(5).random((R, C), dtype=np.float32)
    return job(x)


@pytest.mark.parametrize("name", CASES)
def test_op_layouts_match_one_device(name):
    want = run_case(name, 1)
    for devices in (2, 3, 4):
        got = run_case(name, devices)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{name} on {devices} devices")


@pytest.mark.parametrize("split_axis", [None, 0, 1])
def test_train_job_gradients_with_every_layout(split_axis):
    """A two-layer model with a split (or whole) weight, LAMB (trust ratios
    need whole-weight norms) and global-norm clipping (the norm over all
    gradients): the same variables on 1 and 2 devices."""
    def train(devices):
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)
        dist = None if split_axis is None else flow.distribute.split(split_axis)

        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((R, C), dtype=flow.float),
                y: tp.Numpy.Placeholder((R,), dtype=flow.int32)) -> tp.Numpy:
            w = flow.get_variable("w", shape=(C, C), initializer=flow.random_normal_initializer(stddev=0.3),
                                  distribute=dist)
            h = flow.math.tanh(flow.matmul(x, w))
            # A random (not zero) kernel: with equal logits a class holding R/4 of the labels has an
            # exactly-zero bias gradient whose rounding residue (~1e-8, summed in another order on 2
            # devices) LAMB's m / (sqrt(v) + eps) (OneFlow's LambGradFunctor: eps outside the root)
            # scales up to about lr, so the two runs would differ by far more than rounding.
            logits = flow.layers.dense(h, 4, name="out", kernel_initializer=flow.random_normal_initializer(stddev=0.3))
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            flow.optimizer.LAMB(flow.optimizer.PiecewiseConstantScheduler([], [0.01]),
                                grad_clipping=flow.optimizer.grad_clipping.by_global_norm(0.5)).minimize(loss)
            return loss

        rng = np.random.default_rng(9)
        for _ in range(3):
            job(rng.random((R, C), dtype=np.float32), rng.integers(0, 4, R).astype(np.int32))
        return {k: np.array(v) for k, v in flow.get_all_variables().items()}

    want, got = train(1), train(2)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_big_split_weight_splits_the_activations_instead():
    """Tiny batch, wide split layer: gathering the weight would move 1000x the
    bytes of the activations, so the matmul takes the model-parallel
    signature (whole rows x split columns) and still matches one device."""
    def train(devices):
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)

        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((4, 256), dtype=flow.float),
                y: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
            h = flow.layers.dense(x, 1024, activation=flow.nn.relu, name="wide",
                                  kernel_initializer=flow.random_normal_initializer(stddev=0.05),
                                  model_distribute=flow.distribute.split(0))
            logits = flow.layers.dense(h, 8, name="head")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
            return loss

        rng = np.random.default_rng(2)
        for _ in range(3):
            job(rng.random((4, 256), dtype=np.float32), rng.integers(0, 8, 4).astype(np.int32))
        return job, {k: np.array(v) for k, v in flow.get_all_variables().items()}

    _, want = train(1)
    job, got = train(2)
    dist = job.compiled_jobs()[0].distribution
    assert "variable wide-weight: S(0)" in dist
    # the hidden layer is split by units (columns), so the head's weight is
    # sliced along its inputs (k) on each device rather than the wide weight gathered
    assert "'head-weight'" in dist and "B -> S(1)" in dist, dist
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
