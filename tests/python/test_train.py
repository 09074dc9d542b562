"""Training end to end: the seed's MNIST job (examples/train_mnist.py), its
gradients against numpy, and which variables a train job updates."""
import time

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

BATCH_SIZE = 100


# ---------------------------------------------------------------- the seed's jobs (copied from
# examples/train_mnist.py; OneFlow's example with only the imports changed)

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


def accuracy(test_images, test_labels):
    correct = total = 0
    for images, labels in zip(test_images, test_labels):
        pred = eval_job(images)
        correct += int((pred == labels).sum())
        total += labels.size
    return correct / total


@pytest.fixture(scope="module")
def fashion_mnist():
    return flow.data.load_fashion_mnist(BATCH_SIZE)


@pytest.mark.slow
def test_seed_job_reaches_85_percent_on_fashion_mnist_in_3_epochs(fashion_mnist):
    (train_images, train_labels), (test_images, test_labels) = fashion_mnist
    t0 = time.perf_counter()
    for epoch in range(3):
        for images, labels in zip(train_images, train_labels):
            loss = train_job(images, labels)
            assert np.all(np.isfinite(loss))
    train_s = time.perf_counter() - t0
    acc = accuracy(test_images, test_labels)
    print(f"\n3 epochs ({3 * len(train_images)} steps) in {train_s:.1f} s "
          f"({train_s / (3 * len(train_images)) * 1e3:.2f} ms/step); test accuracy {acc:.4f}")
    assert acc >= 0.85
    assert len(train_job.compiled_jobs()) == 1 and len(eval_job.compiled_jobs()) == 1


def test_seed_job_50_steps_reduce_the_loss(fashion_mnist):
    (train_images, train_labels), (test_images, test_labels) = fashion_mnist
    losses = [float(train_job(images, labels).mean())
              for images, labels, _ in zip(train_images, train_labels, range(50))]
    # Fashion-MNIST from a truncated-normal(0.1) init: ~2.5 at the start,
    # ~0.6-0.8 after 50 steps at lr 0.1.
    assert losses[0] > 1.5
    assert np.mean(losses[-10:]) < 0.5 * losses[0], losses
    # the predict job shares the trained variables: far better than chance
    correct = sum(int((eval_job(x) == y).sum()) for x, y in zip(test_images[:10], test_labels[:10]))
    assert correct / (10 * BATCH_SIZE) > 0.5
    assert int(flow.get_all_variables()["System-Train-TrainStep-train_job"]) == 50


# ---------------------------------------------------------------- the MLP's gradients vs numpy

