"""ms per train step of the [zoo] model families (#26) and images/s of the
input pipeline: flowjit against PyTorch eager, torch.compile and a PIL
DataLoader, on the same cores, in one run.

- resnet50: ResNet-50 v1.5 (bottlenecks [3, 4, 6, 3], stride 2 in the 3x3
  convolution, projection shortcuts), train-mode batch norm, 1000 classes,
  sparse softmax cross-entropy, SGD with momentum 0.9 (no weight decay),
  float32 NCHW; batch 32 at 224x224 (--quick: batch 8 at 112x112).
- bert: BERT-base pretraining step (12 layers, hidden 768, 12 heads, FFN
  3072, vocabulary 30522; a padding mask in every attention; masked-LM loss
  on 20 positions per sequence through the tied word embedding plus the
  next-sentence loss), AdamW (bias correction, weight decay 0.01 except
  biases and layer norms), dropout 0 so every implementation does the same
  arithmetic; sequence 128, batch 8 (--quick: 2 layers, sequence 64, batch 4).
- wdl: Wide&Deep with OneFlow-Benchmark's WDL shape (26 deep sparse fields
  of 16-wide embeddings, 2 wide fields, 13 dense features, 7 hidden layers
  of 1024, sigmoid cross-entropy, LazyAdam at 1e-3, dropout 0) scaled to
  batch 512 and vocabularies of 200000 (its defaults are batch 16384 and
  1.6M); --quick: batch 256, vocabularies of 50000.
- input: images/s of the ImageNet training input pipeline on a small OFRecord
  set of JPEGs the script writes with flowjit.ofrecord: flowjit's job
  (ofrecord_reader, OFRecordImageDecoderRandomCrop, image.Resize to 224x224,
  CoinFlip, CropMirrorNormalize to float NCHW) against a torch DataLoader over
  the same JPEG files decoding with PIL (torchvision is not needed: the random
  resized crop, flip and normalization are written here with PIL and numpy),
  with as many worker processes as flowjit has threads, and in-process.

Every implementation gets the same batch each step (the input pipeline
excepted), is warmed up (compiled) outside the timing, and returns the loss
to the caller. torch.compile compiles the model's forward and loss (inductor,
default mode; its backward is compiled by AOTAutograd), the optimizer runs
eagerly (foreach), as bench_transformer.py does.

    python benchmarks/bench_models.py [--quick] [--only resnet50,bert,wdl,input] [--no-compile]
"""
import argparse
import functools
import gc
import math
import os
import shutil
import tempfile
import time

import numpy as np

import _common as C

CASES = ("resnet50", "bert", "wdl", "input")

FULL = {
    "resnet50": dict(batch=32, image=224, classes=1000, lr=0.1, momentum=0.9),
    "bert": dict(batch=8, seq=128, layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, preds=20,
                 lr=1e-4, wd=0.01),
    "wdl": dict(batch=512, deep_vocab=200_000, wide_vocab=200_000, emb=16, deep_fields=26, wide_fields=2,
                dense_fields=13, hidden=1024, layers=7, lr=1e-3),
    "input": dict(batch=32, images=128, size=224),
}
QUICK = {
    "resnet50": dict(FULL["resnet50"], batch=8, image=112),
    "bert": dict(FULL["bert"], batch=4, seq=64, layers=2, preds=10),
    "wdl": dict(FULL["wdl"], batch=256, deep_vocab=50_000, wide_vocab=50_000),
    "input": dict(FULL["input"], batch=16, images=64),
}
RESNET50_BLOCKS = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, first stride)
IMAGENET_MEAN = (123.68, 116.78, 103.94)
IMAGENET_STD = (58.393, 57.12, 57.375)


# ================================================================ ResNet-50

