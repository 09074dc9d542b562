"""Cost model for a flowjit train step on many machines.

    python tools/scale_model.py [--model seed|lenet|mlp5] [--gbps 25,100] [--latency-us 10]
                                [--gpus-per-machine 1,8] [--scaling weak|strong] [--split]
                                [--check] [--json FILE]

From a job's compiled plan it predicts the step time and the scaling
efficiency of N machines x G devices, with and without overlap, for data
parallel and for a split layer (the output layer's units split over the
devices: flow.distribute.split(axis=0), model parallel).

Inputs, all from this machine:
  * the per-device plan of the job compiled for 2 devices (one process,
    flow.config.cpu_device_num(2)): its launches in order, each collective's
    op, dtype and [outer][inner] piece (the layouts' bytes), and where each
    asynchronous collective must be complete (`complete_before=` in
    CompiledJob.plan);
  * each kernel's time, measured by the profiler (FLOWJIT_PROFILE=1, the mean
    over the measured steps of device 0, overlap off) at the global batch and
    at half of it.

Assumptions (what the numbers mean, and where they stop being true):
  A1 A device computes the plan's kernels in the times measured here for one
     device of a 2-device process (one core of this host), divided by
     --device-speedup (default 1: the devices are this host's cores). No
     kernel gets faster or slower from contention with other devices.
  A2 Weak scaling (default): the per-device batch stays the measured one, so
     every kernel's time stays the same at any device count (a split layer's
     per-device work, (batch x devices) x (units / devices), is constant
     too). Strong scaling (--scaling strong): the global batch stays, so the
     work fraction f = 2 / devices of the 2-device plan; each kernel's time
     is affine in f, t = a + c f, fitted from the two measured batches (a:
     what does not depend on the batch, e.g. the update of a weight).
  A3 Collectives are the plan's, with the sizes of its layouts: an
     all_reduce moves the whole (mirrored) gradient n at any device count;
     an all_gather or reduce_scatter moves a tensor of n = parts x piece
     bytes, whose per-device piece is fixed under weak scaling and whose
     whole is fixed under strong scaling. Adjacent all_reduces of one dtype
     are one bucket (one message), as the runtime runs them.
  A4 Ring algorithms on a flat ring of P = N x G devices (alpha-beta model):
     all_reduce 2 (P-1) (alpha + n / (P beta)); all_gather and
     reduce_scatter (P-1) (alpha + n / (P beta)). alpha is the latency per
     message (--latency-us), beta the bandwidth of the slowest link of the
     ring: the machine's network (--gbps, one link per machine, crossed
     once per ring step) when N > 1, the devices' link inside a machine
     (--intra-gbps, --intra-latency-us) when N = 1. No congestion, no
     hierarchical (two-level) algorithm, no compression.
  A5 Overlap: the kernels run in plan order on one stream; an asynchronous
     collective (bucket) is queued on one communication channel when the
     stream reaches it and runs when the channel is free (in order, one at
     a time, as the runtime's communication thread); a kernel starts when
     the buckets that must be complete before it are. Synchronous
     collectives wait for the channel to drain and block the stream.
     Without overlap every collective blocks the stream in plan order.
  A6 Nothing else costs time: no input pipeline, no host-device copies, no
     launch overhead beyond what the profiler measured inside kernels.

Efficiency: weak scaling T(1) / T(P); strong scaling T(1) / (P T(P)), where
T(1) is the same model with one device (no collectives: the measured
compute). A configuration "stops scaling" at the first P whose efficiency is
under 50%.

--check measures what this host can run (1, 2 and 4 processes x 1 device,
one kernel thread each, over Gloo on 127.0.0.1, global batch 100: strong
scaling, as benchmarks/bench_parallel.py) and prints the model's prediction
beside it. For that the model's link is the loopback, alpha and beta fitted
from flowjit's own all-reduce of 4 KB and 1.6 MB between 2 processes
(build/dev/flowjit_bench_collectives), once from the best and once from the
median of its repetitions (an idle host, and this host at its present
load), and P processes on C cores compute max(1, P / C) times slower (time
sharing).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

DTYPE_BYTES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "i8": 1, "u8": 1, "b8": 1,
               "bool": 1}
_COLL = re.compile(r"^@k\d+\.(all_reduce|all_gather|reduce_scatter|local_slice)\.(\w+)\.p(\d+)\.o(\d+)\.i(\d+)$")
_LINE = re.compile(r"^\s*\[(\d+)\]\s+(\S+)(.*?)\s:\s")


# ---------------------------------------------------------------- the plan


@dataclass
class Step:
    """One launch of a per-device plan."""
    symbol: str
    seconds: float = 0.0            # measured kernel time (kernels only)
    op: Optional[str] = None        # collective: all_reduce, all_gather, reduce_scatter, local_slice
    dtype_bytes: int = 4
    parts: int = 1
    outer: int = 1
    inner: int = 1
    complete_before: int = -1       # asynchronous collective: complete before this launch
    seconds_half: Optional[float] = None  # kernel time at half the batch (strong scaling)

    @property
    def piece_bytes(self) -> int:
        return self.outer * self.inner * self.dtype_bytes

    def message_bytes(self) -> int:
        """The bytes of the tensor a ring moves (n in A4) in the measured plan."""
        if self.op == "all_reduce":
            return self.piece_bytes
        if self.op in ("all_gather", "reduce_scatter"):
            return self.piece_bytes * self.parts
        return 0


@dataclass
class Plan:
    steps: List[Step]
    parts: int = 2
    name: str = "job"
    meta: Dict = field(default_factory=dict)


def parse_plan(text: str, times: Dict[str, float], times_half: Optional[Dict[str, float]] = None,
               name: str = "job") -> Plan:
    """A Plan from CompiledJob.plan and the profiler's mean seconds per symbol."""
    steps = []
    parts = 1
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        sym, attrs = m.group(2), m.group(3)
        cb = re.search(r"complete_before=(\d+)", attrs)
        c = _COLL.match(sym)
        if c:
            op, dt, p, o, i = c.groups()
            if dt not in DTYPE_BYTES:
                raise ValueError(f"scale_model: unknown dtype {dt!r} in collective {sym}")
            parts = max(parts, int(p))
            steps.append(Step(sym, 0.0, op, DTYPE_BYTES[dt], int(p), int(o), int(i),
                              int(cb.group(1)) if cb else -1))
        else:
            steps.append(Step(sym, times.get(sym, 0.0),
                              seconds_half=None if times_half is None else times_half.get(sym)))
    if not steps:
        raise ValueError("scale_model: the plan text has no launches")
    return Plan(steps, parts, name)


