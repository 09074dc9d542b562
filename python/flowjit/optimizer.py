"""Optimizers, learning-rate schedules and warmup (OneFlow's flow.optimizer).

A schedule is computed inside the job from its train-step variable, so the
learning rate changes every step without recompiling anything.
"""
import math
import numbers

from . import _dtypes, _ops, _trace
from ._blob import Blob

__all__ = ["SGD", "Adam", "AdamW", "RMSProp", "LAMB", "LARS", "PiecewiseConstantScheduler",
           "PiecewiseScalingScheduler", "CosineScheduler", "LinearCosineScheduler",
           "PolynomialScheduler", "PolynomialSchduler", "ExponentialScheduler",
           "InverseTimeScheduler", "NaturalExpScheduler", "warmup", "grad_clipping"]


# ---------------------------------------------------------------- warmup

class _Warmup:
    def __init__(self, kind, steps, multiplier):
        if not isinstance(steps, numbers.Integral) or steps < 0:
            raise ValueError(f"warmup.{kind}: steps must be a non-negative int, got {steps!r}")
        self.kind, self.steps, self.multiplier = kind, int(steps), float(multiplier)

    def apply(self, lr, step):
        """lr (float64 blob) adjusted during the first `steps` steps."""
        if self.steps == 0:
            return lr
        if self.kind == "linear":
            frac = _ops.divide(step, float(self.steps))
            mult = _ops.add(_ops.multiply(frac, 1.0 - self.multiplier), self.multiplier)
        else:
            mult = _ops.constant(self.multiplier, _dtypes.float64)
        return _ops.where(_ops.less(step, float(self.steps)), _ops.multiply(lr, mult), lr)


class warmup:  # noqa: N801 - OneFlow's module-like name
    """``warmup.linear(steps, start_multiplier)`` ramps the rate from
    start_multiplier * lr to lr; ``warmup.constant(steps, multiplier)`` scales
    it by multiplier for the first steps."""

    @staticmethod
    def linear(steps, start_multiplier):
        return _Warmup("linear", steps, start_multiplier)

    @staticmethod
    def constant(steps, multiplier):
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
            lr = self.warmup.apply(lr, step)
        return lr

    def _rate(self, step):
        raise NotImplementedError


def _c(v):
    return _ops.constant(float(v), _dtypes.float64)


class PiecewiseConstantScheduler(_Scheduler):
    """values[i] while boundaries[i-1] <= step < boundaries[i]."""

    def __init__(self, boundaries, values, warmup=None):
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
            lr = _ops.where(_ops.greater_equal(step, float(b)), _c(v), lr)
        return lr


class PiecewiseScalingScheduler(_Scheduler):
    """base_lr, then base_lr * scale[i] from boundaries[i] on (a single float
    scale means scale ** (i + 1))."""

    def __init__(self, base_lr, boundaries, scale, warmup=None):
        super().__init__(warmup)
        boundaries = list(boundaries)
        if isinstance(scale, numbers.Real):
            scale = [float(scale) ** (i + 1) for i in range(len(boundaries))]
        scale = list(scale)
        if len(scale) != len(boundaries):
            raise ValueError("PiecewiseScalingScheduler: one scale per boundary is needed, got "
                             f"{len(boundaries)} boundaries and {len(scale)} scales")
        self.base_lr, self.boundaries, self.scale = float(base_lr), boundaries, [float(s) for s in scale]

    def _rate(self, step):
        lr = _c(self.base_lr)
        for b, s in zip(self.boundaries, self.scale):
            lr = _ops.where(_ops.greater_equal(step, float(b)), _c(self.base_lr * s), lr)
        return lr


class CosineScheduler(_Scheduler):
    """base_lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, steps) / steps)) + alpha)."""

    def __init__(self, base_lr, steps, alpha=0.0, warmup=None):
        super().__init__(warmup)
        self.base_lr, self.steps, self.alpha = float(base_lr), _positive("CosineScheduler: steps", steps), float(alpha)

    def _rate(self, step):
        t = _ops.minimum(step, float(self.steps))
        cosv = _ops.multiply(_ops.add(_ops.cos(_ops.multiply(t, math.pi / self.steps)), 1.0), 0.5)
        return _ops.multiply(_ops.add(_ops.multiply(cosv, 1.0 - self.alpha), self.alpha), self.base_lr)


