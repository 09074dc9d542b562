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
extra_layers, width, B = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
flow.config.cpu_device_num(devices)
if threads:
    flow.config.cpu_threads(threads)
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
from flowjit import _C
interleave = {}
if os.environ.get("BENCH_INTERLEAVE"):
    # (overlap, delay) settings alternated in this one run, block by block,
    # each block starting with the next setting: slow changes of the host's
    # load then fall on every setting alike. Every process switches at the
    # same step (FLOWJIT_OVERLAP is read at each run; the delay by the hook).
    combos = [tuple(c.split(":")) for c in os.environ["BENCH_INTERLEAVE"].split(",")]
    per_block = max(1, steps // int(os.environ["BENCH_BLOCKS"]))
    for c in combos:
        interleave[":".join(c)] = {"block_ms": [], "messages": 0.0, "injected_ms": 0.0, "slept_ms": 0.0,
                                   "collective_ms": 0.0, "kernel_ms": 0.0}

    def split_profile():
        p = train_job.compiled_jobs()[0].profile()
        return (sum(t for sym, c, t in p if sym.startswith("@")), sum(t for sym, c, t in p if not sym.startswith("@")))
    for blk in range(int(os.environ["BENCH_BLOCKS"])):
        for j in range(len(combos)):
            ov, d = combos[(blk + j) % len(combos)]
            os.environ["FLOWJIT_OVERLAP"] = ov
            _C.set_test_comm_delay_ms(float(d))
            train_job(x, y)  # the first step after a switch is not timed
            s0 = _C.test_comm_delay_stats()
            p0 = split_profile()
            t0 = time.perf_counter()
            for _ in range(per_block):
                train_job(x, y)
            t1 = time.perf_counter()
            s1 = _C.test_comm_delay_stats()
            p1 = split_profile()
            e = interleave[ov + ":" + d]
            nb = per_block * int(os.environ["BENCH_BLOCKS"])
            e["collective_ms"] += (p1[0] - p0[0]) / nb * 1e3  # device 0's time in collectives (launch events)
            e["kernel_ms"] += (p1[1] - p0[1]) / nb * 1e3
            e["block_ms"].append((t1 - t0) / per_block * 1e3)
            for k in ("messages", "injected_ms", "slept_ms"):
                e[k] += (s1[k] - s0[k]) / per_block / int(os.environ["BENCH_BLOCKS"])
    steps = 5
d0 = _C.test_comm_delay_stats()
samples = []
for rep in range(5):
    t0 = time.perf_counter()
    for _ in range(steps // 5):
        train_job(x, y)
    samples.append((time.perf_counter() - t0) / (steps // 5))
d1 = _C.test_comm_delay_stats()
timed = 5 * (steps // 5)
# The injected delay as this process's communicator counted it, per step.
delay = {k: (d1[k] - d0[k]) / timed for k in ("messages", "injected_ms", "slept_ms")}
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
if os.environ.get("BENCH_TIMELINE"):
    ev = [e for e in train_job.compiled_jobs()[0]._job.trace_events() if e[0] == 0][-len(syms):]
    t0 = min(e[2] for e in ev)
    timeline = [(sym, (st - t0) / 1e6, du / 1e6, tid) for _, sym, st, du, tid in ev]
    if os.environ.get("BENCH_TIMELINE") == "abs":  # one clock for every process of this machine
        timeline = [(sym, st / 1e6, du / 1e6, tid) for _, sym, st, du, tid in ev]
print("RESULT " + json.dumps({"step_ms": min(samples) * 1e3, "collective_ms": coll / max(calls, 1) * 1e3,
                              "messages": messages, "timeline": timeline, "delay": delay, "interleave": interleave,
                              "launch_ms": total / max(calls, 1) * 1e3,
                              "collectives": sum(1 for sym, c, s in prof if sym.startswith("@"))}))
'''


def run(devices, split, steps, threads=0, world=1, extra_layers=0, env_extra=None, width=512, batch=100,
        all_ranks=False):
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
                                       str(extra_layers), str(width), str(batch)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"benchmark child failed:\n{err}")
        results.append(json.loads(out.split("RESULT ", 1)[1]))
    return results if all_ranks else results[0]


def overlap_rows(steps, cores, delay_ms, rounds=1, configs=None, batch=100, blocks=12):
    """2 processes x 1 device (Gloo) and 2 devices of one process (shared
    memory), overlap on and off, without and with an injected per-message
    delay: the four settings alternate block by block inside each run (the
    same processes and compiled code), `blocks` blocks of steps/blocks steps
    per setting, in `rounds` runs. growth: the median over the blocks of
    (a delayed block - the undelayed block of the same cycle). "injected" is
    what rank 0's communicator counted (test_comm_delay_stats: delayed
    messages per step times the delay): what a synchronous exchange pays in
    full; "slept" is what those sleeps took by the clock."""
    import statistics
    configs = configs or [("5 layers, 2 processes", 3, 2, 512, batch),
                          ("5 layers, 2 devices 1 process", 3, 1, 512, batch),
                          ("seed, 2 processes", 0, 2, 512, batch),
                          ("seed, 2 devices 1 process", 0, 1, 512, batch)]
    combos = [("1", 0.0), ("1", delay_ms), ("0", 0.0), ("0", delay_ms)]
    spec = ",".join(f"{ov}:{d}" for ov, d in combos)
    load0 = os.getloadavg()[0]
    print(f"\noverlap of gradient all-reduces with the backward pass: injected delay {delay_ms} ms per "
          f"message; {rounds} run(s) x {blocks} blocks of {max(1, steps // blocks)} steps per setting, "
          f"the 4 settings alternating; load {load0:.2f} at the start")
    print(f"{'model':36s} {'overlap':>7s} {'step ms':>8s} {'delayed':>8s} {'growth':>8s} {'msgs':>5s} "
          f"{'injected':>8s} {'slept':>7s} {'growth/injected':>15s} {'growth/slept':>13s} {'quartiles':>10s}")
    loads = []
    for name, extra, world, width, b in configs:
        blk = {c: [] for c in combos}
        counted = {}
        for _ in range(rounds):
            r = run(1 if world == 2 else 2, False, steps, threads=max(1, cores // 2) if world == 2 else 0,
                    world=world, extra_layers=extra, width=width, batch=b,
                    env_extra={"BENCH_INTERLEAVE": spec, "BENCH_BLOCKS": str(blocks)})
            for ov, d in combos:
                e = r["interleave"][f"{ov}:{d}"]
                blk[(ov, d)] += e["block_ms"]
                if d:
                    counted[ov] = e
            loads.append(os.getloadavg()[0])
        for ov in ("1", "0"):
            base, slow = blk[(ov, 0.0)], blk[(ov, delay_ms)]
            diffs = [y - x for x, y in zip(base, slow)]
            growth = statistics.median(diffs)
            q = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [growth] * 3
            c = counted[ov]
            if os.environ.get("BENCH_VERBOSE"):
                print(f"   {'on' if ov == '1' else 'off'}: collectives {r['interleave'][f'{ov}:0.0']['collective_ms']:.2f}"
                      f" -> {c['collective_ms']:.2f} ms, kernels {r['interleave'][f'{ov}:0.0']['kernel_ms']:.2f} -> "
                      f"{c['kernel_ms']:.2f} ms per step (last run)")
            print(f"{name:36s} {'on' if ov == '1' else 'off':>7s} {statistics.median(base):8.2f} "
                  f"{statistics.median(slow):8.2f} {growth:+8.2f} {c['messages']:5.1f} {c['injected_ms']:8.2f} "
                  f"{c['slept_ms']:7.2f} {100 * growth / c['injected_ms']:14.0f}% {100 * growth / c['slept_ms']:12.0f}% "
                  f"{100 * q[0] / c['injected_ms']:5.0f}..{100 * q[2] / c['injected_ms']:.0f}%")
    print("step ms / delayed: median block without / with the delay; growth: median of the paired differences "
          "(quartiles: their 1st and 3rd, over injected); "
          "msgs: delayed messages per step as rank 0's communicator counted them; injected: their delay, "
          "what a synchronous exchange pays in full; slept: what the sleeps took by the clock "
          "(a woken thread waits for a core), what overlap off pays")
    print(f"load after each run: {', '.join(f'{x:.1f}' for x in loads)}")


def wide_overlap_rows(steps, cores, rounds, delay_ms=4.0, batch=800):
    """The overlap rows with a larger batch, so that a layer's backward pass
    outlasts one message (the delay plus a 1 MB exchange): the channel then
    keeps up with the backward pass and only the last bucket's message is
    exposed. The seed cannot show it: its largest bucket is the last
    gradient computed, so its rows are left out here."""
    overlap_rows(steps, cores, delay_ms, rounds,
                 [(f"5 layers, batch {batch}, 2 processes", 3, 2, 512, batch),
                  (f"5 layers, batch {batch}, 2 devices 1 proc", 3, 1, 512, batch)], batch)


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
    ap.add_argument("--rounds", type=int, default=1, help="runs of the overlap rows (each alternating its settings)")
    ap.add_argument("--batch", type=int, default=None,
                    help="batch of the overlap rows (default 100; 800 for overlap-wide)")
    ap.add_argument("--wide-delay-ms", type=float, default=4.0, help="injected delay per message in overlap-wide")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    if args.only == "overlap":
        return overlap_rows(args.steps, cores, args.delay_ms, args.rounds, batch=args.batch or 100)
    if args.only == "overlap-wide":
        return wide_overlap_rows(args.steps, cores, args.rounds, args.wide_delay_ms, args.batch or 800)
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
        wide_overlap_rows(args.steps, cores, args.rounds, args.wide_delay_ms, args.batch or 800)
        collective_rows(50)


if __name__ == "__main__":
    main()
