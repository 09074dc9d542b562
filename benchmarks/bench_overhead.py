"""Per-call overhead of a cached tiny job (one add of 16 floats, two
placeholders): flowjit vs jax.jit vs numpy's np.add, in microseconds per call.

Each figure is over 20000 calls: 200 batches of 100 back-to-back calls, the
median (and best) batch's time per call, after warm-up.

    python benchmarks/bench_overhead.py
"""
import numpy as np

import _common as C

BATCHES, PER_BATCH = 200, 100


def per_call_us(fns, syncs=None):
    """{name: (best, median)} microseconds per call over BATCHES x PER_BATCH
    calls, the batches of the implementations interleaved."""
    times = C.interleaved(fns, syncs=syncs, warmup=2000, reps=BATCHES, inner=PER_BATCH,
                          cooldown_s=0)
    return {k: (b * 1e6, m * 1e6) for k, (b, m) in times.items()}


def _job():
    import flowjit as flow
    import flowjit.typing as tp

    @flow.global_function(type="predict")
    def bench_tiny_add(a: tp.Numpy.Placeholder((16,), dtype=flow.float),
                       b: tp.Numpy.Placeholder((16,), dtype=flow.float)) -> tp.Numpy:
        return a + b

    return bench_tiny_add


def run():
    C.print_load("(overhead)")
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, dtype=np.float32)
    case = "add 16 floats, cached"
    job = _job()
    assert np.array_equal(job(a, b), a + b)
    fns = {"flowjit": lambda: job(a, b), "numpy np.add": lambda: np.add(a, b)}
    notes = {"flowjit": f"{job.compiled_jobs()[0].num_kernels} kernel(s), numpy in -> numpy out",
             "numpy np.add": "numpy in -> numpy out"}
    skipped = []
    jax = C.peer("jax")
    if jax is None:
        skipped.append(C.skipped("overhead", case, "jax.jit", "jax is not installed"))
    else:
        f = jax.jit(lambda x, y: x + y)
        ja, jb = jax.device_put(a), jax.device_put(b)
        fns["jax.jit"] = lambda: f(ja, jb).block_until_ready()
        notes["jax.jit"] = "device arrays in, blocked each call"
        fns["jax.jit numpy"] = lambda: np.asarray(f(a, b))
        notes["jax.jit numpy"] = "numpy in -> numpy out, as flowjit"
    times = per_call_us(fns)
    rows = [C.row("overhead", case, k, best, med, "us/call", notes[k]) for k, (best, med) in times.items()]
    C.print_load("(overhead, after)")
    return rows + skipped


if __name__ == "__main__":
    C.fair_env()
    C.header()
    C.print_rows(run(), f"per-call overhead ({BATCHES} x {PER_BATCH} calls; best and median batch)")
