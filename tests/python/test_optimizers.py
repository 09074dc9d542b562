"""Optimizer updates and learning-rate schedules against numpy references.

The references follow OneFlow's definitions:
  * updates: oneflow/user/kernels/model_update_kernel_util.{h,cpp}
    (SGDUpdateFunctor, MomentumUpdateFunctor, AdamUpdateFunctor with
    AdamBiasCorrectionLearningRate, RmsPropUpdateFunctor, LambGradFunctor /
    LambUpdateFunctor, LarsUpdateKernelUtil);
  * gradient scaling: oneflow/core/job_rewriter/autograd.cpp (the 1 / N loss
    instance scaling, loss_scale_factor; clip_by_global_norm as documented in
    oneflow/python/ops/optimizer.py: g * clip / max(global_norm, clip));
  * schedules: oneflow/core/kernel/learning_rate_schedule_kernel.cpp.
The learning rate is a float32 scalar (as OneFlow's), so the references round
it to float32 before using it.
"""
import math

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

opt = flow.optimizer
N, DIN, DOUT = 4, 3, 2
W, B = "model-weight", "model-bias"
STEPS = 6


def f32(v):
    return float(np.float32(v))


def _config(dtype):
    cfg = flow.function_config()
    cfg.default_data_type(dtype)
    return cfg


def make_data(steps=STEPS, seed=0):
    r = np.random.default_rng(seed)
    return r.standard_normal((steps, N, DIN)), r.standard_normal((steps, N, DOUT))


def make_params(seed=1, scale=1.0):
    r = np.random.default_rng(seed)
    return {W: r.standard_normal((DIN, DOUT)) * scale, B: r.standard_normal((DOUT,)) * scale}


def np_loss_and_grads(p, x, y):
    """Per-sample loss 0.5 * |x w + b - y|^2 (shape (N,)); gradients of its mean."""
    r = x @ p[W] + p[B] - y
    return 0.5 * (r * r).sum(1), {W: x.T @ r / N, B: r.sum(0) / N}


def run_flowjit(make_optimizer, params, xs, ys, dtype=np.float64, job_name="train_job",
                loss_kind="one"):
    """Trains the linear model with flowjit; returns per-step losses and snapshots
    of every session variable after each step."""
    fdt = flow.float64 if dtype == np.float64 else flow.float32
    cfg = _config(fdt)

    def model(x):
        w = flow.get_variable(W, shape=(DIN, DOUT), dtype=fdt, initializer=flow.zeros_initializer())
        b = flow.get_variable(B, shape=(DOUT,), dtype=fdt, initializer=flow.zeros_initializer())
        return flow.matmul(x, w) + b

    def predict(x: tp.Numpy.Placeholder((N, DIN), dtype=fdt)) -> tp.Numpy:
        return model(x)

    def train(x: tp.Numpy.Placeholder((N, DIN), dtype=fdt),
              y: tp.Numpy.Placeholder((N, DOUT), dtype=fdt)) -> tp.Numpy:
        r = model(x) - y
        loss = 0.5 * flow.math.reduce_sum(r * r, axis=1)
        if loss_kind == "one":
            make_optimizer().minimize(loss)
        elif loss_kind == "list":
            # the same total split into two per-sample losses of equal shape
            l1 = loss * 0.25
            l2 = loss * 0.75
            make_optimizer().minimize([l1, l2])
        elif loss_kind == "mixed":
            # a scalar loss and a per-sample one: each trains like its mean
            make_optimizer().minimize([flow.math.reduce_mean(loss) * 0.5, loss * 0.5])
        return loss

    train.__name__ = job_name
    predict_job = flow.global_function(type="predict", function_config=cfg)(predict)
    train_job = flow.global_function(type="train", function_config=cfg)(train)
    predict_job(xs[0].astype(dtype))  # creates the model variables
    flow.load_variables({k: v.astype(dtype) for k, v in params.items()})
    losses, snaps = [], []
    for x, y in zip(xs, ys):
        losses.append(np.asarray(train_job(x.astype(dtype), y.astype(dtype))))
        snaps.append({k: np.asarray(v) for k, v in flow.get_all_variables().items()})
    return losses, snaps, train_job, predict_job


