"""OneFlow's mixed_parallel_mlp.py (the seed's pointer, "Consistent and
Mirrored views"): the seed's MLP on 2 devices, the first layer data-parallel
and the second split by output units. Only the imports changed, and the
devices are CPU devices (OneFlow's example asks for gpu_device_num(2)).
Process 0 prints the loss every 20 steps (every process computes the same).

    python examples/mixed_parallel_mlp.py [--steps N] [--devices N]
    # over 2 processes (the same script in each, as in OneFlow):
    python -m flowjit.launch --nproc-per-node 2 examples/mixed_parallel_mlp.py --devices 1
    # or by hand, with the job's token:
    export FLOWJIT_STORE_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
    FLOWJIT_WORLD_SIZE=2 FLOWJIT_RANK=0 FLOWJIT_MASTER_PORT=29500 python examples/mixed_parallel_mlp.py --devices 1 &
    FLOWJIT_WORLD_SIZE=2 FLOWJIT_RANK=1 FLOWJIT_MASTER_PORT=29500 python examples/mixed_parallel_mlp.py --devices 1
"""
import argparse

import flowjit as flow
import flowjit.typing as tp

BATCH_SIZE = 100


def mlp(data):
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(data, [data.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, kernel_initializer=initializer,
                               name="hidden")
    return flow.layers.dense(hidden, 10, kernel_initializer=initializer,
                             # the second layer is split by its output units
                             model_distribute=flow.distribute.split(axis=0), name="dense2")


def get_train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.default_logical_view(flow.scope.consistent_view())
    return config


@flow.global_function(type="train", function_config=get_train_config())
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
    logits = mlp(images)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=2, help="CPU devices per process")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: all)")
    args = ap.parse_args()
    flow.config.cpu_device_num(args.devices)
    check_point = flow.train.CheckPoint()
    check_point.init()
    try:
        (train_images, train_labels), _ = flow.data.load_mnist(BATCH_SIZE, BATCH_SIZE, url=None)
    except (FileNotFoundError, OSError):
        print("MNIST not found locally; using Fashion-MNIST (Debian's dataset-fashion-mnist)")
        (train_images, train_labels), _ = flow.data.load_fashion_mnist(BATCH_SIZE, BATCH_SIZE)
    # Every process computes the same (consistent view) loss: one prints it.
    rank0 = flow.env.get_rank() == 0
    if rank0:
        print(f"{flow.env.get_world_size()} process(es) x {args.devices} CPU device(s)")
    step = 0
    for epoch in range(args.epochs):
        for images, labels in zip(train_images, train_labels):
            loss = train_job(images, labels)
            step += 1
            if rank0 and (step % 20 == 1 or step == args.steps):
                print(f"epoch {epoch + 1} step {step:4d}  loss {loss.mean():.4f}")
            if args.steps and step >= args.steps:
                return


if __name__ == "__main__":
    main()
