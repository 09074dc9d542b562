"""Small versions of the model families OneFlow's model zoo trains ([zoo],
#26), each written with flowjit's OneFlow-style API and trained for a few
steps against the same model in PyTorch (a test-only dependency):

- a ResNet bottleneck block (1x1 / 3x3 stride 2 / 1x1 convolutions with
  train-mode batch norm and ReLU, a projection shortcut), SGD with momentum;
- a BERT encoder layer (embeddings, multi-head self-attention with a padding
  mask, residual + layer norm, GELU MLP) under a masked token loss, AdamW
  with bias correction and weight decay that skips biases and layer norms;
- a Wide&Deep tower (embedding lookups and dense features into a ReLU MLP,
  plus a wide linear part of per-id weights), sigmoid cross-entropy, the
  wide part trained by SGD with momentum and the deep part by LazyAdam in
  one CombinedOptimizer;
- a DCGAN generator (dense, conv2d_transpose x2, leaky ReLU, tanh) and
  discriminator (strided convolutions, leaky ReLU), each trained by its own
  Adam in its own train job, the other network's variables not trainable
  there, steps alternating as in OneFlow's DCGAN.

flowjit creates the variables from its initializers (job.compile()); those
values are copied into torch modules, both sides train on the same batches,
and every step's loss and the variables after the last step are compared
(batch norm's moving statistics too). torch's SGD with momentum is OneFlow's
(v = m v - lr g, w += v is torch's buf = m buf + g, w -= lr buf at a
constant rate); OneFlow's Adam differs from torch's (the bias correction
scales the rate and leaves epsilon alone; AdamW's decay term takes the
corrected rate), so the torch side runs that rule by hand (`_oneflow_adam`).

Tolerances (float32 everywhere): the two sides sum convolutions, matmuls and
reductions in different orders, about 1e-6 relative per op. Losses agree
within rtol 1e-4 at every step: a few steps compound those rounding
differences to about 1e-5 on these tiny models. Weights after the steps are
compared with rtol 1e-3 and atol 1e-4 * lr (1e-6 to 1e-5): an Adam step is
lr * m / (sqrt(v) + eps), which divides out the gradient's scale, so an
element whose gradient is small relative to its rounding error moves by a
step that differs by a fraction of lr between the two sides; measured, the
largest difference of any variable is 6e-6 (BERT's value weights, 1e-4
relative) and most are below 1e-7. SGD's updates are proportional to the
gradient and stay far inside the bound. A variable whose true gradient is
exactly zero (BERT's key bias) moves by rounding noise alone and is held to
Adam's step bound instead (see the BERT test).
"""
import math

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

torch = pytest.importorskip("torch", reason="torch is a test-only dependency; pip install torch")
F = torch.nn.functional

LOSS_RTOL = 1e-4
W_RTOL = 1e-3


@pytest.fixture(autouse=True)
def _fresh_session():
    flow.clear_default_session()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield
    flow.clear_default_session()


def _flow_vars():
    return {n: np.array(v) for n, v in flow.get_all_variables().items()}


def _copy_into(module_params, values):
    """Copies flowjit's variable values into torch parameters/buffers by name
    ({flow name: (torch tensor, transform)}; transform maps the flow array
    to the torch layout)."""
    with torch.no_grad():
        for name, (t, fn) in module_params.items():
            a = values[name] if fn is None else fn(values[name])
            assert tuple(t.shape) == a.shape, (name, t.shape, a.shape)
            t.copy_(torch.from_numpy(np.ascontiguousarray(a)))


def _compare_weights(module_params, values, atol, what, skip=()):
    worst = 0.0
    for name, (t, fn) in module_params.items():
        if name in skip:
            continue
        a = values[name] if fn is None else fn(values[name])
        b = t.detach().numpy()
        np.testing.assert_allclose(a, b, rtol=W_RTOL, atol=atol, err_msg=f"{what}: variable {name}")
        worst = max(worst, float(np.max(np.abs(a - b))))
    return worst


