"""Losses of flow.nn with OneFlow's `reduction` ("none", "mean", "sum"),
composed of primitive ops."""
from typing import Optional

from .._core import dtypes as _dtypes, trace as _trace
from . import builders as _ops
from .._core.blob import Blob
from .composite import _const, blob, floating, log1p, number

_REDUCTIONS = ("none", "mean", "sum")


def _reduce(loss, reduction, api, name):
    if reduction == "mean":
        return _ops.reduce_mean(loss, name=name)
    if reduction == "sum":
        return _ops.reduce_sum(loss, name=name)
    return loss if name is None else _ops.identity(loss, name=name)


def _check(api, input, target, reduction, what=("input", "target")):
    if reduction not in _REDUCTIONS:
        _trace.fail(ValueError, f"{api}: reduction must be one of 'none', 'mean', 'sum', got "
                    f"{reduction!r}")
    floating(input, api, what[0])
    floating(target, api, what[1])
    if tuple(input.shape) != tuple(target.shape):
        _trace.fail(ValueError, f"{api}: {what[0]} has shape {tuple(input.shape)} but {what[1]} has "
                    f"shape {tuple(target.shape)}; they must match")
    if input.dtype is not target.dtype:
        _trace.fail(TypeError, f"{api}: {what[0]} is {input.dtype.name} but {what[1]} is "
                    f"{target.dtype.name}")


def _weight(api, w, like, what="weight"):
    if w is None:
        return None
    floating(w, api, what)
    if tuple(w.shape) != tuple(like.shape):
        _trace.fail(ValueError, f"{api}: {what} has shape {tuple(w.shape)} but input has shape "
                    f"{tuple(like.shape)}; they must match")
    return w


def mse_loss(input: Blob, target: Blob, reduction: str = "mean", name: Optional[str] = None) -> Blob:  # noqa: A002 - OneFlow's names
    """(input - target)^2, reduced.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.mse_loss(x, y)
        >>> job(np.float32([1, 2, 3]), np.float32([1, 0, 1])).astype(float).round(3).tolist()
        [2.667]
    """
    _check("mse_loss", input, target, reduction)
    return _reduce(_ops.square(_ops.subtract(input, target)), reduction, "mse_loss", name)


def l1_loss(input: Blob, target: Blob, reduction: str = "mean", name: Optional[str] = None) -> Blob:  # noqa: A002
    """|input - target|, reduced.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.l1_loss(x, y, reduction="sum")
        >>> job(np.float32([1, 2, 3]), np.float32([1, 0, 1])).tolist()
        [4.0]
    """
    _check("l1_loss", input, target, reduction)
    return _reduce(_ops.abs(_ops.subtract(target, input)), reduction, "l1_loss", name)


def smooth_l1_loss(prediction: Blob, label: Blob, beta: float = 1.0, reduction: str = "none",
                   name: Optional[str] = None) -> Blob:
    """With d = |prediction - label|: 0.5 d^2 / beta where d < beta, else
    d - 0.5 beta (OneFlow's flow.smooth_l1_loss is elementwise: reduction
    "none" by default).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.smooth_l1_loss(x, y)
        >>> job(np.float32([1, 2, 3]), np.float32([1.5, 0, 1])).tolist()
        [0.125, 1.5, 1.5]
    """
    _check("smooth_l1_loss", prediction, label, reduction, ("prediction", "label"))
    b = number(beta, "smooth_l1_loss", "beta")
    if b < 0:
        _trace.fail(ValueError, f"smooth_l1_loss: beta must be >= 0, got {beta}")
    d = _ops.abs(_ops.subtract(prediction, label))
    if b == 0:
        return _reduce(d, reduction, "smooth_l1_loss", name)
    quad = _ops.multiply(_ops.square(d), 0.5 / b)
    lin = _ops.subtract(d, 0.5 * b)
    return _reduce(_ops.where(_ops.less(d, b), quad, lin), reduction, "smooth_l1_loss", name)


