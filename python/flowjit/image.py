"""flow.image: OneFlow's image ops on the images an OFRecord reader
decodes (``flow.data.OFRecordImageDecoder[RandomCrop]``).

``Resize`` runs on the reader's native thread (the images have their own
sizes until then); ``CropMirrorNormalize`` crops there too when the size is
not fixed yet, then mirrors, normalizes and lays out the batch in generated
code."""
import numbers
from typing import Optional, Sequence, Tuple, Union

from ._ops import array as _array, builders as _ops
from ._core import dtypes as _dtypes, trace as _trace
from ._ops.array import reverse
from ._core.blob import Blob
from ._ops.data import ImageSource
from ._core.dtypes import DTypeLike

__all__ = ["CropMirrorNormalize", "Resize", "crop_mirror_normalize", "resize"]


class _NotProduced:
    """An output of a OneFlow op that flowjit does not produce: using it says so."""

    def __init__(self, what):
        self._what = what

    def __getattr__(self, name):
        raise NotImplementedError(f"{self._what} is not produced by flowjit yet")

    def __repr__(self):
        return f"<{self._what}: not produced>"


def Resize(image: ImageSource, target_size: Union[int, Sequence[int], None] = None,
           min_size: Optional[int] = None, max_size: Optional[int] = None, keep_aspect_ratio: bool = False,
           resize_side: str = "shorter", channels: int = 3, dtype: Optional[DTypeLike] = None,
           interpolation_type: str = "auto", name: Optional[str] = None, color_space: Optional[str] = None,
           interp_type: Optional[str] = None, resize_shorter: int = 0, resize_x: int = 0,
           resize_y: int = 0) -> Union[Tuple[ImageSource, object, object], ImageSource]:
    """Resizes decoded images (bilinear, half-pixel centers) on the reader's
    thread: to ``target_size = (width, height)``, or with
    ``keep_aspect_ratio=True`` its shorter side to ``target_size``. Returns
    (images, scale, new_size) as OneFlow does; flowjit does not produce the
    scale and new_size outputs yet (using them raises). With OneFlow's
    deprecated ``resize_x``/``resize_y`` or ``resize_shorter``, the images alone."""
    api = "image.Resize"
    if not isinstance(image, ImageSource):
        _trace.fail(TypeError, f"{api}: image must be what a flow.data OFRecord image decoder returned, got "
                    f"{type(image).__name__}")
    if channels != 3:
        _trace.fail(NotImplementedError, f"{api}: channels={channels!r}: flowjit decodes 3-channel images")
    if dtype is not None and _ops._dtype(dtype, api) is not _dtypes.uint8:
        _trace.fail(NotImplementedError, f"{api}: flowjit resizes to uint8 images; cast the blob afterwards")
    if min_size is not None or max_size is not None:
        _trace.fail(NotImplementedError, f"{api}: min_size and max_size are not supported yet")
    legacy = bool(resize_x or resize_y or resize_shorter)
    if resize_x and resize_y:
        target_size, keep_aspect_ratio = (int(resize_x), int(resize_y)), False
    elif resize_shorter:
        target_size, keep_aspect_ratio, resize_side = int(resize_shorter), True, "shorter"
    if keep_aspect_ratio:
        if resize_side != "shorter":
            _trace.fail(NotImplementedError, f"{api}: resize_side={resize_side!r}: flowjit resizes the shorter "
                        "side")
        if not isinstance(target_size, numbers.Integral) or target_size < 1:
            _trace.fail(ValueError, f"{api}: with keep_aspect_ratio, target_size must be an int >= 1, got "
                        f"{target_size!r}")
        out = image._with(api, shorter=int(target_size), resize_h=0, resize_w=0)
    else:
        if (not isinstance(target_size, (list, tuple)) or len(target_size) != 2
                or not all(isinstance(v, numbers.Integral) and v >= 1 for v in target_size)):
            _trace.fail(ValueError, f"{api}: target_size must be (width, height) of ints >= 1, got "
                        f"{target_size!r}")
        out = image._with(api, resize_w=int(target_size[0]), resize_h=int(target_size[1]), shorter=0)
    if legacy:
        return out
    return out, _NotProduced("flow.image.Resize's scale output"), _NotProduced("flow.image.Resize's new_size output")


