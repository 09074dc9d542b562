"""Connectionist temporal classification: flow.ctc_loss and
flow.nn.ctc_greedy_decoder, written with ordinary ops.

ctc_loss runs the forward (alpha) recursion of Graves et al. (2006) in log
space, unrolled over the static number of time steps, so autodiff gives its
gradient (the backward recursion). Impossible alignments use a large finite
negative number for log 0, so no NaN arises inside the recursion; their loss
is reported as inf (or 0 with zero_infinity), as OneFlow does."""
from typing import Optional, Tuple

from .._core import dtypes as _dtypes, trace as _trace
from . import builders as _ops
from .._core.blob import Blob
from .composite import floating

K = _ops.K
_NEG = -1e30   # log 0 inside the recursion
_INFEASIBLE = 1e29  # a loss above this had no alignment


def _ints_blob(x, api, what, rank):
    if not isinstance(x, Blob):
        _trace.fail(TypeError, f"{api}: {what} must be a Blob, got {type(x).__name__}")
    if x.dtype not in (_dtypes.int32, _dtypes.int64):
        _trace.fail(TypeError, f"{api}: {what} must be int32 or int64, got {x.dtype.name}")
    if len(x.shape) != rank:
        _trace.fail(ValueError, f"{api}: {what} must have rank {rank}, got shape {tuple(x.shape)}")


def _iota(shape, axis, dtype, api):
    return _ops.make(K.iota, [], {"shape": list(shape), "dtype": dtype.c, "axis": axis}, api=api)


def _lse(*xs):
    """log(sum(exp(x))) of finite blobs of one shape."""
    m = xs[0]
    for x in xs[1:]:
        m = _ops.maximum(m, x)
    total = _ops.exp(_ops.subtract(xs[0], m))
    for x in xs[1:]:
        total = _ops.add(total, _ops.exp(_ops.subtract(x, m)))
    return _ops.add(m, _ops.log(total))


def _shift_right(a, by, fill, api):
    """a[:, l - by] along axis 1 (fill where l < by)."""
    n, length = a.shape
    p = _ops.make(K.pad, [a], {"pads_lo": [0, by], "pads_hi": [0, 0], "interior": [0, 0],
                               "pad_value": float(fill)}, api=api)
    return _ops.make(K.slice, [p], {"begin": [0, 0], "step": [1, 1], "shape": [n, length]}, api=api)


