"""Compile time: the first call of a train job, cold and warm-from-disk, for
flowjit, jax.jit and torch.compile, with flowjit's per-stage split.

    python benchmarks/bench_compile.py [--repeat 3] [--extra 0,4,8] [--no-torch]

Models: the seed's 784-512-10 MLP (examples/train_mnist.py's own train_job,
batch 100, SGD) and the same MLP with `extra` more 512x512 ReLU hidden
layers (8 extra = the 9-hidden-layer MLP). Every figure is one fresh process:
  cold  first call on an empty cache directory (flowjit: FLOWJIT_CACHE_DIR,
        which includes the init job's compile and the first step; jax: an
        empty persistent compilation cache; torch: an empty inductor cache)
  warm  first call in a second process on the cache the cold one filled
"cold cpu" is the cold call's CPU time (all threads of the process), which
other work on a shared machine disturbs less than the wall time.
The peers' parameters are made with numpy outside the timing; flowjit's first
call also traces the job and compiles and runs its initializer job.

flowjit's split comes from FLOWJIT_DEBUG=1's stage lines, summed over the
init job and the train job: passes (autodiff, the pass pipeline), fusion,
llvm emit, llvm optimize, llvm codegen (CPU time summed over the compile
threads), load, disk cache (lookup and store); "trace" is the tracing of the
job function, "jobs total" both jobs' compile_job wall time and "other" the
rest of the first call (running the init job and the step, Python glue).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

ROOT = C.ROOT
BATCH, IN, HIDDEN, OUT, LR = 100, 784, 512, 10, 0.1
STAGES = ("passes", "fusion", "llvm emit", "llvm optimize", "llvm codegen", "load", "disk cache")


def _cpu():
    """CPU seconds of this process so far, all threads (less disturbed by other
    processes on a shared machine than the wall time)."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _data():
    import numpy as np
    rng = np.random.default_rng(0)
    images = rng.random((BATCH, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, OUT, BATCH).astype(np.int32)
    return images, labels


def _params(extra):
    import numpy as np
    rng = np.random.default_rng(1)
    dims = [IN] + [HIDDEN] * (1 + extra) + [OUT]
    out = []
    for a, b in zip(dims[:-1], dims[1:]):
        out.append(np.clip(rng.standard_normal((a, b)) * 0.1, -0.2, 0.2).astype(np.float32))
        out.append(np.zeros(b, np.float32))
    return out


# ---------------------------------------------------------------- children

def child_flowjit(extra):
    import importlib.util
    t0 = time.perf_counter()
    import flowjit as flow
    import flowjit.typing as tp
    t_import = time.perf_counter() - t0
    if extra == 0:
        spec = importlib.util.spec_from_file_location("fj_bench_train_mnist",
                                                      os.path.join(ROOT, "examples", "train_mnist.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        job = mod.train_job
    else:
        config = flow.function_config()
        config.default_data_type(flow.float)

        @flow.global_function(type="train", function_config=config)
        def train_deep(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                       labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
            init = flow.truncated_normal(0.1)
            h = flow.reshape(images, [images.shape[0], -1])
            h = flow.layers.dense(h, HIDDEN, activation=flow.nn.relu, kernel_initializer=init,
                                  name="hidden")
            for i in range(extra):
                h = flow.layers.dense(h, HIDDEN, activation=flow.nn.relu, kernel_initializer=init,
                                      name=f"hidden{i + 1}")
            logits = flow.layers.dense(h, OUT, kernel_initializer=init, name="output")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="loss")
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]),
                               momentum=0).minimize(loss)
            return loss

        job = train_deep
    images, labels = _data()
    c1, t1 = _cpu(), time.perf_counter()
    job(images, labels)
    first = time.perf_counter() - t1
    cpu = _cpu() - c1
    compiled = job.compiled_jobs()[0]
    trace = sum(st.dur_ns for st in compiled.stages if st.name == "trace") / 1e9
    return {"import": t_import, "first": first, "cpu": cpu, "from_disk": compiled.from_disk_cache,
            "kernels": compiled.num_kernels, "trace": trace}


