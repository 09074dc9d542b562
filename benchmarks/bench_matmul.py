"""float32 matmul GFLOP/s: flowjit vs numpy (OpenBLAS) vs PyTorch, and % of FMA peak.

Shapes: 1024x1024x1024, and the seed MLP's (784-512-10, batch 100) forward and
backward matmuls, with the operand layouts flowjit's own dense layer and its
autodiff use (weights stored (out, in), `matmul(x, w, transpose_b=True)`).

    python benchmarks/bench_matmul.py
    python benchmarks/bench_matmul.py --series fwd1   # the host's drift, window by window
"""
import time

import numpy as np

import _common as C

# (case, a shape, b shape, transpose_a, transpose_b)
CASES = [
    ("1024^3 a@b", (1024, 1024), (1024, 1024), False, False),
    ("fwd1 x@W1^T 100x784x512", (100, 784), (512, 784), False, True),
    ("fwd2 h@W2^T 100x512x10", (100, 512), (10, 512), False, True),
    ("dW1 dH^T@x 512x100x784", (100, 512), (100, 784), True, False),
    ("dX dH@W1 100x512x784", (100, 512), (512, 784), False, False),
    ("dW2 dL^T@h 10x100x512", (100, 10), (100, 512), True, False),
]


def _mnk(ashape, bshape, ta, tb):
    m, k = (ashape[1], ashape[0]) if ta else ashape
    n = bshape[0] if tb else bshape[1]
    return m, n, k


def _flowjit_job(i, ashape, bshape, ta, tb):
    import flowjit as flow
    import flowjit.typing as tp

    def mm(a, b):
        return flow.matmul(a, b, transpose_a=ta, transpose_b=tb)

    mm.__name__ = f"bench_matmul_{i}"
    mm.__annotations__ = {"a": tp.Numpy.Placeholder(ashape, dtype=flow.float),
                          "b": tp.Numpy.Placeholder(bshape, dtype=flow.float),
                          "return": tp.Numpy}
    return flow.global_function(type="predict")(mm)


def _operands(i, rng):
    """Case i's random operands as flowjit takes them (a, b), as numpy
    multiplies them (A, B: transposed views where the case says), and its job."""
    _, ashape, bshape, ta, tb = CASES[i]
    a = rng.standard_normal(ashape, dtype=np.float32)
    b = rng.standard_normal(bshape, dtype=np.float32)
    return a, b, (a.T if ta else a), (b.T if tb else b), _flowjit_job(i, ashape, bshape, ta, tb)


def fma_peak():
    """(total GFLOP/s, per-thread dict, threads): the best of 3 measurements
    now (the peak is a property of the machine; load only lowers a sample)."""
    from flowjit import _C
    p = max((_C.measure_fma_peak(0.3) for _ in range(3)), key=lambda d: d["gflops_per_thread"])
    n = _C.num_threads()
    return p["gflops_per_thread"] * n, p, n


