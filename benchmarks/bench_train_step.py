"""Time per step of the seed's train step (784-512-10 MLP, batch 100, SGD lr 0.1,
sparse cross-entropy, float32): flowjit vs hand-written numpy, PyTorch eager,
torch.compile and JAX jax.jit.

flowjit runs the real job function of examples/train_mnist.py. Every peer gets
the same batch of random data (reused every step), weights initialized with the
same scale (truncated normal, stddev 0.1; zero biases), and is warmed up
(compiled) outside the timing. Each step returns the per-sample or mean loss
to the caller, as flowjit's synchronous call does.

    python benchmarks/bench_train_step.py
"""
import functools
import importlib.util
import os
import sys

import numpy as np

import _common as C

BATCH, IN, HIDDEN, OUT, LR = 100, 784, 512, 10, 0.1
# The step's multiply-adds as flops: x @ W1^T, h @ W2^T, dL @ W2 (dH), dL^T @ h
# (dW2) and dH^T @ x (dW1); the elementwise work is below 1% of it.
STEP_FLOPS = 2 * BATCH * (2 * IN * HIDDEN + 3 * HIDDEN * OUT)
ROOT = C.ROOT


def _truncnorm(rng, shape, std=0.1):
    z = rng.standard_normal(shape)
    bad = np.abs(z) > 2
    while bad.any():
        z[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(z) > 2
    return (z * std).astype(np.float32)


def _data():
    rng = np.random.default_rng(0)
    images = rng.random((BATCH, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, OUT, BATCH).astype(np.int32)
    return images, labels


def _seed_example():
    """examples/train_mnist.py as a module (its train_job is the real seed job)."""
    path = os.path.join(ROOT, "examples", "train_mnist.py")
    spec = importlib.util.spec_from_file_location("flowjit_bench_train_mnist", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- numpy

class NumpyMLP:
    """Forward, backward and SGD update in float32 numpy, in place where it can."""

    def __init__(self, rng):
        self.w1 = _truncnorm(rng, (IN, HIDDEN))
        self.b1 = np.zeros(HIDDEN, np.float32)
        self.w2 = _truncnorm(rng, (HIDDEN, OUT))
        self.b2 = np.zeros(OUT, np.float32)
        self.rows = np.arange(BATCH)

    def step(self, x, y):
        n = x.shape[0]
        h = x @ self.w1
        h += self.b1
        np.maximum(h, 0, out=h)
        logits = h @ self.w2
        logits += self.b2
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        loss = np.log(s[:, 0]) + m[:, 0] - logits[self.rows, y]
        # d(mean loss)/d logits = (softmax - onehot) / n
        e *= 1.0 / (s * n)
        e[self.rows, y] -= np.float32(1.0 / n)
        dw2 = h.T @ e
        db2 = e.sum(axis=0)
        dh = e @ self.w2.T
        dh *= h > 0
        dw1 = x.T @ dh
        db1 = dh.sum(axis=0)
        lr = np.float32(LR)
        self.w1 -= lr * dw1
        self.b1 -= lr * db1
        self.w2 -= lr * dw2
        self.b2 -= lr * db2
        return loss


# ---------------------------------------------------------------- torch

def _torch_setup(torch, nthreads):
    import torch.nn as nn
    torch.set_num_threads(nthreads)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    with torch.no_grad():
        for layer in (model[0], model[2]):
            nn.init.trunc_normal_(layer.weight, std=0.1, a=-0.2, b=0.2)
            layer.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0)
    return model, opt


def _torch_step_fn(torch, model, opt):
    import torch.nn.functional as F

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y, reduction="mean")
        loss.backward()
        opt.step()
        return loss.detach()

    return step


# ---------------------------------------------------------------- jax

def _jax_step(jax):
    import jax.numpy as jnp

    def per_sample(params, x, y):
        w1, b1, w2, b2 = params
        h = jax.nn.relu(x @ w1 + b1)
        logits = h @ w2 + b2
        logp = jax.nn.log_softmax(logits)
        loss = -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
        return loss.mean(), loss

    def step(params, x, y):
        (_, loss), grads = jax.value_and_grad(per_sample, has_aux=True)(params, x, y)
        params = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)
        return params, loss

    return jax.jit(step, donate_argnums=0)


# ---------------------------------------------------------------- run