def _oneflow_adam(params, state, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                  decays=lambda name: True):
    """OneFlow's Adam/AdamW with do_bias_correction=True on torch tensors
    (params: {name: tensor with .grad}): m = b1 m + (1 - b1) g,
    v = b2 v + (1 - b2) g^2, lr_t = lr sqrt(1 - b2^t) / (1 - b1^t) with
    t = step + 1, w -= lr_t (m / (sqrt(v) + eps) + wd w)."""
    t = step + 1
    lr_t = float(np.float32(lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)))
    with torch.no_grad():
        for name, w in params.items():
            g = w.grad
            m, v = state.setdefault(name, (torch.zeros_like(w), torch.zeros_like(w)))
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            upd = m / (v.sqrt() + eps)
            if weight_decay and decays(name):
                upd = upd + weight_decay * w
            w.sub_(lr_t * upd)
            w.grad = None


# ================================================================ ResNet bottleneck block

RN = dict(n=4, cin=8, mid=4, cout=16, hw=8, classes=5, lr=0.1, momentum=0.9, steps=4)


def _conv_w(name, co, ci, k):
    return flow.get_variable(name, shape=(co, ci, k, k),
                             initializer=flow.variance_scaling_initializer(2.0, "fan_in", "random_normal",
                                                                          data_format="NCHW"))


def _bn(x, name):
    return flow.layers.batch_normalization(x, axis=1, momentum=0.9, epsilon=1e-5, name=name)


def _flow_bottleneck(x):
    c = RN
    pad1 = [[0, 0], [0, 0], [1, 1], [1, 1]]
    h = flow.nn.relu(_bn(flow.nn.conv2d(x, _conv_w("res-a-w", c["mid"], c["cin"], 1), 1, "VALID"), "res-a-bn"))
    h = flow.nn.relu(_bn(flow.nn.conv2d(h, _conv_w("res-b-w", c["mid"], c["mid"], 3), 2, pad1), "res-b-bn"))
    h = _bn(flow.nn.conv2d(h, _conv_w("res-c-w", c["cout"], c["mid"], 1), 1, "VALID"), "res-c-bn")
    s = _bn(flow.nn.conv2d(x, _conv_w("res-proj-w", c["cout"], c["cin"], 1), 2, "VALID"), "res-proj-bn")
    y = flow.nn.relu(h + s)
    pooled = flow.math.reduce_mean(y, axis=[2, 3])
    w = flow.get_variable("res-fc-w", shape=(c["classes"], c["cout"]),
                          initializer=flow.random_normal_initializer(stddev=0.1, seed=3))
    b = flow.get_variable("res-fc-b", shape=(c["classes"],), initializer=flow.zeros_initializer())
    return flow.nn.bias_add(flow.matmul(pooled, w, transpose_b=True), b)


class TorchBottleneck(torch.nn.Module):
    def __init__(self):
        super().__init__()
        c, nn = RN, torch.nn
        self.a = nn.Conv2d(c["cin"], c["mid"], 1, bias=False)
        self.b = nn.Conv2d(c["mid"], c["mid"], 3, stride=2, padding=1, bias=False)
        self.c = nn.Conv2d(c["mid"], c["cout"], 1, bias=False)
        self.proj = nn.Conv2d(c["cin"], c["cout"], 1, stride=2, bias=False)
        # OneFlow's moving = 0.9 moving + 0.1 batch is torch's momentum 0.1
        self.bn = nn.ModuleDict({k: nn.BatchNorm2d(ch, eps=1e-5, momentum=0.1)
                                 for k, ch in (("a", c["mid"]), ("b", c["mid"]), ("c", c["cout"]),
                                               ("proj", c["cout"]))})
        self.fc = nn.Linear(c["cout"], c["classes"])

    def forward(self, x):
        h = F.relu(self.bn["a"](self.a(x)))
        h = F.relu(self.bn["b"](self.b(h)))
        h = self.bn["c"](self.c(h))
        y = F.relu(h + self.bn["proj"](self.proj(x)))
        return self.fc(y.mean(dim=(2, 3)))

    def by_flow_name(self):
        d = {}
        for k in ("a", "b", "c", "proj"):
            d[f"res-{k}-w"] = (getattr(self, k).weight, None)
            bn = self.bn[k]
            for fname, t in (("gamma", bn.weight), ("beta", bn.bias), ("moving_mean", bn.running_mean),
                             ("moving_variance", bn.running_var)):
                d[f"res-{k}-bn-{fname}"] = (t, None)
        d["res-fc-w"] = (self.fc.weight, None)
        d["res-fc-b"] = (self.fc.bias, None)
        return d


