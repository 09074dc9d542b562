"""A small decoder-only character language model, trained on the Python standard library's source.

Written with flowjit's public API only: token embedding through flow.gather,
learned positions, causal multi-head attention (batched flow.matmul on rank 4,
an additive mask of -1e9 above the diagonal, flow.nn.softmax, flow.nn.dropout),
flow.layers.layer_norm, a GELU MLP, the output projection tied to the
embedding (logits = h @ wte^T), Adam with linear warmup and cosine decay, and
gradient clipping by the global norm. A predict job sharing the variables
reports the validation loss at the end.

    python examples/transformer_lm.py [--steps 200] [--batch 32] [--context 128] [--width 128] [--heads 4]
                                      [--amp bfloat16|float16]

tests/python/test_transformer.py trains the same model in PyTorch from the same
initial weights; benchmarks/bench_transformer.py times its train step.
"""
import argparse
import glob
import math
import os
import time
from dataclasses import dataclass

import numpy as np

import flowjit as flow
import flowjit.typing as tp

VOCAB = 128  # ASCII; other characters become '?'


@dataclass
class Config:
    batch: int = 32
    context: int = 128
    width: int = 128
    heads: int = 4
    layers: int = 2
    vocab: int = VOCAB
    dropout: float = 0.1
    lr: float = 3e-3
    warmup: int = 20
    steps: int = 200
    min_lr_ratio: float = 0.1
    clip_norm: float = 1.0
    dtype: object = flow.float32
    amp: object = None  # a half dtype: OneFlow's automatic mixed precision in it


# ---------------------------------------------------------------- data

