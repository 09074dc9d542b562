"""The package around the compiler: metadata, interop inputs, lower()/compile(),
the profile table and Chrome traces, logging, and the cache tool's --json
and --dot."""
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra):
    """The environment of a child Python that imports this flowjit, whatever the cwd."""
    env = dict(os.environ, **extra)
    # Not resolved: tools/dev.sh sanitize's package links the checkout's
    # files beside its own _C, and the link targets would lead to the other.
    pkg = str(Path(os.path.abspath(flow.__file__)).parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg, env.get("PYTHONPATH")]))
    return env


def test_version_is_written_once():
    from flowjit import _version
    assert flow.__version__ == _version.__version__
    assert flow._C.build_info()["version"] == _version.__version__
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and "\nversion =" not in text


def test_typed_and_licensed():
    assert (ROOT / "python" / "flowjit" / "py.typed").exists()
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert flow.global_function.__doc__


def test_cache_tool_is_a_submodule():
    env = _env(FLOWJIT_CACHE_DIR="/nonexistent-flowjit-cache")
    r = subprocess.run([sys.executable, "-m", "flowjit.cache", "stats", "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["entries"] == 0


# ---------------------------------------------------------------- interop inputs

@flow.global_function(type="predict")
def add_one(x: tp.Numpy.Placeholder((2, 3), dtype=flow.float)) -> tp.Numpy:
    return x + 1


class ArrayOnly:
    """An object with only __array__ (as many array libraries have)."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a


def test_numpy_views_and_array_protocol():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = base[:2, 1:]  # strided: copied into C order by the runtime
    assert np.array_equal(add_one(view), view + 1)
    assert np.array_equal(add_one(ArrayOnly(base[:2, :3])), base[:2, :3] + 1)


def test_array_protocol_checks_dtype_and_shape_with_the_same_messages():
    with pytest.raises(TypeError, match="declared float32 but the array is float64"):
        add_one(ArrayOnly(np.zeros((2, 3))))
    with pytest.raises(ValueError, match=r"declared with shape \(2, 3\) but the array has shape \(3, 2\)"):
        add_one(ArrayOnly(np.zeros((3, 2), np.float32)))
    with pytest.raises(TypeError, match="expects a numpy array .* or __array__ is accepted too"):
        add_one("not an array")


def test_dlpack_inputs_are_not_copied():
    class DLPackOnly:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.shares_memory(flow._core.job._interop_array("j", "x", DLPackOnly(a)), a)
    assert np.array_equal(add_one(DLPackOnly(a)), a + 1)


def test_jax_arrays():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    out = add_one(x)
    assert isinstance(out, np.ndarray)
    assert np.array_equal(out, np.asarray(x) + 1)
    with pytest.raises(TypeError, match="declared float32 but the array is int32"):
        add_one(jnp.zeros((2, 3), dtype=jnp.int32))


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert np.shares_memory(flow._core.job._interop_array("j", "x", t), t.numpy())
    assert np.array_equal(add_one(t), t.numpy() + 1)
    assert np.array_equal(add_one(t.t().contiguous().t()), t.numpy() + 1)  # a strided view


# ---------------------------------------------------------------- lower() / compile()

@flow.global_function(type="train")
def lower_train(x: tp.Numpy.Placeholder((4, 3), dtype=flow.float)) -> tp.Numpy:
    w = flow.get_variable("lower_train_w", shape=(3, 2), initializer=flow.ones_initializer())
    loss = flow.math.reduce_mean(flow.matmul(x, w))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


def test_lower_compile_does_not_run_a_train_job():
    lowered = lower_train.lower((4, 3))
    assert lowered.signature == ((4, 3),)
    compiled = lowered.compile()
    assert isinstance(compiled, flow.CompiledJob)
    values = flow.get_all_variables()
    assert np.array_equal(values["lower_train_w"], np.ones((3, 2), np.float32))  # not trained
    step = values["System-Train-TrainStep-lower_train"]
    assert int(np.asarray(step)) == 0
    assert "matmul" in compiled.as_text("optimized")
    assert compiled.as_text("fusion") and compiled.as_text("kernels")
    assert compiled.llvm_ir  # kept for inspection
    assert compiled.num_kernels >= 2
    assert lower_train.compiled_jobs()[0].cache_key == compiled.cache_key
    # The call after compile() runs without compiling again.
    lower_train(np.ones((4, 3), np.float32))
    assert len(lower_train.compiled_jobs()) == 1
    assert not np.array_equal(flow.get_all_variables()["lower_train_w"], np.ones((3, 2), np.float32))


def test_lower_checks_shapes_and_takes_arrays():
    with pytest.raises(ValueError, match=r"declared with shape \(2, 3\) but lower\(\) was given shape"):
        add_one.lower((3, 2))
    assert add_one.lower(np.zeros((2, 3), np.float32)).signature == ((2, 3),)
    assert add_one.lower().signature == ((2, 3),)
    with pytest.raises(ValueError, match="stage must be one of"):
        add_one.compile().as_text("nope")


# ---------------------------------------------------------------- profile and traces

PROFILE_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import flowjit as flow
    import flowjit.typing as tp

    @flow.global_function(type="predict")
    def mlp(x: tp.Numpy.Placeholder((64, 128), dtype=flow.float)) -> tp.Numpy:
        h = flow.layers.dense(x, 256, activation=flow.nn.relu, name="h")
        return flow.math.reduce_sum(flow.math.exp(h), axis=1)

    x = np.random.rand(64, 128).astype(np.float32)
    for _ in range(5):
        mlp(x)
    table = mlp.profile()
    print(table)
    rows = table.as_dicts()
    costs = {r.kernel: (r.flops, r.bytes) for r in table}
    json.dump({"rows": rows, "total_s": table.total_s, "costs": costs}, open(sys.argv[1] + ".rows.json", "w"))
    mlp.export_chrome_trace(sys.argv[1])
""")


def test_profile_table_and_chrome_trace(tmp_path):
    trace = tmp_path / "trace.json"
    env = _env(FLOWJIT_PROFILE="1", FLOWJIT_DISABLE_CACHE="1")
    r = subprocess.run([sys.executable, "-c", PROFILE_SCRIPT, str(trace)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("kernel"))
    for col in ("calls", "total ms", "mean us", "GFLOP/s", "GB/s", "share"):
        assert col in header
    doc = json.loads(Path(str(trace) + ".rows.json").read_text())
    rows = doc["rows"]
    # Per call, as the compiler recorded it: the dense layer's matmul is
    # 2*m*n*k flops plus its epilogue's few ops at each of the m*n outputs.
    flops, nbytes = doc["costs"][next(k for k in doc["costs"] if "matmul" in k)]
    extra = flops - 2 * 64 * 256 * 128
    assert 0 <= extra <= 4 * 64 * 256 and extra % (64 * 256) == 0, flops
    assert nbytes >= 4 * (64 * 128 + 128 * 256 + 64 * 256)
    assert all(f is not None and b for f, b in doc["costs"].values())
    assert rows and all(row["calls"] == 5 for row in rows)
    mm = next(row for row in rows if "matmul" in row["kernel"])
    assert mm["gflops"] and mm["gflops"] > 0 and mm["gbps"] > 0
    assert abs(sum(row["share"] for row in rows) - 1) < 1e-6
    # The table's columns line up: every data row is as long as the header or shorter.
    table_rows = [ln for ln in lines if ln.startswith(("k", "total"))]
    assert len({ln.index(ln.split()[1]) for ln in table_rows if not ln.startswith("total")}) >= 1

    doc = json.loads(trace.read_text())  # Chrome's JSON object format, which Perfetto reads
    events = doc["traceEvents"]
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e)
        assert e["ph"] in ("X", "M")
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    kernels = [e for e in events if e.get("cat") == "kernel"]
    stages = [e for e in events if e.get("cat") == "compile"]
    assert len(kernels) == 5 * len(rows)
    assert {e["args"]["device"] for e in kernels} == {"cpu:0"}
    assert {"trace", "codegen"} <= {e["name"] for e in stages}
    assert min(e["ts"] for e in stages) <= min(e["ts"] for e in kernels)
    assert any(e["name"] == "thread_name" for e in events)


# The parser of the printed kernel text that the profiler used before the
# compiler recorded costs (codegen::kernel_cost); kept here as the reference
# the recorded figures must equal.
_KERNEL = re.compile(r"^kernel (\S+) (\w+) domain=\[([0-9,]*)\]")
_ARG = re.compile(r"^\s+arg\d+: (\w+)\[(\d+)\] ?(.*)$")
_MM = re.compile(r"^\s+mm: batch=(\d+) m=(\d+) n=(\d+) k=(\d+)")
_OP = re.compile(r"^\s+\$\d+ = (\w+)")
_NOT_ARITHMETIC = {"load", "const", "index", "identity", "acc", "cast", "bitcast"}
_DTYPE_BYTES = {"f32": 4, "f64": 8, "i8": 1, "u8": 1, "i32": 4, "i64": 8, "bool": 1}


def _costs_from_text(text):
    costs, name, points, mm, ops, nbytes = {}, None, 0, None, 0, 0

    def close():
        if name is not None:
            costs[name] = (ops * points + (2 * mm[0] * mm[1] * mm[2] * mm[3] if mm else 0), nbytes)

    for line in text.splitlines():
        m = _KERNEL.match(line)
        if m:
            close()
            name, mm, ops, nbytes, points = m.group(1), None, 0, 0, 1
            for d in filter(None, m.group(3).split(",")):
                points *= int(d)
            continue
        if name is None:
            continue
        a = _ARG.match(line)
        if a:
            modes = a.group(3).split()
            nbytes += int(a.group(2)) * _DTYPE_BYTES[a.group(1)] * max(1, ("r" in modes) + ("w" in modes))
        elif _MM.match(line):
            mm = tuple(int(g) for g in _MM.match(line).groups())
        elif _OP.match(line) and _OP.match(line).group(1) not in _NOT_ARITHMETIC:
            ops += 1
    close()
    return costs


@flow.global_function(type="predict")
def cost_mlp(x: tp.Numpy.Placeholder((64, 128), dtype=flow.float)) -> tp.Numpy:
    h = flow.layers.dense(x, 256, activation=flow.nn.relu, name="cost_h")
    return flow.layers.dense(h, 10, name="cost_out")


@flow.global_function(type="predict")
def cost_conv(x: tp.Numpy.Placeholder((2, 3, 9, 9), dtype=flow.float),
              w: tp.Numpy.Placeholder((4, 3, 3, 3), dtype=flow.float)) -> tp.Numpy:
    return flow.math.reduce_sum(flow.nn.relu(flow.nn.conv2d(x, w, 1, "SAME")), axis=[2, 3])


@flow.global_function(type="train")
def cost_train(x: tp.Numpy.Placeholder((8, 5), dtype=flow.float),
               y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    logits = flow.layers.dense(x, 3, name="cost_train_m")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


def test_kernel_costs_are_recorded_by_the_compiler():
    compiled = cost_mlp.lower().compile()
    costs = compiled.kernel_costs()
    # Both dense layers are matmul kernels (x @ W + b, relu fused or not):
    # 2*m*n*k flops, plus a few epilogue ops at each of the m*n outputs.
    for m, n, k in ((64, 256, 128), (64, 10, 256)):
        assert any(0 <= c.flops - 2 * m * n * k <= 4 * m * n and (c.flops - 2 * m * n * k) % (m * n) == 0
                   for c in costs.values()), (m, n, k, costs)
    for job in (cost_mlp, cost_conv, cost_train):
        c = job.lower().compile()
        ref = _costs_from_text(c.kernels)
        assert ref and {k: (v.flops, v.bytes) for k, v in c.kernel_costs().items()} == ref, job


def test_kernel_costs_on_a_disk_cache_hit(tmp_path):
    script = textwrap.dedent("""
        import json, numpy as np, flowjit as flow, flowjit.typing as tp
        @flow.global_function(type="predict")
        def cached_mlp(x: tp.Numpy.Placeholder((16, 32), dtype=flow.float)) -> tp.Numpy:
            return flow.layers.dense(x, 8, activation=flow.nn.relu, name="cached_h")
        c = cached_mlp.lower().compile()
        print(json.dumps([c.from_disk_cache, sorted(c._job.kernel_costs)]))
    """)
    env = _env(FLOWJIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("FLOWJIT_DISABLE_CACHE", None)
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout.splitlines()[-1]))
    (miss, costs), (hit, cached) = runs
    assert not miss and hit
    assert costs and cached == costs
    assert any(f >= 2 * 16 * 8 * 32 for _, f, _ in costs)


# ---------------------------------------------------------------- logging

def test_diagnostics_go_through_logging(caplog):
    @flow.global_function(type="predict")
    def logged(x: tp.ListNumpy.Placeholder((8,), dtype=flow.float)) -> tp.ListNumpy:
        return x * 2

    with caplog.at_level(logging.INFO, logger="flowjit"):
        logged([np.ones(4, np.float32)])
        logged([np.ones(5, np.float32)])
    msgs = [r.getMessage() for r in caplog.records if r.name == "flowjit"]
    assert any("compiled in" in m for m in msgs)
    assert any("cache miss, recompiling because" in m for m in msgs)


def test_flowjit_debug_maps_to_levels():
    from flowjit._core import log as _log
    assert _log.level_for(0) == logging.WARNING
    assert _log.level_for(1) == logging.INFO
    assert _log.level_for(3) == logging.DEBUG


# ---------------------------------------------------------------- the cache tool

def test_cache_json_and_dot(tmp_path):
    cache = tmp_path / "cache"
    script = textwrap.dedent("""
        import numpy as np, flowjit as flow, flowjit.typing as tp
        @flow.global_function(type="predict")
        def dotjob(x: tp.Numpy.Placeholder((16, 8), dtype=flow.float)) -> tp.Numpy:
            h = flow.layers.dense(x, 4, activation=flow.nn.relu, name="dot_h")
            return flow.math.reduce_sum(h * h, axis=1)
        dotjob(np.ones((16, 8), np.float32))
    """)
    env = _env(FLOWJIT_CACHE_DIR=str(cache))
    env.pop("FLOWJIT_DISABLE_CACHE", None)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr

    def tool(*argv):
        p = subprocess.run([sys.executable, "-m", "flowjit.cache", "--dir", str(cache), *argv], env=env,
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        return p

    listed = json.loads(tool("list", "--json").stdout)
    key = next(e["key"] for e in listed if e.get("job") == "dotjob")
    for argv in (("show", key), ("stats",), ("verify",), ("gc", "--dry-run"), ("diff", key, key)):
        p = tool(*argv, "--json")
        assert p.returncode == 0, (argv, p.stderr)
        json.loads(p.stdout)
    assert "sections" in json.loads(tool("show", key, "--json").stdout)
    p = tool("show", key, "--dot", "g.dot")
    assert p.returncode == 0, p.stderr
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith('digraph "dotjob"') and "->" in dot and "matmul" in dot
    assert "I0 ->" in dot and "-> O0" in dot
    bad = tool("show", "ffffffffffff", "--json")
    assert bad.returncode == 2 and "error" in json.loads(bad.stdout)


MISS_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import flowjit as flow
    import flowjit.typing as tp

    @flow.global_function()
    def cached_job(x: tp.Numpy.Placeholder((16, 16))) -> tp.Numpy:
        return flow.math.exp(flow.math.tanh(x) * 2.0 + float(sys.argv[1]))

    cached_job(np.ones((16, 16), np.float32))
""")


def test_flowjit_debug_says_why_the_disk_cache_missed_across_processes(tmp_path):
    """Each run is a new process; the second and later name the key part that
    differs from the closest entry an earlier process cached."""
    def run(c, **extra):
        env = _env(FLOWJIT_CACHE_DIR=str(tmp_path / "cache"), FLOWJIT_DEBUG="1", **extra)
        env.pop("FLOWJIT_DISABLE_CACHE", None)
        r = subprocess.run([sys.executable, "-c", MISS_SCRIPT, c], env=env, capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if "disk cache miss:" in ln]
        return lines[0] if lines else None

    assert "no entry for this job and signature" in run("1.0")
    assert run("1.0") is None  # a hit
    cpu = flow._C.build_info()["target"].split(";")[1]
    other = "x86-64-v2" if cpu != "x86-64-v2" else "x86-64"  # older ISAs: runnable on this host
    assert "the target differs" in run("1.0", FLOWJIT_CPU=other)
    assert "the fusion plan differs" in run("1.0", FLOWJIT_DISABLE_FUSION="1")
    why = run("1.5")
    assert "the optimized IR differs" in why and "1.5" in why
