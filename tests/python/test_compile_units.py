"""Identical kernels compile once: per job (identical layers), per process
(a second job with the same layers), and the initializer job at its cheap
level, its random kernels of other seeds and sizes sharing one body; the
results match the unfused reference."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

WORKER = textwrap.dedent('''
    import json, sys
    import numpy as np
    import flowjit as flow
    import flowjit.typing as tp

    def make(prefix):
        @flow.global_function(type="train")
        def deep(x: tp.Numpy.Placeholder((16, 48)),
                 y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
            init = flow.truncated_normal(0.1)
            h = flow.layers.dense(x, 64, activation=flow.nn.relu, name=prefix + "in",
                                  kernel_initializer=init)
            for i in range(3):  # identical 64x64 layers
                h = flow.layers.dense(h, 64, activation=flow.nn.relu, name=f"{prefix}h{i}",
                                      kernel_initializer=init)
            logits = flow.layers.dense(h, 10, name=prefix + "out", kernel_initializer=init)
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                               momentum=0).minimize(loss)
            return loss
        return deep

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 48)).astype(np.float32)
    y = rng.integers(0, 10, 16).astype(np.int32)
    first = make("a_")
    losses = [first(x, y).tolist() for _ in range(3)]
    second = make("b_")  # the same layers under other variable names
    again = second(x, y).tolist()
    print(json.dumps({"losses": losses, "again": again}))
''')


def _run(tmp_path, **env):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    e = {k: v for k, v in os.environ.items() if k not in ("FLOWJIT_CACHE_DIR", "FLOWJIT_DISABLE_FUSION")}
    e.update(FLOWJIT_DISABLE_CACHE="1", FLOWJIT_DEBUG="1")
    e.update(env)
    p = subprocess.run([sys.executable, str(script)], env=e, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    import json
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def _counts(log, job):
    """(compiled, identical, reused, level) of each 'llvm compile' line of `job`."""
    pat = (r"\[flowjit\] " + re.escape(job) + r": llvm compile .* (\d+) kernels compiled "
           r"\((O\d), \d+ threads\), (\d+) identical to another, (\d+) reused from this process")
    return [(int(m.group(1)), int(m.group(3)), int(m.group(4)), m.group(2))
            for m in re.finditer(pat, log)]


def test_identical_layers_compile_once_and_match_the_unfused_reference(tmp_path):
    out, log = _run(tmp_path)
    train = _counts(log, "deep")
    assert len(train) == 2, log[-3000:]
    (compiled, identical, reused, level), (compiled2, identical2, reused2, _) = train
    assert level == "O3"
    # Three identical 64x64 layers: their forward, backward and update kernels
    # are compiled once, not three times (at least 3 kinds of kernel, 2 copies each).
    assert identical >= 6, log[-3000:]
    assert reused == 0
    # The second job of the process compiles none of its kernels again.
    assert compiled2 == 0 and reused2 == compiled + identical, train
    init = _counts(log, "deep.init")
    assert init and all(lv == "O0" for *_, lv in init), log[-3000:]
    # The initializer job's zero-filled biases of equal size share their kernel,
    # and the five truncated-normal weights (three sizes, five seeds) share one
    # body that reads its seed at run time: 7 of the 11 kernels are shared.
    assert init[0][1] >= 7, init
    # The second job's initializers (other variables, so other seeds) compile nothing.
    assert len(init) == 2 and init[1][0] == 0, init
    assert np.all(np.isfinite(out["again"]))

    ref, _ = _run(tmp_path, FLOWJIT_DISABLE_FUSION="1")
    np.testing.assert_allclose(np.array(out["losses"]), np.array(ref["losses"]), rtol=2e-5,
                               atol=1e-6)
    assert np.all(np.diff(np.mean(out["losses"], axis=1)) < 0)  # it trains


def test_the_disk_entry_holds_each_distinct_kernel_once_and_loads_again(tmp_path):
    from flowjit import _C
    from flowjit.cache.store import Cache
    cache = tmp_path / "cache"
    cold, log = _run(tmp_path, FLOWJIT_DISABLE_CACHE="0", FLOWJIT_CACHE_DIR=str(cache))
    (compiled, identical, _, _), _ = _counts(log, "deep")
    entries = {e.job: e for e in Cache(str(cache)).entries()}
    assert {"deep", "deep.init"} <= set(entries)
    for e in entries.values():
        assert e.problems() == [], (e.job, e.problems())
    objects, aliases = _C.unpack_objects(entries["deep"].read("object.o"))
    assert len(aliases) == compiled + identical  # every kernel's name
    assert len(objects) == len(set(aliases.values())) == compiled  # each distinct code once
    warm, log = _run(tmp_path, FLOWJIT_DISABLE_CACHE="0", FLOWJIT_CACHE_DIR=str(cache))
    assert re.search(r"\[flowjit\] deep: disk cache hit", log), log[-2000:]
    assert warm["losses"] == cold["losses"]
    # A damaged container is reported by the cache tool's check.
    blob = entries["deep"].read("object.o")
    with pytest.raises(ValueError, match="truncated"):
        _C.unpack_objects(blob[: len(blob) // 2])