def run_reference(update, params, xs, ys, state_names=()):
    """update(p, state, g, t) -> None, mutating; t = 0, 1, ... (the train step)."""
    p = {k: v.copy() for k, v in params.items()}
    state = {f"{k}-{s}": np.zeros_like(v) for k, v in p.items() for s in state_names}
    losses, snaps = [], []
    for t, (x, y) in enumerate(zip(xs, ys)):
        loss, g = np_loss_and_grads(p, x, y)
        update(p, state, g, t)
        losses.append(loss)
        snaps.append({**{k: v.copy() for k, v in p.items()}, **{k: v.copy() for k, v in state.items()}})
    return losses, snaps


def compare(got, want, rtol=1e-10, atol=1e-12, job_name="train_job"):
    g_losses, g_snaps = got[0], got[1]
    w_losses, w_snaps = want
    for step, (gl, wl, gs, ws) in enumerate(zip(g_losses, w_losses, g_snaps, w_snaps)):
        np.testing.assert_allclose(gl, wl, rtol=rtol, atol=atol, err_msg=f"loss at step {step}")
        for name, value in ws.items():
            assert name in gs, f"step {step}: variable '{name}' missing; have {sorted(gs)}"
            np.testing.assert_allclose(gs[name], value, rtol=rtol, atol=atol,
                                       err_msg=f"variable '{name}' after step {step}")
        assert int(gs[f"System-Train-TrainStep-{job_name}"]) == step + 1


def check_optimizer(make_optimizer, update, state_names=(), params=None, rtol=1e-10, atol=1e-12,
                    steps=STEPS):
    params = make_params() if params is None else params
    xs, ys = make_data(steps)
    got = run_flowjit(make_optimizer, params, xs, ys)
    want = run_reference(update, params, xs, ys, state_names)
    expected_names = {W, B, "System-Train-TrainStep-train_job"} | set(want[1][0])
    assert set(got[1][-1]) == expected_names, "session variables (optimizer state names)"
    compare(got, want, rtol, atol)
    assert len(got[2].compiled_jobs()) == 1
    return got, want


# ---------------------------------------------------------------- SGD

def test_sgd_without_momentum():
    lr = 0.1

    def update(p, s, g, t):
        for k in p:
            p[k] -= f32(lr) * g[k]

    check_optimizer(lambda: opt.SGD(opt.PiecewiseConstantScheduler([], [lr]), momentum=0), update)


def test_sgd_with_momentum():
    lr, beta = 0.1, 0.9

    def update(p, s, g, t):
        for k in p:  # OneFlow: v = beta * v - lr * g; w = w + v
            s[f"{k}-momentum"] = beta * s[f"{k}-momentum"] - f32(lr) * g[k]
            p[k] += s[f"{k}-momentum"]

    check_optimizer(lambda: opt.SGD(opt.PiecewiseConstantScheduler([], [lr]), momentum=beta), update,
                    ["momentum"])


def test_sgd_number_as_learning_rate_and_default_momentum():
    # A plain number is a constant schedule; SGD's default momentum is 0.9.
    def update(p, s, g, t):
        for k in p:
            s[f"{k}-momentum"] = 0.9 * s[f"{k}-momentum"] - f32(0.05) * g[k]
            p[k] += s[f"{k}-momentum"]

    check_optimizer(lambda: opt.SGD(0.05), update, ["momentum"])


# ---------------------------------------------------------------- Adam family

def adam_update(lr, b1, b2, eps, bias_correction, wd=0.0, decays=lambda name: True):
    def update(p, s, g, t):
        if bias_correction:  # AdamBiasCorrectionLearningRate: the rate is corrected
            lr_t = f32(f32(lr) * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1)))
        else:
            lr_t = f32(lr)
        for k in p:
            m = s[f"{k}-m"] = b1 * s[f"{k}-m"] + (1 - b1) * g[k]
            v = s[f"{k}-v"] = b2 * s[f"{k}-v"] + (1 - b2) * g[k] * g[k]
            decay = wd if decays(k) else 0.0
            p[k] = p[k] - lr_t * (m / (np.sqrt(v) + eps) + decay * p[k])
    return update