class LinearCosineScheduler(_Scheduler):
    """base_lr * ((alpha + linear) * cosine + beta), TensorFlow's linear cosine decay."""

    def __init__(self, base_lr, steps, num_periods=0.5, alpha=0.0, beta=0.001, warmup=None):
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
    """(base_lr - end) * (1 - step / steps) ** power + end; with cycle, steps
    grows to the next multiple of itself past step."""

    def __init__(self, base_lr, steps, end_learning_rate=0.0001, power=1.0, cycle=False, warmup=None):
        super().__init__(warmup)
        self.base_lr, self.steps = float(base_lr), _positive("PolynomialScheduler: steps", steps)
        self.end, self.power, self.cycle = float(end_learning_rate), float(power), bool(cycle)

    def _rate(self, step):
        if self.cycle:
            periods = _ops.maximum(_ops.ceil(_ops.divide(step, float(self.steps))), 1.0)
            span = _ops.multiply(periods, float(self.steps))
            frac = _ops.divide(step, span)
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
        self.lr = float(lr)

    def _rate(self, step):
        return _c(self.lr)


# ---------------------------------------------------------------- clipping

class _ByGlobalNorm:
    def __init__(self, clip_norm):
        self.clip_norm = float(_positive("grad_clipping.by_global_norm: clip_norm", clip_norm))


class grad_clipping:  # noqa: N801
    """``grad_clipping.by_global_norm(c)``: scale all gradients by
    c / max(global_norm, c)."""

    @staticmethod
    def by_global_norm(clip_norm):
        return _ByGlobalNorm(clip_norm)


# ---------------------------------------------------------------- optimizers

class Optimizer:
    kind = "?"

    def __init__(self, lr_scheduler, loss_scale_factor=None, grad_clipping=None):
        if isinstance(lr_scheduler, numbers.Real) and not isinstance(lr_scheduler, bool):
            lr_scheduler = _Constant(lr_scheduler)
        if not isinstance(lr_scheduler, _Scheduler):
            raise TypeError(f"{type(self).__name__}: lr_scheduler must be a flow.optimizer scheduler "
                            f"(e.g. PiecewiseConstantScheduler([], [0.1])) or a number, got {lr_scheduler!r}")
        if grad_clipping is not None and not isinstance(grad_clipping, _ByGlobalNorm):
            raise TypeError(f"{type(self).__name__}: grad_clipping must come from "
                            "flow.optimizer.grad_clipping.by_global_norm(c)")
        self.lr_scheduler = lr_scheduler
        self.loss_scale_factor = 1.0 if loss_scale_factor is None else float(loss_scale_factor)
        self.grad_clipping = grad_clipping

    def minimize(self, loss):
        """Trains the job's trainable variables to reduce `loss` (a blob or a
        list of blobs). A non-scalar loss trains like its mean (OneFlow)."""
        b = _trace.require_builder(f"{type(self).__name__}.minimize")
        losses = list(loss) if isinstance(loss, (list, tuple)) else [loss]
        for l in losses:
            if not isinstance(l, Blob):
                _trace.fail(TypeError, f"{type(self).__name__}.minimize: the loss must be a Blob, got "
                            f"{type(l).__name__}")
            b.check_owned(l, "minimize", _trace.user_location())
        if b.type != "train":
            _trace.fail(TypeError, f"{type(self).__name__}.minimize: job '{b.job_name}' is declared "
                        "type=\"predict\"; optimizers belong in type=\"train\" jobs")
        if b.minimize is not None:
            _trace.fail(ValueError, f"{type(self).__name__}.minimize: job '{b.job_name}' already "
                        "called minimize; pass a list of losses to one minimize call instead")
        step = b.train_step()
        lr = _ops.cast(self.lr_scheduler.learning_rate(_ops.cast(step, _dtypes.float64)), _dtypes.float32)
        b.minimize = (self, losses, lr, step)

    def _config(self):
        c = {"kind": self.kind, "loss_scale_factor": self.loss_scale_factor}
        if self.grad_clipping is not None:
            c["clip_norm"] = self.grad_clipping.clip_norm
        c.update(self._extra())
        return c

    def _extra(self):
        return {}

    def _variables_filter(self):
        return None


