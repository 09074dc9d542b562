"""Fused chains of math functions give the same bits on every x86-64 the
package runs on, including where the CPU backend pins the functions'
constants (targets with 16 vector registers: x86-64-v3 and v2; see CpuMath
in codegen/cpu/backend.cpp).

The math library's scalar and vector forms are bit-identical and use only
IEEE operations with one rounding each (fma included: without the
instruction it is the correctly rounded libm call), so a fused kernel must
produce exactly the same floats natively, on AVX2+FMA and on SSE4.2. Each
run is a subprocess with its own FLOWJIT_CPU and cache directory.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

N = 10007  # whole vectors and a tail, at every vector width


def _inputs():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(N) * 4).astype(np.float32)
    x[:6] = [0.0, -0.0, 1e-30, -90.0, 95.0, np.nan]
    return x


def run_chains():
    import flowjit as flow
    import flowjit.typing as tp

    @flow.global_function(type="predict")
    def every_function(x: tp.Numpy.Placeholder((N,), dtype=flow.float)) -> tp.Numpy:
        m = flow.math
        a = m.tanh(x * 1.5 + 0.5) * x - m.exp(-x) / 2  # the benchmark's chain
        b = m.sigmoid(x) + m.sin(x) * m.cos(x * 0.5)
        c = m.log(m.exp(x * 0.1) + 1.0) + m.erf(x) - m.erfc(x * 0.5)
        return a + b * 2.0 + c * 3.0 + m.pow(m.sigmoid(x) + 0.5, x * 0.25)

    y = every_function(_inputs())
    jk = every_function.compiled_jobs()[0]
    return {"bits": y.view(np.uint32).tolist(), "kernels": jk.num_kernels}


def _host_can_run(cpu):
    flags = open("/proc/cpuinfo").read().split()
    need = {"x86-64-v3": ("avx2", "fma", "bmi2", "movbe"), "x86-64-v2": ("sse4_2", "popcnt")}
    return all(f in flags for f in need[cpu])


def _run(tmp_path, cpu=None, debug=None):
    env = dict(os.environ, FLOWJIT_CACHE_DIR=str(tmp_path / (cpu or "native")))
    env.pop("FLOWJIT_CPU", None)
    env.pop("FLOWJIT_DISABLE_FUSION", None)
    if cpu:
        env["FLOWJIT_CPU"] = cpu
    if debug:
        env["FLOWJIT_DEBUG"] = debug
    p = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.mark.parametrize("cpu", ["x86-64-v3", "x86-64-v2"])
def test_fused_math_is_bit_identical_on_smaller_cpus(cpu, tmp_path):
    if not os.path.exists("/proc/cpuinfo") or not _host_can_run(cpu):
        pytest.skip(f"this host cannot run code for {cpu}")
    native, _ = _run(tmp_path)
    small, _ = _run(tmp_path, cpu)
    assert native["kernels"] == small["kernels"] == 1
    diff = [i for i, (u, v) in enumerate(zip(native["bits"], small["bits"])) if u != v]
    assert not diff, f"{len(diff)} elements differ on {cpu}, first at {diff[:5]}"
    # And the values are right (loose: this checks the bits are not garbage).
    y = np.array(native["bits"], dtype=np.uint32).view(np.float32)
    assert np.isnan(y[5]) and np.isfinite(y[6:]).all()


def test_constants_are_pinned_with_16_vector_registers(tmp_path):
    if not os.path.exists("/proc/cpuinfo") or not _host_can_run("x86-64-v3"):
        pytest.skip("this host cannot run code for x86-64-v3")
    _, err = _run(tmp_path, "x86-64-v3", debug="3")
    ir = err[err.index("LLVM IR:"):]
    assert 'asm "", "=x,0"(<8 x float>' in ir, ir[:2000]


if __name__ == "__main__":
    print(json.dumps(run_chains()))