def test_resnet_bottleneck_block_trains_like_pytorch():
    c = RN
    shape = (c["n"], c["cin"], c["hw"], c["hw"])

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder(shape), y: tp.Numpy.Placeholder((c["n"],), dtype=flow.int32)) -> tp.Numpy:
        logits = _flow_bottleneck(x)
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        flow.optimizer.SGD(c["lr"], momentum=c["momentum"]).minimize(loss)
        return loss

    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal(shape).astype(np.float32),
                rng.integers(0, c["classes"], c["n"]).astype(np.int32)) for _ in range(c["steps"])]
    train.compile(*batches[0])
    model = TorchBottleneck()
    params = model.by_flow_name()
    _copy_into(params, _flow_vars())
    opt = torch.optim.SGD(model.parameters(), lr=c["lr"], momentum=c["momentum"])

    flow_losses, torch_losses = [], []
    for x, y in batches:
        flow_losses.append(train(x, y).item())
        opt.zero_grad()
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y).long())
        loss.backward()
        opt.step()
        torch_losses.append(loss.item())
    np.testing.assert_allclose(flow_losses, torch_losses, rtol=LOSS_RTOL)
    _compare_weights(params, _flow_vars(), 1e-4 * c["lr"], "resnet block")
    assert flow_losses[-1] < flow_losses[0], flow_losses


# ================================================================ BERT encoder layer

BT = dict(batch=2, seq=8, hidden=16, heads=2, ffn=32, vocab=24, lr=1e-2, wd=0.01, steps=4)
_BERT_DECAY_EXCLUDES = ["bias", "LayerNorm"]


def _dense_vars(name, n_in, n_out, seed):
    w = flow.get_variable(f"{name}-weight", shape=(n_out, n_in),
                          initializer=flow.truncated_normal_initializer(stddev=0.2, seed=seed))
    b = flow.get_variable(f"{name}-bias", shape=(n_out,),
                          initializer=flow.random_uniform_initializer(-0.1, 0.1, seed=seed + 100))
    return w, b


def _dense(x, name, n_out, seed):
    w, b = _dense_vars(name, x.shape[-1], n_out, seed)
    return flow.nn.bias_add(flow.matmul(x, w, transpose_b=True), b)


def _flow_bert(ids, mask):
    c = BT
    B, T, H, NH = c["batch"], c["seq"], c["hidden"], c["heads"]
    D = H // NH
    wte = flow.get_variable("bert-word_embeddings", shape=(c["vocab"], H),
                            initializer=flow.random_normal_initializer(stddev=0.5, seed=1))
    wpe = flow.get_variable("bert-position_embeddings", shape=(T, H),
                            initializer=flow.random_normal_initializer(stddev=0.5, seed=2))
    x = flow.gather(wte, ids) + wpe                                     # (B, T, H)
    x = flow.layers.layer_norm(x, begin_norm_axis=-1, begin_params_axis=-1, name="bert-emb-LayerNorm")
    x2 = flow.reshape(x, (B * T, H))

    def heads(v):
        return flow.transpose(flow.reshape(v, (B, T, NH, D)), perm=[0, 2, 1, 3])

    q, k, v = (heads(_dense(x2, f"bert-attn-{n}", H, 10 + i)) for i, n in enumerate("qkv"))
    scores = flow.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(D))  # (B, NH, T, T)
    bias = (1.0 - flow.reshape(mask, (B, 1, 1, T))) * -10000.0
    probs = flow.nn.softmax(scores + bias, axis=-1)
    ctx = flow.reshape(flow.transpose(flow.matmul(probs, v), perm=[0, 2, 1, 3]), (B * T, H))
    x2 = flow.layers.layer_norm(x2 + _dense(ctx, "bert-attn-out", H, 14), begin_norm_axis=-1,
                                begin_params_axis=-1, name="bert-attn-LayerNorm")
    h = flow.math.gelu(_dense(x2, "bert-ffn-in", c["ffn"], 15))
    x2 = flow.layers.layer_norm(x2 + _dense(h, "bert-ffn-out", H, 16), begin_norm_axis=-1,
                                begin_params_axis=-1, name="bert-ffn-LayerNorm")
    return _dense(x2, "bert-lm-head", c["vocab"], 17)                   # (B*T, vocab)


class TorchBertLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        c, nn = BT, torch.nn
        H = c["hidden"]
        self.wte = nn.Embedding(c["vocab"], H)
        self.wpe = nn.Parameter(torch.zeros(c["seq"], H))
        self.lin = nn.ModuleDict({"attn-q": nn.Linear(H, H), "attn-k": nn.Linear(H, H), "attn-v": nn.Linear(H, H),
                                  "attn-out": nn.Linear(H, H), "ffn-in": nn.Linear(H, c["ffn"]),
                                  "ffn-out": nn.Linear(c["ffn"], H), "lm-head": nn.Linear(H, c["vocab"])})
        self.ln = nn.ModuleDict({k: nn.LayerNorm(H, eps=1e-5) for k in ("emb", "attn", "ffn")})

    def forward(self, ids, mask):
        c = BT
        B, T, H, NH = c["batch"], c["seq"], c["hidden"], c["heads"]
        D = H // NH
        x = self.ln["emb"](self.wte(ids) + self.wpe).reshape(B * T, H)

        def heads(v):
            return v.reshape(B, T, NH, D).permute(0, 2, 1, 3)

        q, k, v = (heads(self.lin[f"attn-{n}"](x)) for n in "qkv")
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D)) + (1.0 - mask.reshape(B, 1, 1, T)) * -10000.0
        ctx = (torch.softmax(s, -1) @ v).permute(0, 2, 1, 3).reshape(B * T, H)
        x = self.ln["attn"](x + self.lin["attn-out"](ctx))
        x = self.ln["ffn"](x + self.lin["ffn-out"](F.gelu(self.lin["ffn-in"](x))))
        return self.lin["lm-head"](x)

    def by_flow_name(self):
        d = {"bert-word_embeddings": (self.wte.weight, None), "bert-position_embeddings": (self.wpe, None)}
        for k, m in self.lin.items():
            d[f"bert-{k}-weight"] = (m.weight, None)
            d[f"bert-{k}-bias"] = (m.bias, None)
        for k, m in self.ln.items():
            d[f"bert-{k}-LayerNorm-gamma"] = (m.weight, None)
            d[f"bert-{k}-LayerNorm-beta"] = (m.bias, None)
        return d


def _bert_masked_loss_flow(logits, targets, weights):
    ce = flow.nn.sparse_softmax_cross_entropy_with_logits(flow.reshape(targets, (-1,)), logits)
    w = flow.reshape(weights, (-1,))
    return flow.math.reduce_sum(ce * w) / flow.math.reduce_sum(w)


