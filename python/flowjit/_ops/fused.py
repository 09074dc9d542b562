"""OneFlow's fused nn ops (bias_add + dropout, bias_add + gelu, scale + tril,
scale + tril + softmax + dropout, the self-attention query x key product),
random_mask_like and softmax_grad. Each is written as the composition it
stands for: fusion in the compiler merges the pieces into one kernel, and
their gradients come from autodiff."""
import numbers
from typing import Optional, Sequence, Tuple, Union

from .. import _C
from .._core import dtypes as _dtypes, trace as _trace
from . import builders as _ops
from .activations import gelu
from .._core.blob import Blob
from .composite import _triangle, blob, floating, number
from .conv import dropout, dropout_counter

K = _C.OpKind


def _bias_add(value, bias, data_format, api):
    from ..nn import bias_add
    floating(value, api, "value")
    floating(bias, api, "bias")
    return bias_add(value, bias, data_format=data_format)


def fused_bias_add_gelu(a: Blob, b: Blob, data_format: str = "NCHW", name: Optional[str] = None) -> Blob:
    """gelu(bias_add(a, b, data_format)).

    Example:
        >>> @flow.global_function()
        ... def job(a: tp.Numpy.Placeholder((1, 2)), b: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.nn.fused_bias_add_gelu(a, b, data_format="NC")
        >>> job(np.float32([[0, 1]]), np.float32([0, 1])).astype(float).round(3).tolist()
        [[0.0, 1.954]]
    """
    return gelu(_bias_add(a, b, data_format, "fused_bias_add_gelu"), name=name)


def fused_bias_add_dropout(a: Blob, b: Blob, data_format: str = "NCHW", rate: float = 0.0,
                           noise_shape: Optional[Sequence[int]] = None, seed: Optional[int] = None,
                           name: Optional[str] = None) -> Blob:
    """dropout(bias_add(a, b, data_format), rate, noise_shape, seed): with the
    same seed, the same mask as flow.nn.dropout.

    Example:
        >>> @flow.global_function()   # a predict job: dropout is the identity
        ... def job(a: tp.Numpy.Placeholder((1, 2)), b: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        ...     return flow.nn.fused_bias_add_dropout(a, b, data_format="NC", rate=0.5)
        >>> job(np.float32([[0, 1]]), np.float32([1, 2])).tolist()
        [[1.0, 3.0]]
    """
    return dropout(_bias_add(a, b, data_format, "fused_bias_add_dropout"), rate, noise_shape, seed, name)


def fused_scale_tril(x: Blob, diagonal: int = 0, fill_value: Union[int, float] = 0, scale: Union[int, float] = 1,
                     name: Optional[str] = None) -> Blob:
    """x * scale on and below the `diagonal`-th diagonal of the last two axes,
    fill_value (not scaled) above it.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.fused_scale_tril(x, fill_value=-1, scale=2)
        >>> job(np.float32([[1, 2], [3, 4]])).tolist()
        [[2.0, -1.0], [6.0, 8.0]]
    """
    api = "fused_scale_tril"
    blob(x, api, "x")
    s = number(scale, api, "scale")
    if x.dtype in _dtypes.FLOATS:
        pass
    elif x.dtype is not _dtypes.bool_ and float(s).is_integer():
        s = int(s)  # OneFlow's kernel scales an integer blob by an integer
    else:
        _trace.fail(TypeError, f"{api}: x must be a number blob, and an integer x takes an integral scale; "
                    f"got {x.dtype.name} and scale={scale!r}")
    y = _triangle(_ops.multiply(x, s) if s != 1.0 else x, diagonal, fill_value, api, True)
    return y if name is None else _ops.identity(y, name=name)


