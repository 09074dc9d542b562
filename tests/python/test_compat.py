"""OneFlow's older and auxiliary API forms (releases 0.1 to 0.5), each tested
in its release's style: jobs without return annotations and .get(),
FixedTensorDef / MirroredTensorDef, function_config().train with
flow.losses.add_loss, distribute strategies, optimization hints, checkpoints
before the first call, flow.watch, regularizers, name spaces, __all__.

The older and newer forms of the same training must give the same
variables, bit for bit where they compile to the same program.
"""
import os
import threading

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

RNG = np.random.default_rng(7)
X = RNG.standard_normal((8, 4)).astype(np.float32)
Y = (np.arange(8) % 3).astype(np.int32)


def snapshot():
    return {k: np.array(v) for k, v in flow.get_all_variables().items()}


def assert_same_variables(a, b, rtol=0.0, atol=0.0):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=k)


def logits_of(x):
    return flow.layers.dense(x, 3, kernel_initializer=flow.random_normal_initializer(stddev=0.5),
                             name="fc")


# ---------------------------------------------------------------- 0.1-0.2: futures and local blobs

def test_job_without_annotations_returns_a_future_of_local_blobs():
    func_config = flow.FunctionConfig()
    func_config.default_data_type(flow.float)

    @flow.global_function(func_config)
    def eval_job(x=flow.FixedTensorDef((2, 3), dtype=flow.float)):
        y = flow.math.relu(x)
        return y, [x * 2], {"sum": flow.math.reduce_sum(x, axis=1)}

    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    y, (twice,), d = eval_job(x).get()
    np.testing.assert_array_equal(y.ndarray(), np.maximum(x, 0))
    np.testing.assert_array_equal(y.numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(twice.ndarray_list()[0], x * 2)
    assert len(twice.numpy_list()) == 1
    np.testing.assert_array_equal(d["sum"].ndarray(), x.sum(axis=1))
    assert d["sum"].shape == (2,) and d["sum"].dtype == np.float32

    @flow.global_function(func_config)
    def single(x=flow.FixedTensorDef((2, 3))):
        return x + 1

    np.testing.assert_array_equal(single(x).get().ndarray(), x + 1)

    @flow.global_function()
    def returns_nothing(x=flow.FixedTensorDef((2, 3))):
        flow.math.relu(x)

    assert returns_nothing(x) is None


def test_async_get_delivers_in_call_order_on_the_callback_thread():
    @flow.global_function()
    def add_one(x=flow.FixedTensorDef((4,))):
        return x + 1

    got, threads = [], set()

    def cb(blob):
        threads.add(threading.get_ident())
        got.append(float(blob.ndarray()[0]))

    for i in range(6):
        add_one(np.full(4, i, np.float32)).async_get(cb)
    flow.sync_default_session()
    assert got == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert threading.get_ident() not in threads and len(threads) == 1


def test_a_result_is_taken_once():
    @flow.global_function()
    def job(x=flow.FixedTensorDef((2,))):
        return x * 3

    f = job(np.ones(2, np.float32))
    np.testing.assert_array_equal(f.get().numpy(), [3, 3])
    with pytest.raises(RuntimeError, match=r"^job 'job': the result of this call was already taken with "
                                           r"\.get\(\); a job's result is given once"):
        f.get()
    with pytest.raises(RuntimeError, match=r"already taken with \.get\(\)"):
        f.async_get(print)
    g = job(np.ones(2, np.float32))
    with pytest.raises(TypeError, match=r"^job 'job': async_get takes a callable, got int$"):
        g.async_get(3)
    g.async_get(lambda b: None)
    with pytest.raises(RuntimeError, match=r"already taken with \.async_get\(\)"):
        g.get()


def test_errors_of_a_job_without_annotations():
    @flow.global_function()
    def returns_int(x=flow.FixedTensorDef((2,))):
        return 3

    with pytest.raises(TypeError, match=r"^job 'returns_int' has no return annotation, so it may return "
                                        r"None, a Blob, or tuples, lists and dicts of Blobs; it returned int$"):
        returns_int(np.ones(2, np.float32))

    @flow.global_function()
    def typed(x=flow.FixedTensorDef((2,), dtype=flow.int32)):
        return x

    with pytest.raises(TypeError, match=r"parameter 'x' is declared int32 but the array is float32"):
        typed(np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"flow\.FixedTensorDef: shape must be a tuple of positive ints"):
        flow.FixedTensorDef((2, 0))

    # A failing job's error comes from .get().
    @flow.global_function()
    def ok(x=flow.FixedTensorDef((2,))):
        return x

    def boom(_):
        raise KeyError("in the callback")

    ok(np.ones(2, np.float32)).async_get(boom)
    later = ok(np.ones(2, np.float32))
    with pytest.raises(KeyError, match="in the callback"):
        later.get()


def test_mirrored_tensor_def_with_the_mirrored_strategy():
    func_config = flow.FunctionConfig()
    func_config.default_distribute_strategy(flow.distribute.mirrored_strategy())
    seen = []

    @flow.global_function(func_config)
    def mirrored_job(x=flow.MirroredTensorDef((4, 2), dtype=flow.float)):
        seen.append((flow.distribute.consistent_strategy_enabled(), flow.scope.mirrored_view_enabled(),
                     flow.distribute.mirrored_strategy_enabled(), flow.scope.consistent_view_enabled()))
        return x * 2

    flow.config.cpu_device_num(2)
    try:
        a, b = np.ones((4, 2), np.float32), np.full((4, 2), 3, np.float32)
        out = mirrored_job([a, b]).get()
        got = out.ndarray_list()
        assert len(got) == 2
        np.testing.assert_array_equal(got[0], a * 2)
        np.testing.assert_array_equal(got[1], b * 2)
        np.testing.assert_array_equal(out.numpy(1), b * 2)
        with pytest.raises(ValueError, match=r"^job 'mirrored_job': this result has one value per device "
                                             r"\(2 devices\); use numpy_list\(\) or numpy\(rank\)$"):
            out.numpy()
    finally:
        flow.config.cpu_device_num(1)
    assert seen == [(False, True, True, False)]
    assert flow.scope.consistent_view_enabled() and not flow.scope.mirrored_view_enabled()

    with pytest.raises(TypeError, match=r"^function_config\.default_distribute_strategy: expected flow\."
                                        r"distribute\.consistent_strategy\(\) or flow\.distribute\."
                                        r"mirrored_strategy\(\), got 'mirrored'$"):
        flow.FunctionConfig().default_distribute_strategy("mirrored")


def test_consistent_strategy_in_the_job():
    func_config = flow.FunctionConfig()
    func_config.default_distribute_strategy(flow.distribute.consistent_strategy())
    seen = []

    @flow.global_function(func_config)
    def job(x=flow.FixedTensorDef((2,))):
        seen.append(flow.distribute.consistent_strategy_enabled())
        return x

    job(np.ones(2, np.float32)).get()
    assert seen == [True]


# ---------------------------------------------------------------- 0.1-0.2: train conf and add_loss

CONFS = {
    "naive": ({"naive_conf": {}}, lambda: flow.optimizer.SGD(0.1, momentum=0)),
    "momentum": ({"momentum_conf": {"beta": 0.8}}, lambda: flow.optimizer.SGD(0.1, momentum=0.8)),
    "adam": ({"adam_conf": {"beta1": 0.85, "beta2": 0.99, "epsilon": 1e-7, "do_bias_correction": True}},
             lambda: flow.optimizer.Adam(0.1, beta1=0.85, beta2=0.99, epsilon=1e-7, do_bias_correction=True)),
    "rmsprop": ({"rmsprop_conf": {"decay_rate": 0.9, "epsilon": 1e-6, "centered": True}},
                lambda: flow.optimizer.RMSProp(0.1, decay_rate=0.9, epsilon=1e-6, centered=True)),
    "lamb": ({"lamb_conf": {"beta1": 0.8, "beta2": 0.95, "epsilon": 1e-5}},
             lambda: flow.optimizer.LAMB(0.1, beta1=0.8, beta2=0.95, epsilon=1e-5)),
    "lars": ({"lars_conf": {"momentum_beta": 0.7, "epsilon": 1e-8, "lars_coefficient": 0.01}},
             lambda: flow.optimizer.LARS(0.1, momentum_beta=0.7, epsilon=1e-8, lars_coefficient=0.01)),
    "adam+decay+warmup+clip+weight_decay": (
        {"adam_conf": {}, "learning_rate_decay": {"exponential_conf": {"decay_batches": 2, "decay_rate": 0.5}},
         "warmup_conf": {"linear_conf": {"warmup_batches": 2, "start_multiplier": 0.1}},
         "clip_conf": {"clip_by_global_norm": {"clip_norm": 0.5}},
         "weight_decay_conf": {"weight_decay_rate": 0.01, "excludes": {"pattern": ["bias"]}}},
        lambda: flow.optimizer.AdamW(
            flow.optimizer.ExponentialScheduler(0.1, 2, 0.5, warmup=flow.optimizer.warmup.linear(2, 0.1)),
            grad_clipping=flow.optimizer.grad_clipping.by_global_norm(0.5), weight_decay=0.01,
            weight_decay_excludes=["bias"])),
}


def train_old_style(conf, steps=4):
    """OneFlow 0.2's documentation: a FunctionConfig with train settings,
    FixedTensorDef defaults, add_loss, and .get()."""
    func_config = flow.FunctionConfig()
    func_config.default_data_type(flow.float)
    func_config.train.primary_lr(0.1)
    func_config.train.model_update_conf(conf)

    @flow.global_function(func_config)
    def train_job(images=flow.FixedTensorDef((8, 4), dtype=flow.float),
                  labels=flow.FixedTensorDef((8,), dtype=flow.int32)):
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits_of(images))
        flow.losses.add_loss(loss)
        return loss

    return [train_job(X, Y).get().ndarray() for _ in range(steps)]


