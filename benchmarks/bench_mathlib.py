"""float32 exp and tanh: flowjit's own polynomials (codegen/mathlib.cpp) against
glibc's vector math library (libmvec, what LLVM's -vector-library=LIBMVEC-X86
and gcc -fveclib call) and numpy, in ns per element and in ulps.

    python benchmarks/bench_mathlib.py            (FLOWJIT_CPU=x86-64-v3 for AVX2)

Speed: N = 128K floats (in L2), one thread, best of 7, whole-array calls:
flowjit is a compiled job (its call overhead included, ~1-2 us), libmvec a C
loop over its 16-lane (AVX-512) or 8-lane (AVX2) entry points, compiled here
with the system C compiler (the column is skipped without one), numpy a ufunc
call. The chain is the fused 8-op chain of bench_elementwise.py, written as
one pass of libmvec calls for libmvec.

Accuracy: the largest distance in ulps to the correctly rounded result (the
float64 function rounded to float32) over 2^20 inputs spread over the range
(exp [-87, 88], tanh [-10, 10]) plus the speed run's inputs.
"""
import ctypes
import os
import shutil
import subprocess
import tempfile

import numpy as np

import _common as C

N = 1 << 17

_SHIM = r"""
#include <immintrin.h>
#define DEF(isa, vt, lanes, suffix, load, store, mul, add, sub, set1)                    \
  vt _ZGV##isa##N##lanes##v_expf(vt);                                                    \
  vt _ZGV##isa##N##lanes##v_tanhf(vt);                                                   \
  __attribute__((target(suffix))) void exp_##isa(const float* x, float* y, long n) {     \
    for (long i = 0; i + lanes <= n; i += lanes)                                         \
      store(y + i, _ZGV##isa##N##lanes##v_expf(load(x + i)));                            \
  }                                                                                      \
  __attribute__((target(suffix))) void tanh_##isa(const float* x, float* y, long n) {    \
    for (long i = 0; i + lanes <= n; i += lanes)                                         \
      store(y + i, _ZGV##isa##N##lanes##v_tanhf(load(x + i)));                           \
  }                                                                                      \
  __attribute__((target(suffix))) void chain_##isa(const float* x, float* y, long n) {   \
    for (long i = 0; i + lanes <= n; i += lanes) {                                       \
      vt v = load(x + i);                                                                \
      vt t = _ZGV##isa##N##lanes##v_tanhf(add(mul(v, set1(1.5f)), set1(0.5f)));         \
      vt e = _ZGV##isa##N##lanes##v_expf(sub(set1(0.0f), v));                            \
      store(y + i, sub(mul(t, v), mul(e, set1(0.5f))));                                  \
    }                                                                                    \
  }
DEF(e, __m512, 16, "avx512f", _mm512_loadu_ps, _mm512_storeu_ps, _mm512_mul_ps, _mm512_add_ps,
    _mm512_sub_ps, _mm512_set1_ps)
DEF(d, __m256, 8, "avx2,fma", _mm256_loadu_ps, _mm256_storeu_ps, _mm256_mul_ps, _mm256_add_ps,
    _mm256_sub_ps, _mm256_set1_ps)
"""


def _libmvec():
    """(isa name, {fn: callable(x, y)}) or (None, why)."""
    cc = shutil.which("cc") or shutil.which("clang") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler to build the libmvec loop"
    cpu = os.environ.get("FLOWJIT_CPU", "")
    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    if cpu in ("", "native") and "avx512f" in flags:
        isa, name = "e", "AVX-512 (_ZGVeN16v_*)"
    elif cpu in ("", "native", "x86-64-v3", "x86-64-v4") and "avx2" in flags:
        isa, name = "d", "AVX2 (_ZGVdN8v_*)"
    else:
        return None, f"no libmvec variant compared for FLOWJIT_CPU={cpu or 'native'}"
    d = tempfile.mkdtemp(prefix="fj_mvec_")
    src, lib = os.path.join(d, "shim.c"), os.path.join(d, "shim.so")
    with open(src, "w") as f:
        f.write(_SHIM)
    p = subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib, "-lmvec", "-lm"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None, "building the libmvec loop failed: " + p.stderr.strip()[-200:]
    so = ctypes.CDLL(lib)
    fns = {}
    for fn in ("exp", "tanh", "chain"):
        c = getattr(so, f"{fn}_{isa}")
        c.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
        fns[fn] = (lambda c: lambda x, y: c(x.ctypes.data, y.ctypes.data, x.size))(c)
    return name, fns