def fused_scale_tril_softmax_dropout(x: Blob, diagonal: int = 0, fill_value: Union[int, float] = 0,
                                     scale: Union[int, float] = 1, rate: float = 0.0,
                                     noise_shape: Optional[Sequence[int]] = None, seed: Optional[int] = None,
                                     name: Optional[str] = None) -> Blob:
    """dropout(softmax(fused_scale_tril(x, diagonal, fill_value, scale)), rate,
    noise_shape, seed) over the last axis (a causal attention mask).

    Example:
        >>> @flow.global_function()   # a causal mask, then softmax; predict: no dropout
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.math.fused_scale_tril_softmax_dropout(x, fill_value=-1e9, rate=0.1)
        >>> job(np.zeros((2, 2), np.float32)).tolist()
        [[1.0, 0.0], [0.5, 0.5]]
    """
    y = _ops.softmax(fused_scale_tril(x, diagonal, fill_value, scale))
    return dropout(y, rate, noise_shape, seed, name)


def random_mask_like(like: Blob, rate: float, seed: Optional[int] = None,
                     noise_shape: Optional[Sequence[int]] = None, name: Optional[str] = None) -> Blob:
    """An int8 blob of like's shape (or `noise_shape`): 1 with probability
    1 - rate, else 0; new numbers at every run of the job, reproducible from
    `seed` (in train jobs, the mask flow.nn.dropout draws with that seed).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1000,))) -> tp.Numpy:
        ...     return flow.nn.random_mask_like(x, rate=0.25, seed=1)
        >>> mask = job(np.zeros(1000, np.float32))
        >>> mask.dtype, set(mask.tolist()), bool(650 < mask.sum() < 850)
        (dtype('int8'), {0, 1}, True)
    """
    api = "random_mask_like"
    if not isinstance(like, Blob):
        _trace.fail(TypeError, f"{api}: like must be a Blob, got {type(like).__name__}")
    if not isinstance(rate, numbers.Real) or isinstance(rate, bool) or not 0.0 <= float(rate) < 1.0:
        _trace.fail(ValueError, f"{api}: rate must be a number in [0, 1), got {rate!r}")
    b = _trace.require_builder(f"flow.nn.{api}")
    shape = list(like.shape) if noise_shape is None else _ops._int_list(noise_shape, api, "noise_shape")
    step = None  # a train job's steps
    if b.type != "train":
        # A predict job counts its own runs, so each run draws new numbers.
        from .._core.variables import ConstantInitializer
        step = b.variable(f"System-RandomMask-Step-{b.job_name}", (), _dtypes.int64, ConstantInitializer(0),
                          False, 0, _trace.user_location())
        if not b._counts.get("random_mask_step"):
            b._counts["random_mask_step"] = 1
            b.effects.append(_C.make_node(K.assign, [step._node, _ops.add(step, 1)._node], {}))
    seed, offset = dropout_counter(b, shape, seed, step)
    u = _ops.make(K.random_uniform_at, [offset], {"shape": shape, "dtype": _dtypes.float32.c, "seed": seed},
                  api=api)
    return _ops.cast(_ops.greater_equal(u, float(rate)), _dtypes.int8, name=name)


def softmax_grad(y: Blob, dy: Blob, axis: Optional[int] = None, name: Optional[str] = None) -> Blob:
    """The gradient of softmax with respect to its logits, from its output y
    and output gradient dy: y * (dy - sum(dy * y)) along `axis` (the last when
    None).

    Example:
        >>> @flow.global_function()
        ... def job(y: tp.Numpy.Placeholder((1, 2)), dy: tp.Numpy.Placeholder((1, 2))) -> tp.Numpy:
        ...     return flow.nn.softmax_grad(y, dy)   # y * (dy - sum(dy * y))
        >>> job(np.float32([[0.5, 0.5]]), np.float32([[1, 0]])).tolist()
        [[0.25, -0.25]]
    """
    api = "softmax_grad"
    floating(y, api, "y")
    floating(dy, api, "dy")
    if tuple(y.shape) != tuple(dy.shape):
        _trace.fail(ValueError, f"{api}: y has shape {tuple(y.shape)} but dy has {tuple(dy.shape)}")
    ax = -1 if axis is None else axis
    if not isinstance(ax, numbers.Integral) or not -len(y.shape) <= ax < len(y.shape):
        _trace.fail(ValueError, f"{api}: axis must be an int in [{-len(y.shape)}, {len(y.shape)}), got {axis!r}")
    dot = _ops.reduce_sum(_ops.multiply(dy, y), axis=int(ax), keepdims=True)
    return _ops.multiply(y, _ops.subtract(dy, dot), name=name)


