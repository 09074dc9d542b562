"""OneFlow 0.4-0.5 optimizer options against numpy references.

References follow oneflow/user/kernels/model_update_kernel_util.h (SGD,
momentum with decoupled weight decay, Adam with the bias-corrected rate,
RMSProp, LARS), dynamic_loss_scale_schedule_kernel.cpp (the loss scale rule)
and optimizer.py (variables=, CombinedOptimizer, loss_scale_policy).
"""
import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

opt = flow.optimizer
SHAPE = (6,)


def _cfg():
    cfg = flow.function_config()
    cfg.default_data_type(flow.float32)
    return cfg


def _init(seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, SHAPE).astype(np.float32)


def _var(name):
    return flow.get_variable(name, shape=SHAPE, dtype=flow.float32,
                             initializer=flow.constant_initializer(0.0))


def _train(make_opt, names, masks, inits, returns_scale=False):
    """Trains loss = sum_i mean(var_i * mask) with flowjit; returns the
    variables after each step (and the loss scale variable if asked)."""
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=_cfg())
    def job(mask: tp.Numpy.Placeholder(SHAPE, dtype=flow.float32)) -> tp.Numpy:
        vs = [_var(n) for n in names]
        loss = None
        for v in vs:
            term = flow.math.reduce_mean(v * mask)
            loss = term if loss is None else loss + term
        make_opt().minimize(loss)
        return loss

    # A first step with a zero gradient creates the variables, then they get
    # their initial values; optimizer state stays zero, the train step is 1.
    job(np.zeros(SHAPE, np.float32))
    flow.load_variables({n: inits[n] for n in names})
    out = []
    for m in masks:
        job(m)
        out.append({n: flow.get_all_variables()[n].numpy().copy() for n in names})
    return out


def _masks(steps, seed=1, scale=1.0):
    r = np.random.default_rng(seed)
    return [(r.uniform(0, 1, SHAPE) * scale).astype(np.float32) for _ in range(steps)]


def _grad(mask):
    return mask.astype(np.float64) / mask.size


def sgd_ref(w, masks, lr, beta, wd=0.0):
    w, v = w.astype(np.float64), np.zeros(SHAPE)
    for m in masks:
        g = _grad(m)
        v = beta * v - lr * g
        w = w + v - lr * wd * w
    return w


def adam_ref(w, masks, lr, b1, b2, eps, step0=0, corrected=True):
    w, m1, m2 = w.astype(np.float64), np.zeros(SHAPE), np.zeros(SHAPE)
    for i, m in enumerate(masks):
        g = _grad(m)
        t = step0 + i + 1
        lr_t = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) if corrected else lr
        m1 = b1 * m1 + (1 - b1) * g
        m2 = b2 * m2 + (1 - b2) * g * g
        w = w - lr_t * m1 / (np.sqrt(m2) + eps)
    return w


def rmsprop_ref(w, masks, lr, decay, eps):
    w, ms = w.astype(np.float64), np.zeros(SHAPE)
    for m in masks:
        g = _grad(m)
        ms = decay * ms + (1 - decay) * g * g
        w = w - lr * g / np.sqrt(ms + eps)
    return w


def lars_ref(w, masks, lr, beta, eps, coeff, wd):
    w, v = w.astype(np.float64), np.zeros(SHAPE)
    for m in masks:
        g = _grad(m)
        wn, gn = np.linalg.norm(w), np.linalg.norm(g)
        lars = coeff * wn / (eps + gn + wd * wn) if wn > 0 and gn > 0 else 1.0
        local = lr * lars
        v = beta * v - local * g
        w = w + v - local * wd * w
    return w


def test_sgdw_with_and_without_momentum():
    inits = {"a": _init(0)}
    masks = _masks(4)
    for beta in (0.0, 0.9):
        got = _train(lambda: opt.SGDW(opt.PiecewiseConstantScheduler([], [0.5]), momentum=beta,
                                      weight_decay=0.3), ["a"], masks, inits)
        np.testing.assert_allclose(got[-1]["a"], sgd_ref(inits["a"], masks, 0.5, beta, 0.3), rtol=1e-5)


def test_sgdw_weight_decay_excludes():
    inits = {"a": _init(0), "b_bias": _init(2)}
    masks = _masks(3)
    got = _train(lambda: opt.SGDW(0.5, momentum=0.0, weight_decay=0.3, weight_decay_excludes=["bias"]),
                 ["a", "b_bias"], masks, inits)
    np.testing.assert_allclose(got[-1]["a"], sgd_ref(inits["a"], masks, 0.5, 0.0, 0.3), rtol=1e-5)
    np.testing.assert_allclose(got[-1]["b_bias"], sgd_ref(inits["b_bias"], masks, 0.5, 0.0, 0.0), rtol=1e-5)


