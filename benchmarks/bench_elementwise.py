"""A fused chain of 8 elementwise ops on 16M float32 elements: flowjit (one
fused kernel) vs numpy (the same expression), as effective GB/s (4 bytes read
+ 4 bytes written per element per call) and % of the machine's copy bandwidth
(a large np.copyto of 16M floats, one thread, measured in the same run).
flowjit runs on its default thread count (all cores; FLOWJIT_BENCH_THREADS
overrides it) and, for context, on one thread.

    y = tanh(x * 1.5 + 0.5) * x - exp(-x) / 2
        mul, add, tanh, mul, neg, exp, div, sub  (8 ops)

    python benchmarks/bench_elementwise.py
"""
import numpy as np

import _common as C

N = 16 * 1024 * 1024
BYTES = 2 * 4 * N  # read x + write y


def chain_numpy(x):
    return np.tanh(x * 1.5 + 0.5) * x - np.exp(-x) / 2


def _jobs():
    import flowjit as flow
    import flowjit.typing as tp

    @flow.global_function(type="predict")
    def bench_chain8(x: tp.Numpy.Placeholder((N,), dtype=flow.float)) -> tp.Numpy:
        return flow.math.tanh(x * 1.5 + 0.5) * x - flow.math.exp(-x) / 2

    @flow.global_function(type="predict")
    def bench_add1(x: tp.Numpy.Placeholder((N,), dtype=flow.float)) -> tp.Numpy:
        return x + 1.0

    return bench_chain8, bench_add1


def run():
    C.print_load("(elementwise)")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N, dtype=np.float32)
    src = rng.standard_normal(N, dtype=np.float32)
    dst = np.empty_like(src)

    chain, add1 = _jobs()
    y = chain(x)
    jk = chain.compiled_jobs()[0]
    print(f"# flowjit chain: {jk.num_kernels} kernel(s); fusion plan: {jk.fusion_plan.strip()}")
    print(f"# flowjit plan: {jk.plan.strip()}")
    if jk.num_kernels != 1:
        print(f"# WARNING: the chain compiled to {jk.num_kernels} kernels, not one fused kernel")
    err = float(np.abs(y - chain_numpy(x)).max())
    add1(x)

    from flowjit import _C
    nthreads = _C.num_threads()

    def on_one_thread(fn):
        def run1():
            _C.set_num_threads(1)
            try:
                return fn()
            finally:
                _C.set_num_threads(nthreads)
        return run1

    cases = {  # name: (case, impl, fn)
        "copy": ("copy bandwidth", "np.copyto", lambda: np.copyto(dst, src)),
        "fj chain": ("chain of 8 ops, 16M", "flowjit", lambda: chain(x)),
        "fj chain 1t": ("chain of 8 ops, 16M", "flowjit 1 thread", on_one_thread(lambda: chain(x))),
        "np chain": ("chain of 8 ops, 16M", "numpy", lambda: chain_numpy(x)),
        "fj add1": ("x + 1 (1 op), 16M", "flowjit", lambda: add1(x)),
        "np add1": ("x + 1 (1 op), 16M", "numpy", lambda: x + 1.0),
        "np copy": ("copy to a fresh array", "np.copy", lambda: np.copy(src)),
    }
    times = C.interleaved({k: v[2] for k, v in cases.items()}, warmup=3, reps=7, target_s=0.25)
    bw = BYTES / times["copy"][0] / 1e9
    notes = {
        "copy": "16M floats, 1 thread, preallocated destination",
        "fj chain": f"{jk.num_kernels} kernel(s), {nthreads} thread(s), max err {err:.1e}",
        "fj chain 1t": "context: the same kernel on one thread",
        "np chain": "",
        "fj add1": "context: one memory-bound op",
        "np add1": "",
        "np copy": "context: allocation + page faults + copy",
    }
    rows = []
    for k, (case, impl, _) in cases.items():
        best, med = times[k]
        g = BYTES / best / 1e9
        note = f"{100 * g / bw:.0f}% of copy bw, {best * 1e3:.1f} ms"
        if notes[k]:
            note += ", " + notes[k]
        extra = {"copy_bw": True} if k == "copy" else {"pct_copy": 100 * g / bw}
        if k.startswith("fj chain"):
            extra["kernels"] = jk.num_kernels
        rows.append(C.row("elementwise", case, impl, g, BYTES / med / 1e9, "GB/s",
                          notes[k] if k == "copy" else note, **extra))
    C.print_load("(elementwise, after)")
    return rows


if __name__ == "__main__":
    C.fair_env()
    C.header()
    C.print_rows(run(), "fused elementwise chain (best and median of 7 repetitions after warm-up)")