def test_adam_without_bias_correction():
    check_optimizer(lambda: opt.Adam(opt.PiecewiseConstantScheduler([], [0.01]), beta1=0.8, beta2=0.95),
                    adam_update(0.01, 0.8, 0.95, 1e-8, False), ["m", "v"])


def test_adam_with_bias_correction():
    # OneFlow folds the correction into the (float32) rate:
    # lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t), epsilon is not corrected.
    # epsilon = 1e-3 makes the difference to the textbook m_hat / (sqrt(v_hat) + eps) visible.
    # rtol 1e-7: lr_t is a float32 computed in float64 by the job and by numpy.
    check_optimizer(lambda: opt.Adam(opt.PiecewiseConstantScheduler([], [0.01]), beta1=0.8, beta2=0.95,
                                     epsilon=1e-3, do_bias_correction=True),
                    adam_update(0.01, 0.8, 0.95, 1e-3, True), ["m", "v"], rtol=1e-7)


def test_adam_default_hyperparameters():
    check_optimizer(lambda: opt.Adam(opt.PiecewiseConstantScheduler([], [0.01])),
                    adam_update(0.01, 0.9, 0.999, 1e-8, False), ["m", "v"])


def test_adamw_weight_decay_and_excludes():
    wd = 0.1
    check_optimizer(lambda: opt.AdamW(opt.PiecewiseConstantScheduler([], [0.01]), beta1=0.8, beta2=0.95,
                                      weight_decay=wd, weight_decay_excludes=["bias"]),
                    adam_update(0.01, 0.8, 0.95, 1e-8, False, wd, lambda k: "bias" not in k), ["m", "v"])


def test_adamw_weight_decay_all_with_bias_correction():
    # The decay term is scaled by the corrected rate too (AdamUpdateFunctor).
    wd = 0.1
    check_optimizer(lambda: opt.AdamW(opt.PiecewiseConstantScheduler([], [0.01]), beta1=0.8, beta2=0.95,
                                      do_bias_correction=True, weight_decay=wd),
                    adam_update(0.01, 0.8, 0.95, 1e-8, True, wd), ["m", "v"], rtol=1e-7)


def test_adamw_weight_decay_includes():
    wd = 0.2
    check_optimizer(lambda: opt.AdamW(opt.PiecewiseConstantScheduler([], [0.01]),
                                      weight_decay=wd, weight_decay_includes="weight"),
                    adam_update(0.01, 0.9, 0.999, 1e-8, False, wd, lambda k: "weight" in k), ["m", "v"])


# ---------------------------------------------------------------- RMSProp

def rmsprop_update(lr, decay, eps, centered):
    def update(p, s, g, t):
        for k in p:
            ms = s[f"{k}-mean_square"] = (1 - decay) * g[k] * g[k] + decay * s[f"{k}-mean_square"]
            if centered:
                mg = s[f"{k}-mean_gradient"] = (1 - decay) * g[k] + decay * s[f"{k}-mean_gradient"]
                denom = ms - mg * mg
            else:
                denom = ms
            p[k] = p[k] - f32(lr) * g[k] / np.sqrt(denom + eps)
    return update


def test_rmsprop():
    check_optimizer(lambda: opt.RMSProp(opt.PiecewiseConstantScheduler([], [0.01]), decay_rate=0.9),
                    rmsprop_update(0.01, 0.9, 1e-8, False), ["mean_square"])


def test_rmsprop_centered():
    check_optimizer(lambda: opt.RMSProp(opt.PiecewiseConstantScheduler([], [0.01]), decay_rate=0.9,
                                        epsilon=1e-4, centered=True),
                    rmsprop_update(0.01, 0.9, 1e-4, True), ["mean_square", "mean_gradient"])


# ---------------------------------------------------------------- LAMB