def CropMirrorNormalize(input_blob: Union[ImageSource, Blob], mirror_blob: Optional[Blob] = None,
                        color_space: str = "BGR", output_layout: str = "NCHW", crop_h: int = 0, crop_w: int = 0,
                        crop_pos_y: float = 0.5, crop_pos_x: float = 0.5, mean: Sequence[float] = (0.0,),
                        std: Sequence[float] = (1.0,), output_dtype: DTypeLike = _dtypes.float32,
                        name: Optional[str] = None) -> Blob:
    """Crops ``crop_h`` x ``crop_w`` at (``crop_pos_y``, ``crop_pos_x``) in
    [0, 1] of the room left (no crop when they are 0), mirrors the images
    whose ``mirror_blob`` element (int8, one per image, e.g. from
    ``flow.random.CoinFlip``) is nonzero, and normalizes each channel:
    ``(x - mean) / std``, in ``output_layout`` (NCHW or NHWC) and
    ``output_dtype``. On decoded images the crop runs on the reader's
    thread; the rest is generated code."""
    api = "image.CropMirrorNormalize"
    if output_layout not in ("NCHW", "NHWC"):
        _trace.fail(ValueError, f"{api}: output_layout must be 'NCHW' or 'NHWC', got {output_layout!r}")
    ch, cw = int(crop_h), int(crop_w)
    if isinstance(input_blob, ImageSource):
        img = input_blob
        if ch > 0 and cw > 0:
            img = img._with(api, crop_h=ch, crop_w=cw, pos_y=float(crop_pos_y), pos_x=float(crop_pos_x))
            ch = cw = 0
        x = img.blob()
    elif isinstance(input_blob, Blob):
        x = input_blob
        if len(x.shape) != 4:
            _trace.fail(ValueError, f"{api}: input_blob must be a (batch, height, width, channels) blob, got "
                        f"shape {tuple(x.shape)}")
    else:
        _trace.fail(TypeError, f"{api}: input_blob must be decoded images or a Blob, got {type(input_blob).__name__}")
    n, h, w, c = x.shape
    if ch > 0 and cw > 0:  # a crop of a blob whose size is fixed: a slice at a static position
        if ch > h or cw > w:
            _trace.fail(ValueError, f"{api}: a {ch}x{cw} crop of {h}x{w} images")
        y0, x0 = int((h - ch) * float(crop_pos_y)), int((w - cw) * float(crop_pos_x))  # OneFlow truncates
        x = _array.slice(x, [0, y0, x0, 0], [n, ch, cw, c])
    dt = _ops._dtype(output_dtype, api)
    y = _ops.cast(x, dt if dt in _dtypes.FLOATS else _dtypes.float32)
    if mirror_blob is not None:
        if not isinstance(mirror_blob, Blob) or tuple(mirror_blob.shape) != (n,):
            _trace.fail(ValueError, f"{api}: mirror_blob must be a ({n},) blob (one flag per image), got "
                        f"{getattr(mirror_blob, 'shape', mirror_blob)!r}")
        flip = _ops.reshape(_ops.not_equal(mirror_blob, _ops._scalar(0, mirror_blob.dtype, api)), [n, 1, 1, 1])
        y = _ops.where(_ops.broadcast_to(flip, list(y.shape)), reverse(y, axis=2), y)
    mean = [float(v) for v in (mean if isinstance(mean, (list, tuple)) else [mean])]
    std = [float(v) for v in (std if isinstance(std, (list, tuple)) else [std])]
    if len(mean) not in (1, c) or len(std) not in (1, c):
        _trace.fail(ValueError, f"{api}: mean and std take 1 or {c} values, got {len(mean)} and {len(std)}")
    y = _ops.divide(_ops.subtract(y, _per_channel(mean, c, y.dtype)), _per_channel(std, c, y.dtype))
    if output_layout == "NCHW":
        y = _ops.transpose(y, [0, 3, 1, 2])
    if dt is not y.dtype:
        y = _ops.cast(y, dt)
    return y if name is None else _ops.identity(y, name=name)


def _per_channel(values, c, dtype):
    """A (c,) blob of per-channel values (one value: the same for every channel)."""
    if len(values) == 1:
        return _ops.constant(values[0], dtype, [c])
    return _array.concat([_ops.constant(v, dtype, [1]) for v in values], axis=0)


resize = Resize
crop_mirror_normalize = CropMirrorNormalize