def test_bert_encoder_layer_trains_like_pytorch():
    c = BT
    B, T = c["batch"], c["seq"]

    @flow.global_function(type="train")
    def train(ids: tp.Numpy.Placeholder((B, T), dtype=flow.int32), mask: tp.Numpy.Placeholder((B, T)),
              targets: tp.Numpy.Placeholder((B, T), dtype=flow.int32)) -> tp.Numpy:
        loss = _bert_masked_loss_flow(_flow_bert(ids, mask), targets, mask)
        flow.optimizer.AdamW(c["lr"], do_bias_correction=True, weight_decay=c["wd"],
                             weight_decay_excludes=_BERT_DECAY_EXCLUDES).minimize(loss)
        return loss

    rng = np.random.default_rng(1)
    lengths = np.array([T, T - 3])                       # the second sequence has 3 padding positions
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    batches = [(rng.integers(0, c["vocab"], (B, T)).astype(np.int32), mask,
                rng.integers(0, c["vocab"], (B, T)).astype(np.int32)) for _ in range(c["steps"])]
    train.compile(*batches[0])
    model = TorchBertLayer()
    params = model.by_flow_name()
    init = _flow_vars()
    _copy_into(params, init)
    tparams = {n: t for n, (t, _) in params.items()}
    decays = lambda name: not any(p in name for p in _BERT_DECAY_EXCLUDES)  # noqa: E731
    state, flow_losses, torch_losses = {}, [], []
    for step, (ids, m, tg) in enumerate(batches):
        flow_losses.append(train(ids, m, tg).item())
        tm = torch.from_numpy(m)
        logits = model(torch.from_numpy(ids).long(), tm)
        ce = F.cross_entropy(logits, torch.from_numpy(tg).long().reshape(-1), reduction="none")
        loss = (ce * tm.reshape(-1)).sum() / tm.sum()
        loss.backward()
        _oneflow_adam(tparams, state, step, c["lr"], weight_decay=c["wd"], decays=decays)
        torch_losses.append(loss.item())
    np.testing.assert_allclose(flow_losses, torch_losses, rtol=LOSS_RTOL)
    after = _flow_vars()
    # The key bias adds q.b_k to every score of a query's row, which the
    # softmax ignores: its true gradient is exactly 0, each side's is rounding
    # noise, and Adam turns noise into steps of up to about lr. So it is held
    # only to that bound (torch's moves the same way).
    _compare_weights(params, after, 1e-4 * c["lr"], "bert layer", skip=("bert-attn-k-bias",))
    kb0, kb = init["bert-attn-k-bias"], after["bert-attn-k-bias"]
    assert np.abs(kb - kb0).max() <= 2 * c["lr"] * c["steps"], np.abs(kb - kb0).max()
    assert flow_losses[-1] < flow_losses[0], flow_losses


def test_bert_padding_mask_hides_padded_tokens():
    """Changing the tokens at masked positions changes nothing the unmasked
    positions compute (the mask reaches every head's softmax)."""
    c = BT
    B, T = c["batch"], c["seq"]

    @flow.global_function()
    def predict(ids: tp.Numpy.Placeholder((B, T), dtype=flow.int32), mask: tp.Numpy.Placeholder((B, T))
                ) -> tp.Numpy:
        return _flow_bert(ids, mask)

    rng = np.random.default_rng(2)
    mask = np.ones((B, T), np.float32)
    mask[1, 5:] = 0
    ids = rng.integers(0, c["vocab"], (B, T)).astype(np.int32)
    a = predict(ids, mask).reshape(B, T, -1)
    ids2 = ids.copy()
    ids2[1, 5:] = (ids2[1, 5:] + 7) % c["vocab"]
    b = predict(ids2, mask).reshape(B, T, -1)
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.allclose(a[1, 5:], b[1, 5:])


# ================================================================ Wide&Deep tower

WD = dict(batch=16, dense=4, deep_ids=3, deep_vocab=30, emb=4, wide_ids=2, wide_vocab=40, hidden=(16, 8),
          sgd_lr=0.1, adam_lr=1e-2, steps=5)


def _flow_wide_deep(dense, deep_ids, wide_ids):
    c = WD
    B = c["batch"]
    emb = flow.get_variable("wdl-deep-embedding", shape=(c["deep_vocab"], c["emb"]),
                            initializer=flow.random_uniform_initializer(-0.3, 0.3, seed=5))
    wide = flow.get_variable("wdl-wide-weight", shape=(c["wide_vocab"], 1),
                             initializer=flow.random_uniform_initializer(-0.3, 0.3, seed=6))
    wide_b = flow.get_variable("wdl-wide-bias", shape=(1,), initializer=flow.zeros_initializer())
    wide_logit = flow.math.reduce_sum(flow.gather(wide, wide_ids), axis=[1]) + wide_b     # (B, 1)
    deep = flow.reshape(flow.gather(emb, deep_ids), (B, c["deep_ids"] * c["emb"]))
    h = flow.concat([deep, dense], axis=1)
    for i, n in enumerate(c["hidden"]):
        h = flow.nn.relu(_dense(h, f"wdl-deep-fc{i}", n, 40 + i))
    return _dense(h, "wdl-deep-out", 1, 50) + wide_logit


