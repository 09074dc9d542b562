"""ms per train step of examples/transformer_lm.py: flowjit, PyTorch eager, torch.compile, JAX jit.

Every implementation runs the same model and step: forward, backward, global
norm clipping and an Adam update, float32, dropout 0 (so all do the same
arithmetic; flowjit's dropout is one counter-based random draw fused into its
consumers). The peers hold their parameters and batch as their own tensors, so
no conversion is timed.

    python benchmarks/bench_transformer.py [--batch 32] [--context 128] [--width 128] [--amp]

`--amp`: automatic mixed precision in bfloat16 for flowjit (OneFlow's
enable_auto_mixed_precision) and PyTorch (the loss under
torch.autocast("cpu", dtype=torch.bfloat16)), beside flowjit's float32 step;
JAX has no automatic mixed precision and is left out.
"""
import argparse
import dataclasses
import functools
import math
import os
import sys

import numpy as np

import _common as C

sys.path.insert(0, os.path.join(C.ROOT, "examples"))


# ---------------------------------------------------------------- torch

def _torch_loss(torch, P, tokens, targets, cfg):
    F = torch.nn.functional
    B, T, Cw, H = cfg.batch, cfg.context, cfg.width, cfg.heads
    D = Cw // H
    lin = lambda x, n: x @ P[f"{n}-weight"] + P[f"{n}-bias"]  # noqa: E731
    ln = lambda x, n: F.layer_norm(x, (Cw,), P[f"{n}-gamma"], P[f"{n}-beta"], eps=1e-5)  # noqa: E731
    heads = lambda v: v.reshape(B, T, H, D).permute(0, 2, 1, 3)  # noqa: E731
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1) * -1e9
    x = (P["wte"][tokens] + P["wpe"]).reshape(B * T, Cw)
    for i in range(cfg.layers):
        h = ln(x, f"h{i}-ln1")
        q, k, v = (heads(lin(h, f"h{i}-attn-{n}")) for n in "qkv")
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D)) + mask
        y = (torch.softmax(s, dim=-1) @ v).permute(0, 2, 1, 3).reshape(B * T, Cw)
        x = x + lin(y, f"h{i}-attn-proj")
        x = x + lin(F.gelu(lin(ln(x, f"h{i}-ln2"), f"h{i}-mlp-fc")), f"h{i}-mlp-out")
    logits = ln(x, "ln_f") @ P["wte"].T
    return F.cross_entropy(logits, targets.reshape(-1))


def _torch_step(torch, loss_fn, params, opt, clip):
    def step(tokens, targets):
        loss = loss_fn(params, tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


# ---------------------------------------------------------------- jax

def _jax_step(jax, cfg):
    import jax.numpy as jnp
    B, T, Cw, H = cfg.batch, cfg.context, cfg.width, cfg.heads
    D = Cw // H
    b1, b2, eps = 0.9, 0.95, 1e-8

    def ln(x, P, n):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * P[f"{n}-gamma"] + P[f"{n}-beta"]

    def loss_fn(P, tokens, targets):
        lin = lambda x, n: x @ P[f"{n}-weight"] + P[f"{n}-bias"]  # noqa: E731
        heads = lambda v: v.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # noqa: E731
        mask = jnp.triu(jnp.ones((T, T), jnp.float32), 1) * -1e9
        x = (P["wte"][tokens] + P["wpe"]).reshape(B * T, Cw)
        for i in range(cfg.layers):
            h = ln(x, P, f"h{i}-ln1")
            q, k, v = (heads(lin(h, f"h{i}-attn-{n}")) for n in "qkv")
            s = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(D)) + mask
            y = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B * T, Cw)
            x = x + lin(y, f"h{i}-attn-proj")
            x = x + lin(jax.nn.gelu(lin(ln(x, P, f"h{i}-ln2"), f"h{i}-mlp-fc"), approximate=False),
                        f"h{i}-mlp-out")
        logits = ln(x, P, "ln_f") @ P["wte"].T
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=1).mean()

    def step(state, tokens, targets):
        P, m, v, t = state
        loss, g = jax.value_and_grad(loss_fn)(P, tokens, targets)
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g)))
        scale = cfg.clip_norm / jnp.maximum(norm, cfg.clip_norm)
        g = jax.tree_util.tree_map(lambda x: x * scale, g)
        m = jax.tree_util.tree_map(lambda a, x: b1 * a + (1 - b1) * x, m, g)
        v = jax.tree_util.tree_map(lambda a, x: b2 * a + (1 - b2) * x * x, v, g)
        t = t + 1
        lr = cfg.lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        P = jax.tree_util.tree_map(lambda p, a, b: p - lr * a / (jnp.sqrt(b) + eps), P, m, v)
        return (P, m, v, t), loss

    return jax.jit(step, donate_argnums=0)


# ---------------------------------------------------------------- run

