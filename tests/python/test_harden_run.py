"""Hardening of runs (issue [harden]): out-of-range indices are errors of the
run, check_numerics, and the process edges (exit, fork, Ctrl-C).

Index checks: the kernels report the first index outside its range to a
status buffer the runtime reads after each checking launch (codegen/emit.cpp,
runtime/executable.cpp); nothing is clamped or dropped silently."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

_N = [0]


def _name(base):
    _N[0] += 1
    return f"{base}_{_N[0]}"


def _job(fn, *specs, type="predict", ret=tp.Numpy, config=None):  # noqa: A002
    """A job over placeholders `specs` ((shape, dtype) pairs) returning fn(*blobs)."""
    params = [f"a{i}" for i in range(len(specs))]
    ann = ", ".join(f"a{i}: tp.Numpy.Placeholder({s!r}, dtype=flow.{d})" for i, (s, d) in enumerate(specs))
    name = _name("hr")
    src = f"def {name}({ann}) -> ret:\n    return fn({', '.join(params)})\n"
    ns = {"tp": tp, "flow": flow, "fn": fn, "ret": ret}
    exec(compile(src, __file__, "exec"), ns)
    return flow.global_function(type=type, function_config=config)(ns[name])


def _err(pattern):
    return pytest.raises(IndexError, match=pattern)


# ---------------------------------------------------------------- index checks

def test_sparse_cross_entropy_label_out_of_range_predict():
    j = _job(lambda y, z: flow.nn.sparse_softmax_cross_entropy_with_logits(y, z),
             ((6,), "int32"), ((6, 4), "float32"))
    z = np.random.default_rng(0).random((6, 4), np.float32)
    good = np.array([0, 1, 2, 3, 0, 1], np.int32)
    want = j(good, z)
    for bad, at in ((4, 2), (-1, 5), (2 ** 31 - 1, 0)):
        y = good.copy()
        y[at] = bad
        with _err(rf"job '{j.__name__}', test_harden_run.py:\d+: sparse_softmax_cross_entropy_with_logits: "
                  rf"labels holds {bad} at \[{at}\], outside the valid range \[0, 4\)"):
            j(y, z)
    np.testing.assert_array_equal(j(good, z), want)  # the status is reset for the next run


def _train_job(batch=8, classes=5, lr=0.1):
    name = _name("hr_train")

    def body(x, y):
        w = flow.get_variable(f"{name}-w", shape=(3, classes), initializer=flow.constant_initializer(0.1))
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.matmul(x, w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr])).minimize(loss)
        return loss
    return _job(body, ((batch, 3), "float32"), ((batch,), "int64"), type="train"), f"{name}-w"


def test_train_step_with_a_bad_label_raises_and_leaves_the_variables():
    j, wname = _train_job()
    x = np.random.default_rng(1).random((8, 3), np.float32)
    y = np.arange(8, dtype=np.int64) % 5
    j(x, y)
    w0 = flow.get_all_variables()[wname].numpy().copy()
    step_name = [n for n in flow.get_all_variables() if n.startswith("System-Train-TrainStep")]
    steps0 = {n: flow.get_all_variables()[n].numpy().copy() for n in step_name}
    y_bad = y.copy()
    y_bad[6] = 5
    with _err(r"labels holds 5 at \[6\], outside the valid range \[0, 5\)"):
        j(x, y_bad)
    # The run stopped at the kernel that found the label: no update ran.
    np.testing.assert_array_equal(flow.get_all_variables()[wname].numpy(), w0)
    for n, v in steps0.items():
        np.testing.assert_array_equal(flow.get_all_variables()[n].numpy(), v)
    j(x, y)  # and the job still trains
    assert not np.array_equal(flow.get_all_variables()[wname].numpy(), w0)


def test_a_writer_whose_value_a_check_reads_defers_its_assign():
    # The kernel that computes the new value also assigns it, and the gather
    # that checks reads that value: the writer cannot move after the check,
    # so its assign goes through a temporary and a guarded copy at the end.
    name = _name("hr_counter")

    def body(y, m):
        c = flow.get_variable(name, shape=(4,), dtype=flow.float32, initializer=flow.zeros_initializer())
        new = c + flow.math.reduce_sum(m, axis=0)
        flow.assign(c, new)
        return flow.gather(new, y)

    j = _job(body, ((4,), "int32"), ((5, 4), "float32"))
    m = np.ones((5, 4), np.float32)
    np.testing.assert_array_equal(j(np.array([0, 1, 2, 0], np.int32), m), [5, 5, 5, 5])
    with _err(r"gather: indices holds 7 at \[2\], outside the valid range \[0, 4\)"):
        j(np.array([0, 1, 7, 0], np.int32), m)
    np.testing.assert_array_equal(flow.get_all_variables()[name].numpy(), [5, 5, 5, 5])
    np.testing.assert_array_equal(j(np.array([3, 1, 2, 0], np.int32), m), [10, 10, 10, 10])
    np.testing.assert_array_equal(flow.get_all_variables()[name].numpy(), [10, 10, 10, 10])
    (compiled,) = j.compiled_jobs()
    assert "assign" in compiled.fusion_plan.splitlines()[-1], compiled.fusion_plan


def test_one_hot_gather_gather_nd_and_scatters_name_the_op_value_and_position():
    p = np.arange(24, dtype=np.float32).reshape(6, 4)
    cases = [
        (lambda i: flow.one_hot(i, depth=3), ((2, 3), "int32"), np.array([[0, 1, 2], [2, 3, 0]]),
         r"one_hot: indices holds 3 at \[1, 1\], outside the valid range \[0, 3\)"),
        (lambda i: flow.gather(flow.constant(1.0, shape=[6, 4]), i, axis=0) * 2.0, ((3,), "int64"),
         np.array([0, 5, 6]), r"gather: indices holds 6 at \[2\], outside the valid range \[0, 6\)"),
        (lambda i: flow.gather(flow.constant(1.0, shape=[6, 4]), i, axis=1), ((2, 2), "int32"),
         np.array([[0, 3], [-7, 1]]), r"gather: indices holds -7 at \[1, 0\], outside the valid range \[0, 4\)"),
        # gather_nd: each component against its own dim (6 rows, 4 columns).
        (lambda i: flow.gather_nd(flow.constant(1.0, shape=[6, 4]), i), ((3, 2), "int32"),
         np.array([[5, 3], [1, 1], [2, 4]]), r"gather_nd: indices holds 4 at \[2, 1\], outside the valid range \[0, 4\)"),
        (lambda i: flow.scatter_nd(i, flow.constant(1.0, shape=[2]), [5]), ((2, 1), "int32"),
         np.array([[4], [5]]), r"scatter_nd: indices\[\.\.\., 0\] holds 5 at \[1, 0\], outside the valid range \[0, 5\)"),
        (lambda i: flow.math.unsorted_segment_sum(flow.constant(1.0, shape=[3, 2]), i, 2), ((3,), "int32"),
         np.array([0, 1, 2]), r"unsorted_segment_sum: segment_ids holds 2 at \[2\], outside the valid range \[0, 2\)"),
    ]
    del p
    for fn, spec, idx, pattern in cases:
        j = _job(fn, spec)
        with _err(pattern):
            j(idx.astype(spec[1]))
        ok = np.clip(idx, 0, 1).astype(spec[1])
        j(ok)  # in range: runs


def test_gather_check_fuses_into_the_consumer_kernel():
    j = _job(lambda p, i: flow.math.tanh(flow.gather(p * 2.0, i)), ((6, 8), "float32"), ((3,), "int32"))
    p = np.random.default_rng(2).random((6, 8), np.float32)
    i = np.array([1, 5, 0], np.int32)
    np.testing.assert_allclose(j(p, i), np.tanh(2 * p[i]), rtol=1e-6)
    c = j.lower(p, i).compile()
    assert re.search(r"indirect\(\$\d+ <6 \*8 check#0", c.kernels), c.kernels
    assert c.num_kernels == 2, c.fusion_plan  # p * 2.0, then gather + tanh with the check


def test_in_top_k_keeps_out_of_range_targets_as_false():
    x = np.random.default_rng(3).random((3, 5), np.float32)
    j = _job(lambda p, t: flow.math.in_top_k(t, p, 2), ((3, 5), "float32"), ((3,), "int32"))
    assert not j(x, np.array([9, -1, 0], np.int32))[:2].any()


def test_index_check_costs_no_kernel_in_the_seed_step():
    """The seed's train step stays at its 10 kernels: the label checks are in
    the cross-entropy kernels (forward and backward)."""
    name = _name("hr_seed")

    def body(x, y):
        h = flow.layers.dense(x, 64, activation=flow.nn.relu, name=f"{name}-h")
        logits = flow.layers.dense(h, 10, name=f"{name}-o")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    j = _job(body, ((16, 20), "float32"), ((16,), "int32"), type="train")
    x = np.zeros((16, 20), np.float32)
    y = np.zeros(16, np.int32)
    c = j.lower(x, y).compile()
    kernels = c.kernels
    assert len(re.findall(r"^kernel ", kernels, re.M)) == 10, kernels
    assert len(re.findall(r"check_index \$\d+ <10 check#0", kernels)) == 2, kernels


# ---------------------------------------------------------------- check_numerics

def _numerics_config():
    cfg = flow.function_config()
    cfg.check_numerics(True)
    return cfg


def test_check_numerics_is_off_by_default_and_names_kernel_op_line_and_element():
    def body(x):
        return flow.math.sqrt(x) + 1.0  # the line the error names
    line = body.__code__.co_firstlineno + 1
    plain = _job(body, ((3, 4), "float32"))
    checked = _job(body, ((3, 4), "float32"), config=_numerics_config())
    x = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(checked(x), plain(x))
    x[1, 2] = -1
    assert np.isnan(plain(x)[1, 2])  # off: NaN comes back
    with pytest.raises(FloatingPointError,
                       match=rf"job '{checked.__name__}', test_harden_run.py:{line}: check_numerics: kernel "
                             r"k0_sqrt_add stores add, nan at \[1, 2\]"):
        checked(x)
    x[1, 2] = np.inf
    with pytest.raises(FloatingPointError, match=r"stores add, inf at \[1, 2\]"):
        checked(x)


def test_check_numerics_stops_a_train_step_at_the_first_kernel():
    name = _name("hr_num")

    def body(x, y):
        w = flow.get_variable(f"{name}-w", shape=(3, 4), initializer=flow.constant_initializer(0.5))
        logits = flow.matmul(x, w)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    j = _job(body, ((5, 3), "float32"), ((5,), "int32"), type="train", config=_numerics_config())
    x = np.ones((5, 3), np.float32)
    y = np.zeros(5, np.int32)
    j(x, y)
    w0 = flow.get_all_variables()[f"{name}-w"].numpy().copy()
    x[3, 1] = np.inf
    line = body.__code__.co_firstlineno + 2  # the matmul
    with pytest.raises(FloatingPointError, match=rf"test_harden_run.py:{line}: check_numerics: kernel k\d+_matmul\w* "
                                                 r"stores matmul, (-?inf|nan) at \[3, "):
        j(x, y)
    np.testing.assert_array_equal(flow.get_all_variables()[f"{name}-w"].numpy(), w0)
    x[3, 1] = 1
    j(x, y)
    kernels = j.lower(x, y).compile().kernels
    assert "check_finite" in kernels


# ---------------------------------------------------------------- exit, fork, Ctrl-C

def _python(code, timeout=240, env=None):
    if env is None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)


_CALLBACK_JOB = """
    import os, sys, numpy as np, flowjit as flow, flowjit.typing as tp

    @flow.global_function()
    def j(x: tp.Numpy.Placeholder((2,))) -> tp.Callback[tp.Numpy]:
        return x + 1.0
