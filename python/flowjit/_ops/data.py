"""Data ops inside a job (OneFlow's flow.data.*): decode_random.

decode_random is what OneFlow's model programs read instead of a data set
(``--use_synthetic_data`` in its CNN and Wide&Deep programs): a batch drawn
from an initializer, new at every call of the job. The draw is generated
code, like flow.random's: a counter-based uniform source whose offset the job
advances on every call (flowjit.random), shaped by the initializer.
"""
import numbers
from typing import Any, Optional, Sequence

from .. import _C
from .._core import dtypes as _dtypes, trace as _trace
from . import builders as _ops
from .._core.blob import Blob
from .._core.dtypes import DTypeLike

K = _C.OpKind


class _PerCallOps:
    """The op module an initializer builds with (`init.build(ops, ...)`),
    with its random sources replaced by ones that draw anew on every call."""

    def __init__(self, seed, api):
        self._seed, self._api, self._draws = seed, api, 0

    def __getattr__(self, name):
        return getattr(_ops, name)

    def _uniform(self, shape, dtype):
        from .. import random as _random
        self._draws += 1
        return _random._uniform(list(shape), dtype, (self._seed + 7919 * self._draws) & 0x7FFFFFFFFFFFFFFF,
                                self._api)

    def _normal(self, shape, dtype):
        # Box-Muller on two per-call uniform draws, in float64 so log(u) of the
        # smallest u stays finite.
        u1 = self._uniform(shape, _dtypes.float64)
        u2 = self._uniform(shape, _dtypes.float64)
        r = _ops.sqrt(_ops.multiply(_ops.log(_ops.subtract(1.0, u1)), -2.0))
        return _ops.multiply(r, _ops.cos(_ops.multiply(u2, 6.283185307179586)))

    def _random(self, op, shape, dtype, seed):
        if op == K.random_uniform:
            return self._uniform(shape, dtype)
        if op == K.random_normal:
            return _ops.cast(self._normal(shape, dtype), dtype)
        if op == K.truncated_normal:
            # Redraw where |z| > 2 (the truncation of flow.truncated_normal):
            # four candidates, all outside with probability 0.0455^4 < 5e-6,
            # the last clipped.
            z = self._normal(shape, dtype)
            for _ in range(3):
                z = _ops.where(_ops.less_equal(_ops.abs(z), 2.0), z, self._normal(shape, dtype))
            return _ops.cast(_ops.minimum(_ops.maximum(z, -2.0), 2.0), dtype)
        _trace.fail(NotImplementedError, f"{self._api}: the initializer draws from {op.name}, which has no "
                    "per-call form")


def decode_random(shape: Sequence[int], dtype: DTypeLike, batch_size: int = 1, initializer: Optional[Any] = None,
                  tick: Optional[Blob] = None, name: Optional[str] = None) -> Blob:
    """A ``(batch_size, *shape)`` blob of `dtype` drawn from `initializer`
    (default ``flow.random_uniform_initializer()``: uniform in [0, 1)), new
    at every call of the job, as OneFlow's DecodeRandom op. `tick` (an op
    this one waits for in OneFlow's graph) changes nothing here: each call
    draws once.

    Example:
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.data.decode_random(shape=(3,), dtype=flow.float32, batch_size=2,
        ...                                    initializer=flow.random_uniform_initializer(5, 6))
        >>> batch = job()
        >>> batch.shape, bool(((5 <= batch) & (batch < 6)).all())
        ((2, 3), True)
    """
    api = "data.decode_random"
    b = _trace.require_builder(f"flow.{api}")
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in shape):
        _trace.fail(TypeError, f"{api}: shape must be a list or tuple of ints >= 0, got {shape!r}")
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
        _trace.fail(ValueError, f"{api}: batch_size must be an int >= 1, got {batch_size!r}")
    if tick is not None and not isinstance(tick, Blob):
        _trace.fail(TypeError, f"{api}: tick must be a Blob or None, got {type(tick).__name__}")
    dt = _ops._dtype(dtype, api)
    from .._core import variables as _variables
    from ..random import _seed
    init = initializer if initializer is not None else _variables.RandomUniformInitializer()
    if not isinstance(init, _variables.Initializer):
        _trace.fail(TypeError, f"{api}: initializer must be a flow initializer (flow.random_uniform_initializer(), "
                    f"flow.zeros_initializer(), ...), got {init!r}")
    seed = _seed(b, getattr(init, "seed", None), api)
    out = init.build(_PerCallOps(seed, api), [int(batch_size)] + [int(d) for d in shape], dt, seed)
    if out.dtype is not dt:
        out = _ops.cast(out, dt)
    return _ops.identity(out, name=name) if name else out