def run(args):
    import flowjit as flow
    from flowjit import _C
    import transformer_lm as lm

    C.print_load("(transformer)")
    nthreads = _C.num_threads()
    cfg = lm.Config(batch=args.batch, context=args.context, width=args.width, heads=args.heads,
                    dropout=0.0, steps=10 ** 6, amp=flow.bfloat16 if args.amp else None)
    case = (f"lm b{cfg.batch} t{cfg.context} c{cfg.width} h{cfg.heads} l{cfg.layers}"
            + (" AMP bf16" if args.amp else ""))
    data = lm.encode(lm.stdlib_text(400_000))
    tok, tgt = lm.batches(data, cfg, np.random.default_rng(0))
    fns, syncs, notes, skipped = {}, {}, {}, []

    if args.amp:  # flowjit's float32 step beside its AMP one
        f32_job, _ = lm.make_jobs(dataclasses.replace(cfg, amp=None))
        f32_job(tok, tgt)
        fns["flowjit f32"] = lambda: f32_job(tok, tgt)
        notes["flowjit f32"] = f"float32 throughout, {f32_job.compiled_jobs()[0].num_kernels} kernels, {nthreads} threads"
    train_job, eval_job = lm.make_jobs(cfg)
    eval_job(tok, tgt)
    init = {n: np.array(v) for n, v in flow.get_all_variables().items() if not n.startswith("System-")}
    train_job(tok, tgt)  # trace + compile
    jk = train_job.compiled_jobs()[0]
    print(f"# flowjit: {jk.num_kernels} kernels, arena {jk.arena_bytes} bytes, {nthreads} threads")
    fns["flowjit"] = lambda: train_job(tok, tgt)
    notes["flowjit"] = f"{jk.num_kernels} kernels, {nthreads} threads"

    torch = C.peer("torch")
    if torch is None:
        for impl in ("torch eager", "torch.compile"):
            skipped.append(C.skipped("transformer", case, impl, "torch is not installed"))
    else:
        torch.set_num_threads(nthreads)
        tt, ty = torch.from_numpy(tok.astype(np.int64)), torch.from_numpy(tgt.astype(np.int64))

        def setup():
            P = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
            return P, torch.optim.Adam(P.values(), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)

        loss_fn = functools.partial(_torch_loss, torch, cfg=cfg)
        if args.amp:
            f32_loss = loss_fn

            def loss_fn(p, a, b):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return f32_loss(p, a, b)
        P, opt = setup()
        fns["torch eager"] = functools.partial(
            _torch_step(torch, lambda p, a, b: loss_fn(p, a, b), P, opt, cfg.clip_norm), tt, ty)
        notes["torch eager"] = (f"torch {torch.__version__}, {nthreads} threads, foreach Adam"
                                      + (", autocast bfloat16" if args.amp else ""))
        crash = C.torch_compile_failure()
        if crash:
            skipped.append(C.skipped("transformer", case, "torch.compile", crash))
        else:
            try:
                P2, opt2 = setup()
                compiled = torch.compile(lambda p, a, b: loss_fn(p, a, b))
                cstep = _torch_step(torch, compiled, P2, opt2, cfg.clip_norm)
                cstep(tt, ty)
                fns["torch.compile"] = functools.partial(cstep, tt, ty)
                notes["torch.compile"] = ("inductor, default mode, forward + backward compiled"
                                                + (", autocast bfloat16" if args.amp else ""))
            except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
                why = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
                print(f"# SKIP torch.compile: {why}")
                skipped.append(C.skipped("transformer", case, "torch.compile", f"failed: {why}"))

    jax = None if args.amp else C.peer("jax")
    if args.amp:
        skipped.append(C.skipped("transformer", case, "jax.jit", "no automatic mixed precision in JAX"))
    elif jax is None:
        skipped.append(C.skipped("transformer", case, "jax.jit", "jax is not installed"))
    else:
        import jax.numpy as jnp
        P = {n: jnp.asarray(v) for n, v in init.items()}
        zeros = lambda: {n: jnp.zeros_like(v) for n, v in P.items()}  # noqa: E731
        box = [(P, zeros(), zeros(), jnp.float32(0))]  # donated: no buffer twice
        jstep = _jax_step(jax, cfg)
        jt, jy = jax.device_put(tok), jax.device_put(tgt)

        def one():
            box[0], loss = jstep(box[0], jt, jy)
            return loss.block_until_ready()

        one()
        fns["jax.jit"] = one
        notes["jax.jit"] = f"jax {jax.__version__}, whole step jitted, loss ready each step"

    with C.blas_threads(nthreads):
        times = C.interleaved(fns, syncs=syncs, warmup=3, reps=5, target_s=0.5)
    rows = [C.row("transformer", case, impl, best * 1e3, med * 1e3, "ms/step", notes[impl])
            for impl, (best, med) in times.items()]
    C.print_load("(transformer, after)")
    return rows + skipped


if __name__ == "__main__":
    C.fair_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--amp", action="store_true", help="bfloat16 automatic mixed precision (flowjit, torch)")
    a = ap.parse_args()
    C.header()
    C.print_rows(run(a), "transformer LM train step (best and median of 5 repetitions after warm-up)")
