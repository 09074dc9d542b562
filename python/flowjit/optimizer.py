"""Optimizers, learning-rate schedules and warmup (OneFlow's flow.optimizer).

A schedule is computed inside the job from its train-step variable, so the
learning rate changes every step without recompiling anything. The formulas
follow OneFlow's LearningRateScheduleKernel (oneflow/core/kernel/
learning_rate_schedule_kernel.cpp): during warmup the rate is derived from the
scheduler's base rate, and no decay applies; afterwards the decayed rate at the
(unshifted) train step.

The docstrings' examples assume ``import numpy as np``, ``import flowjit as flow``
and ``import flowjit.typing as tp``; each starts from a fresh session.
"""
import math
import numbers
import re
from typing import Callable, List, Optional, Sequence, Union

from . import _C
from ._core import dtypes as _dtypes, log as _log, trace as _trace
from ._ops import builders as _ops
from ._core.blob import Blob

__all__ = ["SGD", "SGDW", "Adam", "AdamW", "LazyAdam", "RMSProp", "LAMB", "LARS", "CombinedOptimizer",
           "CustomScheduler", "loss_scale", "PiecewiseConstantScheduler",
           "PiecewiseScalingScheduler", "CosineScheduler", "LinearCosineScheduler",
           "PolynomialScheduler", "PolynomialSchduler", "ExponentialScheduler",
           "InverseTimeScheduler", "NaturalExpScheduler", "warmup", "grad_clipping"]


# ---------------------------------------------------------------- warmup

class _Warmup:
    def __init__(self, kind, steps, multiplier):
        if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"warmup.{kind}: steps must be a non-negative int, got {steps!r}")
        if not isinstance(multiplier, numbers.Real) or isinstance(multiplier, bool):
            raise TypeError(f"warmup.{kind}: the multiplier must be a number, got {multiplier!r}")
        # OneFlow's kernel checks: constant 0 < multiplier < 1, linear 0 <= start < 1.
        if kind == "constant" and not 0 < multiplier < 1:
            raise ValueError(f"warmup.constant: multiplier must be in (0, 1), got {multiplier!r}")
        if kind == "linear" and not 0 <= multiplier < 1:
            raise ValueError(f"warmup.linear: start_multiplier must be in [0, 1), got {multiplier!r}")
        self.kind, self.steps, self.multiplier = kind, int(steps), float(multiplier)

    def apply(self, base_lr, lr, step):
        """During the first `steps` steps, base_lr * multiplier (linear: the
        multiplier ramps from start_multiplier towards 1); lr (the decayed
        rate, a float64 blob) afterwards."""
        if self.steps == 0:
            return lr
        if self.kind == "linear":
            frac = _ops.divide(step, float(self.steps))
            mult = _ops.add(_ops.multiply(frac, 1.0 - self.multiplier), self.multiplier)
            warm = _ops.multiply(mult, base_lr)
        else:
            warm = _c(base_lr * self.multiplier)
        return _ops.where(_ops.less(step, float(self.steps)), warm, lr)


class warmup:  # noqa: N801 - OneFlow's module-like name
    """``warmup.linear(steps, start_multiplier)``: for step < steps the rate is
    base_lr * (start_multiplier + (1 - start_multiplier) * step / steps);
    ``warmup.constant(steps, multiplier)``: base_lr * multiplier for step <
    steps. The scheduler's decay applies from step `steps` on (OneFlow)."""

    @staticmethod
    def linear(steps: int, start_multiplier: float) -> _Warmup:
        return _Warmup("linear", steps, start_multiplier)

    @staticmethod
    def constant(steps: int, multiplier: float) -> _Warmup:
        return _Warmup("constant", steps, multiplier)


# ---------------------------------------------------------------- schedules

def _check_warmup(w):
    if w is not None and not isinstance(w, _Warmup):
        raise TypeError(f"warmup must come from flow.optimizer.warmup.linear/constant, got {w!r}")
    return w


def _positive(name, v):
    if not isinstance(v, numbers.Real) or v <= 0:
        raise ValueError(f"{name} must be a positive number, got {v!r}")
    return v


class _Scheduler:
    """Builds the learning rate as a float64 scalar blob from the step."""

    def __init__(self, warmup=None):
        self.warmup = _check_warmup(warmup)

    def learning_rate(self, step):
        """The rate at `step` (a float64 scalar blob)."""
        lr = self._rate(step)
        if self.warmup is not None:
            lr = self.warmup.apply(self._base_lr(), lr, step)
        return lr

    def _rate(self, step):
        raise NotImplementedError

    def _base_lr(self):
        """The rate warmup scales (OneFlow's base_learning_rate)."""
        return self.base_lr


def _c(v):
    return _ops.constant(float(v), _dtypes.float64)


