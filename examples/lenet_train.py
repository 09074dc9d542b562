"""OneFlow's LeNet on Fashion-MNIST: train, save a checkpoint, reload it, test.

The model is OneFlow's quick-start LeNet (conv 32 5x5 SAME + ReLU, max-pool 2,
conv 64 5x5 SAME + ReLU, max-pool 2, dense 512 + ReLU, dropout 0.5 while
training, dense 10) with only the imports changed. A predict job in a fresh
session reloads the checkpoint and reports the test accuracy.

    python examples/lenet_train.py [--epochs 3] [--optimizer adam|sgd] [--checkpoint DIR] [--steps N]
                                   [--amp bfloat16|float16]

Progress shows as in train_mnist.py: tqdm's bar when installed, else a line
rewritten in place on a terminal, or one line per epoch in a log file.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

import flowjit as flow
import flowjit.typing as tp

BATCH_SIZE = 100


def lenet(data, train=False):
    initializer = flow.truncated_normal(0.1)
    conv1 = flow.layers.conv2d(data, 32, 5, padding="SAME", activation=flow.nn.relu, name="conv1",
                               kernel_initializer=initializer)
    pool1 = flow.nn.max_pool2d(conv1, ksize=2, strides=2, padding="SAME", name="pool1", data_format="NCHW")
    conv2 = flow.layers.conv2d(pool1, 64, 5, padding="SAME", activation=flow.nn.relu, name="conv2",
                               kernel_initializer=initializer)
    pool2 = flow.nn.max_pool2d(conv2, ksize=2, strides=2, padding="SAME", name="pool2", data_format="NCHW")
    reshape = flow.reshape(pool2, [pool2.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, kernel_initializer=initializer,
                               name="dense1")
    if train:
        hidden = flow.nn.dropout(hidden, rate=0.5, name="dropout")
    return flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="dense2")


def job_config(amp):
    config = flow.function_config()
    if amp:
        config.enable_auto_mixed_precision(True, dtype=getattr(flow, amp))
    return config


def define_jobs(optimizer, amp=None):
    @flow.global_function(type="train", function_config=job_config(amp))
    def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
        logits = lenet(images, train=True)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
        if optimizer == "adam":
            opt = flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3]))
        else:
            opt = flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9)
        opt.minimize(loss)
        return loss

    return train_job


def define_eval(amp=None):
    @flow.global_function(type="predict", function_config=job_config(amp))
    def eval_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return flow.math.argmax(lenet(images, train=False))

    return eval_job


class Progress:
    """The epoch's progress as train_mnist.py shows it: tqdm's bar when tqdm is
    installed, else one line rewritten in place on a terminal, and a single
    line per epoch when the output is a file or a pipe (CI logs)."""

    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.t0 = total, desc, 0, time.perf_counter()
        self.tty = sys.stdout.isatty()
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit="step", leave=True)
        except ImportError:
            self.bar = None

    def update(self, n, loss):
        self.n += n
        rate = self.n * BATCH_SIZE / max(time.perf_counter() - self.t0, 1e-9)
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{rate:,.0f}")
        elif self.tty or self.n == self.total:
            width = 30
            filled = width * self.n // self.total
            line = (f"{self.desc} [{'#' * filled}{'.' * (width - filled)}] {self.n}/{self.total} "
                    f"loss {loss:.4f}  {rate:,.0f} img/s")
            print(("\r" if self.tty else "") + line, end="" if self.tty else "\n", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            print()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--checkpoint", default=None, help="folder for the checkpoint (default: a temporary one)")
    p.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    p.add_argument("--amp", choices=["bfloat16", "float16"], default=None,
                   help="automatic mixed precision in this half type (default: float32 throughout)")
    args = p.parse_args()
    (train_images, train_labels), (test_images, test_labels) = flow.data.load_fashion_mnist(BATCH_SIZE)
    train_job = define_jobs(args.optimizer, args.amp)
    n = len(train_images) if args.steps <= 0 else min(args.steps, len(train_images))
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        losses = []
        bar = Progress(n, f"epoch {epoch + 1}/{args.epochs}")
        for i in range(n):
            loss = float(train_job(train_images[i], train_labels[i]).mean())
            losses.append(loss)
            if i % 10 == 9 or i == n - 1:
                bar.update(i + 1 - bar.n, float(np.mean(losses[-10:])))
        bar.close()
    train_s = time.perf_counter() - t0
    ckpt = args.checkpoint or os.path.join(tempfile.mkdtemp(prefix="lenet-"), "model")
    flow.checkpoint.save(ckpt)
    print(f"trained {args.epochs} epochs in {train_s:.1f} s; checkpoint saved to {ckpt}")

    # A fresh session: the predict job sees only what the checkpoint holds.
    flow.clear_default_session()
    eval_job = define_eval(args.amp)
    flow.load_variables(flow.checkpoint.get(ckpt))
    correct = total = 0
    for images, labels in zip(test_images, test_labels):
        correct += int((eval_job(images) == labels).sum())
        total += labels.size
    print(f"test accuracy {correct / total:.4f}")


if __name__ == "__main__":
    main()