# ---------------------------------------------------------------- the model


@dataclass
class Network:
    gbps: float               # slowest link of the ring between machines, Gbit/s
    latency_us: float         # alpha between machines
    intra_gbps: float = 2400  # between the devices of one machine
    intra_latency_us: float = 2.0

    def link(self, machines: int):
        if machines > 1:
            return self.latency_us * 1e-6, self.gbps * 1e9 / 8
        return self.intra_latency_us * 1e-6, self.intra_gbps * 1e9 / 8


def collective_seconds(op: str, nbytes: float, devices: int, alpha: float, beta: float) -> float:
    """A4: ring algorithms, alpha-beta."""
    if devices <= 1 or op == "local_slice" or nbytes <= 0:
        return 0.0
    steps = 2 * (devices - 1) if op == "all_reduce" else devices - 1
    return steps * (alpha + nbytes / devices / beta)


def kernel_seconds(s: Step, devices: int, scaling: str, speedup: float, measured_parts: int) -> float:
    t = s.seconds
    if scaling == "strong" and devices != measured_parts:
        if s.seconds_half is None:
            raise ValueError("scale_model: strong scaling needs kernel times at half the batch")
        c = max(0.0, 2 * (s.seconds - s.seconds_half))
        a = s.seconds - c
        if a < 0:
            a, c = 0.0, s.seconds
        t = a + c * measured_parts / devices
    return t / speedup