class PiecewiseConstantScheduler(_Scheduler):
    """values[0] while step <= boundaries[0], values[i] while
    boundaries[i-1] < step <= boundaries[i], values[-1] after the last
    boundary (OneFlow's kernel, as TensorFlow's piecewise_constant)."""

    def __init__(self, boundaries: Sequence[int], values: Sequence[float],
                 warmup: Optional[_Warmup] = None) -> None:
        super().__init__(warmup)
        boundaries, values = list(boundaries), list(values)
        if len(values) != len(boundaries) + 1:
            raise ValueError("PiecewiseConstantScheduler: values needs one entry more than boundaries, "
                             f"got {len(boundaries)} boundaries and {len(values)} values")
        if sorted(boundaries) != boundaries:
            raise ValueError(f"PiecewiseConstantScheduler: boundaries must be increasing, got {boundaries}")
        self.boundaries, self.values = boundaries, [float(v) for v in values]

    def _rate(self, step):
        lr = _c(self.values[0])
        for b, v in zip(self.boundaries, self.values[1:]):
            lr = _ops.where(_ops.greater(step, float(b)), _c(v), lr)
        return lr

    def _base_lr(self):
        return self.values[0]


class PiecewiseScalingScheduler(_Scheduler):
    """base_lr while step <= boundaries[0], then base_lr * scale[i] while
    boundaries[i] < step <= boundaries[i+1]; a single number `scale` means
    that scale for every boundary (OneFlow: [scale] * len(boundaries))."""

    def __init__(self, base_lr: float, boundaries: Sequence[int], scale: Union[float, Sequence[float]],
                 warmup: Optional[_Warmup] = None) -> None:
        super().__init__(warmup)
        boundaries = list(boundaries)
        if isinstance(scale, numbers.Real):
            scale = [float(scale)] * len(boundaries)
        scale = list(scale)
        if len(scale) != len(boundaries):
            raise ValueError("PiecewiseScalingScheduler: one scale per boundary is needed, got "
                             f"{len(boundaries)} boundaries and {len(scale)} scales")
        self.base_lr, self.boundaries, self.scale = float(base_lr), boundaries, [float(s) for s in scale]

    def _rate(self, step):
        lr = _c(self.base_lr)
        for b, s in zip(self.boundaries, self.scale):
            lr = _ops.where(_ops.greater(step, float(b)), _c(self.base_lr * s), lr)
        return lr


class CosineScheduler(_Scheduler):
    """base_lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, steps) / steps)) + alpha)."""

    def __init__(self, base_lr: float, steps: int, alpha: float = 0.0,
                 warmup: Optional[_Warmup] = None) -> None:
        super().__init__(warmup)
        self.base_lr, self.steps, self.alpha = float(base_lr), _positive("CosineScheduler: steps", steps), float(alpha)

    def _rate(self, step):
        t = _ops.minimum(step, float(self.steps))
        cosv = _ops.multiply(_ops.add(_ops.cos(_ops.multiply(t, math.pi / self.steps)), 1.0), 0.5)
        return _ops.multiply(_ops.add(_ops.multiply(cosv, 1.0 - self.alpha), self.alpha), self.base_lr)


class LinearCosineScheduler(_Scheduler):
    """base_lr * ((alpha + linear) * cosine + beta), TensorFlow's linear cosine decay."""

    def __init__(self, base_lr: float, steps: int, num_periods: float = 0.5, alpha: float = 0.0,
                 beta: float = 0.001, warmup: Optional[_Warmup] = None) -> None:
        super().__init__(warmup)
        self.base_lr, self.steps = float(base_lr), _positive("LinearCosineScheduler: steps", steps)
        self.num_periods, self.alpha, self.beta = float(num_periods), float(alpha), float(beta)

    def _rate(self, step):
        t = _ops.minimum(step, float(self.steps))
        linear = _ops.divide(_ops.subtract(float(self.steps), t), float(self.steps))
        cosv = _ops.multiply(_ops.add(_ops.cos(_ops.multiply(t, 2 * math.pi * self.num_periods / self.steps)),
                                      1.0), 0.5)
        decayed = _ops.add(_ops.multiply(_ops.add(linear, self.alpha), cosv), self.beta)
        return _ops.multiply(decayed, self.base_lr)


class PolynomialScheduler(_Scheduler):
    """(base_lr - end) * (1 - min(step, steps) / steps) ** power + end; with
    cycle, steps grows to steps * ceil(step / steps) and step 0 counts as
    step 1 (OneFlow's kernel)."""

    def __init__(self, base_lr: float, steps: int, end_learning_rate: float = 0.0001, power: float = 1.0,
                 cycle: bool = False, warmup: Optional[_Warmup] = None) -> None:
        super().__init__(warmup)
        self.base_lr, self.steps = float(base_lr), _positive("PolynomialScheduler: steps", steps)
        self.end, self.power, self.cycle = float(end_learning_rate), float(power), bool(cycle)

    def _rate(self, step):
        if self.cycle:
            cur = _ops.maximum(step, 1.0)  # OneFlow: cur_batch = 1 at step 0
            span = _ops.multiply(_ops.ceil(_ops.divide(cur, float(self.steps))), float(self.steps))
            frac = _ops.divide(cur, span)
        else:
            frac = _ops.divide(_ops.minimum(step, float(self.steps)), float(self.steps))
        base = _ops.subtract(1.0, frac)
        poly = _ops.pow(base, _c(self.power)) if self.power != 1.0 else base
        return _ops.add(_ops.multiply(poly, self.base_lr - self.end), self.end)