"""


def test_a_callback_error_at_exit_is_printed_and_fails_the_process():
    r = _python(_CALLBACK_JOB + """
    def cb(v):
        raise RuntimeError("boom in the callback")
    j(np.zeros(2, np.float32))(cb)
    print("main done")
    """)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "main done" in r.stdout
    assert "never reached a sync point" in r.stderr and "RuntimeError: boom in the callback" in r.stderr
    assert "job 'j'" in r.stderr  # the note naming the job
    ok = _python(_CALLBACK_JOB + """
    got = []
    j(np.zeros(2, np.float32))(got.append)
    """)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr


def test_async_calls_work_in_a_forked_child():
    r = _python(_CALLBACK_JOB + """
    got = []
    j(np.zeros(2, np.float32))(got.append)  # the parent's worker and callback threads run
    flow.sync_default_session()
    pid = os.fork()
    if pid == 0:
        try:
            mine = []
            for i in range(3):
                j(np.full(2, i, np.float32))(mine.append)
            flow.sync_default_session()
            ok = [float(v[0]) for v in mine] == [1.0, 2.0, 3.0]
            os._exit(0 if ok else 3)
        except BaseException as e:
            print("child failed:", repr(e), flush=True)
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    j(np.ones(2, np.float32))(got.append)  # the parent still works
    flow.sync_default_session()
    print("child", os.waitstatus_to_exitcode(status), "parent", [float(v[0]) for v in got])
    """, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "child 0 parent [1.0, 2.0]" in r.stdout, (r.stdout, r.stderr)


_LONG_COMPILE = """
    import os, signal, sys, time, traceback, numpy as np
    # Python leaves SIGINT ignored when it starts ignored (a job started in
    # the background by a non-interactive shell, as a CI step may be).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ["FLOWJIT_DISABLE_CACHE"] = "1"
    os.environ["FLOWJIT_DISABLE_FUSION"] = "1"
    import flowjit as flow, flowjit.typing as tp

    @flow.global_function()
    def big(x: tp.Numpy.Placeholder((64, 64))) -> tp.Numpy:
        y = x
        for i in range(NOPS):
            y = flow.math.tanh(flow.matmul(y, x) * 0.5 + float(i)) if i % 3 == 0 else \\
                flow.math.reduce_sum(flow.math.exp(y * (1.0 + i * 1e-4)), axis=i % 2, keepdims=True) + y
        return y