def _flow_resnet50(flow, x, classes):
    init = flow.variance_scaling_initializer(2.0, "fan_in", "random_normal", data_format="NCHW")

    def conv(h, name, co, k, stride):
        w = flow.get_variable(f"{name}-weight", shape=(co, h.shape[1], k, k), initializer=init)
        p = k // 2
        return flow.nn.conv2d(h, w, stride, [[0, 0], [0, 0], [p, p], [p, p]])

    def bn(h, name, relu=True):
        h = flow.layers.batch_normalization(h, axis=1, momentum=0.9, epsilon=1e-5, name=name)
        return flow.nn.relu(h) if relu else h

    h = bn(conv(x, "conv1", 64, 7, 2), "bn1")
    h = flow.nn.max_pool2d(h, 3, 2, [[0, 0], [0, 0], [1, 1], [1, 1]])
    for si, (width, blocks, stride) in enumerate(RESNET50_BLOCKS):
        for bi in range(blocks):
            s = stride if bi == 0 else 1
            name = f"res{si + 2}{chr(ord('a') + bi)}"
            y = bn(conv(h, f"{name}-branch2a", width, 1, 1), f"{name}-branch2a-bn")
            y = bn(conv(y, f"{name}-branch2b", width, 3, s), f"{name}-branch2b-bn")
            y = bn(conv(y, f"{name}-branch2c", width * 4, 1, 1), f"{name}-branch2c-bn", relu=False)
            if bi == 0:
                h = bn(conv(h, f"{name}-branch1", width * 4, 1, s), f"{name}-branch1-bn", relu=False)
            h = flow.nn.relu(y + h)
    pooled = flow.math.reduce_mean(h, axis=[2, 3])
    w = flow.get_variable("fc-weight", shape=(classes, pooled.shape[1]),
                          initializer=flow.random_normal_initializer(stddev=0.01))
    b = flow.get_variable("fc-bias", shape=(classes,), initializer=flow.zeros_initializer())
    return flow.nn.bias_add(flow.matmul(pooled, w, transpose_b=True), b)


