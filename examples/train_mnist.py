"""The seed's job function: a 784-512-10 MLP trained with SGD on (Fashion-)MNIST.

The training code is OneFlow's example with only the imports changed; then a
predict job sharing the trained variables measures the test accuracy.

    python examples/train_mnist.py [--epochs 3] [--data fashion|mnist]
"""
import argparse
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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--data", choices=["auto", "mnist", "fashion"], default="auto")
    args = p.parse_args()
    (train_images, train_labels), (test_images, test_labels) = load(args.data)
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        for i, (images, labels) in enumerate(zip(train_images, train_labels)):
            loss = train_job(images, labels)
            if i % 20 == 0:
                print(loss.mean())
        print(f"epoch {epoch + 1}: test accuracy {accuracy(test_images, test_labels):.4f}")
    dt = time.perf_counter() - t0
    steps = args.epochs * len(train_images)
    print(f"trained {steps} steps in {dt:.1f} s ({dt / steps * 1e3:.2f} ms/step)")
    print(f"final test accuracy: {accuracy(test_images, test_labels):.4f}")


if __name__ == "__main__":
    main()