def train_new_style(make_optimizer, steps=4):
    """OneFlow 0.3+: annotations, type="train", an optimizer object."""
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((8, 4), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits_of(images))
        make_optimizer().minimize(loss)
        return loss

    return [train_job(X, Y) for _ in range(steps)]


@pytest.mark.parametrize("name", list(CONFS))
def test_train_conf_trains_like_the_optimizer_object(name):
    conf, make_optimizer = CONFS[name]
    old_losses = train_old_style(conf)
    old = snapshot()
    flow.clear_default_session()
    new_losses = train_new_style(make_optimizer)
    new = snapshot()
    assert_same_variables(old, new)
    np.testing.assert_array_equal(np.array(old_losses), np.array(new_losses))
    assert old_losses[-1].mean() < old_losses[0].mean()  # it trained


def test_train_conf_errors():
    train = flow.FunctionConfig().train
    with pytest.raises(ValueError, match=r"^function_config\.train\.model_update_conf: unknown key "
                                         r"'sgd_conf'; expected one update rule \(adam_conf, lamb_conf, "
                                         r"lars_conf, momentum_conf, naive_conf, rmsprop_conf\)"):
        train.model_update_conf({"sgd_conf": {}})
    with pytest.raises(ValueError, match=r"^function_config\.train\.model_update_conf: momentum_conf has "
                                         r"no field 'momentum'; its fields are beta$"):
        train.model_update_conf({"momentum_conf": {"momentum": 0.9}})
    with pytest.raises(NotImplementedError, match=r"lazy_adam_conf is a OneFlow update rule flowjit does "
                                                  r"not have"):
        train.model_update_conf({"lazy_adam_conf": {}})
    with pytest.raises(ValueError, match=r"exactly one update rule is needed .* got \['naive_conf', "
                                         r"'adam_conf'\]"):
        train.model_update_conf({"naive_conf": {}, "adam_conf": {}})
    with pytest.raises(ValueError, match=r"unknown learning_rate_decay 'step_conf'; flowjit knows "
                                         r"cosine_conf, exponential_conf"):
        train.model_update_conf({"naive_conf": {}, "learning_rate_decay": {"step_conf": {}}})
    with pytest.raises(NotImplementedError, match=r"weight_decay_conf with momentum_conf: flowjit applies "
                                                  r"weight decay only with adam_conf \(as AdamW\)"):
        train.model_update_conf({"momentum_conf": {}, "weight_decay_conf": {"weight_decay_rate": 0.1}})
    with pytest.raises(ValueError, match=r"^SGD: momentum must be in \[0, 1\), got 1\.5$"):
        train.model_update_conf({"momentum_conf": {"beta": 1.5}})
    with pytest.raises(TypeError, match=r"model_update_conf: the conf must be a dict, got str"):
        train.model_update_conf("naive")
    with pytest.raises(ValueError, match=r"^function_config\.train\.primary_lr: expected a non-negative "
                                         r"number, got -1$"):
        train.primary_lr(-1)
    with pytest.raises(NotImplementedError, match=r"^function_config\.train\.secondary_lr: a second "
                                                  r"learning rate"):
        train.secondary_lr(0.1)
    with pytest.raises(AttributeError, match=r"^function_config\.train has no setting 'weight_l3'"):
        train.weight_l3(0.1)