# ---------------------------------------------------------------- OFRecord data sets

class OFRecordSource:
    """What ``flow.data.ofrecord_reader`` returns while tracing: the data
    set's part files and reading options. Its decoders
    (``OFRecordRawDecoder``) add fields; at the end of the trace the job
    gets one native reader (``_C.OFRecordReader``) that decodes them all on
    a thread of its own, a few batches ahead, and every call of the job
    takes the next batch."""

    def __init__(self, builder, files, batch_size, shuffle, shuffle_buffer, shuffle_after_epoch, seed, name):
        self.builder, self.files, self.batch_size = builder, files, batch_size
        self.shuffle, self.shuffle_buffer, self.shuffle_after_epoch = shuffle, shuffle_buffer, shuffle_after_epoch
        self.seed, self.name = seed, name
        self.fields = []   # (feature name, shape, dtype, truncate, image spec dict or None)
        self.params = []   # the job parameters the fields feed
        self.image_blobs = {}  # (feature, image spec) -> its blob: decoded once per call
        self.shape = (batch_size,)  # OneFlow's record blob: one record per row

    def add_field(self, builder, param_name, feature, shape, dtype, truncate=False, image=None):
        """A field the reader decodes into a (batch_size, *shape) parameter of
        the job, after the user's and the earlier fields'; returns its blob."""
        shape = tuple(int(d) for d in shape)
        index = len(builder.params)
        blob = builder.data_placeholder(index, param_name, [self.batch_size, *shape], dtype,
                                        "data.ofrecord_reader")
        self.fields.append((feature, shape, dtype, bool(truncate), image))
        self.params.append(index)
        return blob

    def open(self, data_split=None):
        """The native reader of this source (a new one per compiled job).
        With a job's data_split (the mirrored view: every process's devices,
        this process's first, its count) it decodes only this process's
        rows of each batch."""
        rows = (0, -1)
        if data_split:
            total, first, local = data_split
            per = self.batch_size // total
            rows = (first * per, (first + local) * per)
        return _C.OFRecordReader(self.files, self.batch_size, self.shuffle, self.shuffle_buffer,
                                 self.shuffle_after_epoch, self.seed,
                                 [{"name": n, "shape": list(s), "dtype": d.c, "truncate": t, "image": im}
                                  for n, s, d, t, im in self.fields],
                                 rows_begin=rows[0], rows_end=rows[1])

    def __repr__(self):
        return f"<OFRecord source {self.name}: {len(self.files)} part file(s), batch {self.batch_size}>"


def _part_files(api, ofrecord_dir, data_part_num, part_name_prefix, part_name_suffix_length):
    import os
    if not isinstance(ofrecord_dir, (str, os.PathLike)):
        _trace.fail(TypeError, f"{api}: ofrecord_dir must be a path, got {type(ofrecord_dir).__name__}")
    if not isinstance(data_part_num, numbers.Integral) or isinstance(data_part_num, bool) or data_part_num < 1:
        _trace.fail(ValueError, f"{api}: data_part_num must be an int >= 1, got {data_part_num!r}")
    if not isinstance(part_name_suffix_length, numbers.Integral) or part_name_suffix_length < -1:
        _trace.fail(ValueError, f"{api}: part_name_suffix_length must be -1 or an int >= 0, got "
                    f"{part_name_suffix_length!r}")
    files = []
    for i in range(int(data_part_num)):
        suffix = str(i) if part_name_suffix_length <= 0 else str(i).zfill(int(part_name_suffix_length))
        path = os.path.join(os.fspath(ofrecord_dir), f"{part_name_prefix}{suffix}")
        if not os.path.isfile(path):
            _trace.fail(FileNotFoundError, f"{api}: part file '{path}' does not exist (data_part_num="
                        f"{data_part_num}, part_name_prefix={part_name_prefix!r}, part_name_suffix_length="
                        f"{part_name_suffix_length})")
        if os.path.islink(path) and os.stat(os.path.dirname(os.path.abspath(path))).st_uid != os.geteuid():
            # A link planted in another user's folder must not make this
            # process read (and train on, and later save) its own files.
            _trace.fail(PermissionError, f"{api}: part file '{path}' is a symbolic link in a folder owned by "
                        "another user; copy the data set or link the folder itself")
        files.append(path)
    return files


