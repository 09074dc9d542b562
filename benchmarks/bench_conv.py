"""Convolutions: GFLOP/s of the LeNet layers (batch 100) and a ResNet 3x3
64->64 convolution at 56x56 (batch 8), forward and forward+backward, and the
LeNet train step in ms; flowjit against PyTorch eager and JAX jit when they
are installed, all measured in this run, with the fraction of the FMA peak.

    python benchmarks/bench_conv.py
"""
import numpy as np

import _common as C

# (case, x shape NCHW, w shape, padding)
CASES = [
    ("lenet conv1 1->32 5x5 28x28 b100", (100, 1, 28, 28), (32, 1, 5, 5), 2),
    ("lenet conv2 32->64 5x5 14x14 b100", (100, 32, 14, 14), (64, 32, 5, 5), 2),
    ("resnet 64->64 3x3 56x56 b8", (8, 64, 56, 56), (64, 64, 3, 3), 1),
]


def conv_flops(xs, ws):
    n, _, h, w = xs
    co, cg, kh, kw = ws
    return 2.0 * n * co * cg * kh * kw * h * w  # stride 1, SAME: out = in


def flowjit_jobs(i, xs, ws, pad):
    import flowjit as flow
    import flowjit.typing as tp
    sgd0 = flow.optimizer.PiecewiseConstantScheduler([], [0.0])

    def fwd(x, w):
        return flow.nn.conv2d(x, w, 1, pad)
    fwd.__name__ = f"bench_conv_fwd_{i}"
    fwd.__annotations__ = {"x": tp.Numpy.Placeholder(xs), "w": tp.Numpy.Placeholder(ws), "return": tp.Numpy}

    def step(x, c):
        # x is a variable too (except LeNet's first layer), so both gradients run
        xv = flow.get_variable(f"x{i}", shape=xs, initializer=flow.random_normal_initializer()) if xs[1] > 1 else x
        w = flow.get_variable(f"w{i}", shape=ws, initializer=flow.random_normal_initializer())
        loss = flow.math.reduce_sum(flow.nn.conv2d(xv, w, 1, pad) * c)
        flow.optimizer.SGD(sgd0, momentum=0).minimize(loss)
        return loss
    step.__name__ = f"bench_conv_step_{i}"
    step.__annotations__ = {"x": tp.Numpy.Placeholder(xs), "c": tp.Numpy.Placeholder((xs[0], ws[0]) + xs[2:]),
                            "return": tp.Numpy}
    return flow.global_function(type="predict")(fwd), flow.global_function(type="train")(step)


def run():
    """Rows for the common table (and run_all's targets)."""
    import flowjit as flow
    from flowjit import _C
    C.print_load("(conv)")
    p = max((_C.measure_fma_peak(0.3) for _ in range(3)), key=lambda d: d["gflops_per_thread"])
    peak = p["gflops_per_thread"] * _C.num_threads()
    print(f"# FMA peak {peak:.1f} GFLOP/s ({p['lanes']} lanes, {p['accumulators']} accumulators, "
          f"{_C.num_threads()} threads)")
    torch = C.peer("torch")
    jax = C.peer("jax")
    if torch is not None:
        torch.set_num_threads(_C.num_threads())
    rng = np.random.default_rng(0)
    rows = []

    def add(case, impl, flops, times, what):
        best, med = times
        g, gm = flops / best / 1e9, flops / med / 1e9
        rows.append(C.row("conv", f"{case} {what}", impl, g, gm, "GFLOP/s", f"{100 * g / peak:.0f}% of peak",
                          pct_peak=100 * g / peak))

    for i, (case, xs, ws, pad) in enumerate(CASES):
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        c = rng.standard_normal((xs[0], ws[0]) + xs[2:]).astype(np.float32)
        f = conv_flops(xs, ws)
        fb = f * (3 if xs[1] > 1 else 2)  # forward, filter gradient, data gradient (not for 1 channel)
        fwd, step = flowjit_jobs(i, xs, ws, "SAME")
        add(case, "flowjit", f, C.timeit(lambda: fwd(x, w)), "fwd")
        add(case, "flowjit", fb, C.timeit(lambda: step(x, c)), "fwd+bwd")
        if torch is not None:
            tx, tw, tc = torch.tensor(x), torch.tensor(w, requires_grad=True), torch.tensor(c)
            txg = torch.tensor(x, requires_grad=xs[1] > 1)

            def tstep():
                y = torch.nn.functional.conv2d(txg, tw, padding=pad)
                (y * tc).sum().backward()
            with torch.no_grad():
                add(case, "torch", f, C.timeit(lambda: torch.nn.functional.conv2d(tx, tw, padding=pad)), "fwd")
            add(case, "torch", fb, C.timeit(tstep), "fwd+bwd")
        if jax is not None:
            import jax.numpy as jnp
            jf = jax.jit(lambda a, b: jax.lax.conv(a, b, (1, 1), "SAME"))
            jg = jax.jit(jax.grad(lambda a, b, cc: jnp.sum(jax.lax.conv(a, b, (1, 1), "SAME") * cc),
                                  argnums=(0, 1) if xs[1] > 1 else (1,)))
            jx, jw, jc = jnp.asarray(x), jnp.asarray(w), jnp.asarray(c)
            add(case, "jax.jit", f, C.timeit(lambda: jf(jx, jw), sync=lambda r: r.block_until_ready()), "fwd")
            add(case, "jax.jit", fb, C.timeit(lambda: jg(jx, jw, jc), sync=lambda r: r[0].block_until_ready()),
                "fwd+bwd")
        flow.clear_default_session()

    # The LeNet train step (examples/lenet_train.py's model, Adam).
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    import lenet_train as L
    job = L.define_jobs("adam")
    xi = rng.standard_normal((100, 1, 28, 28)).astype(np.float32)
    li = rng.integers(0, 10, 100).astype(np.int32)
    case = "lenet train step b100 (adam)"

    def ms(times):
        return times[0] * 1e3, times[1] * 1e3
    rows.append(C.row("conv", case, "flowjit", *ms(C.timeit(lambda: job(xi, li), reps=5)), "ms/step"))
    if torch is not None:
        for name, tstep in torch_lenet_steps(torch, xi, li):
            rows.append(C.row("conv", case, name, *ms(C.timeit(tstep, reps=5)), "ms/step"))
    if jax is not None:
        jstep = jax_lenet_step(jax, xi, li)
        rows.append(C.row("conv", case, "jax.jit",
                          *ms(C.timeit(jstep, reps=5, sync=lambda r: r.block_until_ready())), "ms/step"))
    flow.clear_default_session()
    return rows


