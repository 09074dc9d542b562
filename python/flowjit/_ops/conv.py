"""Convolutions, pooling, normalization and dropout (flow.nn / flow.layers).

Convolutions lower to the IR's implicit-GEMM ops (`conv`, and its gradients
through autodiff) over channels-first operands; pooling reduces over a
`window` view. Channels-last (NHWC) operands are transposed views, which the
kernels read through strides. Batch and layer normalization are written with
ordinary ops, so their gradients, fusion and layouts come from those ops.
"""
import numbers
from typing import Any, Callable, Optional, Sequence, Union

from .. import _C
from .._core import dtypes as _dtypes, trace as _trace
from . import builders as _ops
from .._core.blob import Blob

K = _C.OpKind

_FORMATS = {"NCHW": True, "NHWC": False, "NCW": True, "NWC": False, "NCDHW": True, "NDHWC": False,
            "channels_first": True, "channels_last": False}


def _check_blob(x, api, what="input"):
    if not isinstance(x, Blob):
        _trace.fail(TypeError, f"{api}: {what} must be a Blob, got {type(x).__name__}")


def _channels_first(data_format, api):
    if not isinstance(data_format, str) or data_format not in _FORMATS:
        _trace.fail(ValueError, f"{api}: data_format must be one of {', '.join(repr(f) for f in _FORMATS)}, "
                    f"got {data_format!r}")
    return _FORMATS[data_format]


def _ints(v, n, api, what, minimum=1):
    """An int or a list of n ints, as a list of n ints >= minimum."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        out = [int(v)] * n
    elif isinstance(v, (list, tuple)) and len(v) == n and all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in v):
        out = [int(d) for d in v]
    else:
        _trace.fail(ValueError, f"{api}: {what} must be an int or a list of {n} ints, got {v!r}")
    for d in out:
        if d < minimum:
            _trace.fail(ValueError, f"{api}: {what} must be >= {minimum}, got {v!r}")
    return out


def _pads(padding, spatial_in, kernel, strides, dilations, channels_first, api):
    """OneFlow's padding forms -> (pads_lo, pads_hi) per spatial dim."""
    s = len(spatial_in)
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [0] * s, [0] * s
        if mode in ("SAME", "SAME_UPPER", "SAME_LOWER"):
            lo, hi = [], []
            for i in range(s):
                out = -(-spatial_in[i] // strides[i])
                total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial_in[i], 0)
                small = total // 2
                lo.append(total - small if mode == "SAME_LOWER" else small)
                hi.append(small if mode == "SAME_LOWER" else total - small)
            return lo, hi
        _trace.fail(ValueError, f"{api}: padding must be 'SAME', 'SAME_LOWER', 'SAME_UPPER', 'VALID' or "
                    f"explicit pads, got {padding!r}")
    if isinstance(padding, numbers.Integral) and not isinstance(padding, bool):
        p = int(padding)
        if p < 0:
            _trace.fail(ValueError, f"{api}: padding must be >= 0, got {padding!r}")
        return [p] * s, [p] * s
    if isinstance(padding, (list, tuple)):
        items = list(padding)
        if len(items) == s + 2 and all(isinstance(q, (list, tuple)) for q in items):
            # OneFlow's per-dimension pairs over every dim of the input layout.
            spatial = items[2:] if channels_first else items[1:-1]
            if any(tuple(q) != (0, 0) for q in (items[:2] if channels_first else [items[0], items[-1]])):
                _trace.fail(ValueError, f"{api}: padding of the batch and channel dims must be [0, 0], "
                            f"got {padding!r}")
            items = spatial
        if len(items) == s and all(isinstance(q, numbers.Integral) and not isinstance(q, bool) for q in items):
            items = [(q, q) for q in items]
        if len(items) == s and all(isinstance(q, (list, tuple)) and len(q) == 2 for q in items):
            lo = [int(q[0]) for q in items]
            hi = [int(q[1]) for q in items]
            if min(lo + hi) < 0:
                _trace.fail(ValueError, f"{api}: padding must be >= 0, got {padding!r}")
            return lo, hi
    _trace.fail(ValueError, f"{api}: padding must be 'SAME', 'VALID', an int, or per-dimension [low, high] "
                f"pairs, got {padding!r}")


def _to_channels_first(x, channels_first):
    if channels_first:
        return x
    r = len(x.shape)
    return _ops.transpose(x, [0, r - 1] + list(range(1, r - 1)))


def _from_channels_first(x, channels_first):
    if channels_first:
        return x
    r = len(x.shape)
    return _ops.transpose(x, [0] + list(range(2, r)) + [1])


def _check_rank(x, s, api):
    if len(x.shape) != s + 2:
        _trace.fail(ValueError, f"{api}: input must have rank {s + 2} (batch, channels and {s} spatial "
                    f"dims), got shape {x.shape}")


