"""OneFlow's older training settings, ``function_config().train``, mapped onto flow.optimizer.

    func_config = flow.FunctionConfig()
    func_config.train.primary_lr(0.1)
    func_config.train.model_update_conf({"momentum_conf": {"beta": 0.9}})

    @flow.global_function(func_config)
    def train_job(x=flow.FixedTensorDef((32, 784))):
        ...
        flow.losses.add_loss(loss)
        return loss

The conf is OneFlow's ``NormalModelUpdateOpUserConf`` written as a dict:
exactly one update rule (``naive_conf``, ``momentum_conf``, ``adam_conf``,
``rmsprop_conf``, ``lamb_conf``, ``lars_conf``) and optionally
``learning_rate_decay``, ``warmup_conf``, ``clip_conf`` and
``weight_decay_conf``. It is checked when set and turned into the same
optimizer object a newer job would pass its loss to, so both forms compile to
the same program.
"""
import numbers

from .. import optimizer as _opt

# conf name -> (optimizer class, {OneFlow field: constructor argument}).
_RULES = {
    "naive_conf": (_opt.SGD, {}),
    "momentum_conf": (_opt.SGD, {"beta": "momentum"}),
    "adam_conf": (_opt.Adam, {"beta1": "beta1", "beta2": "beta2", "epsilon": "epsilon",
                              "do_bias_correction": "do_bias_correction"}),
    "rmsprop_conf": (_opt.RMSProp, {"decay_rate": "decay_rate", "epsilon": "epsilon",
                                    "centered": "centered"}),
    "lamb_conf": (_opt.LAMB, {"beta1": "beta1", "beta2": "beta2", "epsilon": "epsilon"}),
    "lars_conf": (_opt.LARS, {"momentum_beta": "momentum_beta", "epsilon": "epsilon",
                              "lars_coefficient": "lars_coefficient"}),
}
# OneFlow rules flowjit has no update for.
_UNSUPPORTED_RULES = {"lazy_adam_conf": "lazy (sparse) Adam updates are not implemented",
                      "ftrl_conf": "FTRL updates are not implemented",
                      "adagrad_conf": "Adagrad updates are not implemented"}

# learning_rate_decay conf -> (scheduler factory(base_lr, **fields), {field: argument}).
_DECAYS = {
    "exponential_conf": (_opt.ExponentialScheduler,
                         {"decay_batches": "steps", "decay_rate": "decay_rate", "staircase": "staircase"}),
    "inverse_time_conf": (_opt.InverseTimeScheduler,
                          {"decay_batches": "steps", "decay_rate": "decay_rate", "staircase": "staircase"}),
    "natural_exp_conf": (_opt.NaturalExpScheduler,
                         {"decay_batches": "steps", "decay_rate": "decay_rate", "staircase": "staircase"}),
    "polynomial_conf": (_opt.PolynomialScheduler,
                        {"decay_batches": "steps", "end_learning_rate": "end_learning_rate",
                         "power": "power", "cycle": "cycle"}),
    "cosine_conf": (_opt.CosineScheduler, {"decay_batches": "steps", "alpha": "alpha"}),
    "linear_cosine_conf": (_opt.LinearCosineScheduler,
                           {"decay_batches": "steps", "num_periods": "num_periods", "alpha": "alpha",
                            "beta": "beta"}),
    "piecewise_scaling_conf": (_opt.PiecewiseScalingScheduler,
                               {"boundaries": "boundaries", "scales": "scale"}),
    "piecewise_constant_conf": (None, {"boundaries": "boundaries", "values": "values"}),
}
_WARMUPS = {"linear_conf": ("linear", "start_multiplier"), "constant_conf": ("constant", "multiplier")}
_TOP = ("learning_rate_decay", "warmup_conf", "clip_conf", "weight_decay_conf")
# Rules whose flowjit optimizer takes a weight decay (the others have none).
_DECAYING = {"adam_conf", "lamb_conf", "lars_conf"}


def _dict(value, what):
    if not isinstance(value, dict):
        raise TypeError(f"function_config.train.model_update_conf: {what} must be a dict, got "
                        f"{type(value).__name__} {value!r}")
    return value