def test_lazy_adam_is_bias_corrected_adam_on_dense_gradients():
    inits = {"a": _init(0)}
    masks = _masks(5)
    got = _train(lambda: opt.LazyAdam(opt.PiecewiseConstantScheduler([], [0.1]), beta1=0.9, beta2=0.99,
                                      epsilon=1e-8), ["a"], masks, inits)
    # the first (zero-gradient) call advanced the step, m and v stay 0
    np.testing.assert_allclose(got[-1]["a"], adam_ref(inits["a"], masks, 0.1, 0.9, 0.99, 1e-8, step0=1),
                               rtol=1e-5)


@pytest.mark.parametrize("wd", [0.0, 0.9])
def test_lars_matches_oneflow_kernel(wd):
    inits = {"a": _init(0) * 30}
    masks = _masks(4)
    got = _train(lambda: opt.LARS(opt.PiecewiseConstantScheduler([], [1.0]), momentum_beta=0.9,
                                  epsilon=1e-9, lars_coefficient=0.01, weight_decay=wd), ["a"], masks, inits)
    np.testing.assert_allclose(got[-1]["a"], lars_ref(inits["a"], masks, 1.0, 0.9, 1e-9, 0.01, wd),
                               rtol=1e-5)


def test_lars_positional_arguments_follow_oneflow():
    o = opt.LARS(0.1, 0.8, 1e-7, 0.02, None, 0.5, None, ["bias"])
    assert (o.momentum, o.epsilon, o.lars_coefficient, o.weight_decay, o.excludes) == \
        (0.8, 1e-7, 0.02, 0.5, ["bias"])


def test_variables_keyword_limits_updates():
    inits = {"a": _init(0), "b": _init(1)}
    masks = _masks(3)
    got = _train(lambda: opt.SGD(0.5, momentum=0.0, variables=["b"]), ["a", "b"], masks, inits)
    np.testing.assert_array_equal(got[-1]["a"], inits["a"])
    np.testing.assert_allclose(got[-1]["b"], sgd_ref(inits["b"], masks, 0.5, 0.0), rtol=1e-5)


def test_combined_optimizer_one_rule_per_variable():
    inits = {"a": _init(0), "b": _init(1), "c": _init(2)}
    masks = _masks(5)

    def make():
        return opt.CombinedOptimizer([
            opt.SGD(opt.PiecewiseConstantScheduler([], [1.0]), momentum=0.9, variables=["a"]),
            opt.RMSProp(opt.PiecewiseConstantScheduler([], [0.5]), decay_rate=0.9, epsilon=1e-6,
                        variables=["b"]),
            opt.Adam(opt.PiecewiseConstantScheduler([], [2.0]), beta1=0.9, beta2=0.99, epsilon=1e-9,
                     do_bias_correction=True, variables=["c"]),
        ])

    got = _train(make, ["a", "b", "c"], masks, inits)[-1]
    np.testing.assert_allclose(got["a"], sgd_ref(inits["a"], masks, 1.0, 0.9), rtol=1e-5)
    np.testing.assert_allclose(got["b"], rmsprop_ref(inits["b"], masks, 0.5, 0.9, 1e-6), rtol=1e-4)
    np.testing.assert_allclose(got["c"], adam_ref(inits["c"], masks, 2.0, 0.9, 0.99, 1e-9, step0=1),
                               rtol=1e-5)


def test_combined_optimizer_rejects_shared_variables():
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=_cfg())
    def job() -> tp.Numpy:
        v = _var("a")
        loss = flow.math.reduce_sum(v)
        opt.CombinedOptimizer([opt.SGD(0.1, variables=["a"]), opt.Adam(0.1, variables=["a"])]).minimize(loss)
        return loss

    with pytest.raises(ValueError, match="variable 'a' is given to both SGD and Adam"):
        job()


def test_variables_naming_an_unknown_variable():
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=_cfg())
    def job() -> tp.Numpy:
        v = _var("a")
        loss = flow.math.reduce_sum(v)
        opt.SGD(0.1, variables=["nope"]).minimize(loss)
        return loss

    with pytest.raises(ValueError, match="variables= names 'nope'"):
        job()