def test_add_loss_errors():
    @flow.global_function()
    def no_settings(x=flow.FixedTensorDef((2,))):
        flow.losses.add_loss(x)
        return x

    with pytest.raises(TypeError, match=r"losses\.add_loss: job 'no_settings' is a predict job"):
        no_settings(np.ones(2, np.float32))

    @flow.global_function(type="train")
    def declared_train(x=flow.FixedTensorDef((2,))):
        flow.losses.add_loss(x * flow.get_variable("w", shape=(2,)))
        return x

    with pytest.raises(TypeError, match=r"flow\.losses\.add_loss: job 'declared_train' has no training "
                                        r"settings; set function_config\(\)\.train\.primary_lr"):
        declared_train(np.ones(2, np.float32))

    cfg = flow.FunctionConfig()
    cfg.train.primary_lr(0.1)
    cfg.train.model_update_conf({"naive_conf": {}})

    @flow.global_function(cfg)
    def forgot_add_loss(x=flow.FixedTensorDef((2,))):
        return x * flow.get_variable("w", shape=(2,))

    with pytest.raises(TypeError, match=r"^job 'forgot_add_loss' has function_config\(\)\.train settings "
                                        r"but never calls flow\.losses\.add_loss\(loss\)"):
        forgot_add_loss(np.ones(2, np.float32))

    no_conf = flow.FunctionConfig()
    no_conf.train.primary_lr(0.1)

    @flow.global_function(no_conf)
    def no_rule(x=flow.FixedTensorDef((2,))):
        flow.losses.add_loss(x * flow.get_variable("w", shape=(2,)))

    with pytest.raises(ValueError, match=r"^job 'no_rule': function_config\(\)\.train needs "
                                         r"model_update_conf"):
        no_rule(np.ones(2, np.float32))

    @flow.global_function(cfg)
    def both(x=flow.FixedTensorDef((2,))):
        loss = x * flow.get_variable("w", shape=(2,))
        flow.optimizer.SGD(0.1).minimize(loss)
        flow.losses.add_loss(loss)

    with pytest.raises(ValueError, match=r"add_loss: job 'both' already calls an optimizer's minimize"):
        both(np.ones(2, np.float32))
    assert flow.get_all_variables() == {}  # failed traces created nothing