class SGD(Optimizer):
    """w += v, v = momentum * v - lr * g (momentum=0: w -= lr * g)."""

    kind = "SGD"

    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum=0.9, grad_clipping=None,
                 train_step_lbn=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping)
        if not 0 <= momentum < 1:
            raise ValueError(f"SGD: momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)

    def _extra(self):
        return {"momentum": self.momentum}


class Adam(Optimizer):
    kind = "Adam"

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8, do_bias_correction=False,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping)
        for n, v in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= v < 1:
                raise ValueError(f"{type(self).__name__}: {n} must be in [0, 1), got {v}")
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.do_bias_correction = bool(do_bias_correction)

    def _extra(self):
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                "do_bias_correction": self.do_bias_correction}


class AdamW(Adam):
    """Adam with decoupled weight decay: w -= lr * (update + weight_decay * w)."""

    kind = "AdamW"

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8, do_bias_correction=False,
                 loss_scale_factor=None, weight_decay=None, weight_decay_includes=None,
                 weight_decay_excludes=None, grad_clipping=None, train_step_lbn=None):
        super().__init__(lr_scheduler, beta1, beta2, epsilon, do_bias_correction, loss_scale_factor,
                         grad_clipping)
        if weight_decay_includes is not None and weight_decay_excludes is not None:
            raise ValueError("AdamW: give weight_decay_includes or weight_decay_excludes, not both")
        self.weight_decay = float(weight_decay or 0.0)
        self.includes = _names(weight_decay_includes)
        self.excludes = _names(weight_decay_excludes)

    def _extra(self):
        d = super()._extra()
        d.update(weight_decay=self.weight_decay, weight_decay_includes=self.includes,
                 weight_decay_excludes=self.excludes)
        return d


def _names(v):
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    return [str(x) for x in v]


class RMSProp(Optimizer):
    """ms = decay * ms + (1 - decay) * g^2; w -= lr * g / sqrt(ms + eps)
    (centered: ms - mg^2 under the root)."""

    kind = "RMSProp"

    def __init__(self, lr_scheduler, decay_rate=0.99, epsilon=1e-8, centered=False,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping)
        self.decay_rate, self.epsilon, self.centered = float(decay_rate), float(epsilon), bool(centered)

    def _extra(self):
        return {"decay_rate": self.decay_rate, "epsilon": self.epsilon, "centered": self.centered}


class LAMB(Optimizer):
    """Adam's bias-corrected direction scaled per variable by ||w|| / ||direction||."""

    kind = "LAMB"

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-6, loss_scale_factor=None,
                 grad_clipping=None, train_step_lbn=None, weight_decay=None,
                 weight_decay_includes=None, weight_decay_excludes=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.weight_decay = float(weight_decay or 0.0)
        self.includes, self.excludes = _names(weight_decay_includes), _names(weight_decay_excludes)

    def _extra(self):
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                "weight_decay": self.weight_decay, "weight_decay_includes": self.includes,
                "weight_decay_excludes": self.excludes}


class LARS(Optimizer):
    """Momentum SGD with a layer-wise rate lr * coeff * ||w|| / (||g|| + wd ||w|| + eps)."""

    kind = "LARS"

    def __init__(self, lr_scheduler, momentum_beta=0.9, epsilon=1e-9, lars_coefficient=0.0001,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None, weight_decay=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping)
        self.momentum, self.epsilon = float(momentum_beta), float(epsilon)
        self.lars_coefficient = float(lars_coefficient)
        self.weight_decay = float(weight_decay or 0.0)

    def _extra(self):
        return {"momentum": self.momentum, "epsilon": self.epsilon,
                "lars_coefficient": self.lars_coefficient, "weight_decay": self.weight_decay}
