"""The CPU matmul's kernel shapes: the packed GEMM (operands packed or read in
place, whole and edge tiles) and the skinny-output dot path, against float64
numpy, on this host's code and on code for smaller x86-64 CPUs (FLOWJIT_CPU in
a subprocess: x86-64-v3 = AVX2+FMA, x86-64-v2 = SSE4.2 without FMA).

Which path a kernel takes is read from FLOWJIT_DEBUG=1's line; no test assumes
a vector width, a register count or a cache size.
"""
import inspect
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

# (name, m, k, n, transpose_a, transpose_b, batch)
CASES = [
    ("seed fwd2 x@W2^T", 100, 512, 10, False, True, 0),
    ("skinny n=1", 9, 64, 1, False, True, 0),
    ("skinny n=3, k with a remainder", 7, 77, 3, False, True, 0),
    ("skinny n=10, rows not a tile multiple", 13, 100, 10, False, True, 0),
    ("skinny n=7 batched", 11, 40, 7, False, True, 3),
    ("skinny n, a transposed (gemm)", 30, 64, 5, True, True, 0),
    ("skinny n, b not transposed (gemm)", 30, 64, 6, False, False, 0),
    ("seed dW2 dL^T@h", 10, 100, 512, True, False, 0),
    ("skinny m=1", 1, 33, 70, False, False, 0),
    ("skinny m=3 b^T", 3, 50, 100, False, True, 0),
    ("seed dH dL@W2 (skinny k)", 100, 10, 512, False, False, 0),
    ("k=1", 5, 1, 7, False, False, 0),
    ("1x1x1", 1, 1, 1, False, False, 0),
    ("odd", 37, 29, 53, False, False, 0),
    ("odd a^T", 37, 29, 53, True, False, 0),
    ("odd b^T", 37, 29, 53, False, True, 0),
    ("odd a^T b^T", 37, 29, 53, True, True, 0),
    ("row edges, whole columns", 13, 64, 64, False, False, 0),
    ("k blocked", 20, 1500, 40, False, False, 0),
    ("batched odd", 7, 19, 23, False, True, 4),
    # K blocks summing in the output: K not a multiple of the block, edge
    # tiles in both m and n (masked C loads and stores between the blocks).
    ("k blocked, odd edges", 37, 1029, 53, False, False, 0),
    ("k blocked a^T b^T", 29, 1100, 45, True, True, 0),
    ("k blocked b^T, m of tile rows", 100, 1200, 70, False, True, 0),
    ("k blocked batched", 5, 600, 33, False, True, 2),
    # B packed row by row (rows contiguous along n, a stride of a 128-byte
    # multiple), K blocked, a partial last row tile (with a 48K L1d the row
    # tiles go outside the column panels).
    ("b packed by rows, k blocked", 61, 1000, 128, False, False, 0),
    # B read in place with many row tiles (a row stride that is not a multiple
    # of 128 bytes), n not a multiple of the register tile.
    ("b in place, row tiles", 40, 64, 100, False, False, 0),
    ("b in place, k blocked", 45, 700, 100, True, False, 0),
    # A read in place: rows contiguous along k, a stride spreading them over
    # the cache sets (784 floats), K blocked, B packed through transposes.
    ("seed fwd1 x@W1^T", 100, 784, 512, False, True, 0),
    ("a in place, odd edges", 37, 777, 45, False, True, 0),
    # B in place with the tasks split along rows (A packed per task's rows).
    ("seed dW1 dH^T@x", 512, 100, 784, True, False, 0),
]


def _operands(rng, m, k, n, ta, tb, batch, dtype=np.float32):
    ash = (k, m) if ta else (m, k)
    bsh = (n, k) if tb else (k, n)
    if batch:
        ash, bsh = (batch,) + ash, (batch,) + bsh
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-5, 6, ash).astype(dtype), rng.integers(-5, 6, bsh).astype(dtype)
    return rng.standard_normal(ash).astype(dtype), rng.standard_normal(bsh).astype(dtype)


def _reference(a, b, ta, tb, bias=None, relu=False):
    a = np.swapaxes(a, -1, -2) if ta else a
    b = np.swapaxes(b, -1, -2) if tb else b
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if bias is not None:
        want = want + bias
    return np.maximum(want, 0) if relu else want


_DT = {np.float32: flow.float32, np.float64: flow.float64, np.int32: flow.int32}


def _job(name, arrays, body):
    names = [f"x{i}" for i in range(len(arrays))]

    def fn(*blobs):
        return body(*blobs)

    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in names])
    fn.__annotations__ = {p: tp.Numpy.Placeholder(a.shape, dtype=_DT[a.dtype.type])
                          for p, a in zip(names, arrays)}
    fn.__annotations__["return"] = tp.Numpy
    fn.__name__ = fn.__qualname__ = re.sub(r"\W", "_", name)
    return flow.global_function(type="predict")(fn)