def ofrecord_reader(ofrecord_dir: str, batch_size: int = 1, data_part_num: int = 1,
                    part_name_prefix: str = "part-", part_name_suffix_length: int = -1,
                    random_shuffle: bool = False, shuffle_buffer_size: int = 1024,
                    shuffle_after_epoch: bool = False, name: Optional[str] = None) -> OFRecordSource:
    """OneFlow's OFRecord reader inside a job: the part files
    ``ofrecord_dir/part-0 ... part-(data_part_num - 1)`` (suffixes
    zero-padded to ``part_name_suffix_length`` when it is positive), read in
    order or, with ``random_shuffle``, drawn at random from a buffer of
    ``shuffle_buffer_size`` records; ``shuffle_after_epoch`` reorders the
    part files every epoch. Decode its fields with
    :func:`OFRecordRawDecoder`; every call of the job takes the next
    ``batch_size`` records, looping over the epochs. The seed comes from
    ``flow.manual_seed`` (or the job and the reader's position in it)."""
    api = "data.ofrecord_reader"
    b = _trace.require_builder(f"flow.{api}")
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
        _trace.fail(ValueError, f"{api}: batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(shuffle_buffer_size, numbers.Integral) or shuffle_buffer_size < 1:
        _trace.fail(ValueError, f"{api}: shuffle_buffer_size must be an int >= 1, got {shuffle_buffer_size!r}")
    files = _part_files(api, ofrecord_dir, data_part_num, part_name_prefix, part_name_suffix_length)
    from ..random import _seed
    n = len(b.data_sources)
    src = OFRecordSource(b, files, int(batch_size), bool(random_shuffle), int(shuffle_buffer_size),
                         bool(shuffle_after_epoch), _seed(b, None, api), name or f"OFRecordReader_{n}")
    b.data_sources.append(src)
    return src


def OFRecordRawDecoder(input_blob: OFRecordSource, blob_name: str, shape: Sequence[int], dtype: DTypeLike,
                       dim1_varying_length: bool = False, truncate: bool = False,
                       auto_zero_padding: bool = False, name: Optional[str] = None) -> Blob:
    """The feature ``blob_name`` of every record of the batch as a
    ``(batch_size, *shape)`` blob of ``dtype`` (OneFlow's ofrecord_raw_decoder):
    a float/double/int32/int64 list of exactly numel(shape) values converted
    to dtype, or a bytes feature's bytes as int8 values. With ``truncate``
    (or the deprecated ``auto_zero_padding``) longer lists are cut and
    shorter ones padded with zeros. A record without the feature, or with
    another count, stops the job's next call with a ValueError naming the
    part file and the record."""
    api = "data.OFRecordRawDecoder"
    if not isinstance(input_blob, OFRecordSource):
        _trace.fail(TypeError, f"{api}: input_blob must be what flow.data.ofrecord_reader returned, got "
                    f"{type(input_blob).__name__}")
    b = _trace.require_builder(f"flow.{api}")
    if input_blob.builder is not b:
        _trace.fail(RuntimeError, f"{api}: the OFRecord reader belongs to another job")
    if not isinstance(blob_name, str):
        _trace.fail(TypeError, f"{api}: blob_name must be a str, got {type(blob_name).__name__}")
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in shape):
        _trace.fail(TypeError, f"{api}: shape must be a list or tuple of ints >= 0, got {shape!r}")
    if dim1_varying_length:
        _trace.fail(NotImplementedError, f"{api}: dim1_varying_length=True makes the blob's shape depend on "
                    "the data (a dynamic blob in OneFlow); flowjit compiles static shapes: use truncate=True "
                    "with the largest length instead")
    dt = _ops._dtype(dtype, api)
    src = input_blob
    return src.add_field(b, name or f"{src.name}-{blob_name}", blob_name, shape, dt, truncate or auto_zero_padding)


