"""The seed's job function: a 784-512-10 MLP trained with SGD on (Fashion-)MNIST.

The training code is OneFlow's example with only the imports changed; then a
predict job sharing the trained variables measures the test accuracy.

    python examples/train_mnist.py [--epochs 3] [--data auto|fashion|mnist] [--plot curve.png]

--data auto (the default) uses MNIST when it is on this machine, else
Fashion-MNIST. Progress shows as a bar with the loss and throughput (tqdm when
installed, a plain one-line bar otherwise); --plot saves the loss and accuracy
curves as a PNG when matplotlib is installed.
"""
import argparse
import sys
import time

import numpy as np

import flowjit as flow
import flowjit.typing as tp

BATCH_SIZE = 100


def get_train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    return config


@flow.global_function(type="train", function_config=get_train_config())
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu,
                               kernel_initializer=initializer, name="hidden")
    logits = flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="output")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)
    return loss


@flow.global_function(type="predict", function_config=get_train_config())
def eval_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
    reshape = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, name="hidden")
    logits = flow.layers.dense(hidden, 10, name="output")
    return flow.math.argmax(logits)


def load(which):
    if which == "mnist":
        return flow.data.load_mnist(BATCH_SIZE)
    if which == "fashion":
        return flow.data.load_fashion_mnist(BATCH_SIZE)
    try:
        return flow.data.load_mnist(BATCH_SIZE, url=None)
    except OSError:
        print("MNIST not found locally; using Fashion-MNIST (Debian's dataset-fashion-mnist)")
        return flow.data.load_fashion_mnist(BATCH_SIZE)


def accuracy(test_images, test_labels):
    correct = total = 0
    for images, labels in zip(test_images, test_labels):
        pred = eval_job(images)
        correct += int((pred == labels).sum())
        total += labels.size
    return correct / total


class Progress:
    """A progress bar with the running loss and images/s: tqdm's when it is
    installed, else one line rewritten in place (a line per update when the
    output is not a terminal, e.g. CI logs)."""

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
            return
        if not self.tty and self.n % max(1, self.total // 4) and self.n != self.total:
            return
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


def save_plot(path, losses, accuracies, steps_per_epoch):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot written")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.8, label="train loss (mean of the batch)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot([(e + 1) * steps_per_epoch for e in range(len(accuracies))], accuracies, "o-", color="C1",
             label="test accuracy")
    ax2.set_ylabel("test accuracy")
    # Below the axes, where it covers no point (the accuracy's last point is
    # at the top right, the loss's first at the top left).
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(loc="lower center", ncol=2, frameon=False)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--data", choices=["auto", "mnist", "fashion"], default="auto")
    p.add_argument("--plot", metavar="PNG", help="save the loss and accuracy curves (needs matplotlib)")
    args = p.parse_args()
    (train_images, train_labels), (test_images, test_labels) = load(args.data)
    losses, accuracies = [], []
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        bar = Progress(len(train_images), f"epoch {epoch + 1}/{args.epochs}")
        for i, (images, labels) in enumerate(zip(train_images, train_labels)):
            loss = float(train_job(images, labels).mean())
            losses.append(loss)
            if i % 10 == 9 or i == len(train_images) - 1:
                bar.update(i + 1 - bar.n, float(np.mean(losses[-10:])))
        bar.close()
        accuracies.append(accuracy(test_images, test_labels))
        print(f"epoch {epoch + 1}: test accuracy {accuracies[-1]:.4f}")
    dt = time.perf_counter() - t0
    steps = args.epochs * len(train_images)
    print(f"trained {steps} steps in {dt:.1f} s ({dt / steps * 1e3:.2f} ms/step)")
    print(f"final test accuracy: {accuracy(test_images, test_labels):.4f}")
    if args.plot:
        save_plot(args.plot, losses, accuracies, len(train_images))


if __name__ == "__main__":
    main()
