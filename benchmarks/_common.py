"""Shared helpers of the benchmark scripts (timing, machine facts, peers).

Benchmarks are run by hand (``python benchmarks/run_all.py`` or one script
alone), never by CI or pytest.
"""
import importlib
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prefer_this_checkout():
    """Benchmarks measure the flowjit of the checkout they are in: when its
    python/flowjit has a built _C, it goes first on sys.path (ahead of an
    editable install that may point at another clone)."""
    import glob
    pkg = os.path.join(ROOT, "python")
    if glob.glob(os.path.join(pkg, "flowjit", "_C*.so")) and pkg not in sys.path:
        sys.path.insert(0, pkg)


_prefer_this_checkout()

# Environment variables that pin OpenBLAS to a core type or cache size. They may
# be set on the team's machines for reproducible tests; for a fair numpy figure
# the benchmark process runs without them (see fair_env()).
_OPENBLAS_PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# FLOWJIT_CPU values that mean an AVX2+FMA target, and the switches that hold
# the peers to the same instructions: OpenBLAS's Haswell kernels, MKL and
# PyTorch's ATen at AVX2 (XLA gets --xla_cpu_max_isa=AVX2).
_AVX2_CPUS = ("x86-64-v3", "haswell", "broadwell", "skylake", "znver1", "znver2", "znver3")
_AVX2_PEERS = {"OPENBLAS_CORETYPE": "Haswell", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
               "ATEN_CPU_CAPABILITY": "avx2"}


def fair_env():
    """Re-executes this process without the OpenBLAS pinning variables, once.

    Call it first in a script's __main__ block. The variables are removed for
    the benchmark process only; the caller's shell is unchanged. With
    FLOWJIT_CPU=x86-64-v3 (an AVX2 target on a bigger host) the peers are
    held to AVX2 instead (see _AVX2_PEERS).
    """
    peers_avx2 = os.environ.get("FLOWJIT_CPU", "") in _AVX2_CPUS
    found = {k: os.environ[k] for k in _OPENBLAS_PINS if k in os.environ}
    if peers_avx2 and not os.environ.get("FLOWJIT_BENCH_REEXEC"):
        # flowjit generates AVX2 code (FLOWJIT_CPU): the peers are held to AVX2
        # as well, so the run measures what an AVX2+FMA host would see.
        env = {k: v for k, v in os.environ.items() if k not in _OPENBLAS_PINS}
        env.update(_AVX2_PEERS)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX2").strip()
        env["FLOWJIT_BENCH_REEXEC"] = "peers held to AVX2: " + " ".join(
            f"{k}={v}" for k, v in sorted(_AVX2_PEERS.items()))
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    if found and not os.environ.get("FLOWJIT_BENCH_REEXEC"):
        env = {k: v for k, v in os.environ.items() if k not in _OPENBLAS_PINS}
        env["FLOWJIT_BENCH_REEXEC"] = ",".join(f"{k}={v}" for k, v in found.items())
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    removed = os.environ.get("FLOWJIT_BENCH_REEXEC")
    if removed:
        print(f"# removed for this benchmark process: {removed}")


def openblas_info():
    """'<kernel> (<version>, <n> threads)' of numpy's BLAS, from threadpoolctl."""
    try:
        import threadpoolctl
    except ImportError:
        return "unknown (threadpoolctl is not installed: pip install threadpoolctl)"
    import numpy  # noqa: F401 - loads the BLAS that threadpoolctl inspects
    infos = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    if not infos:
        return "no BLAS found by threadpoolctl"
    i = infos[0]
    return (f"{i.get('internal_api')} {i.get('version')} kernel {i.get('architecture')}, "
            f"{i.get('num_threads')} threads")


def blas_threads(n):
    """A context manager limiting numpy's BLAS to n threads (no-op without threadpoolctl)."""
    try:
        import threadpoolctl
        return threadpoolctl.threadpool_limits(limits=n, user_api="blas")
    except ImportError:
        import contextlib
        return contextlib.nullcontext()


