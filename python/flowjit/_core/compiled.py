"""Looking into compiled jobs: the compiled-job view, lower()/compile(),
the profile table and Chrome/Perfetto traces."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .. import _C


# ---------------------------------------------------------------- kernel arithmetic

@dataclass
class KernelCost:
    """What one launch of a kernel computes and touches, as the compiler
    recorded it from the kernel's description (codegen::kernel_cost): flops
    (2·m·n·k per matmul plus the epilogue's scalar ops at every output point;
    a loop kernel's scalar ops at every domain point) and bytes (each
    argument's extent once per read and once per write)."""
    flops: int
    bytes: int


# ---------------------------------------------------------------- the profile table

@dataclass
class ProfileRow:
    kernel: str
    calls: int
    total_s: float
    flops: Optional[int] = None  # per call
    bytes: Optional[int] = None  # per call

    @property
    def mean_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0

    @property
    def gflops(self) -> Optional[float]:
        if self.flops is None or not self.total_s:
            return None
        return self.flops * self.calls / self.total_s / 1e9

    @property
    def gbps(self) -> Optional[float]:
        if self.bytes is None or not self.total_s:
            return None
        return self.bytes * self.calls / self.total_s / 1e9

    def __iter__(self) -> Iterator[Any]:  # (kernel, calls, total_s), as profile() gave before
        return iter((self.kernel, self.calls, self.total_s))

    def __getitem__(self, i: int) -> Any:
        return (self.kernel, self.calls, self.total_s)[i]

    def __len__(self) -> int:
        return 3


class ProfileTable(Sequence[ProfileRow]):
    """FLOWJIT_PROFILE=1's per-kernel times of one compiled job. Prints as an
    aligned table; its rows are also (kernel, calls, total_s) tuples."""

    def __init__(self, job: str, rows: List[ProfileRow]):
        self.job = job
        self.rows = rows

    def __getitem__(self, i):  # type: ignore[override]
        return self.rows[i]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def total_s(self) -> float:
        return sum(r.total_s for r in self.rows)

    def as_dicts(self) -> List[Dict[str, Any]]:
        total = self.total_s
        return [{"kernel": r.kernel, "calls": r.calls, "total_s": r.total_s, "mean_s": r.mean_s,
                 "gflops": r.gflops, "gbps": r.gbps,
                 "share": r.total_s / total if total else 0.0} for r in self.rows]

    def __str__(self) -> str:
        if not any(r.calls for r in self.rows):
            return (f"profile of job '{self.job}': nothing recorded (set FLOWJIT_PROFILE=1 before the "
                    "process starts; GPU jobs are timed by the device, not here)")
        total = self.total_s
        head = ("kernel", "calls", "total ms", "mean us", "GFLOP/s", "GB/s", "share")
        body = []
        for r in sorted(self.rows, key=lambda r: -r.total_s):
            body.append((r.kernel, str(r.calls), f"{r.total_s * 1e3:.3f}", f"{r.mean_s * 1e6:.2f}",
                         "-" if r.gflops is None else f"{r.gflops:.2f}",
                         "-" if r.gbps is None else f"{r.gbps:.2f}",
                         f"{100 * r.total_s / total:.1f}%" if total else "-"))
        body.append(("total", str(max((r.calls for r in self.rows), default=0)) + " steps",
                     f"{total * 1e3:.3f}", "", "", "", "100.0%"))
        widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]

        def fmt(row):
            cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
            return "  ".join(cells).rstrip()

        rule = "-" * len(fmt(head))
        return "\n".join([f"profile of job '{self.job}'", fmt(head), rule] + [fmt(b) for b in body[:-1]]
                         + [rule, fmt(body[-1])])

    def __repr__(self) -> str:
        return str(self)


# ---------------------------------------------------------------- compiled jobs

@dataclass
class Stage:
    """One compile stage, on CLOCK_MONOTONIC (time.monotonic_ns)."""
    name: str
    start_ns: int
    dur_ns: int
    thread: int