def _jobs(n):
    import flowjit as flow
    import flowjit.typing as tp

    def job(f, name):
        def fn(x: tp.Numpy.Placeholder((n,), dtype=flow.float)) -> tp.Numpy:
            return f(x)
        fn.__name__ = f"{name}_{n}"
        return flow.global_function(type="predict")(fn)

    return {
        "exp": job(flow.math.exp, "bench_math_exp"),
        "tanh": job(flow.math.tanh, "bench_math_tanh"),
        "chain": job(lambda x: flow.math.tanh(x * 1.5 + 0.5) * x - flow.math.exp(-x) / 2,
                     "bench_math_chain"),
    }


def _numpy(fn):
    if fn == "exp":
        return np.exp
    if fn == "tanh":
        return np.tanh
    return lambda x: np.tanh(x * 1.5 + 0.5) * x - np.exp(-x) / 2


def _ordered(y):
    """float32 -> int64 positions on the number line, +0 and -0 alike."""
    i = y.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def max_ulps(got, ref64):
    ref = ref64.astype(np.float32)
    ok = np.isfinite(ref) & np.isfinite(got)
    return int(np.max(np.abs(_ordered(got[ok]) - _ordered(ref[ok]))))


def run():
    C.print_load("(mathlib)")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N, dtype=np.float32) * 3
    y = np.empty_like(x)
    isa, mvec = _libmvec()
    if isa is None:
        print(f"# libmvec: skipped ({mvec})")
        mvec = {}
    else:
        print(f"# libmvec: {isa}, glibc's libmvec.so.1")

    from flowjit import _C
    nthreads = _C.num_threads()
    fj = _jobs(N)
    rows = []
    for fn in ("exp", "tanh", "chain"):
        impls = {"flowjit": lambda f=fj[fn]: f(x), "numpy": lambda f=_numpy(fn): f(x)}
        if fn in mvec:
            impls["libmvec"] = lambda f=mvec[fn]: f(x, y)
        _C.set_num_threads(1)
        try:
            times = C.interleaved(impls, warmup=3, reps=7, target_s=0.05)
        finally:
            _C.set_num_threads(nthreads)
        for impl, (best, med) in times.items():
            rows.append(C.row("mathlib", f"{fn} f32, 128K, 1 thread", impl, best / N * 1e9,
                              med / N * 1e9, "ns/elem", ""))

    # Accuracy, against the float64 function rounded once to float32.
    ranges = {"exp": (-87.0, 88.0, np.exp), "tanh": (-10.0, 10.0, np.tanh)}
    for fn, (lo, hi, ref) in ranges.items():
        m = 1 << 20
        xs = np.concatenate([np.linspace(lo, hi, m, dtype=np.float32), x])
        xs = xs[: (xs.size // 16) * 16]
        r64 = ref(xs.astype(np.float64))
        errs = {}
        job = _jobs(xs.size)[fn]
        errs["flowjit"] = max_ulps(job(xs), r64)
        errs["numpy"] = max_ulps(_numpy(fn)(xs), r64)
        if fn in mvec:
            ys = np.empty_like(xs)
            mvec[fn](xs, ys)
            errs["libmvec"] = max_ulps(ys, r64)
        print(f"# {fn} f32 max ulps vs correctly rounded on [{lo:g}, {hi:g}] ({xs.size} inputs): "
              + ", ".join(f"{k} {v}" for k, v in errs.items()))
        for r in rows:
            if r["case"].startswith(fn + " ") and r["impl"] in errs:
                r["note"] = f"max {errs[r['impl']]} ulp"
    C.print_load("(mathlib, after)")
    return rows


def print_table(rows):
    print("\n== float32 exp / tanh, ns per element (best of 7; median); x: that row's time over flowjit's")
    print(f"{'case':<26} {'impl':<8} {'best':>7} {'median':>7} {'x':>6}  accuracy")
    fj = {r["case"]: r["best"] for r in rows if r["impl"] == "flowjit"}
    for r in rows:
        print(f"{r['case']:<26} {r['impl']:<8} {r['best']:7.3f} {r['median']:7.3f} "
              f"{r['best'] / fj[r['case']]:6.2f}  {r['note']}")


if __name__ == "__main__":
    C.fair_env()
    C.header()
    print_table(run())
