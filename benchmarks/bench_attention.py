"""ms per forward + backward of causal self-attention: flowjit's attention
family (online softmax, codegen/families/attention) against flowjit's
unfused matmul-softmax-matmul, PyTorch's scaled_dot_product_attention (its
CPU flash kernel) and PyTorch eager unfused, on [groups, T, D] operands.

Every implementation computes sum(attention(q * w, q * w, q * w)) and its
gradient with respect to w (one SGD step at learning rate 0 for flowjit),
float32. flowjit's two rows are the same job with FLOWJIT_FUSE_ATTENTION=1
and =0; the =0 row ("flowjit") is what the default does at these sizes
(jit/passes/attention.h fuses only score matrices of 256 MiB and more). The
note gives the kernels per step and the bytes of one score matrix. With
--dropout P the probabilities are dropped out (flow.nn.dropout, which the
family draws in its kernels; PyTorch's dropout_p and F.dropout).

    python benchmarks/bench_attention.py [--cases 128x128x32,16x512x64,2x2048x64] [--dropout 0.1]
"""
import argparse
import math
import os

import numpy as np

import _common as C


def _flowjit_step(flow, tp, G, T, D, fuse, dropout):
    os.environ["FLOWJIT_FUSE_ATTENTION"] = "1" if fuse else "0"

    @flow.global_function(type="train")
    def step(x: tp.Numpy.Placeholder((G, T, D))) -> tp.Numpy:
        w = flow.get_variable(f"w{int(fuse)}_{G}_{T}_{D}", (D,), initializer=flow.ones_initializer())
        q = x * w
        s = flow.math.multiply(flow.matmul(q, q, transpose_b=True), 1.0 / math.sqrt(D))
        rows = flow.reshape(flow.range(T), [T, 1])
        cols = flow.reshape(flow.range(T), [1, T])
        s = flow.math.add(s, flow.math.multiply(flow.cast(flow.math.greater(cols, rows), flow.float32), -1e9))
        p = flow.nn.softmax(s, axis=-1)
        y = flow.matmul(flow.nn.dropout(p, rate=dropout) if dropout else p, q)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(flow.math.reduce_sum(y))
        return w
    return step


def run(args):
    import flowjit as flow
    import flowjit.typing as tp
    from flowjit import _C

    C.print_load("(attention)")
    nthreads = _C.num_threads()
    torch = C.peer("torch")
    rows, skipped = [], []
    for case in args.cases.split(","):
        G, T, D = (int(v) for v in case.split("x"))
        name = f"causal g{G} t{T} d{D}" + (f" dropout {args.dropout}" if args.dropout else "")
        x = np.random.default_rng(0).standard_normal((G, T, D)).astype(np.float32)
        fns, notes = {}, {}
        for fuse in (True, False):
            job = _flowjit_step(flow, tp, G, T, D, fuse, args.dropout)
            job(x)  # trace + compile with this setting
            kernels = job.compiled_jobs()[0].as_text("kernels")
            impl = "flowjit attention family" if fuse else "flowjit"
            assert ("family attention" in kernels) == fuse, impl
            fns[impl] = (lambda j: lambda: j(x))(job)
            notes[impl] = f"{job.compiled_jobs()[0].num_kernels} kernels, scores {G * T * T * 4 >> 20} MiB"
        os.environ.pop("FLOWJIT_FUSE_ATTENTION", None)
        if torch is None:
            skipped.append(C.skipped("attention", name, "torch", "torch is not installed"))
        else:
            torch.set_num_threads(nthreads)
            xt = torch.from_numpy(x)
            w = torch.ones(D, requires_grad=True)
            F = torch.nn.functional

            def sdpa():
                q = xt * w
                F.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=args.dropout).sum().backward()
                w.grad = None

            mask = torch.ones(T, T, dtype=torch.bool).triu(1)

            def eager():
                q = xt * w
                s = (q @ q.transpose(-1, -2)) * (1.0 / math.sqrt(D))
                p = torch.softmax(s.masked_fill(mask, -1e9), -1)
                (F.dropout(p, args.dropout) @ q).sum().backward()
                w.grad = None
            fns["torch sdpa"] = sdpa
            notes["torch sdpa"] = f"torch {torch.__version__}, is_causal, {nthreads} threads"
            fns["torch eager unfused"] = eager
            notes["torch eager unfused"] = f"torch {torch.__version__}, {nthreads} threads"
        with C.blas_threads(nthreads):
            times = C.interleaved(fns, warmup=2, reps=5, target_s=0.3)
        rows += [C.row("attention", name, impl, best * 1e3, med * 1e3, "ms/step", notes[impl])
                 for impl, (best, med) in times.items()]
    C.print_load("(attention, after)")
    return rows + skipped


if __name__ == "__main__":
    C.fair_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="128x128x32,16x512x64,2x2048x64")
    ap.add_argument("--dropout", type=float, default=0.0, help="attention dropout rate (0: none)")
    a = ap.parse_args()
    C.header()
    C.print_rows(run(a), "causal attention forward + backward (best and median of 5 repetitions)")