def step_time(plan: Plan, machines: int, gpus: int, net: Network, overlap: bool, scaling: str = "weak",
              speedup: float = 1.0, compute_scale: float = 1.0) -> Dict[str, float]:
    """Predicted seconds of one step on machines x gpus devices (A1-A6)."""
    P = machines * gpus
    alpha, beta = net.link(machines)
    steps = plan.steps
    n = len(steps)
    kt = [0.0 if s.op else kernel_seconds(s, P, scaling, speedup, plan.parts) * compute_scale
          for s in steps]
    # Collective messages: buckets of adjacent all_reduces of one dtype (A3).
    msgs = []  # (first index, last index, seconds, complete_before)
    i = 0
    while i < n:
        s = steps[i]
        if not s.op:
            i += 1
            continue
        j, nbytes, cb = i, s.message_bytes(), s.complete_before
        if s.op == "all_reduce":
            while j + 1 < n and steps[j + 1].op == "all_reduce" and steps[j + 1].dtype_bytes == s.dtype_bytes:
                j += 1
                nbytes += steps[j].message_bytes()
                cb = -1 if cb < 0 or steps[j].complete_before < 0 else min(cb, steps[j].complete_before)
        elif scaling == "weak":
            nbytes = nbytes * P / max(s.parts, 1)  # the per-device piece stays (A3)
        msgs.append((i, j, collective_seconds(s.op, nbytes, P, alpha, beta), cb))
        i = j + 1
    compute = sum(kt)
    comm = sum(m[2] for m in msgs)
    if P == 1:
        return {"step": compute, "compute": compute, "comm": 0.0, "exposed": 0.0}
    if not overlap:
        return {"step": compute + comm, "compute": compute, "comm": comm, "exposed": comm}
    # A5: one stream, one communication channel.
    by_start = {m[0]: m for m in msgs}
    t = 0.0           # the stream
    channel = 0.0     # when the channel is free
    pending = []      # (complete_before, done)
    i = 0
    while i < n:
        due = [d for cb, d in pending if cb <= i]
        if due:
            t = max(t, max(due))
            pending = [(cb, d) for cb, d in pending if cb > i]
        if i in by_start:
            first, last, secs, cb = by_start[i]
            if cb > last:
                start = max(t, channel)
                channel = start + secs
                pending.append((cb, channel))
            else:  # synchronous: after everything queued
                t = max(t, channel) + secs
                channel = t
                pending = []
            i = last + 1
            continue
        t += kt[i]
        i += 1
    end = max([t, channel] + [d for _, d in pending])
    return {"step": end, "compute": compute, "comm": comm, "exposed": end - compute}


def efficiency(plan: Plan, machines: int, gpus: int, net: Network, overlap: bool, scaling: str,
               speedup: float = 1.0) -> float:
    P = machines * gpus
    t1 = step_time(plan, 1, 1, net, overlap, scaling, speedup)["step"]
    tp = step_time(plan, machines, gpus, net, overlap, scaling, speedup)["step"]
    return t1 / tp if scaling == "weak" else t1 / (P * tp)


def stops_scaling(plan: Plan, gpus: int, net: Network, overlap: bool, scaling: str, speedup: float = 1.0,
                  limit: int = 1 << 16) -> Optional[int]:
    """The first device count (machines x gpus, machines doubling; gpus alone
    first) whose efficiency is under 50%, or None up to `limit` devices."""
    g = 1
    while g < gpus:  # inside the first machine
        g *= 2
        g = min(g, gpus)
        if efficiency(plan, 1, g, net, overlap, scaling, speedup) < 0.5:
            return g
    m = 2
    while m * gpus <= limit:
        if efficiency(plan, m, gpus, net, overlap, scaling, speedup) < 0.5:
            return m * gpus
        m *= 2
    return None


# ---------------------------------------------------------------- measuring here

MODELS = ("seed", "mlp5", "lenet")