def stdlib_text(max_chars=2_000_000):
    """The standard library's own .py files (every Python install has them), in
    a fixed order, as one ASCII string."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    parts, n = [], 0
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        n += len(parts[-1])
        if n >= max_chars:
            break
    text = "".join(parts)[:max_chars]
    return text.encode("ascii", errors="replace").decode("ascii")


def encode(text):
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8).astype(np.int32)


def batches(data, cfg, rng):
    """Random windows: tokens [B, T] and the next characters [B, T]."""
    starts = rng.integers(0, len(data) - cfg.context - 1, size=cfg.batch)
    idx = starts[:, None] + np.arange(cfg.context + 1)[None, :]
    w = data[idx]
    return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


# ---------------------------------------------------------------- model

def _normal(std):
    return flow.random_normal_initializer(stddev=std)


def linear(x, n_in, n_out, name, cfg, std=0.02):
    """x [N, n_in] @ <name>-weight [n_in, n_out] + <name>-bias."""
    w = flow.get_variable(f"{name}-weight", shape=(n_in, n_out), dtype=cfg.dtype,
                          initializer=_normal(std))
    b = flow.get_variable(f"{name}-bias", shape=(n_out,), dtype=cfg.dtype,
                          initializer=flow.zeros_initializer())
    return flow.math.add(flow.matmul(x, w), b)


def causal_bias(t, dtype):
    """[T, T]: 0 on and below the diagonal, -1e9 above (key after query)."""
    rows = flow.reshape(flow.range(t), [t, 1])
    cols = flow.reshape(flow.range(t), [1, t])
    return flow.math.multiply(flow.cast(flow.math.greater(cols, rows), dtype), -1e9)


def attention(x, cfg, name):
    """Causal multi-head self-attention of x [B*T, C]."""
    B, T, C, H = cfg.batch, cfg.context, cfg.width, cfg.heads
    D = C // H

    def heads(v):  # [B*T, C] -> [B, H, T, D]
        return flow.transpose(flow.reshape(v, [B, T, H, D]), perm=[0, 2, 1, 3])

    q = heads(linear(x, C, C, f"{name}-q", cfg))
    k = heads(linear(x, C, C, f"{name}-k", cfg))
    v = heads(linear(x, C, C, f"{name}-v", cfg))
    scores = flow.math.multiply(flow.matmul(q, k, transpose_b=True), 1.0 / math.sqrt(D))
    scores = flow.math.add(scores, causal_bias(T, cfg.dtype))
    p = flow.nn.softmax(scores, axis=-1)
    if cfg.dropout > 0:
        p = flow.nn.dropout(p, rate=cfg.dropout)
    y = flow.matmul(p, v)  # [B, H, T, D]
    y = flow.reshape(flow.transpose(y, perm=[0, 2, 1, 3]), [B * T, C])
    proj_std = 0.02 / math.sqrt(2 * cfg.layers)
    return linear(y, C, C, f"{name}-proj", cfg, std=proj_std)


def mlp(x, cfg, name):
    C = cfg.width
    h = flow.nn.gelu(linear(x, C, 4 * C, f"{name}-fc", cfg))
    return linear(h, 4 * C, C, f"{name}-out", cfg, std=0.02 / math.sqrt(2 * cfg.layers))


def residual(x, y, cfg):
    if cfg.dropout > 0:
        y = flow.nn.dropout(y, rate=cfg.dropout)
    return flow.math.add(x, y)


def language_model_loss(tokens, targets, cfg):
    """Mean cross-entropy of the next character, tokens and targets [B, T]."""
    B, T, C = cfg.batch, cfg.context, cfg.width
    wte = flow.get_variable("wte", shape=(cfg.vocab, C), dtype=cfg.dtype, initializer=_normal(0.02))
    wpe = flow.get_variable("wpe", shape=(T, C), dtype=cfg.dtype, initializer=_normal(0.01))
    x = flow.math.add(flow.gather(wte, tokens), wpe)  # [B, T, C]
    if cfg.dropout > 0:
        x = flow.nn.dropout(x, rate=cfg.dropout)
    x = flow.reshape(x, [B * T, C])
    for i in range(cfg.layers):
        a = attention(flow.layers.layer_norm(x, begin_norm_axis=-1, name=f"h{i}-ln1"), cfg, f"h{i}-attn")
        x = residual(x, a, cfg)
        m = mlp(flow.layers.layer_norm(x, begin_norm_axis=-1, name=f"h{i}-ln2"), cfg, f"h{i}-mlp")
        x = residual(x, m, cfg)
    x = flow.layers.layer_norm(x, begin_norm_axis=-1, name="ln_f")
    logits = flow.matmul(x, wte, transpose_b=True)  # tied: [B*T, V]
    labels = flow.reshape(targets, [B * T])
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    return flow.math.reduce_mean(loss)


def optimizer(cfg):
    schedule = flow.optimizer.CosineScheduler(
        cfg.lr, cfg.steps, alpha=cfg.min_lr_ratio, warmup=flow.optimizer.warmup.linear(cfg.warmup, 0.0))
    return flow.optimizer.Adam(schedule, beta1=0.9, beta2=0.95, epsilon=1e-8, do_bias_correction=True,
                               grad_clipping=flow.optimizer.grad_clipping.by_global_norm(cfg.clip_norm))


def make_jobs(cfg):
    """(train_job, eval_job): both take int32 tokens and targets [B, T] and
    return the mean loss (shape (1,), as OneFlow's full reductions: read it
    with .item()); they share the model's variables by name."""
    shape = (cfg.batch, cfg.context)
    fc = flow.function_config()
    if cfg.amp is not None:
        fc.enable_auto_mixed_precision(True, dtype=cfg.amp)

    @flow.global_function(type="train", function_config=fc)
    def transformer_train(tokens: tp.Numpy.Placeholder(shape, dtype=flow.int32),
                          targets: tp.Numpy.Placeholder(shape, dtype=flow.int32)) -> tp.Numpy:
        loss = language_model_loss(tokens, targets, cfg)
        optimizer(cfg).minimize(loss)
        return loss

    @flow.global_function(type="predict", function_config=fc)
    def transformer_eval(tokens: tp.Numpy.Placeholder(shape, dtype=flow.int32),
                         targets: tp.Numpy.Placeholder(shape, dtype=flow.int32)) -> tp.Numpy:
        return language_model_loss(tokens, targets, cfg)

    return transformer_train, transformer_eval


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = Config()
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--context", type=int, default=d.context)
    ap.add_argument("--width", type=int, default=d.width)
    ap.add_argument("--heads", type=int, default=d.heads)
    ap.add_argument("--dropout", type=float, default=d.dropout)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--amp", choices=["bfloat16", "float16"], default=None,
                    help="automatic mixed precision in this half type (default: float32 throughout)")
    args = ap.parse_args()
    if args.width % args.heads:
        ap.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    cfg = Config(batch=args.batch, context=args.context, width=args.width, heads=args.heads,
                 dropout=args.dropout, lr=args.lr, steps=args.steps, warmup=min(d.warmup, args.steps // 10),
                 amp=getattr(flow, args.amp) if args.amp else None)

    data = encode(stdlib_text())
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    print(f"data: {len(data):,} characters of {os.path.dirname(os.__file__)}/*.py "
          f"(train {len(train):,}, validation {len(val):,})")
    train_job, eval_job = make_jobs(cfg)
    rng = np.random.default_rng(0)
    tokens_per_step = cfg.batch * cfg.context

    t0 = time.perf_counter()
    loss = train_job(*batches(train, cfg, rng)).item()
    print(f"step    1  loss {loss:.4f}  (trace + compile + first step {time.perf_counter() - t0:.1f} s)")
    t_start, last_t, last_step = time.perf_counter(), time.perf_counter(), 1
    for step in range(2, cfg.steps + 1):
        loss = train_job(*batches(train, cfg, rng)).item()
        if step % args.log_every == 0 or step == cfg.steps:
            now = time.perf_counter()
            tps = (step - last_step) * tokens_per_step / (now - last_t)
            print(f"step {step:4d}  loss {loss:.4f}  {tps:,.0f} tokens/s")
            last_t, last_step = now, step
    train_s = time.perf_counter() - t_start

    vrng = np.random.default_rng(1)
    vals = [eval_job(*batches(val, cfg, vrng)).item() for _ in range(args.eval_batches)]
    print(f"trained {cfg.steps} steps in {train_s:.1f} s after the first "
          f"({(cfg.steps - 1) * tokens_per_step / max(train_s, 1e-9):,.0f} tokens/s); "
          f"validation loss {np.mean(vals):.4f} over {args.eval_batches} batches "
          f"(uniform guess: {math.log(VOCAB):.4f})")


if __name__ == "__main__":
    main()