# ---------------------------------------------------------------- 0.3-0.5: config hints

def test_optimization_hints_are_accepted_and_said_once(monkeypatch, capsys):
    monkeypatch.setattr(flow.FunctionConfig, "_said", set())
    monkeypatch.setenv("FLOWJIT_DEBUG", "1")
    configs = []
    for _ in range(2):
        cfg = flow.function_config()
        cfg.enable_inplace(True)
        cfg.enable_fuse_add_to_output(True)
        cfg.enable_xla_jit(False)
        cfg.enable_tensor_float_32_compute(True)  # a permission: CPU jobs compute in full float32
        cfg.enable_auto_mixed_precision(False)
        configs.append(cfg)
    err = capsys.readouterr().err
    assert err.count("function_config.enable_inplace(True) is ignored: flowjit plans memory reuse "
                     "itself") == 1
    assert err.count("enable_fuse_add_to_output(True) is ignored") == 1
    assert err.count("enable_xla_jit(False) is ignored: flowjit is its own JIT") == 1
    monkeypatch.delenv("FLOWJIT_DEBUG")

    @flow.global_function(function_config=configs[0])
    def hinted(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.math.tanh(x) + 1

    x = np.array([0.5, -1, 2], np.float32)
    np.testing.assert_allclose(hinted(x), np.tanh(x) + 1, rtol=1e-6)


def test_hints_that_change_numerics():
    cfg = flow.function_config()
    with pytest.raises(ValueError, match=r"^enable_auto_mixed_precision: dtype must be flow\.float16 or "
                                         r"flow\.bfloat16, got flow\.int32$"):
        cfg.enable_auto_mixed_precision(True, dtype=flow.int32)
    with pytest.raises(TypeError, match=r"^function_config\.enable_inplace: expected True or False, "
                                        r"got 'yes'$"):
        cfg.enable_inplace("yes")
    with pytest.raises(NotImplementedError, match=r"function_config\.enable_tensorrt is a OneFlow setting"):
        cfg.enable_tensorrt(True)
    # TF32 is the GPU target's FLOWJIT_ALLOW_TF32, set for the compile of a GPU job only.
    from flowjit._core.job import _tf32_for
    saved = os.environ.pop("FLOWJIT_ALLOW_TF32", None)
    try:
        cfg.enable_tensor_float_32_compute(True)
        with _tf32_for(cfg, {"device": "gpu", "gpu": 0}):
            assert os.environ["FLOWJIT_ALLOW_TF32"] == "1"
        assert "FLOWJIT_ALLOW_TF32" not in os.environ
        with _tf32_for(cfg, {}):
            assert "FLOWJIT_ALLOW_TF32" not in os.environ
        os.environ["FLOWJIT_ALLOW_TF32"] = "1"
        cfg.enable_tensor_float_32_compute(False)
        with _tf32_for(cfg, {"device": "gpu", "gpu": 0}):
            assert os.environ["FLOWJIT_ALLOW_TF32"] == "0"
        assert os.environ["FLOWJIT_ALLOW_TF32"] == "1"
    finally:
        os.environ.pop("FLOWJIT_ALLOW_TF32", None)
        if saved is not None:
            os.environ["FLOWJIT_ALLOW_TF32"] = saved


def test_model_io_switches_are_accepted():
    flow.config.enable_legacy_model_io(True)
    flow.config.enable_model_io_v2(True)
    flow.config.enable_legacy_model_io(False)
    with pytest.raises(TypeError, match=r"^config\.enable_model_io_v2: expected True or False, got 1$"):
        flow.config.enable_model_io_v2(1)


# ---------------------------------------------------------------- checkpoints before the first call

def make_train_job():
    @flow.global_function(type="train")
    def ck_job(x: tp.Numpy.Placeholder((8, 4), dtype=flow.float),
               y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits_of(x))
        flow.optimizer.SGD(0.5, momentum=0.9).minimize(loss)
        return loss
    return ck_job


def make_extra_job():
    @flow.global_function()
    def extra_job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return x + flow.get_variable("extra", shape=(3,), initializer=flow.constant_initializer(2.5))
    return extra_job


@pytest.fixture
def saved(tmp_path):
    """A checkpoint after 2 steps, and the state after a 3rd step from it."""
    job = make_train_job()
    job(X, Y)
    job(X, Y)
    path = tmp_path / "ck"
    flow.checkpoint.save(path)
    at_save = snapshot()
    job(X, Y)
    after = snapshot()
    flow.clear_default_session()
    return path, at_save, after


def test_checkpoint_load_before_the_first_call(saved):
    path, at_save, after = saved
    job = make_train_job()
    extra = make_extra_job()
    check_point = flow.train.CheckPoint()
    check_point.load(str(path))
    now = snapshot()
    assert now.pop("extra").tolist() == [2.5, 2.5, 2.5]  # not in the checkpoint: its initial value
    assert_same_variables(now, at_save)  # momentum and train step included
    job(X, Y)
    now = snapshot()
    now.pop("extra")
    assert_same_variables(now, after)
    np.testing.assert_array_equal(extra(np.zeros(3, np.float32)), [2.5, 2.5, 2.5])


def test_load_variables_before_the_first_call(saved):
    path, at_save, after = saved
    job = make_train_job()
    flow.load_variables(flow.checkpoint.get(path))
    assert_same_variables(snapshot(), at_save)
    job(X, Y)
    assert_same_variables(snapshot(), after)


def test_checkpoint_init_in_the_legacy_style(tmp_path):
    flow.config.enable_legacy_model_io(True)
    try:
        job = make_train_job()
        check_point = flow.train.CheckPoint()
        check_point.init()
        initial = snapshot()
        assert sorted(initial) == ["System-Train-TrainStep-ck_job", "fc-bias", "fc-bias-momentum",
                                   "fc-weight", "fc-weight-momentum"]
        assert not initial["fc-weight-momentum"].any() and int(initial["System-Train-TrainStep-ck_job"]) == 0
        check_point.save(str(tmp_path / "init"))
        first = job(X, Y)
    finally:
        flow.config.enable_legacy_model_io(False)
    # The values init() gave are the ones the first call would have started from.
    flow.clear_default_session()
    job = make_train_job()
    np.testing.assert_array_equal(job(X, Y), first)
    flow.clear_default_session()
    job = make_train_job()
    flow.train.CheckPoint().load(str(tmp_path / "init"))
    np.testing.assert_array_equal(job(X, Y), first)


def test_a_job_that_fails_to_trace_is_named(tmp_path):
    @flow.global_function()
    def broken(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.reshape(x, (2, 2))

    with pytest.raises(ValueError) as info:
        flow.train.CheckPoint().init()
    assert "while tracing job 'broken' for its declared shapes" in "".join(info.value.__notes__)


def test_simple_checkpoint_manager(tmp_path):
    root = tmp_path / "snapshots"
    job = make_train_job()
    manager = flow.train.SimpleCheckPointManager(str(root), prefix="snapshot_")
    assert manager.list_checkpoints() == [] and manager.latest_checkpoint() is None
    manager.initialize_or_restore()  # nothing to restore: the initial values become the first
    initial = snapshot()
    assert len(manager.list_checkpoints()) == 1
    job(X, Y)
    name = manager.save()
    trained = snapshot()
    assert manager.list_checkpoints()[-1] == name == manager.latest_checkpoint()
    assert len(manager.list_checkpoints()) == 2
    assert_same_variables(flow.checkpoint.get(root / manager.list_checkpoints()[0]), initial)
    os.mkdir(root / "snapshot_zz_incomplete")  # no snapshot_done: not a checkpoint
    assert manager.latest_checkpoint() == name

    flow.clear_default_session()
    job = make_train_job()
    flow.train.SimpleCheckPointManager(str(root)).initialize_or_restore()
    assert_same_variables(snapshot(), trained)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        flow.train.SimpleCheckPointManager(str(tmp_path / "file"))


# ---------------------------------------------------------------- flow.watch

def test_watch_gets_every_value_in_order_on_the_callback_thread():
    seen, threads = [], set()

    def handler(v):
        threads.add(threading.get_ident())
        seen.append(v.ndarray().copy())

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        h = flow.math.exp(x)
        flow.watch(h, handler)
        return flow.math.tanh(h * 0.1)

    xs = [np.full(4, i / 4, np.float32) for i in range(5)]
    outs = [job(x) for x in xs]
    flow.sync_default_session()
    assert len(seen) == 5 and threading.get_ident() not in threads
    for x, v, o in zip(xs, seen, outs):
        np.testing.assert_allclose(v, np.exp(x), rtol=1e-6)
        np.testing.assert_allclose(o, np.tanh(np.exp(x) * 0.1), rtol=1e-6)


def test_watch_in_a_train_job_without_annotations():
    cfg = flow.FunctionConfig()
    cfg.train.primary_lr(0.1)
    cfg.train.model_update_conf({"naive_conf": {}})
    watched = []

    @flow.global_function(cfg)
    def train_job(images=flow.FixedTensorDef((8, 4)), labels=flow.FixedTensorDef((8,), dtype=flow.int32)):
        logits = logits_of(images)
        flow.watch(logits, lambda v: watched.append(np.array(v)))
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.losses.add_loss(loss)
        return loss

    states = []
    for _ in range(3):
        train_job(X, Y).get()  # the handler has run when get() returns
        states.append(snapshot())
    assert len(watched) == 3
    for i in (1, 2):  # call i computed its logits with the variables after step i - 1
        w, b = states[i - 1]["fc-weight"], states[i - 1]["fc-bias"]
        np.testing.assert_allclose(watched[i], X @ w.T + b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(watched[1], watched[2])


def test_watch_in_a_callback_job_and_a_raising_handler():
    seen = []

    def bad_handler(v):
        raise ValueError(f"handler saw {v.tolist()}")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Callback[tp.Numpy]:
        y = flow.math.multiply(x, 2.0, name="doubled")
        flow.watch(y, bad_handler)
        flow.watch(y + 1, lambda v: seen.append(v.tolist()))
        return y

    results = []
    job(np.array([1, 2], np.float32))(lambda r: results.append(r.tolist()))
    with pytest.raises(ValueError, match=r"handler saw \[2\.0, 4\.0\]") as info:
        flow.sync_default_session()
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "raised by the flow.watch handler of blob 'doubled'" in notes
    assert seen == [[3.0, 5.0]] and results == [[2.0, 4.0]]  # the other handler and the callback ran


def test_watch_errors():
    @flow.global_function()
    def not_callable(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        flow.watch(x, 42)
        return x

    with pytest.raises(TypeError, match=r"^job 'not_callable', test_compat\.py:\d+: flow\.watch: the "
                                        r"handler must be callable, got int$"):
        not_callable(np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match=r"^flow\.watch can only be used inside a function decorated"):
        flow.watch(None, print)

    @flow.global_function(type="predict")
    def no_grads(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        flow.watch_diff(x * 2.0, print)
        return x

    with pytest.raises(ValueError, match=r"flow\.watch_diff: job 'no_grads' is a predict job; gradients "
                                          r"exist only in train jobs"):
        no_grads(np.ones(2, np.float32))


def test_watch_diff_gets_the_backward_gradient_every_call():
    """OneFlow 0.2's flow.watch_diff: the gradient of the loss at a blob, with
    the loss seeded with ones (OneFlow scales only the variables' diffs)."""
    seen = []

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((3, 2)), c: tp.Numpy.Placeholder((3, 2))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(2,), initializer=flow.constant_initializer(2.0))
        h = x * w
        flow.watch_diff(h, lambda g: seen.append(np.array(g)))
        loss = flow.math.square(h) * c  # a (3, 2) loss: six instances
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]), momentum=0).minimize(loss)
        return loss

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    c = np.full((3, 2), 0.5, np.float32)
    train(x, c)
    w1 = np.asarray(flow.get_all_variables()["w"]).copy()
    train(x, c)
    flow.sync_default_session()
    assert len(seen) == 2
    np.testing.assert_allclose(seen[0], 2 * (x * 2.0) * c, rtol=1e-6)  # d(h^2 c)/dh = 2 h c
    np.testing.assert_allclose(seen[1], 2 * (x * w1) * c, rtol=1e-6)


# ---------------------------------------------------------------- regularizers

def test_regularizers_on_get_variable_follow_oneflow():
    w0 = np.array([1.0, -2.0, 0.5], np.float32)
    lr = 0.1

    def make(reg, name):
        @flow.global_function(type="train")
        def reg_job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
            w = flow.get_variable(name, shape=(3,), initializer=flow.constant_initializer(0.0),
                                  regularizer=reg)
            loss = flow.math.reduce_sum(x * w, axis=1)  # (4,): trained like its mean
            flow.optimizer.SGD(lr, momentum=0).minimize(loss)
            return loss
        return reg_job

    x = RNG.standard_normal((4, 3)).astype(np.float32)
    grad = x.mean(axis=0)
    cases = {"w_l1": (flow.regularizers.l1(0.2), 0.2 * np.sign(w0)),
             "w_l2": (flow.regularizers.l2(0.5), 0.5 * w0),
             "w_l1_l2": (flow.regularizers.l1_l2(l1=0.2, l2=0.5), 0.2 * np.sign(w0) + 0.5 * w0)}
    for name, (reg, extra) in cases.items():
        job = make(reg, name)
        flow.load_variables({name: w0})  # before the first call: the job is traced to create `name`
        job(x)
        np.testing.assert_allclose(flow.get_all_variables()[name], w0 - lr * (grad + extra), rtol=1e-6,
                                   err_msg=name)


def test_layer_regularizers_match_the_penalty_added_by_hand():
    def run(by_hand):
        @flow.global_function(type="train")
        def reg_job(x: tp.Numpy.Placeholder((8, 4)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) \
                -> tp.Numpy:
            reg = None if by_hand else flow.regularizers.l2(0.3)
            breg = None if by_hand else flow.regularizers.l1(0.05)
            logits = flow.layers.dense(x, 3, kernel_initializer=flow.random_normal_initializer(stddev=0.5),
                                       bias_initializer=flow.random_normal_initializer(stddev=0.5),
                                       kernel_regularizer=reg, bias_regularizer=breg, name="fc")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            if by_hand:  # l2 / 2 * sum(w^2) + l1 * sum(|b|), not averaged over the batch
                w = flow.get_variable("fc-weight", shape=(3, 4))
                b = flow.get_variable("fc-bias", shape=(3,))
                loss = loss + (0.15 * flow.math.reduce_sum(w * w) + 0.05 * flow.math.reduce_sum(flow.math.abs(b)))
            flow.optimizer.SGD(0.2, momentum=0.9).minimize(loss)
            return loss
        for _ in range(3):
            reg_job(X, Y)
        return snapshot()

    auto = run(False)
    flow.clear_default_session()
    by_hand = run(True)
    assert_same_variables(auto, by_hand, rtol=1e-5, atol=1e-6)
    flow.clear_default_session()

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:  # no loss: regularizers do nothing
        return flow.layers.dense(x, 3, kernel_regularizer=flow.regularizers.l2(0.3), name="fc")

    assert predict(X).shape == (8, 3)


def test_regularizer_errors():
    with pytest.raises(ValueError, match=r"^regularizers\.l2: l2 must be a non-negative number, got -1$"):
        flow.regularizers.l2(-1)
    with pytest.raises(ValueError, match=r"^regularizers\.l1_l2: l1 must be a non-negative number"):
        flow.regularizers.l1_l2(l1="a")

    @flow.global_function()
    def bad(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x * flow.get_variable("w", shape=(2,), regularizer=0.1)

    with pytest.raises(TypeError, match=r"get_variable: regularizer of 'w' must come from "
                                        r"flow\.regularizers \(l1, l2 or l1_l2\), got 0\.1$"):
        bad(np.ones(2, np.float32))

    @flow.global_function()
    def int_var(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        v = flow.get_variable("i", shape=(2,), dtype=flow.int32, regularizer=flow.regularizers.l1())
        return x + flow.cast(v, flow.float)

    with pytest.raises(TypeError, match=r"get_variable: 'i' is flow\.int32, and only float variables can "
                                        r"be regularized"):
        int_var(np.ones(2, np.float32))


# ---------------------------------------------------------------- name spaces

def test_namespace_prefixes_variables_and_op_names():
    names = []

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 4))) -> tp.Numpy:
        with flow.scope.namespace("encoder"):
            h = flow.layers.dense(x, 3, name="fc")
            names.append(h.name)
            with flow.name_scope("inner"):
                v = flow.get_variable("w", shape=(3,), initializer=flow.ones_initializer())
                names.append((h * v).name)
        names.append((h + h).name)
        return h * v

    job(np.ones((2, 4), np.float32))
    assert sorted(flow.get_all_variables()) == ["encoder-fc-bias", "encoder-fc-weight", "encoder-inner-w"]
    assert names == ["encoder-fc_bias_add", "encoder-inner-multiply_0", "add_0"]
    assert flow.name_scope is flow.scope.namespace
    with pytest.raises(TypeError, match=r"^scope\.namespace: name must be a non-empty string, got 3$"):
        flow.scope.namespace(3)


# ---------------------------------------------------------------- __all__

def test_public_modules_define_all():
    for name in ("checkpoint", "config", "data", "distribute", "env", "losses", "optimizer",
                 "regularizers", "scope", "train", "typing"):
        module = getattr(flow, name)
        assert module.__all__, name
        for n in module.__all__:
            assert hasattr(module, n), (name, n)
        assert dir(module) == sorted(module.__all__), name
    layers = dir(flow.layers)
    assert "dense" in layers and "numbers" not in layers and "np" not in layers and "_ops" not in layers
    assert "numbers" not in dir(flow.config) and "np" not in dir(flow.nn)
    top = flow.__all__
    for n in ("global_function", "FixedTensorDef", "MirroredTensorDef", "watch", "watch_diff",
              "name_scope", "losses", "regularizers", "layers", "typing", "float"):
        assert n in top, n
    assert "np" not in top and "atexit" not in top
    namespace = {}
    exec("from flowjit import *", namespace)  # noqa: S102
    assert namespace["FixedTensorDef"] is flow.FixedTensorDef