def lamb_update(lr, b1, b2, eps, wd=0.0):
    """OneFlow (LambGradFunctor at 5119226d, 2021): adam_diff = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps);
    trust = ||w|| / ||adam_diff|| (1 if a norm is 0);
    w -= lr * trust * (adam_diff + wd * w)."""
    def update(p, s, g, t):
        for k in p:
            m = s[f"{k}-m"] = b1 * s[f"{k}-m"] + (1 - b1) * g[k]
            v = s[f"{k}-v"] = b2 * s[f"{k}-v"] + (1 - b2) * g[k] * g[k]
            diff = (m / (1 - b1 ** (t + 1))) / (np.sqrt(v / (1 - b2 ** (t + 1))) + eps)
            wn, gn = np.linalg.norm(p[k]), np.linalg.norm(diff)
            trust = wn / gn if wn > 0 and gn > 0 else 1.0
            p[k] = p[k] - f32(lr) * trust * (diff + wd * p[k])
    return update


def test_lamb():
    # epsilon = 0 and no weight decay: the part of the formula on which
    # flowjit and OneFlow agree (see the xfail below for the rest).
    check_optimizer(lambda: opt.LAMB(opt.PiecewiseConstantScheduler([], [0.01]), beta1=0.8, beta2=0.95,
                                     epsilon=0.0),
                    lamb_update(0.01, 0.8, 0.95, 0.0), ["m", "v"], rtol=1e-9)


def test_lamb_epsilon_and_weight_decay_as_oneflow():
    check_optimizer(lambda: opt.LAMB(opt.PiecewiseConstantScheduler([], [0.01]), beta1=0.8, beta2=0.95,
                                     epsilon=1e-2, weight_decay=0.1),
                    lamb_update(0.01, 0.8, 0.95, 1e-2, 0.1), ["m", "v"], rtol=1e-9)


# ---------------------------------------------------------------- LARS

def lars_update(lr, beta, eps, coeff, wd=0.0):
    """OneFlow's LarsUpdateKernelUtil at 5119226d (2021): L2 norms; lars = 1
    when a norm is zero; the weight decay in the denominator and as a
    decoupled term of the parameter update, not in the momentum."""
    def update(p, s, g, t):
        for k in p:
            wn = np.sqrt(np.sum(p[k] ** 2))
            gn = np.sqrt(np.sum(g[k] ** 2))
            lars = coeff * wn / (eps + gn + wd * wn) if wn > 0 and gn > 0 else 1.0
            local = f32(lr) * lars
            mom = s[f"{k}-momentum"] = beta * s[f"{k}-momentum"] - local * g[k]
            p[k] = p[k] + mom - local * wd * p[k]
    return update


def test_lars():
    # epsilon = 0, no weight decay: the part on which flowjit and OneFlow agree.
    check_optimizer(lambda: opt.LARS(opt.PiecewiseConstantScheduler([], [0.5]), momentum_beta=0.9,
                                     epsilon=0.0, lars_coefficient=0.01),
                    lars_update(0.5, 0.9, 0.0, 0.01), ["momentum"], rtol=1e-9)


def test_lars_epsilon_as_oneflow():
    check_optimizer(lambda: opt.LARS(opt.PiecewiseConstantScheduler([], [0.5]), momentum_beta=0.9,
                                     epsilon=0.05, lars_coefficient=0.01),
                    lars_update(0.5, 0.9, 0.05, 0.01), ["momentum"], rtol=1e-9)


def test_lars_weight_decay_as_oneflow():
    check_optimizer(lambda: opt.LARS(opt.PiecewiseConstantScheduler([], [0.5]), momentum_beta=0.9,
                                     epsilon=0.0, lars_coefficient=0.01, weight_decay=0.5),
                    lars_update(0.5, 0.9, 0.0, 0.01, 0.5), ["momentum"], rtol=1e-9)


