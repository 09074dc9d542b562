"""flow.data: ops that produce a job's data inside it (``decode_random``), and
MNIST and Fashion-MNIST loaders that return pre-batched numpy arrays, like
``oneflow.data``."""

import gzip
import hashlib
import http.client
import operator
import os
import tempfile
import urllib.request
import zipfile
import zlib

import numpy as np

from ._ops.data import (ImageDecoderRandomCropResize, OFRecordBytesDecoder, OFRecordImageDecoder,
                        OFRecordImageDecoderRandomCrop, OFRecordRawDecoder, decode_random,
                        image_decoder_random_crop_resize, ofrecord_bytes_decoder, ofrecord_image_decoder,
                        ofrecord_image_decoder_random_crop, ofrecord_raw_decoder, ofrecord_reader)
from ._ops.megatron import MegatronGPTMMapDataLoader, megatron_gpt_mmap_data_loader

__all__ = [
    "decode_random",
    "ofrecord_reader",
    "OFRecordRawDecoder",
    "ofrecord_raw_decoder",
    "OFRecordBytesDecoder",
    "ofrecord_bytes_decoder",
    "OFRecordImageDecoder",
    "ofrecord_image_decoder",
    "OFRecordImageDecoderRandomCrop",
    "ofrecord_image_decoder_random_crop",
    "ImageDecoderRandomCropResize",
    "image_decoder_random_crop_resize",
    "megatron_gpt_mmap_data_loader",
    "MegatronGPTMMapDataLoader",
    "load_mnist",
    "load_fashion_mnist",
    "DatasetNotFoundError",
    "ChecksumError",
    "MNIST_URL",
    "MNIST_SHA256",
]

MNIST_URL = "https://oneflow-public.oss-cn-beijing.aliyuncs.com/datasets/mnist.npz"
MNIST_SHA256 = "63d4344077849053dc3036b247fa012b2b381de53fd055a66b539dffd76cf08e"

DATA_DIR_ENV = "FLOWJIT_DATA_DIR"
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
DEBIAN_FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"

NPZ_NAME = "mnist.npz"
IDX_NAMES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
DATA_FORMATS = ("NCHW", "NHWC")

_IMAGE_MAGIC = 2051
_LABEL_MAGIC = 2049
_IMAGE_SIZE = (28, 28)
_NUM_CLASSES = 10
_HASHES_BY_HEX_LENGTH = {32: "md5", 40: "sha1", 64: "sha256"}
_DOWNLOAD_TIMEOUT_S = 60


class DatasetNotFoundError(FileNotFoundError):
    """A data set is neither on disk in any searched directory nor downloadable."""


class ChecksumError(ValueError):
    """A downloaded file does not match the expected hash; the file has been deleted."""


def load_mnist(
    train_batch_size=100,
    test_batch_size=100,
    data_format="NCHW",
    url=MNIST_URL,
    hash_check=MNIST_SHA256,
    out_dir=".",
):
    """Load MNIST as batched arrays, downloading ``mnist.npz`` only if no local copy exists.

    Looks, in this order, in ``out_dir``, ``$FLOWJIT_DATA_DIR``,
    ``$FLOWJIT_DATA_DIR/mnist`` and ``~/.cache/flowjit/datasets/mnist`` for
    ``mnist.npz`` (arrays ``x_train, y_train, x_test, y_test``) or the four IDX
    files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (each plain or with
    ``.gz``).  In a directory holding both, ``mnist.npz`` wins.  When nothing is
    found, ``url`` is downloaded to ``out_dir/mnist.npz`` (via a temporary file
    and an atomic rename) and checked against ``hash_check``.

    Args:
        train_batch_size: samples per training batch (positive int).
        test_batch_size: samples per test batch (positive int).
        data_format: ``"NCHW"`` or ``"NHWC"``.
        url: where to download ``mnist.npz`` from; ``None`` disables downloading.
        hash_check: hex digest of the download, md5 (32 digits), sha1 (40) or
            sha256 (64, OneFlow's default); ``None`` or ``""`` skips the check.  Files
            already on disk are validated structurally, not hashed.
        out_dir: first directory searched and where a download is saved.

    Returns:
        ``(train_images, train_labels), (test_images, test_labels)``: images are
        C-contiguous float32 in ``[0, 1]`` (pixels / 255) of shape
        ``(num_batches, batch, 1, 28, 28)`` for NCHW or
        ``(num_batches, batch, 28, 28, 1)`` for NHWC; labels are C-contiguous
        int32 of shape ``(num_batches, batch)``.  Samples that do not fill a
        whole batch are dropped.

    Raises:
        ValueError: bad arguments, or corrupt data (the message names the file).
        TypeError: a batch size that is not an integer.
        ChecksumError: the download does not match ``hash_check`` (deleted).
        DatasetNotFoundError: no local copy and the download failed; the
            message lists the files to provide and where to put them.
    """
    train_batch_size = _check_batch_size(train_batch_size, "train_batch_size")
    test_batch_size = _check_batch_size(test_batch_size, "test_batch_size")
    data_format = _check_data_format(data_format)
    if hash_check:
        _hash_algorithm(hash_check)
    out_dir = os.path.abspath(os.fspath(out_dir))

    search_dirs = _mnist_search_dirs(out_dir)
    train, test = _find_mnist(search_dirs)
    if train is None:
        destination = os.path.join(out_dir, NPZ_NAME)
        if not url:
            raise DatasetNotFoundError(
                _mnist_missing_message(search_dirs, None, "downloading is disabled (url=None)")
            )
        try:
            _download(url, destination, hash_check)
        except (OSError, http.client.HTTPException) as exc:
            raise DatasetNotFoundError(
                _mnist_missing_message(search_dirs, url, "downloading %s failed: %s" % (url, exc))
            ) from exc
        train, test = _read_npz(destination)
    return (
        _batch(train, train_batch_size, data_format, "train_batch_size"),
        _batch(test, test_batch_size, data_format, "test_batch_size"),
    )