def load_average():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def cpu_busy(seconds=1.0):
    """Fraction of all CPUs busy (any process) over the next `seconds`, from /proc/stat."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v), idle
    try:
        t0, i0 = snap()
        time.sleep(seconds)
        t1, i1 = snap()
    except OSError:
        return float("nan")
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_for_quiet(max_busy=0.25, max_wait_s=0.0):
    """Waits (up to max_wait_s) until the CPUs are at most max_busy busy for a
    second before a measurement; returns the last busy fraction seen."""
    deadline = time.time() + max_wait_s
    busy = cpu_busy()
    while busy > max_busy and time.time() < deadline:
        print(f"# waiting for a quiet machine: CPUs {100 * busy:.0f}% busy", flush=True)
        time.sleep(5)
        busy = cpu_busy()
    return busy


def print_load(tag=""):
    la = load_average()
    ncpu = os.cpu_count() or 1
    busy = cpu_busy(0.5)
    msg = (f"# load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} ({ncpu} cpus), CPUs {100 * busy:.0f}% busy "
           f"over the last 0.5 s{' ' + tag if tag else ''}")
    if la[0] > 0.5 * ncpu or busy > 0.3:
        msg += "  <- HIGH: other work is running; the figures may be disturbed, re-run later"
    print(msg, flush=True)
    return la


def machine():
    """Model name, cores, AVX-512 and date, from lscpu."""
    model, cores, flags = platform.processor() or "?", str(os.cpu_count()), ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        model = fields.get("Model name", model)
        cores = fields.get("CPU(s)", cores)
        flags = fields.get("Flags", "")
    except (OSError, subprocess.SubprocessError):
        pass
    avx512 = sorted(f for f in flags.split() if f.startswith("avx512"))
    return {"model": model, "cpus": cores, "avx512": " ".join(avx512) or "none",
            "date": time.strftime("%Y-%m-%d %H:%M %Z")}


def flowjit_build():
    """'flowjit <version> build <id> from <path> (git <rev>), LLVM <v>, target, threads'."""
    import flowjit
    from flowjit import _C
    if os.environ.get("FLOWJIT_BENCH_THREADS"):  # every implementation gets this many threads
        _C.set_num_threads(int(os.environ["FLOWJIT_BENCH_THREADS"]))
    b = _C.build_info()
    where = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(flowjit.__file__))))
    rev = "?"
    try:
        out = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        rev = (out.stdout.strip() or "?") + ("+local changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    cpu = b.get("target", "").split(";")
    return (f"flowjit {b.get('version')} build {b.get('build_id')} from {where} (git {rev}), "
            f"LLVM {b.get('llvm_version')}, target {cpu[1] if len(cpu) > 1 else '?'} "
            f"({b.get('vector_bits')}-bit vectors), {_C.num_threads()} threads")


def header():
    """Prints the machine, the flowjit build and numpy's BLAS; returns machine()."""
    m = machine()
    print(f"# {m['model']}, {m['cpus']} cpus, AVX-512: {m['avx512']}")
    print(f"# {m['date']}, python {sys.version.split()[0]}")
    print(f"# {flowjit_build()}")
    import numpy
    print(f"# numpy {numpy.__version__}: {openblas_info()}", flush=True)
    if clock_note():
        print(clock_note(), flush=True)
    return m


def host_kind():
    """'<isa>, <n>-bit vectors, <cpu>, <k> cores' of the target flowjit generates code for
    (FLOWJIT_CPU, when set, replaces the host's CPU)."""
    import os as _os
    from flowjit import _C
    b = _C.build_info()
    parts = b.get("target", "").split(";")
    feats = set(parts[2].split(",")) if len(parts) > 2 else set()
    isa = ("AVX-512" if "+avx512f" in feats else "AVX2+FMA" if {"+avx2", "+fma"} <= feats
           else "AVX2" if "+avx2" in feats else "baseline x86-64 (no FMA)" if "+fma" not in feats
           else "SSE+FMA")
    cpu = parts[1] if len(parts) > 1 else "?"
    return f"{isa}, {b.get('vector_bits')}-bit vectors, cpu {cpu}, {_os.cpu_count()} cores"