PolynomialSchduler = PolynomialScheduler  # OneFlow's spelling


class _DecayScheduler(_Scheduler):
    def __init__(self, base_lr, steps, decay_rate, staircase=False, warmup=None):
        super().__init__(warmup)
        self.base_lr, self.steps = float(base_lr), _positive(f"{type(self).__name__}: steps", steps)
        self.decay_rate, self.staircase = float(decay_rate), bool(staircase)

    def _progress(self, step):
        p = _ops.divide(step, float(self.steps))
        return _ops.floor(p) if self.staircase else p


class ExponentialScheduler(_DecayScheduler):
    """base_lr * decay_rate ** (step / steps) (floored with staircase)."""

    def _rate(self, step):
        return _ops.multiply(_ops.pow(_c(self.decay_rate), self._progress(step)), self.base_lr)


class InverseTimeScheduler(_DecayScheduler):
    """base_lr / (1 + decay_rate * step / steps) (floored with staircase)."""

    def _rate(self, step):
        return _ops.divide(self.base_lr, _ops.add(_ops.multiply(self._progress(step), self.decay_rate), 1.0))


class NaturalExpScheduler(_DecayScheduler):
    """base_lr * exp(-decay_rate * step / steps) (floored with staircase)."""

    def _rate(self, step):
        return _ops.multiply(_ops.exp(_ops.multiply(self._progress(step), -self.decay_rate)), self.base_lr)


class _Constant(_Scheduler):
    def __init__(self, lr):
        super().__init__(None)
        self.lr = self.base_lr = float(lr)

    def _rate(self, step):
        return _c(self.lr)


class CustomScheduler(_Scheduler):
    """The learning rate is a blob the job computes (OneFlow's CustomScheduler).

    OneFlow names that blob by its logical blob name ("op/out"); flowjit
    takes the Blob itself: a one-element float blob of the job that calls
    minimize."""

    def __init__(self, lbn: Union[Blob, str]) -> None:
        super().__init__(None)
        if isinstance(lbn, str):
            raise NotImplementedError(
                f"CustomScheduler({lbn!r}): flowjit cannot find a blob by its logical blob name; pass "
                "the Blob itself, e.g. CustomScheduler(lr_blob)")
        if not isinstance(lbn, Blob):
            raise TypeError(f"CustomScheduler: expected the learning-rate Blob, got {type(lbn).__name__}")
        if lbn._node.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"CustomScheduler: the learning rate must be a float blob, got {lbn.dtype}")
        if math.prod(lbn.shape) != 1:
            raise ValueError(f"CustomScheduler: the learning rate must hold one element, got shape "
                             f"{tuple(lbn.shape)}")
        self.blob = lbn

    def learning_rate(self, step):
        """The rate at `step`: the blob's value (warmup does not apply)."""
        return _ops.cast(_ops.reshape(self.blob, ()), _dtypes.float64)

    def _base_lr(self):
        raise NotImplementedError("CustomScheduler has no base rate")


# ---------------------------------------------------------------- clipping

class _ByGlobalNorm:
    def __init__(self, clip_norm):
        self.clip_norm = float(_positive("grad_clipping.by_global_norm: clip_norm", clip_norm))


class grad_clipping:  # noqa: N801
    """``grad_clipping.by_global_norm(c)``: scale all gradients by
    c / max(global_norm, c)."""

    @staticmethod
    def by_global_norm(clip_norm: float) -> _ByGlobalNorm:
        return _ByGlobalNorm(clip_norm)


# ---------------------------------------------------------------- optimizers

# Ops through which no gradient flows (ops.def: grad = Zero); a gradient also
# stops where jit/autodiff.cpp's gradient_flows_into says so (bools always,
# integers outside the ops that add, multiply, select or move values).
_NO_GRADIENT_OPS = frozenset(getattr(_C.OpKind, n) for n in (
    "parameter", "variable", "fill", "iota", "random_uniform", "random_normal", "truncated_normal",
    "sign", "floor", "ceil", "round", "logical_not", "equal", "not_equal", "less", "less_equal",
    "greater", "greater_equal", "logical_and", "logical_or", "argmax", "argmin", "one_hot"))
_FLOAT_DTYPES = frozenset(d.c for d in _dtypes.FLOATS)


def _variables_with_gradient(losses):
    """Names of the variables a gradient of the losses reaches.

    OneFlow updates only the variables that get a gradient ("diff") from the
    losses: a trainable variable the loss does not depend on keeps its value
    (no weight decay, no momentum carried over from another job) and gets no
    optimizer state. The walk deduplicates shared nodes (Node.same), bucketed
    by op and type so that it stays cheap.
    """
    names = set()
    seen = {}  # (op, shape, dtype) -> [visited nodes]
    stack = [(l._node, None) for l in losses]  # (node, the op that reads it; None: a loss)
    while stack:
        n, user = stack.pop()
        if n.dtype not in _FLOAT_DTYPES and not (
                _C.gradient_flows_into(_C.OpKind.identity if user is None else user, n.dtype)):
            continue  # (a loss is seeded as through an identity: integer losses take gradients)
        bucket = seen.setdefault((n.op, n.shape, n.dtype), [])
        if any(n.same(m) for m in bucket):
            continue
        bucket.append(n)
        if n.op == _C.OpKind.variable:
            names.add(n.attr("name"))
        elif n.op not in _NO_GRADIENT_OPS:
            stack.extend((i, n.op) for i in n.inputs)
    return names