def run():
    from flowjit import _C
    C.print_load("(train step)")
    nthreads = _C.num_threads()
    images, labels = _data()
    x2 = np.ascontiguousarray(images.reshape(BATCH, -1))
    case = "mlp 784-512-10 b100"
    fns, syncs, notes, rows_skipped = {}, {}, {}, []

    # flowjit: the seed's own job function
    ex = _seed_example()
    loss = ex.train_job(images, labels)  # trace + compile
    jk = ex.train_job.compiled_jobs()[0]
    print(f"# flowjit train_job: {jk.num_kernels} kernels, arena {jk.arena_bytes} bytes, "
          f"{nthreads} threads, first loss {float(np.mean(loss)):.4f}")
    fns["flowjit"] = lambda: ex.train_job(images, labels)
    notes["flowjit"] = f"{jk.num_kernels} kernels, {nthreads} threads"

    # numpy
    net = NumpyMLP(np.random.default_rng(1))
    fns["numpy"] = lambda: net.step(x2, labels)
    notes["numpy"] = f"hand-written, OpenBLAS {nthreads} threads"

    # torch eager and torch.compile
    torch = C.peer("torch")
    if torch is None:
        rows_skipped.append(C.skipped("train_step", case, "torch eager", "torch is not installed"))
        rows_skipped.append(C.skipped("train_step", case, "torch.compile", "torch is not installed"))
    else:
        tx, ty = torch.from_numpy(x2), torch.from_numpy(labels).long()
        model, opt = _torch_setup(torch, nthreads)
        fns["torch eager"] = functools.partial(_torch_step_fn(torch, model, opt), tx, ty)
        notes["torch eager"] = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
        crash = C.torch_compile_failure()
        if crash:
            rows_skipped.append(C.skipped("train_step", case, "torch.compile", crash))
        else:
            try:
                import logging
                logging.getLogger("torch").setLevel(logging.ERROR)  # inductor's CUDA-not-found notes
                model2, opt2 = _torch_setup(torch, nthreads)
                cstep = torch.compile(_torch_step_fn(torch, model2, opt2))
                for _ in range(3):
                    cstep(tx, ty)  # compile (forward+backward graph, then the optimizer step)
                fns["torch.compile"] = functools.partial(cstep, tx, ty)
                notes["torch.compile"] = "inductor, default mode, whole step"
            except Exception as e:  # noqa: BLE001 - report why and go on
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
                print(f"# SKIP torch.compile: it failed on this machine: {why}")
                rows_skipped.append(C.skipped("train_step", case, "torch.compile", f"failed: {why}"))

    # jax.jit
    jax = C.peer("jax")
    if jax is None:
        rows_skipped.append(C.skipped("train_step", case, "jax.jit", "jax is not installed"))
    else:
        rng = np.random.default_rng(1)
        params = [jax.device_put(p) for p in (_truncnorm(rng, (IN, HIDDEN)), np.zeros(HIDDEN, np.float32),
                                              _truncnorm(rng, (HIDDEN, OUT)), np.zeros(OUT, np.float32))]
        jx, jy = jax.device_put(x2), jax.device_put(labels)
        jstep = _jax_step(jax)
        state = {"p": params}

        def one_synced():
            state["p"], loss = jstep(state["p"], jx, jy)
            return loss.block_until_ready()

        def one_async():
            state["p"], loss = jstep(state["p"], jx, jy)
            return loss

        one_synced()  # compile
        fns["jax.jit"] = one_synced
        notes["jax.jit"] = f"jax {jax.__version__}, loss ready each step"
        fns["jax.jit async"] = one_async
        syncs["jax.jit async"] = lambda r: r.block_until_ready()
        notes["jax.jit async"] = "no per-step sync; blocks once per repetition"

    with C.blas_threads(nthreads):
        times = C.interleaved(fns, syncs=syncs, warmup=10, reps=7, target_s=0.15)
    rows = [C.row("train_step", case, impl, best * 1e3, med * 1e3, "ms/step", notes[impl])
            for impl, (best, med) in times.items()]
    C.print_load("(train step, after)")
    return rows + rows_skipped


if __name__ == "__main__":
    C.fair_env()
    C.header()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    C.print_rows(run(), "seed train step (best and median of 7 repetitions after warm-up)")