def ctc_loss(log_probs: Blob, targets: Blob, input_lengths: Blob, target_lengths: Blob, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False, name: Optional[str] = None) -> Blob:
    """The CTC loss of log_probs (T, N, C) (log-softmax outputs) against padded
    targets (N, S) with the lengths input_lengths (N,) and target_lengths
    (N,): the negative log-probability of all alignments, per sample for
    reduction 'none', the mean of loss / target_length for 'mean', the sum
    for 'sum'. A sample with no possible alignment has loss inf (its gradient
    NaN), or 0 (and gradient 0) with zero_infinity.

    Example:
        >>> @flow.global_function()   # T=1 step, N=1, C=2 classes (0 the blank), target [1]
        ... def job(lp: tp.Numpy.Placeholder((1, 1, 2)), t: tp.Numpy.Placeholder((1, 1), dtype=flow.int32),
        ...         il: tp.Numpy.Placeholder((1,), dtype=flow.int32),
        ...         tl: tp.Numpy.Placeholder((1,), dtype=flow.int32)) -> tp.Numpy:
        ...     return flow.ctc_loss(lp, t, il, tl, reduction="none")
        >>> lp = np.log(np.float32([[[0.25, 0.75]]]))
        >>> job(lp, np.int32([[1]]), np.int32([1]), np.int32([1])).astype(float).round(3).tolist()   # -log 0.75
        [0.288]
    """
    api = "ctc_loss"
    floating(log_probs, api, "log_probs")
    if len(log_probs.shape) != 3:
        _trace.fail(ValueError, f"{api}: log_probs must be (T, N, C), got shape {tuple(log_probs.shape)}")
    t_max, n, c = log_probs.shape
    _ints_blob(targets, api, "targets", 2)
    _ints_blob(input_lengths, api, "input_lengths", 1)
    _ints_blob(target_lengths, api, "target_lengths", 1)
    if targets.shape[0] != n or input_lengths.shape[0] != n or target_lengths.shape[0] != n:
        _trace.fail(ValueError, f"{api}: targets {tuple(targets.shape)}, input_lengths "
                    f"{tuple(input_lengths.shape)} and target_lengths {tuple(target_lengths.shape)} must all "
                    f"have the batch size {n} of log_probs first")
    if not isinstance(blank, int) or isinstance(blank, bool) or not 0 <= blank < c:
        _trace.fail(ValueError, f"{api}: blank must be an int in [0, {c}), got {blank!r}")
    if reduction not in ("none", "mean", "sum"):
        _trace.fail(ValueError, f"{api}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    dt = log_probs.dtype
    s = targets.shape[1]
    length = 2 * s + 1
    i32 = _dtypes.int32
    targets = _ops.cast(_ops.checked_index(targets, c, f"{api}: targets", api), i32)
    # The extended labels: blank, t0, blank, t1, ..., blank.
    lpos = _iota([length], 0, i32, api)
    lf = _iota([length], 0, _dtypes.float32, api)
    half = _ops.floor(_ops.multiply(lf, 0.5))
    odd = _ops.greater(_ops.subtract(lf, _ops.multiply(half, 2.0)), 0.5)
    pick = _ops.cast(_ops.floor(_ops.multiply(_ops.maximum(_ops.subtract(lf, 1.0), 0.0), 0.5)), i32)
    labels = _ops.make(K.gather, [targets, pick], {"axis": 1}, api=api)                 # (N, L)
    ext = _ops.where(_ops.reshape(odd, [1, length]), labels, _ops.constant(blank, dtype=i32))
    skip = _ops.logical_and(_ops.not_equal(ext, _shift_right(ext, 2, -1, api)),
                            _ops.reshape(_ops.greater_equal(lf, 1.5), [1, length]))
    # Emissions e[n, t, l] = log_probs[t, n, ext[n, l]].
    lp = _ops.transpose(log_probs, [1, 0, 2])
    e = _ops.make(K.gather, [lp, ext], {"axis": 2, "batch_dims": 1}, api=api)            # (N, T, L)

    e = _ops.maximum(e, _NEG)  # log 0 stays finite
    neg = _ops.constant(_NEG, dtype=dt)
    lens = _ops.reshape(_ops.cast(input_lengths, i32), [n, 1])
    tl = _ops.reshape(_ops.cast(target_lengths, i32), [n, 1])
    lrow = _ops.reshape(lpos, [1, length])
    # OneFlow's kernel, when a sample's last target is the blank itself (an
    # invalid target), counts only the alignment ending on that target at the
    # last step in the gradient: the final blank's emission there passes none.
    quirk = _ops.logical_and(_ops.logical_and(_ops.equal(lrow, _ops.multiply(tl, 2)), _ops.greater(tl, 0)),
                             _ops.equal(_shift_right(ext, 1, -1, api), blank))

    def at(t):
        et = _ops.reshape(_ops.make(K.slice, [e], {"begin": [0, t, 0], "step": [1, 1, 1],
                                                   "shape": [n, 1, length]}, api=api), [n, length])
        hold = _ops.logical_and(quirk, _ops.equal(lens, t + 1))
        held = _ops.make(K.check_finite, [_ops.where(hold, et, _ops.zeros_like(et))],
                         {"what": f"{api}: log_probs"}, api=api)
        return _ops.where(hold, held, et)
    first = _ops.logical_or(_ops.equal(lrow, 0), _ops.logical_and(_ops.equal(lrow, 1), _ops.greater(tl, 0)))
    alpha = _ops.where(first, at(0), neg)
    for t in range(1, t_max):
        a1 = _shift_right(alpha, 1, _NEG, api)
        a2 = _ops.where(skip, _shift_right(alpha, 2, _NEG, api), neg)
        new = _ops.add(_lse(alpha, a1, a2), at(t))
        alpha = _ops.where(_ops.greater(lens, t), new, alpha)
    two = _ops.multiply(tl, 2)
    end = _ops.logical_or(_ops.equal(lrow, two),
                          _ops.logical_and(_ops.greater(tl, 0), _ops.equal(lrow, _ops.subtract(two, 1))))
    ends = _ops.where(end, alpha, neg)
    m = _ops.reduce_max(ends, axis=1, keepdims=True)
    loss = _ops.negative(_ops.reshape(_ops.add(m, _ops.log(_ops.reduce_sum(_ops.exp(_ops.subtract(ends, m)),
                                                                             axis=1, keepdims=True))), [n]))
    infeasible = _ops.greater(loss, _INFEASIBLE)
    valid = _ops.greater(_ops.reshape(lens, [n, 1, 1]), _ops.reshape(_iota([t_max], 0, i32, api), [1, t_max, 1]))
    # OneFlow's (and PyTorch's) gradient is the one with respect to the logits
    # under log_softmax: exp(log_probs) - posterior over a sample's steps. The
    # exp term comes from soft - held(soft), 0 in value (a check_finite node
    # passes no gradient).
    soft = _ops.reduce_sum(_ops.where(valid, _ops.exp(lp), _ops.zeros_like(lp)), axis=[1, 2])
    held = _ops.make(K.check_finite, [soft], {"what": f"{api}: exp(log_probs)"}, api=api)
    feasible_loss = _ops.add(loss, _ops.subtract(soft, held))
    if zero_infinity:
        loss = _ops.where(infeasible, _ops.zeros([n], dtype=dt), feasible_loss)
    else:
        # inf for an impossible alignment, with a NaN gradient over the
        # sample's inputs (OneFlow's): 1 / (0 * S), S > 0 depending on them.
        lp_sum = _ops.reduce_sum(_ops.where(valid, lp, _ops.zeros_like(lp)), axis=[1, 2])
        k = _ops.where(infeasible, _ops.zeros([n], dtype=dt), _ops.ones([n], dtype=dt))
        inf = _ops.reciprocal(_ops.multiply(k, _ops.subtract(loss, lp_sum)))
        loss = _ops.where(infeasible, inf, feasible_loss)
    if reduction == "mean":
        per = _ops.divide(loss, _ops.cast(_ops.maximum(_ops.reshape(tl, [n]), 1), dt))
        out = _ops.reduce_mean(per)
    elif reduction == "sum":
        out = _ops.reduce_sum(loss)
    else:
        out = loss
    return out if name is None else _ops.identity(out, name=name)


def ctc_greedy_decoder(log_probs: Blob, input_lengths: Blob, merge_repeated: bool = True,
                       name: Optional[str] = None) -> Tuple[Blob, Blob]:
    """Best-path decoding of log_probs (T, N, C) whose last class is the blank:
    per sample, the most likely class at each of its input_lengths steps,
    repeats merged (with merge_repeated) and blanks dropped, left-aligned in
    `decoded` (N, T) of input_lengths' dtype (0 after the end); and
    neg_sum_logits (N, 1), minus the sum of those steps' largest log-probabilities.

    Example:
        >>> from typing import Tuple
        >>> @flow.global_function()   # T=4 steps, N=1, classes 0, 1 and the blank 2
        ... def job(lp: tp.Numpy.Placeholder((4, 1, 3)),
        ...         il: tp.Numpy.Placeholder((1,), dtype=flow.int64)) -> Tuple[tp.Numpy, tp.Numpy]:
        ...     return flow.nn.ctc_greedy_decoder(lp, il)
        >>> best = [1, 1, 2, 0]   # the most likely class at each step
        >>> lp = np.log(np.where(np.eye(3)[best] > 0, 0.8, 0.1).astype(np.float32)).reshape(4, 1, 3)
        >>> decoded, _ = job(lp, np.int64([4]))
        >>> decoded.tolist()
        [[1, 0, 0, 0]]
    """
    api = "ctc_greedy_decoder"
    floating(log_probs, api, "log_probs")
    if len(log_probs.shape) != 3:
        _trace.fail(ValueError, f"{api}: log_probs must be (T, N, C), got shape {tuple(log_probs.shape)}")
    _ints_blob(input_lengths, api, "input_lengths", 1)
    t_max, n, c = log_probs.shape
    if input_lengths.shape[0] != n:
        _trace.fail(ValueError, f"{api}: input_lengths has {input_lengths.shape[0]} entries but the batch is {n}")
    dt = log_probs.dtype
    lp = _ops.transpose(log_probs, [1, 0, 2])                                       # (N, T, C)
    best = _ops.reduce_max(lp, axis=2)                                              # (N, T)
    idx = _ops.cast(_ops.argmax(lp, axis=2, dtype=_dtypes.int32), dt)               # exact small ints
    valid = _ops.greater(_ops.reshape(_ops.cast(input_lengths, _dtypes.int32), [n, 1]),
                         _ops.reshape(_iota([t_max], 0, _dtypes.int32, api), [1, t_max]))
    neg_sum = _ops.negative(_ops.reduce_sum(_ops.where(valid, best, _ops.zeros_like(best)), axis=1,
                                            keepdims=True))
    keep = _ops.logical_and(valid, _ops.not_equal(idx, float(c - 1)))
    if merge_repeated:
        keep = _ops.logical_and(keep, _ops.not_equal(idx, _shift_right(idx, 1, -1, api)))
    keepf = _ops.cast(keep, dt)
    upper = _ops.cast(_ops.less_equal(_iota([t_max, t_max], 0, _dtypes.int32, api),
                                      _iota([t_max, t_max], 1, _dtypes.int32, api)), dt)
    slot = _ops.subtract(_ops.matmul(keepf, upper), 1.0)                             # output slot of step t
    j = _ops.reshape(_iota([t_max], 0, dt, api), [1, t_max, 1])
    hit = _ops.logical_and(_ops.equal(_ops.reshape(slot, [n, 1, t_max]), j), _ops.reshape(keep, [n, 1, t_max]))
    dec = _ops.reduce_sum(_ops.where(hit, _ops.reshape(idx, [n, 1, t_max]), _ops.zeros([n, t_max, t_max], dtype=dt)),
                          axis=2)
    decoded = _ops.cast(dec, input_lengths.dtype)
    if name is not None:
        decoded = _ops.identity(decoded, name=f"{name}_decoded")
        neg_sum = _ops.identity(neg_sum, name=f"{name}_neg_sum_logits")
    return decoded, neg_sum