CHILD = r'''
import json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import numpy as np
import flowjit as flow
import flowjit.typing as tp
model, devices, batch, split, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6])
threads = int(sys.argv[7])
if devices > 1:
    flow.config.cpu_device_num(devices)
if threads:
    flow.config.cpu_threads(threads)
B = batch
dist = flow.distribute.split(axis=0) if split else None
def mlp(images, extra):
    init = flow.truncated_normal(0.1)
    h = flow.layers.dense(flow.reshape(images, [images.shape[0], -1]), 512, activation=flow.nn.relu,
                          kernel_initializer=init, name="hidden")
    for i in range(extra):
        h = flow.layers.dense(h, 512, activation=flow.nn.relu, kernel_initializer=init, name=f"extra{i}")
    return flow.layers.dense(h, 10, kernel_initializer=init, name="output", model_distribute=dist)
def lenet(data):
    init = flow.truncated_normal(0.1)
    c1 = flow.layers.conv2d(data, 32, 5, padding="SAME", activation=flow.nn.relu, name="conv1", kernel_initializer=init)
    p1 = flow.nn.max_pool2d(c1, ksize=2, strides=2, padding="SAME", name="pool1", data_format="NCHW")
    c2 = flow.layers.conv2d(p1, 64, 5, padding="SAME", activation=flow.nn.relu, name="conv2", kernel_initializer=init)
    p2 = flow.nn.max_pool2d(c2, ksize=2, strides=2, padding="SAME", name="pool2", data_format="NCHW")
    h = flow.layers.dense(flow.reshape(p2, [p2.shape[0], -1]), 512, activation=flow.nn.relu, kernel_initializer=init, name="dense1")
    return flow.layers.dense(h, 10, kernel_initializer=init, name="dense2", model_distribute=dist)
@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((B, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
    logits = lenet(images) if model == "lenet" else mlp(images, 3 if model == "mlp5" else 0)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss
rng = np.random.default_rng(0)
x = rng.random((B, 1, 28, 28), dtype=np.float32)
y = rng.integers(0, 10, B).astype(np.int32)
warm = max(3, steps // 5)
for _ in range(warm):
    train_job(x, y)
job = train_job.compiled_jobs()[0]
before = {r.kernel: (r.calls, r.total_s) for r in job.profile()}
samples = []
for rep in range(5):
    t0 = time.perf_counter()
    for _ in range(max(1, steps // 5)):
        train_job(x, y)
    samples.append((time.perf_counter() - t0) / max(1, steps // 5))
times = {}
for r in job.profile():
    c0, s0 = before.get(r.kernel, (0, 0.0))
    if r.calls > c0:
        times[r.kernel] = (r.total_s - s0) / (r.calls - c0)
print("RESULT " + json.dumps({"plan": job.plan, "times": times, "step_s": min(samples),
                              "step_median_s": sorted(samples)[2]}))
'''


def _child(model, devices, batch, split, steps, threads=0, world=1, env_extra=None):
    port = 0
    if world > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    token = os.environ.get("FLOWJIT_STORE_TOKEN") or secrets.token_hex(32)
    procs = []
    for rank in range(world):
        env = dict(os.environ, FLOWJIT_PROFILE="1", FLOWJIT_STORE_TOKEN=token)
        env.update(env_extra or {})
        if world > 1:
            env.update(FLOWJIT_WORLD_SIZE=str(world), FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, ROOT, model, str(devices), str(batch),
                                       "1" if split else "0", str(steps), str(threads)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        o, e = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"scale_model: measuring child failed:\n{e[-3000:]}")
        out.append(json.loads(o.split("RESULT ", 1)[1]))
    return out[0]


