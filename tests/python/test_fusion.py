"""Fused kernels against the unfused reference (FLOWJIT_DISABLE_FUSION=1).

Every fused pattern of the seed's train step (matmul epilogues with bias and
ReLU, the ReLU mask of the backward matmul, the phased softmax and
cross-entropy kernels, reductions with an optimizer update as epilogue) must
give the same result as one kernel per op. Float32, tolerance rtol 1e-5.
"""
from typing import Tuple

import numpy as np

import flowjit as flow
import flowjit.typing as tp


def make_job(name, extra_output=True):
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((24, 37), dtype=flow.float),
            y: tp.Numpy.Placeholder((24,), dtype=flow.int32)) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.3, seed=3)
        h = flow.layers.dense(x, 33, activation=flow.nn.relu, kernel_initializer=init, name="h")
        z = flow.layers.dense(h, 10, kernel_initializer=init, name="z")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, z)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.2]), momentum=0.9).minimize(loss)
        if not extra_output:
            return loss
        # A softmax shared by an output and the loss gradient (CSE merges them).
        return loss + flow.math.reduce_mean(flow.nn.softmax(z), axis=1) * 0.0

    job.__name__ = name
    return job


def train(fused, steps, monkeypatch, rng):
    flow.clear_default_session()
    if fused:
        monkeypatch.delenv("FLOWJIT_DISABLE_FUSION", raising=False)
    else:
        monkeypatch.setenv("FLOWJIT_DISABLE_FUSION", "1")
    job = make_job(f"fusion_{fused}")
    x = rng.standard_normal((24, 37)).astype(np.float32)
    y = rng.integers(0, 10, 24).astype(np.int32)
    losses = [job(x, y) for _ in range(steps)]
    return job.compiled_jobs()[0], losses, flow.get_all_variables()


def test_fused_matches_unfused(monkeypatch):
    fused, lf, vf = train(True, 6, monkeypatch, np.random.default_rng(0))
    unfused, lu, vu = train(False, 6, monkeypatch, np.random.default_rng(0))
    assert fused.num_kernels < unfused.num_kernels, (fused.fusion_plan, unfused.fusion_plan)
    for a, b in zip(lf, lu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert vf.keys() == vu.keys()
    for k in vf:
        np.testing.assert_allclose(vf[k], vu[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_seed_step_fusion_plan():
    # The forward matmuls absorb bias and ReLU; the backward matmuls absorb the
    # ReLU mask and the SGD update; one kernel each for the loss forward and
    # backward.
    job = make_job("plan", extra_output=False)
    x = np.zeros((24, 37), np.float32)
    y = np.zeros(24, np.int32)
    job(x, y)
    plan = job.compiled_jobs()[0].plan
    summaries = [line.split(" : ", 1)[1] for line in plan.strip().splitlines()]
    assert "matmul, add, relu" in summaries, plan
    assert any(s.startswith("greater, matmul, where") for s in summaries), plan
    assert sum(1 for s in summaries if "matmul" in s and "sub" in s) == 2, plan  # weight updates
    assert sum(1 for s in summaries if "reduce_sum" in s and "matmul" not in s and "sub" in s
               and not s.startswith("reduce_max")) == 2, plan  # bias updates
    assert sum(1 for s in summaries if s.startswith("reduce_max")) == 2, plan  # loss fwd, bwd
    assert len(summaries) == 10, plan


def test_aliasing_inputs_outputs_and_in_place_updates():
    # The same array bound to two placeholders, the same blob returned twice,
    # a variable returned directly, and an update of a variable that the
    # same step also reads transposed (the assign must wait for every read).
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4, 4), dtype=flow.double),
            b: tp.Numpy.Placeholder((4, 4), dtype=flow.double)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        w = flow.get_variable("alias_w", shape=(4, 4), dtype=flow.double,
                              initializer=flow.random_normal_initializer(seed=5))
        y = flow.matmul(w, w, transpose_b=True) * a + b
        loss = flow.math.reduce_sum(y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]), momentum=0).minimize(loss)
        return y, y, w

    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 4))
    job(x, x)  # creates the variable
    w0 = flow.get_all_variables()["alias_w"].copy()
    y1, y2, wret = job(x, x)
    np.testing.assert_allclose(y1, w0 @ w0.T * x + x, rtol=1e-12)
    np.testing.assert_array_equal(y1, y2)
    assert y1 is not y2
    np.testing.assert_array_equal(wret, w0)  # the value read by this step
    # d/dw sum((w w^T) * a) = (a + a^T) w; the learning rate is a float32 (OneFlow).
    lr = float(np.float32(0.01))
    np.testing.assert_allclose(flow.get_all_variables()["alias_w"], w0 - lr * (x + x.T) @ w0, rtol=1e-12)


def test_an_assigned_value_broadcast_in_its_kernels_domain():
    # `new` has shape (1,) but is computed in the (4, 3) loop of the product
    # it feeds; its store (for the assign) is broadcast along the vector
    # dimension. It used to stop the compile with an InternalError ("vector
    # store along a broadcast dimension").
    @flow.global_function(type="predict")
    def job(y: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        c = flow.get_variable("bcast_c", shape=(1,), dtype=flow.float32,
                              initializer=flow.constant_initializer(2.0))
        new = c + 1
        flow.assign(c, new)
        return flow.one_hot(y, 3) * new

    y = np.array([0, 1, 2, 0], np.int32)
    out = job(y)
    np.testing.assert_array_equal(out, np.eye(3, dtype=np.float32)[y] * 3.0)
    np.testing.assert_array_equal(flow.get_all_variables()["bcast_c"], [3.0])
    out = job(y)
    np.testing.assert_array_equal(out, np.eye(3, dtype=np.float32)[y] * 4.0)