# ---------------------------------------------------------------- loss scaling

class _LossScalePolicy:
    """A loss scale policy (OneFlow's LossScalePolicy)."""


class _StaticLossScale(_LossScalePolicy):
    def __init__(self, loss_scale_factor):
        if isinstance(loss_scale_factor, bool) or not isinstance(loss_scale_factor, numbers.Real) \
                or not loss_scale_factor > 0:
            raise ValueError("optimizer.loss_scale.static_loss_scale: loss_scale_factor must be a positive "
                             f"number, got {loss_scale_factor!r}")
        self.loss_scale_factor = float(loss_scale_factor)


class _DynamicLossScale(_LossScalePolicy):
    def __init__(self, initial_loss_scale, increment_period, multiplier):
        if isinstance(initial_loss_scale, bool) or not isinstance(initial_loss_scale, numbers.Real) \
                or not initial_loss_scale > 0:
            raise ValueError("optimizer.loss_scale.dynamic_loss_scale: initial_loss_scale must be a positive "
                             f"number, got {initial_loss_scale!r}")
        if isinstance(increment_period, bool) or not isinstance(increment_period, numbers.Integral) \
                or increment_period < 1:
            raise ValueError("optimizer.loss_scale.dynamic_loss_scale: increment_period must be a positive "
                             f"int, got {increment_period!r}")
        if isinstance(multiplier, bool) or not isinstance(multiplier, numbers.Real) or not multiplier > 1:
            raise ValueError("optimizer.loss_scale.dynamic_loss_scale: multiplier must be a number > 1, got "
                             f"{multiplier!r}")
        self.initial_loss_scale = float(initial_loss_scale)
        self.increment_period, self.multiplier = int(increment_period), float(multiplier)

    def variables(self):
        """The job's loss scale (float32) and good-step counter (int64)
        variables, created with the initial scale and 0."""
        from ._core import variables as _variables
        scale = _variables.get_variable(
            LOSS_SCALE_VARIABLE, shape=(1,), dtype=_dtypes.float32, trainable=False,
            initializer=_variables.constant_initializer(self.initial_loss_scale, dtype=_dtypes.float32))
        good = _variables.get_variable(
            GOOD_STEP_COUNTER_VARIABLE, shape=(1,), dtype=_dtypes.int64, trainable=False,
            initializer=_variables.constant_initializer(0, dtype=_dtypes.int64))
        return scale, good


LOSS_SCALE_VARIABLE = "System-Train-LossScale"
GOOD_STEP_COUNTER_VARIABLE = "System-Train-LossScale-GoodStepCounter"


class loss_scale:  # noqa: N801 - OneFlow's module-like name
    """``loss_scale.static_loss_scale(f)``: the loss is multiplied by f and
    the gradients divided by f before the update.

    ``loss_scale.dynamic_loss_scale(initial_loss_scale=2**30,
    increment_period=2000, multiplier=2.0)``: the scale is a float32
    variable (``System-Train-LossScale``); a step whose gradients hold an
    inf or a nan updates nothing (parameters and optimizer state keep their
    values; the train step still counts) and divides the scale by
    `multiplier`, not below 1; after `increment_period` good steps in a row
    the scale is multiplied by `multiplier`, up to the largest float32."""

    @staticmethod
    def static_loss_scale(loss_scale_factor: float) -> _LossScalePolicy:
        """A fixed loss scale."""
        return _StaticLossScale(loss_scale_factor)

    @staticmethod
    def dynamic_loss_scale(initial_loss_scale: float = 2.0 ** 30, increment_period: int = 2000,
                           multiplier: float = 2.0) -> _LossScalePolicy:
        """A loss scale that shrinks on overflow and grows after good steps."""
        return _DynamicLossScale(initial_loss_scale, increment_period, multiplier)


def _sparse_variables(builder):
    """The variables function_config().indexed_slices_optimizer_conf names:
    OneFlow updates them as by sparse gradients, only in the rows a step
    touches (jit/optimizer.h: sparse_variables)."""
    conf = builder.config.get("indexed_slices_optimizer_conf")
    if not conf or not conf.get("enable", True):
        return []
    names = conf.get("include_op_names", {}).get("op_name", [])
    return sorted(n for n in names if n in builder.variables)


VariablesArg = Optional[Union[Sequence[str], Callable[[], Sequence[str]]]]


def _check_variables(owner, variables):
    """None, a callable, or a list of variable names (OneFlow's `variables=`)."""
    if variables is None or callable(variables):
        return variables
    if isinstance(variables, str):
        return [variables]
    try:
        names = list(variables)
    except TypeError:
        raise TypeError(f"{owner}: variables must be a list of variable names or a callable returning "
                        f"one, got {variables!r}") from None
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"{owner}: variables must be variable names (str), got {n!r}")
    return names