def mlp_train_job(dtype):
    """The seed's network, trained by SGD with lr 1 so that one step's change
    of each variable is its gradient."""
    fdt = flow.float64 if dtype == np.float64 else flow.float32
    cfg = flow.function_config()
    cfg.default_data_type(fdt)

    @flow.global_function(type="train", function_config=cfg)
    def mlp_grad_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=fdt),
                     labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
        reshape = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, name="hidden")
        logits = flow.layers.dense(hidden, 10, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss

    return mlp_grad_job


def np_mlp_loss_and_grads(p, x, labels):
    """Per-sample loss (N,) and the gradients of its mean (OneFlow scales by 1/N)."""
    n = x.shape[0]
    h_pre = x @ p["hidden-weight"].T + p["hidden-bias"]
    h = np.maximum(h_pre, 0)
    logits = h @ p["output-weight"].T + p["output-bias"]
    z = logits - logits.max(1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    loss = -np.log(prob[np.arange(n), labels])
    d_logits = prob.copy()
    d_logits[np.arange(n), labels] -= 1
    d_logits /= n
    d_h = (d_logits @ p["output-weight"]) * (h_pre > 0)
    return loss, {"output-weight": d_logits.T @ h, "output-bias": d_logits.sum(0),
                  "hidden-weight": d_h.T @ x, "hidden-bias": d_h.sum(0)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_gradients_against_numpy(dtype, fashion_mnist):
    (train_images, train_labels), _ = fashion_mnist
    images, labels = train_images[3].astype(dtype), train_labels[3]
    r = np.random.default_rng(7)
    params = {"hidden-weight": r.normal(0, 0.05, (512, 784)), "hidden-bias": r.normal(0, 0.1, (512,)),
              "output-weight": r.normal(0, 0.1, (10, 512)), "output-bias": r.normal(0, 0.1, (10,))}
    params = {k: v.astype(dtype) for k, v in params.items()}
    job = mlp_train_job(dtype)
    job(images, labels)  # creates the variables
    flow.load_variables(params)
    loss = job(images, labels)
    after = flow.get_all_variables()
    want_loss, want = np_mlp_loss_and_grads({k: v.astype(np.float64) for k, v in params.items()},
                                            images.reshape(BATCH_SIZE, -1).astype(np.float64), labels)
    assert loss.shape == (BATCH_SIZE,)
    if dtype == np.float64:
        rtol, rel_atol, loss_tol = 1e-10, 1e-12, 1e-12
    else:
        # float32 arithmetic (784-term sums), and the gradient read back as
        # w - (w - g): errors of ~1e-7 absolute, ~4e-7 of the largest gradient
        rtol, rel_atol, loss_tol = 1e-4, 1e-5, 1e-5
    np.testing.assert_allclose(loss, want_loss, rtol=loss_tol, atol=loss_tol)
    for k, g in want.items():
        got = params[k].astype(np.float64) - np.asarray(after[k], dtype=np.float64)
        np.testing.assert_allclose(got, g, rtol=rtol, atol=rel_atol * np.abs(g).max(), err_msg=k)


# ---------------------------------------------------------------- variables the loss does not use

def _two_variable_job(name, use, make_optimizer):
    def job(x: tp.Numpy.Placeholder((3,), dtype=flow.float32)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), dtype=flow.float32, initializer=flow.constant_initializer(1.0))
        v = flow.get_variable("v", shape=(3,), dtype=flow.float32, initializer=flow.constant_initializer(2.0))
        used = {"w": w, "v": v, "w_int": flow.cast(flow.cast(w, flow.int32), flow.float32) + v}[use]
        loss = flow.math.reduce_sum(used * x)
        make_optimizer().minimize(loss)
        return loss
    job.__name__ = name
    return flow.global_function(type="train")(job)


OPTIMIZERS = {
    "sgd": lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0),
    "momentum": lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9),
    "adam": lambda: flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.1])),
    "adamw_decay": lambda: flow.optimizer.AdamW(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                                                weight_decay=0.5),
    "lars_decay": lambda: flow.optimizer.LARS(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                                              lars_coefficient=0.01, weight_decay=0.5),
    "lamb_decay": lambda: flow.optimizer.LAMB(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                                              weight_decay=0.5),
}


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_variable_the_loss_does_not_use_is_unchanged(kind):
    # OneFlow updates only variables that get a gradient: no weight decay and
    # no optimizer state for the others.
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    job = _two_variable_job(f"uses_v_{kind}", "v", OPTIMIZERS[kind])
    for _ in range(3):
        job(x)
    values = flow.get_all_variables()
    np.testing.assert_array_equal(values["w"], np.full(3, 1.0, np.float32))
    assert not np.allclose(values["v"], 2.0)
    assert not any(n.startswith("w-") for n in values), sorted(values)


def test_gradient_through_an_integer_cast_reaches_the_variable_as_in_oneflow():
    # w reaches the loss only through cast -> int32 -> float32: OneFlow carries
    # the gradient through the casts (in int32, so x's 0.5 truncates to 0).
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    job = _two_variable_job("uses_w_int", "w_int", OPTIMIZERS["adamw_decay"])
    job(x)
    job(x)
    w = np.asarray(flow.get_all_variables()["w"])
    assert w[0] < 1.0 and w[1] > 1.0  # moved against the gradient (1, -2, 0)


def test_momentum_of_another_job_does_not_move_an_unused_variable():
    # Job a trains w with momentum; job b's loss does not use w: w keeps the
    # value job a left (OneFlow: job b has no update op for w).
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    job_a = _two_variable_job("trains_w", "w", OPTIMIZERS["momentum"])
    job_b = _two_variable_job("trains_v", "v", OPTIMIZERS["momentum"])
    job_a(x)
    job_a(x)
    w = np.asarray(flow.get_all_variables()["w"]).copy()
    # reference: v = 0.9 v - lr g; w += v, with g = x, lr = float32(0.1)
    lr = float(np.float32(0.1))
    v1 = -lr * x.astype(np.float64)
    v2 = 0.9 * v1 - lr * x
    np.testing.assert_allclose(w, 1.0 + v1 + v2, rtol=1e-6)
    job_b(x)
    job_b(x)
    np.testing.assert_array_equal(flow.get_all_variables()["w"], w)


def test_loss_without_variables_trains_nothing():
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)

    @flow.global_function(type="train")
    def no_vars(a: tp.Numpy.Placeholder((3,), dtype=flow.float32)) -> tp.Numpy:
        flow.get_variable("w", shape=(3,), dtype=flow.float32, initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(a * a)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    np.testing.assert_allclose(no_vars(x), 5.25)
    values = flow.get_all_variables()
    np.testing.assert_array_equal(values["w"], np.ones(3, np.float32))
    assert int(values["System-Train-TrainStep-no_vars"]) == 1