ofrecord_raw_decoder = OFRecordRawDecoder




# ---------------------------------------------------------------- images in OFRecords

class ImageSource:
    """What the OFRecord image decoders return while tracing: the encoded
    image feature of a reader and what to do to it (decode, random crop,
    resize, crop), all done by the reader's native thread. It becomes a
    uint8 (batch, height, width, 3) blob, once its size is fixed, through
    ``flow.image.CropMirrorNormalize`` (or ``flow.image.Resize`` to a fixed
    size, then any op)."""

    def __init__(self, src, blob_name, spec, api):
        self.src, self.blob_name, self.spec, self.api = src, blob_name, dict(spec), api

    def _with(self, api, **kw):
        spec = dict(self.spec)
        spec.update(kw)
        return ImageSource(self.src, self.blob_name, spec, api)

    def fixed_size(self):
        """(height, width) when the pipeline fixes it, else None."""
        s = self.spec
        if s.get("crop_h"):
            return int(s["crop_h"]), int(s["crop_w"])
        if s.get("resize_h"):
            return int(s["resize_h"]), int(s["resize_w"])
        return None

    def blob(self, name=None):
        """The decoded batch as a uint8 (batch, height, width, 3) blob, a
        parameter of the job the reader fills every call."""
        size = self.fixed_size()
        if size is None:
            _trace.fail(NotImplementedError, f"{self.api}: the images of '{self.blob_name}' have no fixed size "
                        "yet (each keeps its own): resize them to a fixed size (flow.image.Resize with "
                        "target_size=(width, height)) or crop them (flow.image.CropMirrorNormalize with "
                        "crop_h and crop_w); flowjit compiles static shapes")
        b = _trace.require_builder(f"flow.{self.api}")
        src = self.src
        key = (self.blob_name, tuple(sorted(self.spec.items())))
        if key in src.image_blobs:  # the same images read twice: one field, one random crop
            return src.image_blobs[key]
        blob = src.add_field(b, name or f"{src.name}-{self.blob_name}-image", self.blob_name,
                             (size[0], size[1], 3), _dtypes.uint8, image=dict(self.spec))
        src.image_blobs[key] = blob
        return blob

    def __repr__(self):
        return f"<images of '{self.blob_name}' from {self.src.name}: {self.spec}>"


class BytesSource:
    """What ``flow.data.OFRecordBytesDecoder`` returns while tracing: a
    bytes feature of each record, for ``flow.data.ImageDecoderRandomCropResize``
    (flowjit has no blob of variable-length bytes)."""

    def __init__(self, src, blob_name):
        self.src, self.blob_name = src, blob_name

    def __repr__(self):
        return f"<bytes of '{self.blob_name}' from {self.src.name}>"


def _color_space(api, color_space, channels=None):
    if channels is not None and channels != 3:
        _trace.fail(NotImplementedError, f"{api}: channels={channels!r}: flowjit decodes 3-channel images")
    cs = "BGR" if color_space is None else str(color_space).upper()
    if cs not in ("RGB", "BGR"):
        _trace.fail(NotImplementedError, f"{api}: color_space {color_space!r}: flowjit decodes RGB or BGR")
    return cs == "BGR"


def _reader_of(api, input_blob):
    if not isinstance(input_blob, OFRecordSource):
        _trace.fail(TypeError, f"{api}: input_blob must be what flow.data.ofrecord_reader returned, got "
                    f"{type(input_blob).__name__}")
    return input_blob


def _crop_spec(api, num_attempts, random_area, random_aspect_ratio):
    area = [0.08, 1.0] if random_area is None else [float(v) for v in random_area]
    ratio = [0.75, 4.0 / 3.0] if random_aspect_ratio is None else [float(v) for v in random_aspect_ratio]
    if len(area) != 2 or not 0 < area[0] <= area[1] <= 1:
        _trace.fail(ValueError, f"{api}: random_area must be [min, max] with 0 < min <= max <= 1, got {random_area!r}")
    if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
        _trace.fail(ValueError, f"{api}: random_aspect_ratio must be [min, max] with 0 < min <= max, got "
                    f"{random_aspect_ratio!r}")
    attempts = 10 if num_attempts is None else int(num_attempts)
    return {"random_crop": True, "area_min": area[0], "area_max": area[1], "ratio_min": ratio[0],
            "ratio_max": ratio[1], "attempts": attempts}


