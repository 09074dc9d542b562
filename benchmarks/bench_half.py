"""Half precision ([amp]): bfloat16/float16 matmul GFLOP/s and the seed MLP's
train step with automatic mixed precision, against flowjit's own float32 and
PyTorch (bfloat16 matmul; torch.autocast("cpu", dtype=torch.bfloat16)) in
the same run.

Which kernels flowjit's half types get depends on the host: this line of the
header says it. bfloat16 matmuls run on a vdpbf16ps micro-kernel where the
CPU has AVX512-BF16; elsewhere (and for float16, which has no CPU
micro-kernel) flowjit widens the operands to float32 around its float32
kernel, so those figures measure that fallback, not half arithmetic.

    python benchmarks/bench_half.py
"""
import numpy as np

import _common as C
import bench_train_step as T

CASES = [("1024^3 a@b", 1024, 1024, 1024), ("fwd1 100x784x512", 100, 512, 784)]


def _half_support():
    from flowjit import _C
    b = _C.build_info()
    feats = set(b.get("target", "").split(";")[2].split(",")) if b.get("target") else set()
    have = [f for f in ("+avx512bf16", "+amx-bf16", "+avx512fp16", "+f16c") if f in feats]
    kernel = ("bfloat16 on the vdpbf16ps micro-kernel (float32 sums), float16 as float32 behind "
              "conversions" if b.get("bf16_matmuls") else
              "float32 kernel behind conversions (no bfloat16 dot-product instructions)")
    return ("host has " + (", ".join(h.lstrip("+") for h in have) or "no half-precision instructions")
            + "; flowjit's half matmul: " + kernel)


def _matmul_job(name, m, n, k, dt):
    import flowjit as flow
    import flowjit.typing as tp

    def mm(a, b):
        return flow.matmul(a, b)

    mm.__name__ = name
    mm.__annotations__ = {"a": tp.Numpy.Placeholder((m, k), dtype=dt),
                          "b": tp.Numpy.Placeholder((k, n), dtype=dt), "return": tp.Numpy}
    return flow.global_function(type="predict")(mm)


def run_matmul(torch, nthreads):
    import ml_dtypes

    import flowjit as flow
    rows = []
    rng = np.random.default_rng(0)
    for i, (case, m, n, k) in enumerate(CASES):
        flops = 2.0 * m * n * k
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        fns = {}
        for tag, dt, npd in (("flowjit f32", flow.float32, np.float32),
                             ("flowjit bf16", flow.bfloat16, ml_dtypes.bfloat16),
                             ("flowjit f16", flow.float16, np.float16)):
            job = _matmul_job(f"bench_half_{i}_{tag.split()[1]}", m, n, k, dt)
            ah, bh = a.astype(npd), b.astype(npd)
            job(ah, bh)
            fns[tag] = (lambda j, x, y: lambda: j(x, y))(job, ah, bh)
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            fns["torch f32"] = lambda: torch.matmul(ta, tb)
            ta16, tb16 = ta.bfloat16(), tb.bfloat16()
            fns["torch bf16"] = lambda: torch.matmul(ta16, tb16)
        times = C.interleaved(fns)
        for impl, (best, med) in times.items():
            rows.append(C.row("half matmul", case, impl, flops / best / 1e9, flops / med / 1e9, "GFLOP/s"))
        if torch is None:
            rows.append(C.skipped("half matmul", case, "torch bf16", "torch is not installed"))
    return rows


def _seed_train_job(amp):
    import flowjit as flow
    import flowjit.typing as tp
    flow.clear_default_session()
    cfg = flow.function_config()
    if amp is not None:
        cfg.enable_auto_mixed_precision(True, dtype=amp)

    def train(images, labels):
        init = flow.truncated_normal(0.1)
        r = flow.reshape(images, [T.BATCH, -1])
        h = flow.layers.dense(r, T.HIDDEN, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
        logits = flow.layers.dense(h, T.OUT, kernel_initializer=init, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [T.LR]), momentum=0).minimize(loss)
        return loss

    train.__name__ = f"bench_half_seed_{'f32' if amp is None else amp.name}"
    train.__annotations__ = {"images": tp.Numpy.Placeholder((T.BATCH, 1, 28, 28)),
                             "labels": tp.Numpy.Placeholder((T.BATCH,), dtype=flow.int32), "return": tp.Numpy}
    return flow.global_function(type="train", function_config=cfg)(train)


def run_train(torch, nthreads):
    import flowjit as flow
    images, labels = T._data()
    rows, fns = [], {}
    # One job at a time: each clears the session (its variables are its own).
    for tag, amp in (("flowjit f32", None), ("flowjit AMP bf16", flow.bfloat16)):
        job = _seed_train_job(amp)
        job(images, labels)
        (best, med), = C.interleaved({tag: lambda: job(images, labels)}).values()
        rows.append(C.row("half train step", "seed MLP step", tag, best * 1e3, med * 1e3, "ms"))
    if torch is not None:
        model, opt = T._torch_setup(torch, nthreads)
        step = T._torch_step_fn(torch, model, opt)
        x = torch.from_numpy(images.reshape(T.BATCH, -1))
        y = torch.from_numpy(labels.astype(np.int64))

        def autocast_step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return step(x, y)

        fns = {"torch f32": lambda: step(x, y), "torch autocast bf16": autocast_step}
        for impl, (best, med) in C.interleaved(fns).items():
            rows.append(C.row("half train step", "seed MLP step", impl, best * 1e3, med * 1e3, "ms"))
    return rows


def run_lenet(torch, nthreads):
    """examples/lenet_train.py's step (Adam, b100): float32 and AMP bfloat16,
    against the same model in PyTorch in float32 and under autocast."""
    import os
    import sys

    import flowjit as flow
    sys.path.insert(0, os.path.join(C.ROOT, "examples"))
    import bench_conv
    import lenet_train as L
    rng = np.random.default_rng(0)
    xi = rng.standard_normal((L.BATCH_SIZE, 1, 28, 28)).astype(np.float32)
    li = rng.integers(0, 10, L.BATCH_SIZE).astype(np.int32)
    case = f"lenet step b{L.BATCH_SIZE} (adam)"
    rows = []
    for tag, amp in (("flowjit f32", None), ("flowjit AMP bf16", "bfloat16")):
        flow.clear_default_session()
        job = L.define_jobs("adam", amp=amp)
        job(xi, li)
        (best, med), = C.interleaved({tag: lambda: job(xi, li)}).values()
        rows.append(C.row("half train step", case, tag, best * 1e3, med * 1e3, "ms"))
    flow.clear_default_session()
    if torch is not None:
        for name, step in bench_conv.torch_lenet_steps(torch, xi, li):
            def autocast_step(step=step):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return step()
            for impl, (best, med) in C.interleaved({f"{name} f32": step,
                                                    f"{name} autocast bf16": autocast_step}).items():
                rows.append(C.row("half train step", case, impl, best * 1e3, med * 1e3, "ms"))
    return rows


def run():
    C.print_load("(half)")
    from flowjit import _C
    nthreads = _C.num_threads()
    print(f"# {_half_support()}")
    torch = C.peer("torch")
    if torch is not None:
        torch.set_num_threads(nthreads)
        print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")
    return run_matmul(torch, nthreads) + run_train(torch, nthreads) + run_lenet(torch, nthreads)


if __name__ == "__main__":
    C.fair_env()
    C.header()
    C.print_rows(run(), "half precision (best and median of 7 repetitions after warm-up)")