def bce_loss(input: Blob, target: Blob, weight: Optional[Blob] = None, reduction: str = "mean",  # noqa: A002
             name: Optional[str] = None) -> Blob:
    """-(target log(input) + (1 - target) log(1 - input)), times weight, reduced;
    input holds probabilities.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,)), y: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.nn.bce_loss(x, y, reduction="none")
        >>> job(np.float32([0.5, 0.9]), np.float32([1, 0])).astype(float).round(3).tolist()
        [0.693, 2.303]
    """
    _check("bce_loss", input, target, reduction)
    w = _weight("bce_loss", weight, input)
    loss = _ops.negative(_ops.add(_ops.multiply(target, _ops.log(input)),
                                  _ops.multiply(_ops.subtract(1.0, target),
                                                log1p(_ops.negative(input)))))
    if w is not None:
        loss = _ops.multiply(loss, w)
    return _reduce(loss, reduction, "bce_loss", name)


def bce_with_logits_loss(input: Blob, target: Blob, weight: Optional[Blob] = None,  # noqa: A002
                         pos_weight: Optional[Blob] = None, reduction: str = "mean",
                         name: Optional[str] = None) -> Blob:
    """bce_loss(sigmoid(input), target) computed from the logits without
    overflow; pos_weight (one per class, the last axis) scales the positive term:
    (1 - t) x + (1 + (p - 1) t) softplus(-x).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,)), y: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.nn.bce_with_logits_loss(x, y, reduction="none")
        >>> job(np.float32([0, 2]), np.float32([1, 0])).astype(float).round(3).tolist()
        [0.693, 2.127]
    """
    api = "bce_with_logits_loss"
    _check(api, input, target, reduction)
    w = _weight(api, weight, input)
    x, t = input, target
    sp = _ops.add(_ops.maximum(_ops.negative(x), 0.0),
                  log1p(_ops.exp(_ops.negative(_ops.abs(x)))))  # softplus(-x) = -log sigmoid(x)
    if pos_weight is not None:
        floating(pos_weight, api, "pos_weight")
        if len(pos_weight.shape) != 1 or not x.shape or pos_weight.shape[0] != x.shape[-1]:
            _trace.fail(ValueError, f"{api}: pos_weight must be 1-D with one weight per class (the "
                        f"last axis of input, {x.shape[-1] if x.shape else 'none'}), got shape "
                        f"{tuple(pos_weight.shape)}")
        sp = _ops.multiply(_ops.add(_ops.multiply(_ops.subtract(pos_weight, 1.0), t), 1.0), sp)
    loss = _ops.add(_ops.multiply(_ops.subtract(1.0, t), x), sp)
    if w is not None:
        loss = _ops.multiply(loss, w)
    return _reduce(loss, reduction, api, name)


def kldiv_loss(input: Blob, target: Blob, log_target: bool = False, reduction: str = "mean",  # noqa: A002
               name: Optional[str] = None) -> Blob:
    """target (log(target) - input), 0 where target <= 0 (input holds log
    probabilities); with log_target, exp(target) (target - input).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2,)), y: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.nn.kldiv_loss(x, y, reduction="none")
        >>> job(np.float32([-1, -1]), np.float32([0.5, 0.5])).astype(float).round(3).tolist()
        [0.153, 0.153]
    """
    api = "kldiv_loss"
    _check(api, input, target, reduction)
    if log_target:
        loss = _ops.multiply(_ops.exp(target), _ops.subtract(target, input))
    else:
        pos = _ops.greater(target, 0.0)
        t_safe = _ops.where(pos, target, _const(target, 1.0))
        loss = _ops.where(pos, _ops.multiply(target, _ops.subtract(_ops.log(t_safe), input)),
                          _const(input, 0.0))
    return _reduce(loss, reduction, api, name)