class CompiledJob:
    """A compiled signature of a job function, to look into: the IR before and
    after the pipeline (ir_traced, ir_optimized), the fusion plan, the
    loop-level kernels, LLVM IR and assembly (kept when compiled through
    job.lower().compile(), or with FLOWJIT_DEBUG>=3/4), the launch plan and,
    for jobs over several devices, the distribution. Other attributes are
    those of the underlying flowjit._C.CompiledJob.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ...     return flow.math.exp(x) + 1
        >>> compiled = job.compile()   # traced and compiled for the declared shapes, not run
        >>> compiled
        <flowjit compiled job 'job' [Numpy:float32(4,)] on cpu: 1 kernels, arena 0 bytes>
        >>> compiled.as_text("fusion").splitlines()   # exp and + fused into one kernel
        ['k0_exp_add: %0 %2 -> out0']
        >>> job(np.zeros(4, np.float32))   # the call runs what was compiled
        array([2., 2., 2., 2.], dtype=float32)
    """

    def __init__(self, job: Any, name: str, signature: str, stages: Sequence[Stage] = ()):
        self._job = job
        self.name = name
        self.signature = signature
        self.stages = list(stages)
        self._costs: Optional[Dict[str, KernelCost]] = None
        self._cpu_assembly: Optional[str] = None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._job, attr)

    def __repr__(self) -> str:
        return (f"<flowjit compiled job '{self.name}' [{self.signature}] on {self._job.device}: "
                f"{self._job.num_kernels} kernels, arena {self._job.arena_bytes} bytes>")

    def as_text(self, stage: str = "optimized") -> str:
        """The text of one stage: traced, optimized, fusion, kernels, llvm,
        assembly, plan or distribution.

        "llvm" and "assembly" need the LLVM IR, which a job keeps when it was
        compiled through ``job.lower().compile()`` / ``job.compile()`` (or with
        ``FLOWJIT_KEEP_TEXT=1`` or ``FLOWJIT_DEBUG>=3``); otherwise they are
        empty. On the CPU the assembly is generated from that LLVM IR when it
        is first asked for (for this process's CPU target: FLOWJIT_CPU's when set); on a GPU
        it is the PTX."""
        texts = {"traced": "ir_traced", "optimized": "ir_optimized", "fusion": "fusion_plan",
                 "kernels": "kernels", "llvm": "llvm_ir", "assembly": "assembly", "plan": "plan",
                 "distribution": "distribution"}
        if stage not in texts:
            raise ValueError(f"as_text: stage must be one of {', '.join(texts)}, got {stage!r}")
        if stage == "assembly":
            return self._assembly()
        return getattr(self._job, texts[stage])

    def _assembly(self) -> str:
        text = self._job.assembly
        if text or not str(self._job.device).startswith("cpu"):
            return text
        if self._cpu_assembly is None:
            llvm_ir = self._job.llvm_ir
            # The core keeps CPU assembly only at FLOWJIT_DEBUG>=4; the LLVM IR
            # it kept says the same code.
            self._cpu_assembly = _C.assembly_from_ir(llvm_ir) if llvm_ir else ""
        return self._cpu_assembly

    def kernel_costs(self) -> Dict[str, KernelCost]:
        """Per kernel symbol, what one launch computes and touches (collectives
        have no entry)."""
        if self._costs is None:
            self._costs = {sym: KernelCost(flops, nbytes)
                           for sym, flops, nbytes in self._job.kernel_costs}
        return self._costs

    def profile(self) -> ProfileTable:
        costs = self.kernel_costs()
        rows = []
        for sym, calls, secs in self._job.profile():
            c = costs.get(sym)
            rows.append(ProfileRow(sym, calls, secs, c.flops if c else None, c.bytes if c else None))
        return ProfileTable(self.name, rows)

    def trace_events(self) -> List[Dict[str, Any]]:
        """This job's compile stages and kernel launches as Chrome trace events."""
        pid = os.getpid()
        events: List[Dict[str, Any]] = []
        for s in self.stages:
            events.append({"name": s.name, "cat": "compile", "ph": "X", "pid": pid, "tid": s.thread,
                           "ts": s.start_ns / 1e3, "dur": s.dur_ns / 1e3,
                           "args": {"job": self.name, "signature": self.signature}})
        for device, sym, start, dur, tid in self._job.trace_events():
            events.append({"name": sym, "cat": "kernel", "ph": "X", "pid": pid, "tid": tid,
                           "ts": start / 1e3, "dur": dur / 1e3,
                           "args": {"job": self.name, "device": f"cpu:{device}"}})
        return events


