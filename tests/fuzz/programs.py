"""Differential program fuzzer: random flowjit jobs against a float64 numpy reference.

Hypothesis draws a small job (tests/python/test_fuzz_programs.py runs a fixed
slice of it; ``tools/dev.sh fuzz programs`` or ``python tests/fuzz/programs.py
--seconds N --seed S`` the long run): placeholders of every dtype flowjit
supports, odd and empty shapes, special values (NaN, +-inf, -0.0, extremes),
then one to four ops of the public API (elementwise with broadcasting and
Python scalars, reductions, matmul, conv2d and pooling, array ops, sorts,
casts), fused or with FLOWJIT_DISABLE_FUSION=1; train jobs (float64) also
compare the gradient of a variable (flow.watch_diff) with central
differences of the reference, and the variable after one update of the
drawn optimizer (SGD with or without momentum, SGDW, Adam, AdamW, LazyAdam,
RMSProp, LAMB, LARS; weight decay, gradient clipping) with the reference's
update of that gradient (_ref_update, OneFlow's update rules). Some jobs run
on 2 CPU devices (flow.config.cpu_device_num(2)): in the consistent view
(one logical job, the batch split where it divides, a train job's variable
split across the devices or whole) or the mirrored view
(each device gets the whole inputs; each device's results must be the
one-device job's, within the same tolerance).

The program is generated together with its reference value: each op's
reference runs as it is drawn, so later ops know their operands' shapes and
dtypes. flowjit itself runs only in a worker process (Worker) that executes
the job's source text; a worker that dies (a crash) or does not answer in
time (a hang) is a finding too, and the next case gets a fresh worker. Every
finding is shrunk by Hypothesis and printed as a self-contained pytest test.

The reference's contract, where numpy and OneFlow/flowjit could differ:
  * floats: each op is computed in float64 from its operands and rounded to
    the op's dtype (a correctly rounded op); results agree within a tolerance
    of the dtype (RTOL/ATOL, ATOL scaled by the magnitudes the value was
    computed from). Values of exact ops (data movement, comparisons, min/max,
    floor/ceil/round, sign, abs, neg, casts) must match bit for bit, the sign
    of zero included; NaN where NaN, inf where inf.
  * integers: exact. add/sub/mul/neg/abs/square wrap (two's complement; numpy
    does the same for arrays); division truncates toward zero and x / 0 is 0
    (C semantics, flowjit's documented choice, where numpy floors and warns);
    a Python scalar operand outside the dtype's range is an error (numpy 2
    raises OverflowError; flowjit must refuse it, not wrap it).
  * float -> int casts are only drawn where numpy and C agree (finite values
    in range, truncated).
  * sort/argsort/top_k: NaN is the largest value (numpy puts it last in an
    ascending sort, PyTorch first in a descending one and in top_k), -0.0
    equals 0.0, ties keep index order.
  * reductions over every axis of a rank >= 1 input, without keepdims, have
    shape (1,) (OneFlow's rule), not numpy's ().
  * reductions: NaN propagates through max/min (numpy, PyTorch); maximum and
    minimum of two values likewise, and -0.0 < +0.0 there (IEEE 754-2019's
    maximum/minimum; numpy returns either zero). max/min over an empty extent
    is not drawn; the sign of a zero that reduce_max/min return is not compared.
  * optimizers: the variable after one update from fresh state must be the
    reference's update of the gradient flowjit reports (VAR_RTOL); the rate
    is a float32 value (OneFlow's), Adam's bias correction scales the rate;
    a mirrored job's watch_diff joins the devices' gradients along axis 0
    (as a tp.Numpy result does) and the update uses their mean.
  * average pooling divides by the number of input elements in the window
    (TensorFlow's and OneFlow's rule, not PyTorch's count_include_pad);
    pooling padding that leaves a window with no input element is refused.
"""
import argparse
import math
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

FLOATS = ("float32", "float64")
INTS = ("int8", "uint8", "int32", "int64")
NUMERIC = FLOATS + INTS
ALL = NUMERIC + ("bool",)
FLOW_DT = {"float32": "flow.float32", "float64": "flow.float64", "int8": "flow.int8", "uint8": "flow.uint8",
           "int32": "flow.int32", "int64": "flow.int64", "bool": "flow.bool"}
RTOL = {"float32": 2e-4, "float64": 1e-9}
ATOL = {"float32": 2e-5, "float64": 1e-11}
CASE_TIMEOUT = 20.0   # seconds one case may take in the worker before it counts as a hang
SHRINK_SECONDS = 90   # the most time shrinking one finding may take (Hypothesis' default: 300)
USER_ERRORS = ("TypeError", "ValueError", "OverflowError", "NotImplementedError", "IndexError")


# Open findings (issue [fuzz]) whose fix is pending: with skip_known the
# generator does not draw these constructs, so a run finds what is new; each
# has a strict-xfail regression test in tests/python/test_fuzz_programs.py.
# Remove a key here when its fix lands (its test then passes).
KNOWN = {
}


class Refused(Exception):
    """The reference says the op is an error (flowjit must raise a user error)."""


@dataclass
class Val:
    name: str
    dtype: str
    value: np.ndarray          # the reference value (numpy, the op's dtype)
    exact: bool = True         # computed only by exact ops: compare bit for bit
    scale: float = 1.0         # magnitude the value was computed from (tolerance scale)
    fragile: bool = False      # computed (somewhere upstream) from magnitudes near overflow, with
    # rounding: whether inf - inf (NaN) happens depends on FMA and order; only shape and dtype compared
    tol: Optional[str] = None  # the dtype whose tolerance applies: float32 for a float64 value
    # computed from rounded float32 values (a cast up keeps float32's error)
    alt: Optional[np.ndarray] = None   # also accepted: the op computed in float32 by numpy
    # (a float32 sum or dot may overflow to inf, and inf - inf to NaN, where float64 does not)


@dataclass
class Program:
    inputs: List[Tuple[str, np.ndarray]] = field(default_factory=list)
    lines: List[str] = field(default_factory=list)
    outputs: List[Val] = field(default_factory=list)
    refused: Optional[str] = None       # the op line the reference refuses (the job must raise)
    fusion: bool = True
    train: bool = False
    var_init: Optional[np.ndarray] = None   # train: the variable "w" (value name "w")
    weights: Optional[np.ndarray] = None    # train: loss = sum(out * weights)
    grad: Optional[np.ndarray] = None       # train: the reference gradient (NaN: not checked)
    opt: Optional["Opt"] = None             # train: the optimizer (None: SGD(lr=1), momentum=0)
    devices: int = 1                        # 2: flow.config.cpu_device_num(2)
    view: str = "consistent"                # 2 devices: "consistent" (one logical job) or "mirrored"
    # (every device gets the same whole inputs; each device's outputs are the reference)
    ops: List[str] = field(default_factory=list)
    got_grad: Optional[np.ndarray] = None   # train: flowjit's gradient, where the update was wrong
    var_split: Optional[int] = None   # train on 2 devices, consistent view: w split along this axis

    # ------------------------------------------------------------ source text
    def empty(self):
        return any(0 in a.shape for _, a in self.inputs) or any(0 in v.value.shape for v in self.outputs)

    def listy(self):
        return self.mirrored() or self.empty()

    def mirrored(self):
        """On several devices: the mirrored view (drawn, or for empty shapes, whose
        tp.ListNumpy takes one array per device in either view)."""
        return self.devices > 1 and (self.view == "mirrored" or self.empty())

    def copies(self):
        """How many arrays each argument and result has (one per device in the mirrored view)."""
        return self.devices if self.mirrored() else 1

    def optimizer_source(self):
        if self.opt is None:
            return ("flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), "
                    "momentum=0).minimize(loss)")
        return self.opt.source()

    def job_source(self):
        lst = self.listy()
        params = []
        for name, a in self.inputs:
            kind = "ListNumpy" if lst else "Numpy"
            shape = tuple(max(d, 1) for d in a.shape) if lst else a.shape
            params.append(f"{name}: tp.{kind}.Placeholder({shape!r}, dtype={FLOW_DT[a.dtype.name]})")
        ret = "tp.ListNumpy" if lst else "tp.Numpy"
        n = max(len(self.outputs), 1)
        body = list(self.lines)
        if self.train:
            body = [f"w = flow.get_variable('w', shape={self.var_init.shape!r}, dtype=flow.float64, "
                    f"initializer=flow.constant_initializer(0.0)"
                    + (f", distribute=flow.distribute.split({self.var_split})" if self.var_split is not None
                       else "") + ")"] + body
            out = self.outputs[0].name
            body += [f"loss = flow.math.reduce_sum(flow.math.multiply({out}, lw))",
                     "flow.watch_diff(w, _grads.append)", self.optimizer_source()]
        names = ", ".join(v.name for v in self.outputs) if self.outputs else self.inputs[0][0]
        body.append(f"return ({names},)")
        typ = "train" if self.train else "predict"
        head, cfg = "", ""
        if self.devices > 1:   # (flow.config.cpu_device_num(devices) is called before)
            head = ("_cfg = flow.function_config()\n"
                    f"_cfg.default_logical_view(flow.scope.{'mirrored' if self.mirrored() else 'consistent'}_view())\n")
            cfg = ", function_config=_cfg"
        return (head + f"@flow.global_function(type={typ!r}{cfg})\n"
                f"def job({', '.join(params)}) -> Tuple[{', '.join([ret] * n)}]:\n"
                + textwrap.indent("\n".join(body), "    ") + "\n")

    def args_source(self):
        out = []
        for _, a in self.inputs:
            arr = f"np.array({a.tolist()!r}, dtype=np.{a.dtype.name}).reshape({a.shape!r})"
            if not self.listy():
                out.append(arr)
            else:   # a list of one array per device (the mirrored view: the same on each)
                out.append(f"[{arr}]" + (f" * {self.copies()}" if self.copies() > 1 else ""))
        return out

    def reproducer(self, what):
        """A self-contained pytest test that fails while the finding stands."""
        env = "" if self.fusion else "monkeypatch.setenv('FLOWJIT_DISABLE_FUSION', '1')\n"
        lines = ["import numpy as np", "import pytest", "from typing import Tuple",
                 "import flowjit as flow", "import flowjit.typing as tp",
                 "nan, inf = float('nan'), float('inf')", "", "",
                 "def test_fuzz_finding(monkeypatch):",
                 f"    # {what}"]
        src = env + "_grads = []\n" if self.train else env
        src += self.job_source()
        if self.train:
            src += (f"flow.load_variables({{'w': np.array({self.var_init.tolist()!r}, "
                    f"dtype=np.float64).reshape({self.var_init.shape!r})}})\n")
        args = ", ".join(self.args_source())
        if self.refused is not None:
            src += ("with pytest.raises((TypeError, ValueError, OverflowError, NotImplementedError)):\n"
                    f"    job({args})\n")
        else:
            src += f"got = job({args})\n"
            for i, v in enumerate(self.outputs):
                want = f"np.array({v.value.tolist()!r}, dtype=np.{v.value.dtype.name}).reshape({v.value.shape!r})"
                for j in range(self.copies()):
                    g = f"got[{i}][{j}]" if self.listy() else f"got[{i}]"
                    if v.exact or v.dtype not in FLOATS:
                        src += f"np.testing.assert_array_equal({g}, {want})\n"
                        if v.dtype in FLOATS:
                            src += f"assert (np.signbit({g}) == np.signbit({want})).all()  # -0.0\n"
                    else:
                        src += (f"np.testing.assert_allclose({g}, {want}, rtol={RTOL[v.dtype]}, "
                                f"atol={ATOL[v.dtype] * v.scale:.3g})\n")
            if self.train:
                src += "flow.sync_default_session()\n"
                src += (f"want = np.array({self.grad.tolist()!r}).reshape({self.grad.shape!r})  "
                        "# central differences; nan: a kink, not checked\n")
                g = "_grads[0]"
                if self.mirrored():   # watch_diff joins the devices' gradients along axis 0
                    src += "g = np.split(np.asarray(_grads[0]), 2)[0]\n"
                    g = "g"
                src += (f"ok = np.isnan(want) | np.isclose({g}, want, rtol=1e-4, atol=1e-6 * "
                        f"max(1.0, np.nanmax(np.abs(want), initial=0)))\nassert ok.all(), ({g}, want)\n")
                if self.got_grad is not None:   # the update from the gradient flowjit computed
                    kind = self.opt.kind if self.opt else "SGD"
                    want_w = _ref_update(self.opt, self.var_init, self.got_grad)
                    src += (f"# w after one {kind} update (tests/fuzz/programs.py's _ref_update) of the "
                            "gradient flowjit computed\n"
                            f"w_want = np.array({want_w.tolist()!r}).reshape({want_w.shape!r})\n"
                            "np.testing.assert_allclose(flow.get_all_variables()['w'], w_want, "
                            f"rtol={VAR_RTOL}, atol={VAR_RTOL} * {_var_scale(self.var_init, want_w):.3g})\n")
        if self.devices > 1:
            src = (f"flow.clear_default_session()\nflow.config.cpu_device_num({self.devices})\ntry:\n"
                   + textwrap.indent(src, "    ")
                   + "finally:\n    flow.clear_default_session()\n    flow.config.cpu_device_num(1)\n")
        return "\n".join(lines) + "\n" + textwrap.indent(src, "    ")