def _loss_scale_policy(owner, loss_scale_factor, policy):
    if policy is not None and not isinstance(policy, _LossScalePolicy):
        raise TypeError(f"{owner}: loss_scale_policy must come from flow.optimizer.loss_scale."
                        f"static_loss_scale(...) or dynamic_loss_scale(...), got {policy!r}")
    if loss_scale_factor is not None:
        if policy is not None:
            raise ValueError(f"{owner}: give loss_scale_factor or loss_scale_policy, not both")
        policy = _StaticLossScale(loss_scale_factor)
    return policy


class Optimizer:
    """The base of flow.optimizer's optimizers: `minimize(loss)` trains the
    job's trainable variables (or the `variables=` given) to reduce loss."""

    kind = "?"

    def __init__(self, lr_scheduler: Union[_Scheduler, float], loss_scale_factor: Optional[float] = None,
                 grad_clipping: Optional[_ByGlobalNorm] = None, train_step_lbn: Optional[str] = None,
                 loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        name = type(self).__name__
        if isinstance(lr_scheduler, numbers.Real) and not isinstance(lr_scheduler, bool):
            lr_scheduler = _Constant(lr_scheduler)
        if not isinstance(lr_scheduler, _Scheduler):
            raise TypeError(f"{name}: lr_scheduler must be a flow.optimizer scheduler "
                            f"(e.g. PiecewiseConstantScheduler([], [0.1])) or a number, got {lr_scheduler!r}")
        if grad_clipping is not None and not isinstance(grad_clipping, _ByGlobalNorm):
            raise TypeError(f"{name}: grad_clipping must come from "
                            "flow.optimizer.grad_clipping.by_global_norm(c)")
        if train_step_lbn is not None:
            raise NotImplementedError(f"{name}: train_step_lbn: flowjit counts the train step in its own "
                                      "variable and cannot take it from a blob")
        self.lr_scheduler = lr_scheduler
        self.loss_scale_policy = _loss_scale_policy(name, loss_scale_factor, loss_scale_policy)
        self.grad_clipping = grad_clipping
        self.variables = _check_variables(name, variables)

    @property
    def loss_scale_factor(self) -> float:
        """The static loss scale (1 without one)."""
        p = self.loss_scale_policy
        return p.loss_scale_factor if isinstance(p, _StaticLossScale) else 1.0

    def Variables(self) -> List[str]:  # noqa: N802 - OneFlow's name
        """The names of the variables this optimizer is given (`variables=`;
        all trainable variables of the job being traced by default)."""
        if callable(self.variables):
            return list(self.variables())
        if self.variables is not None:
            return list(self.variables)
        b = _trace.require_builder(f"{type(self).__name__}.Variables")
        return sorted(n for n, (_, trainable) in b.variables.items() if trainable)

    def minimize(self, loss: Union[Blob, Sequence[Blob]]) -> None:
        """Trains the job's trainable variables to reduce `loss` (a blob or a
        list of blobs). A non-scalar loss trains like its mean (OneFlow).

        Example:
            >>> @flow.global_function(type="train")
            ... def train(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
            ...     w = flow.get_variable("w", shape=(1,), initializer=flow.constant_initializer(3.0))
            ...     loss = flow.math.reduce_sum(w * w * x)
            ...     lr = flow.optimizer.PiecewiseConstantScheduler([], [0.25])
            ...     flow.optimizer.SGD(lr, momentum=0.0).minimize(loss)
            ...     return loss
            >>> [train(np.float32([1])).tolist() for _ in range(3)]   # w -= 0.25 * 2w: 3, 1.5, 0.75
            [[9.0], [2.25], [0.5625]]
        """
        b = _trace.require_builder(f"{type(self).__name__}.minimize")
        losses = list(loss) if isinstance(loss, (list, tuple)) else [loss]
        for l in losses:
            if not isinstance(l, Blob):
                _trace.fail(TypeError, f"{type(self).__name__}.minimize: the loss must be a Blob, got "
                            f"{type(l).__name__}")
            b.check_owned(l, "minimize", _trace.user_location())
        if b.type != "train":
            # As OneFlow's minimize (it sets the job's train_conf): the job becomes a
            # train job; what was traced before it saw a predict job, as in OneFlow.
            _log.logger.info("%s.minimize: job '%s' was declared type=\"predict\" and becomes a train job",
                             type(self).__name__, b.job_name)
            b.type = "train"
        if b.minimize is not None:
            _trace.fail(ValueError, f"{type(self).__name__}.minimize: job '{b.job_name}' already "
                        "called minimize; pass a list of losses to one minimize call instead")
        reached = _variables_with_gradient(losses)
        step = b.train_step()
        step64 = _ops.cast(step, _dtypes.float64)
        self._prepare(b, reached, step64)
        self._sparse = _sparse_variables(b)
        self._scale_vars = None
        if isinstance(self.loss_scale_policy, _DynamicLossScale):
            self._scale_vars = self.loss_scale_policy.variables()
        b.minimize = (self, losses, self._lr, step)

    def _prepare(self, builder, reached, step64):
        """Sets the variables this optimizer updates and its rate blob."""
        given = self.variables
        if given is None:
            self._trained = reached
        else:
            names = set(self.Variables())
            unknown = sorted(n for n in names if n not in builder.variables)
            if unknown:
                _trace.fail(ValueError, f"{type(self).__name__}: variables= names {unknown[0]!r}, which job "
                            f"'{builder.job_name}' has not defined (it has "
                            f"{', '.join(sorted(builder.variables)) or 'none'})")
            self._trained = reached & names
        # As in OneFlow, the learning rate is a float32 value.
        self._lr = _ops.cast(self._adjust_lr(self.lr_scheduler.learning_rate(step64), step64),
                             _dtypes.float32)

    def _adjust_lr(self, lr, step):
        """The scheduled rate (float64 blob) as the update formula uses it."""
        return lr

    def _rule(self):
        c = {"kind": self.kind}
        if self.grad_clipping is not None:
            c["clip_norm"] = self.grad_clipping.clip_norm
        c.update(self._extra())
        return c

    def _config(self):
        c = self._rule()
        c["loss_scale_factor"] = self.loss_scale_factor
        self._add_loss_scale(c)
        return c

    def _add_loss_scale(self, c):
        if getattr(self, "_sparse", None):
            c["sparse_variables"] = self._sparse
        if getattr(self, "_scale_vars", None) is not None:
            p = self.loss_scale_policy
            scale, good = self._scale_vars
            c.update(loss_scale=scale._node, good_steps=good._node, increment_period=p.increment_period,
                     multiplier=p.multiplier)

    def _extra(self):
        return {}

    def _variables_filter(self):
        """The variables minimize updates (set in minimize)."""
        return getattr(self, "_trained", None)


def _check_unit(owner, name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < 1:
        raise ValueError(f"{owner}: {name} must be in [0, 1), got {v!r}")
    return float(v)


class SGD(Optimizer):
    """w += v, v = momentum * v - lr * g (momentum=0: w -= lr * g).

    Example:
        >>> @flow.global_function(type="train")
        ... def train() -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(1,), initializer=flow.ones_initializer())
        ...     lr = flow.optimizer.PiecewiseConstantScheduler([], [0.5])
        ...     flow.optimizer.SGD(lr, momentum=0.5).minimize(flow.math.reduce_sum(w))   # g = 1
        ...     return w
        >>> [train().tolist() for _ in range(3)]   # w before each step: v = 0.5 v - 0.5, w += v
        [[1.0], [0.5], [-0.25]]
    """

    kind = "SGD"

    def __init__(self, lr_scheduler: Union[_Scheduler, float], loss_scale_factor: Optional[float] = None,
                 momentum: float = 0.9, grad_clipping: Optional[_ByGlobalNorm] = None,
                 train_step_lbn: Optional[str] = None, loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                         variables)
        self.momentum = _check_unit(type(self).__name__, "momentum", momentum)

    def _extra(self):
        return {"momentum": self.momentum}


class SGDW(SGD):
    """SGD with decoupled weight decay (OneFlow's SGDW):
    w -= lr * (g + weight_decay * w); with momentum v = momentum * v - lr * g,
    w += v - lr * weight_decay * w. weight_decay_includes / _excludes select
    the decayed variables by name (substrings)."""

    kind = "SGD"

    def __init__(self, lr_scheduler: Union[_Scheduler, float], loss_scale_factor: Optional[float] = None,
                 momentum: float = 0.9, weight_decay: Optional[float] = None,
                 weight_decay_includes: Optional[Union[Sequence[str], str]] = None,
                 weight_decay_excludes: Optional[Union[Sequence[str], str]] = None,
                 grad_clipping: Optional[_ByGlobalNorm] = None, train_step_lbn: Optional[str] = None,
                 loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, momentum, grad_clipping, train_step_lbn,
                         loss_scale_policy, variables)
        _set_weight_decay(self, weight_decay, weight_decay_includes, weight_decay_excludes)

    def _extra(self):
        d = super()._extra()
        d.update(_weight_decay_conf(self))
        return d


def _set_weight_decay(opt, weight_decay, includes, excludes):
    owner = type(opt).__name__
    if includes is not None and excludes is not None:
        raise ValueError(f"{owner}: give weight_decay_includes or weight_decay_excludes, not both")
    if weight_decay is not None and (isinstance(weight_decay, bool) or not isinstance(weight_decay, numbers.Real)
                                     or weight_decay < 0):
        raise ValueError(f"{owner}: weight_decay must be a non-negative number, got {weight_decay!r}")
    opt.weight_decay = float(weight_decay or 0.0)
    opt.includes, opt.excludes = _patterns(owner, includes), _patterns(owner, excludes)


def _patterns(owner, v):
    """None, or the regular expressions of weight_decay_includes/_excludes."""
    if v is None:
        return None
    v = [v] if isinstance(v, str) else list(v)
    for p in v:
        if not isinstance(p, str):
            raise TypeError(f"{owner}: weight decay patterns must be str, got {p!r}")
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(f"{owner}: weight decay pattern {p!r} is not a regular expression: {e}") from None
    return v


def _decays(name, includes, excludes):
    """OneFlow's rule: with includes, a variable decays when one of them
    matches part of its name (re.search); else with excludes, when none
    does; else always."""
    if includes is not None:
        return any(re.search(p, name) for p in includes)
    if excludes is not None:
        return not any(re.search(p, name) for p in excludes)
    return True


def _weight_decay_conf(opt):
    names = sorted(getattr(opt, "_trained", None) or ())
    return {"weight_decay": opt.weight_decay,
            "weight_decay_variables": [n for n in names if _decays(n, opt.includes, opt.excludes)]}


class Adam(Optimizer):
    """Adam: m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
    w -= lr * m / (sqrt(v) + epsilon). With do_bias_correction the rate is
    scaled by sqrt(1 - beta2^t) / (1 - beta1^t), as OneFlow does (epsilon is
    not corrected).

    Example:
        >>> @flow.global_function(type="train")
        ... def train() -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(1,), initializer=flow.ones_initializer())
        ...     lr = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
        ...     flow.optimizer.Adam(lr, do_bias_correction=True).minimize(flow.math.reduce_sum(w * 5))
        ...     return w
        >>> [round(train().item(), 3) for _ in range(3)]   # steps of about lr, whatever the gradient's scale
        [1.0, 0.9, 0.8]
    """

    kind = "Adam"

    def __init__(self, lr_scheduler: Union[_Scheduler, float], beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, do_bias_correction: bool = False,
                 loss_scale_factor: Optional[float] = None, grad_clipping: Optional[_ByGlobalNorm] = None,
                 train_step_lbn: Optional[str] = None, loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                         variables)
        owner = type(self).__name__
        self.beta1, self.beta2 = _check_unit(owner, "beta1", beta1), _check_unit(owner, "beta2", beta2)
        self.epsilon = float(epsilon)
        self.do_bias_correction = bool(do_bias_correction)

    def _adjust_lr(self, lr, step):
        # OneFlow's bias correction scales the rate, not m and v:
        # lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) with t = step + 1, and
        # then w -= lr_t * (m / (sqrt(v) + epsilon) [+ weight_decay * w])
        # (AdamBiasCorrectionLearningRate and AdamUpdateFunctor in
        # oneflow/user/kernels/model_update_kernel_util.*). So epsilon is not
        # bias corrected and AdamW's decay term gets lr_t too.
        if not self.do_bias_correction:
            return lr
        t = _ops.add(step, 1.0)
        one_minus_b1 = _ops.subtract(1.0, _ops.pow(_c(self.beta1), t))
        one_minus_b2 = _ops.subtract(1.0, _ops.pow(_c(self.beta2), t))
        return _ops.divide(_ops.multiply(lr, _ops.sqrt(one_minus_b2)), one_minus_b1)

    def _extra(self):
        # The bias correction is folded into the rate above, so the update
        # lowering (jit/optimizer.cpp) runs the uncorrected formula.
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                "do_bias_correction": False}


class LazyAdam(Adam):
    """OneFlow's LazyAdam: Adam with bias correction that, with sparse
    (indexed-slices) gradients, updates only the rows present. flowjit's
    gradients are dense, where LazyAdam computes what Adam with
    do_bias_correction=True computes."""

    def __init__(self, lr_scheduler: Union[_Scheduler, float], beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, loss_scale_factor: Optional[float] = None,
                 grad_clipping: Optional[_ByGlobalNorm] = None, train_step_lbn: Optional[str] = None,
                 loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        super().__init__(lr_scheduler, beta1, beta2, epsilon, True, loss_scale_factor, grad_clipping,
                         train_step_lbn, loss_scale_policy, variables)


class AdamW(Adam):
    """Adam with decoupled weight decay: w -= lr * (update + weight_decay * w)."""

    kind = "AdamW"

    def __init__(self, lr_scheduler: Union[_Scheduler, float], beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, do_bias_correction: bool = False,
                 loss_scale_factor: Optional[float] = None, weight_decay: Optional[float] = None,
                 weight_decay_includes: Optional[Union[Sequence[str], str]] = None,
                 weight_decay_excludes: Optional[Union[Sequence[str], str]] = None,
                 grad_clipping: Optional[_ByGlobalNorm] = None, train_step_lbn: Optional[str] = None,
                 loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        super().__init__(lr_scheduler, beta1, beta2, epsilon, do_bias_correction, loss_scale_factor,
                         grad_clipping, train_step_lbn, loss_scale_policy, variables)
        _set_weight_decay(self, weight_decay, weight_decay_includes, weight_decay_excludes)

    def _extra(self):
        d = super()._extra()
        d.update(_weight_decay_conf(self))
        return d


class RMSProp(Optimizer):
    """ms = decay * ms + (1 - decay) * g^2; w -= lr * g / sqrt(ms + eps)
    (centered: ms - mg^2 under the root)."""

    kind = "RMSProp"

    def __init__(self, lr_scheduler: Union[_Scheduler, float], decay_rate: float = 0.99,
                 epsilon: float = 1e-8, centered: bool = False, loss_scale_factor: Optional[float] = None,
                 grad_clipping: Optional[_ByGlobalNorm] = None, train_step_lbn: Optional[str] = None,
                 loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                         variables)
        self.decay_rate, self.epsilon, self.centered = float(decay_rate), float(epsilon), bool(centered)

    def _extra(self):
        return {"decay_rate": self.decay_rate, "epsilon": self.epsilon, "centered": self.centered}


class LAMB(Optimizer):
    """Adam's bias-corrected direction scaled per variable by ||w|| / ||direction||."""

    kind = "LAMB"

    def __init__(self, lr_scheduler: Union[_Scheduler, float], beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-6, loss_scale_factor: Optional[float] = None,
                 weight_decay: Optional[float] = None,
                 weight_decay_includes: Optional[Union[Sequence[str], str]] = None,
                 weight_decay_excludes: Optional[Union[Sequence[str], str]] = None,
                 grad_clipping: Optional[_ByGlobalNorm] = None, train_step_lbn: Optional[str] = None,
                 loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                         variables)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        _set_weight_decay(self, weight_decay, weight_decay_includes, weight_decay_excludes)

    def _extra(self):
        d = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}
        d.update(_weight_decay_conf(self))
        return d


class LARS(Optimizer):
    """Momentum SGD with a layer-wise rate (OneFlow's LARS kernel):
    local = lr * coeff * ||w|| / (epsilon + ||g|| + wd * ||w||) (lr when a
    norm is 0), v = momentum_beta * v - local * g, w += v - local * wd * w."""

    kind = "LARS"

    def __init__(self, lr_scheduler: Union[_Scheduler, float], momentum_beta: float = 0.9,
                 epsilon: float = 1e-9, lars_coefficient: float = 0.0001,
                 loss_scale_factor: Optional[float] = None, weight_decay: Optional[float] = None,
                 weight_decay_includes: Optional[Union[Sequence[str], str]] = None,
                 weight_decay_excludes: Optional[Union[Sequence[str], str]] = None,
                 grad_clipping: Optional[_ByGlobalNorm] = None, train_step_lbn: Optional[str] = None,
                 loss_scale_policy: Optional[_LossScalePolicy] = None,
                 variables: VariablesArg = None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                         variables)
        self.momentum = _check_unit("LARS", "momentum_beta", momentum_beta)
        self.epsilon = float(epsilon)
        self.lars_coefficient = float(lars_coefficient)
        _set_weight_decay(self, weight_decay, weight_decay_includes, weight_decay_excludes)

    def _extra(self):
        d = {"momentum": self.momentum, "epsilon": self.epsilon, "lars_coefficient": self.lars_coefficient}
        d.update(_weight_decay_conf(self))
        return d


class CombinedOptimizer(Optimizer):
    """Several optimizers in one job, each updating its own `variables=`
    with its own rule, schedule and clipping (OneFlow's CombinedOptimizer).
    The loss scale policy belongs to the combination, not to its parts; no
    variable may be given to two optimizers."""

    kind = "SGD"

    def __init__(self, optimizers: Sequence[Optimizer], loss_scale_factor: Optional[float] = None,
                 train_step_lbn: Optional[str] = None,
                 loss_scale_policy: Optional[_LossScalePolicy] = None) -> None:
        optimizers = list(optimizers)
        if not optimizers:
            raise ValueError("CombinedOptimizer: needs at least one optimizer")
        for o in optimizers:
            if isinstance(o, CombinedOptimizer):
                raise TypeError("CombinedOptimizer: a CombinedOptimizer cannot contain another")
            if not isinstance(o, Optimizer):
                raise TypeError(f"CombinedOptimizer: expected flow.optimizer optimizers, got {o!r}")
            if o.loss_scale_policy is not None:
                raise ValueError(f"CombinedOptimizer: {type(o).__name__} has its own loss scale; give the "
                                 "loss_scale_factor or loss_scale_policy to the CombinedOptimizer instead")
        super().__init__(optimizers[0].lr_scheduler, loss_scale_factor, None, train_step_lbn,
                         loss_scale_policy, None)
        self.optimizers = optimizers

    def Variables(self) -> List[List[str]]:  # noqa: N802 - OneFlow's name
        """Each optimizer's variables."""
        return [o.Variables() for o in self.optimizers]

    def _prepare(self, builder, reached, step64):
        owner = {}
        for o in self.optimizers:
            o._prepare(builder, reached, step64)
            for n in o.Variables():
                if n in owner and owner[n] is not o:
                    _trace.fail(ValueError, f"CombinedOptimizer: variable '{n}' is given to both "
                                f"{type(owner[n]).__name__} and {type(o).__name__}; each variable may "
                                "have one optimizer")
                owner[n] = o
        self._trained = set().union(*(o._trained for o in self.optimizers))
        self._lr = self.optimizers[0]._lr

    def _config(self):
        groups = []
        for o in self.optimizers:
            g = o._rule()
            g.update(variables=sorted(o._trained), lr=o._lr._node)
            groups.append(g)
        c = {"kind": "SGD", "loss_scale_factor": self.loss_scale_factor, "groups": groups}
        self._add_loss_scale(c)
        return c