def _fields(conf, allowed, what):
    """{argument: value} of a sub-conf, every field known."""
    out = {}
    for k, v in _dict(conf, what).items():
        if k not in allowed:
            raise ValueError(f"function_config.train.model_update_conf: {what} has no field {k!r}; its "
                             f"fields are {', '.join(sorted(allowed)) or '(none)'}")
        out[allowed[k]] = v
    return out


def _one_of(conf, choices, what):
    conf = _dict(conf, what)
    if len(conf) != 1:
        raise ValueError(f"function_config.train.model_update_conf: {what} must hold exactly one of "
                         f"{', '.join(sorted(choices))}, got {sorted(conf) or 'nothing'}")
    (name, body), = conf.items()
    if name not in choices:
        raise ValueError(f"function_config.train.model_update_conf: unknown {what} {name!r}; flowjit "
                         f"knows {', '.join(sorted(choices))}")
    return name, body


def _patterns(conf, key):
    if key not in conf:
        return None
    v = _dict(conf[key], f"weight_decay_conf.{key}")
    bad = sorted(set(v) - {"pattern"})
    if bad:
        raise ValueError(f"function_config.train.model_update_conf: weight_decay_conf.{key} has no field "
                         f"{bad[0]!r}; its field is 'pattern'")
    p = v.get("pattern", [])
    return [p] if isinstance(p, str) else list(p)


class ModelUpdateConf:
    """A checked model_update_conf: which rule, its fields, the schedule."""

    def __init__(self, conf):
        conf = _dict(conf, "the conf")
        rules = [k for k in conf if k not in _TOP]
        for k in rules:
            if k in _UNSUPPORTED_RULES:
                raise NotImplementedError(f"function_config.train.model_update_conf: {k} is a OneFlow "
                                          f"update rule flowjit does not have ({_UNSUPPORTED_RULES[k]}); "
                                          f"flowjit knows {', '.join(sorted(_RULES))}")
            if k not in _RULES:
                raise ValueError(f"function_config.train.model_update_conf: unknown key {k!r}; expected "
                                 f"one update rule ({', '.join(sorted(_RULES))}) and optionally "
                                 f"{', '.join(_TOP)}")
        if len(rules) != 1:
            raise ValueError("function_config.train.model_update_conf: exactly one update rule is needed "
                             f"({', '.join(sorted(_RULES))}), got {rules or 'none'}")
        self.rule = rules[0]
        cls, allowed = _RULES[self.rule]
        self.args = _fields(conf[self.rule], allowed, self.rule)
        if self.rule == "naive_conf":
            self.args["momentum"] = 0.0
        self.decay = None
        if "learning_rate_decay" in conf:
            name, body = _one_of(conf["learning_rate_decay"], _DECAYS, "learning_rate_decay")
            self.decay = (name, _fields(body, _DECAYS[name][1], f"learning_rate_decay.{name}"))
        self.warmup = None
        if "warmup_conf" in conf:
            name, body = _one_of(conf["warmup_conf"], _WARMUPS, "warmup_conf")
            kind, mult = _WARMUPS[name]
            f = _fields(body, {"warmup_batches": "steps", mult: "multiplier"}, f"warmup_conf.{name}")
            if "steps" not in f:
                raise ValueError(f"function_config.train.model_update_conf: warmup_conf.{name} needs "
                                 "warmup_batches")
            default = 0.0 if kind == "linear" else None
            if f.get("multiplier", default) is None:
                raise ValueError("function_config.train.model_update_conf: warmup_conf.constant_conf "
                                 "needs multiplier")
            self.warmup = getattr(_opt.warmup, kind)(f["steps"], f.get("multiplier", default))
        self.clip = None
        if "clip_conf" in conf:
            name, body = _one_of(conf["clip_conf"], {"clip_by_global_norm"}, "clip_conf")
            f = _fields(body, {"clip_norm": "clip_norm"}, "clip_conf.clip_by_global_norm")
            if "clip_norm" not in f:
                raise ValueError("function_config.train.model_update_conf: clip_conf.clip_by_global_norm "
                                 "needs clip_norm")
            self.clip = _opt.grad_clipping.by_global_norm(f["clip_norm"])
        self.weight_decay = None
        if "weight_decay_conf" in conf:
            wd = _dict(conf["weight_decay_conf"], "weight_decay_conf")
            bad = sorted(set(wd) - {"weight_decay_rate", "includes", "excludes"})
            if bad:
                raise ValueError(f"function_config.train.model_update_conf: weight_decay_conf has no field "
                                 f"{bad[0]!r}; its fields are excludes, includes, weight_decay_rate")
            if self.rule not in _DECAYING:
                raise NotImplementedError(f"function_config.train.model_update_conf: weight_decay_conf "
                                          f"with {self.rule}: flowjit applies weight decay only with "
                                          "adam_conf (as AdamW), lamb_conf and lars_conf")
            self.weight_decay = (float(wd.get("weight_decay_rate", 0.0)), _patterns(wd, "includes"),
                                 _patterns(wd, "excludes"))
        self.optimizer(0.1)  # every value checked now, by the optimizer's own checks

    def scheduler(self, lr):
        warm = self.warmup
        if self.decay is None:
            return _opt.PiecewiseConstantScheduler([], [lr], warmup=warm)
        name, f = self.decay
        if name == "piecewise_constant_conf":
            return _opt.PiecewiseConstantScheduler(f.get("boundaries", []), f.get("values", [lr]),
                                                   warmup=warm)
        factory = _DECAYS[name][0]
        if "steps" in f or name == "piecewise_scaling_conf":
            return factory(lr, **f, warmup=warm)
        raise ValueError(f"function_config.train.model_update_conf: learning_rate_decay.{name} needs "
                         "decay_batches")

    def optimizer(self, lr, loss_scale_factor=None):
        """The flow.optimizer object this conf means, at primary rate `lr`."""
        cls = _RULES[self.rule][0]
        args = dict(self.args)
        if self.weight_decay is not None:
            rate, inc, exc = self.weight_decay
            if self.rule == "adam_conf":
                cls = _opt.AdamW
            args.update(weight_decay=rate, weight_decay_includes=inc, weight_decay_excludes=exc)
        return cls(self.scheduler(lr), loss_scale_factor=loss_scale_factor,
                   grad_clipping=self.clip, **args)

    def __repr__(self):
        return (f"ModelUpdateConf({self.rule}, {self.args!r}, decay={self.decay!r}, "
                f"warmup={self.warmup and (self.warmup.kind, self.warmup.steps, self.warmup.multiplier)!r}, "
                f"clip={self.clip and self.clip.clip_norm!r}, weight_decay={self.weight_decay!r})")


