"""flow.losses: OneFlow 0.1-0.2's way of naming a train job's loss::

    func_config.train.primary_lr(0.1)
    func_config.train.model_update_conf({"naive_conf": {}})

    @flow.global_function(func_config)
    def train_job(...):
        loss = ...
        flow.losses.add_loss(loss)
        return loss

The losses added are minimized with the rule of ``function_config().train``
(the same optimizer a newer job would call ``minimize`` on).
"""
from ._core import trace as _trace
from ._core.blob import Blob

__all__ = ["add_loss"]


def add_loss(loss):
    """Marks `loss` (a Blob, or a list of them) to be minimized by the job's
    function_config().train settings.

    Example:
        >>> config = flow.FunctionConfig()
        >>> config.train.primary_lr(0.25)
        >>> config.train.model_update_conf({"naive_conf": {}})
        >>> @flow.global_function(config)   # OneFlow 0.2's style of train job
        ... def train(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(1,), initializer=flow.constant_initializer(3.0))
        ...     loss = flow.math.reduce_sum(w * w * x)
        ...     flow.losses.add_loss(loss)
        ...     return loss
        >>> [train(np.float32([1])).tolist() for _ in range(3)]   # w -= 0.25 * 2w
        [[9.0], [2.25], [0.5625]]
    """
    b = _trace.require_builder("flow.losses.add_loss")
    loc = _trace.user_location()
    items = list(loss) if isinstance(loss, (list, tuple)) else [loss]
    for l in items:
        if not isinstance(l, Blob):
            _trace.fail(TypeError, f"losses.add_loss: the loss must be a Blob, got {type(l).__name__}", loc)
        b.check_owned(l, "losses.add_loss", loc)
    if b.type != "train":
        _trace.fail(TypeError, f"losses.add_loss: job '{b.job_name}' is a predict job; a loss is trained "
                    "in a job whose function_config sets train.primary_lr and train.model_update_conf "
                    "(or one declared type=\"train\")", loc)
    if b.minimize is not None:
        _trace.fail(ValueError, f"losses.add_loss: job '{b.job_name}' already calls an optimizer's "
                    "minimize(loss); use one of the two forms in a job", loc)
    b.added_losses.extend(items)
