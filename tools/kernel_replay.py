"""Dump the generated code of the project's own jobs, to compare two builds.

    python tools/kernel_replay.py OUT_DIR
    diff -r BEFORE_DIR AFTER_DIR

For the seed MLP (examples/train_mnist.py), LeNet (examples/lenet_train.py, SGD
and Adam) and the transformer LM (examples/transformer_lm.py, at its default
context with dropout and at one long enough that fusion picks the attention
family), train
and predict, it writes each compiled job's fusion plan, kernel descriptions,
runtime plan and LLVM IR into OUT_DIR/<job>.<stage>.txt, compiled with the disk
cache off. A change below the IR that should not change generated code (a
refactoring of fusion, of the kernel families, of the backend seam) shows as
an empty diff; anything else shows which kernel changed.
"""
import os
import sys

os.environ["FLOWJIT_DISABLE_CACHE"] = "1"
os.environ["FLOWJIT_KEEP_TEXT"] = "1"

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import flowjit as flow  # noqa: E402

STAGES = ("fusion", "kernels", "plan", "llvm")


def dump(out, name, job, *args):
    job(*args)
    compiled = job.compiled_jobs()
    if len(compiled) != 1:
        raise SystemExit(f"{name}: expected one compiled job, got {len(compiled)}")
    for stage in STAGES:
        text = compiled[0].as_text(stage)
        if not text:
            raise SystemExit(f"{name}: the {stage} text is empty")
        with open(os.path.join(out, f"{name}.{stage}.txt"), "w") as f:
            f.write(text)
    print(f"{name}: {compiled[0].num_kernels} kernels")


def images(rng, batch):
    return (rng.random((batch, 1, 28, 28), dtype=np.float32),
            rng.integers(0, 10, batch).astype(np.int32))


def main(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)

    import train_mnist as seed
    x, y = images(rng, seed.BATCH_SIZE)
    dump(out, "seed_train", seed.train_job, x, y)
    dump(out, "seed_eval", seed.eval_job, x)

    import lenet_train as lenet
    for opt in ("sgd", "adam"):
        flow.clear_default_session()
        x, y = images(rng, lenet.BATCH_SIZE)
        dump(out, f"lenet_{opt}_train", lenet.define_jobs(opt), x, y)
        dump(out, f"lenet_{opt}_eval", lenet.define_eval(), x)

    import transformer_lm as lm
    data = lm.encode("".join(chr(32 + i % 90) for i in range(200_000)))
    for tag, context, dropout in (("t128", 128, 0.1), ("t512", 512, 0.0)):
        flow.clear_default_session()
        cfg = lm.Config(batch=2 if context > 128 else 8, context=context, dropout=dropout, steps=100)
        tok, tgt = lm.batches(data, cfg, np.random.default_rng(0))
        train_job, eval_job = lm.make_jobs(cfg)
        dump(out, f"lm_{tag}_eval", eval_job, tok, tgt)
        dump(out, f"lm_{tag}_train", train_job, tok, tgt)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
