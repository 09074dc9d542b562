"""flow.experimental.ssp_variable_proxy and function_config().enable_ssp:
the value a proxy hands out lags its variable by buffer_size - 1 runs (the
initial value at first), ref is the variable, and an enable_ssp train job
trains its variables with gradients taken at the lagged values."""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


def _proxy_job(buffer_size, update_from):
    @flow.global_function(type="predict")
    def job() -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(5.0))
        ref, value = flow.experimental.ssp_variable_proxy(w, buffer_size=buffer_size)
        flow.assign(ref, (value if update_from == "value" else ref) * 2.0)
        return value

    return job


@pytest.mark.parametrize("k", [1, 2, 4])
def test_value_lags_the_variable_by_buffer_size_minus_one_runs(k):
    job = _proxy_job(k, "ref")
    got = [job()[0] for _ in range(7)]
    # w doubles every run; run t (from 0) sees w after run t - k + 1, and 5 before that
    assert got == [5.0 * 2.0 ** max(0, t - k + 1) for t in range(7)]
    np.testing.assert_array_equal(flow.get_all_variables()["w"], np.full(3, 5.0 * 2 ** 7, np.float32))


def test_assigning_from_the_lagged_value():
    job = _proxy_job(3, "value")
    got = [job()[0] for _ in range(7)]
    # runs 0..2 read 5 and write 10; runs 3..5 read what runs 0..2 wrote
    assert got == [5.0, 5.0, 5.0, 10.0, 10.0, 10.0, 20.0]


def test_the_value_has_no_gradient():
    @flow.global_function(type="train")
    def train() -> tp.Numpy:
        w = flow.get_variable("w", shape=(2,), initializer=flow.constant_initializer(1.0))
        u = flow.get_variable("u", shape=(2,), initializer=flow.constant_initializer(1.0))
        _, value = flow.experimental.ssp_variable_proxy(w, buffer_size=2)
        loss = value * u
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
        return loss

    train()
    train()
    v = flow.get_all_variables()
    np.testing.assert_array_equal(v["w"], [1.0, 1.0])
    np.testing.assert_array_equal(v["u"], [0.5, 0.5])  # u's gradient: the value 1, over 2 loss elements


def _ssp_train(stages, stage, lr=-10.0):
    cfg = flow.FunctionConfig()
    cfg.enable_ssp(True)

    @flow.global_function(type="train", function_config=cfg)
    def train() -> tp.Numpy:
        with flow.experimental.scope.config(ssp_num_stages=stages, ssp_stage_id=stage):
            w = flow.get_variable("w", shape=(4,), initializer=flow.constant_initializer(0.0))
            loss = w * 1.0
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0).minimize(loss)
            return loss

    return train


@pytest.mark.parametrize("stages,stage", [(4, 0), (3, 1), (1, 0)])
def test_enable_ssp_trains_with_the_lagged_value(stages, stage):
    train = _ssp_train(stages, stage)
    lag = stages - stage - 1
    got = [train()[0] for _ in range(6)]
    # every step adds 10 * (1 / 4) to w; the forward pass sees w lag steps late
    assert got == [2.5 * max(0, t - lag) for t in range(6)]
    np.testing.assert_array_equal(flow.get_all_variables()["w"], np.full(4, 15.0, np.float32))


def test_enable_ssp_gradient_is_taken_at_the_lagged_value():
    cfg = flow.FunctionConfig()
    cfg.enable_ssp(True)

    @flow.global_function(type="train", function_config=cfg)
    def train() -> tp.Numpy:
        with flow.experimental.scope.config(ssp_num_stages=2, ssp_stage_id=0):
            w = flow.get_variable("w", shape=(1,), initializer=flow.constant_initializer(1.0))
            loss = w * w
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.25]), momentum=0).minimize(loss)
            return w

    seen = [float(train()[0]) for _ in range(3)]
    # w <- w - 0.25 * 2 * (lagged w): 1 -> 0.5 (at 1) -> 0 (at 1) -> -0.25 (at 0.5)
    assert seen == [1.0, 1.0, 0.5]
    assert float(flow.get_all_variables()["w"][0]) == -0.25


def test_enable_ssp_needs_the_stages_in_scope():
    cfg = flow.FunctionConfig()
    cfg.enable_ssp(True)

    @flow.global_function(type="train", function_config=cfg)
    def train() -> tp.Numpy:
        w = flow.get_variable("w", shape=(1,))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(w)
        return w

    with pytest.raises(ValueError, match=r"enable_ssp: variable 'w' is requested outside a "
                                         r"flow.experimental.scope.config\(ssp_num_stages=S"):
        train()


def test_scope_config_checks_names_and_types():
    with pytest.raises(ValueError, match="unknown scope attribute 'ssp_stages'"):
        flow.experimental.scope.config(ssp_stages=2)
    with pytest.raises(TypeError, match="ssp_num_stages must be an int"):
        flow.experimental.scope.config(ssp_num_stages=True)
    with pytest.raises(TypeError, match="checkpointing must be True or False"):
        flow.experimental.scope.config(checkpointing=1)


def test_proxy_checks_its_arguments():
    @flow.global_function(type="predict")
    def not_a_variable(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return flow.experimental.ssp_variable_proxy(x * 2.0)[1]

    with pytest.raises(TypeError, match="var must be a variable"):
        not_a_variable(np.zeros(2, np.float32))

    @flow.global_function(type="predict")
    def no_buffer() -> tp.Numpy:
        w = flow.get_variable("w", shape=(2,))
        return flow.experimental.ssp_variable_proxy(w, buffer_size=0)[1]

    with pytest.raises(ValueError, match="buffer_size must be an int >= 1, got 0"):
        no_buffer()
