"""examples/transformer_lm.py against the same model in PyTorch (a test-only
dependency): flowjit's initial variables are loaded into torch, dropout is 0,
and both train 50 steps on the same batches with the same optimizer (OneFlow's
Adam, whose bias correction scales the rate and leaves epsilon alone; global
norm clipping as c / max(norm, c); linear warmup then cosine decay).

Tolerance: float32 losses within rtol 1e-3 at every step (the two sides sum in
different orders, and Adam amplifies rounding in the first steps, where v is
tiny)."""
import math
import os
import sys

import numpy as np
import pytest

import flowjit as flow

torch = pytest.importorskip("torch", reason="torch is a test-only dependency; pip install torch")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import transformer_lm as lm  # noqa: E402

STEPS = 50


def torch_loss(P, tokens, targets, cfg):
    F = torch.nn.functional
    B, T, C, H = cfg.batch, cfg.context, cfg.width, cfg.heads
    D = C // H

    def lin(x, name):
        return x @ P[f"{name}-weight"] + P[f"{name}-bias"]

    def ln(x, name):
        return F.layer_norm(x, (C,), P[f"{name}-gamma"], P[f"{name}-beta"], eps=1e-5)

    def heads(v):
        return v.reshape(B, T, H, D).permute(0, 2, 1, 3)

    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = (P["wte"][tokens] + P["wpe"]).reshape(B * T, C)
    for i in range(cfg.layers):
        h = ln(x, f"h{i}-ln1")
        q, k, v = (heads(lin(h, f"h{i}-attn-{n}")) for n in "qkv")
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))
        s = s + mask * -1e9
        y = (torch.softmax(s, dim=-1) @ v).permute(0, 2, 1, 3).reshape(B * T, C)
        x = x + lin(y, f"h{i}-attn-proj")
        h = ln(x, f"h{i}-ln2")
        x = x + lin(F.gelu(lin(h, f"h{i}-mlp-fc")), f"h{i}-mlp-out")
    x = ln(x, "ln_f")
    logits = x @ P["wte"].T
    return F.cross_entropy(logits, targets.reshape(-1))


def scheduled_lr(cfg, step):
    """OneFlow's CosineScheduler with warmup.linear(warmup, 0), as a float32 rate."""
    if step < cfg.warmup:
        lr = cfg.lr * step / cfg.warmup
    else:
        t = min(step, cfg.steps)
        lr = cfg.lr * ((1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t / cfg.steps))
                       + cfg.min_lr_ratio)
    return float(np.float32(lr))


def torch_train_step(P, state, tokens, targets, cfg, step, b1=0.9, b2=0.95, eps=1e-8):
    loss = torch_loss(P, tokens, targets, cfg)
    grads = torch.autograd.grad(loss, list(P.values()))
    with torch.no_grad():
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        scale = cfg.clip_norm / torch.maximum(norm, torch.tensor(cfg.clip_norm))
        t = step + 1
        lr = scheduled_lr(cfg, step) * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for (name, w), g in zip(P.items(), grads):
            g = g * scale
            m, v = state.setdefault(name, (torch.zeros_like(w), torch.zeros_like(w)))
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            w.sub_(lr * m / (v.sqrt() + eps))
    return float(loss.detach())


@pytest.mark.slow
def test_loss_curve_matches_pytorch():
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = lm.Config(batch=8, context=32, width=64, heads=4, layers=2, dropout=0.0,
                    lr=3e-3, warmup=5, steps=STEPS)
    data = lm.encode(lm.stdlib_text(200_000))
    rng = np.random.default_rng(0)
    batches = [lm.batches(data, cfg, rng) for _ in range(STEPS)]

    flow.clear_default_session()
    train_job, eval_job = lm.make_jobs(cfg)
    first = eval_job(*batches[0]).item()  # creates and initializes the variables
    init = flow.get_all_variables()
    names = [n for n in init if not n.startswith("System-")]
    assert "wte" in names and "h1-mlp-fc-weight" in names, sorted(init)
    P = {n: torch.tensor(np.array(init[n]), dtype=torch.float32, requires_grad=True) for n in names}
    with torch.no_grad():
        t0, y0 = (torch.from_numpy(a.astype(np.int64)) for a in batches[0])
        assert float(torch_loss(P, t0, y0, cfg)) == pytest.approx(first, rel=1e-5)

    flow_losses = [train_job(*b).item() for b in batches]
    state = {}
    torch_losses = []
    for step, (tok, tgt) in enumerate(batches):
        tok, tgt = torch.from_numpy(tok.astype(np.int64)), torch.from_numpy(tgt.astype(np.int64))
        torch_losses.append(torch_train_step(P, state, tok, tgt, cfg, step))
    print("\nstep  flowjit   torch")
    for s in (0, 1, 2, 5, 10, 20, 30, 40, STEPS - 1):
        print(f"{s:4d}  {flow_losses[s]:.5f}  {torch_losses[s]:.5f}")
    rel = np.abs(np.subtract(flow_losses, torch_losses)) / np.abs(torch_losses)
    print(f"max relative difference over {STEPS} steps: {rel.max():.2e}")
    np.testing.assert_allclose(flow_losses, torch_losses, rtol=1e-3)
    assert flow_losses[-1] < flow_losses[0] - 0.5, "the model did not learn"