def _conv_flat(s, api, input, filters, strides, padding, data_format, dilations, groups):
    """The conv op's result [N, groups, Co/groups, prod(out)], and how to
    bring such a value back to the user's layout."""
    _check_blob(input, api)
    _check_blob(filters, api, "filters")
    cf = _channels_first(data_format, api)
    _check_rank(input, s, api)
    if len(filters.shape) != s + 2:
        _trace.fail(ValueError, f"{api}: filters must have rank {s + 2}, got shape {filters.shape}")
    if not isinstance(groups, numbers.Integral) or isinstance(groups, bool) or groups < 1:
        _trace.fail(ValueError, f"{api}: groups must be a positive int, got {groups!r}")
    x = _to_channels_first(input, cf)
    w = _to_channels_first(filters, cf)  # OneFlow's NHWC filters are (Co, k..., C/groups)
    st = _ints(strides, s, api, "strides")
    dl = _ints(1 if dilations is None else dilations, s, api, "dilations")
    kernel = list(w.shape[2:])
    spatial = list(x.shape[2:])
    lo, hi = _pads(padding, spatial, kernel, st, dl, cf, api)
    c, co = x.shape[1], w.shape[0]
    if c % groups:
        _trace.fail(ValueError, f"{api}: input channels ({c}) are not divisible by groups ({groups})")
    y = _ops.make(K.conv, [x, w], {"strides": st, "dilations": dl, "pads_lo": lo, "pads_hi": hi,
                                   "groups": int(groups)}, api=api)
    out = [(spatial[i] + lo[i] + hi[i] - dl[i] * (kernel[i] - 1) - 1) // st[i] + 1 for i in range(s)]

    def unflatten(v):
        return _from_channels_first(_ops.reshape(v, [x.shape[0], co] + out), cf)
    return y, unflatten


def _conv_nd(s, api, input, filters, strides, padding, data_format, dilations, groups, name):
    y, unflatten = _conv_flat(s, api, input, filters, strides, padding, data_format, dilations, groups)
    y = unflatten(y)
    return _ops.identity(y, name=name) if name else y


def conv1d(input: Blob, filters: Blob, strides: Union[int, Sequence[int]],
           padding: Union[str, int, Sequence[Any]], data_format: str = "NCW",
           dilations: Optional[Union[int, Sequence[int]]] = None, groups: int = 1,
           name: Optional[str] = None) -> Blob:
    """1-D convolution (cross-correlation, as OneFlow computes it).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 4)), w: tp.Numpy.Placeholder((1, 1, 2))) -> tp.Numpy:
        ...     return flow.nn.conv1d(x, w, strides=1, padding="VALID")
        >>> job(np.float32([[[1, 2, 3, 4]]]), np.float32([[[1, -1]]])).tolist()
        [[[-1.0, -1.0, -1.0]]]
    """
    return _conv_nd(1, "conv1d", input, filters, strides, padding, data_format, dilations, groups, name)


def conv2d(input: Blob, filters: Blob, strides: Union[int, Sequence[int]],
           padding: Union[str, int, Sequence[Any]], bias: Optional[Blob] = None, data_format: str = "NCHW",
           dilations: Optional[Union[int, Sequence[int]]] = None, groups: int = 1,
           name: Optional[str] = None) -> Blob:
    """2-D convolution: input (N, C, H, W) or NHWC, filters (Co, C/groups, kh, kw)
    (NHWC: (Co, kh, kw, C/groups)); padding 'SAME', 'VALID' or explicit pairs.
    A 1-D `bias` of Co values is added per output channel (OneFlow's fifth
    argument), inside the convolution's kernel.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 3, 3)), w: tp.Numpy.Placeholder((2, 1, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.conv2d(x, w, strides=1, padding="VALID")
        >>> x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
        >>> w = np.float32([[[[1, 0], [0, 0]]], [[[1, 1], [1, 1]]]])   # two filters
        >>> job(x, w).tolist()
        [[[[0.0, 1.0], [3.0, 4.0]], [[8.0, 12.0], [20.0, 24.0]]]]
    """
    if bias is None:
        return _conv_nd(2, "conv2d", input, filters, strides, padding, data_format, dilations, groups, name)
    api = "conv2d"
    _check_blob(bias, api, "bias")
    y, unflatten = _conv_flat(2, api, input, filters, strides, padding, data_format, dilations, groups)
    co = filters.shape[0]
    if tuple(bias.shape) != (co,):
        _trace.fail(ValueError, f"{api}: bias must have shape ({co},), one value per output channel, "
                    f"got {tuple(bias.shape)}")
    y = unflatten(_ops.add(y, _ops.reshape(bias, [1, groups, co // groups, 1])))
    return _ops.identity(y, name=name) if name else y


def compat_conv2d(input: Blob, filters: Blob, strides: Union[int, Sequence[int]], padding: str,
                  data_format: str = "NCHW", dilations: Optional[Union[int, Sequence[int]]] = None,
                  groups: int = 1, name: Optional[str] = None) -> Blob:
    """TensorFlow's conv2d padding rule on :func:`conv2d`: 'SAME' puts the odd
    padding element after (SAME_UPPER); 'VALID' pads nothing.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 2, 2)), w: tp.Numpy.Placeholder((1, 1, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.compat_conv2d(x, w, strides=1, padding="SAME")
        >>> job(np.float32([[[[1, 2], [3, 4]]]]), np.ones((1, 1, 2, 2), np.float32)).tolist()
        [[[[10.0, 6.0], [7.0, 4.0]]]]
    """
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "VALID"):
        _trace.fail(ValueError, f"compat_conv2d: padding must be 'SAME' or 'VALID', got {padding!r}")
    mode = "SAME_UPPER" if padding.upper() == "SAME" else "VALID"
    return conv2d(input, filters, strides, mode, None, data_format, dilations, groups, name)


# ---------------------------------------------------------------- transposed convolution

def _deconv2d(api, x, w, strides, dilations, data_format, pads_lo, out_spatial, name):
    """The transposed 2-D convolution of x (N, Ci, h, w) with w (Ci, Co, kh, kw)
    (both in `data_format`): out[o] = sum over i, k with o = i * s + k * d - pads_lo
    of x[i] w[k], `out_spatial` long. It is the convolution, at stride 1, of x
    spread out by s - 1 zeros between elements with the flipped, transposed
    filter, so its gradients are the convolution's own."""
    cf = _channels_first(data_format, api)
    x = _to_channels_first(x, cf)
    w = _to_channels_first(w, cf)  # NHWC filters are (Ci, kh, kw, Co)
    if x.shape[1] != w.shape[0]:
        _trace.fail(ValueError, f"{api}: input has {x.shape[1]} channels but the filters expect "
                    f"{w.shape[0]} (filters are (in_channels, out_channels, kh, kw))")
    k = list(w.shape[2:])
    st, dl = list(strides), list(dilations)
    up = _ops.make(K.pad, [x], {"pads_lo": [0] * 4, "pads_hi": [0] * 4,
                                "interior": [0, 0] + [s - 1 for s in st], "pad_value": 0.0}, api=api)
    lo = [dl[i] * (k[i] - 1) - pads_lo[i] for i in range(2)]
    hi = [out_spatial[i] - up.shape[2 + i] - lo[i] + dl[i] * (k[i] - 1) for i in range(2)]
    if min(lo + hi) < 0:  # more padding than the filter reaches: cut the spread input instead
        begin = [0, 0] + [max(-v, 0) for v in lo]
        shape = list(up.shape[:2]) + [up.shape[2 + i] - max(-lo[i], 0) - max(-hi[i], 0) for i in range(2)]
        if min(shape) <= 0:
            _trace.fail(ValueError, f"{api}: output size {out_spatial} with padding {pads_lo} leaves no "
                        "input element in reach of the filter")
        up = _ops.make(K.slice, [up], {"begin": begin, "step": [1] * 4, "shape": shape}, api=api)
        lo, hi = [max(v, 0) for v in lo], [max(v, 0) for v in hi]
    flipped = _ops.make(K.slice, [w], {"begin": [0, 0, k[0] - 1, k[1] - 1], "step": [1, 1, -1, -1],
                                       "shape": list(w.shape)}, api=api)
    wt = _ops.transpose(flipped, [1, 0, 2, 3])
    y = _ops.make(K.conv, [up, wt], {"strides": [1, 1], "dilations": dl, "pads_lo": lo, "pads_hi": hi,
                                     "groups": 1}, api=api)
    y = _from_channels_first(_ops.reshape(y, [x.shape[0], w.shape[1]] + list(out_spatial)), cf)
    return _ops.identity(y, name=name) if name else y


def _deconv_operands(api, value, filter, input, filters):
    if (value is None) == (input is None):
        _trace.fail(TypeError, f"{api}: pass the input as exactly one of `value` and `input`")
    if (filter is None) == (filters is None):
        _trace.fail(TypeError, f"{api}: pass the filters as exactly one of `filter` and `filters`")
    x = value if value is not None else input
    w = filter if filter is not None else filters
    _check_blob(x, api, "input")
    _check_blob(w, api, "filters")
    _check_rank(x, 2, api)
    if len(w.shape) != 4:
        _trace.fail(ValueError, f"{api}: filters must have rank 4, got shape {w.shape}")
    return x, w


def conv2d_transpose(value: Optional[Blob] = None, filter: Optional[Blob] = None,  # noqa: A002 - OneFlow's names
                     output_shape: Optional[Sequence[int]] = None,
                     strides: Optional[Union[int, Sequence[int]]] = None, padding: str = "VALID",
                     data_format: str = "NCHW", name: Optional[str] = None, input: Optional[Blob] = None,  # noqa: A002
                     filters: Optional[Blob] = None,
                     dilations: Optional[Union[int, Sequence[int]]] = None) -> Blob:
    """2-D transposed convolution (the gradient of conv2d with respect to its
    input), TensorFlow's conv2d_transpose: filters (in, out, kh, kw) for NCHW,
    (in, kh, kw, out) for NHWC; `output_shape` is the whole 4-D result shape,
    and 'SAME' or 'VALID' padding is the one of the convolution it transposes.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 2, 2)), w: tp.Numpy.Placeholder((1, 1, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.conv2d_transpose(x, w, output_shape=(1, 1, 4, 4), strides=2, padding="VALID")
        >>> job(np.float32([[[[1, 2], [3, 4]]]]), np.ones((1, 1, 2, 2), np.float32))[0, 0].tolist()
        [[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0], [3.0, 3.0, 4.0, 4.0], [3.0, 3.0, 4.0, 4.0]]
    """
    api = "conv2d_transpose"
    x, w = _deconv_operands(api, value, filter, input, filters)
    cf = _channels_first(data_format, api)
    if output_shape is None or len(output_shape) != 4:
        _trace.fail(ValueError, f"{api}: output_shape must list 4 extents, got {output_shape!r}")
    oshape = _ops._int_list(output_shape, api, "output_shape")
    st = _ints(strides, 2, api, "strides")
    dl = _ints(1 if dilations is None else dilations, 2, api, "dilations")
    in_sp = list(x.shape[2:] if cf else x.shape[1:3])
    k = list(w.shape[2:] if cf else w.shape[1:3])
    co = w.shape[1] if cf else w.shape[3]
    out_sp = oshape[2:] if cf else oshape[1:3]
    if oshape[0] != x.shape[0] or (oshape[1] if cf else oshape[3]) != co:
        _trace.fail(ValueError, f"{api}: output_shape {oshape} must have the input's batch {x.shape[0]} and "
                    f"the filters' {co} output channels")
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "VALID"):
        _trace.fail(ValueError, f"{api}: padding must be 'SAME' or 'VALID', got {padding!r}")
    lo = []
    for i in range(2):
        eff = (k[i] - 1) * dl[i] + 1
        if padding.upper() == "VALID":
            if (out_sp[i] + st[i] - eff) // st[i] != in_sp[i]:
                _trace.fail(ValueError, f"{api}: a VALID convolution of an output of extent {out_sp[i]} "
                            f"(spatial dim {i}) gives {(out_sp[i] + st[i] - eff) // st[i]} elements, but the "
                            f"input has {in_sp[i]}")
            lo.append(0)
        else:
            if (out_sp[i] + st[i] - 1) // st[i] != in_sp[i]:
                _trace.fail(ValueError, f"{api}: a SAME convolution of an output of extent {out_sp[i]} "
                            f"(spatial dim {i}) gives {(out_sp[i] + st[i] - 1) // st[i]} elements, but the "
                            f"input has {in_sp[i]}")
            lo.append(max(0, (in_sp[i] - 1) * st[i] + eff - out_sp[i]) // 2)
    return _deconv2d(api, x, w, st, dl, data_format, lo, out_sp, name)


def torch_conv2d_transpose(value: Optional[Blob] = None, filter: Optional[Blob] = None,  # noqa: A002
                           output_padding: Optional[Sequence[int]] = None,
                           strides: Optional[Union[int, Sequence[int]]] = None,
                           padding_needed: Optional[Sequence[int]] = None, data_format: str = "NCHW",
                           name: Optional[str] = None, input: Optional[Blob] = None,  # noqa: A002
                           filters: Optional[Blob] = None,
                           dilations: Optional[Union[int, Sequence[int]]] = None) -> Blob:
    """PyTorch's ConvTranspose2d arithmetic: padding_needed[i] (even) is twice
    torch's padding, output_padding extends the end; the output extent is
    (in - 1) * stride - padding_needed + dilation * (k - 1) + 1 + output_padding.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 2, 2)), w: tp.Numpy.Placeholder((1, 1, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.torch_conv2d_transpose(x, w, strides=2, padding_needed=[0, 0])
        >>> job(np.float32([[[[1, 2], [3, 4]]]]), np.ones((1, 1, 2, 2), np.float32)).shape
        (1, 1, 4, 4)
    """
    api = "torch_conv2d_transpose"
    x, w = _deconv_operands(api, value, filter, input, filters)
    cf = _channels_first(data_format, api)
    st = _ints(strides, 2, api, "strides")
    dl = _ints(1 if dilations is None else dilations, 2, api, "dilations")
    need = _ints([0, 0] if padding_needed is None else padding_needed, 2, api, "padding_needed", 0)
    if any(p % 2 for p in need):
        _trace.fail(ValueError, f"{api}: padding_needed must hold even numbers (twice the padding), got {need}")
    op = _ints([0, 0] if output_padding is None else output_padding, 2, api, "output_padding", 0)
    in_sp = list(x.shape[2:] if cf else x.shape[1:3])
    k = list(w.shape[2:] if cf else w.shape[1:3])
    out_sp = [(in_sp[i] - 1) * st[i] - need[i] + dl[i] * (k[i] - 1) + 1 + op[i] for i in range(2)]
    if min(out_sp) <= 0:
        _trace.fail(ValueError, f"{api}: the output would have extents {out_sp}")
    return _deconv2d(api, x, w, st, dl, data_format, [p // 2 for p in need], out_sp, name)


def conv3d(input: Blob, filters: Blob, strides: Union[int, Sequence[int]],
           padding: Union[str, int, Sequence[Any]], data_format: str = "NCDHW",
           dilations: Optional[Union[int, Sequence[int]]] = None, groups: int = 1,
           name: Optional[str] = None) -> Blob:
    """3-D convolution.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 2, 2, 2)), w: tp.Numpy.Placeholder((1, 1, 2, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.conv3d(x, w, strides=1, padding="VALID")
        >>> job(np.ones((1, 1, 2, 2, 2), np.float32), np.ones((1, 1, 2, 2, 2), np.float32)).tolist()
        [[[[[8.0]]]]]
    """
    return _conv_nd(3, "conv3d", input, filters, strides, padding, data_format, dilations, groups, name)


# ---------------------------------------------------------------- pooling

def _pool_nd(s, kind, api, input, ksize, strides, padding, data_format, name):
    _check_blob(input, api)
    cf = _channels_first(data_format, api)
    _check_rank(input, s, api)
    if not (input.dtype in _dtypes.FLOATS):
        _trace.fail(TypeError, f"{api}: expected a floating-point input, got {input.dtype!r}")
    k = _ints(ksize, s, api, "ksize")
    st = _ints(strides, s, api, "strides")
    x = _to_channels_first(input, cf)
    spatial = list(x.shape[2:])
    lo, hi = _pads(padding, spatial, k, st, [1] * s, cf, api)
    for i in range(s):
        if k[i] > spatial[i] + lo[i] + hi[i]:
            _trace.fail(ValueError, f"{api}: ksize {k[i]} is larger than the padded input "
                        f"({spatial[i]} + padding {lo[i]} + {hi[i]}) along spatial dim {i}")
        # A window wholly inside the padding has no input element: max pooling
        # would give -inf and average pooling 0/0. PyTorch and OneFlow refuse
        # such padding (theirs must be at most half the window), so do we.
        last = (spatial[i] + lo[i] + hi[i] - k[i]) // st[i] * st[i]
        if spatial[i] == 0 or lo[i] >= k[i] or last - lo[i] >= spatial[i]:
            _trace.fail(ValueError, f"{api}: padding ({lo[i]}, {hi[i]}) along spatial dim {i} leaves a "
                        f"window of ksize {k[i]} (stride {st[i]}) with no input element (extent "
                        f"{spatial[i]}); the padding before and after must each be smaller than ksize")
    attrs = {"window": k, "strides": st, "dilations": [1] * s, "pads_lo": lo, "pads_hi": hi,
             "pad_value": float("-inf") if kind == "max" else 0.0}
    if st == k and max(lo + hi) == 0 and all(spatial[i] % k[i] == 0 for i in range(s)):
        # Windows that tile the input exactly (2x2 stride 2): the window view
        # is a split and a transpose, read with plain strides, and its
        # gradient is the inverse permutation (a copy, no sum over taps).
        n, c = x.shape[:2]
        split = [n, c]
        for i in range(s):
            split += [spatial[i] // k[i], k[i]]
        win = _ops.transpose(_ops.reshape(x, split),
                             [0, 1] + [2 + 2 * i for i in range(s)] + [3 + 2 * i for i in range(s)])
    else:
        win = _ops.make(K.window, [x], attrs, api=api)
    taps = list(range(len(win.shape) - s, len(win.shape)))
    if kind == "max":
        y = _ops.reduce_max(win, taps)
    else:
        total = _ops.reduce_sum(win, taps)
        if max(lo + hi) == 0:
            n = 1
            for d in k:
                n *= d
            y = _ops.multiply(total, 1.0 / n)
        else:
            # Averages over the elements inside the input (TensorFlow's and
            # OneFlow's SAME pooling): the count per window from a window of ones.
            ones = _ops.ones([1, 1] + spatial, dtype=x.dtype)
            count = _ops.reduce_sum(_ops.make(K.window, [ones], attrs, api=api), taps)
            y = _ops.divide(total, count)
    y = _from_channels_first(y, cf)
    return _ops.identity(y, name=name) if name else y


def max_pool1d(input: Blob, ksize: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
               padding: Union[str, int, Sequence[Any]], data_format: str = "NWC",
               name: Optional[str] = None) -> Blob:
    """The 1-D form of :func:`max_pool2d`: max over ksize windows.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 4, 1))) -> tp.Numpy:
        ...     return flow.nn.max_pool1d(x, ksize=2, strides=2, padding="VALID")   # NWC
        >>> job(np.float32([[[1], [3], [2], [0]]])).tolist()
        [[[3.0], [2.0]]]
    """
    return _pool_nd(1, "max", "max_pool1d", input, ksize, strides, padding, data_format, name)


def max_pool2d(input: Blob, ksize: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
               padding: Union[str, int, Sequence[Any]], data_format: str = "NCHW",
               name: Optional[str] = None) -> Blob:
    """Max over ksize windows; padded positions never win (-inf).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 4, 4))) -> tp.Numpy:
        ...     return flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID")
        >>> job(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)).tolist()
        [[[[5.0, 7.0], [13.0, 15.0]]]]
    """
    return _pool_nd(2, "max", "max_pool2d", input, ksize, strides, padding, data_format, name)


def max_pool3d(input: Blob, ksize: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
               padding: Union[str, int, Sequence[Any]], data_format: str = "NCDHW",
               name: Optional[str] = None) -> Blob:
    """The 3-D form of :func:`max_pool2d`: max over ksize windows.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 2, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.max_pool3d(x, ksize=2, strides=2, padding="VALID")
        >>> job(np.arange(8, dtype=np.float32).reshape(1, 1, 2, 2, 2)).tolist()
        [[[[[7.0]]]]]
    """
    return _pool_nd(3, "max", "max_pool3d", input, ksize, strides, padding, data_format, name)


def avg_pool1d(input: Blob, ksize: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
               padding: Union[str, int, Sequence[Any]], data_format: str = "NWC",
               name: Optional[str] = None) -> Blob:
    """The 1-D form of :func:`avg_pool2d`: mean over ksize windows.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 4, 1))) -> tp.Numpy:
        ...     return flow.nn.avg_pool1d(x, ksize=2, strides=2, padding="VALID")   # NWC
        >>> job(np.float32([[[1], [3], [2], [0]]])).tolist()
        [[[2.0], [1.0]]]
    """
    return _pool_nd(1, "avg", "avg_pool1d", input, ksize, strides, padding, data_format, name)


def avg_pool2d(input: Blob, ksize: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
               padding: Union[str, int, Sequence[Any]], data_format: str = "NCHW",
               name: Optional[str] = None) -> Blob:
    """Mean over ksize windows; with padding, over the elements inside the input.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 4, 4))) -> tp.Numpy:
        ...     return flow.nn.avg_pool2d(x, ksize=2, strides=2, padding="VALID")
        >>> job(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)).tolist()
        [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    return _pool_nd(2, "avg", "avg_pool2d", input, ksize, strides, padding, data_format, name)


def avg_pool3d(input: Blob, ksize: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
               padding: Union[str, int, Sequence[Any]], data_format: str = "NCDHW",
               name: Optional[str] = None) -> Blob:
    """The 3-D form of :func:`avg_pool2d`: mean over ksize windows.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 2, 2, 2))) -> tp.Numpy:
        ...     return flow.nn.avg_pool3d(x, ksize=2, strides=2, padding="VALID")
        >>> job(np.arange(8, dtype=np.float32).reshape(1, 1, 2, 2, 2)).tolist()
        [[[[[3.5]]]]]
    """
    return _pool_nd(3, "avg", "avg_pool3d", input, ksize, strides, padding, data_format, name)


# ---------------------------------------------------------------- dropout

def dropout_counter(b, shape: Sequence[int], seed: Optional[int], step: Optional[Blob] = None):
    """The seed and the int64 counter offset of a dropout mask of `shape`:
    the offset moves by the mask's size every step (the train step, or
    `step`), so each step draws new numbers; the seed defaults to one per
    dropout of the job."""
    count = b._counts.get("dropout_seed", 0)
    b._counts["dropout_seed"] = count + 1
    if seed is None:
        seed = 0x5EED0000 + count  # distinct per dropout in a job, stable across runs
    numel = 1
    for d in shape:
        numel *= d
    if step is None:
        step = b.train_step()
    return int(seed), _ops.multiply(step, _ops.constant(numel, dtype=_dtypes.int64))


def dropout(x: Blob, rate: float, noise_shape: Optional[Sequence[int]] = None, seed: Optional[int] = None,
            name: Optional[str] = None) -> Blob:
    """Zeroes each element with probability `rate` and scales the others by
    1 / (1 - rate) in train jobs; the identity in predict jobs. The mask is
    counter-based: new every train step, reproducible from `seed`.

    Example:
        >>> @flow.global_function()   # a predict job: dropout is the identity
        ... def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        ...     return flow.nn.dropout(x, rate=0.5)
        >>> job(np.float32([1, 2, 3])).tolist()
        [1.0, 2.0, 3.0]
    """
    _check_blob(x, "dropout", "x")
    if not isinstance(rate, numbers.Real) or isinstance(rate, bool) or not 0.0 <= float(rate) < 1.0:
        _trace.fail(ValueError, f"dropout: rate must be a number in [0, 1), got {rate!r}")
    if not (x.dtype in _dtypes.FLOATS):
        _trace.fail(TypeError, f"dropout: expected a floating-point x, got {x.dtype!r}")
    b = _trace.require_builder("flow.nn.dropout")
    rate = float(rate)
    if b.type != "train" or rate == 0.0:
        return _ops.identity(x, name=name) if name else x
    shape = list(x.shape) if noise_shape is None else _ops._int_list(noise_shape, "dropout", "noise_shape")
    if len(shape) != len(x.shape) or any(d not in (1, e) for d, e in zip(shape, x.shape)):
        _trace.fail(ValueError, f"dropout: noise_shape {shape} must have x's rank with each extent 1 or "
                    f"x's ({list(x.shape)})")
    seed, offset = dropout_counter(b, shape, seed)
    u = _ops.make(K.random_uniform_at, [offset], {"shape": shape, "dtype": x.dtype.c, "seed": seed},
                  api="dropout")
    keep = _ops.greater_equal(u, rate)
    return _ops.where(keep, _ops.multiply(x, 1.0 / (1.0 - rate)), _ops.zeros_like(x), name=name)


# ---------------------------------------------------------------- layers

# Activations that act elementwise: a conv layer applies them (and its bias)
# before bringing the result to the user's layout, where they fuse into the
# convolution's epilogue. Others see the result in the user's layout.
_ELEMENTWISE_ACTIVATIONS = {_ops.relu, _ops.sigmoid, _ops.tanh}


def _layer_name(api, name):
    return _trace.unique_name(name, api, "layers", f"layer:{api}", api.capitalize())


def _conv_layer(s, api, inputs, filters, kernel_size, strides, padding, data_format, dilation_rate, groups,
                activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
                bias_regularizer, trainable, name, weight_name=None, bias_name=None):
    from .._core.variables import get_variable
    _check_blob(inputs, api, "inputs")
    name = _layer_name(api, name)
    if not isinstance(filters, numbers.Integral) or isinstance(filters, bool) or filters <= 0:
        _trace.fail(ValueError, f"{api} '{name}': filters must be a positive int, got {filters!r}")
    if not isinstance(groups, numbers.Integral) or isinstance(groups, bool) or groups < 1:
        _trace.fail(ValueError, f"{api} '{name}': groups must be a positive int, got {groups!r}")
    cf = _channels_first(data_format, api)
    _check_rank(inputs, s, api)
    k = _ints(kernel_size, s, api, "kernel_size")
    c = inputs.shape[1] if cf else inputs.shape[-1]
    if c % groups:
        _trace.fail(ValueError, f"{api} '{name}': input channels ({c}) are not divisible by groups ({groups})")
    if filters % groups:
        _trace.fail(ValueError, f"{api} '{name}': filters ({filters}) are not divisible by groups ({groups})")
    shape = (filters, c // groups, *k) if cf else (filters, *k, c // groups)
    weight = get_variable(weight_name or f"{name}-weight", shape=shape, dtype=inputs.dtype,
                          initializer=kernel_initializer, regularizer=kernel_regularizer,
                          trainable=trainable)
    y, unflatten = _conv_flat(s, api, inputs, weight, strides, padding, data_format, dilation_rate, groups)
    if use_bias:
        bias = get_variable(bias_name or f"{name}-bias", shape=(filters,), dtype=inputs.dtype,
                            initializer=bias_initializer, regularizer=bias_regularizer, trainable=trainable)
        y = _ops.add(y, _ops.reshape(bias, [1, groups, filters // groups, 1]))
    if activation is not None and activation in _ELEMENTWISE_ACTIVATIONS:
        return unflatten(activation(y))
    y = unflatten(y)
    return activation(y) if activation is not None else y


def layer_conv1d(inputs: Blob, filters: int, kernel_size: Union[int, Sequence[int]] = 1,
                 strides: Union[int, Sequence[int]] = 1, padding: Union[str, int, Sequence[Any]] = "VALID",
                 data_format: str = "NCW", dilation_rate: Union[int, Sequence[int]] = 1, groups: int = 1,
                 activation: Optional[Callable[[Blob], Blob]] = None, use_bias: bool = True,
                 kernel_initializer: Optional[Any] = None, bias_initializer: Optional[Any] = None,
                 kernel_regularizer: Optional[Any] = None, bias_regularizer: Optional[Any] = None,
                 trainable: bool = True, name: Optional[str] = None, weight_name: Optional[str] = None,
                 bias_name: Optional[str] = None) -> Blob:
    """1-D convolution layer: variables `<name>-weight` (filters, in/groups, k) and `<name>-bias`.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2, 5))) -> tp.Numpy:
        ...     return flow.layers.conv1d(x, filters=4, kernel_size=3, kernel_initializer=flow.ones_initializer())
        >>> job(np.ones((1, 2, 5), np.float32)).tolist()
        [[[6.0, 6.0, 6.0], [6.0, 6.0, 6.0], [6.0, 6.0, 6.0], [6.0, 6.0, 6.0]]]
    """
    return _conv_layer(1, "conv1d", inputs, filters, kernel_size, strides, padding, data_format, dilation_rate,
                       groups, activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
                       bias_regularizer, trainable, name, weight_name, bias_name)


def layer_conv2d(inputs: Blob, filters: int, kernel_size: Union[int, Sequence[int]] = 1,
                 strides: Union[int, Sequence[int]] = 1, padding: Union[str, int, Sequence[Any]] = "VALID",
                 data_format: str = "NCHW", dilation_rate: Union[int, Sequence[int]] = 1, groups: int = 1,
                 activation: Optional[Callable[[Blob], Blob]] = None, use_bias: bool = True,
                 kernel_initializer: Optional[Any] = None, bias_initializer: Optional[Any] = None,
                 kernel_regularizer: Optional[Any] = None, bias_regularizer: Optional[Any] = None,
                 trainable: bool = True, name: Optional[str] = None, weight_name: Optional[str] = None,
                 bias_name: Optional[str] = None) -> Blob:
    """2-D convolution layer: variables `<name>-weight` of shape (filters,
    in/groups, kh, kw) for NCHW ((filters, kh, kw, in/groups) for NHWC) and
    `<name>-bias` (filters,); the bias and an elementwise activation fuse
    into the convolution kernel.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 3, 4, 4))) -> tp.Numpy:
        ...     return flow.layers.conv2d(x, filters=2, kernel_size=3, padding="SAME", activation=flow.math.relu,
        ...                               kernel_initializer=flow.constant_initializer(0.5))
        >>> y = job(np.ones((1, 3, 4, 4), np.float32))
        >>> y.shape, y[0, 0].tolist()
        ((1, 2, 4, 4), [[6.0, 9.0, 9.0, 6.0], [9.0, 13.5, 13.5, 9.0], [9.0, 13.5, 13.5, 9.0], [6.0, 9.0, 9.0, 6.0]])
    """
    return _conv_layer(2, "conv2d", inputs, filters, kernel_size, strides, padding, data_format, dilation_rate,
                       groups, activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
                       bias_regularizer, trainable, name, weight_name, bias_name)


def layer_conv3d(inputs: Blob, filters: int, kernel_size: Union[int, Sequence[int]] = 1,
                 strides: Union[int, Sequence[int]] = 1, padding: Union[str, int, Sequence[Any]] = "VALID",
                 data_format: str = "NCDHW", dilation_rate: Union[int, Sequence[int]] = 1, groups: int = 1,
                 activation: Optional[Callable[[Blob], Blob]] = None, use_bias: bool = True,
                 kernel_initializer: Optional[Any] = None, bias_initializer: Optional[Any] = None,
                 kernel_regularizer: Optional[Any] = None, bias_regularizer: Optional[Any] = None,
                 trainable: bool = True, name: Optional[str] = None, weight_name: Optional[str] = None,
                 bias_name: Optional[str] = None) -> Blob:
    """3-D convolution layer.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 3, 3, 3))) -> tp.Numpy:
        ...     return flow.layers.conv3d(x, filters=2, kernel_size=2)
        >>> job(np.ones((1, 1, 3, 3, 3), np.float32)).shape
        (1, 2, 2, 2, 2)
    """
    return _conv_layer(3, "conv3d", inputs, filters, kernel_size, strides, padding, data_format, dilation_rate,
                       groups, activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
                       bias_regularizer, trainable, name, weight_name, bias_name)


def max_pooling1d(inputs: Blob, pool_size: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
                  padding: Union[str, int, Sequence[Any]] = "valid", data_format: str = "channels_last",
                  name: Optional[str] = None) -> Blob:
    """flow.layers.max_pooling1d: :func:`flowjit.nn.max_pool1d` with Keras-style defaults.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 4, 1))) -> tp.Numpy:
        ...     return flow.layers.max_pooling1d(x, pool_size=2, strides=2)   # channels_last
        >>> job(np.float32([[[1], [3], [2], [0]]])).tolist()
        [[[3.0], [2.0]]]
    """
    return _pool_nd(1, "max", "max_pooling1d", inputs, pool_size, strides, padding, data_format, name)


def max_pooling2d(inputs: Blob, pool_size: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
                  padding: Union[str, int, Sequence[Any]] = "valid", data_format: str = "channels_last",
                  name: Optional[str] = None) -> Blob:
    """flow.layers.max_pooling2d (Keras-style defaults: 'valid', channels_last).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2, 2, 1))) -> tp.Numpy:
        ...     return flow.layers.max_pooling2d(x, pool_size=2, strides=2)   # channels_last
        >>> job(np.float32([[[[1], [3]], [[2], [0]]]])).tolist()
        [[[[3.0]]]]
    """
    return _pool_nd(2, "max", "max_pooling2d", inputs, pool_size, strides, padding, data_format, name)


def max_pooling3d(inputs: Blob, pool_size: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
                  padding: Union[str, int, Sequence[Any]] = "valid", data_format: str = "channels_last",
                  name: Optional[str] = None) -> Blob:
    """flow.layers.max_pooling3d: :func:`flowjit.nn.max_pool3d` with Keras-style defaults.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2, 2, 2, 1))) -> tp.Numpy:
        ...     return flow.layers.max_pooling3d(x, pool_size=2, strides=2)   # channels_last
        >>> job(np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2, 1)).tolist()
        [[[[[7.0]]]]]
    """
    return _pool_nd(3, "max", "max_pooling3d", inputs, pool_size, strides, padding, data_format, name)


def average_pooling1d(inputs: Blob, pool_size: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
                      padding: Union[str, int, Sequence[Any]] = "valid", data_format: str = "channels_last",
                      name: Optional[str] = None) -> Blob:
    """flow.layers.average_pooling1d: :func:`flowjit.nn.avg_pool1d` with Keras-style defaults ('valid', channels_last).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 4, 1))) -> tp.Numpy:
        ...     return flow.layers.average_pooling1d(x, pool_size=2, strides=2)   # channels_last
        >>> job(np.float32([[[1], [3], [2], [0]]])).tolist()
        [[[2.0], [1.0]]]
    """
    return _pool_nd(1, "avg", "average_pooling1d", inputs, pool_size, strides, padding, data_format, name)


def average_pooling2d(inputs: Blob, pool_size: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
                      padding: Union[str, int, Sequence[Any]] = "valid", data_format: str = "channels_last",
                      name: Optional[str] = None) -> Blob:
    """flow.layers.average_pooling2d: :func:`flowjit.nn.avg_pool2d` with Keras-style defaults ('valid', channels_last).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2, 2, 1))) -> tp.Numpy:
        ...     return flow.layers.average_pooling2d(x, pool_size=2, strides=2)   # channels_last
        >>> job(np.float32([[[[1], [3]], [[2], [0]]]])).tolist()
        [[[[1.5]]]]
    """
    return _pool_nd(2, "avg", "average_pooling2d", inputs, pool_size, strides, padding, data_format, name)


def average_pooling3d(inputs: Blob, pool_size: Union[int, Sequence[int]], strides: Union[int, Sequence[int]],
                      padding: Union[str, int, Sequence[Any]] = "valid", data_format: str = "channels_last",
                      name: Optional[str] = None) -> Blob:
    """flow.layers.average_pooling3d: :func:`flowjit.nn.avg_pool3d` with Keras-style defaults ('valid', channels_last).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2, 2, 2, 1))) -> tp.Numpy:
        ...     return flow.layers.average_pooling3d(x, pool_size=2, strides=2)   # channels_last
        >>> job(np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2, 1)).tolist()
        [[[[[3.5]]]]]
    """
    return _pool_nd(3, "avg", "average_pooling3d", inputs, pool_size, strides, padding, data_format, name)


# ---------------------------------------------------------------- normalization

def _axis(x, axis, api, what="axis"):
    r = len(x.shape)
    if not isinstance(axis, numbers.Integral) or isinstance(axis, bool) or not -r <= axis < r:
        _trace.fail(ValueError, f"{api}: {what} must be an int in [{-r}, {r}) for a rank-{r} input, got {axis!r}")
    return int(axis) % r


def _float_input(x, api):
    _check_blob(x, api, "inputs")
    if x.dtype not in _dtypes.FLOATS:
        _trace.fail(TypeError, f"{api}: expected a floating-point input, got {x.dtype!r}")


def batch_normalization(inputs: Blob, axis: int = -1, momentum: float = 0.99, epsilon: float = 0.001,
                        center: bool = True, scale: bool = True, beta_initializer: Optional[Any] = None,
                        gamma_initializer: Optional[Any] = None, beta_regularizer: Optional[Any] = None,
                        gamma_regularizer: Optional[Any] = None,
                        moving_mean_initializer: Optional[Any] = None,
                        moving_variance_initializer: Optional[Any] = None, trainable: bool = True,
                        training: bool = True, name: str = "BatchNorm") -> Blob:
    """Batch normalization over every axis but `axis` (the channels).

    In train jobs with training=True: the batch's mean and (biased) variance
    normalize, and the moving statistics `<name>-moving_mean` and
    `<name>-moving_variance` (unbiased variance) are updated as
    moving = momentum * moving + (1 - momentum) * batch. Otherwise (predict
    jobs, or training=False) the moving statistics normalize. `<name>-gamma`
    scales and `<name>-beta` shifts when scale and center are set.

    Example:
        >>> @flow.global_function()   # a predict job normalizes with the moving statistics (0 and 1)
        ... def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        ...     return flow.layers.batch_normalization(x, axis=1, epsilon=0.0)
        >>> job(np.float32([[1, 2, 3], [4, 5, 6]])).tolist()
        [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    """
    from .._core.variables import ConstantInitializer, get_variable
    api = "batch_normalization"
    _float_input(inputs, api)
    ax = _axis(inputs, axis, api)
    if not isinstance(momentum, numbers.Real) or not 0.0 <= float(momentum) <= 1.0:
        _trace.fail(ValueError, f"{api}: momentum must be in [0, 1], got {momentum!r}")
    if not isinstance(epsilon, numbers.Real) or float(epsilon) < 0:
        _trace.fail(ValueError, f"{api}: epsilon must be >= 0, got {epsilon!r}")
    b = _trace.require_builder("flow.layers.batch_normalization")
    x = inputs
    r = len(x.shape)
    c = x.shape[ax]
    bshape = [1] * r
    bshape[ax] = c
    axes = [d for d in range(r) if d != ax]
    dt = x.dtype

    def var(suffix, init, dflt, reg=None, train=trainable):
        return get_variable(f"{name}-{suffix}", shape=(c,), dtype=dt,
                            initializer=init if init is not None else ConstantInitializer(dflt),
                            regularizer=reg, trainable=train)

    mm = var("moving_mean", moving_mean_initializer, 0.0, train=False)
    mv = var("moving_variance", moving_variance_initializer, 1.0, train=False)
    n = 1
    for d in axes:
        n *= x.shape[d]
    if b.type == "train" and training and n > 0:
        mean = _ops.reduce_mean(x, axes, keepdims=True)
        centered = _ops.subtract(x, mean)
        variance = _ops.reduce_mean(_ops.square(centered), axes, keepdims=True)
        m = float(momentum)
        flat_mean = _ops.reshape(mean, [c])
        flat_var = _ops.reshape(variance, [c])
        unbiased = _ops.multiply(flat_var, n / (n - 1) if n > 1 else 1.0)
        new_mm = _ops.add(_ops.multiply(mm, m), _ops.multiply(flat_mean, 1.0 - m))
        new_mv = _ops.add(_ops.multiply(mv, m), _ops.multiply(unbiased, 1.0 - m))
        b.effects.append(_C.make_node(K.assign, [mm._node, new_mm._node], {}))
        b.effects.append(_C.make_node(K.assign, [mv._node, new_mv._node], {}))
    else:
        # (A train step on an empty batch, such as an empty ListNumpy, has no
        # statistics: it normalizes with the moving ones and leaves them as
        # they are, where the batch's mean of nothing would make them NaN.)
        centered = _ops.subtract(x, _ops.reshape(mm, bshape))
        variance = _ops.reshape(mv, bshape)
    y = _ops.multiply(centered, _ops.rsqrt(_ops.add(variance, float(epsilon))))
    if scale:
        y = _ops.multiply(y, _ops.reshape(var("gamma", gamma_initializer, 1.0, gamma_regularizer), bshape))
    if center:
        y = _ops.add(y, _ops.reshape(var("beta", beta_initializer, 0.0, beta_regularizer), bshape))
    return y


def layer_norm(inputs: Blob, center: bool = True, scale: bool = True, trainable: bool = True,
               begin_norm_axis: int = 1, begin_params_axis: int = -1, epsilon: float = 1e-5,
               name: str = "LayerNorm") -> Blob:
    """Normalizes over the axes from `begin_norm_axis` on; `<name>-gamma` and
    `<name>-beta` have the input's shape from `begin_params_axis` on.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        ...     return flow.layers.layer_norm(x, epsilon=0.0)   # gamma 1 and beta 0 at first
        >>> job(np.float32([[1, 3], [5, 5.5]])).tolist()
        [[-1.0, 1.0], [-1.0, 1.0]]
    """
    from .._core.variables import ConstantInitializer, get_variable
    api = "layer_norm"
    _float_input(inputs, api)
    x = inputs
    r = len(x.shape)
    na = _axis(x, begin_norm_axis, api, "begin_norm_axis")
    pa = _axis(x, begin_params_axis, api, "begin_params_axis")
    axes = list(range(na, r))
    mean = _ops.reduce_mean(x, axes, keepdims=True)
    centered = _ops.subtract(x, mean)
    variance = _ops.reduce_mean(_ops.square(centered), axes, keepdims=True)
    y = _ops.multiply(centered, _ops.rsqrt(_ops.add(variance, float(epsilon))))
    pshape = tuple(x.shape[pa:])
    if scale:
        y = _ops.multiply(y, get_variable(f"{name}-gamma", shape=pshape, dtype=x.dtype,
                                          initializer=ConstantInitializer(1.0), trainable=trainable))
    if center:
        y = _ops.add(y, get_variable(f"{name}-beta", shape=pshape, dtype=x.dtype,
                                     initializer=ConstantInitializer(0.0), trainable=trainable))
    return y
