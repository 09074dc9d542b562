"""Overlap of gradient all-reduces with the backward pass: each bucket is
launched as soon as its gradients exist and runs on the device's
communication thread while the remaining backward kernels run; an update
waits only for its own bucket. Checked on the structure of a run (plan
order, which thread ran what, what started while a slow collective was in
flight), not on times; results equal overlap off and one device."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

CHILD = r'''
import json, sys
import numpy as np
import flowjit as flow
import flowjit.typing as tp
devices, out = int(sys.argv[1]), sys.argv[2]
flow.config.cpu_device_num(devices)
B = 64
@flow.global_function(type="train")
def train_job(x: tp.Numpy.Placeholder((B, 96), dtype=flow.float),
              y: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
    init = flow.truncated_normal(0.1)
    h = flow.layers.dense(x, 128, activation=flow.nn.relu, kernel_initializer=init, name="l1")
    h = flow.layers.dense(h, 128, activation=flow.nn.relu, kernel_initializer=init, name="l2")
    logits = flow.layers.dense(h, 10, kernel_initializer=init, name="l3")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss
rng = np.random.default_rng(3)
from flowjit import _C
before = _C.test_comm_delay_stats()
for _ in range(2):
    train_job(rng.random((B, 96), dtype=np.float32), rng.integers(0, 10, B).astype(np.int32))
delayed = _C.test_comm_delay_stats()["messages"] - before["messages"]
job = train_job.compiled_jobs()[0]
plan = [line.split()[1] for line in job.plan.splitlines()]
events = [e for e in job._job.trace_events() if e[0] == 0][-len(plan):] if devices > 1 else []
np.savez(out, **{k: np.asarray(v) for k, v in flow.get_all_variables().items()})
print("RESULT " + json.dumps({"plan": plan, "events": events, "delayed": delayed}))
'''


def run(tmp_path, devices, name, **env):
    out = str(tmp_path / f"{name}.npz")
    e = dict(os.environ, FLOWJIT_PROFILE="1")
    e.update({k: str(v) for k, v in env.items()})
    p = subprocess.run([sys.executable, "-c", CHILD, str(devices), out], env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout
    return json.loads(p.stdout.split("RESULT ", 1)[1]), dict(np.load(out))


def is_collective(sym):
    return sym.startswith("@")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("overlap")
    delay = 100  # ms per message: a collective is in flight far longer than the kernels around it
    return {"one": run(d, 1, "one"),
            "on": run(d, 2, "on", FLOWJIT_TEST_COMM_DELAY_MS=delay),
            "off": run(d, 2, "off", FLOWJIT_TEST_COMM_DELAY_MS=delay, FLOWJIT_OVERLAP=0)}


def test_results_equal_overlap_off_and_one_device(runs):
    one, on, off = runs["one"][1], runs["on"][1], runs["off"][1]
    assert sorted(on) == sorted(one) == sorted(off)
    for k in one:
        np.testing.assert_array_equal(on[k], off[k], err_msg=k)  # the same sums in the same order
        np.testing.assert_allclose(on[k], one[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_buckets_are_launched_before_the_backward_pass_ends(runs):
    plan = runs["on"][0]["plan"]
    coll = [i for i, s in enumerate(plan) if is_collective(s)]
    assert len(coll) >= 6, plan  # weight and bias gradients of three layers
    # Some kernel that is not an update (a `sub` of SGD with momentum reads
    # the all-reduced gradient) comes after the first bucket: backward work.
    later = [s for s in plan[coll[0] + 1:] if not is_collective(s)]
    assert any("matmul" in s for s in later), plan


def test_collectives_run_beside_the_kernels(runs):
    info = runs["on"][0]
    plan, events = info["plan"], info["events"]
    assert [e[1] for e in events] != [] and len(events) == len(plan)
    colls = [e for e in events if is_collective(e[1])]
    kernels = [e for e in events if not is_collective(e[1])]
    kernel_threads = {e[4] for e in kernels}
    assert len(kernel_threads) == 1
    assert all(e[4] not in kernel_threads for e in colls), "collectives ran on the kernels' thread"
    first = min(colls, key=lambda e: e[2])
    end = first[2] + first[3]
    # A backward matmul that comes after the first bucket in the plan started
    # before that bucket was complete (it did not wait for the exchange).
    after = set(plan[plan.index(first[1]) + 1:])
    assert any(e[1] in after and "matmul" in e[1] and e[2] < end for e in kernels), events
    # The updates of the first bucket did not wait for the last bucket.
    last_end = max(e[2] + e[3] for e in colls)
    consumers = [e for e in kernels if e[2] >= end]
    assert consumers and min(e[2] for e in consumers) < last_end, events


def messages(plan):
    """The exchanges of one step: each collective, adjacent all_reduces being
    one bucket (as the runtime sends them)."""
    return sum(1 for i, s in enumerate(plan) if is_collective(s) and not (
        ".all_reduce." in s and i > 0 and ".all_reduce." in plan[i - 1]))


def test_the_communicator_counts_each_delayed_message_once(runs):
    # 2 steps; a bucket is one message, whichever thread sends it, and the
    # second device of the process sleeps beside the first uncounted.
    plan = runs["on"][0]["plan"]
    assert messages(plan) >= 2, plan
    assert runs["on"][0]["delayed"] == runs["off"][0]["delayed"] == 2 * messages(plan)
    assert runs["one"][0]["delayed"] == 0


def test_without_overlap_collectives_run_in_order_on_the_kernels_thread(runs):
    events = runs["off"][0]["events"]
    assert len({e[4] for e in events}) == 1
    starts = [e[2] for e in events]
    assert starts == sorted(starts)


# A job whose last backward kernel (the first layer's weight gradient,
# 2048x4096x1024 multiply-adds per device) runs far longer than it takes to
# hand a bucket to the communication thread, so that the order of the
# events below is the structure, not a race.
BIG = r'''
import json, sys
import numpy as np
import flowjit as flow
import flowjit.typing as tp
devices = int(sys.argv[1])
flow.config.cpu_device_num(devices)
B = 256
@flow.global_function(type="train")
def train_job(x: tp.Numpy.Placeholder((B, 4096), dtype=flow.float),
              y: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
    init = flow.truncated_normal(0.02)
    h = flow.layers.dense(x, 1024, activation=flow.nn.relu, kernel_initializer=init, name="l1")
    h = flow.layers.dense(h, 64, activation=flow.nn.relu, kernel_initializer=init, name="l2")
    logits = flow.layers.dense(h, 10, kernel_initializer=init, name="l3")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss
rng = np.random.default_rng(5)
x, y = rng.random((B, 4096), dtype=np.float32), rng.integers(0, 10, B).astype(np.int32)
for _ in range(3):
    train_job(x, y)
job = train_job.compiled_jobs()[0]
plan = [line.split()[1] for line in job.plan.splitlines()]
trace = job._job.trace_events()
events = [[e for e in trace if e[0] == d][-len(plan):] for d in sorted({e[0] for e in trace})]
print("RESULT " + json.dumps({"plan": plan, "events": events}))
'''


def run_big(world, **env):
    port = 0
    if world > 1:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        e = dict(os.environ, FLOWJIT_PROFILE="1")
        if world > 1:
            e.update(FLOWJIT_WORLD_SIZE=str(world), FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_ADDR="127.0.0.1",
                     FLOWJIT_MASTER_PORT=str(port), FLOWJIT_STORE_TOKEN="test-overlap-0123456789abcdef")
        e.update({k: str(v) for k, v in env.items()})
        procs.append(subprocess.Popen([sys.executable, "-c", BIG, "2" if world == 1 else "1"], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    results = [json.loads(out.split("RESULT ", 1)[1]) for out in outs]
    assert all(r["plan"] == results[0]["plan"] for r in results)
    # One event list per device, whichever process ran it (the start times
    # are on CLOCK_MONOTONIC, one clock for every process of the host).
    return {"plan": results[0]["plan"], "events": [ev for r in results for ev in r["events"]]}


@pytest.mark.parametrize("world", [1, 2], ids=["2 devices 1 process", "2 processes"])
def test_the_first_bucket_starts_before_the_last_backward_kernel_ends(world):
    r = run_big(world)
    plan, devices = r["plan"], r["events"]
    assert len(devices) == 2 and all(len(events) == len(plan) for events in devices)
    reduces = [i for i, s in enumerate(plan) if ".all_reduce." in s]
    assert len(reduces) >= 2, plan
    # The last backward kernel: the one the last bucket waits for (a bucket is
    # launched right after the kernel computing its last gradient).
    last_kernel = max(i for i in range(reduces[-1]) if not is_collective(plan[i]))
    # A bucket starts once its device has submitted it and has finished the
    # exchanges queued before it, which the other device must join: where
    # one device runs ahead of the other (two processes sharing the cores),
    # its buckets wait for the late one. So the claim holds against the
    # device that ends its backward pass last: every device's first bucket
    # ran on the communication thread and started before then.
    ends = []
    for events in devices:
        by_sym = {e[1]: e for e in events}
        k = by_sym[plan[last_kernel]]
        first = min((by_sym[plan[i]] for i in reduces), key=lambda e: e[2])
        assert first[4] != k[4], "the bucket ran on the kernels' thread"
        ends.append(k[2] + k[3])
    for events in devices:
        by_sym = {e[1]: e for e in events}
        first = min((by_sym[plan[i]] for i in reduces), key=lambda e: e[2])
        assert first[2] < max(ends), (first, ends, plan)
    # Without overlap every bucket runs on the kernels' thread in plan order:
    # none is in flight while that kernel runs.
    off = run_big(world, FLOWJIT_OVERLAP=0)
    assert off["plan"] == plan
    for events in off["events"]:
        by_sym = {e[1]: e for e in events}
        k = by_sym[plan[last_kernel]]
        for i in reduces:
            b = by_sym[plan[i]]
            assert b[4] == k[4] and (b[2] + b[3] <= k[2] or b[2] >= k[2] + k[3]), (b, k)