def test_static_loss_scale_policy_equals_unscaled_training():
    inits = {"a": _init(0)}
    masks = _masks(3)
    got = _train(lambda: opt.SGD(0.5, momentum=0.0,
                                 loss_scale_policy=opt.loss_scale.static_loss_scale(1024.0)),
                 ["a"], masks, inits)
    np.testing.assert_allclose(got[-1]["a"], sgd_ref(inits["a"], masks, 0.5, 0.0), rtol=1e-5)


def test_loss_scale_factor_and_policy_exclusive():
    with pytest.raises(ValueError, match="not both"):
        opt.SGD(0.1, loss_scale_factor=2.0, loss_scale_policy=opt.loss_scale.static_loss_scale(2.0))
    with pytest.raises(ValueError, match="multiplier must be a number > 1"):
        opt.loss_scale.dynamic_loss_scale(multiplier=1.0)
    with pytest.raises(ValueError, match="increment_period"):
        opt.loss_scale.dynamic_loss_scale(increment_period=0)


def _scale_ref(scale, good, finite, period, mult):
    if finite:
        good += 1
        if good >= period:
            scale, good = min(scale * mult, np.finfo(np.float32).max), 0
        return scale, good
    return max(scale / mult, 1.0), 0


def test_dynamic_loss_scale_skips_bad_steps_and_moves_the_scale():
    """A mask holding inf makes the gradient non-finite: that step changes
    neither the variable nor the momentum, and halves the scale; two good
    steps in a row double it."""
    flow.clear_default_session()
    period, mult, scale0 = 2, 2.0, 8.0

    @flow.global_function(type="train", function_config=_cfg())
    def job(mask: tp.Numpy.Placeholder(SHAPE, dtype=flow.float32)) -> tp.Numpy:
        v = _var("a")
        loss = flow.math.reduce_mean(v * mask)
        opt.SGD(0.5, momentum=0.9, loss_scale_policy=opt.loss_scale.dynamic_loss_scale(
            initial_loss_scale=scale0, increment_period=period, multiplier=mult)).minimize(loss)
        return loss

    w0 = _init(0)
    job(np.zeros(SHAPE, np.float32))   # creates variables; a good step with zero gradient
    flow.load_variables({"a": w0})
    scale, good = _scale_ref(scale0, 0, True, period, mult)
    bad = np.ones(SHAPE, np.float32)
    bad[2] = np.inf
    good_masks = _masks(4)
    seq = [good_masks[0], bad, good_masks[1], good_masks[2], bad, bad, good_masks[3]]
    w, mom = w0.astype(np.float64), np.zeros(SHAPE)
    for m in seq:
        job(m)
        finite = bool(np.all(np.isfinite(m)))
        if finite:
            mom = 0.9 * mom - 0.5 * _grad(m)
            w = w + mom
        scale, good = _scale_ref(scale, good, finite, period, mult)
        got = flow.get_all_variables()
        np.testing.assert_allclose(got["a"].numpy(), w, rtol=1e-5)
        np.testing.assert_allclose(got["a-momentum"].numpy(), mom, rtol=1e-5, atol=1e-7)
        assert got[opt.LOSS_SCALE_VARIABLE].numpy()[0] == np.float32(scale)
        assert got[opt.GOOD_STEP_COUNTER_VARIABLE].numpy()[0] == good


def test_dynamic_loss_scale_never_below_one():
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=_cfg())
    def job(mask: tp.Numpy.Placeholder(SHAPE, dtype=flow.float32)) -> tp.Numpy:
        v = _var("a")
        loss = flow.math.reduce_mean(v * mask)
        opt.SGD(0.5, momentum=0.0, loss_scale_policy=opt.loss_scale.dynamic_loss_scale(
            initial_loss_scale=3.0, increment_period=100, multiplier=2.0)).minimize(loss)
        return loss

    nan = np.full(SHAPE, np.nan, np.float32)
    for expect in (1.5, 1.0, 1.0):
        job(nan)
        assert flow.get_all_variables()[opt.LOSS_SCALE_VARIABLE].numpy()[0] == expect


def test_custom_scheduler_takes_the_rate_blob():
    flow.clear_default_session()
    w0 = _init(0)

    @flow.global_function(type="train", function_config=_cfg())
    def job(mask: tp.Numpy.Placeholder(SHAPE, dtype=flow.float32),
            lr: tp.Numpy.Placeholder((1,), dtype=flow.float32)) -> tp.Numpy:
        v = _var("a")
        loss = flow.math.reduce_mean(v * mask)
        opt.SGD(opt.CustomScheduler(lr), momentum=0.0).minimize(loss)
        return loss

    zero = np.zeros(SHAPE, np.float32)
    job(zero, np.array([0.0], np.float32))
    flow.load_variables({"a": w0})
    m = _masks(1)[0]
    job(m, np.array([0.25], np.float32))
    np.testing.assert_allclose(flow.get_all_variables()["a"].numpy(), w0 - 0.25 * _grad(m), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="logical blob name"):
        opt.CustomScheduler("lr/out")