def load_fashion_mnist(
    train_batch_size=100, test_batch_size=100, data_format="NCHW", data_dir=None
):
    """Load Fashion-MNIST from local IDX files as batched arrays, without any network access.

    Reads ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each plain or
    with ``.gz``) from ``data_dir`` if given; otherwise from
    ``$FLOWJIT_DATA_DIR/fashion-mnist`` or, failing that, Debian's
    ``/usr/share/datasets/fashion-mnist`` (``apt-get install dataset-fashion-mnist``).

    Args:
        train_batch_size: samples per training batch (positive int).
        test_batch_size: samples per test batch (positive int).
        data_format: ``"NCHW"`` or ``"NHWC"``.
        data_dir: directory holding the four IDX files; overrides the search.

    Returns:
        The same structure, dtypes and shapes as :func:`load_mnist`.

    Raises:
        ValueError: bad arguments, or corrupt data (the message names the file).
        TypeError: a batch size that is not an integer.
        DatasetNotFoundError: the files are in none of the searched
            directories; the message names each path tried and the apt package.
    """
    train_batch_size = _check_batch_size(train_batch_size, "train_batch_size")
    test_batch_size = _check_batch_size(test_batch_size, "test_batch_size")
    data_format = _check_data_format(data_format)

    search_dirs = _fashion_search_dirs(data_dir)
    problems = []
    for label, directory in search_dirs:
        paths, problem = _find_idx_files(directory)
        if paths is not None:
            train, test = _read_idx_set(paths)
            return (
                _batch(train, train_batch_size, data_format, "train_batch_size"),
                _batch(test, test_batch_size, data_format, "test_batch_size"),
            )
        problems.append("  %s (%s): %s" % (directory, label, problem))
    raise DatasetNotFoundError(
        "Fashion-MNIST was not found. Looked for the four IDX files %s in:\n%s\n"
        "Install it with `apt-get install %s` (Debian/Ubuntu; files go to %s), "
        "pass data_dir=DIR, or put the files in $%s/fashion-mnist."
        % (
            ", ".join(name + "[.gz]" for name in IDX_NAMES),
            "\n".join(problems),
            DEBIAN_FASHION_MNIST_PACKAGE,
            DEBIAN_FASHION_MNIST_DIR,
            DATA_DIR_ENV,
        )
    )


def _check_batch_size(value, name):
    if isinstance(value, bool):
        raise TypeError("%s must be an integer, got %r" % (name, value))
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an integer, got %r" % (name, value)) from None
    if value <= 0:
        raise ValueError("%s must be positive, got %d" % (name, value))
    return value


def _check_data_format(data_format):
    normalized = data_format.upper() if isinstance(data_format, str) else data_format
    if normalized not in DATA_FORMATS:
        raise ValueError(
            "data_format must be one of %s, got %r"
            % (" or ".join(map(repr, DATA_FORMATS)), data_format)
        )
    return normalized


def _hash_algorithm(hex_digest):
    try:
        int(hex_digest, 16)
        name = _HASHES_BY_HEX_LENGTH[len(hex_digest)]
    except (TypeError, ValueError, KeyError):
        raise ValueError(
            "hash_check must be a hex md5 (32 digits), sha1 (40) or sha256 (64) digest, got %r"
            % (hex_digest,)
        ) from None
    return name


def _user_cache_dir():
    return os.path.join(os.path.expanduser("~"), ".cache", "flowjit", "datasets", "mnist")


