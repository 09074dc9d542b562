"""Asynchronous calls: tp.Callback jobs, ordering, callbacks of every result
type, errors at the next sync point, threads, and back-pressure."""
import select
import signal
import subprocess
import sys
import threading
import time
import typing

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from flowjit import _C

N_IN, N_OUT, BATCH = 6, 3, 8
LR = 0.1


def _sgd():
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]), momentum=0)


def _model(x, y):
    logits = flow.layers.dense(x, N_OUT, name="m", kernel_initializer=flow.truncated_normal(0.3))
    return flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)


def _train_jobs():
    """The same training step as an async and as a sync job (one set of variables)."""
    @flow.global_function(type="train")
    def train_async(x: tp.Numpy.Placeholder((BATCH, N_IN)),
                    y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
        loss = _model(x, y)
        _sgd().minimize(loss)
        return loss

    @flow.global_function(type="train")
    def train_sync(x: tp.Numpy.Placeholder((BATCH, N_IN)),
                   y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = _model(x, y)
        _sgd().minimize(loss)
        return loss

    return train_async, train_sync


def _batches(n, seed=7):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, N_IN)).astype(np.float32),
             rng.integers(0, N_OUT, BATCH).astype(np.int32)) for _ in range(n)]


def _weights():
    return {k: v.copy() for k, v in flow.get_all_variables().items() if k.startswith("m-")}


@pytest.fixture
def double():
    @flow.global_function(type="predict")
    def double_async(x: tp.Numpy.Placeholder((4,))) -> tp.Callback[tp.Numpy]:
        return x * 2.0
    return double_async


# ---------------------------------------------------------------- basics

def test_callback_job_returns_a_callable_taking_the_callback(double):
    fut = double(np.arange(4, dtype=np.float32))
    assert callable(fut)
    got = []
    assert fut(got.append) is None
    flow.sync_default_session()
    (out,) = got
    np.testing.assert_array_equal(out, [0, 2, 4, 6])


def test_callback_without_type_is_a_clear_error():
    with pytest.raises(TypeError, match=r"job 'bare': tp\.Callback needs the result type, e\.g\. "
                                        r"tp\.Callback\[tp\.Numpy\]"):
        @flow.global_function()
        def bare(x: tp.Numpy.Placeholder((4,))) -> tp.Callback:
            return x


def test_future_rejects_non_callables_and_a_second_callback(double):
    fut = double(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="job 'double_async': the result of a tp.Callback job takes a callable"):
        fut(42)
    fut(lambda r: None)
    with pytest.raises(RuntimeError, match="a callback was already attached"):
        fut(lambda r: None)
    flow.sync_default_session()


def test_callbacks_run_in_call_order_on_one_thread_holding_the_gil(double):
    seen, threads = [], set()

    def cb(i):
        def run(r):
            threads.add(threading.get_ident())
            seen.append((i, float(r[0])))
        return run

    for i in range(40):
        double(np.full(4, i, np.float32))(cb(i))
    late = double(np.full(4, 99, np.float32))
    flow.sync_default_session()  # the job is done before its callback is attached
    late(cb(99))
    flow.sync_default_session()
    assert seen == [(i, 2.0 * i) for i in range(40)] + [(99, 198.0)]
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_inputs_are_copied_at_call_time(double):
    x = np.ones(4, np.float32)
    got = []
    double(x)(got.append)
    x[:] = 100  # reusing the buffer at once must not change the queued run
    flow.sync_default_session()
    np.testing.assert_array_equal(got[0], [2, 2, 2, 2])


# ---------------------------------------------------------------- ordering and variables

def test_async_then_sync_training_matches_all_sync():
    n = 12
    data = _batches(n + 1)

    train_async, train_sync = _train_jobs()
    losses = [None] * n
    for i, (x, y) in enumerate(data[:n]):
        train_async(x, y)(lambda loss, i=i: losses.__setitem__(i, loss.copy()))
    last = train_sync(*data[n])  # a synchronous call sees every queued update
    flow.sync_default_session()
    async_weights = _weights()
    async_losses = losses + [last]

    flow.clear_default_session()
    _, train_ref = _train_jobs()
    ref_losses = [train_ref(x, y) for x, y in data]
    ref_weights = _weights()

    assert set(async_weights) == set(ref_weights) == {"m-weight", "m-bias"}
    for k in ref_weights:
        np.testing.assert_array_equal(async_weights[k], ref_weights[k], err_msg=k)
    for i, (a, r) in enumerate(zip(async_losses, ref_losses)):
        np.testing.assert_array_equal(a, r, err_msg=f"step {i}")
    # Different batches each step, so a reordering would have shown.
    assert not np.allclose(ref_losses[0], ref_losses[1])


