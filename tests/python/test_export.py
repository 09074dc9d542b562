"""flowjit.export: jobs as a shared library with a C header, run from a C
program that loads neither Python nor LLVM (its /proc/self/maps checked, the
library's dependencies too), whose outputs equal the Python job's bit for
bit, also with 8 threads calling one context at once; exports for a named
x86-64 level, several jobs in one library, a train job's forward, float16
through the conversion helpers, failed checks, and the errors."""
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
import flowjit.export as fe
from flowjit import _C
from flowjit._core import dtypes as _dtypes

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "export" / "driver.c"
sys.path.insert(0, str(ROOT / "examples"))

CC = shutil.which(os.environ.get("CC", "cc"))
pytestmark = pytest.mark.skipif(CC is None, reason="exports link with a C compiler (cc)")


def build_driver(lib, job, tmp_path):
    """The C driver (tests/python/export/driver.c) for `job` of `lib`, linked against the library."""
    def sizes(items):
        return "{" + ", ".join(str(int(np.prod(s, dtype=np.int64)) * _dtypes.from_name(d).np.itemsize)
                               for _, d, s in items) + "}"
    exe = tmp_path / f"driver_{job.prefix}"
    libdir, libname = os.path.split(lib.library)
    cmd = [CC, "-O1", "-std=gnu11", f"-DJOB={job.prefix}", f'-DHEADER="{lib.header}"',
           f"-DIN_BYTES={sizes(job.inputs)}", f"-DOUT_BYTES={sizes(job.outputs)}", str(DRIVER),
           "-o", str(exe), f"-L{libdir}", f"-l:{libname}", f"-Wl,-rpath,{libdir}", "-pthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def run_c(lib, job, tmp_path, inputs, threads=1, calls=1):
    """Runs `job` of `lib` from C on `inputs`; its outputs as arrays."""
    exe = build_driver(lib, job, tmp_path)
    args = []
    for i, a in enumerate(inputs):
        f = tmp_path / f"in{i}.bin"
        f.write_bytes(np.ascontiguousarray(a).tobytes())
        args.append(str(f))
    outs = [tmp_path / f"out{i}.bin" for i in range(len(job.outputs))]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # no PYTHON*, no LD_PRELOAD
    r = subprocess.run([str(exe), *args, *map(str, outs), str(threads), str(calls)],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"driver exited {r.returncode}: {r.stderr}")
    return [np.frombuffer(f.read_bytes(), dtype=_dtypes.from_name(d).np).reshape(s)
            for f, (_, d, s) in zip(outs, job.outputs)]


def needed(library):
    out = subprocess.run(["readelf", "-d", library], check=True, capture_output=True, text=True).stdout
    return sorted(line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line)


def assert_bits(got, ref):
    ref = list(ref) if isinstance(ref, tuple) else [ref]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert (g.dtype, g.shape) == (r.dtype, r.shape)
        assert g.tobytes() == np.ascontiguousarray(r).tobytes()


@pytest.fixture
def seed_trained(rng):
    import train_mnist as seed
    images = rng.random((seed.BATCH_SIZE, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, seed.BATCH_SIZE).astype(np.int32)
    for _ in range(3):
        seed.train_job(images, labels)
    return seed, images, labels


def test_seed_mlp_from_c_bit_for_bit_and_8_threads(seed_trained, rng, tmp_path):
    seed, images, labels = seed_trained

    @flow.global_function(type="predict")
    def seed_probs1(images: tp.Numpy.Placeholder((1, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        reshape = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, name="hidden")
        return flow.nn.softmax(flow.layers.dense(hidden, 10, name="output"))

    lib = fe.export([seed.eval_job, seed_probs1], tmp_path / "libseed.so", name=["seed100", "seed1"])
    assert Path(lib.header).name == "libseed.h" and lib.size_bytes == os.path.getsize(lib.library)
    # The variables are in it: 784x512 + 512 + 512x10 + 10 floats, each 64-byte aligned.
    assert lib.variables_bytes >= 4 * (784 * 512 + 512 + 5120 + 10)
    for dep in needed(lib.library):
        assert dep.startswith(("libc.so", "libm.so", "libpthread.so", "ld-linux")), dep
    j100, j1 = lib.jobs
    assert j100.inputs == [("images", "float32", (100, 1, 28, 28))]
    assert j100.outputs[0][1:] == ("int32", (100,))
    assert_bits(run_c(lib, j100, tmp_path, [images]), seed.eval_job(images))
    one = images[:1].copy()
    assert_bits(run_c(lib, j1, tmp_path, [one]), seed_probs1(one))
    # 8 threads, 20 calls each, on one context: every call's outputs equal the first's.
    assert_bits(run_c(lib, j100, tmp_path, [images], threads=8, calls=20), seed.eval_job(images))
    assert_bits(run_c(lib, j1, tmp_path, [one], threads=8, calls=50), seed_probs1(one))
    header = Path(lib.header).read_text()
    assert "int seed100_run(seed100_context *ctx, const float *images, int32_t *" in header
    assert "#define SEED1_INPUT0_SHAPE {1, 1, 28, 28}" in header


def test_lenet_from_c_bit_for_bit(rng, tmp_path):
    import lenet_train
    train_job = lenet_train.define_jobs("sgd")
    eval_job = lenet_train.define_eval()
    images = rng.random((100, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, 100).astype(np.int32)
    train_job(images, labels)
    lib = fe.export(eval_job, tmp_path / "liblenet.so", name="lenet")
    (job,) = lib.jobs
    assert_bits(run_c(lib, job, tmp_path, [images]), eval_job(images))
    assert_bits(run_c(lib, job, tmp_path, [images], threads=8, calls=4), eval_job(images))
    # The train job's forward: its loss before the next update (dropout off).
    fwd = fe.export(train_job, tmp_path / "liblenet_train.so", name="lenet_train")
    (tj,) = fwd.jobs
    assert [n for n, _, _ in tj.inputs] == ["images", "labels"]
    (loss,) = run_c(fwd, tj, tmp_path, [images, labels])

    @flow.global_function(type="predict")
    def lenet_loss(images: tp.Numpy.Placeholder((100, 1, 28, 28), dtype=flow.float),
                   labels: tp.Numpy.Placeholder((100,), dtype=flow.int32)) -> tp.Numpy:
        return flow.nn.sparse_softmax_cross_entropy_with_logits(labels, lenet_train.lenet(images))

    np.testing.assert_allclose(loss, lenet_loss(images, labels), rtol=1e-5, atol=1e-5)


def test_named_level_and_float16_conversion_helpers(rng, tmp_path):
    """x86-64-v2 has no F16C: the kernels call the runtime's float16 helpers."""
    @flow.global_function(type="predict")
    def half_chain(x: tp.Numpy.Placeholder((64, 33), dtype=flow.float16),
                   y: tp.Numpy.Placeholder((64, 33), dtype=flow.float32)) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        z = flow.cast(x, flow.float32) * 1.5 + flow.cast(flow.cast(y, flow.float64), flow.float32)
        return flow.cast(flow.math.tanh(z), flow.float16), flow.cast(flow.cast(y, flow.float64), flow.float16)

    x = (rng.standard_normal((64, 33)) * 3).astype(np.float16)
    x[0, :6] = [np.inf, -np.inf, np.nan, 6e-8, -0.0, 65504]
    y = (rng.standard_normal((64, 33)) * 1e3).astype(np.float32)
    y[0, :5] = [1e6, 6e-8, 3e-8, 2.98e-8, 65520.0]  # overflow, subnormals, ties
    lib = fe.export(half_chain, tmp_path / "libhalf.so", cpu="x86-64-v2")
    assert lib.cpu == "x86-64-v2" and ";x86-64-v2;" in lib.target and "+f16c" not in lib.target
    nm = subprocess.run(["nm", lib.library], capture_output=True, text=True).stdout
    assert "__truncdfhf2" in nm  # double -> half has no instruction before AVX512-FP16
    (job,) = lib.jobs
    got = run_c(lib, job, tmp_path, [x, y])
    ref = half_chain(x, y)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got[1], y.astype(np.float64).astype(np.float16))
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[0].astype(np.float32), ref[0].astype(np.float32), rtol=1e-3, atol=1e-3)


def test_failed_check_is_an_error_code_with_the_message(tmp_path):
    @flow.global_function(type="predict")
    def pick(table: tp.Numpy.Placeholder((5, 3)), idx: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        return flow.gather(table, idx)

    lib = fe.export(pick, tmp_path / "libpick.so")
    (job,) = lib.jobs
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    ok = np.array([4, 0, 2, 2], np.int32)
    assert_bits(run_c(lib, job, tmp_path, [table, ok]), pick(table, ok))
    bad = np.array([1, 7, 0, 0], np.int32)
    with pytest.raises(Exception) as py_err:
        pick(table, bad)
    with pytest.raises(AssertionError) as c_err:
        run_c(lib, job, tmp_path, [table, bad])
    assert "driver exited 2" in str(c_err.value)
    assert "holds 7 at [1], outside the valid range [0, 5)" in str(c_err.value)
    assert "holds 7 at [1], outside the valid range [0, 5)" in str(py_err.value)


def test_cross_export_for_a_cpu_this_host_may_lack(tmp_path):
    @flow.global_function(type="predict")
    def scale(x: tp.Numpy.Placeholder((8, 128))) -> tp.Numpy:
        return flow.math.sigmoid(x) * 2.0

    lib = fe.export(scale, tmp_path / "libscale.so", cpu="skylake-avx512")
    assert "+avx512f" in lib.target and os.path.getsize(lib.library) > 0
    target, runs = _C.cpu_target("skylake-avx512")
    assert target == lib.target and isinstance(runs, bool)


def test_errors(tmp_path):
    @flow.global_function(type="predict")
    def ident(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        return flow.math.relu(x)

    with pytest.raises(TypeError, match="expected a job function"):
        fe.export(lambda x: x, tmp_path / "a.so")
    with pytest.raises(ValueError, match="not an x86-64 CPU name"):
        fe.export(ident, tmp_path / "a.so", cpu="pentium-9000")
    with pytest.raises(ValueError, match="C identifier"):
        fe.export(ident, tmp_path / "a.so", name="9lives")
    with pytest.raises(ValueError, match="2 jobs but 1 names"):
        fe.export([ident, ident], tmp_path / "a.so", name=["one"])
    with pytest.raises(ValueError, match="share the C name prefix"):
        fe.export([ident, ident], tmp_path / "a.so")
    with pytest.raises(RuntimeError, match="needs a C compiler"):
        fe.export(ident, tmp_path / "a.so", compiler="no-such-cc-here")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fe.export(ident, tmp_path / "missing" / "a.so")
    assert not list(tmp_path.iterdir())  # nothing half-written

    @flow.global_function(type="predict")
    def counts(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        v = flow.get_variable("export_counter", shape=(2,), initializer=flow.zeros_initializer())
        flow.assign(v, v + x)
        return v

    with pytest.raises(NotImplementedError, match="assigns variables"):
        fe.export(counts, tmp_path / "a.so")


def test_flowjit_cache_export_of_an_entry_with_a_checkpoint(tmp_path, monkeypatch, capsys):
    from flowjit.cache import cli
    monkeypatch.setenv("FLOWJIT_CACHE_DIR", str(tmp_path / "cache"))

    @flow.global_function(type="predict")
    def cached_pick(table: tp.Numpy.Placeholder((5, 3)),
                    idx: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable("cached_pick_w", shape=(3,), initializer=flow.random_normal_initializer())
        return flow.math.tanh(flow.gather(table, idx) * w)

    table = np.linspace(-2, 2, 15, dtype=np.float32).reshape(5, 3)
    idx = np.array([4, 0, 2, 2], np.int32)
    ref = cached_pick(table, idx)
    key = cached_pick.compiled_jobs()[0].cache_key
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    out = tmp_path / "libcached.so"
    # Without the variables' values: refused, naming the variable.
    assert cli.main(["export", key[:12], str(out)]) == 2
    assert "cached_pick_w" in capsys.readouterr().err and not out.exists()
    assert cli.main(["export", key[:12], str(out), "--checkpoint", str(tmp_path / "ckpt")]) == 0
    assert "cached_pick_create/_run/_destroy" in capsys.readouterr().out
    job = fe.ExportedJob("cached_pick", "cached_pick", [("in0", "float32", (5, 3)), ("in1", "int32", (4,))],
                         [("out0", "float32", (4, 3))], 1, 0)
    lib = fe.ExportedLibrary(str(out), str(tmp_path / "libcached.h"), "", "", 0, 0, [job])
    assert "int cached_pick_run(cached_pick_context *ctx, const float *in0, const int32_t *in1, float *out0);" \
        in Path(lib.header).read_text()
    assert_bits(run_c(lib, job, tmp_path, [table, idx]), ref)  # the entry's own code
    # The plan keeps the run's checks: the message names the job, the line and the index.
    with pytest.raises(AssertionError, match=r"gather: indices holds 9 at \[1\], outside the valid range"):
        run_c(lib, job, tmp_path, [table, np.array([0, 9, 0, 0], np.int32)])