"""


def test_ctrl_c_during_a_compile_stops_it():
    """SIGINT while a long compile runs: the KeyboardInterrupt comes out of
    the compile itself (the polling in compile_job), not after it returned.
    (The delay from the signal to the exit is printed, not asserted.)"""
    code = _LONG_COMPILE.replace("NOPS", "600") + """
    print("START", flush=True)
    t0 = time.monotonic()
    try:
        big(np.ones((64, 64), np.float32))
        print("COMPILED", flush=True)
    except KeyboardInterrupt:
        frames = traceback.extract_tb(sys.exc_info()[2])
        print("INTERRUPTED in", frames[-1].line, "after", round(time.monotonic() - t0, 2), flush=True)
        print("STOPPED", time.monotonic(), flush=True)
        sys.exit(130)
    """
    env = dict(os.environ, FLOWJIT_DEBUG="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "START"
        # Into the LLVM compile: fusion has logged its stage (hundreds of
        # distinct kernels are left to compile, seconds of work).
        for line in p.stderr:
            if "fusion+memory" in line:
                break
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert "COMPILED" not in out, (out, err)
    assert p.returncode == 130, (p.returncode, out, err)
    assert "INTERRUPTED in job = _C.compile_job(" in out, out
    stopped = float(out.split("STOPPED")[1].split()[0])
    print(f"Ctrl-C honoured {stopped - sent:.2f} s after the signal")


_LABEL_JOB = """
    import os, sys, numpy as np, flowjit as flow, flowjit.typing as tp

    @flow.global_function()
    def ce(y: tp.Numpy.Placeholder((8,), dtype=flow.int32), z: tp.Numpy.Placeholder((8, 3))) -> tp.Numpy:
        return flow.nn.sparse_softmax_cross_entropy_with_logits(y, z)
    c = ce.lower(np.zeros(8, np.int32), np.zeros((8, 3), np.float32)).compile()
    y = np.zeros(8, np.int32)
    y[5] = 3
    try:
        ce(y, np.zeros((8, 3), np.float32))
        print("no error")
    except IndexError as e:
        print("disk" if c.from_disk_cache else "fresh", e)
