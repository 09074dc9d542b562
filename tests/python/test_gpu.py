"""Jobs placed on a GPU: placement parsing and validation, flow.config.
gpu_device_num, the clear error where the GPU cannot be used (no driver, no
such GPU), CPU fallback with its warning; and, where a GPU is, the GPU-placed
jobs against the same jobs on the CPU (predict, train, async, variables
shared with CPU jobs and checkpoints, the disk cache).

The real-GPU cases skip (visibly) without a usable GPU; FLOWJIT_REQUIRE_GPU=1
(tools/gpu_check.sh sets it) turns those skips into failures."""
import os
import warnings

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from flowjit import _C


def _gpu_reason():
    status = _C.gpu_status(0)
    return None if status["available"] else status["reason"]


NO_GPU = _gpu_reason()
REQUIRE_GPU = os.environ.get("FLOWJIT_REQUIRE_GPU", "") not in ("", "0")
# FLOWJIT_REQUIRE_GPUS=2 (tools/gpu_check.sh where two GPUs are): the
# two-GPU cases fail rather than skip.
REQUIRE_TWO_GPUS = os.environ.get("FLOWJIT_REQUIRE_GPUS", "").strip() not in ("", "0", "1")
# A GPU that does not exist on any machine: the error path where a driver is.
MISSING = 0 if NO_GPU else 63


@pytest.fixture(autouse=True)
def default_devices_after():
    yield
    flow.sync_default_session()
    flow.clear_default_session()
    flow.config.gpu_device_num(0)
    flow.config.cpu_device_num(1)


@pytest.fixture
def gpu():
    """The real GPU, for the cases that compare it with the CPU."""
    if NO_GPU:
        if REQUIRE_GPU:
            pytest.fail(f"FLOWJIT_REQUIRE_GPU is set but no GPU can be used: {NO_GPU}")
        pytest.skip(f"no GPU: {NO_GPU}")
    flow.config.gpu_device_num(1)
    return flow.scope.placement("gpu", "0:0")


def _placed(placement, fallback=False):
    cfg = flow.function_config()
    cfg.default_placement_scope(placement)
    if fallback:
        cfg.allow_cpu_fallback(True)
    return cfg


# ---------------------------------------------------------------- config and placement

@pytest.mark.parametrize("n", [0, 1, 2, 8])
def test_gpu_device_num_accepts_counts(n):
    flow.config.gpu_device_num(n)
    assert flow.config._settings["gpu_device_num"] == n
    assert flow.config.device_count() == 1, "jobs stay on the CPU devices unless placed on a GPU"


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1", None])
def test_gpu_device_num_rejects_non_counts(bad):
    with pytest.raises(ValueError, match=r"config\.gpu_device_num: expected a non-negative int, got "):
        flow.config.gpu_device_num(bad)


def test_gpu_placement_parses_like_cpu_placement():
    p = flow.scope.placement("gpu", "0:0")
    assert p.device_tag == "gpu" and p.devices == [(0, [0])]
    assert flow.scope.placement("gpu", "0:1-3").devices == [(0, [1, 2, 3])]
    assert flow.scope.placement("gpu", ["0:0", "1:0"]).devices == [(0, [0]), (1, [0])]
    assert p == flow.scope.placement("gpu", "0:0") and p != flow.scope.placement("cpu", "0:0")
    with pytest.raises(ValueError, match="device_tag must be \"cpu\" or \"gpu\", got 'tpu'"):
        flow.scope.placement("tpu", "0:0")
    with pytest.raises(ValueError, match="expected \"machine:devices\""):
        flow.scope.placement("gpu", "0")
    with pytest.raises(ValueError, match="cannot parse device ids '0:x'"):
        flow.scope.placement("gpu", "0:x")


def test_allow_cpu_fallback_takes_a_bool():
    cfg = flow.function_config()
    assert cfg.allow_cpu_fallback() is cfg
    assert cfg.get("allow_cpu_fallback") is True
    cfg.allow_cpu_fallback(False)
    assert cfg.get("allow_cpu_fallback") is False
    with pytest.raises(TypeError, match=r"allow_cpu_fallback: expected True or False, got 'yes'"):
        cfg.allow_cpu_fallback("yes")
    with pytest.raises(AttributeError, match="allow_cpu_fallback"):
        cfg.no_such_setting  # noqa: B018 - the message lists the settings