def concurrent_fma_peak(nthreads, seconds=0.5):
    """Total GFLOP/s with the FMA loop running on nthreads threads at once
    (measure_fma_peak releases the GIL): context for the denominator, which
    assumes the threads' peaks add up."""
    import threading
    from flowjit import _C
    res = [0.0] * nthreads

    def one(i):
        res[i] = _C.measure_fma_peak(seconds)["gflops_per_thread"]

    ts = [threading.Thread(target=one, args=(i,)) for i in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(res)


def run():
    C.print_load("(matmul)")
    peak, p, nthreads = fma_peak()
    print(f"# FMA peak {peak:.1f} GFLOP/s = {p['gflops_per_thread']:.1f} per thread x {nthreads} "
          f"threads ({p['lanes']} lanes, {p['accumulators']} accumulators)")
    print(f"# numpy BLAS: {C.openblas_info()} (limited to {nthreads} threads for the benchmark)")
    torch = C.peer("torch")
    if torch is not None:
        torch.set_num_threads(nthreads)
        print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")

    rng = np.random.default_rng(0)
    measured = []  # (case, impl, flops, best, median, note)
    for i, (case, ashape, bshape, ta, tb) in enumerate(CASES):
        m, n, k = _mnk(ashape, bshape, ta, tb)
        flops = 2.0 * m * n * k
        a, b, A, B, job = _operands(i, rng)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        out = job(a, b)  # compiles
        err = float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-30))
        jk = job.compiled_jobs()[0]
        fns = {"flowjit": lambda: job(a, b), "numpy": lambda: np.matmul(A, B)}
        if torch is not None:
            ta_t, tb_t = torch.from_numpy(a), torch.from_numpy(b)
            TA = ta_t.t() if ta else ta_t
            TB = tb_t.t() if tb else tb_t
            fns["torch"] = lambda: torch.matmul(TA, TB)
        with C.blas_threads(nthreads):
            times = C.interleaved(fns)
        for impl, (best, med) in times.items():
            note = f", {jk.num_kernels} kernel(s), rel err {err:.1e}" if impl == "flowjit" else ""
            measured.append((case, impl, flops, best, med, note))
        if torch is None:
            measured.append((case, "torch", flops, None, None, ""))

    # The peak again after the cases; the higher of the two counts (load only
    # ever lowers a sample of it).
    peak2, p2, _ = fma_peak()
    if peak2 > peak:
        peak, p = peak2, p2
    print(f"# FMA peak used: {peak:.1f} GFLOP/s (before the cases and after; the higher); "
          f"for context, {nthreads} FMA loops at once measure {concurrent_fma_peak(nthreads):.1f} GFLOP/s")
    rows = [C.row("matmul", "FMA peak", "machine", peak, peak, "GFLOP/s",
                  f"{p['gflops_per_thread']:.1f}/thread x {nthreads} threads", peak=True)]
    for case, impl, flops, best, med, note in measured:
        if best is None:
            rows.append(C.skipped("matmul", case, impl, "torch is not installed"))
            continue
        g = flops / best / 1e9
        rows.append(C.row("matmul", case, impl, g, flops / med / 1e9, "GFLOP/s",
                          f"{100 * g / peak:.0f}% peak{note}", pct_peak=100 * g / peak))
    C.print_load("(matmul, after)")
    return rows


def series(prefix, windows, seconds=0.1):
    """Prints flowjit's and numpy's GFLOP/s on one case and the one-thread FMA
    loop's, window after window, alternating: on a shared host whose speed
    drifts while the load stays low, this shows whether a difference between
    two runs is the code or the host."""
    from flowjit import _C
    found = [i for i, c in enumerate(CASES) if c[0].startswith(prefix)]
    if not found:
        raise SystemExit(f"--series: no case starts with {prefix!r}; cases: {', '.join(c[0] for c in CASES)}")
    i = found[0]
    case, ashape, bshape, ta, tb = CASES[i]
    m, n, k = _mnk(ashape, bshape, ta, tb)
    a, b, A, B, job = _operands(i, np.random.default_rng(0))
    job(a, b)
    fns = {"flowjit": lambda: job(a, b), "numpy": lambda: np.matmul(A, B)}
    reps = max(1, int(seconds * 1e11 / (2.0 * m * n * k)))
    print(f"# {case}: GFLOP/s per window of {reps} calls, flowjit / numpy / FMA loop (1 thread)")
    with C.blas_threads(_C.num_threads()):
        for _ in range(windows):
            g = []
            for fn in fns.values():
                fn()
                t = time.perf_counter()
                for _ in range(reps):
                    fn()
                g.append(2.0 * m * n * k * reps / (time.perf_counter() - t) / 1e9)
            fma = _C.measure_fma_peak(0.05)["gflops_per_thread"]
            print(f"{g[0]:7.1f} {g[1]:7.1f} {fma:7.1f}", flush=True)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", metavar="CASE", help="a case name's start (e.g. fwd1): print a time series instead")
    ap.add_argument("--windows", type=int, default=30)
    args = ap.parse_args()
    C.fair_env()
    C.header()
    if args.series:
        series(args.series, args.windows)
    else:
        C.print_rows(run(), "matmul (float32; best and median of 7 repetitions after warm-up)")
