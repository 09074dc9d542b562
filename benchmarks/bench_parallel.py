"""Scaling of the seed's train step (784-512-10 MLP, batch 100, SGD) over
devices and processes on this machine, and the time spent in collectives.

    python benchmarks/bench_parallel.py [--steps 300]

Configurations (each in a fresh process, the same batch every step):
  1 device          the single-device baseline (TBB uses every core)
  1 device, 1 thread  the baseline of one device on one core: 2 devices on
                    2 cores against it is the scaling the issue asks about
  2 devices         flow.config.cpu_device_num(2), one process, data parallel
  2 devices split   the same with the second layer split by units
                    (mixed_parallel_mlp.py's model)
  2 processes       2 processes x 1 device over Gloo on 127.0.0.1, each with
                    cores/2 kernel threads so that they do not oversubscribe
Ratios are against the 1-device step measured in the same run; "ideal" is
2x for the 2-way configurations. Collective time comes from FLOWJIT_PROFILE
(device 0's launches whose symbol starts with '@').
"""
import argparse
import json
import os
import secrets
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r'''
import json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import numpy as np
import flowjit as flow
import flowjit.typing as tp
devices, split, steps, threads = int(sys.argv[2]), sys.argv[3] == "split", int(sys.argv[4]), int(sys.argv[5])
flow.config.cpu_device_num(devices)
if threads:
    flow.config.cpu_threads(threads)
B = 100
@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((B, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
    init = flow.truncated_normal(0.1)
    r = flow.reshape(images, [images.shape[0], -1])
    h = flow.layers.dense(r, 512, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
    logits = flow.layers.dense(h, 10, kernel_initializer=init, name="output",
                               model_distribute=flow.distribute.split(axis=0) if split else None)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss
rng = np.random.default_rng(0)
x = rng.random((B, 1, 28, 28), dtype=np.float32)
y = rng.integers(0, 10, B).astype(np.int32)
for _ in range(20):
    train_job(x, y)
samples = []
for rep in range(5):
    t0 = time.perf_counter()
    for _ in range(steps // 5):
        train_job(x, y)
    samples.append((time.perf_counter() - t0) / (steps // 5))
prof = train_job.compiled_jobs()[0].profile()
coll = sum(s for sym, c, s in prof if sym.startswith("@"))
total = sum(s for sym, c, s in prof)
calls = max((c for sym, c, s in prof), default=1)
print("RESULT " + json.dumps({"step_ms": min(samples) * 1e3, "collective_ms": coll / max(calls, 1) * 1e3,
                              "launch_ms": total / max(calls, 1) * 1e3,
                              "collectives": sum(1 for sym, c, s in prof if sym.startswith("@"))}))
'''


def run(devices, split, steps, threads=0, world=1):
    port = 0
    if world > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    procs = []
    token = secrets.token_hex(32)
    for rank in range(world):
        env = dict(os.environ, FLOWJIT_PROFILE="1")
        if world > 1:
            env.update(FLOWJIT_WORLD_SIZE=str(world), FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_PORT=str(port),
                       FLOWJIT_STORE_TOKEN=token)
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, ROOT, str(devices),
                                       "split" if split else "dp", str(steps), str(threads)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"benchmark child failed:\n{err}")
        results.append(json.loads(out.split("RESULT ", 1)[1]))
    return results[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    print(f"seed train step, batch 100, {cores} cores, {args.steps} steps per configuration "
          f"(load {os.getloadavg()[0]:.2f})")
    base = run(1, False, args.steps)
    one_core = run(1, False, args.steps, threads=1)
    rows = [("1 device", base), ("1 device, 1 thread", one_core),
            ("2 devices", run(2, False, args.steps)),
            ("2 devices, 2nd layer split", run(2, True, args.steps)),
            ("2 processes x 1 device", run(1, False, args.steps, threads=max(1, cores // 2), world=2)),
            ("2 processes, 2nd layer split", run(1, True, args.steps, threads=max(1, cores // 2), world=2))]
    print(f"{'configuration':32s} {'step ms':>8s} {'vs 1 device':>11s} {'vs 1 core':>10s} "
          f"{'in collectives':>15s}")
    for name, r in rows:
        share = r["collective_ms"] / r["step_ms"] * 100 if r["step_ms"] else 0
        print(f"{name:32s} {r['step_ms']:8.3f} {base['step_ms'] / r['step_ms']:10.2f}x "
              f"{one_core['step_ms'] / r['step_ms']:9.2f}x {r['collective_ms']:7.3f} ms {share:4.0f}%  "
              f"({r['collectives']} collectives)")
    print("ideal for the 2-way rows: 2.00x against 1 core (this machine has "
          f"{cores} cores, so 1.00x against the 1-device row that already uses them all)")


if __name__ == "__main__":
    main()