def test_lars_zero_weight_as_oneflow():
    params = make_params()
    params[W] = np.zeros_like(params[W])
    check_optimizer(lambda: opt.LARS(opt.PiecewiseConstantScheduler([], [0.5]), momentum_beta=0.9,
                                     epsilon=0.0, lars_coefficient=0.01),
                    lars_update(0.5, 0.9, 0.0, 0.01), ["momentum"], params=params, rtol=1e-9)


# ---------------------------------------------------------------- gradient processing

def clipped(g, clip):
    norm = math.sqrt(sum(float(np.sum(v * v)) for v in g.values()))
    return {k: v * clip / max(norm, clip) for k, v in g.items()}, norm


def sgd_clip_update(lr, clip, norms):
    def update(p, s, g, t):
        g, norm = clipped(g, clip)
        norms.append(norm)
        for k in p:
            p[k] -= f32(lr) * g[k]
    return update


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grad_clipping_by_global_norm(dtype):
    # The global gradient norms of these 6 steps are 1.64, 2.21, 0.48, 4.19,
    # 2.23, 1.41: clip = 0.1 clips every step, clip = 2 some steps (gradients
    # above and below c in one run), clip = 50 none.
    lr = 0.1
    params = {k: v.astype(dtype).astype(np.float64) for k, v in make_params().items()}
    xs, ys = (a.astype(dtype).astype(np.float64) for a in make_data())
    for clip, clipped_steps in ((0.1, "all"), (2.0, "some"), (50.0, "none")):
        flow.clear_default_session()
        norms = []
        want = run_reference(sgd_clip_update(lr, clip, norms), params, xs, ys)
        above = [n > clip for n in norms]
        assert {"all": all(above), "some": any(above) and not all(above), "none": not any(above)}[clipped_steps]
        if dtype == np.float64 and clipped_steps != "none":
            continue  # float64 accuracy of a clipped update: test_grad_clipping_float64_precision
        got = run_flowjit(lambda: opt.SGD(opt.PiecewiseConstantScheduler([], [lr]), momentum=0,
                                          grad_clipping=opt.grad_clipping.by_global_norm(clip)),
                          params, xs, ys, dtype=dtype)
        rtol, atol = (1e-5, 1e-6) if dtype == np.float32 else (1e-12, 1e-13)
        compare(got, want, rtol, atol)


def test_grad_clipping_float64_precision():
    lr, clip = 0.1, 2.0
    params = make_params()
    xs, ys = make_data()
    want = run_reference(sgd_clip_update(lr, clip, []), params, xs, ys)
    got = run_flowjit(lambda: opt.SGD(opt.PiecewiseConstantScheduler([], [lr]), momentum=0,
                                      grad_clipping=opt.grad_clipping.by_global_norm(clip)),
                      params, xs, ys)
    compare(got, want, 1e-12, 1e-13)