def test_variable_reads_wait_for_queued_updates():
    train_async, _ = _train_jobs()
    data = _batches(5)
    for x, y in data:
        train_async(x, y)(lambda loss: None)
    # No explicit sync: reading a variable waits for the jobs that update it.
    step = _C.variable_value("System-Train-TrainStep-train_async")
    assert int(step) == 5
    flow.sync_default_session()


# ---------------------------------------------------------------- result types

def test_callbacks_with_every_annotation_type():
    @flow.global_function()
    def as_tuple(x: tp.Numpy.Placeholder((3,))) -> tp.Callback[typing.Tuple[tp.Numpy, tp.Numpy]]:
        return x + 1.0, x * 3.0

    @flow.global_function()
    def as_dict(x: tp.Numpy.Placeholder((3,))) -> tp.Callback[typing.Dict[str, tp.Numpy]]:
        return {"neg": -x, "sq": x * x}

    @flow.global_function()
    def as_bundle(x: tp.Numpy.Placeholder((3,))) -> tp.Callback[tp.Bundle[tp.Numpy]]:
        return {"a": x, "b": (x + 1.0, [x + 2.0])}

    @flow.global_function()
    def as_list(x: tp.ListNumpy.Placeholder((5,))) -> tp.Callback[tp.ListNumpy]:
        return x * 2.0

    x = np.array([1, 2, 3], np.float32)
    got = {}
    as_tuple(x)(lambda r: got.__setitem__("tuple", r))
    as_dict(x)(lambda r: got.__setitem__("dict", r))
    as_bundle(x)(lambda r: got.__setitem__("bundle", r))
    as_list([np.array([1, 2], np.float32)])(lambda r: got.__setitem__("list", r))
    flow.sync_default_session()

    a, b = got["tuple"]
    np.testing.assert_array_equal(a, x + 1)
    np.testing.assert_array_equal(b, x * 3)
    assert isinstance(got["tuple"], tuple)
    assert set(got["dict"]) == {"neg", "sq"}
    np.testing.assert_array_equal(got["dict"]["sq"], x * x)
    bundle = got["bundle"]
    np.testing.assert_array_equal(bundle["a"], x)
    assert isinstance(bundle["b"], tuple) and isinstance(bundle["b"][1], list)
    np.testing.assert_array_equal(bundle["b"][1][0], x + 2)
    (only,) = got["list"]
    np.testing.assert_array_equal(only, [2, 4])


# ---------------------------------------------------------------- errors

def _notes(exc):
    return " ".join(getattr(exc, "__notes__", [])) + " " + str(exc)


def test_callback_exception_raised_at_sync_with_the_job_name(double):
    def bad(r):
        raise ValueError("callback failed on purpose")

    double(np.ones(4, np.float32))(bad)
    with pytest.raises(ValueError, match="callback failed on purpose") as ei:
        flow.sync_default_session()
    assert "job 'double_async'" in _notes(ei.value)
    flow.sync_default_session()  # reported once, then gone

    # The runtime keeps working.
    got = []
    double(np.full(4, 3, np.float32))(got.append)
    flow.sync_default_session()
    np.testing.assert_array_equal(got[0], [6, 6, 6, 6])