def _torch_resnet50(torch, classes):
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            self.a = nn.Conv2d(cin, width, 1, bias=False)
            self.bna = nn.BatchNorm2d(width, eps=1e-5, momentum=0.1)
            self.b = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bnb = nn.BatchNorm2d(width, eps=1e-5, momentum=0.1)
            self.c = nn.Conv2d(width, width * 4, 1, bias=False)
            self.bnc = nn.BatchNorm2d(width * 4, eps=1e-5, momentum=0.1)
            self.proj = None
            if stride != 1 or cin != width * 4:
                self.proj = nn.Sequential(nn.Conv2d(cin, width * 4, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(width * 4, eps=1e-5, momentum=0.1))

        def forward(self, x):
            F = torch.nn.functional
            y = F.relu(self.bna(self.a(x)))
            y = F.relu(self.bnb(self.b(y)))
            y = self.bnc(self.c(y))
            return F.relu(y + (x if self.proj is None else self.proj(x)))

    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64, eps=1e-5, momentum=0.1),
              nn.ReLU(), nn.MaxPool2d(3, 2, padding=1)]
    cin = 64
    for width, blocks, stride in RESNET50_BLOCKS:
        for bi in range(blocks):
            layers.append(Bottleneck(cin, width, stride if bi == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def case_resnet50(flow, tp, torch, cfg):
    B, S, K = cfg["batch"], cfg["image"], cfg["classes"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, 3, S, S)).astype(np.float32)
    y = rng.integers(0, K, B).astype(np.int32)

    @flow.global_function(type="train")
    def train(images: tp.Numpy.Placeholder((B, 3, S, S)),
              labels: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
        logits = _flow_resnet50(flow, images, K)
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        flow.optimizer.SGD(cfg["lr"], momentum=cfg["momentum"]).minimize(loss)
        return loss

    def torch_setup():
        m = _torch_resnet50(torch, K)
        return m, torch.optim.SGD(m.parameters(), lr=cfg["lr"], momentum=cfg["momentum"], foreach=True)

    def torch_loss(model, a, b):
        return torch.nn.functional.cross_entropy(model(a), b)

    tx, ty = (torch.from_numpy(x), torch.from_numpy(y).long()) if torch else (None, None)
    return dict(case=f"resnet50 b{B} {S}x{S}", job=train, args=(x, y), torch_setup=torch_setup,
                torch_loss=torch_loss, torch_args=(tx, ty), per_step_items=B, items="images")


# ================================================================ BERT-base

def _flow_bert(flow, cfg, ids, mask, positions, cls_rows):
    B, T, H, NH, V = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"], cfg["vocab"]
    D = H // NH
    init = flow.truncated_normal_initializer(stddev=0.02)

    def dense(h, name, n_out):
        w = flow.get_variable(f"{name}-weight", shape=(n_out, h.shape[-1]), initializer=init)
        b = flow.get_variable(f"{name}-bias", shape=(n_out,), initializer=flow.zeros_initializer())
        return flow.nn.bias_add(flow.matmul(h, w, transpose_b=True), b)

    def ln(h, name):
        return flow.layers.layer_norm(h, begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-12,
                                      name=f"{name}-LayerNorm")

    def heads(v):
        return flow.transpose(flow.reshape(v, (B, T, NH, D)), perm=[0, 2, 1, 3])

    wte = flow.get_variable("word_embeddings", shape=(V, H), initializer=init)
    wpe = flow.get_variable("position_embeddings", shape=(T, H), initializer=init)
    wtt = flow.get_variable("token_type_embeddings", shape=(1, H), initializer=init)
    x = flow.reshape(ln(flow.gather(wte, ids) + wpe + wtt, "embeddings"), (B * T, H))
    mask_bias = (1.0 - flow.reshape(mask, (B, 1, 1, T))) * -10000.0
    for i in range(cfg["layers"]):
        p = f"layer{i}"
        q, k, v = (heads(dense(x, f"{p}-attention-{n}", H)) for n in ("query", "key", "value"))
        s = flow.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(D)) + mask_bias
        ctx = flow.reshape(flow.transpose(flow.matmul(flow.nn.softmax(s, axis=-1), v), perm=[0, 2, 1, 3]),
                           (B * T, H))
        x = ln(x + dense(ctx, f"{p}-attention-output", H), f"{p}-attention")
        x = ln(x + dense(flow.math.gelu(dense(x, f"{p}-intermediate", cfg["ffn"])), f"{p}-output", H),
               f"{p}-output")
    # masked LM: the predicted positions through a transform and the tied embedding
    h = ln(flow.math.gelu(dense(flow.gather(x, positions), "cls-transform", H)), "cls-transform")
    mlm_bias = flow.get_variable("cls-output-bias", shape=(V,), initializer=flow.zeros_initializer())
    mlm_logits = flow.nn.bias_add(flow.matmul(h, wte, transpose_b=True), mlm_bias)
    pooled = flow.math.tanh(dense(flow.gather(x, cls_rows), "pooler", H))
    return mlm_logits, dense(pooled, "cls-seq_relationship", 2)


def _torch_bert(torch, cfg):
    nn, F = torch.nn, torch.nn.functional
    B, T, H, NH, V = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"], cfg["vocab"]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.ModuleList(nn.Linear(H, H) for _ in range(3))
            self.out, self.ln1 = nn.Linear(H, H), nn.LayerNorm(H, eps=1e-12)
            self.fc1, self.fc2, self.ln2 = nn.Linear(H, cfg["ffn"]), nn.Linear(cfg["ffn"], H), nn.LayerNorm(H, 1e-12)

        def forward(self, x, bias):
            q, k, v = (m(x).reshape(B, T, NH, H // NH).transpose(1, 2) for m in self.qkv)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(B * T, H)
            x = self.ln1(x + self.out(ctx))
            return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, H), nn.Parameter(torch.randn(T, H) * 0.02)
            self.wtt, self.ln = nn.Parameter(torch.randn(1, H) * 0.02), nn.LayerNorm(H, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(cfg["layers"]))
            self.transform, self.tln = nn.Linear(H, H), nn.LayerNorm(H, eps=1e-12)
            self.mlm_bias = nn.Parameter(torch.zeros(V))
            self.pooler, self.nsp = nn.Linear(H, H), nn.Linear(H, 2)

        def forward(self, ids, mask, positions, cls_rows, mlm_labels, nsp_labels):
            x = self.ln(self.wte(ids) + self.wpe + self.wtt).reshape(B * T, H)
            bias = ((1.0 - mask.reshape(B, 1, 1, T)) * -10000.0)
            for layer in self.layers:
                x = layer(x, bias)
            h = self.tln(F.gelu(self.transform(x[positions])))
            mlm = F.cross_entropy(h @ self.wte.weight.t() + self.mlm_bias, mlm_labels)
            nsp = F.cross_entropy(self.nsp(torch.tanh(self.pooler(x[cls_rows]))), nsp_labels)
            return mlm + nsp

    m = Bert()
    with torch.no_grad():  # BERT's initialization (flowjit's side uses the same)
        for mod in m.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(mod.weight, std=0.02, a=-0.04, b=0.04)
            if isinstance(mod, nn.Linear):
                nn.init.zeros_(mod.bias)
    return m


def case_bert(flow, tp, torch, cfg):
    B, T, V, P = cfg["batch"], cfg["seq"], cfg["vocab"], cfg["preds"]
    rng = np.random.default_rng(1)
    ids = rng.integers(0, V, (B, T)).astype(np.int32)
    lengths = rng.integers(T // 2, T + 1, B)
    lengths[0] = T
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    positions = np.concatenate([b * T + rng.choice(lengths[b], P, replace=False) for b in range(B)]).astype(np.int32)
    cls_rows = (np.arange(B) * T).astype(np.int32)
    mlm_labels = rng.integers(0, V, B * P).astype(np.int32)
    nsp_labels = rng.integers(0, 2, B).astype(np.int32)
    excludes = ["bias", "LayerNorm"]

    @flow.global_function(type="train")
    def train(ids_: tp.Numpy.Placeholder((B, T), dtype=flow.int32), mask_: tp.Numpy.Placeholder((B, T)),
              pos_: tp.Numpy.Placeholder((B * P,), dtype=flow.int32),
              cls_: tp.Numpy.Placeholder((B,), dtype=flow.int32),
              mlm_: tp.Numpy.Placeholder((B * P,), dtype=flow.int32),
              nsp_: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
        mlm_logits, nsp_logits = _flow_bert(flow, cfg, ids_, mask_, pos_, cls_)
        ce = flow.nn.sparse_softmax_cross_entropy_with_logits
        loss = flow.math.reduce_mean(ce(mlm_, mlm_logits)) + flow.math.reduce_mean(ce(nsp_, nsp_logits))
        flow.optimizer.AdamW(cfg["lr"], do_bias_correction=True, weight_decay=cfg["wd"],
                             weight_decay_excludes=excludes).minimize(loss)
        return loss

    def torch_setup():
        m = _torch_bert(torch, cfg)
        named = list(m.named_parameters())
        no_decay = [p for n, p in named if n.endswith("bias") or ".ln" in n or n.startswith("ln")
                    or n.startswith("tln")]
        decay = [p for n, p in named if all(p is not q for q in no_decay)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["wd"]},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=cfg["lr"], foreach=True)
        return m, opt

    def torch_loss(model, *a):
        return model(*a)

    targs = None
    if torch:
        targs = (torch.from_numpy(ids).long(), torch.from_numpy(mask), torch.from_numpy(positions).long(),
                 torch.from_numpy(cls_rows).long(), torch.from_numpy(mlm_labels).long(),
                 torch.from_numpy(nsp_labels).long())
    case = f"bert h{cfg['hidden']} l{cfg['layers']} b{B} t{T}"
    return dict(case=case, job=train, args=(ids, mask, positions, cls_rows, mlm_labels, nsp_labels),
                torch_setup=torch_setup, torch_loss=torch_loss, torch_args=targs, per_step_items=B * T,
                items="tokens")


# ================================================================ Wide&Deep

def _flow_wdl(flow, cfg, dense, deep_ids, wide_ids):
    B = cfg["batch"]
    uni = flow.random_uniform_initializer(-0.05, 0.05)
    emb = flow.get_variable("deep_embedding", shape=(cfg["deep_vocab"], cfg["emb"]), initializer=uni)
    wide = flow.get_variable("wide_embedding", shape=(cfg["wide_vocab"], 1), initializer=uni)
    wide_logit = flow.math.reduce_sum(flow.gather(wide, wide_ids), axis=[1])
    h = flow.concat([flow.reshape(flow.gather(emb, deep_ids), (B, cfg["deep_fields"] * cfg["emb"])), dense],
                    axis=1)
    for i in range(cfg["layers"] + 1):
        n_out = cfg["hidden"] if i < cfg["layers"] else 1
        w = flow.get_variable(f"fc{i}-weight", shape=(n_out, h.shape[1]), initializer=flow.xavier_uniform_initializer())
        b = flow.get_variable(f"fc{i}-bias", shape=(n_out,), initializer=flow.zeros_initializer())
        h = flow.nn.bias_add(flow.matmul(h, w, transpose_b=True), b)
        if i < cfg["layers"]:
            h = flow.nn.relu(h)
    return h + wide_logit


def _torch_wdl(torch, cfg, sparse):
    nn, F = torch.nn, torch.nn.functional

    class WDL(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(cfg["deep_vocab"], cfg["emb"], sparse=sparse)
            self.wide = nn.Embedding(cfg["wide_vocab"], 1, sparse=sparse)
            sizes = [cfg["deep_fields"] * cfg["emb"] + cfg["dense_fields"]] + [cfg["hidden"]] * cfg["layers"]
            self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
            self.out = nn.Linear(cfg["hidden"], 1)

        def forward(self, dense, deep_ids, wide_ids, labels):
            h = torch.cat([self.emb(deep_ids).flatten(1), dense], 1)
            for fc in self.fcs:
                h = F.relu(fc(h))
            logits = self.out(h) + self.wide(wide_ids).sum(1)
            return F.binary_cross_entropy_with_logits(logits, labels)

    m = WDL()
    with torch.no_grad():  # the initializers of flowjit's side
        for mod in m.modules():
            if isinstance(mod, nn.Embedding):
                nn.init.uniform_(mod.weight, -0.05, 0.05)
            elif isinstance(mod, nn.Linear):
                nn.init.xavier_uniform_(mod.weight)
                nn.init.zeros_(mod.bias)
    return m


def case_wdl(flow, tp, torch, cfg):
    B = cfg["batch"]
    rng = np.random.default_rng(2)
    dense = rng.random((B, cfg["dense_fields"]), dtype=np.float32)
    deep_ids = rng.integers(0, cfg["deep_vocab"], (B, cfg["deep_fields"])).astype(np.int32)
    wide_ids = rng.integers(0, cfg["wide_vocab"], (B, cfg["wide_fields"])).astype(np.int32)
    labels = rng.integers(0, 2, (B, 1)).astype(np.float32)

    @flow.global_function(type="train")
    def train(dense_: tp.Numpy.Placeholder(dense.shape), deep_: tp.Numpy.Placeholder(deep_ids.shape, dtype=flow.int32),
              wide_: tp.Numpy.Placeholder(wide_ids.shape, dtype=flow.int32),
              labels_: tp.Numpy.Placeholder(labels.shape)) -> tp.Numpy:
        logits = _flow_wdl(flow, cfg, dense_, deep_, wide_)
        loss = flow.math.reduce_mean(flow.nn.sigmoid_cross_entropy_with_logits(labels_, logits))
        flow.optimizer.LazyAdam(cfg["lr"]).minimize(loss)
        return loss

    def torch_setup(sparse=False):
        m = _torch_wdl(torch, cfg, sparse)
        if not sparse:
            return m, torch.optim.Adam(m.parameters(), lr=cfg["lr"], foreach=True)
        emb = [m.emb.weight, m.wide.weight]
        rest = [p for p in m.parameters() if all(p is not q for q in emb)]
        return m, _MultiOpt(torch.optim.SparseAdam(emb, lr=cfg["lr"]),
                            torch.optim.Adam(rest, lr=cfg["lr"], foreach=True))

    def torch_loss(model, *a):
        return model(*a)

    targs = None
    if torch:
        targs = (torch.from_numpy(dense), torch.from_numpy(deep_ids).long(), torch.from_numpy(wide_ids).long(),
                 torch.from_numpy(labels))
    case = f"wdl b{B} vocab {cfg['deep_vocab']} {cfg['layers']}x{cfg['hidden']}"
    extra = {"torch eager, sparse embeddings": (functools.partial(torch_setup, True),
                                                "nn.Embedding(sparse=True), SparseAdam + Adam")}
    return dict(case=case, job=train, args=(dense, deep_ids, wide_ids, labels), torch_setup=torch_setup,
                torch_loss=torch_loss, torch_args=targs, per_step_items=B, items="samples", extra_torch=extra)


class _MultiOpt:
    def __init__(self, *opts):
        self.opts = opts

    def step(self):
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)


# ================================================================ model runner

def _torch_step(model, opt, loss_fn, args):
    def step():
        loss = loss_fn(model, *args)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def _error_line(e):
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]


def run_model(name, spec, torch, nthreads, args):
    """Times one model's train step; returns rows."""
    case, bench = spec["case"], "models"
    rows, fns, notes = [], {}, {}
    job, jargs = spec["job"], spec["args"]
    try:
        t0 = time.perf_counter()
        first = float(np.mean(job(*jargs)))  # trace + compile + first step
        compile_s = time.perf_counter() - t0
        jk = job.compiled_jobs()[0]
        print(f"# {name}: flowjit first call (compile + step) {compile_s:.1f} s, {jk.num_kernels} kernels, "
              f"arena {jk.arena_bytes / 2**20:.0f} MiB, first loss {first:.4f}", flush=True)
        fns["flowjit"] = lambda: job(*jargs)
        notes["flowjit"] = f"{jk.num_kernels} kernels, {nthreads} threads, first call {compile_s:.0f} s"
    except Exception as e:  # noqa: BLE001 - reported in the table, never hidden
        why = _error_line(e)
        print(f"# FAIL flowjit {name}: {why}", flush=True)
        rows.append(C.skipped(bench, case, "flowjit", f"FAILED: {why}"))

    if torch is None:
        rows += [C.skipped(bench, case, i, "torch is not installed") for i in ("torch eager", "torch.compile")]
    else:
        model, opt = spec["torch_setup"]()
        step = _torch_step(model, opt, spec["torch_loss"], spec["torch_args"])
        t0 = time.perf_counter()
        first = float(step())
        print(f"# {name}: torch eager first step {time.perf_counter() - t0:.1f} s, loss {first:.4f}", flush=True)
        fns["torch eager"] = step
        notes["torch eager"] = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
        for impl, (setup, note) in spec.get("extra_torch", {}).items():
            m2, o2 = setup()
            fns[impl] = _torch_step(m2, o2, spec["torch_loss"], spec["torch_args"])
            fns[impl]()
            notes[impl] = note
        crash = None if args.no_compile else C.torch_compile_failure()
        if args.no_compile:
            rows.append(C.skipped(bench, case, "torch.compile", "--no-compile"))
        elif crash:
            rows.append(C.skipped(bench, case, "torch.compile", crash))
        else:
            try:
                import logging
                logging.getLogger("torch").setLevel(logging.ERROR)
                m3, o3 = spec["torch_setup"]()
                compiled = torch.compile(spec["torch_loss"])
                cstep = _torch_step(m3, o3, compiled, spec["torch_args"])
                t0 = time.perf_counter()
                cstep()
                cstep()
                comp_s = time.perf_counter() - t0
                print(f"# {name}: torch.compile first two steps {comp_s:.1f} s", flush=True)
                fns["torch.compile"] = cstep
                notes["torch.compile"] = f"inductor, forward+loss compiled, first 2 steps {comp_s:.0f} s"
            except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
                why = _error_line(e)[:150]
                print(f"# SKIP torch.compile: {why}", flush=True)
                rows.append(C.skipped(bench, case, "torch.compile", f"failed: {why}"))

    if fns:
        with C.blas_threads(nthreads):
            times = C.interleaved(fns, warmup=args.warmup, reps=args.reps, inner=1, cooldown_s=0.2)
        for impl, (best, med) in times.items():
            note = f"{notes[impl]}; {C.fmt(spec['per_step_items'] / best)} {spec['items']}/s"
            rows.append(C.row(bench, case, impl, best * 1e3, med * 1e3, "ms/step", note))
    return rows


# ================================================================ input pipeline

def _write_jpegs(root, n, rng):
    """n JPEGs of ImageNet-like sizes (smooth color fields with noise, which
    compress and decode like photographs rather than like white noise)."""
    from PIL import Image
    paths = []
    for i in range(n):
        cls = f"class{i % 4}"
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        h, w = int(rng.integers(300, 500)), int(rng.integers(350, 500))
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([np.sin(xx / rng.uniform(10, 60) + c) * np.cos(yy / rng.uniform(10, 60) - c)
                         for c in range(3)], -1)
        img = np.clip(127 + 100 * base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        p = os.path.join(root, cls, f"{i:05d}.jpg")
        Image.fromarray(img).save(p, quality=90)
        paths.append(p)
    return paths


def _random_resized_crop_box(w, h, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    area = w * h
    for _ in range(10):
        target = area * rng.uniform(*scale)
        ar = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = int(round(math.sqrt(target * ar))), int(round(math.sqrt(target / ar)))
        if 0 < cw <= w and 0 < ch <= h:
            x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return x0, y0, x0 + cw, y0 + ch
    s = min(w, h)
    return (w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s


class _PILTrainSet:
    """Decode with PIL, random resized crop (bilinear), random flip, normalize
    to float CHW: the same augmentation as flowjit's job, in PIL and numpy."""

    def __init__(self, paths, size):
        self.paths, self.size = paths, size
        self.mean = np.array(IMAGENET_MEAN, np.float32)
        self.inv_std = 1.0 / np.array(IMAGENET_STD, np.float32)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image
        import torch
        rng = np.random.default_rng()
        with Image.open(self.paths[i]) as im:
            im = im.convert("RGB")
            box = _random_resized_crop_box(im.width, im.height, rng)
            im = im.resize((self.size, self.size), Image.BILINEAR, box=box)
            if rng.random() < 0.5:
                im = im.transpose(Image.FLIP_LEFT_RIGHT)
            a = (np.asarray(im, np.float32) - self.mean) * self.inv_std
        return torch.from_numpy(a.transpose(2, 0, 1).copy()), i % 4


def run_input(flow, tp, torch, nthreads, cfg, args):
    bench, B, S = "models", cfg["batch"], cfg["size"]
    case = f"input jpeg->{S}x{S} b{B}"
    rows, fns, notes = [], {}, {}
    tmp = tempfile.mkdtemp(prefix="flowjit_bench_models_")
    import flowjit.ofrecord as ofr
    try:
        from PIL import Image  # noqa: F401
    except ImportError:
        return [C.skipped(bench, case, "flowjit", "PIL is needed to write the JPEGs (pip install pillow)")]
    paths = _write_jpegs(os.path.join(tmp, "jpeg"), cfg["images"], np.random.default_rng(3))
    nbytes = sum(os.path.getsize(p) for p in paths)
    ofr.write_image_folder(os.path.join(tmp, "jpeg"), os.path.join(tmp, "ofrecord"), parts=1)
    print(f"# input: {len(paths)} JPEGs ({nbytes / len(paths) / 1024:.0f} KiB each on average) in {tmp}",
          flush=True)
    d = os.path.join(tmp, "ofrecord")

    @flow.global_function()
    def input_job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(d, batch_size=B, random_shuffle=True)
        img = flow.data.OFRecordImageDecoderRandomCrop(r, "encoded", color_space="RGB")
        rsz = flow.image.Resize(img, target_size=(S, S))[0]
        flip = flow.random.CoinFlip(batch_size=B)
        return flow.image.CropMirrorNormalize(rsz, mirror_blob=flip, color_space="RGB", output_layout="NCHW",
                                              mean=IMAGENET_MEAN, std=IMAGENET_STD, output_dtype=flow.float)

    try:
        out = input_job()
        assert out.shape == (B, 3, S, S), out.shape
        fns["flowjit"] = input_job
        notes["flowjit"] = "ofrecord_reader + RandomCrop decoder + Resize + CoinFlip + CropMirrorNormalize"
    except Exception as e:  # noqa: BLE001
        why = _error_line(e)
        print(f"# FAIL flowjit input pipeline: {why}", flush=True)
        rows.append(C.skipped(bench, case, "flowjit", f"FAILED: {why}"))
    loaders = []
    if torch is None:
        rows.append(C.skipped(bench, case, "torch DataLoader (PIL)", "torch is not installed"))
    else:
        for workers in (nthreads, 0):
            dl = torch.utils.data.DataLoader(_PILTrainSet(paths, S), batch_size=B, shuffle=True, drop_last=True,
                                             num_workers=workers, persistent_workers=workers > 0)
            loaders.append(dl)
            state = {"it": iter(dl)}

            def nxt(state=state, dl=dl):
                try:
                    return next(state["it"])
                except StopIteration:
                    state["it"] = iter(dl)
                    return next(state["it"])

            impl = f"DataLoader PIL, {workers} workers" if workers else "PIL in process"
            fns[impl] = nxt
            notes[impl] = (f"torch DataLoader, {workers} worker processes" if workers
                           else "torch DataLoader, num_workers=0")
    if fns:
        # A fixed count of batches per repetition (an epoch of the set): a
        # calibrated one would be fooled by the batches the loaders prefetched.
        times = C.interleaved(fns, warmup=3, reps=args.reps + 2, inner=max(2, cfg["images"] // B), cooldown_s=0.2)
        fj = times.get("flowjit")
        for impl, (best, med) in times.items():
            r = C.row(bench, case, impl, B / best, B / med, "images/s", notes[impl])
            if fj and impl != "flowjit":
                r["speedup"] = best / fj[0]
            rows.append(r)
    del loaders
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


# ================================================================ main

def run(args):
    import flowjit as flow
    import flowjit.typing as tp
    from flowjit import _C
    nthreads = _C.num_threads()
    torch = C.peer("torch")
    if torch is not None:
        torch.set_num_threads(nthreads)
    sizes = QUICK if args.quick else FULL
    only = [c.strip() for c in args.only.split(",")] if args.only else list(CASES)
    unknown = [c for c in only if c not in CASES]
    if unknown:
        raise SystemExit(f"--only: unknown case(s) {unknown}; the cases are {', '.join(CASES)}")
    makers = {"resnet50": case_resnet50, "bert": case_bert, "wdl": case_wdl}
    rows = []
    for name in only:
        C.print_load(f"(before {name})")
        flow.clear_default_session()
        if name == "input":
            rows += run_input(flow, tp, torch, nthreads, sizes["input"], args)
        else:
            spec = makers[name](flow, tp, torch, sizes[name])
            rows += run_model(name, spec, torch, nthreads, args)
            del spec
        flow.clear_default_session()
        gc.collect()
    C.print_load("(models, after)")
    return rows


if __name__ == "__main__":
    C.fair_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller batches, images and BERT (a few minutes)")
    ap.add_argument("--only", default="", help=f"comma-separated cases of {', '.join(CASES)}")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (its compiles take minutes)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions (one step each) per implementation")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per implementation before timing")
    a = ap.parse_args()
    C.header()
    title = (f"[zoo] model train steps and input pipeline ({'quick' if a.quick else 'full'} sizes; best and "
             f"median of {a.reps} interleaved repetitions after warm-up)")
    C.print_rows(run(a), title)