def _max_rel_err(got, want):
    scale = max(1.0, float(np.abs(want).max()))
    return float(np.abs(got.astype(np.float64) - want).max()) / scale


def run_cases():
    """Every case with this process's target: {name: max relative error}."""
    rng = np.random.default_rng(7)
    out = {}
    for name, m, k, n, ta, tb, batch in CASES:
        a, b = _operands(rng, m, k, n, ta, tb, batch)
        job = _job(name, [a, b], lambda x, y: flow.matmul(x, y, transpose_a=ta, transpose_b=tb))
        out[name] = _max_rel_err(job(a, b), _reference(a, b, ta, tb))
    # Epilogues on the skinny paths: bias + relu fused into the matmul kernel.
    for name, m, k, n, ta, tb in [("dot epilogue", 13, 100, 10, False, True),
                                  ("gemm edge epilogue", 13, 40, 37, False, False)]:
        a, b = _operands(rng, m, k, n, ta, tb, 0)
        bias = rng.standard_normal(n).astype(np.float32)
        job = _job(name, [a, b, bias], lambda x, y, c: flow.nn.relu(flow.nn.bias_add(
            flow.matmul(x, y, transpose_a=ta, transpose_b=tb), c)))
        out[name] = _max_rel_err(job(a, b, bias), _reference(a, b, ta, tb, bias, relu=True))
    # K blocks with an epilogue: the output holds the raw sums until the last
    # block applies bias + relu; a float64 result (not the accumulator's type)
    # keeps them in scratch instead.
    a, b = _operands(rng, 19, 1100, 41, False, False, 0)
    bias = rng.standard_normal(41).astype(np.float32)
    job = _job("k blocked epilogue", [a, b, bias],
               lambda x, y, c: flow.nn.relu(flow.nn.bias_add(flow.matmul(x, y), c)))
    out["k blocked epilogue"] = _max_rel_err(job(a, b, bias), _reference(a, b, False, False, bias,
                                                                         relu=True))
    job = _job("k blocked f64 result", [a, b],
               lambda x, y: flow.cast(flow.matmul(x, y), flow.float64))
    got = job(a, b)
    assert got.dtype == np.float64
    out["k blocked f64 result"] = _max_rel_err(got, _reference(a, b, False, False))
    # One A for every batch (packed once per call for all of them): K blocked
    # with a shorter last block, rows not a tile multiple.
    a, b = _operands(rng, 37, 1030, 53, True, False, 0)
    b = np.stack([b, -b[::-1], b * 0.5])
    job = _job("a shared by the batches", [a, b], lambda x, y: flow.matmul(x, y, transpose_a=True))
    out["a shared by the batches"] = _max_rel_err(job(a, b), _reference(a, b, True, False))
    # Other dtypes on the dot path (integer sums are exact).
    for dt in (np.float64, np.int32):
        a, b = _operands(rng, 21, 96, 10, False, True, 0, dtype=dt)
        job = _job(f"dot {dt.__name__}", [a, b], lambda x, y: flow.matmul(x, y, transpose_b=True))
        got = job(a, b)
        assert got.dtype == dt
        out[f"dot {dt.__name__}"] = _max_rel_err(got, _reference(a, b, False, True))
    return out


TOL = {"dot float64": 1e-13, "dot int32": 0.0}


def _check(errors):
    bad = {k: v for k, v in errors.items() if v > TOL.get(k, 2e-5)}
    assert not bad, f"matmul results off: {bad}"


def test_matmul_paths_on_this_target():
    _check(run_cases())


def _host_can_run(cpu):
    flags = open("/proc/cpuinfo").read().split()
    need = {"x86-64-v3": ("avx2", "fma", "bmi2", "movbe"), "x86-64-v2": ("sse4_2", "popcnt")}
    return all(f in flags for f in need[cpu])


