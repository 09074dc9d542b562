"""Images in OFRecord data sets ([zoo]): JPEG decoding (libjpeg-turbo), the
random crop and the resizes on the reader's native thread, and
flow.image.CropMirrorNormalize in generated code, against PIL's decoder and
a numpy bilinear resize with half-pixel centers (as OpenCV's INTER_LINEAR,
which OneFlow's image ops use). Pixels may differ by 1 (rounding of halves)."""
import os
from typing import Tuple

import numpy as np
import pytest

import flowjit as flow
import flowjit.ofrecord as ofr
import flowjit.typing as tp

Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.skipif(not flow._C.ofrecord_jpeg_support(),
                                reason="this flowjit was built without libjpeg-turbo (libturbojpeg0-dev)")


def _bilinear(a, oh, ow):
    h, w, _ = a.shape
    ys = np.maximum((np.arange(oh) + 0.5) * h / oh - 0.5, 0)
    xs = np.maximum((np.arange(ow) + 0.5) * w / ow - 0.5, 0)
    y0, x0 = np.minimum(ys.astype(int), h - 1), np.minimum(xs.astype(int), w - 1)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    ay, ax = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    a = a.astype(np.float64)
    v = (1 - ay) * ((1 - ax) * a[y0][:, x0] + ax * a[y0][:, x1]) + ay * ((1 - ax) * a[y1][:, x0] + ax * a[y1][:, x1])
    return np.clip(np.round(v), 0, 255)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    files = []
    for c in ("cat", "dog"):
        os.makedirs(root / "imgs" / c)
        for i in range(3):
            h, w = rng.integers(20, 40, 2)
            a = (rng.random((h, w, 3)) * 255).astype(np.uint8)
            path = root / "imgs" / c / f"{i}.jpg"
            Image.fromarray(a).save(path, quality=95)
            files.append(path)
    ofr.write_image_folder(str(root / "imgs"), str(root / "ofr"), parts=1)
    return str(root / "ofr"), files


def test_decode_resize_shorter_and_center_crop_match_pil(dataset):
    d, files = dataset
    flow.clear_default_session()

    @flow.global_function()
    def val() -> Tuple[tp.Numpy, tp.Numpy]:
        r = flow.data.ofrecord_reader(d, batch_size=6)
        img = flow.data.OFRecordImageDecoder(r, "encoded", color_space="RGB")
        label = flow.data.OFRecordRawDecoder(r, "class/label", shape=(), dtype=flow.int32)
        rsz = flow.image.Resize(img, resize_side="shorter", keep_aspect_ratio=True, target_size=20)
        out = flow.image.CropMirrorNormalize(rsz[0], color_space="RGB", output_layout="NHWC", crop_h=16,
                                             crop_w=16, output_dtype=flow.float)
        return out, label

    out, label = val()
    assert out.shape == (6, 16, 16, 3) and out.dtype == np.float32 and label.tolist() == [0, 0, 0, 1, 1, 1]
    for i, path in enumerate(files):
        a = np.asarray(Image.open(path).convert("RGB"))
        h, w, _ = a.shape
        s = 20 / min(h, w)
        oh, ow = max(1, round(h * s)), max(1, round(w * s))
        y0, x0 = int((oh - 16) * 0.5), int((ow - 16) * 0.5)  # OneFlow truncates the offset
        ref = _bilinear(a, oh, ow)[y0:y0 + 16, x0:x0 + 16]
        assert np.abs(out[i] - ref).max() <= 1, path


def test_random_crop_resize_mirror_normalize(dataset):
    d, _ = dataset
    flow.clear_default_session()
    mean, std = [10.0, 20.0, 30.0], [2.0, 4.0, 8.0]

    @flow.global_function()
    def train(flip: tp.Numpy.Placeholder((6,), dtype=flow.int8)) -> Tuple[tp.Numpy, tp.Numpy]:
        r = flow.data.ofrecord_reader(d, batch_size=6)
        img = flow.data.OFRecordImageDecoderRandomCrop(r, "encoded", color_space="RGB")
        rsz = flow.image.Resize(img, target_size=(12, 10))[0]  # (width, height)
        raw = flow.image.CropMirrorNormalize(rsz, output_layout="NHWC", color_space="RGB")
        out = flow.image.CropMirrorNormalize(rsz, mirror_blob=flip, color_space="RGB", mean=mean, std=std)
        return raw, out

    flip = np.array([0, 1, 0, 1, 1, 0], np.int8)
    raw, out = train(flip)
    assert raw.shape == (6, 10, 12, 3) and out.shape == (6, 3, 10, 12)  # NCHW by default
    assert raw.min() >= 0 and raw.max() <= 255
    want = raw.copy()
    want[flip != 0] = want[flip != 0][:, :, ::-1]
    want = ((want - np.array(mean)) / np.array(std)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-5)
    raw2, _ = train(flip)
    assert not np.array_equal(raw, raw2)  # new crops every call (the data set loops)


def test_the_bytes_path_crops_and_resizes(dataset):
    d, _ = dataset
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(d, batch_size=3)
        enc = flow.data.OFRecordBytesDecoder(r, "encoded")
        return flow.data.ImageDecoderRandomCropResize(enc, target_width=8, target_height=6)

    out = job()
    assert out.shape == (3, 6, 8, 3) and out.dtype == np.uint8