def fused_self_attention_query_mul_key_and_value(x: Blob, head_size: int, alpha: float = 1.0,
                                                 name: Optional[str] = None) -> Tuple[Blob, Blob]:
    """From x (seq, batch, heads * 3 * head_size), each head's [q | k | v]
    side by side: (alpha * q @ k^T of shape (batch, heads, seq, seq),
    v of shape (batch, heads, seq, head_size)).

    Example:
        >>> from typing import Tuple
        >>> @flow.global_function()   # seq 3, batch 1, 2 heads of 4
        ... def job(x: tp.Numpy.Placeholder((3, 1, 2 * 3 * 4))) -> Tuple[tp.Numpy, tp.Numpy]:
        ...     return flow.nn.fused_self_attention_query_mul_key_and_value(x, head_size=4)
        >>> qk, v = job(np.ones((3, 1, 24), np.float32))
        >>> qk.shape, v.shape, qk[0, 0, 0, 0].item()
        ((1, 2, 3, 3), (1, 2, 3, 4), 4.0)
    """
    api = "fused_self_attention_query_mul_key_and_value"
    floating(x, api, "x")
    if not isinstance(head_size, numbers.Integral) or isinstance(head_size, bool) or head_size < 1:
        _trace.fail(ValueError, f"{api}: head_size must be a positive int, got {head_size!r}")
    if len(x.shape) != 3 or x.shape[2] % (3 * head_size):
        _trace.fail(ValueError, f"{api}: x must be (seq, batch, heads * 3 * head_size) with head_size "
                    f"{head_size}, got shape {tuple(x.shape)}")
    s, n = x.shape[0], x.shape[1]
    heads = x.shape[2] // (3 * head_size)
    h = _ops.reshape(x, [s, n, heads, 3 * head_size])

    def part(i):
        p = _ops.make(K.slice, [h], {"begin": [0, 0, 0, i * head_size], "step": [1, 1, 1, 1],
                                     "shape": [s, n, heads, head_size]}, api=api)
        return _ops.transpose(p, [1, 2, 0, 3])
    q, k, v = part(0), part(1), part(2)
    qmk = _ops.matmul(q, k, transpose_b=True, alpha=number(alpha, api, "alpha"))
    if name is not None:
        qmk = _ops.identity(qmk, name=f"{name}_query_mul_key")
        v = _ops.identity(v, name=f"{name}_value")
    return qmk, v