@pytest.mark.parametrize("cpu", ["x86-64-v3", "x86-64-v2"])
def test_matmul_paths_on_smaller_cpus(cpu, tmp_path):
    if not os.path.exists("/proc/cpuinfo") or not _host_can_run(cpu):
        pytest.skip(f"this host cannot run code for {cpu}")
    env = dict(os.environ, FLOWJIT_CPU=cpu, FLOWJIT_DEBUG="1", FLOWJIT_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    _check(json.loads(p.stdout.strip().splitlines()[-1]))
    lines = [ln for ln in p.stderr.splitlines() if ": matmul " in ln]
    assert lines and all(f" on {cpu} " in ln for ln in lines), lines[:3]
    # Without FMA the baseline still gets its own choice and says so.
    assert all(("no fma" in ln) == (cpu == "x86-64-v2") for ln in lines)


def _matmul_debug_lines(code, tmp_path):
    """The FLOWJIT_DEBUG=1 matmul lines of `code` run in a fresh process (an empty cache)."""
    env = dict(os.environ, FLOWJIT_DEBUG="1", FLOWJIT_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return [ln for ln in p.stderr.splitlines() if ": matmul " in ln]


def test_the_choice_is_printed_and_skinny_outputs_take_the_dot_path(tmp_path):
    code = ("import numpy as np, flowjit as flow, flowjit.typing as tp\n"
            "def mm(a: tp.Numpy.Placeholder((100, 512)), b: tp.Numpy.Placeholder((10, 512))"
            ") -> tp.Numpy:\n"
            "    return flow.matmul(a, b, transpose_b=True)\n"
            "def big(a: tp.Numpy.Placeholder((64, 96)), b: tp.Numpy.Placeholder((96, 80))"
            ") -> tp.Numpy:\n"
            "    return flow.matmul(a, b)\n"
            "flow.global_function(type='predict')(mm)(np.ones((100, 512), np.float32), "
            "np.ones((10, 512), np.float32))\n"
            "flow.global_function(type='predict')(big)(np.ones((64, 96), np.float32), "
            "np.ones((96, 80), np.float32))\n")
    lines = _matmul_debug_lines(code, tmp_path)
    assert len(lines) == 2, lines
    assert "1x100x512x10" in lines[0] and "dot path" in lines[0], lines[0]
    assert "1x64x96x80" in lines[1] and "gemm, tile " in lines[1], lines[1]
    for ln in lines:  # the facts the choice came from
        assert re.search(r"\d+-bit vectors, \d+ registers, (no )?fma, L1d \d+K, L2 \d+K", ln), ln


def test_k_contiguous_rows_with_a_spread_stride_are_read_in_place(tmp_path):
    # x @ W^T with 784-float rows: x's rows (A) are not copied; 1024-float
    # rows (every one in the same cache sets) are packed.
    code = ("import numpy as np, flowjit as flow, flowjit.typing as tp\n"
            "def spread(a: tp.Numpy.Placeholder((100, 784)), b: tp.Numpy.Placeholder((64, 784))"
            ") -> tp.Numpy:\n"
            "    return flow.matmul(a, b, transpose_b=True)\n"
            "def aligned(a: tp.Numpy.Placeholder((100, 1024)), b: tp.Numpy.Placeholder((64, 1024))"
            ") -> tp.Numpy:\n"
            "    return flow.matmul(a, b, transpose_b=True)\n"
            "for f, k in ((spread, 784), (aligned, 1024)):\n"
            "    got = flow.global_function(type='predict')(f)(np.ones((100, k), np.float32), "
            "np.ones((64, k), np.float32))\n"
            "    assert (got == k).all()\n")
    lines = _matmul_debug_lines(code, tmp_path)
    assert len(lines) == 2, lines
    assert "A in place, B packed" in lines[0], lines[0]
    assert "A packed, B packed" in lines[1], lines[1]


def test_k_blocks_sum_in_the_output_unless_it_cannot_hold_them(tmp_path):
    code = ("import numpy as np, flowjit as flow, flowjit.typing as tp\n"
            "def plain(a: tp.Numpy.Placeholder((30, 3000)), b: tp.Numpy.Placeholder((3000, 40))"
            ") -> tp.Numpy:\n"
            "    return flow.matmul(a, b)\n"
            "def wide(a: tp.Numpy.Placeholder((30, 3000)), b: tp.Numpy.Placeholder((3000, 40))"
            ") -> tp.Numpy:\n"
            "    return flow.cast(flow.matmul(a, b), flow.float64)\n"
            "a, b = np.ones((30, 3000), np.float32), np.ones((3000, 40), np.float32)\n"
            "assert (flow.global_function(type='predict')(plain)(a, b) == 3000).all()\n"
            "assert (flow.global_function(type='predict')(wide)(a, b) == 3000).all()\n")
    lines = _matmul_debug_lines(code, tmp_path)
    assert len(lines) == 2, lines
    assert "K blocks sum in the output" in lines[0], lines[0]
    assert "K blocks sum in scratch" in lines[1], lines[1]


def test_the_target_id_carries_what_the_blocking_depends_on():
    from flowjit import _C
    target = _C.build_info()["target"]
    assert re.search(r";l1d=\d+;l2=\d+;threads=\d+$", target), target


if __name__ == "__main__":
    print(json.dumps(run_cases()))
