"""flow.regularizers: weight penalties for get_variable and the layers'
kernel_regularizer / bias_regularizer.

As in OneFlow, a regularized variable's gradient gets ``l1 * sign(w) + l2 *
w`` added after the loss gradient is averaged over the loss's elements
(OneFlow's l1_l2_regularize_gradient op), i.e. the loss minimized gains the
scalar ``l1 * sum(|w|) + l2 / 2 * sum(w * w)`` per regularized variable.
Only train jobs use regularizers, and only for variables the loss trains.
"""
import numbers

__all__ = ["l1", "l2", "l1_l2", "Regularizer"]


class Regularizer:
    """OneFlow's RegularizerConf with its l1_l2_conf."""

    __slots__ = ("l1", "l2")

    def __init__(self, l1, l2, api):
        for n, v in (("l1", l1), ("l2", l2)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 0:
                raise ValueError(f"regularizers.{api}: {n} must be a non-negative number, got {v!r}")
        self.l1, self.l2 = float(l1), float(l2)

    def __repr__(self):
        return f"flow.regularizers.l1_l2(l1={self.l1!r}, l2={self.l2!r})"

    def __eq__(self, o):
        return isinstance(o, Regularizer) and (o.l1, o.l2) == (self.l1, self.l2)

    def __hash__(self):
        return hash((self.l1, self.l2))

    def penalty(self, ops, w):
        """The scalar this regularizer adds to the loss for variable blob `w`."""
        terms = []
        if self.l1:
            terms.append(ops.multiply(ops.reduce_sum(ops.abs(w)), self.l1))
        if self.l2:
            terms.append(ops.multiply(ops.reduce_sum(ops.square(w)), self.l2 / 2))
        if not terms:
            return None
        return terms[0] if len(terms) == 1 else ops.add(terms[0], terms[1])


def l1_l2(l1=0.01, l2=0.01):
    """Adds l1 * sign(w) + l2 * w to the variable's gradient.

    Example:
        >>> @flow.global_function(type="train")
        ... def train(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(1,), initializer=flow.ones_initializer(),
        ...                           regularizer=flow.regularizers.l1_l2(l1=0.25, l2=0.5))
        ...     lr = flow.optimizer.PiecewiseConstantScheduler([], [1.0])
        ...     flow.optimizer.SGD(lr, momentum=0.0).minimize(flow.math.reduce_sum(w * x))
        ...     return w
        >>> [train(np.float32([0])).tolist() for _ in range(3)]   # the loss adds no gradient; w -= 0.25 sign(w) + 0.5 w
        [[1.0], [0.25], [-0.125]]
    """
    return Regularizer(l1, l2, "l1_l2")


def l1(l=0.01):  # noqa: E741 - OneFlow's parameter name
    """Adds l * sign(w) to the variable's gradient.

    Example:
        >>> @flow.global_function(type="train")
        ... def train(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(1,), initializer=flow.ones_initializer(),
        ...                           regularizer=flow.regularizers.l1(0.25))
        ...     lr = flow.optimizer.PiecewiseConstantScheduler([], [1.0])
        ...     flow.optimizer.SGD(lr, momentum=0.0).minimize(flow.math.reduce_sum(w * x))
        ...     return w
        >>> [train(np.float32([0])).tolist() for _ in range(3)]   # the loss adds no gradient; w -= 0.25 sign(w)
        [[1.0], [0.75], [0.5]]
    """
    return Regularizer(l, 0.0, "l1")


def l2(l=0.01):  # noqa: E741
    """Adds l * w to the variable's gradient.

    Example:
        >>> @flow.global_function(type="train")
        ... def train(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        ...     w = flow.get_variable("w", shape=(1,), initializer=flow.ones_initializer(),
        ...                           regularizer=flow.regularizers.l2(0.5))
        ...     lr = flow.optimizer.PiecewiseConstantScheduler([], [1.0])
        ...     flow.optimizer.SGD(lr, momentum=0.0).minimize(flow.math.reduce_sum(w * x))
        ...     return w
        >>> [train(np.float32([0])).tolist() for _ in range(3)]   # the loss adds no gradient; w -= 0.5 w
        [[1.0], [0.5], [0.25]]
    """
    return Regularizer(0.0, l, "l2")