"""


def test_index_checks_hold_for_disk_cache_hits(tmp_path):
    env = {"FLOWJIT_CACHE_DIR": str(tmp_path / "cache")}
    outs = [_python(_LABEL_JOB, env={**os.environ, **env,
                                     "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
            for _ in range(2)]
    for r in outs:
        assert r.returncode == 0, r.stderr
    assert outs[0].stdout.startswith("fresh job 'ce'"), outs[0].stdout
    assert outs[1].stdout.startswith("disk job 'ce'"), outs[1].stdout
    assert "labels holds 3 at [5], outside the valid range [0, 3)" in outs[1].stdout


def test_index_checks_on_several_devices():
    r = _python("""
    import numpy as np, flowjit as flow, flowjit.typing as tp
    flow.config.cpu_device_num(2)

    @flow.global_function()
    def ce(y: tp.Numpy.Placeholder((8,), dtype=flow.int32), z: tp.Numpy.Placeholder((8, 3))) -> tp.Numpy:
        return flow.nn.sparse_softmax_cross_entropy_with_logits(y, z)
    y = np.zeros(8, np.int32)
    print(ce(y, np.zeros((8, 3), np.float32)).shape)
    y[6] = -4
    try:
        ce(y, np.zeros((8, 3), np.float32))
    except IndexError as e:
        print(e)
    print(ce(np.ones(8, np.int32), np.zeros((8, 3), np.float32)).shape)
    """, timeout=120)
    assert r.returncode == 0, r.stderr
    # Each device checks its piece of the batch; the error names the position in the whole.
    assert "(8,)\n" in r.stdout and "labels holds -4 at [6], outside the valid range [0, 3)" in r.stdout, r.stdout
