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
2x for the 2-way configurations. Then the overlap rows (overlap on/off,
with and without an injected delay per message) and the all-reduce
comparison with Gloo's own algorithms (benchmarks/bench_collectives.cpp;
--only scaling|overlap|collectives runs one part; --only timeline prints
rank 0's last step, launch by launch and thread by thread). Collective time comes from FLOWJIT_PROFILE
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
extra_layers, width = int(sys.argv[6]), int(sys.argv[7])
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
    for i in range(extra_layers):
        h = flow.layers.dense(h, width, activation=flow.nn.relu, kernel_initializer=init, name=f"extra{i}")
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
# Messages per step: each collective, adjacent all_reduces being one bucket
# (as the runtime exchanges them): what an injected delay is paid for.
syms = [line.split()[1] for line in train_job.compiled_jobs()[0].plan.splitlines()]
messages = sum(1 for i, s in enumerate(syms) if s.startswith("@") and not (
    ".all_reduce." in s and i > 0 and ".all_reduce." in syms[i - 1]))
timeline = []
if os.environ.get("BENCH_TIMELINE") and os.environ.get("FLOWJIT_RANK", "0") == "0":
    ev = [e for e in train_job.compiled_jobs()[0]._job.trace_events() if e[0] == 0][-len(syms):]
    t0 = min(e[2] for e in ev)
    timeline = [(sym, (st - t0) / 1e6, du / 1e6, tid) for _, sym, st, du, tid in ev]
print("RESULT " + json.dumps({"step_ms": min(samples) * 1e3, "collective_ms": coll / max(calls, 1) * 1e3,
                              "messages": messages, "timeline": timeline,
                              "launch_ms": total / max(calls, 1) * 1e3,
                              "collectives": sum(1 for sym, c, s in prof if sym.startswith("@"))}))