class TorchWideDeep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        c, nn = WD, torch.nn
        self.emb = nn.Embedding(c["deep_vocab"], c["emb"])
        self.wide = nn.Embedding(c["wide_vocab"], 1)
        self.wide_b = nn.Parameter(torch.zeros(1))
        sizes = [c["deep_ids"] * c["emb"] + c["dense"], *c["hidden"], 1]
        self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, dense, deep_ids, wide_ids):
        h = torch.cat([self.emb(deep_ids).reshape(dense.shape[0], -1), dense], 1)
        for fc in self.fc[:-1]:
            h = F.relu(fc(h))
        return self.fc[-1](h) + self.wide(wide_ids).sum(1) + self.wide_b

    def by_flow_name(self):
        d = {"wdl-deep-embedding": (self.emb.weight, None), "wdl-wide-weight": (self.wide.weight, None),
             "wdl-wide-bias": (self.wide_b, None)}
        names = [f"wdl-deep-fc{i}" for i in range(len(WD["hidden"]))] + ["wdl-deep-out"]
        for n, fc in zip(names, self.fc):
            d[f"{n}-weight"] = (fc.weight, None)
            d[f"{n}-bias"] = (fc.bias, None)
        return d


def test_wide_and_deep_tower_trains_like_pytorch():
    c = WD
    B = c["batch"]
    wide_names = ["wdl-wide-weight", "wdl-wide-bias"]

    @flow.global_function(type="train")
    def train(dense: tp.Numpy.Placeholder((B, c["dense"])),
              deep_ids: tp.Numpy.Placeholder((B, c["deep_ids"]), dtype=flow.int32),
              wide_ids: tp.Numpy.Placeholder((B, c["wide_ids"]), dtype=flow.int32),
              label: tp.Numpy.Placeholder((B, 1))) -> tp.Numpy:
        logits = _flow_wide_deep(dense, deep_ids, wide_ids)
        loss = flow.math.reduce_mean(flow.nn.sigmoid_cross_entropy_with_logits(label, logits))
        layers = [f"wdl-deep-fc{i}" for i in range(len(c["hidden"]))] + ["wdl-deep-out"]
        deep_names = ["wdl-deep-embedding"] + [f"{n}-{p}" for n in layers for p in ("weight", "bias")]
        flow.optimizer.CombinedOptimizer([
            flow.optimizer.SGD(c["sgd_lr"], momentum=0.9, variables=wide_names),
            flow.optimizer.LazyAdam(c["adam_lr"], variables=deep_names),
        ]).minimize(loss)
        return loss

    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((B, c["dense"])).astype(np.float32),
                rng.integers(0, c["deep_vocab"] // 2, (B, c["deep_ids"])).astype(np.int32),  # rows unused too
                rng.integers(0, c["wide_vocab"], (B, c["wide_ids"])).astype(np.int32),
                rng.integers(0, 2, (B, 1)).astype(np.float32)) for _ in range(c["steps"])]
    train.compile(*batches[0])
    model = TorchWideDeep()
    params = model.by_flow_name()
    _copy_into(params, _flow_vars())
    wide_p = [model.wide.weight, model.wide_b]
    sgd = torch.optim.SGD(wide_p, lr=c["sgd_lr"], momentum=0.9)
    deep = {n: t for n, (t, _) in params.items() if n not in wide_names}
    state, flow_losses, torch_losses = {}, [], []
    for step, (d, di, wi, lab) in enumerate(batches):
        flow_losses.append(train(d, di, wi, lab).item())
        logits = model(torch.from_numpy(d), torch.from_numpy(di).long(), torch.from_numpy(wi).long())
        loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(lab))
        loss.backward()
        sgd.step()
        sgd.zero_grad()
        _oneflow_adam(deep, state, step, c["adam_lr"])
        torch_losses.append(loss.item())
    np.testing.assert_allclose(flow_losses, torch_losses, rtol=LOSS_RTOL)
    _compare_weights(params, _flow_vars(), 1e-4 * c["adam_lr"], "wide&deep")
    after = _flow_vars()["wdl-deep-embedding"]
    assert flow_losses[-1] < flow_losses[0], flow_losses
    # rows no batch looked up get zero gradients and keep their initial values
    unused = np.arange(c["deep_vocab"] // 2, c["deep_vocab"])
    np.testing.assert_array_equal(after[unused], model.emb.weight.detach().numpy()[unused])


# ================================================================ DCGAN generator / discriminator

GAN = dict(batch=4, z=8, g_ch=(8, 4), img=16, d_ch=(4, 8), lr=2e-3, beta1=0.5, steps=3)


def _gan_var(name, shape, seed, trainable):
    return flow.get_variable(name, shape=shape, trainable=trainable,
                             initializer=flow.random_normal_initializer(stddev=0.1, seed=seed))


def _flow_generator(z, trainable):
    c = GAN
    B, (c0, c1) = c["batch"], c["g_ch"]
    w = _gan_var("g-fc-weight", (c0 * 4 * 4, c["z"]), 20, trainable)
    h = flow.nn.leaky_relu(flow.reshape(flow.matmul(z, w, transpose_b=True), (B, c0, 4, 4)), alpha=0.2)
    w1 = _gan_var("g-deconv1-weight", (c0, c1, 4, 4), 21, trainable)      # (in, out, kh, kw)
    h = flow.nn.leaky_relu(flow.nn.conv2d_transpose(h, w1, output_shape=(B, c1, 8, 8), strides=2,
                                                    padding="SAME"), alpha=0.2)
    w2 = _gan_var("g-deconv2-weight", (c1, 1, 4, 4), 22, trainable)
    return flow.math.tanh(flow.nn.conv2d_transpose(h, w2, output_shape=(B, 1, 16, 16), strides=2, padding="SAME"))


def _flow_discriminator(x, trainable):
    c = GAN
    c0, c1 = c["d_ch"]
    pad = [[0, 0], [0, 0], [1, 1], [1, 1]]
    h = flow.nn.leaky_relu(flow.nn.conv2d(x, _gan_var("d-conv1-weight", (c0, 1, 4, 4), 30, trainable), 2, pad),
                           alpha=0.2)
    h = flow.nn.leaky_relu(flow.nn.conv2d(h, _gan_var("d-conv2-weight", (c1, c0, 4, 4), 31, trainable), 2, pad),
                           alpha=0.2)
    h = flow.reshape(h, (c["batch"], c1 * 4 * 4))
    w = _gan_var("d-fc-weight", (1, c1 * 4 * 4), 32, trainable)
    b = flow.get_variable("d-fc-bias", shape=(1,), trainable=trainable, initializer=flow.zeros_initializer())
    return flow.nn.bias_add(flow.matmul(h, w, transpose_b=True), b)


class TorchGenerator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        c, nn = GAN, torch.nn
        c0, c1 = c["g_ch"]
        self.fc = nn.Linear(c["z"], c0 * 16, bias=False)
        self.d1 = nn.ConvTranspose2d(c0, c1, 4, stride=2, padding=1, bias=False)
        self.d2 = nn.ConvTranspose2d(c1, 1, 4, stride=2, padding=1, bias=False)

    def forward(self, z):
        h = F.leaky_relu(self.fc(z).reshape(z.shape[0], GAN["g_ch"][0], 4, 4), 0.2)
        return torch.tanh(self.d2(F.leaky_relu(self.d1(h), 0.2)))

    def by_flow_name(self):
        return {"g-fc-weight": (self.fc.weight, None), "g-deconv1-weight": (self.d1.weight, None),
                "g-deconv2-weight": (self.d2.weight, None)}


class TorchDiscriminator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        nn = torch.nn
        c0, c1 = GAN["d_ch"]
        self.c1 = nn.Conv2d(1, c0, 4, stride=2, padding=1, bias=False)
        self.c2 = nn.Conv2d(c0, c1, 4, stride=2, padding=1, bias=False)
        self.fc = nn.Linear(c1 * 16, 1)

    def forward(self, x):
        h = F.leaky_relu(self.c2(F.leaky_relu(self.c1(x), 0.2)), 0.2)
        return self.fc(h.reshape(x.shape[0], -1))

    def by_flow_name(self):
        return {"d-conv1-weight": (self.c1.weight, None), "d-conv2-weight": (self.c2.weight, None),
                "d-fc-weight": (self.fc.weight, None), "d-fc-bias": (self.fc.bias, None)}


def test_dcgan_generator_and_discriminator_steps_match_pytorch():
    c = GAN
    B = c["batch"]
    img = (B, 1, c["img"], c["img"])

    def bce(label_value, logits):
        return flow.math.reduce_mean(flow.nn.sigmoid_cross_entropy_with_logits(
            flow.constant_like(logits, label_value), logits))

    @flow.global_function(type="train")
    def train_d(z: tp.Numpy.Placeholder((B, c["z"])), real: tp.Numpy.Placeholder(img)) -> tp.Numpy:
        fake = _flow_generator(z, trainable=False)
        loss = bce(1.0, _flow_discriminator(real, True)) + bce(0.0, _flow_discriminator(fake, True))
        flow.optimizer.Adam(c["lr"], beta1=c["beta1"], do_bias_correction=True).minimize(loss)
        return loss

    @flow.global_function(type="train")
    def train_g(z: tp.Numpy.Placeholder((B, c["z"]))) -> tp.Numpy:
        loss = bce(1.0, _flow_discriminator(_flow_generator(z, trainable=True), trainable=False))
        flow.optimizer.Adam(c["lr"], beta1=c["beta1"], do_bias_correction=True).minimize(loss)
        return loss

    rng = np.random.default_rng(4)
    steps = [(rng.standard_normal((B, c["z"])).astype(np.float32),
              np.tanh(rng.standard_normal(img)).astype(np.float32),
              rng.standard_normal((B, c["z"])).astype(np.float32)) for _ in range(c["steps"])]
    train_d.compile(*steps[0][:2])
    train_g.compile(steps[0][2])
    G, D = TorchGenerator(), TorchDiscriminator()
    gp, dp = G.by_flow_name(), D.by_flow_name()
    init = _flow_vars()
    _copy_into(gp, init)
    _copy_into(dp, init)
    g_params, d_params = {n: t for n, (t, _) in gp.items()}, {n: t for n, (t, _) in dp.items()}
    g_state, d_state = {}, {}
    flow_d, flow_g, torch_d, torch_g = [], [], [], []
    for step, (zd, real, zg) in enumerate(steps):
        flow_d.append(train_d(zd, real).item())
        flow_g.append(train_g(zg).item())
        # discriminator step: the generator's output is a constant here
        with torch.no_grad():
            fake = G(torch.from_numpy(zd))
        lr_, lf = D(torch.from_numpy(real)), D(fake)
        loss = (F.binary_cross_entropy_with_logits(lr_, torch.ones_like(lr_))
                + F.binary_cross_entropy_with_logits(lf, torch.zeros_like(lf)))
        loss.backward()
        _oneflow_adam(d_params, d_state, step, c["lr"], beta1=c["beta1"])
        torch_d.append(loss.item())
        # generator step: gradients pass through D, whose variables do not move
        out = D(G(torch.from_numpy(zg)))
        loss = F.binary_cross_entropy_with_logits(out, torch.ones_like(out))
        loss.backward()
        _oneflow_adam(g_params, g_state, step, c["lr"], beta1=c["beta1"])
        for t in d_params.values():
            t.grad = None
        torch_g.append(loss.item())
    np.testing.assert_allclose(flow_d, torch_d, rtol=LOSS_RTOL)
    np.testing.assert_allclose(flow_g, torch_g, rtol=LOSS_RTOL)
    after = _flow_vars()
    _compare_weights(gp, after, 1e-4 * c["lr"], "dcgan generator")
    _compare_weights(dp, after, 1e-4 * c["lr"], "dcgan discriminator")
    for n in list(gp) + list(dp):
        assert not np.array_equal(after[n], init[n]), f"{n} was not trained"