def test_train_step_lbn_is_not_supported():
    with pytest.raises(NotImplementedError, match="train_step_lbn"):
        opt.SGD(0.1, train_step_lbn="step/out")


def test_indexed_slices_variables_update_only_touched_rows():
    """function_config().indexed_slices_optimizer_conf: the embedding rows a
    step does not gather keep their value and momentum (no weight decay, no
    momentum step), as OneFlow's sparse updates; the other variable is
    updated densely."""
    flow.clear_default_session()
    rows, lr, beta, wd = 5, 0.5, 0.9, 0.3
    cfg = _cfg()
    cfg.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["emb"])))
    table0 = np.random.default_rng(3).uniform(1, 2, (rows, 2)).astype(np.float32)
    dense0 = np.random.default_rng(4).uniform(1, 2, (2,)).astype(np.float32)

    @flow.global_function(type="train", function_config=cfg)
    def job(ids: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("emb", shape=(rows, 2), dtype=flow.float32,
                                  initializer=flow.constant_initializer(0.0))
        dense = flow.get_variable("dense", shape=(2,), dtype=flow.float32,
                                  initializer=flow.constant_initializer(0.0))
        loss = flow.math.reduce_sum(flow.gather(table, ids) * 2.0) + flow.math.reduce_sum(dense)
        opt.SGDW(lr, momentum=beta, weight_decay=wd).minimize(loss)
        return loss

    job(np.array([0, 0], np.int32))
    flow.load_variables({"emb": table0, "dense": dense0})
    t, tm = table0.astype(np.float64), np.zeros((rows, 2))
    d, dm = dense0.astype(np.float64), np.zeros(2)
    # the first call moved the momenta: start them from zero again
    flow.load_variables({"emb-momentum": np.zeros((rows, 2), np.float32),
                         "dense-momentum": np.zeros(2, np.float32)})
    for ids in ([1, 3], [3, 3], [0, 4]):
        job(np.array(ids, np.int32))
        g = np.zeros((rows, 2))
        for i in ids:
            g[i] += 2.0
        for i in set(ids):
            tm[i] = beta * tm[i] - lr * g[i]
            t[i] = t[i] + tm[i] - lr * wd * t[i]
        dm = beta * dm - lr * np.ones(2)
        d = d + dm - lr * wd * d
        v = flow.get_all_variables()
        np.testing.assert_allclose(v["emb"].numpy(), t, rtol=1e-5)
        np.testing.assert_allclose(v["emb-momentum"].numpy(), tm, rtol=1e-5)
        np.testing.assert_allclose(v["dense"].numpy(), d, rtol=1e-5)


def test_weight_decay_patterns_are_regular_expressions():
    """OneFlow matches weight_decay_includes/_excludes as regular expressions
    against part of the variable name (RE2::PartialMatch)."""
    inits = {"dense_bias": _init(0), "bias_scale": _init(1)}
    masks = _masks(3)
    got = _train(lambda: opt.SGDW(0.5, momentum=0.0, weight_decay=0.3, weight_decay_excludes=["bias$"]),
                 ["dense_bias", "bias_scale"], masks, inits)[-1]
    np.testing.assert_allclose(got["dense_bias"], sgd_ref(inits["dense_bias"], masks, 0.5, 0.0, 0.0), rtol=1e-5)
    np.testing.assert_allclose(got["bias_scale"], sgd_ref(inits["bias_scale"], masks, 0.5, 0.0, 0.3), rtol=1e-5)
    got = _train(lambda: opt.SGDW(0.5, momentum=0.0, weight_decay=0.3, weight_decay_includes=["^dense"]),
                 ["dense_bias", "bias_scale"], masks, inits)[-1]
    np.testing.assert_allclose(got["dense_bias"], sgd_ref(inits["dense_bias"], masks, 0.5, 0.0, 0.3), rtol=1e-5)
    np.testing.assert_allclose(got["bias_scale"], sgd_ref(inits["bias_scale"], masks, 0.5, 0.0, 0.0), rtol=1e-5)
    with pytest.raises(ValueError, match="not a regular expression"):
        opt.SGDW(0.5, weight_decay=0.1, weight_decay_includes=["("])