'''


def run(devices, split, steps, threads=0, world=1, extra_layers=0, env_extra=None, width=512):
    port = 0
    if world > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    procs = []
    token = os.environ.get("FLOWJIT_STORE_TOKEN") or secrets.token_hex(32)  # the rendezvous's job token
    for rank in range(world):
        env = dict(os.environ, FLOWJIT_PROFILE="1", FLOWJIT_STORE_TOKEN=token)
        env.update(env_extra or {})
        if world > 1:
            env.update(FLOWJIT_WORLD_SIZE=str(world), FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_PORT=str(port),
                       FLOWJIT_STORE_TOKEN=token)
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, ROOT, str(devices),
                                       "split" if split else "dp", str(steps), str(threads),
                                       str(extra_layers), str(width)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"benchmark child failed:\n{err}")
        results.append(json.loads(out.split("RESULT ", 1)[1]))
    return results[0]


def overlap_rows(steps, cores, delay_ms, rounds=3, configs=None):
    """2 processes x 1 device (Gloo) and 2 devices of one process (shared
    memory), overlap on and off, with and without an injected per-message
    delay (FLOWJIT_TEST_COMM_DELAY_MS), for the seed and for the seed with 3
    more 512-unit layers (5 gradient buckets)."""
    print(f"\noverlap of gradient all-reduces with the backward pass (injected delay {delay_ms} ms per "
          f"message, best of {rounds} alternating rounds, load {os.getloadavg()[0]:.2f})")
    print(f"{'model':28s} {'overlap':>7s} {'step ms':>8s} {'delayed':>8s} {'growth':>8s} {'injected':>8s} "
          f"{'growth/injected':>15s}")
    configs = configs or [("seed, 2 processes", 0, 2, 512), ("5 layers, 2 processes", 3, 2, 512),
                          ("seed, 2 devices 1 process", 0, 1, 512), ("5 layers, 2 devices 1 process", 3, 1, 512)]
    for name, extra, world, width in configs:
        got, msgs = {}, {}
        for rnd in range(rounds):  # A/B alternately, best of the rounds
            for ov in ("1", "0"):
                for d in (0, delay_ms):
                    r = run(1 if world == 2 else 2, False, steps, threads=max(1, cores // 2) if world == 2 else 0,
                            world=world, extra_layers=extra, width=width,
                            env_extra={"FLOWJIT_OVERLAP": ov, "FLOWJIT_TEST_COMM_DELAY_MS": str(d)})
                    key = (ov, d)
                    got[key] = min(got.get(key, 1e9), r["step_ms"])
                    msgs[ov] = r["messages"]
        for ov in ("1", "0"):
            growth = got[(ov, delay_ms)] - got[(ov, 0)]
            injected = msgs[ov] * delay_ms
            print(f"{name:28s} {'on' if ov == '1' else 'off':>7s} {got[(ov, 0)]:8.3f} {got[(ov, delay_ms)]:8.3f} "
                  f"{growth:+8.3f} {injected:8.3f} {100 * growth / injected:14.0f}%")
    print("growth: step time added by the delay; injected: the delay times the messages of a step "
          "(buckets and other collectives), what a synchronous exchange pays in full")


def wide_overlap_rows(steps, cores, rounds):
    """The overlap rows for 3 more layers of 2048 units and a 10 ms delay:
    each layer's backward pass (two 100x2048x2048 matmuls) outlasts a
    message's delay, and the delay outlasts a wake-up on a loaded host, so
    what the structure hides shows through the host's noise."""
    overlap_rows(max(4, steps // 5), cores, 10.0, rounds,
                 [("5 layers x 2048, 2 devices 1 process", 3, 1, 2048),
                  ("5 layers x 2048, 2 processes", 3, 2, 2048)])


def timeline(steps, cores, delay_ms, extra=3):
    """Rank 0's last step with overlap on and the delay (FLOWJIT_PROFILE's
    launch events): which thread ran what, when."""
    for ov in ("1", "0"):
        r = run(1, False, steps, threads=max(1, cores // 2), world=2, extra_layers=extra,
                env_extra={"FLOWJIT_OVERLAP": ov, "FLOWJIT_TEST_COMM_DELAY_MS": str(delay_ms),
                           "BENCH_TIMELINE": "1"})
        print(f"\ntimeline of rank 0's last step, overlap {'on' if ov == '1' else 'off'}, {3 + extra - 1} layers, "
              f"delay {delay_ms} ms per message (start ms, duration ms, thread)")
        tids = {}
        for sym, st, du, tid in sorted(r["timeline"], key=lambda e: e[1]):
            lane = tids.setdefault(tid, "kernels" if not tids else "comm")
            print(f"  {st:8.3f} {du:8.3f}  {lane:7s}  {sym}")


def collective_rows(reps):
    """flowjit's Gloo all-reduce against Gloo's own algorithms, 2 processes."""
    exe = os.path.join(os.environ.get("FLOWJIT_BUILD_DIR", os.path.join(ROOT, "build", "dev")),
                       "flowjit_bench_collectives")
    if not os.path.exists(exe):
        print(f"\n(collective comparison skipped: build {exe} with "
              "`cmake --build build/dev --target flowjit_bench_collectives`)")
        return
    out = subprocess.run([exe, "2", str(reps)], stdout=subprocess.PIPE, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    algos = ["ours", "ring", "new_api_ring", "ring_chunked", "halving_doubling"]
    print(f"\nall-reduce of float32 between 2 processes (127.0.0.1), best / median of {reps} ms")
    print(f"{'bytes':>9s} " + " ".join(f"{a:>17s}" for a in algos) + f" {'ours/best':>10s}")
    for r in rows:
        best = min(r[f"{a}_min_ms"] for a in algos[1:])
        print(f"{r['bytes']:9d} " + " ".join(f"{r[a + '_min_ms']:7.3f} / {r[a + '_ms']:7.3f}" for a in algos)
              + f" {r['ours_min_ms'] / best:9.2f}x")
    print("ours: flowjit's communicator (one allgather below 256 KB, Gloo's ring above, for 2 processes)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--delay-ms", type=float, default=1.0, help="injected delay per message in the overlap rows")
    ap.add_argument("--only", choices=["scaling", "overlap", "overlap-wide", "collectives", "timeline"], default=None)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the overlap rows")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    if args.only == "overlap":
        return overlap_rows(args.steps, cores, args.delay_ms, args.rounds)
    if args.only == "overlap-wide":
        return wide_overlap_rows(args.steps, cores, args.rounds)
    if args.only == "timeline":
        return timeline(args.steps, cores, args.delay_ms)
    if args.only == "collectives":
        return collective_rows(50)
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
    if args.only is None:
        overlap_rows(args.steps, cores, args.delay_ms, args.rounds)
        wide_overlap_rows(args.steps, cores, args.rounds)
        collective_rows(50)


if __name__ == "__main__":
    main()
