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


def test_several_gpus_per_job_need_nccl():
    job = _plus_one(_placed(flow.scope.placement("gpu", "0:0-1")))
    with pytest.raises(NotImplementedError, match=r"job 'plus_one' is placed on 2 GPUs .*several GPUs per job "
                       r"need NCCL collectives, which flowjit does not have yet"):
        job(np.zeros(4, np.float32))

    @flow.global_function(type="predict")
    def in_body(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        with flow.scope.placement("gpu", ["0:0", "1:0"]):
            return x + 1

    with pytest.raises(NotImplementedError, match="placed on 2 GPUs"):
        in_body(np.zeros(4, np.float32))


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
int cuDeviceGetCount(int* n) { *n = 1; return 0; }
int cuDeviceGet(int* d, int i) { *d = i; return i == 0 ? 0 : 101; }
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


def _build_fake_driver(tmp_path):
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
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-w", "-o", str(lib), str(src)],
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