# ---------------------------------------------------------------- value strategies

def _special(dtype):
    if dtype in FLOATS:
        f = np.finfo(dtype)
        return [np.nan, np.inf, -np.inf, -0.0, 0.0, float(f.max), -float(f.max), float(f.tiny),
                float(f.smallest_subnormal), 1.0, -1.0, 0.5, 2.5, -2.5]
    if dtype == "bool":
        return [True, False]
    i = np.iinfo(dtype)
    return [int(i.min), int(i.max), 0, 1, -1 if i.min < 0 else 2]


def _elements(dtype, special=True, lo=-4.0, hi=4.0):
    if dtype == "bool":
        return st.booleans()
    if dtype in FLOATS:
        base = st.floats(lo, hi, width=32 if dtype == "float32" else 64, allow_subnormal=False)
        if not special:
            return base
        return st.one_of(base, base, base, st.sampled_from(_special(dtype)))
    i = np.iinfo(dtype)
    base = st.integers(max(int(i.min), -20), min(int(i.max), 20))
    if not special:
        return base
    return st.one_of(base, base, st.sampled_from(_special(dtype)))


def _shape(draw, rank=None, allow_empty=True, max_extent=5):
    if rank is None:
        rank = draw(st.integers(0, 4))
    lo = 0 if allow_empty and draw(st.integers(0, 9)) == 0 else 1
    return tuple(draw(st.integers(lo, max_extent)) for _ in range(rank))


def _array(draw, shape, dtype, special=True, lo=-4.0, hi=4.0):
    n = int(np.prod(shape, dtype=np.int64))
    vals = draw(st.lists(_elements(dtype, special, lo, hi), min_size=n, max_size=n))
    with np.errstate(all="ignore"):
        return np.array(vals, dtype=dtype).reshape(shape)


# ---------------------------------------------------------------- reference helpers

def _round(x, dtype):
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dtype)


def _absmax(*arrs):
    m = 1.0
    for a in arrs:
        a = np.asarray(a)
        if a.dtype.kind == "f" and a.size:
            f = np.abs(a[np.isfinite(a)])
            if f.size:
                m = max(m, float(f.max()))
    return m


def _int_div(a, b):
    """C division (truncation toward zero), x / 0 == 0, MIN / -1 wraps to MIN; exact in Python ints."""
    bits = a.dtype.itemsize * 8
    signed = a.dtype.kind == "i"

    def one(x, y):
        x, y = int(x), int(y)
        if y == 0:
            return 0
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        q %= 1 << bits
        return q - (1 << bits) if signed and q >= 1 << (bits - 1) else q
    out = [one(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist())]
    return np.array(out, dtype=a.dtype).reshape(a.shape)


def _sort_order(row, descending):
    """Stable order with NaN the largest value and -0.0 == 0.0."""
    idx = list(range(len(row)))
    if row.dtype.kind == "f":
        key = (lambda i: (not np.isnan(row[i]), -row[i] if not np.isnan(row[i]) else 0.0)) if descending \
            else (lambda i: (bool(np.isnan(row[i])), row[i] if not np.isnan(row[i]) else 0.0))
    else:
        key = (lambda i: -int(row[i])) if descending else (lambda i: int(row[i]))
    return sorted(idx, key=key)


def _ref_sort(x, axis, descending, want):
    y = np.moveaxis(x, axis, -1)
    out = np.empty(y.shape, dtype=x.dtype if want == "values" else np.int32)
    for i in np.ndindex(*y.shape[:-1]):
        order = _sort_order(y[i], descending)
        out[i] = y[i][order] if want == "values" else np.array(order, np.int32)
    return np.moveaxis(out, -1, axis)


def _ref_conv(x, w, strides, pads, dil, groups, dt=np.float64):
    n, c, h, wd = x.shape
    co, cg, kh, kw = w.shape
    xp = np.pad(x.astype(dt), ((0, 0), (0, 0), pads[0], pads[1]))
    oh = (h + sum(pads[0]) - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + sum(pads[1]) - dil[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, co, oh, ow), dt)
    opg = co // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dil[0]: i * dil[0] + strides[0] * (oh - 1) + 1: strides[0],
                           j * dil[1]: j * dil[1] + strides[1] * (ow - 1) + 1: strides[1]]
                wk = w[g * opg:(g + 1) * opg, :, i, j].astype(dt)
                out[:, g * opg:(g + 1) * opg] += np.einsum("nchw,oc->nohw", patch, wk)
    return out


def _ref_pool(x, kind, k, s, pads, dt=np.float64):
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x.astype(dt), ((0, 0), (0, 0), pads[0], pads[1]), constant_values=fill)
    ones = np.pad(np.ones((h, w)), (pads[0], pads[1]))
    oh = (h + sum(pads[0]) - k[0]) // s[0] + 1
    ow = (w + sum(pads[1]) - k[1]) // s[1] + 1
    out = np.zeros((n, c, oh, ow), dt)
    for a in range(oh):
        for b in range(ow):
            win = xp[:, :, a * s[0]:a * s[0] + k[0], b * s[1]:b * s[1] + k[1]]
            if kind == "max":
                out[:, :, a, b] = np.max(win, axis=(2, 3))
            else:
                cnt = ones[a * s[0]:a * s[0] + k[0], b * s[1]:b * s[1] + k[1]].sum()
                out[:, :, a, b] = win.sum(axis=(2, 3)) / cnt
    return out