def _dedupe(search_dirs):
    seen = set()
    unique = []
    for label, directory in search_dirs:
        key = os.path.realpath(directory)
        if key not in seen:
            seen.add(key)
            unique.append((label, directory))
    return unique


def _mnist_search_dirs(out_dir):
    dirs = [("out_dir", out_dir)]
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        env = os.path.abspath(env)
        dirs.append(("$" + DATA_DIR_ENV, env))
        dirs.append(("$" + DATA_DIR_ENV + "/mnist", os.path.join(env, "mnist")))
    dirs.append(("user cache", _user_cache_dir()))
    return _dedupe(dirs)


def _fashion_search_dirs(data_dir):
    if data_dir is not None:
        return [("data_dir", os.path.abspath(os.fspath(data_dir)))]
    dirs = []
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        env = os.path.abspath(env)
        dirs.append(("$" + DATA_DIR_ENV + "/fashion-mnist", os.path.join(env, "fashion-mnist")))
    dirs.append(("Debian package " + DEBIAN_FASHION_MNIST_PACKAGE, DEBIAN_FASHION_MNIST_DIR))
    return _dedupe(dirs)


def _find_idx_files(directory):
    """Return (paths, None) when all four IDX files are in directory, else (None, reason)."""
    if not os.path.isdir(directory):
        return None, "directory does not exist"
    paths = []
    missing = []
    for name in IDX_NAMES:
        for candidate in (name, name + ".gz"):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                paths.append(path)
                break
        else:
            missing.append(name + "[.gz]")
    if missing:
        return None, "missing " + ", ".join(missing)
    return paths, None


def _find_mnist(search_dirs):
    for _, directory in search_dirs:
        npz = os.path.join(directory, NPZ_NAME)
        if os.path.isfile(npz):
            return _read_npz(npz)
        paths, _ = _find_idx_files(directory)
        if paths is not None:
            return _read_idx_set(paths)
    return None, None


def _mnist_missing_message(search_dirs, url, reason):
    lines = [
        "MNIST was not found locally and %s." % reason,
        "Provide it offline by putting EITHER",
        "  %s  (numpy archive with uint8 arrays x_train, y_train, x_test, y_test)" % NPZ_NAME,
        "OR all four IDX files (plain or gzipped with a .gz suffix):",
    ]
    lines += ["  " + name + "[.gz]" for name in IDX_NAMES]
    lines.append("into one of these directories (searched in this order):")
    lines += ["  %s  (%s)" % (directory, label) for label, directory in search_dirs]
    if not os.environ.get(DATA_DIR_ENV):
        lines.append("  (or set %s=DIR to also search DIR and DIR/mnist)" % DATA_DIR_ENV)
    if url:
        lines.append("%s can be fetched on a machine with network access from %s" % (NPZ_NAME, url))
    lines.append(
        "Offline alternative on Debian/Ubuntu: `apt-get install %s`, then "
        "flow.data.load_fashion_mnist() returns the same format (10 classes, 28x28)."
        % DEBIAN_FASHION_MNIST_PACKAGE
    )
    return "\n".join(lines)


def _download(url, destination, hash_check):
    """Fetch url to destination through a temporary file, verify it, then rename atomically."""
    directory = os.path.dirname(destination)
    os.makedirs(directory, exist_ok=True)
    digest = hashlib.new(_hash_algorithm(hash_check)) if hash_check else None
    fd, tmp_path = tempfile.mkstemp(
        prefix="." + os.path.basename(destination) + ".", suffix=".part", dir=directory
    )
    try:
        with os.fdopen(fd, "wb") as out:
            with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
                while True:
                    chunk = response.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    if digest is not None:
                        digest.update(chunk)
        if digest is not None and digest.hexdigest() != hash_check.lower():
            raise ChecksumError(
                "%s checksum mismatch for %s: expected %s, got %s; "
                "the downloaded file was deleted. "
                "Check url/hash_check, or place a verified %s in %s."
                % (digest.name, url, hash_check.lower(), digest.hexdigest(), NPZ_NAME, directory)
            )
        os.replace(tmp_path, destination)
    except BaseException:
        try:
            os.unlink(tmp_path)
        except FileNotFoundError:
            pass
        raise


