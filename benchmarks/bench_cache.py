"""Cold, warm-from-disk and in-memory-hit call times of the seed's train job.

    python benchmarks/bench_cache.py [--repeat 3] [--calls 200] [--json]

Each measurement runs in a fresh process on examples/train_mnist.py's
train_job with random (100, 1, 28, 28) images:
  cold  first call, empty disk cache: trace, init job, LLVM compile of both
  warm  first call in a second process on the cache the cold one filled:
        trace and fusion, then objects loaded from disk (no LLVM)
  hit   later calls of the same JobFunction: signature check and run only
        (the time of one training step on this machine)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(calls):
    t0 = time.perf_counter()
    import numpy as np
    import flowjit  # noqa: F401
    t_import = time.perf_counter() - t0
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from train_mnist import BATCH_SIZE, train_job

    rng = np.random.default_rng(0)
    images = rng.random((BATCH_SIZE, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, BATCH_SIZE).astype(np.int32)
    t1 = time.perf_counter()
    train_job(images, labels)
    first = time.perf_counter() - t1
    hits = []
    for _ in range(calls):
        t = time.perf_counter()
        train_job(images, labels)
        hits.append(time.perf_counter() - t)
    job = train_job.compiled_jobs()[0]
    print(json.dumps({"import": t_import, "first": first, "hit_median": statistics.median(hits),
                      "hit_min": min(hits), "from_disk": job.from_disk_cache,
                      "codegen": job.seconds_codegen, "compile_total": job.seconds_total,
                      "key": job.cache_key}))


def run_child(cache_dir, calls):
    env = dict(os.environ, FLOWJIT_CACHE_DIR=cache_dir)
    for k in ("FLOWJIT_DISABLE_CACHE", "FLOWJIT_DEBUG"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--calls", str(calls)],
                       env=env, capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="cold/warm pairs (medians are reported)")
    ap.add_argument("--calls", type=int, default=200, help="in-memory hits timed per process")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.calls)
        return
    cold, warm = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="flowjit-bench-cache-") as d:
            c = run_child(d, args.calls)
            w = run_child(d, args.calls)
            assert not c["from_disk"] and w["from_disk"] and c["key"] == w["key"], (c, w)
            cold.append(c)
            warm.append(w)

    def med(rows, k):
        return statistics.median(r[k] for r in rows)

    result = {
        "cold_first_call_s": med(cold, "first"),
        "warm_first_call_s": med(warm, "first"),
        "hit_call_s": med(cold + warm, "hit_median"),
        "cold_codegen_s": med(cold, "codegen"),
        "warm_load_s": med(warm, "codegen"),
        "import_s": med(cold + warm, "import"),
        "repeat": args.repeat,
        "calls": args.calls,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    ms = lambda s: f"{s * 1e3:9.2f} ms"  # noqa: E731
    print(f"train_job (examples/train_mnist.py), medians of {args.repeat} process pairs")
    print(f"  cold first call (empty cache)   {ms(result['cold_first_call_s'])}"
          f"   LLVM compile + load   {ms(result['cold_codegen_s'])}")
    print(f"  warm first call (from disk)     {ms(result['warm_first_call_s'])}"
          f"   read, verify, load    {ms(result['warm_load_s'])}")
    print(f"  in-memory cache hit (per call)  {ms(result['hit_call_s'])}"
          f"   (one SGD step; median of {args.calls})")
    print(f"  import flowjit                  {ms(result['import_s'])}")


if __name__ == "__main__":
    main()