def sparse_cross_entropy(labels: Blob, prediction: Blob, name: Optional[str] = None) -> Blob:
    """-log(prediction[..., label]) for probabilities `prediction`; labels has
    prediction's shape without the last axis (or with a last axis of 1).

    Example:
        >>> @flow.global_function()
        ... def job(labels: tp.Numpy.Placeholder((2,), dtype=flow.int32), p: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.nn.sparse_cross_entropy(labels, p)   # -log(p[i, labels[i]])
        >>> job(np.int32([0, 1]), np.float32([[0.5, 0.5], [0.9, 0.1]])).astype(float).round(3).tolist()
        [0.693, 2.303]
    """
    api = "sparse_cross_entropy"
    blob(labels, api, "labels")
    floating(prediction, api, "prediction")
    if labels.dtype not in (_dtypes.int32, _dtypes.int64, _dtypes.int8, _dtypes.uint8):
        _trace.fail(TypeError, f"{api}: labels must be an integer blob, got {labels.dtype.name}")
    ps, ls = tuple(prediction.shape), tuple(labels.shape)
    if len(ls) == len(ps) and ls and ls[-1] == 1:
        ls = ls[:-1]
        labels = _ops.reshape(labels, list(ls))
    if not ps or ls != ps[:-1]:
        _trace.fail(ValueError, f"{api}: labels of shape {tuple(labels.shape)} do not match prediction "
                    f"of shape {ps} (expected labels of shape {ps[:-1] if ps else '()'})")
    labels = _ops.checked_index(labels, ps[-1], f"{api}: labels", api)
    classes = _ops.make(_ops.K.iota, [], {"shape": list(ps), "dtype": labels.dtype.c,
                                          "axis": len(ps) - 1}, api=api)
    hit = _ops.equal(classes, _ops.reshape(labels, list(ls) + [1]))
    picked = _ops.reduce_sum(_ops.where(hit, prediction, _const(prediction, 0.0)), axis=-1)
    return _ops.negative(_ops.log(picked), name=name)


def margin_ranking_loss(input1: Blob, input2: Blob, target: Blob, margin: float = 0.0,
                        reduction: str = "mean", name: Optional[str] = None) -> Blob:
    """max(0, margin - target * (input1 - input2)), reduced; target holds 1 where
    input1 should rank higher and -1 where input2 should (it broadcasts).

    Example:
        >>> @flow.global_function()
        ... def job(a: tp.Numpy.Placeholder((2,)), b: tp.Numpy.Placeholder((2,)), t: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.nn.margin_ranking_loss(a, b, t, margin=1.0, reduction="none")
        >>> job(np.float32([3, 1]), np.float32([1, 2]), np.float32([1, 1])).tolist()
        [0.0, 2.0]
    """
    api = "MarginRankingLoss"
    _check(api, input1, input2, reduction, ("input1", "input2"))
    floating(target, api, "target")
    m = number(margin, api, "margin")
    loss = _ops.maximum(_ops.add(_ops.multiply(target, _ops.subtract(input2, input1)), m), 0.0)
    return _reduce(loss, reduction, api, name)


def _p_distance(x, y, p, eps):
    """The p-norm of x - y + eps along the last axis."""
    d = _ops.abs(_ops.add(_ops.subtract(x, y), eps))
    if p == 2.0:
        return _ops.sqrt(_ops.reduce_sum(_ops.square(d), axis=-1))
    if p == 1.0:
        return _ops.reduce_sum(d, axis=-1)
    return _ops.pow(_ops.reduce_sum(_ops.pow(d, p), axis=-1), 1.0 / p)


def triplet_margin_loss(anchor: Blob, positive: Blob, negative: Blob, margin: float = 1.0, p: float = 2.0,
                        eps: float = 1e-6, swap: bool = False, reduction: str = "mean",
                        name: Optional[str] = None) -> Blob:
    """max(0, margin + d(anchor, positive) - d(anchor, negative)) per sample,
    reduced, where d(a, b) is the p-norm of a - b + eps along the last axis;
    with swap, d(anchor, negative) is replaced by the smaller of it and
    d(positive, negative).

    Example:
        >>> @flow.global_function()
        ... def job(a: tp.Numpy.Placeholder((1, 2)), p: tp.Numpy.Placeholder((1, 2)), n: tp.Numpy.Placeholder((1, 2))) -> tp.Numpy:
        ...     return flow.nn.triplet_margin_loss(a, p, n, margin=1.0, eps=0.0)
        >>> job(np.float32([[0, 0]]), np.float32([[3, 4]]), np.float32([[0, 1]])).astype(float).round(3).tolist()
        [5.0]
    """
    api = "TripletMarginLoss"
    _check(api, anchor, positive, reduction, ("anchor", "positive"))
    _check(api, anchor, negative, reduction, ("anchor", "negative"))
    if not anchor.shape:
        _trace.fail(ValueError, f"{api}: inputs must have rank >= 1 (features last), got a scalar")
    pp = number(p, api, "p")
    if pp <= 0:
        _trace.fail(ValueError, f"{api}: p must be > 0, got {p}")
    e, m = number(eps, api, "eps"), number(margin, api, "margin")
    d_pos = _p_distance(anchor, positive, pp, e)
    d_neg = _p_distance(anchor, negative, pp, e)
    if swap:
        d_neg = _ops.minimum(d_neg, _p_distance(positive, negative, pp, e))
    loss = _ops.maximum(_ops.add(_ops.subtract(d_pos, d_neg), m), 0.0)
    return _reduce(loss, reduction, api, name)