def peer(name):
    """Imports an optional peer (torch, jax); None with a printed line when absent."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # ImportError, or a broken install raising something else
        print(f"# SKIP {name}: not installed or not importable ({type(e).__name__}: {e}); "
              f"install it with `pip install {name}{' jaxlib' if name == 'jax' else ''}` "
              "to get its figures", flush=True)
        return None


# FLOWJIT_BENCH_CLOCK=cpu times with the process's CPU time instead of the wall
# clock: on a machine whose cores other work shares, time spent preempted is
# then not counted. Use it with FLOWJIT_BENCH_THREADS=1 (every implementation on
# one thread; with more, CPU time adds the threads up and counts a peer's
# spinning workers).
_clock = time.process_time if os.environ.get("FLOWJIT_BENCH_CLOCK") == "cpu" else time.perf_counter


def clock_note():
    """'' or the line saying which clock and thread count the run used."""
    if os.environ.get("FLOWJIT_BENCH_CLOCK") != "cpu" and not os.environ.get("FLOWJIT_BENCH_THREADS"):
        return ""
    return (f"# clock: {'process CPU time' if _clock is time.process_time else 'wall'}; "
            f"FLOWJIT_BENCH_THREADS={os.environ.get('FLOWJIT_BENCH_THREADS', '(default)')}")


def timeit(fn, *, warmup=3, reps=7, target_s=0.08, max_inner=100000, sync=None):
    """Times fn(); returns (best, median) seconds per call.

    Runs `warmup` calls, picks an inner count so one repetition lasts about
    target_s, then times `reps` repetitions of that many calls. `sync`, if
    given, is called after each repetition's calls (e.g. JAX's block).
    """
    for _ in range(warmup):
        r = fn()
    if sync is not None:
        sync(r)
    t0 = _clock()
    r = fn()
    if sync is not None:
        sync(r)
    one = max(_clock() - t0, 1e-7)
    inner = int(min(max_inner, max(1, target_s / one)))
    samples = []
    for _ in range(reps):
        t0 = _clock()
        for _ in range(inner):
            r = fn()
        if sync is not None:
            sync(r)
        samples.append((_clock() - t0) / inner)
    return min(samples), statistics.median(samples)


def interleaved(fns, *, warmup=3, reps=7, target_s=0.08, max_inner=100000, syncs=None, inner=None,
                cooldown_s=0.2):
    """Times several implementations of one case, interleaved; returns
    {name: (best, median)} seconds per call.

    Each fn gets `warmup` calls and an inner count so one repetition lasts
    about target_s; then `reps` rounds each time one repetition of every fn,
    in an order rotated per round. On a shared machine, load that comes and
    goes then hits every implementation alike instead of whichever happened
    to run at the wrong moment. syncs: optional {name: sync(result)}; inner:
    a fixed count of calls per repetition instead of the calibrated one.

    cooldown_s: a pause before each repetition. OpenBLAS's and OpenMP's
    worker threads keep spinning for ~0.1 s after a call returns; without the
    pause they take a core from whichever implementation runs next (on 2
    cores that halved flowjit's 1024^3 matmul right after numpy's).
    """
    syncs = syncs or {}
    names = list(fns)
    fixed, inner = inner, {}
    for name in names:
        fn, sync = fns[name], syncs.get(name)
        for _ in range(warmup):
            r = fn()
        if sync is not None:
            sync(r)
        t0 = _clock()
        r = fn()
        if sync is not None:
            sync(r)
        one = max(_clock() - t0, 1e-7)
        inner[name] = fixed or int(min(max_inner, max(1, target_s / one)))
    samples = {name: [] for name in names}
    for k in range(reps):
        order = names[k % len(names):] + names[:k % len(names)]
        for name in order:
            fn, sync, n = fns[name], syncs.get(name), inner[name]
            if cooldown_s:
                time.sleep(cooldown_s)
            t0 = _clock()
            for _ in range(n):
                r = fn()
            if sync is not None:
                sync(r)
            samples[name].append((_clock() - t0) / n)
    return {name: (min(v), statistics.median(v)) for name, v in samples.items()}


def row(bench, case, impl, best, median, unit, note="", **extra):
    d = {"bench": bench, "case": case, "impl": impl, "best": best, "median": median,
         "unit": unit, "note": note}
    d.update(extra)
    return d


def skipped(bench, case, impl, why):
    return {"bench": bench, "case": case, "impl": impl, "best": None, "median": None,
            "unit": "", "note": f"SKIPPED: {why}"}


def fmt(v):
    if v is None:
        return "-"
    if v == 0 or abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


HIGHER_IS_BETTER = {"GFLOP/s": True, "GB/s": True, "ms/step": False, "us/call": False, "ms": False}


def speedups(rows):
    """Adds 'speedup' to each row: how many times faster flowjit is than that
    row's implementation on the same case, from the best figures (> 1: flowjit
    is faster; < 1: the peer is faster)."""
    fj = {(r["bench"], r["case"]): r["best"] for r in rows if r["impl"] == "flowjit"}
    for r in rows:
        f = fj.get((r["bench"], r["case"]))
        if r["impl"] == "flowjit" or f is None or not r["best"] or r["unit"] not in HIGHER_IS_BETTER:
            r.setdefault("speedup", None)
            continue
        r["speedup"] = f / r["best"] if HIGHER_IS_BETTER[r["unit"]] else r["best"] / f
    return rows


def print_rows(rows, title=None):
    """One aligned table of rows, with flowjit's speedup over each peer."""
    speedups(rows)
    if title:
        print(f"\n== {title}")
    head = ("bench", "case", "impl", "best", "median", "unit", "flowjit x", "note")
    cells = [[r["bench"], r["case"], r["impl"], fmt(r["best"]), fmt(r["median"]), r["unit"],
              "" if r.get("speedup") is None else f"{r['speedup']:.2f}", r["note"]]
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(head)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()
    print(line)
    print("-" * len(line))
    for c in cells:
        print("  ".join(str(x).ljust(w) for x, w in zip(c, widths)).rstrip())
    print("(flowjit x: flowjit's speedup over that row on the same case, from the best figures; "
          "> 1 means flowjit is faster)")
    sys.stdout.flush()


def markdown(rows, machine_info, title="Current results"):
    """The rows as the markdown section benchmarks/README.md keeps per host
    kind: a heading naming the host kind, a line with the host, date,
    flowjit build (commit) and load, then one table (`run_all.py --markdown`)."""
    speedups(rows)
    out = [f"## {title}: {host_kind()}", "",
           f"{machine_info['model']}, {machine_info['cpus']} CPUs, AVX-512: {machine_info['avx512']}; "
           f"{machine_info['date']}; {re.sub(r' from .*? [(]git', ' (git', flowjit_build())}; "
           f"load average {load_average()[0]:.2f} at the end.",
           "", "| bench | case | impl | best | median | unit | flowjit x | note |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = "" if r.get("speedup") is None else f"{r['speedup']:.2f}"
        note = str(r["note"]).replace("|", "\\|")
        out.append(f"| {r['bench']} | {r['case']} | {r['impl']} | {fmt(r['best'])} | {fmt(r['median'])} | "
                   f"{r['unit']} | {sp} | {note} |")
    return "\n".join(out) + "\n"


# A small train step through torch.compile, run in a child process: inductor's
# generated code can corrupt the heap on some hosts (seen with torch 2.15 on an
# AVX-512 Xeon: "malloc(): unaligned tcache chunk detected"), which would abort
# the whole benchmark rather than raise.
_TORCH_COMPILE_PROBE = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))  # the seed MLP
opt = torch.optim.SGD(m.parameters(), lr=0.1)
def step(x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    return loss.detach()
c = torch.compile(step)
x, y = torch.randn(100, 784), torch.randint(0, 10, (100,))
for _ in range(3):
    float(c(x, y))
"""
_torch_compile_verdict = {}


def torch_compile_failure(timeout=600):
    """None when torch.compile survives a small train step in a child process
    (with this process's environment), else a one-line reason. Computed once."""
    if "why" in _torch_compile_verdict:
        return _torch_compile_verdict["why"]
    try:
        p = subprocess.run([sys.executable, "-c", _TORCH_COMPILE_PROBE], capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode == 0:
            why = None
        elif p.returncode < 0:
            import signal
            tail = (p.stderr.strip().splitlines() or [""])[-1][:80]
            why = (f"a probe train step crashed ({signal.Signals(-p.returncode).name}: {tail}); "
                   "ATEN_CPU_CAPABILITY=avx2 may avoid it")
        else:
            why = f"a probe train step failed: {(p.stderr.strip().splitlines() or [''])[-1][:120]}"
    except subprocess.TimeoutExpired:
        why = f"a probe train step took more than {timeout} s"
    if why:
        print(f"# SKIP torch.compile: {why}", flush=True)
    _torch_compile_verdict["why"] = why
    return why