def test_callback_exception_raised_at_the_next_synchronous_call(double):
    @flow.global_function()
    def plus_one(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x + 1.0

    x = np.zeros(4, np.float32)
    plus_one(x)  # compiled and on its fast path
    double(x)(lambda r: 1 / 0)
    with pytest.raises(ZeroDivisionError) as ei:
        plus_one(x)
    assert "job 'double_async'" in _notes(ei.value)
    np.testing.assert_array_equal(plus_one(x), [1, 1, 1, 1])


def test_one_sync_reports_every_error_recorded_before_it(double):
    # The first is raised, the others are counted in its notes and cleared:
    # 5,000 failed callbacks took 5,000 sync_default_session() calls before.
    for i in range(3):
        double(np.ones(4, np.float32))(lambda r, i=i: (_ for _ in ()).throw(KeyError(f"cb{i}")))
    with pytest.raises(KeyError) as ei:
        flow.sync_default_session()
    assert ei.value.args[0] == "cb0"
    assert "2 more error(s)" in _notes(ei.value) and "the next was KeyError: 'cb1'" in _notes(ei.value)
    flow.sync_default_session()  # nothing left


def test_thousands_of_failed_callbacks_clear_at_one_sync(double):
    x = np.ones(4, np.float32)
    for _ in range(2000):
        double(x)(lambda r: 1 / 0)
    with pytest.raises(ZeroDivisionError) as ei:
        flow.sync_default_session()
    assert "1999 more error(s)" in _notes(ei.value)
    flow.sync_default_session()


# ---------------------------------------------------------------- threads

def test_calls_from_several_threads_at_once(double):
    @flow.global_function()
    def affine(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x * 3.0 + 1.0

    train_async, train_sync = _train_jobs()
    data = _batches(2)
    affine(np.zeros(4, np.float32))  # compile before the threads start
    train_sync(*data[0])
    train_async(*data[0])(lambda loss: None)
    flow.sync_default_session()

    errors, async_results = [], []
    calls_per_thread = 25

    def work(t):
        try:
            for i in range(calls_per_thread):
                v = np.full(4, t * 1000 + i, np.float32)
                np.testing.assert_array_equal(affine(v), v * 3 + 1)
                double(v)(lambda r, v=v: async_results.append(bool(np.array_equal(r, v * 2))))
                train_sync(*data[1])
                train_async(*data[1])(lambda loss: None)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    flow.sync_default_session()
    assert errors == []
    assert len(async_results) == 4 * calls_per_thread and all(async_results)
    total = 1 + 4 * calls_per_thread
    assert int(_C.variable_value("System-Train-TrainStep-train_sync")) == total
    assert int(_C.variable_value("System-Train-TrainStep-train_async")) == total


# ---------------------------------------------------------------- back-pressure

@pytest.fixture
def small_queue():
    old = _C.async_capacity()
    _C.set_async_capacity(4)
    yield 4
    flow.sync_default_session()
    _C.set_async_capacity(old)


def _wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def test_the_queue_is_bounded(double, small_queue):
    release = threading.Event()
    delivered, submitted = [], []

    def slow(r):
        release.wait(timeout=30)
        delivered.append(float(r[0]))

    def producer():
        for i in range(20):
            double(np.full(4, i, np.float32))(slow)
            submitted.append(i)

    th = threading.Thread(target=producer)
    th.start()
    try:
        # The first callback blocks; the producer stalls once `capacity` calls
        # are outstanding instead of queueing all 20.
        assert _wait_until(lambda: len(submitted) >= small_queue)
        time.sleep(0.2)  # a bounded look for calls that should not get through
        assert len(submitted) == small_queue and delivered == []
    finally:
        release.set()
        th.join(timeout=60)
    assert not th.is_alive()
    flow.sync_default_session()
    assert submitted == list(range(20))
    assert delivered == [2.0 * i for i in range(20)]


def test_async_capacity_is_validated():
    with pytest.raises(ValueError, match="async capacity must be at least 1"):
        _C.set_async_capacity(0)


def test_a_callback_may_call_async_jobs_even_when_the_queue_is_full(double, small_queue):
    chain = []

    def step(r):
        chain.append(float(r[0]))
        if len(chain) < 10:  # submitted from the callback thread: never waits for a slot
            double(r)(step)

    for i in range(small_queue):
        double(np.full(4, 0.5 if i == 0 else -1, np.float32))(step if i == 0 else (lambda r: None))
    flow.sync_default_session()
    deadline = time.monotonic() + 30
    while len(chain) < 10 and time.monotonic() < deadline:
        flow.sync_default_session()  # a callback may queue more work after a sync returned
    assert chain == [0.5 * 2 ** (k + 1) for k in range(10)]


_INTERRUPTED = """
import signal, sys, time
# Python leaves SIGINT ignored when it starts ignored (a job started in the
# background by a non-interactive shell, as a CI step or nohup may be).
signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy as np
import flowjit as flow
import flowjit.typing as tp
from flowjit import _C

@flow.global_function()
def double(x: tp.Numpy.Placeholder((4,))) -> tp.Callback[tp.Numpy]:
    return x * 2.0

_C.set_async_capacity(2)
x = np.ones(4, np.float32)
for i in range(100000):
    double(x)(lambda r: time.sleep(0.005))
    if i == 10:
        print("running", flush=True)
print("finished without interruption", flush=True)
"""


def test_ctrl_c_stops_an_async_loop_cleanly(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(_INTERRUPTED)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 60)  # bounded wait for the loop to run
        assert ready and p.stdout.readline().strip() == "running"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert "KeyboardInterrupt" in err, err
    assert "finished" not in out
    for crash in ("Segmentation fault", "Fatal Python error", "terminate called", "Aborted"):
        assert crash not in err
    assert p.returncode in (1, -signal.SIGINT, 128 + signal.SIGINT), (p.returncode, err)