def test_grad_clipping_with_momentum_and_adam():
    # clipping happens before the update rule, on the 1/N-scaled gradients
    clip = 1.0

    def update(p, s, g, t):
        g, _ = clipped(g, clip)
        adam_update(0.01, 0.9, 0.999, 1e-8, False)(p, s, g, t)

    check_optimizer(lambda: opt.Adam(opt.PiecewiseConstantScheduler([], [0.01]),
                                     grad_clipping=opt.grad_clipping.by_global_norm(clip)),
                    update, ["m", "v"], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("factor", [100.0, 1024.0])
def test_loss_scale_factor_does_not_change_the_update(factor):
    # The loss gradient is scaled by the factor and the parameter gradients
    # by 1 / factor (ScaleInitialDiffByLossScale, ScaleModelDiffByLossScale).
    lr, beta = 0.1, 0.5

    def update(p, s, g, t):
        for k in p:
            s[f"{k}-momentum"] = beta * s[f"{k}-momentum"] - f32(lr) * g[k]
            p[k] += s[f"{k}-momentum"]

    check_optimizer(lambda: opt.SGD(opt.PiecewiseConstantScheduler([], [lr]), momentum=beta,
                                    loss_scale_factor=factor), update, ["momentum"], rtol=1e-12)


@pytest.mark.parametrize("kind", ["list", "mixed"])
def test_minimize_a_list_of_losses(kind):
    # "list": two (N,) losses summing to the model's loss: OneFlow scales the
    # gradients once by 1/N. "mixed": a scalar and an (N,) loss, each trains
    # like its mean (flowjit; OneFlow requires equal loss shapes).
    lr = 0.1
    params = make_params()
    xs, ys = make_data()

    def update(p, s, g, t):
        for k in p:
            p[k] -= f32(lr) * g[k]

    want = run_reference(update, params, xs, ys)
    got = run_flowjit(lambda: opt.SGD(opt.PiecewiseConstantScheduler([], [lr]), momentum=0),
                      params, xs, ys, loss_kind=kind)
    compare(got, want, 1e-10, 1e-12)


def test_non_scalar_loss_trains_like_its_mean():
    # loss (N,) and reduce_mean(loss) give the same update; reduce_sum(loss) N times larger.
    params = make_params()
    xs, ys = make_data(steps=1)
    updates = {}
    for kind in ("vector", "mean", "sum"):
        flow.clear_default_session()
        cfg = _config(flow.float64)

        @flow.global_function(type="train", function_config=cfg)
        def train(x: tp.Numpy.Placeholder((N, DIN), dtype=flow.float64),
                  y: tp.Numpy.Placeholder((N, DOUT), dtype=flow.float64)) -> tp.Numpy:
            w = flow.get_variable(W, shape=(DIN, DOUT), dtype=flow.float64)
            b = flow.get_variable(B, shape=(DOUT,), dtype=flow.float64)
            r = flow.matmul(x, w) + b - y
            loss = 0.5 * flow.math.reduce_sum(r * r, axis=1)
            loss = {"vector": loss, "mean": flow.math.reduce_mean(loss),
                    "sum": flow.math.reduce_sum(loss)}[kind]
            opt.SGD(opt.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
            return loss

        train(xs[0], ys[0])
        flow.load_variables(params)
        train(xs[0], ys[0])
        v = flow.get_all_variables()
        updates[kind] = {k: params[k] - np.asarray(v[k]) for k in params}
    _, g = np_loss_and_grads(params, xs[0], ys[0])
    for k in params:
        np.testing.assert_allclose(updates["vector"][k], g[k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(updates["mean"][k], g[k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(updates["sum"][k], N * g[k], rtol=1e-12, atol=1e-14)


def test_predict_job_sees_trained_variables():
    lr = 0.1
    params = make_params()
    xs, ys = make_data()
    _, snaps, _, predict_job = run_flowjit(
        lambda: opt.SGD(opt.PiecewiseConstantScheduler([], [lr]), momentum=0), params, xs, ys)
    last = snaps[-1]
    np.testing.assert_allclose(predict_job(xs[0]), xs[0] @ last[W] + last[B], rtol=1e-12)


# ---------------------------------------------------------------- learning-rate schedules

def lr_curve(make_scheduler, steps=30, job_name="lr_job"):
    """The rate at steps 0..steps-1, read as the change of w under SGD (momentum 0)
    with a constant gradient of 1."""
    cfg = _config(flow.float64)

    def lr_job(x: tp.Numpy.Placeholder((1,), dtype=flow.float64)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(1,), dtype=flow.float64, initializer=flow.zeros_initializer())
        loss = flow.math.reduce_sum(w * x)
        opt.SGD(make_scheduler(), momentum=0).minimize(loss)
        return loss

    lr_job.__name__ = job_name
    job = flow.global_function(type="train", function_config=cfg)(lr_job)
    one = np.ones(1)
    ws = [0.0]
    for _ in range(steps):
        job(one)
        ws.append(float(flow.get_all_variables()["w"][0]))
    assert len(job.compiled_jobs()) == 1, "a schedule must not recompile the job"
    assert int(flow.get_all_variables()[f"System-Train-TrainStep-{job_name}"]) == steps
    return -np.diff(ws)


def piecewise_index(step, boundaries):
    """OneFlow: the first i with step <= boundaries[i], else len(boundaries)."""
    for i, b in enumerate(boundaries):
        if step <= b:
            return i
    return len(boundaries)


def ref_piecewise_constant(boundaries, values):
    return lambda s: values[piecewise_index(s, boundaries)]


def ref_piecewise_scaling(base, boundaries, scales):
    return lambda s: base * ([1.0] + list(scales))[piecewise_index(s, boundaries)]


def ref_cosine(base, steps, alpha):
    return lambda s: base * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)) + alpha)


def ref_linear_cosine(base, steps, num_periods, alpha, beta):
    def f(s):
        c = min(s, steps)
        linear = (steps - c) / steps
        cosine = 0.5 * (1 + math.cos(math.pi * 2 * num_periods * c / steps))
        return base * ((alpha + linear) * cosine + beta)
    return f


def ref_polynomial(base, steps, end, power, cycle):
    def f(s):
        cur, span = float(s), float(steps)
        if cycle:
            if s == 0:
                cur = 1.0
            span = steps * math.ceil(cur / steps)
        else:
            cur = min(cur, span)
        return (base - end) * (1 - cur / span) ** power + end
    return f


def _p(s, steps, staircase):
    p = s / steps
    return math.floor(p) if staircase else p


def ref_exponential(base, steps, rate, staircase):
    return lambda s: base * rate ** _p(s, steps, staircase)


def ref_inverse_time(base, steps, rate, staircase):
    return lambda s: base / (1 + rate * _p(s, steps, staircase))


def ref_natural_exp(base, steps, rate, staircase):
    return lambda s: base * math.exp(-rate * _p(s, steps, staircase))


def with_linear_warmup(ref, base, warm_steps, start):
    """OneFlow: during warmup base_lr * (start + (1 - start) * step / steps), no decay."""
    return lambda s: base * (start + (1 - start) * s / warm_steps) if s < warm_steps else ref(s)


def with_constant_warmup(ref, base, warm_steps, mult):
    return lambda s: base * mult if s < warm_steps else ref(s)


SCHEDULES = {
    "piecewise_constant": (lambda: opt.PiecewiseConstantScheduler([5, 12, 20], [0.1, 0.05, 0.01, 0.001]),
                           ref_piecewise_constant([5, 12, 20], [0.1, 0.05, 0.01, 0.001])),
    "piecewise_scaling": (lambda: opt.PiecewiseScalingScheduler(0.1, [5, 12], [0.5, 0.1]),
                          ref_piecewise_scaling(0.1, [5, 12], [0.5, 0.1])),
    "piecewise_scaling_scalar": (lambda: opt.PiecewiseScalingScheduler(0.1, [5, 12, 20], 0.5),
                                 ref_piecewise_scaling(0.1, [5, 12, 20], [0.5, 0.5, 0.5])),
    "cosine": (lambda: opt.CosineScheduler(0.1, 20), ref_cosine(0.1, 20, 0.0)),
    "cosine_alpha": (lambda: opt.CosineScheduler(0.1, 20, alpha=0.1), ref_cosine(0.1, 20, 0.1)),
    "linear_cosine": (lambda: opt.LinearCosineScheduler(0.1, 20), ref_linear_cosine(0.1, 20, 0.5, 0.0, 0.001)),
    "linear_cosine_params": (lambda: opt.LinearCosineScheduler(0.1, 20, num_periods=2.0, alpha=0.1, beta=0.01),
                             ref_linear_cosine(0.1, 20, 2.0, 0.1, 0.01)),
    "polynomial": (lambda: opt.PolynomialScheduler(0.1, 10, end_learning_rate=0.001, power=2.0),
                   ref_polynomial(0.1, 10, 0.001, 2.0, False)),
    "polynomial_linear": (lambda: opt.PolynomialScheduler(0.1, 10), ref_polynomial(0.1, 10, 0.0001, 1.0, False)),
    "polynomial_cycle": (lambda: opt.PolynomialScheduler(0.1, 10, end_learning_rate=0.001, power=2.0, cycle=True),
                         ref_polynomial(0.1, 10, 0.001, 2.0, True)),
    "polynomial_schduler_alias": (lambda: opt.PolynomialSchduler(0.1, 7, end_learning_rate=0.01, power=0.5,
                                                                  cycle=True),
                                  ref_polynomial(0.1, 7, 0.01, 0.5, True)),
    "exponential": (lambda: opt.ExponentialScheduler(0.1, 7, 0.5), ref_exponential(0.1, 7, 0.5, False)),
    "exponential_staircase": (lambda: opt.ExponentialScheduler(0.1, 7, 0.5, staircase=True),
                              ref_exponential(0.1, 7, 0.5, True)),
    "inverse_time": (lambda: opt.InverseTimeScheduler(0.1, 5, 0.9), ref_inverse_time(0.1, 5, 0.9, False)),
    "inverse_time_staircase": (lambda: opt.InverseTimeScheduler(0.1, 5, 0.9, staircase=True),
                               ref_inverse_time(0.1, 5, 0.9, True)),
    "natural_exp": (lambda: opt.NaturalExpScheduler(0.1, 10, 0.5), ref_natural_exp(0.1, 10, 0.5, False)),
    "natural_exp_staircase": (lambda: opt.NaturalExpScheduler(0.1, 10, 0.5, staircase=True),
                              ref_natural_exp(0.1, 10, 0.5, True)),
    "warmup_linear_cosine": (lambda: opt.CosineScheduler(0.1, 20, warmup=opt.warmup.linear(8, 0.1)),
                             with_linear_warmup(ref_cosine(0.1, 20, 0.0), 0.1, 8, 0.1)),
    "warmup_constant_exponential": (lambda: opt.ExponentialScheduler(0.1, 4, 0.5,
                                                                     warmup=opt.warmup.constant(6, 0.2)),
                                    with_constant_warmup(ref_exponential(0.1, 4, 0.5, False), 0.1, 6, 0.2)),
    "warmup_linear_piecewise": (lambda: opt.PiecewiseConstantScheduler([3, 10], [0.1, 0.02, 0.005],
                                                                       warmup=opt.warmup.linear(5, 0.0)),
                                with_linear_warmup(ref_piecewise_constant([3, 10], [0.1, 0.02, 0.005]),
                                                   0.1, 5, 0.0)),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_curve(name):
    make, ref = SCHEDULES[name]
    got = lr_curve(make)
    want = np.array([f32(ref(s)) for s in range(30)])
    # the rate is a float32: allow one float32 rounding apart
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-12, err_msg=name)


def test_polynomial_alias_is_the_same_scheduler():
    assert issubclass(opt.PolynomialSchduler, opt.PolynomialScheduler)


def test_schedule_with_momentum_and_adam_bias_correction_do_not_recompile():
    # A schedule feeding a stateful optimizer: still one compiled job.
    lr = opt.CosineScheduler(0.01, 5, warmup=opt.warmup.linear(2, 0.5))
    base = ref_cosine(0.01, 5, 0.0)
    sched = with_linear_warmup(base, 0.01, 2, 0.5)

    def update(p, s, g, t):
        lr_t = f32(f32(sched(t)) * math.sqrt(1 - 0.999 ** (t + 1)) / (1 - 0.9 ** (t + 1)))
        for k in p:
            m = s[f"{k}-m"] = 0.9 * s[f"{k}-m"] + 0.1 * g[k]
            v = s[f"{k}-v"] = 0.999 * s[f"{k}-v"] + 0.001 * g[k] * g[k]
            p[k] = p[k] - lr_t * m / (np.sqrt(v) + 1e-8)

    check_optimizer(lambda: opt.Adam(lr, do_bias_correction=True), update, ["m", "v"], rtol=1e-6,
                    atol=1e-10, steps=8)


def test_warmup_arguments_are_checked_as_oneflow():
    with pytest.raises(ValueError):
        opt.warmup.constant(5, 1.5)
    with pytest.raises(ValueError):
        opt.warmup.linear(5, 1.0)
    with pytest.raises(ValueError):
        opt.warmup.linear(-1, 0.5)
    opt.warmup.linear(0, 0.0)