def scaled_dot_product_attention(query: Blob, key: Blob, value: Blob, attn_mask: Optional[Blob] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, name: Optional[str] = None) -> Blob:
    """softmax(query @ key^T * scale + mask) @ value over query (..., Lq, D),
    key (..., Lk, D) and value (..., Lk, Dv) with the same batch dims, as
    PyTorch's ``scaled_dot_product_attention``: ``scale`` defaults to
    1 / sqrt(D); ``attn_mask`` is a bool mask (True: the key takes part) or
    a float bias added to the scores, broadcast to (..., Lq, Lk);
    ``is_causal`` masks the keys after each query (j > i) and skips them.

    It is one attention kernel (and three for its gradients) that computes
    the softmax online: no (Lq, Lk) score matrix is stored. With
    ``dropout_p`` > 0 in a train job the probabilities are dropped out as
    flow.nn.dropout does (the same mask), inside the kernels.

    Example:
        >>> @flow.global_function()
        ... def job(q: tp.Numpy.Placeholder((1, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.scaled_dot_product_attention(q, q, q, is_causal=True)
        >>> job(np.float32([[[1, 0], [0, 1]]])).astype(float).round(3).tolist()
        [[[1.0, 0.0], [0.33, 0.67]]]
    """
    api = "scaled_dot_product_attention"
    for x, what in ((query, "query"), (key, "key"), (value, "value")):
        floating(x, api, what)
    if not (query.dtype == key.dtype == value.dtype):
        _trace.fail(TypeError, f"{api}: query, key and value must have one dtype, got "
                    f"{query.dtype.name}, {key.dtype.name}, {value.dtype.name}")
    r = len(query.shape)
    qs, ks, vs = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    if r < 2 or len(ks) != r or len(vs) != r or qs[:-2] != ks[:-2] or qs[:-2] != vs[:-2] \
            or ks[-1] != qs[-1] or vs[-2] != ks[-2]:
        _trace.fail(ValueError, f"{api}: expected query (..., Lq, D), key (..., Lk, D) and value "
                    f"(..., Lk, Dv) with the same batch dims, got {qs}, {ks}, {vs}")
    if not isinstance(is_causal, bool):
        _trace.fail(TypeError, f"{api}: is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is None:
        scale = 1.0 / float(qs[-1]) ** 0.5 if qs[-1] else 1.0
    scale = number(scale, api, "scale")
    p = number(dropout_p, api, "dropout_p")
    if not 0.0 <= p < 1.0:
        _trace.fail(ValueError, f"{api}: dropout_p must be in [0, 1), got {dropout_p!r}")
    lq, lk = qs[-2], ks[-2]
    bias = None
    if attn_mask is not None:
        blob(attn_mask, api, "attn_mask")
        ms = tuple(attn_mask.shape)
        full = qs[:-2] + (lq, lk)
        if len(ms) > r or any(m not in (1, f) for m, f in zip(ms[::-1], full[::-1])):
            _trace.fail(ValueError, f"{api}: attn_mask of shape {ms} does not broadcast to the scores "
                        f"{full}")
        if attn_mask.dtype == _dtypes.bool_:
            bias = _ops.where(attn_mask, _ops.constant(0.0, query.dtype),
                              _ops.constant(float("-inf"), query.dtype))
        elif attn_mask.dtype == query.dtype:
            bias = attn_mask
        else:
            _trace.fail(TypeError, f"{api}: attn_mask must be bool or query's dtype {query.dtype.name}, "
                        f"got {attn_mask.dtype.name}")
    b = _trace.require_builder(f"flow.nn.{api}")
    if bias is None:
        bias = _ops.constant(0.0, query.dtype, shape=[1] * r)
    else:
        ms = (1,) * (r - len(bias.shape)) + tuple(bias.shape)
        if ms != tuple(bias.shape):
            bias = _ops.reshape(bias, list(ms))
        batch = ms[:-2]
        runs = sum(1 for i, d in enumerate(batch) if d != 1 and (i == 0 or batch[i - 1] == 1))
        if runs > 1:  # the kernel reads one run of batch dims: broadcast the rest
            bias = _ops.broadcast_to(bias, list(qs[:-2]) + list(ms[-2:]))
    kt = _ops.transpose(key, list(range(r - 2)) + [r - 1, r - 2])
    operands, attrs = [query, kt, value, bias], {"causal": is_causal, "scale": scale}
    if p > 0.0 and b.type == "train":  # flow.nn.dropout's mask over the probabilities, in the kernels
        seed, offset = dropout_counter(b, list(qs[:-2]) + [lq, lk], None)
        operands.append(offset)
        attrs.update(dropout=p, seed=seed)
    both = _ops.make(K.attention, operands, attrs, api=api)
    # the op's rows end with each query's log-sum-exp (for its gradient): the output is the rest
    dv = vs[-1]
    return _ops.make(K.slice, [both], {"begin": [0] * r, "step": [1] * r, "shape": list(qs[:-1]) + [dv]},
                     name=name, api=api)