def measure_plan(model: str, batch: int, split: bool, steps: int, strong: bool) -> Plan:
    """A1-A3's inputs: the 2-device plan at the global batch (and at half of
    it for strong scaling), kernel times by the profiler, overlap off."""
    env = {"FLOWJIT_OVERLAP": "0"}
    full = _child(model, 2, batch, split, steps, env_extra=env)
    half = _child(model, 2, batch // 2, split, steps, env_extra=env)["times"] if strong else None
    plan = parse_plan(full["plan"], full["times"], half, name=model)
    plan.meta = {"batch": batch, "split": split, "measured_step_s": full["step_s"]}
    return plan


def fit_loopback(reps: int = 30):
    """alpha, beta of this host's loopback from flowjit's 2-process all-reduce
    (ours_min_ms of flowjit_bench_collectives at 4 KB and 1.6 MB):
    t = 2 alpha + n / beta for P = 2 (A4)."""
    exe = os.path.join(os.environ.get("FLOWJIT_BUILD_DIR", os.path.join(ROOT, "build", "dev")),
                       "flowjit_bench_collectives")
    if not os.path.exists(exe):
        raise SystemExit(f"scale_model --check: build {exe} first "
                         "(cmake --build build/dev --target flowjit_bench_collectives)")
    out = subprocess.run([exe, "2", str(reps), "4096", "1607680"], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    rows = {r["bytes"]: r for r in (json.loads(x) for x in out.splitlines() if x.startswith("{"))}
    fits = {}
    for key, name in (("ours_min_ms", "best"), ("ours_ms", "median")):
        t_small, t_big = rows[4096][key] * 1e-3, rows[1607680][key] * 1e-3
        beta = (1607680 - 4096) / max(t_big - t_small, 1e-9)
        alpha = max(0.0, (t_small - 4096 / beta) / 2)
        fits[name] = (alpha, beta)
    return fits


# ---------------------------------------------------------------- reports


def _fmt_eff(e):
    return f"{100 * e:5.1f}%"


def report(plan: Plan, args) -> dict:
    gpus_list = [int(g) for g in args.gpus_per_machine.split(",")]
    machines_list = [int(m) for m in args.machines.split(",")]
    out = {"model": plan.name, "scaling": args.scaling, "split": plan.meta.get("split"), "rows": [],
           "stops": []}
    compute = step_time(plan, 1, 1, Network(25, args.latency_us), False, args.scaling, args.device_speedup)
    colls = [s for s in plan.steps if s.op]
    print(f"\n{plan.name}{' (output layer split)' if plan.meta.get('split') else ''}: batch "
          f"{plan.meta.get('batch')} per {'device' if args.scaling == 'weak' else 'job'} ({args.scaling} scaling), "
          f"1-device compute {compute['step'] * 1e3:.3f} ms (kernels measured here / {args.device_speedup:g}), "
          f"{len(colls)} collectives, " + ", ".join(f"{s.op} {s.message_bytes()} B" for s in colls))
    for gbps in [float(b) for b in args.gbps.split(",")]:
        net = Network(gbps, args.latency_us, args.intra_gbps, args.intra_latency_us)
        print(f"\n  {gbps:g} Gb/s between machines, {args.latency_us:g} us latency "
              f"(inside a machine {args.intra_gbps:g} Gb/s, {args.intra_latency_us:g} us)")
        print(f"  {'machines x gpus':>16s} {'step ms':>9s} {'overlap':>9s} {'eff':>7s} {'eff ovl':>7s}")
        for g in gpus_list:
            for m in machines_list:
                a = step_time(plan, m, g, net, False, args.scaling, args.device_speedup)["step"]
                b = step_time(plan, m, g, net, True, args.scaling, args.device_speedup)["step"]
                ea = efficiency(plan, m, g, net, False, args.scaling, args.device_speedup)
                eb = efficiency(plan, m, g, net, True, args.scaling, args.device_speedup)
                print(f"  {f'{m} x {g}':>16s} {a * 1e3:9.3f} {b * 1e3:9.3f} {_fmt_eff(ea):>7s} {_fmt_eff(eb):>7s}")
                out["rows"].append({"gbps": gbps, "machines": m, "gpus": g, "step_s": a, "step_overlap_s": b,
                                    "eff": ea, "eff_overlap": eb})
            for ov in (False, True):
                at = stops_scaling(plan, g, net, ov, args.scaling, args.device_speedup)
                out["stops"].append({"gbps": gbps, "gpus": g, "overlap": ov, "devices": at})
            s0 = [x["devices"] for x in out["stops"][-2:]]
            print(f"  {g} per machine: efficiency under 50% from "
                  f"{s0[0] if s0[0] else '> 65536'} devices (overlap off), "
                  f"{s0[1] if s0[1] else '> 65536'} (overlap on)")
    return out


def check(args) -> dict:
    """Predicted vs measured on this host (1, 2, 4 processes x 1 device)."""
    cores = os.cpu_count() or 1
    print(f"checking against this host: {cores} cores, load {os.getloadavg()[0]:.2f}")
    fits = fit_loopback()
    nets = {}
    for name, (alpha, beta) in fits.items():
        print(f"loopback fitted from the {name} of flowjit's 2-process all-reduce (4 KB, 1.6 MB): "
              f"alpha {alpha * 1e6:.1f} us, beta {beta / 1e9:.3f} GB/s")
        nets[name] = Network(beta * 8 / 1e9, alpha * 1e6, beta * 8 / 1e9, alpha * 1e6)
    rows = []
    for split in ([False, True] if args.split_check else [False]):
        plan = measure_plan(args.model, args.batch, split, args.steps, strong=True)
        print(f"\n{args.model}{', output layer split' if split else ''}, global batch {args.batch} "
              f"(strong scaling), 1 kernel thread per process")
        print(f"{'processes':>9s} {'overlap':>7s} {'measured ms':>11s} {'pred best':>9s} {'pred/meas':>9s} "
              f"{'pred median':>11s} {'pred/meas':>9s}")
        for world in (1, 2, 4):
            for ov in ("1", "0") if world > 1 else ("1",):
                r = _child(args.model, 1, args.batch, split and world > 1, args.steps, threads=1, world=world,
                           env_extra={"FLOWJIT_OVERLAP": ov})
                slow = max(1.0, world / cores)
                pred = {}
                for name, net in nets.items():
                    if world == 1:
                        # one device: its own plan (no collectives), measured compute
                        pred[name] = sum(r["times"].values()) * slow
                    else:
                        pred[name] = step_time(plan, 1, world, net, ov == "1", "strong", 1.0,
                                               compute_scale=slow)["step"]
                meas = r["step_s"]
                print(f"{world:9d} {'on' if ov == '1' else 'off':>7s} {meas * 1e3:11.3f} "
                      f"{pred['best'] * 1e3:9.3f} {pred['best'] / meas:8.2f}x "
                      f"{pred['median'] * 1e3:11.3f} {pred['median'] / meas:8.2f}x")
                rows.append({"split": split, "processes": world, "overlap": ov == "1", "measured_s": meas,
                             "predicted_s": pred})
    return {"fits": fits, "rows": rows}


def main(argv: Optional[Sequence[str]] = None):
    ap = argparse.ArgumentParser(description="Predict a flowjit job's step time and scaling efficiency on "
                                             "N machines x G devices from its compiled plan.",
                                 epilog=__doc__[__doc__.index("Assumptions"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, default="seed",
                    help="seed: 784-512-10 MLP; mlp5: 3 more 512-unit layers; lenet: examples/lenet_train.py")
    ap.add_argument("--batch", type=int, default=100, help="per device (weak) or per job (strong)")
    ap.add_argument("--split", action="store_true", help="the output layer split over the devices (model parallel)")
    ap.add_argument("--scaling", choices=["weak", "strong"], default="weak")
    ap.add_argument("--gbps", default="25,100", help="bandwidth between machines, Gbit/s (comma list)")
    ap.add_argument("--latency-us", type=float, default=10.0, help="latency per message between machines")
    ap.add_argument("--intra-gbps", type=float, default=2400.0, help="bandwidth between devices of a machine")
    ap.add_argument("--intra-latency-us", type=float, default=2.0)
    ap.add_argument("--gpus-per-machine", default="1,8")
    ap.add_argument("--machines", default="1,2,4,8,16,64,256")
    ap.add_argument("--device-speedup", type=float, default=1.0,
                    help="a device computes this many times faster than one core here (A1)")
    ap.add_argument("--device-step-ms", type=float, default=None,
                    help="instead of --device-speedup: a device computes one step (the 1-device compute) in "
                         "this many ms; every kernel is scaled by the same factor (A1)")
    ap.add_argument("--steps", type=int, default=50, help="measured steps per configuration")
    ap.add_argument("--check", action="store_true", help="predicted vs measured on this host (1, 2, 4 processes)")
    ap.add_argument("--split-check", action="store_true", help="--check also the split layer")
    ap.add_argument("--json", default=None, help="write the predictions here")
    args = ap.parse_args(argv)
    for name in ("gbps", "gpus_per_machine", "machines"):
        try:
            vals = [float(v) for v in getattr(args, name).split(",")]
        except ValueError:
            ap.error(f"--{name.replace('_', '-')} expects a comma list of numbers, got {getattr(args, name)!r}")
        if any(v <= 0 for v in vals):
            ap.error(f"--{name.replace('_', '-')} values must be positive, got {getattr(args, name)!r}")
    if args.batch < 2 or args.batch % 2:
        ap.error(f"--batch must be an even number >= 2 (2 devices measure it), got {args.batch}")
    if args.device_speedup <= 0:
        ap.error(f"--device-speedup must be positive, got {args.device_speedup}")
    result = {}
    if args.check:
        result["check"] = check(args)
    else:
        print(f"host: {_host()}, load {os.getloadavg()[0]:.2f}")
        plan = measure_plan(args.model, args.batch * (2 if args.scaling == "weak" else 1), args.split,
                            args.steps, strong=args.scaling == "strong")
        plan.meta["batch"] = args.batch
        if args.device_step_ms is not None:
            if args.device_step_ms <= 0:
                ap.error(f"--device-step-ms must be positive, got {args.device_step_ms}")
            here = step_time(plan, 1, 1, Network(25, args.latency_us), False, args.scaling)["step"]
            args.device_speedup = here * 1e3 / args.device_step_ms
            print(f"device speedup {args.device_speedup:.1f}x over one core here "
                  f"({here * 1e3:.3f} ms -> {args.device_step_ms:g} ms per step)")
        result["predictions"] = report(plan, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def _host() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" x {os.cpu_count()}"
    except OSError:
        pass
    return "unknown host"


if __name__ == "__main__":
    main()
