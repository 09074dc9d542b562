"""One process of a multi-process test (tests/python/test_multiprocess.py):
trains the seed MLP for a few steps on synthetic data and saves the loss and
the variables. Its role comes from the environment (FLOWJIT_*, torchrun's, mpirun's
or Slurm's variables, see flow.env); the same script runs in every process,
as in OneFlow."""
import os
import sys

import numpy as np

import flowjit as flow
import flowjit.typing as tp

BATCH = 100


def main(out, local, mode, steps, exit_after):
    if os.environ.get("MP_WORKER_ONEFLOW_ENV"):  # OneFlow's form instead of FLOWJIT_WORLD_SIZE
        world = int(os.environ.pop("FLOWJIT_WORLD_SIZE"))
        flow.env.machine([{"addr": "127.0.0.1"}] * world)
        flow.env.ctrl_port(int(os.environ.pop("FLOWJIT_MASTER_PORT")))
        os.environ["FLOWJIT_WORLD_SIZE"] = str(world)  # read back below for the data split only
    flow.config.cpu_device_num(local)
    split, mirrored = mode == "split", mode in ("mirrored", "reader_mirrored")
    reader = mode.startswith("reader")  # the batch from flow.data.ofrecord_reader, not from the caller
    rank, world = flow.env.get_rank(), flow.env.get_world_size()  # from whichever launcher started us
    devices = local * world
    cfg = flow.function_config()
    if mirrored:
        cfg.default_logical_view(flow.scope.mirrored_view())
    per = BATCH // devices if mirrored else BATCH
    Input = tp.ListNumpy if mirrored else tp.Numpy

    def model(images, labels):
        initializer = flow.truncated_normal(0.1)
        reshape = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu,
                                   kernel_initializer=initializer, name="hidden")
        logits = flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="output",
                                   model_distribute=flow.distribute.split(axis=0) if split else None)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    if reader:
        @flow.global_function(type="train", function_config=cfg)
        def read_job() -> Input:
            r = flow.data.ofrecord_reader(os.environ["MP_WORKER_OFRECORD"], batch_size=BATCH, data_part_num=2,
                                          random_shuffle=True, shuffle_buffer_size=64)
            images = flow.data.OFRecordRawDecoder(r, "images", shape=(1, 28, 28), dtype=flow.float)
            labels = flow.data.OFRecordRawDecoder(r, "labels", shape=(), dtype=flow.int32)
            return model(images, labels)

        def train_job(x, y):  # the reader's batch instead of the caller's
            return read_job()
    else:
        @flow.global_function(type="train", function_config=cfg)
        def train_job(images: Input.Placeholder((per, 1, 28, 28), dtype=flow.float),
                      labels: Input.Placeholder((per,), dtype=flow.int32)) -> Input:
            return model(images, labels)

    rng = np.random.default_rng(7)
    losses = []
    for step in range(steps):
        if step == exit_after and rank == world - 1:
            os._exit(3)  # a process that dies without a word
        x = rng.random((BATCH, 1, 28, 28), dtype=np.float32)
        y = rng.integers(0, 10, BATCH).astype(np.int32)
        if mirrored:  # this process's devices take their rows of the batch
            mine = slice(rank * local, (rank + 1) * local)
            loss = train_job(np.split(x, devices)[mine], np.split(y, devices)[mine])
            losses.append(np.concatenate(loss))
        else:
            if step == int(os.environ.get("MP_WORKER_BAD_STEP", "-1")):
                # A label out of range in the last process's rows only: every
                # process raises, naming its position in the whole batch, and
                # no variable changes anywhere (tests/python/test_harden_dist.py).
                before = {k: np.array(v) for k, v in flow.get_all_variables().items()}
                bad = y.copy()
                bad[BATCH - 1 - 3] = 10
                try:
                    train_job(x, bad)
                    print("BAD STEP: no error", flush=True)
                except IndexError as e:
                    print("BAD STEP:", e, flush=True)
                after = {k: np.array(v) for k, v in flow.get_all_variables().items()}
                same = sorted(after) == sorted(before) and all(np.array_equal(after[k], before[k]) for k in before)
                print("VARIABLES", "UNCHANGED" if same else "CHANGED", flush=True)
            losses.append(train_job(x, y))
    if os.environ.get("MP_WORKER_DUMP"):  # the plan and the last step's launches (FLOWJIT_PROFILE=1)
        import json
        job = train_job.compiled_jobs()[0]
        plan = job.plan.splitlines()
        events = [e for e in job._job.trace_events() if e[0] == 0][-len(plan):]
        with open(out + ".json", "w") as f:
            json.dump({"plan": plan, "events": events}, f)
    np.savez(out, losses=np.stack(losses) if not mirrored else np.zeros(1), **{k: np.asarray(v) for k, v in flow.get_all_variables().items()})


if __name__ == "__main__":
    out, local, mode, steps, exit_after = sys.argv[1:6]
    main(out, int(local), mode, int(steps), int(exit_after))
