"""The cost of the label check on the seed's train step (784-512-10 MLP,
batch 100, SGD): the same job with the check (the public
sparse_softmax_cross_entropy_with_logits) and without it (the IR op made
directly), in one process, timed in alternating blocks of 20 steps.

    python benchmarks/bench_index_check.py
"""
import time

import numpy as np

import flowjit as flow
import flowjit.typing as tp
from flowjit._ops import builders as _ops

def make(name, checked):
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((100, 784)), y: tp.Numpy.Placeholder((100,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 512, activation=flow.nn.relu, name=f"{name}-h")
        logits = flow.layers.dense(h, 10, name=f"{name}-o")
        if checked:
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        else:
            loss = _ops.make(_ops.K.sparse_softmax_cross_entropy, [y, logits], api="sce")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    job.__name__ = name
    return job

a, b = make("checked", True), make("unchecked", False)
x = np.random.default_rng(0).random((100, 784), np.float32)
y = np.random.default_rng(1).integers(0, 10, 100).astype(np.int32)
for j in (a, b):
    for _ in range(20): j(x, y)
ka = a.lower(x, y).compile().kernels; kb = b.lower(x, y).compile().kernels
print("kernels", ka.count("\nkernel ") + 1, kb.count("\nkernel ") + 1, "checks in checked:", ka.count("check_index"), "in unchecked:", kb.count("check_index"))
ta, tb = [], []
for r in range(30):
    for j, t in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
        t0 = time.perf_counter()
        for _ in range(20): j(x, y)
        t.append((time.perf_counter() - t0) / 20 * 1e3)
ta.sort(); tb.sort()
print(f"checked   best {ta[0]:.3f} ms  median {ta[len(ta)//2]:.3f} ms")
print(f"unchecked best {tb[0]:.3f} ms  median {tb[len(tb)//2]:.3f} ms")
print(f"ratio checked/unchecked: best {ta[0]/tb[0]:.3f}, median {ta[len(ta)//2]/tb[len(tb)//2]:.3f}")