def child_jax(extra):
    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp
    t_import = time.perf_counter() - t0
    cache = os.environ.get("FJ_BENCH_CACHE")
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    def loss_fn(params, x, y):
        h = x
        for i in range(0, len(params) - 2, 2):
            h = jax.nn.relu(h @ params[i] + params[i + 1])
        logits = h @ params[-2] + params[-1]
        logp = jax.nn.log_softmax(logits)
        loss = -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
        return loss.mean(), loss

    def step(params, x, y):
        (_, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
        return [p - LR * g for p, g in zip(params, grads)], loss

    images, labels = _data()
    params = [jax.device_put(p) for p in _params(extra)]
    x, y = jax.device_put(images.reshape(BATCH, -1)), jax.device_put(labels)
    jstep = jax.jit(step, donate_argnums=0)
    c1, t1 = _cpu(), time.perf_counter()
    params, loss = jstep(params, x, y)
    loss.block_until_ready()
    first = time.perf_counter() - t1
    cpu = _cpu() - c1
    return {"import": t_import, "first": first, "cpu": cpu}


def child_torch(extra):
    t0 = time.perf_counter()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    t_import = time.perf_counter() - t0
    import logging
    logging.getLogger("torch").setLevel(logging.ERROR)
    layers = []
    ps = _params(extra)
    for i in range(0, len(ps), 2):
        lin = nn.Linear(ps[i].shape[0], ps[i].shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(ps[i].T.copy()))
            lin.bias.zero_()
        layers += [lin, nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0)
    images, labels = _data()
    x, y = torch.from_numpy(images.reshape(BATCH, -1)), torch.from_numpy(labels).long()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y, reduction="mean")
        loss.backward()
        opt.step()
        return loss.detach()

    cstep = torch.compile(step)
    c1, t1 = _cpu(), time.perf_counter()
    cstep(x, y)
    first = time.perf_counter() - t1
    cpu = _cpu() - c1
    return {"import": t_import, "first": first, "cpu": cpu}


_STAGE_RE = re.compile(r"^\[flowjit\] (\S+): (.+?)\s+([0-9.]+) ms")


def _split(stderr):
    """Sums FLOWJIT_DEBUG=1's stage lines into STAGES (seconds), plus per-job totals."""
    out = {s: 0.0 for s in STAGES}
    total = 0.0
    for line in stderr.splitlines():
        m = _STAGE_RE.match(line)
        if not m:
            continue
        stage, ms = m.group(2).strip(), float(m.group(3)) / 1e3
        if stage == "total":
            total += ms
        elif stage.startswith("pass ") or stage in ("autodiff+optimizer", "distribute"):
            out["passes"] += ms
        elif stage.startswith("fusion"):
            out["fusion"] += ms
        elif stage.startswith("disk cache"):
            out["disk cache"] += ms
        elif stage in out:
            out[stage] += ms
    out["jobs total"] = total
    return out