def OFRecordImageDecoder(input_blob: OFRecordSource, blob_name: str, color_space: str = "BGR",
                         name: Optional[str] = None) -> ImageSource:
    """The JPEG or PNG image in feature ``blob_name`` of every record, decoded
    to 3 channels in ``color_space`` (RGB or BGR) by the reader's native
    thread (libjpeg-turbo, libpng; a PNG's alpha is dropped and its 16-bit
    samples cut to 8, as OpenCV reads them for OneFlow). Give it a fixed
    size with ``flow.image.Resize``
    or ``flow.image.CropMirrorNormalize``."""
    api = "data.OFRecordImageDecoder"
    return ImageSource(_reader_of(api, input_blob), blob_name, {"bgr": _color_space(api, color_space)}, api)


def OFRecordImageDecoderRandomCrop(input_blob: OFRecordSource, blob_name: str, color_space: str = "BGR",
                                   num_attempts: int = 10, seed: Optional[int] = None,
                                   random_area: Sequence[float] = (0.08, 1.0),
                                   random_aspect_ratio: Sequence[float] = (0.75, 1.333333),
                                   name: Optional[str] = None) -> ImageSource:
    """As :func:`OFRecordImageDecoder`, then a random crop of each image
    (OneFlow's: an area in ``random_area`` of the image and an aspect ratio
    log-uniform in ``random_aspect_ratio``, ``num_attempts`` tries, else the
    whole image), new at every call. The numbers come from the reader's seed."""
    api = "data.OFRecordImageDecoderRandomCrop"
    spec = {"bgr": _color_space(api, color_space)}
    spec.update(_crop_spec(api, num_attempts, random_area, random_aspect_ratio))
    return ImageSource(_reader_of(api, input_blob), blob_name, spec, api)


def OFRecordBytesDecoder(input_blob: OFRecordSource, blob_name: str, name: Optional[str] = None) -> BytesSource:
    """The bytes feature ``blob_name`` of every record, for
    :func:`ImageDecoderRandomCropResize` (OneFlow's GPU image path). flowjit
    has no blob of variable-length bytes, so it feeds only that decoder."""
    return BytesSource(_reader_of("data.OFRecordBytesDecoder", input_blob), blob_name)


def ImageDecoderRandomCropResize(input_blob: BytesSource, target_width: int, target_height: int,
                                 num_attempts: Optional[int] = None, seed: Optional[int] = None,
                                 random_area: Optional[Sequence[float]] = None,
                                 random_aspect_ratio: Optional[Sequence[float]] = None,
                                 num_workers: Optional[int] = None, warmup_size: Optional[int] = None,
                                 max_num_pixels: Optional[int] = None, name: Optional[str] = None) -> Blob:
    """The JPEG or PNG images of a bytes feature decoded (RGB), randomly cropped as
    :func:`OFRecordImageDecoderRandomCrop` does and resized to
    ``target_height`` x ``target_width``: a uint8 (batch, height, width, 3)
    blob. ``num_workers``, ``warmup_size`` and ``max_num_pixels`` tune
    OneFlow's GPU decoder and change nothing here."""
    api = "data.ImageDecoderRandomCropResize"
    if not isinstance(input_blob, BytesSource):
        _trace.fail(TypeError, f"{api}: input_blob must be what flow.data.OFRecordBytesDecoder returned, got "
                    f"{type(input_blob).__name__}")
    for what, v in (("target_width", target_width), ("target_height", target_height)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
            _trace.fail(ValueError, f"{api}: {what} must be an int >= 1, got {v!r}")
    spec = {"bgr": False, "resize_h": int(target_height), "resize_w": int(target_width)}
    spec.update(_crop_spec(api, num_attempts, random_area, random_aspect_ratio))
    return ImageSource(input_blob.src, input_blob.blob_name, spec, api).blob(name)


ofrecord_image_decoder = OFRecordImageDecoder
ofrecord_image_decoder_random_crop = OFRecordImageDecoderRandomCrop
ofrecord_bytes_decoder = OFRecordBytesDecoder
image_decoder_random_crop_resize = ImageDecoderRandomCropResize
