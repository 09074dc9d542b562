"""Resampling of images: flow.layers.upsample_2d (nearest and bilinear) and
flow.nn.PixelShuffle / PixelShufflev2, written with views, iota arithmetic
and matmuls, so their gradients come from autodiff."""
import numbers
from typing import Optional, Sequence, Union

from .._core import dtypes as _dtypes, trace as _trace
from . import builders as _ops
from .._core.blob import Blob
from .composite import floating


def _positive_int(v, api, what):
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
        _trace.fail(ValueError, f"{api}: {what} must be a positive int, got {v!r}")
    return int(v)


def _interp_matrix(n_in, scale, align_corners, dtype, api):
    """The (n_in * scale, n_in) matrix of bilinear weights along one axis:
    half-pixel source coordinates (i + 0.5) / scale - 0.5 clamped at 0, or
    i * (n_in - 1) / (n_out - 1) with align_corners."""
    n_out = n_in * scale
    o = _ops.make(_ops.K.iota, [], {"shape": [n_out, n_in], "dtype": dtype.c, "axis": 0}, api=api)
    i = _ops.make(_ops.K.iota, [], {"shape": [n_out, n_in], "dtype": dtype.c, "axis": 1}, api=api)
    if align_corners:
        src = _ops.multiply(o, (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    else:
        src = _ops.maximum(_ops.subtract(_ops.multiply(_ops.add(o, 0.5), 1.0 / scale), 0.5), 0.0)
    lo = _ops.minimum(_ops.floor(src), float(n_in - 1))
    hi = _ops.minimum(_ops.add(lo, 1.0), float(n_in - 1))
    lam = _ops.subtract(src, lo)
    zero = _ops.zeros([n_out, n_in], dtype=dtype)
    w_lo = _ops.where(_ops.equal(i, lo), _ops.subtract(1.0, lam), zero)
    w_hi = _ops.where(_ops.equal(i, hi), lam, zero)
    return _ops.add(w_lo, w_hi)


def upsample_2d(x: Blob, size: Union[int, Sequence[int]] = (2, 2), align_corners: bool = False,
                data_format: str = "NCHW", interpolation: str = "nearest", name: str = "Upsample2D") -> Blob:
    """Upsamples the spatial dims of a 4-D x by the integer factors `size`
    (height, width): 'nearest' repeats each pixel, 'bilinear' interpolates with
    half-pixel centers (or with the corners aligned).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 1, 1, 2))) -> tp.Numpy:
        ...     return flow.layers.upsample_2d(x, size=2)
        >>> job(np.float32([[[[1, 2]]]])).tolist()
        [[[[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]]]]
    """
    api = "upsample_2d"
    floating(x, api, "x")
    if isinstance(size, (list, tuple)) and len(size) == 2:
        sh, sw = (_positive_int(v, api, "size") for v in size)
    else:
        sh = sw = _positive_int(size, api, "size")
    if interpolation not in ("nearest", "bilinear"):
        _trace.fail(ValueError, f"{api}: interpolation must be 'nearest' or 'bilinear', got {interpolation!r}")
    if interpolation == "nearest" and align_corners:
        _trace.fail(ValueError, f"{api}: 'nearest' interpolation has no align_corners")
    if not isinstance(data_format, str) or data_format.upper() not in ("NCHW", "NHWC"):
        _trace.fail(ValueError, f"{api}: data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    if len(x.shape) != 4:
        _trace.fail(ValueError, f"{api}: x must have rank 4, got shape {tuple(x.shape)}")
    nhwc = data_format.upper() == "NHWC"
    if nhwc:
        x = _ops.transpose(x, [0, 3, 1, 2])
    n, c, h, w = x.shape
    if interpolation == "nearest":
        y = _ops.broadcast_to(_ops.reshape(x, [n, c, h, 1, w, 1]), [n, c, h, sh, w, sw])
        y = _ops.reshape(y, [n, c, h * sh, w * sw])
    else:
        dt = x.dtype if x.dtype in _dtypes.FLOATS else _dtypes.float32
        ah = _interp_matrix(h, sh, align_corners, dt, api)
        aw = _interp_matrix(w, sw, align_corners, dt, api)
        y = _ops.matmul(ah, _ops.matmul(x, aw, transpose_b=True))
    if nhwc:
        y = _ops.transpose(y, [0, 2, 3, 1])
    return _ops.identity(y, name=name) if name else y


def pixel_shufflev2(input: Blob, h_upscale_factor: int, w_upscale_factor: int,  # noqa: A002 - OneFlow's names
                    name: Optional[str] = None) -> Blob:
    """Rearranges (N, C * h * w, H, W) into (N, C, H * h, W * w): channel
    c * h * w + i * w + j becomes pixel (y * h + i, x * w + j) of channel c.

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 2, 1, 1))) -> tp.Numpy:
        ...     return flow.nn.pixel_shufflev2(x, h_upscale_factor=1, w_upscale_factor=2)
        >>> job(np.float32([1, 2]).reshape(1, 2, 1, 1)).tolist()
        [[[[1.0, 2.0]]]]
    """
    api = "PixelShufflev2"
    floating(input, api, "input")
    fh = _positive_int(h_upscale_factor, api, "h_upscale_factor")
    fw = _positive_int(w_upscale_factor, api, "w_upscale_factor")
    if len(input.shape) != 4:
        _trace.fail(ValueError, f"{api}: input must have rank 4 (N, C, H, W), got shape {tuple(input.shape)}")
    n, c, h, w = input.shape
    if c % (fh * fw):
        _trace.fail(ValueError, f"{api}: the {c} channels are not divisible by h_upscale_factor * "
                    f"w_upscale_factor = {fh * fw}")
    y = _ops.reshape(input, [n, c // (fh * fw), fh, fw, h, w])
    y = _ops.transpose(y, [0, 1, 4, 2, 5, 3])
    return _ops.reshape(y, [n, c // (fh * fw), h * fh, w * fw], name=name)


def pixel_shuffle(input: Blob, upscale_factor: int, name: Optional[str] = None) -> Blob:  # noqa: A002
    """:func:`pixel_shufflev2` with one factor r for both axes: (N, C r^2, H, W)
    to (N, C, H r, W r).

    Example:
        >>> @flow.global_function()
        ... def job(x: tp.Numpy.Placeholder((1, 4, 1, 1))) -> tp.Numpy:
        ...     return flow.nn.pixel_shuffle(x, upscale_factor=2)
        >>> job(np.float32([1, 2, 3, 4]).reshape(1, 4, 1, 1)).tolist()
        [[[[1.0, 2.0], [3.0, 4.0]]]]
    """
    return pixel_shufflev2(input, upscale_factor, upscale_factor, name=name)