def _plus_one(cfg=None, name="plus_one"):
    def plus_one(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x + 1
    plus_one.__name__ = name
    return flow.global_function(type="predict", function_config=cfg)(plus_one)


def test_a_job_on_several_gpus_needs_each_of_them():
    # Where a GPU of the placement cannot be used, the error names it and why.
    other = 1 if NO_GPU else MISSING
    job = _plus_one(_placed(flow.scope.placement("gpu", ["0:0", f"0:{other}"])))
    with pytest.raises(RuntimeError, match=rf"job 'plus_one' is placed on GPU {0 if NO_GPU else other} .* "
                       r"cannot run there"):
        job(np.zeros(4, np.float32))

    @flow.global_function(type="predict")
    def in_body(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        with flow.scope.placement("gpu", ["0:0", "1:0"]):
            return x + 1

    with pytest.raises(ValueError, match="placed on machine 1 .* runs on one machine, 0"):
        in_body(np.zeros(4, np.float32))
    twice = _plus_one(_placed(flow.scope.placement("gpu", ["0:1", "0:1"])), name="twice")
    with pytest.raises(ValueError, match=r"placed on GPUs \[1, 1\] .* each GPU once"):
        twice(np.zeros(4, np.float32))


def test_gpu_jobs_over_several_processes_take_any_gpus_of_each(monkeypatch):
    from flowjit._dist import devices as _devices
    monkeypatch.setattr(_devices, "process_info", lambda: (1, 2))
    with pytest.raises(NotImplementedError, match=r"none of them on machine 1 \(this process\)"):
        _devices._gpu_ordinals("j", flow.scope.placement("gpu", "0:0"))
    with pytest.raises(ValueError, match=r"placed on machine 2 .* the session has 2 processes"):
        _devices._gpu_ordinals("j", flow.scope.placement("gpu", ["0:0", "2:0"]))
    assert _devices._gpu_placement("j", flow.scope.placement("gpu", ["0:0", "1:1"])) == ([1], 2)
    # Different numbers of GPUs per process: this process's are ranks 2.. of 3.
    uneven = flow.scope.placement("gpu", ["0:0-1", "1:1"])
    assert _devices._gpu_placement("j", uneven) == ([1], 3)
    assert _devices.gpu_first_rank(uneven) == 2
    flow.config.cpu_device_num(2)  # the NCCL id goes over every CPU device's rank
    assert _devices._gpu_ordinals("j", flow.scope.placement("gpu", ["0:0", "1:0"])) == [0]


def test_several_gpus_in_the_mirrored_view_take_list_placeholders():
    cfg = _placed(flow.scope.placement("gpu", "0:0-1"))
    cfg.default_logical_view(flow.scope.mirrored_view())
    job = _plus_one(cfg)
    with pytest.raises((NotImplementedError, RuntimeError),
                       match=r"(in the mirrored view over 2 GPUs every input is per device|placed on GPU)"):
        job(np.zeros(4, np.float32))


def test_gpu_placement_outside_the_configured_gpus_is_a_value_error():
    flow.config.gpu_device_num(2)
    job = _plus_one(_placed(flow.scope.placement("gpu", "0:2")))
    with pytest.raises(ValueError, match=r"placed on GPU 2 .* flow.config.gpu_device_num\(2\) configures "
                       r"GPUs 0 to 1"):
        job(np.zeros(4, np.float32))
    other_machine = _plus_one(_placed(flow.scope.placement("gpu", "1:0")), name="other_machine")
    with pytest.raises(ValueError, match="placed on machine 1 .* runs on one machine, 0"):
        other_machine(np.zeros(4, np.float32))


def test_a_job_is_on_one_device_kind():
    @flow.global_function(type="predict")
    def mixed(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0"):
            y = x + 1
        with flow.scope.placement("gpu", "0:0"):
            return y * 2

    with pytest.raises(NotImplementedError, match="places ops on different devices"):
        mixed(np.zeros(4, np.float32))


def test_default_placement_stays_the_cpu():
    flow.config.gpu_device_num(1)
    job = _plus_one()
    np.testing.assert_array_equal(job(np.zeros(4, np.float32)), np.ones(4, np.float32))
    assert job.compiled_jobs()[0].device == "cpu"
    cpu = _plus_one(_placed(flow.scope.placement("cpu", "0:0")), name="on_cpu")
    cpu(np.zeros(4, np.float32))
    assert cpu.compiled_jobs()[0].device == "cpu"


def test_list_placeholders_on_a_gpu_take_one_array():
    flow.config.cpu_device_num(2)

    @flow.global_function(type="predict", function_config=_placed(flow.scope.placement("gpu", "0:0")))
    def job(x: tp.ListNumpy.Placeholder((4,), dtype=flow.float)) -> tp.ListNumpy:
        return x + 1

    with pytest.raises(NotImplementedError, match=r"placed on one GPU, but parameter 'x' is a list placeholder.*"
                       r"cpu_device_num\(1\)"):
        job([np.zeros(4, np.float32)] * 2)


# ---------------------------------------------------------------- where the GPU cannot be used

def _where_no_gpu():
    """The message part that says why GPU MISSING cannot be used here."""
    if NO_GPU:
        return "no CUDA driver: libcuda.so.1 not found" if "libcuda.so.1" in NO_GPU else NO_GPU.split(":")[0]
    return f"GPU {MISSING} does not exist"


def _placements():
    where = f"0:{MISSING}"
    return {
        "function_config": lambda: (_placed(flow.scope.placement("gpu", where)), None),
        "scope around the call": lambda: (None, flow.scope.placement("gpu", where)),
        "scope in the body": lambda: (None, "body"),
    }


@pytest.mark.parametrize("how", list(_placements()))
def test_unusable_gpu_fails_at_the_first_call_saying_why(how):
    cfg, around = _placements()[how]()

    @flow.global_function(type="predict", function_config=cfg)
    def on_gpu(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        if around == "body":
            with flow.scope.placement("gpu", f"0:{MISSING}"):
                return x + 1
        return x + 1

    def call():
        if around is not None and around != "body":
            with around:
                return on_gpu(np.zeros(4, np.float32))
        return on_gpu(np.zeros(4, np.float32))

    for _ in range(2):  # nothing half-compiled is kept: the next call says so again
        with pytest.raises(RuntimeError) as e:
            call()
        text = str(e.value)
        assert f"job 'on_gpu' is placed on GPU {MISSING}" in text
        assert _where_no_gpu() in text
        assert "function_config.allow_cpu_fallback(True)" in text


def test_cpu_fallback_warns_once_and_runs_on_the_cpu():
    @flow.global_function(type="predict",
                          function_config=_placed(flow.scope.placement("gpu", f"0:{MISSING}"), fallback=True))
    def falls_back(x: tp.ListNumpy.Placeholder((8,), dtype=flow.float)) -> tp.ListNumpy:
        return x * 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = falls_back([np.arange(4, dtype=np.float32)])
        falls_back([np.arange(6, dtype=np.float32)])  # a second compile: no second warning
        falls_back([np.arange(4, dtype=np.float32)])
    fallback = [w for w in caught if "runs on the CPU" in str(w.message)]
    assert len(fallback) == 1, [str(w.message) for w in caught]
    assert fallback[0].category is RuntimeWarning
    assert f"job 'falls_back' is placed on GPU {MISSING} but runs on the CPU: {_where_no_gpu()}" \
        in str(fallback[0].message)
    assert fallback[0].filename == __file__, "the warning points at the call"
    np.testing.assert_array_equal(out[0], np.arange(4, dtype=np.float32) * 2)
    assert {j.device for j in falls_back.compiled_jobs()} == {"cpu"}


def test_cpu_fallback_trains_like_the_cpu():
    data = np.random.default_rng(3).random((16, 8), dtype=np.float32)
    labels = (np.arange(16) % 4).astype(np.int32)

    def make(cfg, name):
        def train(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float),
                  y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
            logits = flow.layers.dense(x, 4, name="fc", kernel_initializer=flow.random_normal_initializer(seed=1))
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
            return loss
        train.__name__ = name
        return flow.global_function(type="train", function_config=cfg)(train)

    cpu = make(None, "train")
    want = [cpu(data, labels) for _ in range(3)]
    want_vars = {k: v for k, v in flow.get_all_variables().items() if k.startswith("fc")}
    flow.clear_default_session()
    fallback = make(_placed(flow.scope.placement("gpu", f"0:{MISSING}"), fallback=True), "train")
    with pytest.warns(RuntimeWarning, match="runs on the CPU"):
        got = [fallback(data, labels) for _ in range(3)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    for k, v in want_vars.items():
        np.testing.assert_array_equal(flow.get_all_variables()[k], v)


def test_gpu_status_and_devices():
    status = _C.gpu_status(0)
    assert set(status) == {"available", "reason", "ordinal"}
    assert status["available"] == (NO_GPU is None)
    if NO_GPU:
        assert status["reason"]
        if "libcuda.so.1" in NO_GPU:
            with pytest.raises(RuntimeError, match="no CUDA driver: libcuda.so.1 not found"):
                _C.gpu_devices()
    else:
        devices = _C.gpu_devices()
        assert devices and devices[0]["ordinal"] == 0 and devices[0]["sm"] >= 70
        assert not _C.gpu_status(MISSING)["available"]


# ---------------------------------------------------------------- on a GPU, against the CPU

def _close(got, want, rtol=2e-5, atol=1e-5):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_gpu_predict_matches_the_cpu(gpu, rng):
    x = rng.standard_normal((32, 48)).astype(np.float32)
    w = rng.standard_normal((48, 10)).astype(np.float32)

    def make(cfg, name):
        def predict(a: tp.Numpy.Placeholder((32, 48), dtype=flow.float),
                    b: tp.Numpy.Placeholder((48, 10), dtype=flow.float)) -> tp.Numpy:
            h = flow.math.tanh(flow.matmul(a, b)) * 2 - 1
            return flow.nn.softmax(h, axis=1)
        predict.__name__ = name
        return flow.global_function(type="predict", function_config=cfg)(predict)

    on_gpu = make(_placed(gpu), "predict_gpu")
    on_cpu = make(None, "predict_cpu")
    _close(on_gpu(x, w), on_cpu(x, w))
    job = on_gpu.compiled_jobs()[0]
    assert job.device == "gpu:0"
    assert job.gpu_loaded_from.startswith(("cubin sm_", "ptx (driver JIT"))


def _seed_train(cfg, name, units=64):
    def train(images: tp.Numpy.Placeholder((32, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> tp.Numpy:
        init = flow.truncated_normal(0.1)
        x = flow.reshape(images, [32, -1])
        hidden = flow.layers.dense(x, units, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
        logits = flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    train.__name__ = name
    return flow.global_function(type="train", function_config=cfg)(train)


def _seed_batches(n=4):
    rng = np.random.default_rng(11)
    return [(rng.random((32, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 32).astype(np.int32))
            for _ in range(n)]


def _trained_on(cfg, batches):
    flow.clear_default_session()
    job = _seed_train(cfg, "seed_train")
    losses = [job(x, y) for x, y in batches]
    return losses, flow.get_all_variables(), job


def test_gpu_training_matches_the_cpu(gpu):
    batches = _seed_batches()
    want_losses, want_vars, _ = _trained_on(None, batches)
    got_losses, got_vars, job = _trained_on(_placed(gpu), batches)
    assert job.compiled_jobs()[0].device == "gpu:0"
    for a, b in zip(got_losses, want_losses):
        _close(a, b, rtol=1e-4)
    assert set(got_vars) == set(want_vars)
    for k in want_vars:
        _close(got_vars[k], want_vars[k], rtol=1e-4)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_gpu_half_types_and_amp_match_the_cpu(gpu, half):
    """[amp] Half-type kernels on the GPU (cvt for float16, shifts for
    bfloat16) against the CPU's, and an AMP train step (float16 on a GPU by
    default, asked for explicitly on both here) against the CPU's."""
    import ml_dtypes
    dt = getattr(flow, half)
    npd = np.float16 if half == "float16" else ml_dtypes.bfloat16
    tol = dict(rtol=2e-3, atol=1e-3) if half == "float16" else dict(rtol=1.6e-2, atol=1e-2)
    rng = np.random.default_rng(12)
    x = rng.uniform(-2, 2, (37, 65)).astype(npd)

    def make(cfg, name):
        def f(a: tp.Numpy.Placeholder((37, 65), dtype=dt)) -> tp.Numpy:
            return flow.math.reduce_sum(flow.math.exp(a) * 0.5 - a, axis=1)
        f.__name__ = name
        return flow.global_function(type="predict", function_config=cfg)(f)

    got, want = make(_placed(gpu), f"half_gpu_{half}")(x), make(None, f"half_cpu_{half}")(x)
    assert got.dtype == npd
    _close(got.astype(np.float32), want.astype(np.float32), **tol)

    batches = _seed_batches(3)

    def amp_cfg(base):
        cfg = base if base is not None else flow.function_config()
        cfg.enable_auto_mixed_precision(True, dtype=dt)
        return cfg

    want_losses, want_vars, _ = _trained_on(amp_cfg(None), batches)
    got_losses, got_vars, job = _trained_on(amp_cfg(_placed(gpu)), batches)
    assert job.compiled_jobs()[0].device == "gpu:0"
    for a, b in zip(got_losses, want_losses):
        _close(a, b, **tol)
    for k in want_vars:
        _close(got_vars[k], want_vars[k], **tol)


@pytest.fixture
def two_gpus():
    """GPUs 0 and 1, for the data-parallel cases."""
    reasons = [st["reason"] for st in (_C.gpu_status(0), _C.gpu_status(1)) if not st["available"]]
    if reasons:
        if REQUIRE_TWO_GPUS:
            pytest.fail(f"FLOWJIT_REQUIRE_GPUS is set but two GPUs cannot be used: {reasons[0]}")
        pytest.skip(f"two GPUs needed: {reasons[0]}")
    flow.config.gpu_device_num(2)


def test_two_gpus_train_like_one_gpu(two_gpus):
    """A data-parallel train step on GPUs 0 and 1 (the batch split, the
    gradients all-reduced through NCCL) against the same steps on GPU 0
    (tools/gpu_check.sh runs it where two GPUs are)."""
    batches = _seed_batches()
    want_losses, want_vars, _ = _trained_on(_placed(flow.scope.placement("gpu", "0:0")), batches)
    try:
        got_losses, got_vars, job = _trained_on(_placed(flow.scope.placement("gpu", "0:0-1")), batches)
    except RuntimeError as e:
        if "needs NCCL" in str(e) and not REQUIRE_TWO_GPUS:
            pytest.skip(str(e))
        raise
    assert job.compiled_jobs()[0].device == "gpu:0,1"
    for a, b in zip(got_losses, want_losses):
        _close(a, b, rtol=1e-4)
    assert set(got_vars) == set(want_vars)
    for k in want_vars:
        _close(got_vars[k], want_vars[k], rtol=1e-4)


def test_a_bad_label_on_one_of_two_gpus_is_reported_alike_and_changes_nothing(two_gpus):
    """[harden] Row 20 of 32 is GPU 1's local row 4: both GPUs raise the same
    IndexError from the all-gathered status words, naming the row in the
    whole batch; no variable changes, and NCCL is not aborted (the next
    steps train as on one GPU). The fake driver's case: NvptxMultiGpu.AFailedCheck..."""
    batches = _seed_batches(3)
    want_losses, want_vars, _ = _trained_on(_placed(flow.scope.placement("gpu", "0:0")), batches)
    want_vars = {k: np.array(v) for k, v in want_vars.items()}
    flow.clear_default_session()
    job = _seed_train(_placed(flow.scope.placement("gpu", "0:0-1")), "seed_train")
    try:
        _close(job(*batches[0]), want_losses[0], rtol=1e-4)
    except RuntimeError as e:
        if "needs NCCL" in str(e) and not REQUIRE_TWO_GPUS:
            pytest.skip(str(e))
        raise
    before = {k: np.array(v) for k, v in flow.get_all_variables().items()}
    x, y = batches[1]
    bad = y.copy()
    bad[20] = 10
    with pytest.raises(IndexError, match=r"labels holds 10 at \[20\], outside the valid range \[0, 10\)"):
        job(x, bad)
    for k, v in flow.get_all_variables().items():
        np.testing.assert_array_equal(np.array(v), before[k], err_msg=k)
    for (x, y), want in zip(batches[1:], want_losses[1:]):
        _close(job(x, y), want, rtol=1e-4)
    got = flow.get_all_variables()
    for k in want_vars:
        _close(got[k], want_vars[k], rtol=1e-4)


def test_variables_are_shared_by_gpu_jobs_cpu_jobs_and_python(gpu, tmp_path):
    batches = _seed_batches(3)
    train = _seed_train(_placed(gpu), "shared_train")

    def make_predict(cfg, name):
        def predict(images: tp.Numpy.Placeholder((32, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
            x = flow.reshape(images, [32, -1])
            hidden = flow.layers.dense(x, 64, activation=flow.nn.relu, name="hidden")
            return flow.layers.dense(hidden, 10, name="output")
        predict.__name__ = name
        return flow.global_function(type="predict", function_config=cfg)(predict)

    predict_cpu = make_predict(None, "predict_cpu")
    predict_gpu = make_predict(_placed(gpu), "predict_gpu")
    x = batches[0][0]
    train(*batches[0])
    assert _C.gpu_variable_on_device("hidden-weight"), "the GPU holds what it trained"
    # A CPU job sees what the GPU trained, and so does Python.
    _close(predict_cpu(x), predict_gpu(x), rtol=1e-4)
    w = flow.get_all_variables()["hidden-weight"]
    assert not _C.gpu_variable_on_device("hidden-weight")
    # Host writes reach the GPU.
    flow.load_variables({"hidden-weight": np.zeros_like(w),
                         "hidden-bias": np.zeros_like(flow.get_all_variables()["hidden-bias"])})
    out = predict_gpu(x)
    _close(out, np.broadcast_to(flow.get_all_variables()["output-bias"], out.shape))
    # A checkpoint of GPU-trained variables restores them for the CPU.
    train(*batches[1])
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    saved = flow.get_all_variables()
    train(*batches[2])
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "ckpt")))
    for k, v in saved.items():
        np.testing.assert_array_equal(flow.get_all_variables()[k], v)
    _close(predict_gpu(x), predict_cpu(x), rtol=1e-4)


def test_async_gpu_jobs_deliver_in_call_order(gpu):
    @flow.global_function(type="predict", function_config=_placed(gpu))
    def scale(x: tp.Numpy.Placeholder((1000,), dtype=flow.float),
              k: tp.Numpy.Placeholder((), dtype=flow.float)) -> tp.Callback[tp.Numpy]:
        return x * k

    @flow.global_function(type="predict")
    def cpu_scale(x: tp.Numpy.Placeholder((1000,), dtype=flow.float),
                  k: tp.Numpy.Placeholder((), dtype=flow.float)) -> tp.Callback[tp.Numpy]:
        return x * k

    x = np.arange(1000, dtype=np.float32)
    got = []
    for i in range(20):
        job = scale if i % 3 else cpu_scale  # GPU and CPU results interleave in call order
        job(x, np.array(i, np.float32))(lambda out, i=i: got.append((i, out)))
    flow.sync_default_session()
    assert [i for i, _ in got] == list(range(20))
    for i, out in got:
        np.testing.assert_array_equal(out, x * i)


def test_async_gpu_training_matches_sync(gpu):
    batches = _seed_batches()
    want, want_vars, _ = _trained_on(_placed(gpu), batches)
    flow.clear_default_session()

    def train(images: tp.Numpy.Placeholder((32, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
        init = flow.truncated_normal(0.1)
        x = flow.reshape(images, [32, -1])
        hidden = flow.layers.dense(x, 64, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
        logits = flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    train.__name__ = "seed_train"
    job = flow.global_function(type="train", function_config=_placed(gpu))(train)
    got = []
    for x, y in batches:
        job(x, y)(got.append)
    flow.sync_default_session()
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    for k, v in want_vars.items():
        np.testing.assert_array_equal(flow.get_all_variables()[k], v)


def test_gpu_jobs_come_from_the_disk_cache(gpu, rng):
    x = rng.standard_normal((4,)).astype(np.float32)
    job = _plus_one(_placed(gpu), name="cached_on_gpu")
    np.testing.assert_array_equal(job(x), x + 1)
    first = job.compiled_jobs()[0]
    assert not first.from_disk_cache and len(first.cache_key) == 64
    flow.clear_default_session()  # the job recompiles: from the disk this time
    np.testing.assert_array_equal(job(np.zeros(4, np.float32)), np.ones(4, np.float32))
    again = job.compiled_jobs()[0]
    assert again.from_disk_cache and again.cache_key == first.cache_key
    assert again.device == "gpu:0"


# ---------------------------------------------------------------- the bindings behind a fake driver

# A libcuda.so.1 stand-in whose device memory is host memory and whose kernel
# launches do nothing: enough for the session's GPU plumbing (placement,
# compile, upload and download of variables, async runs completed by event,
# driver errors) to run where there is no GPU. The functions not written out
# here are generated from runtime/cuda/driver_api.h as stubs that succeed.
FAKE_DRIVER = r"""
#include <stdlib.h>
#include <string.h>
typedef unsigned long long dptr;
static int launches, fail_after = -1, fail_sync;
void fake_fail_launches_after(int n) { fail_after = n; launches = 0; }
void fake_fail_event_sync(int f) { fail_sync = f; }
int cuEventSynchronize(void* e) { return fail_sync ? 719 : 0; }
int fake_launches(void) { return launches; }
int cuInit(unsigned f) { return 0; }
int cuGetErrorName(int e, const char** s) { *s = e == 719 ? "CUDA_ERROR_LAUNCH_FAILED" : "CUDA_ERROR_UNKNOWN"; return 0; }
int cuGetErrorString(int e, const char** s) { *s = e == 719 ? "unspecified launch failure" : "unknown error"; return 0; }
int cuDriverGetVersion(int* v) { *v = 13000; return 0; }
#ifndef FAKE_DEVICES
#define FAKE_DEVICES 1
#endif
int cuDeviceGetCount(int* n) { *n = FAKE_DEVICES; return 0; }
int cuDeviceGet(int* d, int i) { *d = i; return i >= 0 && i < FAKE_DEVICES ? 0 : 101; }
int cuDeviceGetName(char* s, int n, int d) { strncpy(s, "Fake GPU", n); return 0; }
int cuDeviceGetAttribute(int* v, int a, int d) {
  *v = a == 75 ? 8 : a == 76 ? 0 : a == 16 ? 4 : a == 1 ? 1024 : 0;
  return 0;
}
int cuDeviceTotalMem_v2(size_t* b, int d) { *b = (size_t)1 << 30; return 0; }
static int ctx;
int cuDevicePrimaryCtxRetain(void** c, int d) { *c = &ctx; return 0; }
int cuStreamCreate(void** s, unsigned f) { *s = &ctx; return 0; }
int cuCtxPopCurrent_v2(void** c) { if (c) *c = &ctx; return 0; }
int cuMemAlloc_v2(dptr* p, size_t n) { *p = (dptr)aligned_alloc(256, (n + 255) / 256 * 256); return *p ? 0 : 2; }
int cuMemFree_v2(dptr p) { free((void*)p); return 0; }
int cuMemAllocHost_v2(void** p, size_t n) { *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096); return *p ? 0 : 2; }
int cuMemFreeHost(void* p) { free(p); return 0; }
int cuMemcpyHtoDAsync_v2(dptr d, const void* s, size_t n, void* st) { memcpy((void*)d, s, n); return 0; }
int cuMemcpyDtoHAsync_v2(void* d, dptr s, size_t n, void* st) { memcpy(d, (void*)s, n); return 0; }
int cuMemcpyDtoDAsync_v2(dptr d, dptr s, size_t n, void* st) { memcpy((void*)d, (void*)s, n); return 0; }
int cuModuleLoadDataEx(void** m, const void* image, unsigned n, int* o, void** v) { *m = &ctx; return 0; }
int cuModuleGetFunction(void** f, void* m, const char* name) { *f = &ctx; return 0; }
int cuEventCreate(void** e, unsigned f) { *e = &ctx; return 0; }
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void* s, void** params, void** extra) {
  if (fail_after >= 0 && launches >= fail_after) return 719;
  ++launches;
  return 0;
}
"""

FAKE_SESSION = r"""
import ctypes, os, sys, warnings
import numpy as np
import flowjit as flow
import flowjit.typing as tp
from flowjit import _C

fake = ctypes.CDLL(os.environ["FLOWJIT_LIBCUDA"])
assert _C.gpu_status(0) == {"available": True, "reason": "", "ordinal": 0}, _C.gpu_status(0)
assert _C.gpu_devices()[0]["description"] == "Fake GPU (sm_80, 4 SMs, 1 GiB)"
assert "GPU 1 does not exist" in _C.gpu_status(1)["reason"]
flow.config.gpu_device_num(1)
cfg = flow.function_config()
cfg.default_placement_scope(flow.scope.placement("gpu", "0:0"))

@flow.global_function(type="train", function_config=cfg)
def train(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float),
          y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
    logits = flow.layers.dense(x, 4, name="fc")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
    return loss

@flow.global_function(type="predict")
def predict_cpu(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float)) -> tp.Numpy:
    return flow.layers.dense(x, 4, name="fc")

x = np.random.default_rng(0).random((16, 8), dtype=np.float32)
y = np.zeros(16, np.int32)
assert train(x, y).shape == (16,)
names = set(_C.variable_names())
job = train.compiled_jobs()[0]
assert job.device == "gpu:0", job.device
assert job.gpu_loaded_from in ("cubin sm_80", "ptx (driver JIT for sm_80)"), job.gpu_loaded_from
assert fake.fake_launches() > 0
assert _C.gpu_variable_on_device("fc-weight"), "a train run leaves the newest value on the GPU"
# The fake's kernels do nothing: what comes back is what went up (the
# initializers' values, uploaded when the job was bound).
w = flow.get_all_variables()["fc-weight"]
assert not _C.gpu_variable_on_device("fc-weight"), "a host read downloads it"
# A host write goes up before the next GPU run, and comes back unchanged.
new_w = np.full_like(w, 0.25)
flow.load_variables({"fc-weight": new_w})
train(x, y)
assert _C.gpu_variable_on_device("fc-weight")
# A CPU job reading the variable sees the GPU's value (downloaded first).
b = flow.get_all_variables()["fc-bias"]
np.testing.assert_allclose(predict_cpu(x), x @ new_w.T + b, rtol=1e-5)
np.testing.assert_array_equal(flow.get_all_variables()["fc-weight"], new_w)

# Async: GPU and CPU results arrive in call order; completion is the event's.
@flow.global_function(type="predict", function_config=cfg)
def on_gpu(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float)) -> tp.Callback[tp.Numpy]:
    return x * 2

@flow.global_function(type="predict")
def on_cpu(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float)) -> tp.Callback[tp.Numpy]:
    return x * 2

order = []
for i in range(30):
    (on_gpu if i % 3 else on_cpu)(x)(lambda out, i=i: order.append((i, out.shape)))
train(x, y)  # a synchronous call waits for all of them first
assert [i for i, _ in order] == list(range(30)), order
assert all(s == (16, 8) for _, s in order)

# A driver error in an async GPU run is raised at the next sync point.
fake.fake_fail_launches_after(0)
on_gpu(x)(lambda out: None)
try:
    flow.sync_default_session()
    raise AssertionError("the failed launch was not reported")
except RuntimeError as e:
    assert "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED" in str(e), e
fake.fake_fail_launches_after(-1)
# So is a failure the run's event reports (a fault in a kernel), async or not.
fake.fake_fail_event_sync(1)
on_gpu(x)(lambda out: order.append("delivered"))
try:
    flow.sync_default_session()
    raise AssertionError("the failed run was not reported")
except RuntimeError as e:
    assert "cuEventSynchronize failed: CUDA_ERROR_LAUNCH_FAILED" in str(e), e
    assert "running job 'on_gpu' on Fake GPU" in str(e), e
assert order[-1] != "delivered", "no results from a failed run"
try:
    train(x, y)
    raise AssertionError("the failed run was not reported")
except RuntimeError as e:
    assert "running job 'train'" in str(e), e
fake.fake_fail_event_sync(0)
train(x, y)

# After clear_default_session the jobs recompile, with fresh GPU copies.
flow.clear_default_session()
train(x, y)
assert set(flow.get_all_variables()) == names
print("fake GPU session: ok")
"""


def _build_fake_driver(tmp_path, devices=1):
    import re
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake CUDA driver")
    header = os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "cuda", "driver_api.h")
    with open(header) as f:
        symbols = re.findall(r'X\(cu\w+, "(\w+)"', f.read())
    written = set(re.findall(r"^int (cu\w+)\(", FAKE_DRIVER, re.M))
    stubs = "".join(f"int {s}() {{ return 0; }}\n" for s in symbols if s not in written)
    src = tmp_path / "fake_cuda.c"
    src.write_text(FAKE_DRIVER + stubs)
    lib = tmp_path / "libfakecuda.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-w", f"-DFAKE_DEVICES={devices}", "-o", str(lib), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return lib


def test_session_gpu_plumbing_behind_a_fake_driver(tmp_path):
    import subprocess
    import sys
    lib = _build_fake_driver(tmp_path)
    env = dict(os.environ, FLOWJIT_LIBCUDA=str(lib), FLOWJIT_CACHE_DIR=str(tmp_path / "cache"))
    # The flowjit this test imported (a build may stage it outside the tree).
    root = os.path.dirname(os.path.dirname(os.path.abspath(flow.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", FAKE_SESSION], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fake GPU session: ok" in r.stdout

    # The GPU entries that session left in its disk cache, through flowjit-cache.
    from flowjit.cache import cli
    from flowjit.cache.store import Cache
    cache_dir = str(tmp_path / "cache")
    gpu_entries = [e for e in Cache(cache_dir).entries() if e.is_gpu]
    assert sorted({e.job for e in gpu_entries}) == ["on_gpu", "train"]
    for e in gpu_entries:
        assert e.target_short == "nvptx64/sm_80" and not e.problems(), e.problems()
        assert {"kernels.ptx", "object.o", "plan.txt"} <= set(e.meta["files"])
        assert "launches.txt" not in e.meta["files"]  # the grids are in the plan's launch records

    def run_cli(*argv):
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = cli.main(["--dir", cache_dir, "--color", "never", *argv])
        return rc, out.getvalue()

    rc, out = run_cli("list", "--target", "nvptx")
    assert rc == 0 and "nvptx64/sm_80" in out and "train" in out and "predict_cpu" not in out, out
    key = next(e.key for e in gpu_entries if e.job == "train")
    rc, out = run_cli("show", key[:10], "--ptx", "--launches")
    assert rc == 0, out
    assert "nvptx64-nvidia-cuda, sm_80, PTX " in out and ".entry " in out and " grid=" in out, out
    rc, out = run_cli("show", key[:10], "--asm", "--no-header")
    assert rc == 0 and out.count(".entry ") >= 1, out
    rc, out = run_cli("verify")
    assert rc == 0, out


# ---------------------------------------------------------------- several GPUs behind the fakes

# A libnccl.so.2 stand-in for the fake driver (device memory is host memory):
# ncclCommInitAll's ranks meet at a barrier in each collective, rank 0
# computes every rank's result in host memory, and they meet again. It counts
# the collectives so the test can see the job's gradients go through NCCL.
FAKE_NCCL = r"""
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct {
  int n, arrived; unsigned long gen; pthread_mutex_t mu; pthread_cond_t cv;
  const void* send[16]; void* recv[16];
} World;
/* ncclCommInitRank's ranks (several processes, one rank each: like NCCL it
   waits until every rank has joined): a shared memory segment named by the
   id, a process-shared barrier and one slot per rank. */
#define SLOT (1 << 20)
typedef struct { pthread_barrier_t bar; int ready; char data[]; } Shared;
typedef struct { World* w; int rank, n; Shared* sh; char name[130]; } Comm;
static int next_id;
static int all_reduces, all_gathers, reduce_scatters;
int fake_all_reduces(void) { return all_reduces; }
int fake_all_gathers(void) { return all_gathers; }
int fake_reduce_scatters(void) { return reduce_scatters; }
int ncclGetVersion(int* v) { *v = 22809; return 0; }
int ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "/flowjit-fake-nccl-%d-%d", (int)getpid(), next_id++);
  return 0;
}
int ncclCommInitRank(Comm** c, int n, ncclUniqueId id, int rank) {
  Comm* comm = calloc(1, sizeof(Comm));
  memcpy(comm->name, id.internal, 128);
  size_t bytes = sizeof(Shared) + (size_t)n * SLOT;
  int fd = shm_open(comm->name, O_RDWR | O_CREAT | O_EXCL, 0600), creator = fd >= 0;
  if (!creator) fd = shm_open(comm->name, O_RDWR, 0600);
  if (fd < 0) return 2;
  if (creator) {
    if (ftruncate(fd, (off_t)bytes) != 0) return 2;
  } else {
    struct stat st;
    do { fstat(fd, &st); if ((size_t)st.st_size < bytes) usleep(1000); } while ((size_t)st.st_size < bytes);
  }
  Shared* sh = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (sh == MAP_FAILED) return 2;
  if (creator) {
    pthread_barrierattr_t a;
    pthread_barrierattr_init(&a);
    pthread_barrierattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sh->bar, &a, n);
    __atomic_store_n(&sh->ready, 1, __ATOMIC_SEQ_CST);
  }
  while (!__atomic_load_n(&sh->ready, __ATOMIC_SEQ_CST)) usleep(1000);
  pthread_barrier_wait(&sh->bar);  /* every rank has it mapped: the name can go */
  if (creator) shm_unlink(comm->name);
  comm->sh = sh;
  comm->rank = rank;
  comm->n = n;
  *c = comm;
  return 0;
}
int ncclCommInitAll(Comm** comms, int n, const int* devs) {
  World* w = calloc(1, sizeof(World));
  w->n = n;
  pthread_mutex_init(&w->mu, 0);
  pthread_cond_init(&w->cv, 0);
  for (int i = 0; i < n; ++i) { comms[i] = calloc(1, sizeof(Comm)); comms[i]->w = w; comms[i]->rank = i; }
  return 0;
}
int ncclCommDestroy(Comm* c) { free(c); return 0; }
int ncclCommAbort(Comm* c) { free(c); return 0; }
int ncclCommGetAsyncError(Comm* c, int* e) { *e = 0; return 0; }
const char* ncclGetErrorString(int r) { return "fake NCCL error"; }
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }
static void meet(World* w) {
  pthread_mutex_lock(&w->mu);
  unsigned long g = w->gen;
  if (++w->arrived == w->n) { w->arrived = 0; ++w->gen; pthread_cond_broadcast(&w->cv); }
  else while (w->gen == g) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
}
static size_t size_of(int t) { return t <= 1 ? 1 : t <= 3 ? 4 : t <= 5 ? 8 : t == 7 ? 4 : t == 8 ? 8 : 2; }
#define ADD(T) { T* d = dst; const T* s = src; for (size_t i = 0; i < n; ++i) d[i] = op == 2 ? (d[i] > s[i] ? d[i] : s[i]) : d[i] + s[i]; break; }
static void add(void* dst, const void* src, size_t n, int t, int op) {
  switch (t) {
    case 0: ADD(signed char) case 1: ADD(unsigned char) case 2: ADD(int) case 3: ADD(unsigned)
    case 4: ADD(long long) case 5: ADD(unsigned long long) case 7: ADD(float) case 8: ADD(double)
  }
}
/* kind 0: all_reduce, 1: all_gather, 2: reduce_scatter; each rank computes its own result. */
static int shm_collective(Comm* c, int kind, const void* send, void* recv, size_t count, int t, int op,
                          int nranks) {
  Shared* sh = c->sh;
  size_t b = count * size_of(t), sent = kind == 2 ? b * nranks : b;
  if (sent > SLOT) return 3;
  memcpy(sh->data + (size_t)c->rank * SLOT, send, sent);
  pthread_barrier_wait(&sh->bar);
  char* out = malloc(b * nranks + 1);
  if (kind == 0) {
    memcpy(out, sh->data, b);
    for (int q = 1; q < nranks; ++q) add(out, sh->data + (size_t)q * SLOT, count, t, op);
    memcpy(recv, out, b);
  } else if (kind == 1) {
    for (int q = 0; q < nranks; ++q) memcpy(out + q * b, sh->data + (size_t)q * SLOT, b);
    memcpy(recv, out, b * nranks);
  } else {
    memcpy(out, sh->data + (size_t)c->rank * b, b);
    for (int q = 1; q < nranks; ++q) add(out, sh->data + (size_t)q * SLOT + (size_t)c->rank * b, count, t, op);
    memcpy(recv, out, b);
  }
  free(out);
  pthread_barrier_wait(&sh->bar);
  return 0;
}
int ncclAllReduce(const void* send, void* recv, size_t count, int t, int op, Comm* c, void* st) {
  if (c->sh) { ++all_reduces; return shm_collective(c, 0, send, recv, count, t, op, c->n); }
  World* w = c->w;
  w->send[c->rank] = send; w->recv[c->rank] = recv;
  meet(w);
  if (c->rank == 0) {
    size_t b = count * size_of(t);
    char* sum = malloc(b + 1);
    memcpy(sum, w->send[0], b);
    for (int q = 1; q < w->n; ++q) add(sum, w->send[q], count, t, op);
    for (int q = 0; q < w->n; ++q) memcpy(w->recv[q], sum, b);
    free(sum);
    ++all_reduces;
  }
  meet(w);
  return 0;
}
int ncclAllGather(const void* send, void* recv, size_t count, int t, Comm* c, void* st) {
  if (c->sh) { ++all_gathers; return shm_collective(c, 1, send, recv, count, t, 0, c->n); }
  World* w = c->w;
  w->send[c->rank] = send; w->recv[c->rank] = recv;
  meet(w);
  if (c->rank == 0) {
    size_t b = count * size_of(t);
    char* all = malloc(b * w->n + 1);
    for (int q = 0; q < w->n; ++q) memcpy(all + q * b, w->send[q], b);
    for (int q = 0; q < w->n; ++q) memcpy(w->recv[q], all, b * w->n);
    free(all);
    ++all_gathers;
  }
  meet(w);
  return 0;
}
int ncclReduceScatter(const void* send, void* recv, size_t count, int t, int op, Comm* c, void* st) {
  if (c->sh) { ++reduce_scatters; return shm_collective(c, 2, send, recv, count, t, op, c->n); }
  World* w = c->w;
  w->send[c->rank] = send; w->recv[c->rank] = recv;
  meet(w);
  if (c->rank == 0) {
    size_t b = count * size_of(t);
    char* out = malloc(b * w->n + 1);
    for (int q = 0; q < w->n; ++q) {
      memcpy(out + q * b, (const char*)w->send[0] + q * b, b);
      for (int p = 1; p < w->n; ++p) add(out + q * b, (const char*)w->send[p] + q * b, count, t, op);
    }
    for (int q = 0; q < w->n; ++q) memcpy(w->recv[q], out + q * b, b);
    free(out);
    ++reduce_scatters;
  }
  meet(w);
  return 0;
}
"""

FAKE_TWO_GPUS = r"""
import ctypes, os
import numpy as np
import flowjit as flow
import flowjit.typing as tp

nccl = ctypes.CDLL(os.environ["FLOWJIT_NCCL_LIBRARY"])
flow.config.gpu_device_num(2)
cfg = flow.function_config()
cfg.default_placement_scope(flow.scope.placement("gpu", "0:0-1"))

@flow.global_function(type="train", function_config=cfg)
def train(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float),
          y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
    logits = flow.layers.dense(x, 4, name="fc")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
    return loss

one = flow.function_config()
one.default_placement_scope(flow.scope.placement("gpu", "0:1"))

@flow.global_function(type="predict", function_config=one)
def predict_gpu1(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float)) -> tp.Numpy:
    return flow.layers.dense(x, 4, name="fc")

@flow.global_function(type="predict")
def predict_cpu(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float)) -> tp.Numpy:
    return flow.layers.dense(x, 4, name="fc")

x = np.random.default_rng(0).random((16, 8), dtype=np.float32)
y = np.zeros(16, np.int32)
assert train(x, y).shape == (16,)
job = train.compiled_jobs()[0]
assert job.device == "gpu:0,1", job.device
assert "S(0)" in job.distribution, job.distribution
assert nccl.fake_all_reduces() > 0, "the gradients are all-reduced through NCCL"
# The fake's kernels do nothing: what comes back is what went up (the
# initializers' values), through both GPUs' copies and the host.
w0 = flow.get_all_variables()["fc-weight"].copy()
new_w = np.full_like(w0, 0.25)
flow.load_variables({"fc-weight": new_w})
before = nccl.fake_all_reduces()
train(x, y)
train(x, y)
assert nccl.fake_all_reduces() > before
np.testing.assert_array_equal(flow.get_all_variables()["fc-weight"], new_w)
# Jobs on one GPU and on the CPU read the value the two GPUs hold.
flow.load_variables({"fc-weight": np.full_like(w0, 0.5)})
train(x, y)
b = flow.get_all_variables()["fc-bias"]
np.testing.assert_allclose(predict_cpu(x), x @ np.full_like(w0, 0.5).T + b, rtol=1e-5)
assert predict_gpu1(x).shape == (16, 4)
assert predict_gpu1.compiled_jobs()[0].device == "gpu:1"
# After clear_default_session the job recompiles (from the disk cache: its
# PTX and launch list, collectives' placeholders included), with fresh copies.
flow.clear_default_session()
train(x, y)
again = train.compiled_jobs()[0]
assert again.from_disk_cache and again.device == "gpu:0,1", (again.from_disk_cache, again.device)
# The mirrored view: a list with one array per GPU in, one per GPU out, the
# gradients averaged through NCCL (the numbers: C++
# NvptxMultiGpu.MirroredViewMatchesAsManyCpuDevices).
mcfg = flow.function_config()
mcfg.default_placement_scope(flow.scope.placement("gpu", "0:0-1"))
mcfg.default_logical_view(flow.scope.mirrored_view())

@flow.global_function(type="train", function_config=mcfg)
def train_mirrored(x: tp.ListNumpy.Placeholder((8, 8), dtype=flow.float),
                   y: tp.ListNumpy.Placeholder((8,), dtype=flow.int32)) -> tp.ListNumpy:
    logits = flow.layers.dense(x, 4, name="mfc")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
    return loss

before = nccl.fake_all_reduces()
losses = train_mirrored([x[:8], x[8:]], [y[:8], y[8:]])
assert isinstance(losses, list) and [l.shape for l in losses] == [(8,), (8,)], losses
assert nccl.fake_all_reduces() > before, "the mirrored gradients are all-reduced through NCCL"
assert train_mirrored.compiled_jobs()[0].device == "gpu:0,1"
try:
    train_mirrored([x[:8]], [y[:8]])
    raise AssertionError("a list with one array for two GPUs was accepted")
except ValueError as e:
    assert "expects 2 element(s), one per device" in str(e), e
print("fake two-GPU session: ok")
"""


def _build_fake_nccl(tmp_path):
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake NCCL")
    src = tmp_path / "fake_nccl.c"
    src.write_text(FAKE_NCCL)
    lib = tmp_path / "libfakenccl.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-w", "-o", str(lib), str(src), "-lpthread"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return lib


@pytest.mark.parametrize("overlap", ["1", "0"])
def test_a_job_on_two_gpus_behind_the_fakes(tmp_path, overlap):
    """The session's path for a job placed on "0:0-1": placement, the
    distributed compile for the GPU, one program per GPU, NCCL (the fake)
    for the gradients, variables kept coherent between the GPUs' copies,
    the host, a one-GPU job and a CPU job; with the collectives on each
    GPU's communication stream (overlap) and, with FLOWJIT_OVERLAP=0, on its
    compute stream. The results themselves are compared with one device by
    the C++ NvptxMultiGpu tests, whose fake GPU runs the kernels and checks
    the event edges between the streams."""
    import subprocess
    import sys
    lib = _build_fake_driver(tmp_path, devices=2)
    nccl = _build_fake_nccl(tmp_path)
    env = dict(os.environ, FLOWJIT_LIBCUDA=str(lib), FLOWJIT_NCCL_LIBRARY=str(nccl),
               FLOWJIT_CACHE_DIR=str(tmp_path / "cache"), FLOWJIT_OVERLAP=overlap)
    root = os.path.dirname(os.path.dirname(os.path.abspath(flow.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", FAKE_TWO_GPUS], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fake two-GPU session: ok" in r.stdout


FAKE_GPU_PROCESS = r"""
import ctypes, os
import numpy as np
import flowjit as flow
import flowjit.typing as tp

nccl = ctypes.CDLL(os.environ["FLOWJIT_NCCL_LIBRARY"])
rank = flow.env.get_rank()
flow.config.gpu_device_num(2)
flow.config.cpu_device_num(int(os.environ["TEST_CPU_DEVICES"]))
placement = os.environ["TEST_GPUS"].split(",")  # process p: the GPUs of machine p
cfg = flow.function_config()
cfg.default_placement_scope(flow.scope.placement("gpu", placement))

@flow.global_function(type="train", function_config=cfg)
def train(x: tp.Numpy.Placeholder((24, 8), dtype=flow.float),
          y: tp.Numpy.Placeholder((24,), dtype=flow.int32)) -> tp.Numpy:
    logits = flow.layers.dense(x, 4, name="fc")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
    return loss

x = np.random.default_rng(0).random((24, 8), dtype=np.float32)
y = np.zeros(24, np.int32)
assert train(x, y).shape == (24,), "every process gets the whole batch's result"
job = train.compiled_jobs()[0]
mine = [p.split(":")[1] for p in placement if p.startswith(f"{rank}:")][0]
assert job.device == "gpu:" + mine.replace("-", ","), (job.device, mine)
assert nccl.fake_all_reduces() > 0 and nccl.fake_all_gathers() > 0
w0 = flow.get_all_variables()["fc-weight"].copy()
new_w = np.full_like(w0, 0.25)
flow.load_variables({"fc-weight": new_w})
train(x, y)
np.testing.assert_array_equal(flow.get_all_variables()["fc-weight"], new_w)
print(f"fake GPU process {rank}: ok")
"""


@pytest.mark.parametrize("cpu_devices,gpus", [(1, "0:0,1:1"), (2, "0:0,1:1")])
def test_gpu_jobs_over_two_processes_behind_the_fakes(tmp_path, cpu_devices, gpus):
    """A session over 2 processes (flow.env, Gloo between them) with a job
    placed on GPU p of process p, with 1 and with 2 CPU devices per process:
    the NCCL id goes from process 0 to the other over the session's
    communicator (every CPU device's rank takes part), each process runs its
    GPU as a rank of the NCCL
    communicator (the fake's ranks meet in shared memory), results are whole
    in every process. The results themselves: C++
    NvptxMultiGpu.ProcessesWithAGpuEachMatchOneDevice."""
    import socket
    import subprocess
    import sys
    lib = _build_fake_driver(tmp_path, devices=2)
    nccl = _build_fake_nccl(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(flow.__file__)))
    procs = []
    for rank in range(2):
        env = dict(os.environ, FLOWJIT_LIBCUDA=str(lib), FLOWJIT_NCCL_LIBRARY=str(nccl),
                   FLOWJIT_CACHE_DIR=str(tmp_path / f"cache{rank}"), FLOWJIT_WORLD_SIZE="2",
                   FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_ADDR="127.0.0.1", FLOWJIT_MASTER_PORT=str(port),
                   FLOWJIT_TIMEOUT="60", FLOWJIT_STORE_TOKEN="test-gpu-processes-0123456789abcdef",
                   TEST_CPU_DEVICES=str(cpu_devices), TEST_GPUS=gpus)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        procs.append(subprocess.Popen([sys.executable, "-c", FAKE_GPU_PROCESS], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for rank, p in enumerate(procs):
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        assert f"fake GPU process {rank}: ok" in out, out