def _same_pads(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return (total // 2, total - total // 2)


# ---------------------------------------------------------------- train: optimizers and their reference

VAR_RTOL = 1e-9   # the variable after the update: float64 arithmetic, a few roundings


@dataclass
class Opt:
    """A flow.optimizer optimizer of a train job, every hyperparameter given."""
    kind: str                   # the class name in flow.optimizer
    lr: float
    kw: dict                    # its hyperparameters (keyword arguments)
    sched: bool = True          # the rate as PiecewiseConstantScheduler([], [lr]), else the number
    clip: Optional[float] = None   # grad_clipping=by_global_norm(clip)

    def source(self):
        lr = f"flow.optimizer.PiecewiseConstantScheduler([], [{self.lr!r}])" if self.sched else repr(self.lr)
        args = [lr] + [f"{k}={v!r}" for k, v in self.kw.items()]
        if self.clip is not None:
            args.append(f"grad_clipping=flow.optimizer.grad_clipping.by_global_norm({self.clip!r})")
        return f"flow.optimizer.{self.kind}({', '.join(args)}).minimize(loss)"


OPTIMIZERS = ["SGD", "SGDW", "Adam", "AdamW", "LazyAdam", "RMSProp", "LAMB", "LARS"]


def _draw_opt(d):
    """None (SGD, lr 1, no momentum: w - g) or an optimizer with drawn hyperparameters."""
    if d(st.integers(0, 2)) == 0:
        return None
    kind = d(st.sampled_from(OPTIMIZERS))
    one = lambda *xs: d(st.sampled_from(xs))   # noqa: E731
    kw = {}
    if kind in ("SGD", "SGDW"):
        kw["momentum"] = one(0.0, 0.5, 0.9)
    elif kind in ("Adam", "AdamW", "LazyAdam", "LAMB"):
        kw.update(beta1=one(0.9, 0.5, 0.0), beta2=one(0.999, 0.9, 0.5), epsilon=one(1e-8, 1e-6, 1e-3, 0.5))
        if kind in ("Adam", "AdamW"):
            kw["do_bias_correction"] = d(st.booleans())
    elif kind == "RMSProp":
        kw.update(decay_rate=one(0.99, 0.9, 0.5), epsilon=one(1e-8, 1e-3, 0.5), centered=d(st.booleans()))
    elif kind == "LARS":
        kw.update(momentum_beta=one(0.0, 0.9), epsilon=one(1e-9, 1e-3), lars_coefficient=one(1e-4, 0.1, 1.0))
    if kind in ("SGDW", "AdamW", "LAMB", "LARS"):
        kw["weight_decay"] = one(0.0, 0.01, 0.5)
    clip = one(0.1, 1.0, 100.0) if d(st.integers(0, 3)) == 0 else None
    return Opt(kind, one(1.0, 0.5, 0.1, 0.01, 3.0), kw, d(st.booleans()), clip)


def _norm(a):
    return math.sqrt(float(np.sum(np.square(a))))


def _ref_update(o, w, g):
    """The variable after one update, from fresh optimizer state (zero
    moments), of the gradient g, in float64: OneFlow's update rules (its
    model_update kernels and flow.optimizer's documentation). As in OneFlow
    the rate is a float32 value; Adam's bias correction scales the rate
    (computed in float64, then rounded to float32), not m and v."""
    w, g = w.astype(np.float64), np.asarray(g, np.float64)
    if o is None:
        return w - g
    k = o.kw
    lr = float(np.float32(o.lr))
    if o.clip is not None:   # g * clip / max(||g||, clip), over all the variables' gradients (here one)
        g = g * (o.clip / max(_norm(g), o.clip))
    wd = k.get("weight_decay", 0.0)
    if o.kind in ("SGD", "SGDW"):
        # v = momentum * v - lr * g with v = 0; w += v - lr * wd * w
        return w - lr * g - lr * wd * w
    if o.kind in ("Adam", "AdamW", "LazyAdam", "LAMB"):
        b1, b2, eps = k["beta1"], k["beta2"], k["epsilon"]
        m, v = (1 - b1) * g, (1 - b2) * g * g
        if o.kind == "LAMB":
            # step t = 1: m_hat = m / (1 - beta1), v_hat = v / (1 - beta2);
            # d = m_hat / (sqrt(v_hat) + eps); trust = ||w|| / ||d||, 1 where a
            # norm is 0 (OneFlow's LambGradFunctor/LambUpdateFunctor: the
            # weight decay term is not part of ||d||); w -= lr * trust * (d + wd * w)
            dd = (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps)
            wn, dn = _norm(w), _norm(dd)
            trust = wn / dn if wn > 0 and dn > 0 else 1.0
            return w - lr * trust * (dd + wd * w)
        if k.get("do_bias_correction", o.kind == "LazyAdam"):
            lr = float(np.float32(o.lr * math.sqrt(1 - b2) / (1 - b1)))
        return w - lr * (m / (np.sqrt(v) + eps) + wd * w)
    if o.kind == "RMSProp":
        dr, eps = k["decay_rate"], k["epsilon"]
        ms = (1 - dr) * g * g
        if k["centered"]:
            mg = (1 - dr) * g
            ms = ms - mg * mg
        return w - lr * g / np.sqrt(ms + eps)
    if o.kind == "LARS":
        # local = lr * coeff * ||w|| / (eps + ||g|| + wd * ||w||), lr where a
        # norm is 0; v = momentum * v - local * g (v = 0); w += v - local * wd * w
        eps, coeff = k["epsilon"], k["lars_coefficient"]
        wn, gn = _norm(w), _norm(g)
        local = lr * coeff * wn / (eps + gn + wd * wn) if wn > 0 and gn > 0 else lr
        return w - local * g - local * wd * w
    raise AssertionError(o.kind)


def _var_scale(w0, want):
    return max(1.0, _absmax(w0), _absmax(want - w0))


# ---------------------------------------------------------------- the generator

UNARY_FLOAT = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
               "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "reciprocal": lambda x: 1 / x,
               "sin": np.sin, "cos": np.cos, "erf": None, "erfc": None,
               "floor": np.floor, "ceil": np.ceil, "round": np.round}
UNARY_ANY = {"abs": np.abs, "negative": np.negative, "square": np.square, "sign": np.sign}
# (sign and relu are exact, but the sign of sign(-0.0) and relu(-0.0) is not
# specified: numpy gives +0.0, flowjit -0.0; they compare with tolerance.)
EXACT_UNARY = {"floor", "ceil", "round", "abs", "negative"}
BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": None,
          "maximum": np.maximum, "minimum": np.minimum, "pow": np.power}
COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
           "greater": np.greater, "greater_equal": np.greater_equal}
TRAIN_OPS = ["unary", "binary", "scalar", "reduce", "matmul", "transpose", "reshape", "concat", "slice",
             "pad", "tile", "where", "conv2d", "pool", "softmax", "gather", "broadcast", "attention"]
PREDICT_OPS = TRAIN_OPS + ["compare", "logical", "cast", "sort", "argmax", "reverse"]


def _erf(x):
    v = np.vectorize(math.erf, otypes=[np.float64])
    return v(x) if np.asarray(x).size else np.asarray(x, np.float64)