def export_chrome_trace(path: str, jobs: Sequence[CompiledJob]) -> str:
    """Writes the compile stages and kernel launches of `jobs` as a Chrome
    trace (JSON object format), which Perfetto and chrome://tracing open.
    Kernel launches are recorded only with FLOWJIT_PROFILE=1."""
    pid = os.getpid()
    events: List[Dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                     "args": {"name": f"flowjit (pid {pid})"}}]
    threads = set()
    for j in jobs:
        for e in j.trace_events():
            events.append(e)
            threads.add(e["tid"])
    for t in sorted(threads):
        label = "main" if t == threading.main_thread().native_id else f"thread {t}"
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": label}})
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "flowjit", "clock": "CLOCK_MONOTONIC"}}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


# ---------------------------------------------------------------- lower() / compile()

class _Shape:
    """An argument given only by its shape (lower() with shapes)."""

    def __init__(self, shape: Tuple[int, ...]):
        self.shape = tuple(shape)


class Lowered:
    """``job.lower(*args_or_shapes)``: the job function bound to one signature,
    not yet traced. .compile() traces and compiles it without running it (a
    train job's variables are created and initialized, never updated)."""

    def __init__(self, job: Any, key: tuple, flat: list):
        self._job = job
        self._key = key
        self._flat = flat

    @property
    def signature(self) -> tuple:
        return self._key

    def compile(self) -> CompiledJob:
        return self._job._compile_only(self._key, self._flat)

    def __repr__(self) -> str:
        return f"<flowjit lowered job '{self._job.job_name}' for {self._key}>"


def lower_args(job: Any, args: Sequence[Any]) -> Tuple[tuple, list]:
    """The signature key and flat argument stand-ins of job.lower(*args): each
    argument is an array (or __dlpack__ / __array__ object), a shape (tuple
    or list of ints; per device for tp.ListNumpy: a list of shapes), or None
    for the declared shape."""
    from .. import config
    from .job import fits_dynamic_bound
    params = job._params
    if len(args) not in (0, len(params)):
        names = ", ".join(n for n, _ in params)
        raise TypeError(f"job '{job.job_name}'.lower takes {len(params)} argument(s) ({names}) or none "
                        f"(the declared shapes), but {len(args)} were given")
    if not args:
        args = [None] * len(params)

    def is_shape(x):
        return isinstance(x, (tuple, list)) and all(isinstance(d, int) for d in x)

    def stand_in(pname, ph, x, exact):
        if x is None:
            x = ph.shape
        if is_shape(x):
            shape = tuple(int(d) for d in x)
            if exact and shape != tuple(ph.shape):
                raise ValueError(f"job '{job.job_name}': parameter '{pname}' is declared with shape "
                                 f"{ph.shape} but lower() was given shape {shape}")
            if not exact and not fits_dynamic_bound(shape, ph.shape):
                raise ValueError(f"job '{job.job_name}': parameter '{pname}' has shape {shape}, which is "
                                 f"not within the declared bounds {ph.shape}")
            return _Shape(shape)
        return job._check_array(pname, ph, x, exact)

    key, flat = [], []
    for (pname, ph), x in zip(params, args):
        if ph.kind == "Numpy":
            s = stand_in(pname, ph, x, True)
            key.append(s.shape)
            flat.append(s)
        elif ph.kind == "ListNumpy":
            n = config.device_count()
            if x is None or is_shape(x):
                per = [x] * n
            else:
                per = job._check_list(pname, ph, x)
            items = [stand_in(f"{pname}[{i}]", ph, v, False) for i, v in enumerate(per)]
            key.append(tuple(v.shape for v in items))
            flat.extend(items)
        else:
            if x is None:
                raise TypeError(f"job '{job.job_name}': parameter '{pname}' is a tp.ListListNumpy "
                                "placeholder; lower() needs its arrays or shapes, per device a list")
            per = job._check_list(pname, ph, x)
            shapes = []
            for d, lst in enumerate(per):
                items = [stand_in(f"{pname}[{d}][{i}]", ph, v, False) for i, v in enumerate(lst)]
                flat.extend(items)
                shapes.append(tuple(v.shape for v in items))
            key.append(tuple(shapes))
    return tuple(key), flat


def now_ns() -> int:
    return time.monotonic_ns()