def test_errors_say_what_is_missing(dataset, tmp_path):
    d, _ = dataset
    flow.clear_default_session()

    @flow.global_function()
    def no_size() -> tp.Numpy:
        r = flow.data.ofrecord_reader(d, batch_size=2)
        return flow.image.CropMirrorNormalize(flow.data.OFRecordImageDecoder(r, "encoded"))

    with pytest.raises(NotImplementedError, match=r"have no fixed size yet"):
        no_size()
    ofr.write(tmp_path, [{"encoded": b"not a jpeg"}])
    flow.clear_default_session()

    @flow.global_function()
    def bad() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path), batch_size=1)
        img = flow.image.Resize(flow.data.OFRecordImageDecoder(r, "encoded"), target_size=(4, 4))[0]
        return flow.image.CropMirrorNormalize(img)

    with pytest.raises(ValueError, match=r"feature 'encoded' of '.*part-0' record 0 is not a JPEG or PNG image"):
        bad()
    flow.clear_default_session()

    @flow.global_function()
    def scale() -> tp.Numpy:
        r = flow.data.ofrecord_reader(d, batch_size=1)
        _, s, _ = flow.image.Resize(flow.data.OFRecordImageDecoder(r, "encoded"), target_size=(4, 4))
        return s.shape

    with pytest.raises(NotImplementedError, match=r"scale output is not produced by flowjit yet"):
        scale()


def test_png_images_of_every_kind_decode_as_opencv_reads_them(tmp_path):
    """RGB, gray, palette (with and without transparency), RGBA and 16-bit
    PNGs: 8-bit RGB (or BGR) pixels, gray repeated, alpha dropped (not
    composited) and 16-bit samples cut to their high byte, as OpenCV's
    imdecode(IMREAD_COLOR) gives OneFlow's decoder; PIL is the reference."""
    from flowjit import _C
    if not _C.ofrecord_png_support():
        pytest.skip("this flowjit was built without libpng")
    rng = np.random.default_rng(1)
    h, w = 7, 9
    rgb = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    rgba = np.concatenate([rgb, (rng.random((h, w, 1)) * 255).astype(np.uint8)], axis=2)
    gray = rgb[..., 0]
    wide = (rng.random((h, w, 3)) * 65535).astype(np.uint16)
    images = {
        "rgb": (Image.fromarray(rgb), rgb),
        "rgba": (Image.fromarray(rgba, "RGBA"), rgb),
        "gray": (Image.fromarray(gray), np.repeat(gray[..., None], 3, axis=2)),
        "palette": (Image.fromarray(rgb).quantize(16), None),
        "gray16": (Image.fromarray((gray.astype(np.uint16) * 257)), np.repeat(gray[..., None], 3, axis=2)),
    }
    pal_t = Image.fromarray(rgb).quantize(8)
    pal_t.info["transparency"] = 0
    images["palette_trns"] = (pal_t, None)
    records, refs = [], []
    for name, (img, ref) in images.items():
        path = tmp_path / f"{name}.png"
        img.save(path, **({"transparency": 0} if name == "palette_trns" else {}))
        if ref is None:
            ref = np.asarray(Image.open(path).convert("RGB"))
        records.append({"encoded": path.read_bytes()})
        refs.append(ref)
    # 16-bit RGB (PIL cannot write it): the high bytes.
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + wide[y].astype(">u2").tobytes() for y in range(h))
    png16 = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
             chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    records.append({"encoded": png16})
    refs.append((wide >> 8).astype(np.uint8))
    ofr.write(tmp_path / "ofr", records)
    n = len(records)
    for space in ("RGB", "BGR"):
        flow.clear_default_session()

        @flow.global_function()
        def decode() -> tp.Numpy:
            r = flow.data.ofrecord_reader(str(tmp_path / "ofr"), batch_size=n)
            img = flow.data.OFRecordImageDecoder(r, "encoded", color_space=space)
            rsz = flow.image.Resize(img, target_size=(w, h))[0]  # (width, height): the same size
            return flow.image.CropMirrorNormalize(rsz, color_space=space, output_layout="NHWC",
                                                  output_dtype=flow.float)

        out = decode()
        for i, ref in enumerate(refs):
            want = ref if space == "RGB" else ref[..., ::-1]
            np.testing.assert_array_equal(out[i], want.astype(np.float32), err_msg=f"{space} image {i}")
    # A damaged PNG names the record and what libpng said.
    ofr.write(tmp_path / "bad", [{"encoded": png16[:60]}])
    flow.clear_default_session()

    @flow.global_function()
    def bad() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path / "bad"), batch_size=1)
        img = flow.image.Resize(flow.data.OFRecordImageDecoder(r, "encoded"), target_size=(4, 4))[0]
        return flow.image.CropMirrorNormalize(img)

    with pytest.raises(ValueError, match=r"record 0 is not a PNG image flowjit can decode \(.+\)"):
        bad()


def _crop_reader(d, rows=(0, -1)):
    field = {"name": "encoded", "shape": [10, 12, 3], "dtype": flow.uint8.c,
             "image": {"random_crop": True, "resize_h": 10, "resize_w": 12}}
    return flow._C.OFRecordReader([os.path.join(d, "part-0")], 4, True, 3, False, 5, [field],
                                  rows_begin=rows[0], rows_end=rows[1])


def test_a_reader_of_some_rows_decodes_the_same_crops(dataset):
    """A reader that decodes rows [1, 3) of each batch (a process's share in
    the mirrored view) gives exactly those rows of the whole batch, random
    crops included: a record's crop comes from its own place in the stream,
    not from the images decoded before it."""
    d, _ = dataset
    whole, part = _crop_reader(d), _crop_reader(d, (1, 3))
    for _ in range(4):  # 16 records: past the 6 of the data set, and reshuffled
        (a,), (b,) = whole.next(), part.next()
        assert b.shape == (2, 10, 12, 3)
        np.testing.assert_array_equal(b, a[1:3])
    assert whole.records_read >= 16 and part.records_read >= 16
    for bad in ((3, 3), (-1, 2), (0, 5)):
        with pytest.raises(ValueError, match="rows to decode"):
            _crop_reader(d, bad)
