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
for _ in range(2):
    train_job(rng.random((B, 96), dtype=np.float32), rng.integers(0, 10, B).astype(np.int32))
job = train_job.compiled_jobs()[0]
plan = [line.split()[1] for line in job.plan.splitlines()]
events = [e for e in job._job.trace_events() if e[0] == 0][-len(plan):] if devices > 1 else []
np.savez(out, **{k: np.asarray(v) for k, v in flow.get_all_variables().items()})
print("RESULT " + json.dumps({"plan": plan, "events": events}))
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


def test_without_overlap_collectives_run_in_order_on_the_kernels_thread(runs):
    events = runs["off"][0]["events"]
    assert len({e[4] for e in events}) == 1
    starts = [e[2] for e in events]
    assert starts == sorted(starts)