class Gen:
    """Draws a program; each op's reference runs as it is drawn."""

    def __init__(self, draw, train, skip_known=True):
        self.draw = draw
        self.train = train
        self.skip = set(KNOWN) if skip_known else set()
        self.p = Program(train=train)
        self.vals: List[Val] = []
        self.nin = 0

    # -------------------------------------------------------------- helpers
    def fresh(self, shape, dtype, special=None, lo=-4.0, hi=4.0):
        if special is None:
            special = not self.train
        name = f"x{self.nin}"
        self.nin += 1
        a = _array(self.draw, shape, dtype, special, lo, hi)
        self.p.inputs.append((name, a))
        v = Val(name, dtype, a, True, _absmax(a))
        self.vals.append(v)
        return v

    def pick(self, pred=lambda v: True, dtypes=None):
        """An existing value fit for the op, or a fresh input."""
        dtypes = dtypes or (("float64",) if self.train else ALL)
        cands = [v for v in self.vals if v.dtype in dtypes and pred(v)]
        if cands and self.draw(st.integers(0, 3)) > 0:
            return self.draw(st.sampled_from(cands))
        dtype = self.draw(st.sampled_from(dtypes))
        for _ in range(5):
            shape = _shape(self.draw, allow_empty=not self.train)
            if pred(Val("", dtype, np.zeros(shape, dtype))):
                return self.fresh(shape, dtype)
        return None

    def emit(self, expr, value, dtype, exact, scale, alt=None):
        name = f"v{len(self.p.lines)}"
        self.p.lines.append(f"{name} = {expr}")
        value = np.asarray(value)
        if value.dtype.name != dtype:
            value = _round(value, dtype)
        v = Val(name, dtype, value, exact, max(scale, _absmax(value)) if not exact else _absmax(value))
        import re
        srcs = [u for u in self.vals if u.name in set(re.findall(r"\b([vx]\d+|w)\b", expr))]
        if dtype == "float64" and any(u.tol == "float32" or (u.dtype == "float32" and not u.exact)
                                      for u in srcs):
            v.tol = "float32"
        # an integer or bool result of rounded floats (a comparison, a cast, an
        # index) flips where a value sits within rounding of a boundary
        inexact_in = any(u.dtype in FLOATS and not u.exact for u in srcs)
        v.fragile = any(u.fragile for u in srcs) or (dtype not in FLOATS and inexact_in) or (
            not exact and dtype in FLOATS and v.scale >= float(np.finfo(dtype).max) / 16)
        if alt is not None and dtype == "float32":
            v.alt = _round(alt, dtype)
        self.vals.append(v)
        return v

    def refuse(self, expr, why):
        self.p.lines.append(f"bad = {expr}  # {why}")
        self.p.refused = expr
        raise Refused(why)

    def fl(self, v):
        return v.value.astype(np.float64)

    # -------------------------------------------------------------- ops
    def op_unary(self):
        d = self.draw
        names = list(UNARY_ANY) + ["relu"] + list(UNARY_FLOAT)
        if self.train:
            names = ["tanh", "sigmoid", "sin", "cos", "exp", "square", "negative", "abs", "relu", "erf"]
        name = d(st.sampled_from(names))
        floats_only = name in UNARY_FLOAT
        x = self.pick(dtypes=("float64",) if self.train else (FLOATS if floats_only else NUMERIC))
        if x is None:
            return
        mod = "flow.nn" if name == "relu" else "flow.math"
        with np.errstate(all="ignore"):
            if x.dtype in FLOATS:
                fn = _relu if name == "relu" else (UNARY_FLOAT.get(name) or UNARY_ANY[name])
                r = fn(self.fl(x))
            else:
                r = _relu(x.value) if name == "relu" else UNARY_ANY[name](x.value)
        self.emit(f"{mod}.{name}({x.name})", r, x.dtype, x.exact and name in EXACT_UNARY, x.scale)

    def _bcast_partner(self, x, dtypes=None):
        """A fresh operand whose shape broadcasts with x's (dims dropped or set to 1)."""
        d = self.draw
        shape = list(x.value.shape)
        if shape and d(st.booleans()):
            k = d(st.integers(0, len(shape)))
            shape = shape[k:]
            shape = [1 if d(st.integers(0, 3)) == 0 else s for s in shape]
        elif d(st.integers(0, 4)) == 0:
            shape = [1] + shape
        return self.fresh(tuple(shape), d(st.sampled_from(dtypes)) if dtypes else x.dtype)

    def op_binary(self):
        d = self.draw
        names = list(BINARY) if not self.train else ["add", "subtract", "multiply", "divide", "maximum",
                                                      "minimum"]
        name = d(st.sampled_from(names))
        x = self.pick(dtypes=("float64",) if self.train else (FLOATS if name == "pow" else NUMERIC))
        if x is None:
            return
        if name == "divide" and self.train:
            y = self.fresh(self._bcast_shape(x), "float64", lo=0.5, hi=2.0)
        else:
            cands = [v for v in self.vals if v is not x and v.dtype == x.dtype and _broadcasts(v, x)]
            y = d(st.sampled_from(cands)) if cands and d(st.booleans()) else self._bcast_partner(x)
        if d(st.booleans()) and not (name == "divide" and self.train):   # train: a divisor away from 0
            x, y = y, x
        self._binary(name, x, y, f"flow.math.{name}({x.name}, {y.name})")

    def _bcast_shape(self, x):
        return x.value.shape

    def _binary(self, name, x, y, expr, scalar=None):
        dt = x.dtype
        with np.errstate(all="ignore"):
            if dt in FLOATS:
                a = self.fl(x)
                # a Python scalar takes the blob's dtype first (numpy 2's NEP 50 too)
                b = self.fl(y) if y is not None else np.float64(_round(np.float64(scalar), dt))
                r = a / b if name == "divide" else BINARY[name](a, b)
                exact = name in ("maximum", "minimum")
                if name in ("maximum", "minimum"):
                    # IEEE 754-2019 maximum/minimum (PyTorch too): NaN propagates, -0.0 < +0.0.
                    tie = (a == 0) & (b == 0)
                    z = np.where(np.signbit(a) & np.signbit(b), -0.0, 0.0) if name == "maximum" else \
                        np.where(np.signbit(a) | np.signbit(b), -0.0, 0.0)
                    r = np.where(tie, z, r)
                    r = np.where(np.isnan(a) | np.isnan(b), np.nan, r)
            else:
                a = x.value
                b = y.value if y is not None else np.array(scalar, dtype=dt)
                r = _int_div(*np.broadcast_arrays(a, b)) if name == "divide" else BINARY[name](a, b)
                exact = True
        scale = x.scale * (y.scale if y is not None else max(1.0, abs(float(scalar)) if np.isfinite(
            float(scalar)) else 1.0))
        return self.emit(expr, r, dt, exact and x.exact and (y is None or y.exact), scale)

    def op_scalar(self):
        d = self.draw
        name = d(st.sampled_from(["add", "subtract", "multiply", "divide", "maximum", "minimum"]))
        x = self.pick(dtypes=("float64",) if self.train else NUMERIC)
        if x is None:
            return
        if x.dtype in FLOATS:
            s = d(_elements("float64", special=not self.train)) if not self.train else d(st.floats(0.5, 3))
            lit = repr(float(s)).replace("nan", "float('nan')").replace("inf", "float('inf')")
        else:
            i = np.iinfo(x.dtype)
            s = d(st.one_of(st.integers(-5, 5), st.sampled_from([int(i.min), int(i.max), int(i.max) + 1,
                                                                   int(i.min) - 1, 300, -129, 2 ** 31, 2 ** 63])))
            lit = repr(int(s))
        right = d(st.booleans()) and name not in ("divide", "subtract")
        expr = f"flow.math.{name}({lit}, {x.name})" if right else f"flow.math.{name}({x.name}, {lit})"
        if x.dtype in INTS:
            i = np.iinfo(x.dtype)
            if not i.min <= s <= i.max:
                if "scalar_overflow" in self.skip:
                    return
                self.refuse(expr, f"{s} is out of range for {x.dtype} (numpy: OverflowError)")
        self._binary(name, x, None, expr, scalar=s)

    def op_compare(self):
        d = self.draw
        name = d(st.sampled_from(list(COMPARE)))
        x = self.pick(dtypes=NUMERIC)
        if x is None:
            return
        y = self._bcast_partner(x)
        with np.errstate(all="ignore"):
            r = COMPARE[name](x.value, y.value)
        self.emit(f"flow.math.{name}({x.name}, {y.name})", r, "bool", True, 1.0)

    def op_logical(self):
        d = self.draw
        name = d(st.sampled_from(["logical_and", "logical_or", "logical_not"]))
        x = self.pick(dtypes=("bool",))
        if x is None:
            return
        if name == "logical_not":
            self.emit(f"flow.math.logical_not({x.name})", np.logical_not(x.value), "bool", True, 1.0)
            return
        y = self._bcast_partner(x)
        self.emit(f"flow.math.{name}({x.name}, {y.name})", getattr(np, name)(x.value, y.value), "bool", True, 1.0)

    def op_cast(self):
        d = self.draw
        x = self.pick()
        if x is None:
            return
        dst = d(st.sampled_from(ALL))
        a = x.value
        if x.dtype in FLOATS and dst in INTS:
            i = np.iinfo(dst)
            if a.size and not (np.isfinite(a).all() and (a > i.min - 1).all() and (a < i.max + 1).all()):
                dst = "float64"   # outside the target's range: undefined in C, not drawn
        with np.errstate(all="ignore"):
            r = a.astype(dst)
        exact = x.exact or dst not in FLOATS
        self.emit(f"flow.cast({x.name}, {FLOW_DT[dst]})", r, dst, exact, x.scale)

    def _axes(self, r):
        d = self.draw
        if r == 0 or d(st.integers(0, 3)) == 0:
            return None
        axes = sorted(set(d(st.lists(st.integers(0, r - 1), min_size=1, max_size=r))))
        return axes

    def op_reduce(self):
        d = self.draw
        names = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"]
        name = d(st.sampled_from(names if not self.train else ["reduce_sum", "reduce_mean", "reduce_max"]))
        dtypes = ("float64",) if self.train else (FLOATS if name == "reduce_mean" else NUMERIC)
        x = self.pick(lambda v: len(v.value.shape) >= 1, dtypes=dtypes)
        if x is None:
            return
        r = len(x.value.shape)
        axes = self._axes(r)
        keep = d(st.booleans())
        ax = tuple(range(r)) if axes is None else tuple(axes)
        if name in ("reduce_max", "reduce_min") and any(x.value.shape[a] == 0 for a in ax):
            return
        with np.errstate(all="ignore"):
            if x.dtype in FLOATS:
                a = self.fl(x)
                fn = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max, "reduce_min": np.min,
                      "reduce_prod": np.prod}[name]
                res = fn(a, axis=ax, keepdims=keep)
                alt = fn(x.value.astype(np.float32), axis=ax, keepdims=keep)
                scale = x.scale * max(1, int(np.prod([x.value.shape[i] for i in ax])))
                if name == "reduce_prod":   # a partial product may overflow (then inf * 0 = NaN, order-dependent)
                    fin = np.abs(a[np.isfinite(a)])
                    scale = max(1.0, _absmax(res), float(np.prod(np.maximum(fin, 1.0)))) * 4
                    # or underflow to 0 before it meets an infinity (0 * inf = NaN): fragile
                    tiny = fin[(fin > 0) & (fin < 1)]
                    if np.isinf(a).any() and float(np.prod(tiny)) < float(np.finfo(x.dtype).tiny):
                        scale = float(np.finfo(x.dtype).max)
            else:
                fn = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min, "reduce_prod": np.prod}[name]
                res = fn(x.value, axis=ax, keepdims=keep, dtype=x.value.dtype) if name in (
                    "reduce_sum", "reduce_prod") else fn(x.value, axis=ax, keepdims=keep)
                scale, alt = 1.0, None
        exact = x.dtype in INTS
        if not keep and r and len(ax) == r:   # OneFlow: a reduction over every axis has shape (1,)
            res = np.reshape(res, (1,))
            alt = None if alt is None else np.reshape(alt, (1,))
        axs = "None" if axes is None else repr(axes)
        self.emit(f"flow.math.{name}({x.name}, axis={axs}, keepdims={keep})", res, x.dtype, exact, scale, alt)

    def op_argmax(self):
        d = self.draw
        name = d(st.sampled_from(["argmax", "argmin"]))
        x = self.pick(lambda v: len(v.value.shape) >= 1 and 0 not in v.value.shape, dtypes=NUMERIC)
        if x is None:
            return
        a = x.value
        r = np.argmax(a, axis=-1) if name == "argmax" else np.argmin(a, axis=-1)
        if a.ndim == 1:
            r = np.reshape(r, (1,))
        self.emit(f"flow.math.{name}({x.name})", np.asarray(r, np.int32), "int32", True, 1.0)

    def op_matmul(self):
        d = self.draw
        dts = ("float64",) if self.train else FLOATS
        x = self.pick(lambda v: len(v.value.shape) in (2, 3), dtypes=dts)
        if x is None:
            return
        ta, tb = d(st.booleans()), d(st.booleans())
        a = x.value
        m, k = (a.shape[-1], a.shape[-2]) if ta else a.shape[-2:]
        n = d(st.integers(1, 5))
        bshape = (n, k) if tb else (k, n)
        if a.ndim == 3 and d(st.booleans()):
            bshape = (a.shape[0],) + bshape
        y = self.fresh(bshape, x.dtype)
        A = np.swapaxes(self.fl(x), -1, -2) if ta else self.fl(x)
        B = np.swapaxes(self.fl(y), -1, -2) if tb else self.fl(y)
        with np.errstate(all="ignore"):
            r = np.matmul(A, B)
            alt = np.matmul(A.astype(np.float32), B.astype(np.float32))
        self.emit(f"flow.matmul({x.name}, {y.name}, transpose_a={ta}, transpose_b={tb})", r, x.dtype, False,
                  x.scale * y.scale * max(k, 1), alt)

    def op_transpose(self):
        x = self.pick(lambda v: len(v.value.shape) >= 1)
        if x is None:
            return
        perm = self.draw(st.permutations(range(x.value.ndim)))
        self.emit(f"flow.transpose({x.name}, perm={list(perm)!r})", np.transpose(x.value, perm), x.dtype,
                  x.exact, x.scale)

    def op_reshape(self):
        d = self.draw
        x = self.pick()
        if x is None:
            return
        n = x.value.size
        shape = []
        rest = n
        for _ in range(d(st.integers(0, 3))):
            divs = [q for q in range(1, 7) if rest % q == 0] if rest else [0, 1, 2]
            q = d(st.sampled_from(divs))
            shape.append(q)
            rest = rest // q if q else 0
        if rest != 1 or not shape:
            shape.append(rest)
        if int(np.prod(shape)) != n:
            return
        if n and d(st.booleans()):
            shape[d(st.integers(0, len(shape) - 1))] = -1
        self.emit(f"flow.reshape({x.name}, {shape!r})", x.value.reshape(shape), x.dtype, x.exact, x.scale)

    def op_concat(self):
        d = self.draw
        x = self.pick(lambda v: len(v.value.shape) >= 1)
        if x is None:
            return
        ax = d(st.integers(0, x.value.ndim - 1))
        parts = [x]
        for _ in range(d(st.integers(1, 2))):
            s = list(x.value.shape)
            s[ax] = d(st.integers(0 if not self.train else 1, 3))
            parts.append(self.fresh(tuple(s), x.dtype))
        parts = d(st.permutations(parts))
        if "concat_negzero" in self.skip and any(_has_negzero(q.value) for q in parts):
            return
        r = np.concatenate([p.value for p in parts], axis=ax)
        self.emit(f"flow.concat([{', '.join(p.name for p in parts)}], axis={ax})", r, x.dtype,
                  all(p.exact for p in parts), max(p.scale for p in parts))

    def op_slice(self):
        d = self.draw
        x = self.pick(lambda v: len(v.value.shape) >= 1)
        if x is None:
            return
        tup, idx = [], []
        for n in x.value.shape:
            step = d(st.sampled_from([1, 1, 2, -1])) if not self.train else d(st.sampled_from([1, 2]))
            start = d(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            stop = d(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            tup.append([start, stop, step])
            idx.append(slice(start, stop, step))
        r = x.value[tuple(idx)]
        if self.train and 0 in r.shape:
            return
        self.emit(f"flow.slice_v2({x.name}, {tup!r})", r, x.dtype, x.exact, x.scale)

    def op_pad(self):
        d = self.draw
        x = self.pick(lambda v: len(v.value.shape) >= 1)
        if x is None:
            return
        pads = [(d(st.integers(0, 2)), d(st.integers(0, 2))) for _ in x.value.shape]
        mode = d(st.sampled_from(["constant", "constant", "reflect", "replicate"]))
        a = x.value
        if mode == "reflect" and any(lo >= n or hi >= n for (lo, hi), n in zip(pads, a.shape)):
            mode = "constant"
        if mode == "replicate" and 0 in a.shape:
            mode = "constant"
        if mode != "constant" and "concat_negzero" in self.skip and _has_negzero(a):
            return
        if mode == "constant":
            if x.dtype in INTS:
                i = np.iinfo(x.dtype)
                c = d(st.sampled_from([0, 1, -1 if i.min < 0 else 2, int(i.max), int(i.min)]
                                      + ([2 ** 53 + 1, -(2 ** 62) - 1] if x.dtype == "int64" else [])))
            elif x.dtype == "bool":
                c = d(st.sampled_from([0, 1]))
            else:
                c = d(_elements("float64", special=not self.train))
            lit = repr(c).replace("nan", "float('nan')").replace("inf", "float('inf')")
            with np.errstate(all="ignore"):
                r = np.pad(a, pads, constant_values=np.array(c).astype(x.dtype))
            self.emit(f"flow.pad({x.name}, {[list(p) for p in pads]!r}, constant_value={lit})", r, x.dtype,
                      x.exact, x.scale)
        else:
            r = np.pad(a, pads, mode="reflect" if mode == "reflect" else "edge")
            self.emit(f"flow.pad({x.name}, {[list(p) for p in pads]!r}, mode={mode!r})", r, x.dtype, x.exact,
                      x.scale)

    def op_tile(self):
        d = self.draw
        x = self.pick(lambda v: len(v.value.shape) >= 1)
        if x is None:
            return
        mult = [d(st.integers(1, 3)) for _ in x.value.shape]
        self.emit(f"flow.tile({x.name}, {mult!r})", np.tile(x.value, mult), x.dtype, x.exact, x.scale)

    def op_broadcast(self):
        d = self.draw
        x = self.pick()
        if x is None:
            return
        shape = [d(st.integers(1, 3))] * d(st.integers(0, 1)) + [
            d(st.integers(1, 3)) if s == 1 else s for s in x.value.shape]
        self.emit(f"flow.broadcast_to({x.name}, {shape!r})", np.broadcast_to(x.value, shape), x.dtype, x.exact,
                  x.scale)

    def op_reverse(self):
        d = self.draw
        x = self.pick(lambda v: len(v.value.shape) >= 1)
        if x is None:
            return
        ax = d(st.integers(0, x.value.ndim - 1))
        self.emit(f"flow.reverse({x.name}, axis={ax})", np.flip(x.value, ax), x.dtype, x.exact, x.scale)

    def op_where(self):
        x = self.pick()
        if x is None:
            return
        c = self._bcast_partner(x, dtypes=("bool",))
        y = self._bcast_partner(x)
        r = np.where(c.value, x.value, y.value)
        self.emit(f"flow.where({c.name}, {x.name}, {y.name})", r, x.dtype, x.exact and y.exact,
                  max(x.scale, y.scale))

    def op_gather(self):
        d = self.draw
        x = self.pick(lambda v: len(v.value.shape) >= 1 and 0 not in v.value.shape)
        if x is None:
            return
        ax = d(st.integers(0, x.value.ndim - 1))
        n = x.value.shape[ax]
        ishape = _shape(d, rank=d(st.integers(0, 2)), allow_empty=not self.train, max_extent=4)
        idt = d(st.sampled_from(["int32", "int64"]))
        cnt = int(np.prod(ishape, dtype=np.int64))
        vals = d(st.lists(st.integers(0, n - 1), min_size=cnt, max_size=cnt))
        name = f"x{self.nin}"
        self.nin += 1
        ind = np.array(vals, dtype=idt).reshape(ishape)
        self.p.inputs.append((name, ind))
        r = np.take(x.value, ind, axis=ax)
        self.emit(f"flow.gather({x.name}, {name}, axis={ax})", r, x.dtype, x.exact, x.scale)

    def op_sort(self):
        d = self.draw
        kind = d(st.sampled_from(["sort", "argsort", "top_k"]))
        x = self.pick(lambda v: len(v.value.shape) >= 1, dtypes=NUMERIC)
        if x is None:
            return
        ax = d(st.integers(-x.value.ndim, x.value.ndim - 1))
        if kind == "top_k":
            k = d(st.integers(0, x.value.shape[ax] + 1))
            r = _ref_sort(x.value, ax, True, "indices")
            r = np.take(r, range(min(k, r.shape[ax])), axis=ax)
            self.emit(f"flow.math.top_k({x.name}, axis={ax}, k={k})", r, "int32", True, 1.0)
            return
        desc = d(st.booleans())
        direction = "DESCENDING" if desc else "ASCENDING"
        r = _ref_sort(x.value, ax, desc, "values" if kind == "sort" else "indices")
        self.emit(f"flow.{kind}({x.name}, axis={ax}, direction={direction!r})", r,
                  x.dtype if kind == "sort" else "int32", x.exact or kind != "sort", x.scale)

    def op_softmax(self):
        d = self.draw
        name = d(st.sampled_from(["softmax", "log_softmax"]))
        x = self.pick(lambda v: len(v.value.shape) >= 1 and 0 not in v.value.shape,
                      dtypes=("float64",) if self.train else FLOATS)
        if x is None:
            return
        rs = []
        with np.errstate(all="ignore"):
            for a in (self.fl(x), x.value.astype(np.float32)):
                m = np.max(a, axis=-1, keepdims=True)
                e = np.exp(a - m)
                s = e.sum(axis=-1, keepdims=True)
                rs.append(e / s if name == "softmax" else a - m - np.log(s))
        self.emit(f"flow.nn.{name}({x.name})", rs[0], x.dtype, False, x.scale, rs[1])

    def op_attention(self):
        """flow.nn.scaled_dot_product_attention (the attention family) over a
        picked q with finite, moderate values (scores stay far from overflow),
        fresh k and v, maybe causal, maybe a bool mask."""
        d = self.draw
        dts = ("float64",) if self.train else FLOATS
        def moderate(v):
            return bool(np.isfinite(v.value).all()) and _absmax(v.value) <= 8
        x = self.pick(lambda v: 2 <= len(v.value.shape) <= 4 and 0 not in v.value.shape and moderate(v),
                      dtypes=dts)
        if x is None:
            return
        if not moderate(x):  # a fresh input drawn with special values: one without
            x = self.fresh(x.value.shape, x.dtype, special=False, lo=-2, hi=2)
        qs = x.value.shape
        lk, dv = d(st.integers(1, 5)), d(st.integers(1, 4))
        k = self.fresh(qs[:-2] + (lk, qs[-1]), x.dtype, special=False, lo=-2, hi=2)
        v = self.fresh(qs[:-2] + (lk, dv), x.dtype, special=False, lo=-2, hi=2)
        causal = d(st.booleans())
        scale = d(st.sampled_from([None, 0.5, 1.0]))
        s_eff = 1.0 / np.sqrt(qs[-1]) if scale is None else scale
        mask = None
        if not self.train and d(st.booleans()):
            mshape = tuple(d(st.sampled_from([1, n])) for n in qs[:-2] + (qs[-2], lk))
            mv = _array(d, mshape, "bool")
            mask = Val(f"x{self.nin}", "bool", mv)
            self.nin += 1
            self.p.inputs.append((mask.name, mv))
        rs = []
        with np.errstate(all="ignore"):
            for dt in (np.float64, np.float32):
                q, kk, vv = (a.value.astype(dt) for a in (x, k, v))
                s = q @ np.swapaxes(kk, -1, -2) * dt(s_eff)
                if causal:
                    s = np.where(np.arange(lk)[None, :] > np.arange(qs[-2])[:, None], -np.inf, s)
                if mask is not None:
                    s = np.where(mask.value, s, -np.inf)
                m = s.max(-1, keepdims=True)
                e = np.exp(s - m)
                rs.append((e / e.sum(-1, keepdims=True)) @ vv)
        extra = (f", attn_mask={mask.name}" if mask is not None else "") + \
            (f", scale={scale}" if scale is not None else "")
        self.emit(f"flow.nn.scaled_dot_product_attention({x.name}, {k.name}, {v.name}, is_causal={causal}"
                  f"{extra})", rs[0], x.dtype, False, 2.0 * max(lk, 1), rs[1])

    def op_conv2d(self):
        d = self.draw
        dts = ("float64",) if self.train else FLOATS
        x = self.pick(lambda v: len(v.value.shape) == 4 and 0 not in v.value.shape[1:], dtypes=dts)
        if x is None:
            return
        n, c, h, w = x.value.shape
        groups = d(st.sampled_from([g for g in (1, 2, 3) if c % g == 0]))
        co = groups * d(st.integers(1, 2))
        kh, kw = d(st.integers(1, 3)), d(st.integers(1, 3))
        strides = [d(st.integers(1, 2)), d(st.integers(1, 2))]
        dil = [d(st.integers(1, 2)), d(st.integers(1, 2))]
        mode = d(st.sampled_from(["VALID", "SAME", "explicit"]))
        if mode == "SAME":
            pads = [_same_pads(h, dil[0] * (kh - 1) + 1, strides[0]), _same_pads(w, dil[1] * (kw - 1) + 1,
                                                                                   strides[1])]
            pad_src = "'SAME'"
        elif mode == "VALID":
            pads, pad_src = [(0, 0), (0, 0)], "'VALID'"
        else:
            pads = [(d(st.integers(0, 2)), d(st.integers(0, 2))) for _ in range(2)]
            pad_src = repr([[0, 0], [0, 0]] + [list(p) for p in pads])
        if h + sum(pads[0]) < dil[0] * (kh - 1) + 1 or w + sum(pads[1]) < dil[1] * (kw - 1) + 1:
            return
        f = self.fresh((co, c // groups, kh, kw), x.dtype)
        with np.errstate(all="ignore"):
            r = _ref_conv(x.value, f.value, strides, pads, dil, groups)
            alt = _ref_conv(x.value, f.value, strides, pads, dil, groups, np.float32)
        self.emit(f"flow.nn.conv2d({x.name}, {f.name}, strides={strides}, padding={pad_src}, data_format='NCHW', "
                  f"dilations={dil}, groups={groups})", r, x.dtype, False, x.scale * f.scale * c * kh * kw, alt)

    def op_pool(self):
        d = self.draw
        dts = ("float64",) if self.train else FLOATS
        x = self.pick(lambda v: len(v.value.shape) == 4 and 0 not in v.value.shape[2:], dtypes=dts)
        if x is None:
            return
        kind = d(st.sampled_from(["max", "avg"]))
        n, c, h, w = x.value.shape
        k = [d(st.integers(1, 3)), d(st.integers(1, 3))]
        s = [d(st.integers(1, 3)), d(st.integers(1, 3))]
        mode = d(st.sampled_from(["VALID", "SAME", "explicit"]))
        if mode == "SAME":
            pads = [_same_pads(h, k[0], s[0]), _same_pads(w, k[1], s[1])]
            pad_src = "'SAME'"
        elif mode == "VALID":
            pads, pad_src = [(0, 0), (0, 0)], "'VALID'"
        else:
            pads = [(d(st.integers(0, 3)), d(st.integers(0, 3))) for _ in range(2)]
            pad_src = repr([[0, 0], [0, 0]] + [list(p) for p in pads])
        if h + sum(pads[0]) < k[0] or w + sum(pads[1]) < k[1]:
            return
        expr = (f"flow.nn.{kind}_pool2d({x.name}, ksize={k}, strides={s}, padding={pad_src}, "
                f"data_format='NCHW')")
        for i, size in enumerate((h, w)):
            lo, hi = pads[i]
            last = (size + lo + hi - k[i]) // s[i] * s[i]
            if lo >= k[i] or last - lo >= size:
                self.refuse(expr, f"padding {pads[i]} leaves a window of ksize {k[i]} with no input element")
        with np.errstate(all="ignore"):
            r = _ref_pool(x.value, kind, k, s, pads)
            alt = _ref_pool(x.value.astype(np.float32), kind, k, s, pads, np.float32)
        # (not exact: which zero max(+0.0, -0.0) returns is not specified, as for reduce_max)
        self.emit(expr, r, x.dtype, False, x.scale, alt)

    # -------------------------------------------------------------- the program
    def program(self):
        d = self.draw
        p = self.p
        p.fusion = d(st.booleans())
        if d(st.integers(0, 5)) == 5:   # (shrinks toward one device)
            p.devices, p.view = 2, d(st.sampled_from(["consistent", "mirrored"]))
        if self.train:
            p.opt = _draw_opt(d)
            shape = _shape(d, rank=d(st.integers(1, 4)), allow_empty=False, max_extent=3)
            p.var_init = _array(d, shape, "float64", special=False, lo=-2, hi=2)
            if p.devices > 1 and p.view == "consistent":   # (a split that does not divide: kept whole)
                p.var_split = d(st.one_of(st.none(), st.integers(0, len(shape) - 1)))
            self.vals.append(Val("w", "float64", p.var_init, True, _absmax(p.var_init)))
        nops = d(st.integers(1, 4))
        ops = TRAIN_OPS if self.train else PREDICT_OPS
        try:
            for _ in range(nops):
                name = d(st.sampled_from(ops))
                p.ops.append(name)
                getattr(self, "op_" + name)()
        except Refused:
            p.outputs = []
            return None if self.train else p
        made = [v for v in self.vals if v.name.startswith("v")]
        if self.train:
            made = [v for v in made if v.dtype == "float64" and "w" in _deps(p, v.name)]
            if not made:
                return None
            out = made[-1]
            p.outputs = [out]
            if out.value.size <= 1024:
                p.weights = _array(d, out.value.shape, "float64", special=False, lo=-1, hi=1)
            else:   # Hypothesis draws lists of at most a few thousand elements
                rng = np.random.default_rng(d(st.integers(0, 2 ** 32 - 1)))
                p.weights = rng.uniform(-1, 1, out.value.shape)
            p.inputs.append(("lw", p.weights))
            p.grad = _fd_grad(p)
            if p.grad is None:
                return None
            return p
        if not made:
            return None
        p.outputs = made[-2:] if len(made) > 1 and d(st.booleans()) else made[-1:]
        return p


def _has_negzero(a):
    return a.dtype.kind == "f" and bool(((a == 0) & np.signbit(a)).any())


def _relu(t):
    t = np.asarray(t)
    if t.dtype.kind == "f":
        return np.where(np.isnan(t), t, np.where(t > 0, t, 0.0))
    return np.maximum(t, 0).astype(t.dtype)


def _erfc(t):
    v = np.vectorize(math.erfc, otypes=[np.float64])
    return v(t) if np.asarray(t).size else np.asarray(t, np.float64)


UNARY_FLOAT["erf"] = _erf
UNARY_FLOAT["erfc"] = _erfc


def _broadcasts(v, x):
    try:
        np.broadcast_shapes(v.value.shape, x.value.shape)
        return True
    except ValueError:
        return False


def _deps(p, name):
    """The names a value (transitively) reads, from the job's source lines."""
    import re
    defs = {ln.split(" = ", 1)[0]: ln.split(" = ", 1)[1] for ln in p.lines}
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        for ref in re.findall(r"\b([vx]\d+|w)\b", defs.get(n, "")):
            if ref not in seen:
                seen.add(ref)
                todo.append(ref)
    return seen


# ---------------------------------------------------------------- train: reference gradient

def _eval_source(p, w):
    """The reference value of the train program's output with variable w: the
    job's source lines run against numpy stand-ins of the flow API (float64)."""
    env = dict(_NP_FLOW.__dict__)
    env.update({n: a for n, a in p.inputs})
    env["w"] = w
    for ln in p.lines:
        exec(ln, env)  # noqa: S102 - our own generated lines
    out = env[p.outputs[0].name]
    return float(np.sum(out * p.weights))


def _fd_grad(p):
    """Central differences of loss(w); NaN where w sits on a kink (relu, abs,
    max at a tie): there the one-sided differences disagree by a jump that
    stays as the step shrinks, where on a smooth function it shrinks with it."""
    w0 = p.var_init.astype(np.float64)
    g = np.zeros_like(w0)
    try:
        with np.errstate(all="ignore"):
            base = _eval_source(p, w0)
            noise = 1e-8 * max(1.0, abs(base))   # rounding of the loss over a step of 1e-6..1e-7
            if not np.isfinite(base) or noise > 1e-6:
                return None   # a loss too large for differences to resolve the gradient
            for i in np.ndindex(*w0.shape):
                sides = []
                for h in (1e-6 * max(1.0, abs(w0[i])), 1.25e-7 * max(1.0, abs(w0[i]))):
                    wp, wm = w0.copy(), w0.copy()
                    wp[i] += h
                    wm[i] -= h
                    fp, fm = _eval_source(p, wp), _eval_source(p, wm)
                    sides.append(((fp - base) / h, (base - fm) / h, (fp - fm) / (2 * h)))
                (f1, b1, c1), (f2, b2, c2) = sides
                if not all(np.isfinite(t) for t in (f1, b1, f2, b2)):
                    return None
                d1, d2 = abs(f1 - b1), abs(f2 - b2)
                kink = d1 > 10 * noise + 1e-9 and d2 > 0.5 * d1
                # a kink within a step of w: the two central differences disagree by
                # more than a tenth of what check_program tolerates (rtol 1e-4, atol 1e-6;
                # a small slope, as of a loss weighted by 1e-5, is no excuse), beyond rounding
                near = abs(c1 - c2) > 1e-5 * abs(c1) + 1e-7 + 10 * noise / 1.25e-7 * 1e-6
                g[i] = np.nan if kink or near else c1
    except _NotModelled:
        return None
    return g


class _NotModelled(Exception):
    pass


class _NP_FLOW:
    """numpy stand-ins for the flow calls train programs use (float64, no rounding)."""


def _np_flow_namespace():
    import types
    ns = _NP_FLOW

    def pool(kind):
        def f(x, ksize, strides, padding, data_format):
            h, w = x.shape[2:]
            if padding == "SAME":
                pads = [_same_pads(h, ksize[0], strides[0]), _same_pads(w, ksize[1], strides[1])]
            elif padding == "VALID":
                pads = [(0, 0), (0, 0)]
            else:
                pads = [tuple(q) for q in padding[2:]]
            return _ref_pool(x, kind, ksize, strides, pads)
        return f

    def conv2d(x, f, strides, padding, data_format, dilations, groups):
        h, w = x.shape[2:]
        kh, kw = f.shape[2:]
        if padding == "SAME":
            pads = [_same_pads(h, dilations[0] * (kh - 1) + 1, strides[0]),
                    _same_pads(w, dilations[1] * (kw - 1) + 1, strides[1])]
        elif padding == "VALID":
            pads = [(0, 0), (0, 0)]
        else:
            pads = [tuple(q) for q in padding[2:]]
        return _ref_conv(x, f, strides, pads, dilations, groups)

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def log_softmax(x):
        m = x.max(axis=-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))

    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
        s = q @ np.swapaxes(k, -1, -2) * (1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
        if is_causal:
            s = np.where(np.arange(k.shape[-2])[None, :] > np.arange(q.shape[-2])[:, None], -np.inf, s)
        if attn_mask is not None:
            s = np.where(attn_mask, s, -np.inf)
        return softmax(s) @ v

    def red(fn):
        def f(x, axis=None, keepdims=False):
            ax = tuple(range(x.ndim)) if axis is None else tuple(axis)
            out = fn(x, axis=ax, keepdims=keepdims)
            return np.reshape(out, (1,)) if not keepdims and len(ax) == x.ndim and x.ndim else out
        return f

    def pad(x, pads, constant_value=0, mode="constant"):
        if mode == "constant":
            return np.pad(x, pads, constant_values=constant_value)
        return np.pad(x, pads, mode="reflect" if mode == "reflect" else "edge")

    def matmul(a, b, transpose_a=False, transpose_b=False):
        return np.matmul(np.swapaxes(a, -1, -2) if transpose_a else a, np.swapaxes(b, -1, -2) if transpose_b else b)

    def slice_v2(x, tup):
        return x[tuple(slice(*t) for t in tup)]

    math_ns = types.SimpleNamespace(
        add=np.add, subtract=np.subtract, multiply=np.multiply, divide=np.divide, maximum=np.maximum,
        minimum=np.minimum, tanh=np.tanh, sigmoid=lambda x: 1 / (1 + np.exp(-x)), sin=np.sin, cos=np.cos,
        exp=np.exp, square=np.square, negative=np.negative, abs=np.abs, erf=_erf,
        reduce_sum=red(np.sum), reduce_mean=red(np.mean), reduce_max=red(np.max))
    nn_ns = types.SimpleNamespace(relu=_relu, conv2d=conv2d, max_pool2d=pool("max"), avg_pool2d=pool("avg"),
                                  softmax=softmax, log_softmax=log_softmax,
                                  scaled_dot_product_attention=attention)
    flow_ns = types.SimpleNamespace(
        math=math_ns, nn=nn_ns, matmul=matmul, transpose=lambda x, perm: np.transpose(x, perm),
        reshape=lambda x, s: np.reshape(x, s), concat=lambda xs, axis: np.concatenate(xs, axis),
        slice_v2=slice_v2, pad=pad, tile=np.tile, broadcast_to=np.broadcast_to,
        where=np.where, gather=lambda x, i, axis: np.take(x, i, axis=axis))
    ns.flow = flow_ns
    ns.float = float


_np_flow_namespace()


# ---------------------------------------------------------------- running flowjit in a worker

class Worker:
    """A child process that imports flowjit and runs job sources; restarted
    after a crash or a hang."""

    def __init__(self, timeout=CASE_TIMEOUT, cpu=None):
        self.timeout = timeout
        self.cpu = cpu
        self.proc = None

    def _start(self):
        """A fresh worker, once it imported flowjit and said so. A worker that
        cannot start (flowjit does not import: a rebuild in progress) is no
        finding of a program: a few tries, then an error of the fuzzer."""
        env = dict(os.environ, FLOWJIT_DISABLE_CACHE="1", PYTHONFAULTHANDLER="1")
        if self.cpu:
            env["FLOWJIT_CPU"] = self.cpu   # read once per process: the ISA of the whole run
        for attempt in range(4):
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errfile(),
                                         env=env)
            if self._read(120) == ("ready",):
                return
            err = self._stderr(2000) if self.proc.poll() is not None else ""
            self.close()
            time.sleep(5 * (attempt + 1))
        raise RuntimeError(f"the fuzzer's worker cannot start (import flowjit):\n{err}")

    def _errfile(self):
        """A fresh file for the worker's stderr (its warnings and prints: a pipe
        nobody reads while the worker runs would fill and block it, a false hang)."""
        import tempfile
        if getattr(self, "errf", None) is not None:
            self.errf.close()
        self.errf = tempfile.TemporaryFile()
        return self.errf

    def _stderr(self, n):
        """The last n characters the worker wrote to stderr."""
        f = self.errf
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4 * n))
        return f.read().decode(errors="replace")[-n:]

    def _waited(self):
        """Per thread of the worker: the nanoseconds it was runnable but waited
        for a CPU (/proc/PID/task/TID/schedstat; empty where there is none)."""
        out = {}
        try:
            tids = os.listdir(f"/proc/{self.proc.pid}/task")
        except OSError:
            return out
        for tid in tids:
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as f:
                    out[tid] = int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                pass
        return out

    def _read(self, timeout):
        """One message from the worker, or None (it died), or "timeout": it said
        nothing for `timeout` seconds, not counting the time its busiest-waiting
        thread waited for a CPU (a worker at nice 19 on shared cores is starved,
        not hung), or for 20 * timeout seconds of wall time."""
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        t0, w0 = time.monotonic(), self._waited()
        while not sel.select(0.25):
            wall = time.monotonic() - t0
            if wall < timeout:
                continue
            w = self._waited()
            starved = max((w[t] - w0.get(t, 0) for t in w), default=0) / 1e9
            if wall - starved >= timeout or wall >= 20 * timeout:
                return "timeout"
        head = self.proc.stdout.read(8)
        if len(head) < 8:
            return None
        (n,) = struct.unpack("<Q", head)
        return pickle.loads(self.proc.stdout.read(n))

    def close(self):
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(5)
            except Exception:
                pass
            self.proc = None

    def run(self, req):
        """('ok', outputs, grads, var) | ('error', type, message) | ('crash', detail) | ('hang', detail)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        data = pickle.dumps(req)
        try:
            self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._dead()
        res = self._read(self.timeout)
        if res == "timeout":
            self.close()
            return ("hang", f"no answer within {self.timeout:.0f} s")
        return self._dead() if res is None else res

    def _dead(self):
        rc = self.proc.wait(10)
        err = self._stderr(3000)
        self.proc = None
        return ("crash", f"exit status {rc}\n{err}")


def _worker_main():
    import flowjit as flow
    import flowjit.typing as tp
    from typing import Tuple as _Tuple
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr   # prints of the job must not reach the pipe
    data = pickle.dumps(("ready",))
    out.write(struct.pack("<Q", len(data)) + data)
    out.flush()
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return
        (n,) = struct.unpack("<Q", head)
        req = pickle.loads(inp.read(n))
        os.environ["FLOWJIT_DISABLE_FUSION"] = "" if req["fusion"] else "1"
        try:
            flow.clear_default_session()
            flow.config.cpu_device_num(req.get("devices", 1))
            grads = []
            ns = {"flow": flow, "tp": tp, "Tuple": _Tuple, "np": np, "_grads": grads}
            exec(req["source"], ns)  # noqa: S102 - the fuzzer's own generated job
            job = ns["job"]
            if req["train"]:
                flow.load_variables({"w": req["var_init"]})
            got = job(*req["args"])
            var = None
            if req["train"]:
                flow.sync_default_session()
                var = np.asarray(flow.get_all_variables()["w"])
            res = ("ok", [[np.asarray(a) for a in g] if isinstance(g, list) else np.asarray(g) for g in got],
                   [np.asarray(g) for g in grads], var)
        except Exception as e:  # noqa: BLE001 - reported to the parent as the case's result
            res = ("error", type(e).__name__, f"{e}\n{traceback.format_exc()[-2000:]}")
        data = pickle.dumps(res)
        out.write(struct.pack("<Q", len(data)) + data)
        out.flush()


# ---------------------------------------------------------------- comparing

def _compare(v: Val, got: np.ndarray) -> Optional[str]:
    if v.fragile:
        return _report(v, got, np.zeros(got.shape, bool))
    if v.alt is not None and got.shape == v.alt.shape and got.dtype == v.alt.dtype:
        bad = _bad(v, v.value, got) & _bad(v, v.alt, got)
    else:
        bad = None
    return _report(v, got, bad)


def _bad(v, want, got):
    gn, wn = np.isnan(got), np.isnan(want)
    if v.exact:
        return ~((got == want) & (np.signbit(got) == np.signbit(want)) | (gn & wn))
    dt = v.tol or want.dtype.name
    big = float(np.finfo(want.dtype).max) / 2
    with np.errstate(all="ignore"):
        close = np.abs(got.astype(np.float64) - want) <= ATOL[dt] * v.scale + RTOL[dt] * np.abs(want)
        same_inf = (got == want) | (np.isinf(want) & (np.sign(got) == np.sign(want)) & (np.abs(got) >= big)) \
            | (np.isinf(got) & (np.sign(got) == np.sign(want)) & (np.abs(want) >= big))
    ok = (close & ~wn & ~gn) | same_inf | (gn & wn)
    if v.scale >= float(np.finfo(want.dtype).max) / 16:
        # Computed from magnitudes near overflow: whether a product overflows
        # before a sum (inf - inf = NaN) depends on FMA contraction and order.
        ok |= ~np.isfinite(got) & ~np.isfinite(want)
    return ~ok


def _report(v, got, bad):
    want = v.value
    if got.shape != want.shape:
        return f"{v.name}: shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"{v.name}: dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind != "f":
        bad = (got != want) if bad is None else bad
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            return f"{v.name}: at {i} got {got[i].item()!r}, expected {want[i].item()!r} ({int(bad.sum())} of {want.size} differ)"
        return None
    if bad is None:
        bad = _bad(v, want, got)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        return (f"{v.name}: at {i} got {got[i].item()!r}, expected {want[i].item()!r} ({int(bad.sum())} of {want.size} differ; "
                f"{'exact' if v.exact else 'tolerance'} comparison)")
    return None


def check_program(p: Program, worker: Worker) -> Optional[str]:
    """None when flowjit agrees with the reference, else what differs."""
    n = p.copies()
    args = [[a] * n if p.listy() else a for _, a in p.inputs]
    req = {"source": p.job_source(), "args": args, "fusion": p.fusion, "train": p.train,
           "var_init": p.var_init, "devices": p.devices}
    res = worker.run(req)
    kind = res[0]
    if kind in ("crash", "hang"):
        return f"{kind}: {res[1]}"
    if p.refused is not None:
        if kind == "error" and res[1] in USER_ERRORS:
            return None
        return (f"expected a user error ({p.lines[-1].split('#', 1)[-1].strip()}), got "
                + ("a result" if kind == "ok" else f"{res[1]}: {res[2].splitlines()[0] if res[2] else ''}"))
    if kind == "error":
        return f"raised {res[1]}: {res[2]}"
    outs, grads, var = res[1], res[2], res[3]
    if len(outs) != len(p.outputs):
        return f"{len(outs)} outputs, expected {len(p.outputs)}"
    where = f" ({p.devices} devices, {'mirrored' if p.mirrored() else 'consistent'} view)" \
        if p.devices > 1 else ""
    for v, g in zip(p.outputs, outs):
        parts = g if isinstance(g, list) else [g]
        if len(parts) != n:
            return f"{v.name}: {len(parts)} arrays, expected {n} (one per device){where}"
        for j, part in enumerate(parts):
            msg = _compare(v, part)
            if msg:
                return msg + (f" on device {j}" if n > 1 else "") + where
    if p.train:
        if len(grads) != 1:
            return f"watch_diff called {len(grads)} times, expected once{where}"
        g = grads[0]
        if p.mirrored():   # watch_diff joins the devices' gradients along axis 0 (as a tp.Numpy result)
            if g.ndim < 1 or g.shape[0] != n * p.grad.shape[0]:
                return f"gradient shape {g.shape}, expected {n} of {p.grad.shape} joined along axis 0{where}"
            g = np.split(g, n)[0]
        if g.shape != p.grad.shape:
            return f"gradient shape {g.shape}, expected {p.grad.shape}{where}"
        tol = 1e-6 * max(1.0, float(np.nanmax(np.abs(p.grad), initial=0)))
        ok = np.isnan(p.grad) | np.isclose(g, p.grad, rtol=1e-4, atol=tol)
        if not ok.all():
            i = tuple(int(j) for j in np.argwhere(~ok)[0])
            return f"gradient of w at {i}: got {g[i]!r}, expected {p.grad[i]!r} (central differences){where}"
        with np.errstate(all="ignore"):
            want_var = _ref_update(p.opt, p.var_init, g)
        scale = _var_scale(p.var_init, want_var)
        if var is None or var.shape != want_var.shape or not np.allclose(var, want_var, rtol=VAR_RTOL,
                                                                         atol=VAR_RTOL * scale):
            p.got_grad = g
            opt = p.opt.source().replace(".minimize(loss)", "") if p.opt else "SGD(lr=1, momentum=0)"
            return (f"after one update of {opt}, w = {var!r}, expected {want_var!r} (from the gradient "
                    f"{g!r}){where}")
    return None


# ---------------------------------------------------------------- the Hypothesis driver

@st.composite
def programs(draw, train_share=4, skip_known=True):
    train = draw(st.integers(0, train_share)) == 0 if train_share else False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # numpy's "mean of empty slice" and the like
        p = Gen(draw, train, skip_known).program()
    if p is None:
        from hypothesis import reject
        reject()
    return p


class Fuzzer:
    def __init__(self, timeout=CASE_TIMEOUT, skip_known=True, on_finding=None, cpu=None):
        self.skip_known = skip_known
        self.worker = Worker(timeout, cpu)
        self.cases = 0
        self.findings = []   # (message, reproducer)
        self.on_finding = on_finding
        # A hang costs `timeout` per shrink step: bound the shrinking
        # (a private knob of Hypothesis; without it, up to 300 s).
        from hypothesis.internal.conjecture import engine
        engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS

    def run(self, seed, max_examples, deadline_s=None, derandomize=False, stop_on_first=False):
        """Runs Hypothesis searches until max_examples cases or deadline_s seconds;
        each search ends at its first (shrunk) finding, then the next starts."""
        t0 = time.monotonic()
        last = {}

        def prop(p):
            if last.get("broken"):
                return
            if deadline_s is not None and time.monotonic() - t0 > deadline_s and not last.get("shrinking"):
                raise _TimeUp()   # a BaseException: Hypothesis lets it through at once
            self.cases += 1
            try:
                msg = check_program(p, self.worker)
            except RuntimeError as e:   # the worker cannot start: stop, no finding to shrink
                last["broken"] = str(e)
                return
            if msg is not None:
                last["shrinking"] = True
                last["msg"], last["p"] = msg, p
                raise AssertionError(msg)

        rounds = 0
        while True:
            rounds += 1
            last.clear()
            test = settings(max_examples=max_examples, deadline=None, derandomize=derandomize,
                            database=None, print_blob=False, report_multiple_bugs=False,
                            suppress_health_check=list(HealthCheck),
                            phases=[Phase.generate, Phase.shrink])(given(programs(skip_known=self.skip_known))(prop))
            if not derandomize:
                test = _seeded(test, seed + rounds)
            try:
                test()
            except _TimeUp:
                return
            except AssertionError:
                p = last["p"]
                self.findings.append((last["msg"], p.reproducer(last["msg"].splitlines()[0])))
                if self.on_finding:
                    self.on_finding(len(self.findings), *self.findings[-1])
                if stop_on_first:
                    return
            except Exception as e:  # noqa: BLE001 - a bug of the fuzzer itself
                from hypothesis.errors import FlakyFailure
                if isinstance(e, FlakyFailure) and last.get("p") is not None:
                    # The case failed, then passed when Hypothesis ran it again: a result
                    # that depends on what ran before it in the worker, or on timing.
                    msg = f"flaky (passed when run again): {last['msg']}"
                    self.findings.append((msg, last["p"].reproducer(msg.splitlines()[0])))
                else:
                    self.findings.append((f"fuzzer error: {type(e).__name__}: {e}", traceback.format_exc()))
                if self.on_finding:
                    self.on_finding(len(self.findings), *self.findings[-1])
                if stop_on_first or not isinstance(e, FlakyFailure):
                    return
            else:
                if last.get("broken"):
                    self.findings.append((f"fuzzer error: {last['broken']}", ""))
                    return
                if deadline_s is None or derandomize:
                    return
            if deadline_s is None or time.monotonic() - t0 > deadline_s:
                return

    def close(self):
        self.worker.close()


class _TimeUp(BaseException):
    pass


def _seeded(test, seed):
    from hypothesis import seed as hseed
    return hseed(seed)(test)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-examples", type=int, default=100000)
    ap.add_argument("--cpu", default=None,
                    help="FLOWJIT_CPU of the worker, e.g. x86-64-v2 (SSE4.2, no FMA) or x86-64-v3 (AVX2+FMA)")
    ap.add_argument("--include-known", action="store_true",
                    help="also draw the constructs of open known findings (KNOWN)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        _worker_main()
        return 0
    def show(i, msg, repro):
        print(f"\n==== finding {i}: {msg.splitlines()[0]}\n{msg}\n\n{repro}", flush=True)
    fz = Fuzzer(skip_known=not a.include_known, on_finding=show, cpu=a.cpu)
    t0 = time.monotonic()
    try:
        fz.run(a.seed, a.max_examples, deadline_s=a.seconds)
    finally:
        fz.close()
    print(f"\nprograms fuzzer: {fz.cases} cases in {time.monotonic() - t0:.0f} s (seed {a.seed}, "
          f"cpu {a.cpu or 'host'}), "
          f"{len(fz.findings)} findings" + "".join(f"\n  {i}. {m.splitlines()[0]}"
                                                   for i, (m, _) in enumerate(fz.findings, 1)))
    return 1 if fz.findings else 0


if __name__ == "__main__":
    sys.exit(main())