def run_child(impl, extra, cache_dir):
    env = dict(os.environ)
    for k in ("FLOWJIT_DISABLE_CACHE", "FLOWJIT_DEBUG", "FLOWJIT_DUMP_DIR", "FLOWJIT_KEEP_TEXT"):
        env.pop(k, None)
    env["FLOWJIT_CACHE_DIR"] = os.path.join(cache_dir, "flowjit")
    env["FJ_BENCH_CACHE"] = os.path.join(cache_dir, impl)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
    if impl == "flowjit":
        env["FLOWJIT_DEBUG"] = "1"
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", impl, "--extra", str(extra)],
                       env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{impl} child failed: {p.stderr.strip().splitlines()[-1:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if impl == "flowjit":
        r["split"] = _split(p.stderr)
        r["split"]["trace"] = r["trace"]
        r["split"]["other"] = max(0.0, r["first"] - r["trace"] - r["split"]["jobs total"])
    return r


def _have(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


def run(repeat=3, extras=(0, 4, 8), torch_too=True, growth=None):
    """Rows of first-call seconds (cold, warm) per model and implementation; `growth`
    (a dict), when given, receives each implementation's cold growth per extra layer
    as a fraction of the next-to-last model's time."""
    C.print_load("(compile)")
    impls = ["flowjit"]
    skipped = {}  # label -> why
    for name, label in (("jax", "jax.jit"), ("torch", "torch.compile")):
        if name == "torch" and not torch_too:
            continue
        if name == "torch" and _have(name) and C.torch_compile_failure():
            skipped[label] = C.torch_compile_failure()
        elif _have(name):
            impls.append(name)
        else:
            print(f"# SKIP {label}: {name} is not installed (pip install {name})", flush=True)
            skipped[label] = "not installed"
    label = {"flowjit": "flowjit", "jax": "jax.jit", "torch": "torch.compile"}
    res = {}  # (extra, impl, phase) -> [seconds]
    splits = {}  # (extra, phase) -> [split]
    kernels = {}
    for _ in range(repeat):
        for extra in extras:
            for impl in impls:  # interleaved: load that comes and goes hits every column alike
                with tempfile.TemporaryDirectory(prefix="fj-bench-compile-") as d:
                    for phase in ("cold", "warm"):
                        r = run_child(impl, extra, d)
                        if impl == "flowjit":
                            assert r["from_disk"] == (phase == "warm"), (phase, r)
                            splits.setdefault((extra, phase), []).append(r["split"])
                            kernels[extra] = r["kernels"]
                        res.setdefault((extra, impl, phase), []).append(r["first"])
                        res.setdefault((extra, impl, phase + " cpu"), []).append(r["cpu"])
    rows = []
    for extra in extras:
        case = "seed 784-512-10" if extra == 0 else f"mlp +{extra}x512"
        for phase in ("cold", "warm", "cold cpu"):
            for impl in impls:
                v = res[(extra, impl, phase)]
                note = f"{kernels[extra]} kernels" if impl == "flowjit" else ""
                rows.append(C.row("compile", f"{case} {phase}", label[impl], min(v) * 1e3,
                                  statistics.median(v) * 1e3, "ms", note))
            for s, why in skipped.items():
                rows.append(C.skipped("compile", f"{case} {phase}", s, why))
    print_split(splits, extras)
    cold = {e: statistics.median(res[(e, "flowjit", "cold")]) for e in extras}
    if len(extras) >= 2:
        a, b = extras[-2], extras[-1]
        per = (cold[b] - cold[a]) / (b - a)
        print(f"# flowjit cold first call grows {per * 1e3:.0f} ms per extra 512x512 layer "
              f"({100 * per / cold[a]:.1f}% of the +{a} model's {cold[a] * 1e3:.0f} ms)")
        if growth is not None:
            growth["flowjit"] = per / cold[a]
        for impl in impls[1:]:
            ca = statistics.median(res[(a, impl, "cold")])
            cb = statistics.median(res[(b, impl, "cold")])
            print(f"# {label[impl]} cold first call grows {(cb - ca) / (b - a) * 1e3:.0f} ms per extra layer")
    C.print_load("(compile, after)")
    return rows


def print_split(splits, extras):
    cols = ["trace"] + list(STAGES) + ["jobs total", "other"]
    print("\n== flowjit first-call split (median ms over repeats; init job + train job; llvm "
          "stages are CPU ms summed over the compile threads, the rest wall ms)")
    print(f"{'case':22}" + "".join(f"{c:>14}" for c in cols))
    for extra in extras:
        for phase in ("cold", "warm"):
            v = splits.get((extra, phase))
            if not v:
                continue
            case = ("seed" if extra == 0 else f"+{extra}x512") + f" {phase}"
            print(f"{case:22}" + "".join(f"{statistics.median(s[c] for s in v) * 1e3:14.1f}"
                                         for c in cols))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="fresh-process measurements per cell")
    ap.add_argument("--extra", default="0,4,8", help="extra 512x512 hidden layers, comma-separated")
    ap.add_argument("--no-torch", action="store_true", help="skip torch.compile (slow to compile)")
    ap.add_argument("--child", choices=("flowjit", "jax", "torch"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    extras = tuple(int(x) for x in args.extra.split(","))
    if args.child:
        fn = {"flowjit": child_flowjit, "jax": child_jax, "torch": child_torch}[args.child]
        print(json.dumps(fn(extras[0])))
        return
    C.fair_env()
    C.header()
    print(f"# host: {C.host_kind()}")
    C.print_rows(run(args.repeat, extras, not args.no_torch),
                 f"first call of a train job, ms (best and median of {args.repeat} fresh processes)")


if __name__ == "__main__":
    main()
