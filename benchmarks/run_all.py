"""Runs every benchmark in one process, prints one table with the ratios
measured in this run, and checks the [perf] issue's targets (PASS/MISS).

    python benchmarks/run_all.py        (or: tools/dev.sh bench)
    python benchmarks/run_all.py --markdown results.md   # the README's section for this host kind

Each bench_*.py also runs alone. Benchmarks are run by hand, never by CI.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402


def _find(rows, bench, case=None, impl=None):
    for r in rows:
        if r["bench"] == bench and (case is None or r["case"] == case) and (impl is None or r["impl"] == impl):
            return r
    return None


def _val(r, key="best"):
    return None if r is None else r.get(key)


def check_targets(rows):
    """[(target, status, detail)] with status PASS, MISS or SKIP."""
    out = []

    def add(name, ok, detail):
        out.append((name, "SKIP" if ok is None else ("PASS" if ok else "MISS"), detail))

    mm = "1024^3 a@b"
    fj = _val(_find(rows, "matmul", mm, "flowjit"))
    pct = _val(_find(rows, "matmul", mm, "flowjit"), "pct_peak")
    npy = _val(_find(rows, "matmul", mm, "numpy"))
    add("matmul 1024^3 >= 70% of FMA peak", None if pct is None else pct >= 70,
        f"{pct:.0f}% of peak ({fj:.0f} GFLOP/s)" if pct is not None else "no figure")
    add("matmul 1024^3 faster than numpy", None if fj is None or npy is None else fj > npy,
        f"flowjit {fj:.0f} vs numpy {npy:.0f} GFLOP/s" if fj and npy else "no figure")

    # [speed]: every matmul case ahead of numpy and torch measured in the same run.
    cases = [r["case"] for r in rows if r["bench"] == "matmul" and r["impl"] == "flowjit"]
    behind = []
    for c in cases:
        fj = _val(_find(rows, "matmul", c, "flowjit"))
        for peer in ("numpy", "torch"):
            p = _val(_find(rows, "matmul", c, peer))
            if fj and p and p >= fj:
                behind.append(f"{c}: {peer} {p:.0f} vs {fj:.0f}")
    add("matmul ahead of numpy and torch, every case", None if not cases else not behind,
        "; ".join(behind) if behind else f"{len(cases)} cases")

    case = "mlp 784-512-10 b100"
    t_fj = _val(_find(rows, "train_step", case, "flowjit"))
    t_np = _val(_find(rows, "train_step", case, "numpy"))
    add("train step >= 1.5x numpy", None if t_fj is None or t_np is None else t_np >= 1.5 * t_fj,
        f"{t_np / t_fj:.2f}x (flowjit {t_fj:.2f}, numpy {t_np:.2f} ms/step)" if t_fj and t_np else "no figure")
    peak = _val(_find(rows, "matmul", "FMA peak", "machine"))
    if t_fj and peak:
        import bench_train_step
        limit_ms = bench_train_step.STEP_FLOPS / (peak * 1e9) * 1e3
        add("train step >= 75% of its FMA-bound limit", limit_ms / t_fj >= 0.75,
            f"{100 * limit_ms / t_fj:.0f}% (limit {limit_ms:.2f} ms: "
            f"{bench_train_step.STEP_FLOPS / 1e6:.0f} MFLOP at {peak:.0f} GFLOP/s)")
    else:
        add("train step >= 75% of its FMA-bound limit", None, "no figure")
    t_torch = _val(_find(rows, "train_step", case, "torch eager"))
    jax_times = [t for t in (_val(_find(rows, "train_step", case, "jax.jit")),
                             _val(_find(rows, "train_step", case, "jax.jit async"))) if t]
    t_jax = min(jax_times) if jax_times else None
    add("train step faster than PyTorch eager", None if t_torch is None else t_fj < t_torch,
        f"flowjit {t_fj:.2f} vs torch eager {t_torch:.2f} ms/step" if t_torch else "torch not installed")
    add("train step faster than JAX jit", None if t_jax is None else t_fj < t_jax,
        f"flowjit {t_fj:.2f} vs jax.jit {t_jax:.2f} ms/step (the faster JAX variant)"
        if t_jax else "jax not installed")

    r = _find(rows, "elementwise", "chain of 8 ops, 16M", "flowjit")
    add("fused chain >= 70% of copy bandwidth",
        None if r is None else (r["pct_copy"] >= 70 and r["kernels"] == 1),
        f"{r['pct_copy']:.0f}% ({r['best']:.1f} GB/s), {r['kernels']} kernel(s)" if r else "no figure")

    r = _find(rows, "overhead", None, "flowjit")
    add("per-call overhead <= 10 us", None if r is None else r["median"] <= 10,
        f"{r['median']:.2f} us/call (median)" if r else "no figure")
    # [cnn]: the LeNet step ahead of every peer, the 3x3 conv at 70% of peak.
    step = "lenet train step b100 (adam)"
    fj = _val(_find(rows, "conv", step, "flowjit"))
    peers = [r for r in rows if r["bench"] == "conv" and r["case"] == step and r["impl"] != "flowjit" and r["best"]]
    add("LeNet train step faster than every peer", None if fj is None or not peers else
        all(fj < r["best"] for r in peers),
        ", ".join(f"{r['impl']} {r['best']:.1f} ms" for r in peers) + (f" vs flowjit {fj:.1f} ms" if fj else ""))
    for what in ("fwd", "fwd+bwd"):
        r = _find(rows, "conv", f"resnet 64->64 3x3 56x56 b8 {what}", "flowjit")
        pct = _val(r, "pct_peak")
        add(f"3x3 conv {what} >= 70% of FMA peak", None if pct is None else pct >= 70,
            "-" if pct is None else f"{pct:.0f}% of peak")
    # [speed] compile time: the seed job's cold first call, the 9-layer MLP against jax.jit,
    # and the growth per identical extra layer.
    r = _find(rows, "compile", "seed 784-512-10 cold", "flowjit")
    add("seed train job cold first call <= 0.5 s", None if r is None else r["median"] <= 500,
        f"{r['median']:.0f} ms (median)" if r else "no figure")
    fj = _find(rows, "compile", "mlp +8x512 cold", "flowjit")
    jx = _find(rows, "compile", "mlp +8x512 cold", "jax.jit")
    add("9-layer MLP cold first call <= jax.jit", None if fj is None or jx is None or jx["median"] is None
        else fj["median"] <= jx["median"],
        f"flowjit {fj['median']:.0f} vs jax.jit {jx['median']:.0f} ms" if fj and jx and jx["median"]
        else "jax not installed")
    g = COMPILE_GROWTH.get("flowjit")
    add("< 10% growth per identical extra layer", None if g is None else g < 0.10,
        "no figure" if g is None else f"{100 * g:.1f}% per layer")
    return out


COMPILE_GROWTH = {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                    help="wait up to SECONDS for a quiet machine (CPUs <= 25%% busy) before starting; "
                         "the machine is shared, and other builds disturb every figure")
    ap.add_argument("--compile-repeat", type=int, default=2, metavar="N",
                    help="fresh processes per compile-time cell (default 2)")
    ap.add_argument("--markdown", metavar="PATH",
                    help="also write the results as the markdown section benchmarks/README.md keeps for "
                         "this host kind (host, date, commit and one table) to PATH ('-': stdout)")
    args = ap.parse_args()
    C.fair_env()
    m = C.header()
    if args.wait > 0:
        C.wait_for_quiet(0.25, args.wait)
    # Model, ISA, vector width and cores in one line: the host kind every
    # figure below belongs to (FLOWJIT_CPU replaces the ISA flowjit targets).
    print(f"# host kind: {m['model']}; {C.host_kind()}", flush=True)
    la0 = C.print_load("(start)")
    import bench_compile
    import bench_conv
    import bench_elementwise
    import bench_matmul
    import bench_overhead
    import bench_train_step
    rows = []
    t0 = time.perf_counter()
    for mod in (bench_matmul, bench_train_step, bench_conv, bench_elementwise, bench_overhead):
        t = time.perf_counter()
        print(f"\n# running {mod.__name__} ...", flush=True)
        rows.extend(mod.run())
        print(f"# {mod.__name__}: {time.perf_counter() - t:.0f} s", flush=True)
    t = time.perf_counter()
    print("\n# running bench_compile ...", flush=True)
    rows.extend(bench_compile.run(repeat=args.compile_repeat, growth=COMPILE_GROWTH))
    print(f"# bench_compile: {time.perf_counter() - t:.0f} s", flush=True)
    la1 = C.print_load("(end)")
    C.print_rows(rows, f"all benchmarks ({time.perf_counter() - t0:.0f} s; load average "
                       f"{la0[0]:.2f} at start, {la1[0]:.2f} at end, {m['cpus']} cpus)")
    print("\n== targets")
    for name, status, detail in check_targets(rows):
        print(f"{status:4}  {name:40}  {detail}")
    if args.markdown:
        text = C.markdown(rows, m)
        if args.markdown == "-":
            print("\n" + text)
        else:
            with open(args.markdown, "w") as f:
                f.write(text)
            print(f"# markdown section written to {args.markdown}")


if __name__ == "__main__":
    main()