def softmax_cross_entropy_with_logits(labels: Blob, logits: Blob, name: Optional[str] = None) -> Blob:
    """Per-sample cross entropy -sum(labels * log_softmax(logits)) over the last
    axis, with OneFlow's and TensorFlow's gradient softmax(logits) - labels with
    respect to the logits (the exact one when each row of labels sums to 1),
    and -log_softmax(logits) with respect to the labels. Logits holding inf or
    NaN fail the run.

    Example:
        >>> @flow.global_function()
        ... def job(labels: tp.Numpy.Placeholder((1, 2)), logits: tp.Numpy.Placeholder((1, 2))) -> tp.Numpy:
        ...     return flow.nn.softmax_cross_entropy_with_logits(labels, logits)
        >>> job(np.float32([[0.5, 0.5]]), np.float32([[0, 0]])).astype(float).round(3).tolist()
        [0.693]
    """
    api = "softmax_cross_entropy_with_logits"
    floating(labels, api, "labels")
    floating(logits, api, "logits")
    if not logits.shape or tuple(labels.shape) != tuple(logits.shape):
        _trace.fail(ValueError, f"{api}: labels of shape {tuple(labels.shape)} must match logits of shape "
                    f"{tuple(logits.shape)} (rank >= 1, classes last)")
    if labels.dtype is not logits.dtype:
        _trace.fail(TypeError, f"{api}: labels are {labels.dtype.name} but logits are {logits.dtype.name}")
    # loss = lse(x) - sum(l * x) + (sum(l) - 1) * lse(x), the last lse held
    # constant for the gradient (a check_finite node passes no gradient), so
    # that d loss / dx = softmax(x) - l.
    m = _ops.reduce_max(logits, axis=-1, keepdims=True)
    lse = _ops.add(_ops.log(_ops.reduce_sum(_ops.exp(_ops.subtract(logits, m)), axis=-1)),
                   _ops.reshape(m, list(logits.shape[:-1])))
    held = _ops.make(_ops.K.check_finite, [lse], {"what": f"{api}: logsumexp of the logits"}, api=api)
    total = _ops.reduce_sum(labels, axis=-1)
    dot = _ops.reduce_sum(_ops.multiply(labels, logits), axis=-1)
    loss = _ops.add(_ops.subtract(lse, dot), _ops.multiply(_ops.subtract(total, 1.0), held))
    return loss if name is None else _ops.identity(loss, name=name)


def distributed_sparse_softmax_cross_entropy_with_logits(labels: Blob, logits: Blob,
                                                         name: Optional[str] = None) -> Blob:
    """:func:`flowjit.nn.sparse_softmax_cross_entropy_with_logits` (OneFlow's form
    for logits split over devices along the classes; flowjit places the split
    itself, so the result and gradient are the same).

    Example:
        >>> @flow.global_function()
        ... def job(labels: tp.Numpy.Placeholder((2,), dtype=flow.int32), logits: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.nn.distributed_sparse_softmax_cross_entropy_with_logits(labels, logits)
        >>> job(np.int32([0, 1]), np.float32([[0, 0], [0, 100]])).astype(float).round(3).tolist()
        [0.693, 0.0]
    """
    return _ops.sparse_softmax_cross_entropy_with_logits(labels, logits, name=name)