class TrainConfig:
    """``function_config().train``: OneFlow 0.1-0.2's training settings.

    A job whose config sets them is a train job: the losses it passes to
    flow.losses.add_loss are minimized with the conf's rule at primary_lr."""

    __slots__ = ("_lr", "_conf", "_loss_scale")

    def __init__(self):
        self._lr, self._conf, self._loss_scale = None, None, None

    def primary_lr(self, lr):
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or lr < 0:
            raise ValueError(f"function_config.train.primary_lr: expected a non-negative number, got {lr!r}")
        self._lr = float(lr)

    def secondary_lr(self, lr):
        raise NotImplementedError("function_config.train.secondary_lr: a second learning rate (OneFlow's "
                                  "rate for biases) is not supported: flowjit trains every variable of "
                                  "a job at one rate")

    def loss_scale_factor(self, factor):
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or factor <= 0:
            raise ValueError(f"function_config.train.loss_scale_factor: expected a positive number, got "
                             f"{factor!r}")
        self._loss_scale = float(factor)

    def model_update_conf(self, conf):
        self._conf = ModelUpdateConf(conf)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"function_config.train has no setting '{name}'; flowjit's are: primary_lr, "
                             "model_update_conf, loss_scale_factor (secondary_lr raises)")

    def is_set(self):
        return self._lr is not None or self._conf is not None

    def optimizer(self, job):
        """The optimizer of a job using this config; errors name what is missing."""
        if self._conf is None:
            raise ValueError(f"job '{job}': function_config().train needs model_update_conf({{...}}), e.g. "
                             "model_update_conf({'naive_conf': {}}), to say how variables are updated")
        if self._lr is None and (self._conf.decay is None or self._conf.decay[0] != "piecewise_constant_conf"):
            raise ValueError(f"job '{job}': function_config().train needs primary_lr(rate)")
        return self._conf.optimizer(self._lr if self._lr is not None else 0.0, self._loss_scale)

    def __repr__(self):
        return f"train(primary_lr={self._lr!r}, conf={self._conf!r}, loss_scale={self._loss_scale!r})"