def _read_npz(path):
    keys = ("x_train", "y_train", "x_test", "y_test")
    corrupt = (ValueError, OSError, EOFError, zlib.error, zipfile.BadZipFile)
    corrupt_message = "%s is not a valid mnist.npz (corrupt or truncated): %s"
    try:
        archive = np.load(path, allow_pickle=False)
    except corrupt as exc:
        raise ValueError(corrupt_message % (path, exc)) from exc
    if not hasattr(archive, "files"):
        raise ValueError("%s is not an .npz archive of arrays %s" % (path, ", ".join(keys)))
    with archive:
        missing = [k for k in keys if k not in archive.files]
        if missing:
            raise ValueError("%s lacks the array(s) %s" % (path, ", ".join(missing)))
        try:
            arrays = {k: archive[k] for k in keys}
        except corrupt as exc:
            raise ValueError(corrupt_message % (path, exc)) from exc
    splits = []
    for split in ("train", "test"):
        images, labels = arrays["x_" + split], arrays["y_" + split]
        where = "%s: x_%s" % (path, split)
        if images.dtype != np.uint8:
            raise ValueError("%s has dtype %s, expected uint8 pixels" % (where, images.dtype))
        if images.ndim != 3 or images.shape[1:] != _IMAGE_SIZE:
            raise ValueError("%s has shape %s, expected (N, 28, 28)" % (where, images.shape))
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(
                "%s: y_%s must be a 1-D integer array, got %s %s"
                % (path, split, labels.dtype, labels.shape)
            )
        if labels.shape[0] != images.shape[0]:
            raise ValueError(
                "%s: x_%s has %d images but y_%s has %d labels"
                % (path, split, images.shape[0], split, labels.shape[0])
            )
        _check_label_range(labels, "%s: y_%s" % (path, split))
        splits.append((images, labels))
    return splits[0], splits[1]


def _read_idx_set(paths):
    train_images, train_labels, test_images, test_labels = paths
    return (
        _read_idx_pair(train_images, train_labels),
        _read_idx_pair(test_images, test_labels),
    )


def _read_idx_pair(images_path, labels_path):
    images = _read_idx(images_path, _IMAGE_MAGIC)
    labels = _read_idx(labels_path, _LABEL_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            "image/label count mismatch: %s holds %d images but %s holds %d labels"
            % (images_path, images.shape[0], labels_path, labels.shape[0])
        )
    return images, labels


def _read_idx(path, magic):
    """Decode one uint8 IDX file (images: magic 2051, 3-D; labels: magic 2049, 1-D)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError("%s: corrupt or truncated gzip data (%s)" % (path, exc)) from exc
    kind = "image" if magic == _IMAGE_MAGIC else "label"
    ndim = 3 if magic == _IMAGE_MAGIC else 1
    header_size = 4 + 4 * ndim
    if len(raw) < header_size:
        raise ValueError(
            "%s: truncated IDX header (%d bytes, need %d for an %s file)"
            % (path, len(raw), header_size, kind)
        )
    header = np.frombuffer(raw, dtype=">u4", count=1 + ndim)
    found_magic = int(header[0])
    if found_magic != magic:
        hint = {
            _IMAGE_MAGIC: " (that is an image file)",
            _LABEL_MAGIC: " (that is a label file)",
        }.get(found_magic, "")
        raise ValueError(
            "%s: bad IDX magic number %d%s, expected %d for an MNIST %s file"
            % (path, found_magic, hint, magic, kind)
        )
    dims = tuple(int(d) for d in header[1:])
    if ndim == 3 and dims[1:] != _IMAGE_SIZE:
        raise ValueError("%s: images are %dx%d, expected 28x28" % (path, dims[1], dims[2]))
    expected = int(np.prod(dims, dtype=np.int64))
    payload = len(raw) - header_size
    if payload < expected:
        raise ValueError(
            "%s: truncated: header declares %s (%d bytes of data) but only %d bytes follow"
            % (path, "x".join(map(str, dims)), expected, payload)
        )
    if payload > expected:
        raise ValueError(
            "%s: %d unexpected trailing bytes after the %d declared by the header %s"
            % (path, payload - expected, expected, "x".join(map(str, dims)))
        )
    data = np.frombuffer(raw, dtype=np.uint8, count=expected, offset=header_size).reshape(dims)
    if ndim == 1:
        _check_label_range(data, path)
    return data


def _check_label_range(labels, where):
    if labels.size and (labels.min() < 0 or labels.max() >= _NUM_CLASSES):
        raise ValueError(
            "%s: label values must lie in [0, %d), found range [%d, %d]"
            % (where, _NUM_CLASSES, labels.min(), labels.max())
        )


def _batch(split, batch_size, data_format, name):
    images, labels = split
    num_batches = images.shape[0] // batch_size
    if num_batches == 0:
        raise ValueError(
            "%s=%d exceeds the %d available samples" % (name, batch_size, images.shape[0])
        )
    count = num_batches * batch_size
    height, width = images.shape[1:]
    pixels = images[:count].astype(np.float32)
    pixels /= 255.0
    if data_format == "NCHW":
        shape = (num_batches, batch_size, 1, height, width)
    else:
        shape = (num_batches, batch_size, height, width, 1)
    return (
        np.ascontiguousarray(pixels.reshape(shape)),
        np.ascontiguousarray(labels[:count].astype(np.int32).reshape(num_batches, batch_size)),
    )