def torch_lenet_steps(torch, xi, li):
    """The same LeNet in PyTorch (eager, and torch.compile when it works), Adam, train mode."""
    nn = torch.nn

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(3136, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10))
    x, y = torch.tensor(xi), torch.tensor(li, dtype=torch.long)
    out = []
    for name in ("torch", "torch.compile"):
        if name == "torch.compile" and C.torch_compile_failure():
            continue
        m = model()
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        fwd = m if name == "torch" else torch.compile(m)

        def step(fwd=fwd, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(fwd(x), y)
            loss.backward()
            opt.step()
            return loss
        try:
            step()
        except Exception as e:  # torch.compile needs a C compiler and may fail
            print(f"# SKIP {name}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            continue
        out.append((name, step))
    return out


def jax_lenet_step(jax, xi, li):
    """The same LeNet in JAX (jit of the whole Adam step), NCHW, dropout from a per-step key."""
    import jax.numpy as jnp
    rng = np.random.default_rng(1)

    def init(shape):
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 0.1)
    params = {"c1": init((32, 1, 5, 5)), "b1": jnp.zeros(32), "c2": init((64, 32, 5, 5)), "b2": jnp.zeros(64),
              "d1": init((3136, 512)), "e1": jnp.zeros(512), "d2": init((512, 10)), "e2": jnp.zeros(10)}

    def conv(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return jax.nn.relu(y + b[None, :, None, None])

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "SAME")

    def loss_fn(p, x, y, key):
        h = pool(conv(pool(conv(x, p["c1"], p["b1"])), p["c2"], p["b2"])).reshape(x.shape[0], -1)
        h = jax.nn.relu(h @ p["d1"] + p["e1"])
        keep = jax.random.bernoulli(key, 0.5, h.shape)
        h = jnp.where(keep, h / 0.5, 0)
        logits = h @ p["d2"] + p["e2"]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(x.shape[0]), y])

    @jax.jit
    def step(p, m, v, t, x, y, key):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y, key)
        m = jax.tree_util.tree_map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree_util.tree_map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        t = t + 1
        p = jax.tree_util.tree_map(
            lambda w, a, b: w - 1e-3 * (a / (1 - 0.9 ** t)) / (jnp.sqrt(b / (1 - 0.999 ** t)) + 1e-8), p, m, v)
        return p, m, v, t, loss
    state = [params, jax.tree_util.tree_map(jnp.zeros_like, params),
             jax.tree_util.tree_map(jnp.zeros_like, params), jnp.float32(0)]
    x, y = jnp.asarray(xi), jnp.asarray(li)
    key = jax.random.PRNGKey(0)

    def run():
        nonlocal key
        key, sub = jax.random.split(key)
        p, m, v, t, loss = step(*state, x, y, sub)
        state[:] = [p, m, v, t]
        return loss
    return run


if __name__ == "__main__":
    C.header()
    C.print_rows(run(), "convolutions")
