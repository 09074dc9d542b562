"""Tests for flowjit.data: the MNIST / Fashion-MNIST loaders, on small generated files."""

import gzip
import hashlib
import os
import time
import urllib.error

import numpy as np
import pytest

import flowjit.data as data
from flowjit.data import load_fashion_mnist, load_mnist

IDX_NAMES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
REAL_DOWNLOAD = data._download


def idx_bytes(array, magic):
    header = np.array((magic,) + array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_file(path, payload, gz):
    if gz:
        path = str(path) + ".gz"
        payload = gzip.compress(payload, compresslevel=1)
    with open(path, "wb") as f:
        f.write(payload)
    return path


def make_split(n, seed, label=None):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10 if label is None else np.full(n, label, np.uint8)
    return images, labels


def write_idx_set(directory, n_train=250, n_test=130, gz=True, label=None):
    os.makedirs(directory, exist_ok=True)
    train, test = make_split(n_train, 1, label), make_split(n_test, 2, label)
    arrays = (train[0], train[1], test[0], test[1])
    magics = (2051, 2049, 2051, 2049)
    for name, array, magic in zip(IDX_NAMES, arrays, magics):
        write_file(os.path.join(directory, name), idx_bytes(array, magic), gz)
    return train, test


def write_npz(path, n_train=250, n_test=130, label=None):
    train, test = make_split(n_train, 3, label), make_split(n_test, 4, label)
    np.savez(path, x_train=train[0], y_train=train[1], x_test=test[0], y_test=test[1])
    return train, test


def no_download(url, destination, hash_check):
    raise AssertionError("unexpected download of %s" % url)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("FLOWJIT_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(data, "_download", no_download)


def check_split(result, expected, batch, layout="NCHW"):
    images, labels = result
    raw_images, raw_labels = expected
    num_batches = len(raw_labels) // batch
    count = num_batches * batch
    if layout == "NCHW":
        assert images.shape == (num_batches, batch, 1, 28, 28)
    else:
        assert images.shape == (num_batches, batch, 28, 28, 1)
    assert labels.shape == (num_batches, batch)
    assert images.dtype == np.float32 and labels.dtype == np.int32
    assert images.flags.c_contiguous and labels.flags.c_contiguous
    flat = images.reshape(count, 28, 28)
    np.testing.assert_array_equal(flat, raw_images[:count].astype(np.float32) / 255.0)
    np.testing.assert_array_equal(labels.reshape(-1), raw_labels[:count].astype(np.int32))
    assert 0.0 <= images.min() and images.max() <= 1.0


@pytest.mark.parametrize("gz", [True, False], ids=["gzipped", "plain"])
def test_idx_files_in_out_dir(tmp_path, gz):
    train, test = write_idx_set(tmp_path / "d", gz=gz)
    (tr, te) = load_mnist(100, 50, out_dir=tmp_path / "d")
    check_split(tr, train, 100)
    check_split(te, test, 50)
    assert tr[0].shape[0] == 2 and te[0].shape[0] == 2


def test_npz_in_out_dir_and_defaults(tmp_path, monkeypatch):
    train, test = write_npz(tmp_path / "mnist.npz", n_train=300, n_test=200)
    monkeypatch.chdir(tmp_path)
    (tr, te) = load_mnist()
    check_split(tr, train, 100)
    check_split(te, test, 100)
    assert tr[0].shape == (3, 100, 1, 28, 28)


def test_remainder_dropped_and_batch_of_one(tmp_path):
    train, test = write_npz(tmp_path / "mnist.npz", n_train=250, n_test=130)
    (tr, te) = load_mnist(train_batch_size=64, test_batch_size=1, out_dir=tmp_path)
    assert tr[0].shape[:2] == (3, 64) and tr[1].shape == (3, 64)
    assert te[0].shape[:2] == (130, 1)
    check_split(tr, train, 64)
    check_split(te, test, 1)


@pytest.mark.parametrize("layout", ["NHWC", "nhwc"])
def test_nhwc(tmp_path, layout):
    train, test = write_idx_set(tmp_path, gz=False)
    (tr, te) = load_mnist(50, 10, data_format=layout, out_dir=tmp_path)
    check_split(tr, train, 50, "NHWC")
    check_split(te, test, 10, "NHWC")


def test_unknown_data_format(tmp_path):
    write_npz(tmp_path / "mnist.npz")
    with pytest.raises(ValueError, match="NCHW.*NHWC"):
        load_mnist(data_format="CHWN", out_dir=tmp_path)
    with pytest.raises(ValueError, match="NCHW.*NHWC"):
        load_fashion_mnist(data_format="NCWH", data_dir=tmp_path)


@pytest.mark.parametrize("loader", ["mnist", "fashion"])
@pytest.mark.parametrize("sizes", [(0, 100), (100, -5)])
def test_non_positive_batch_size(tmp_path, loader, sizes):
    write_idx_set(tmp_path)
    with pytest.raises(ValueError, match="must be positive"):
        if loader == "mnist":
            load_mnist(*sizes, out_dir=tmp_path)
        else:
            load_fashion_mnist(*sizes, data_dir=tmp_path)


@pytest.mark.parametrize("size", [2.5, "100", True])
def test_non_integer_batch_size(tmp_path, size):
    write_idx_set(tmp_path)
    with pytest.raises(TypeError, match="integer"):
        load_mnist(size, out_dir=tmp_path)


def test_numpy_integer_batch_size(tmp_path):
    write_idx_set(tmp_path)
    (tr, _) = load_mnist(np.int64(25), out_dir=tmp_path)
    assert tr[0].shape[:2] == (10, 25)


def test_batch_larger_than_dataset(tmp_path):
    write_idx_set(tmp_path, n_test=40)
    with pytest.raises(ValueError, match="test_batch_size=100 exceeds the 40"):
        load_mnist(out_dir=tmp_path)


def test_search_order(tmp_path, monkeypatch):
    out_dir, env_dir = tmp_path / "out", tmp_path / "env"
    cache_dir = tmp_path / "home" / ".cache" / "flowjit" / "datasets" / "mnist"
    os.makedirs(out_dir)
    write_idx_set(cache_dir, label=3)
    assert load_mnist(out_dir=out_dir)[0][1].min() == 3
    env_dir.mkdir()
    write_npz(env_dir / "mnist.npz", label=2)
    monkeypatch.setenv("FLOWJIT_DATA_DIR", str(env_dir))
    assert load_mnist(out_dir=out_dir)[0][1].min() == 2
    write_idx_set(out_dir, label=1)
    assert load_mnist(out_dir=out_dir)[0][1].min() == 1
    write_npz(out_dir / "mnist.npz", label=7)
    assert load_mnist(out_dir=out_dir)[0][1].min() == 7


def test_env_mnist_subdirectory(tmp_path, monkeypatch):
    write_idx_set(tmp_path / "env" / "mnist", label=4)
    monkeypatch.setenv("FLOWJIT_DATA_DIR", str(tmp_path / "env"))
    assert load_mnist(out_dir=tmp_path / "empty")[1][1].max() == 4


def replace_file(directory, name, payload, gz=True):
    for suffix in ("", ".gz"):
        path = os.path.join(directory, name + suffix)
        if os.path.exists(path):
            os.remove(path)
    return write_file(os.path.join(directory, name), payload, gz)


def test_bad_magic(tmp_path):
    train, _ = write_idx_set(tmp_path)
    replace_file(tmp_path, "train-images-idx3-ubyte", idx_bytes(train[0], 2049)[:8] + b"\0" * 16)
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz: bad IDX magic number 2049"):
        load_mnist(out_dir=tmp_path)


def test_labels_swapped_for_images(tmp_path):
    train, _ = write_idx_set(tmp_path, gz=False)
    replace_file(tmp_path, "train-labels-idx1-ubyte", idx_bytes(train[0], 2051), gz=False)
    expected = "train-labels-idx1-ubyte: bad IDX magic number 2051 .*image file"
    with pytest.raises(ValueError, match=expected):
        load_mnist(out_dir=tmp_path)


@pytest.mark.parametrize("gz", [True, False], ids=["gzipped", "plain"])
def test_truncated_payload(tmp_path, gz):
    _, test = write_idx_set(tmp_path, gz=gz)
    replace_file(tmp_path, "t10k-images-idx3-ubyte", idx_bytes(test[0], 2051)[:-100], gz=gz)
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte(\.gz)?: truncated"):
        load_mnist(out_dir=tmp_path)


def test_truncated_header(tmp_path):
    write_idx_set(tmp_path)
    replace_file(tmp_path, "t10k-labels-idx1-ubyte", b"\0\0\x08", gz=False)
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte: truncated IDX header"):
        load_mnist(out_dir=tmp_path)


def test_truncated_gzip_stream(tmp_path):
    write_idx_set(tmp_path)
    path = os.path.join(tmp_path, "train-images-idx3-ubyte.gz")
    with open(path, "rb") as f:
        payload = f.read()
    with open(path, "wb") as f:
        f.write(payload[: len(payload) // 2])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz: corrupt or truncated gzip"):
        load_mnist(out_dir=tmp_path)


def test_trailing_bytes(tmp_path):
    _, test = write_idx_set(tmp_path)
    replace_file(tmp_path, "t10k-labels-idx1-ubyte", idx_bytes(test[1], 2049) + b"junk")
    with pytest.raises(ValueError, match="4 unexpected trailing bytes"):
        load_mnist(out_dir=tmp_path)


def test_wrong_image_size(tmp_path):
    write_idx_set(tmp_path)
    small = np.zeros((250, 28, 27), np.uint8)
    replace_file(tmp_path, "train-images-idx3-ubyte", idx_bytes(small, 2051))
    with pytest.raises(ValueError, match="images are 28x27, expected 28x28"):
        load_mnist(out_dir=tmp_path)


def test_label_out_of_range(tmp_path):
    write_idx_set(tmp_path)
    replace_file(tmp_path, "train-labels-idx1-ubyte", idx_bytes(np.full(250, 12, np.uint8), 2049))
    expected = r"train-labels-idx1-ubyte\.gz: label values must lie in \[0, 10\)"
    with pytest.raises(ValueError, match=expected):
        load_mnist(out_dir=tmp_path)


def test_count_mismatch(tmp_path):
    write_idx_set(tmp_path, n_train=250)
    replace_file(tmp_path, "train-labels-idx1-ubyte", idx_bytes(np.zeros(249, np.uint8), 2049))
    expected = "count mismatch: .*train-images.* 250 images .*train-labels.* 249 labels"
    with pytest.raises(ValueError, match=expected):
        load_mnist(out_dir=tmp_path)


def test_npz_problems(tmp_path):
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=np.zeros((10, 28, 28), np.uint8), y_train=np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="lacks the array.*x_test, y_test"):
        load_mnist(10, 10, out_dir=tmp_path)
    np.savez(path, x_train=np.zeros((10, 28, 28)), y_train=np.zeros(10, np.uint8),
             x_test=np.zeros((10, 28, 28), np.uint8), y_test=np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="x_train has dtype float64, expected uint8"):
        load_mnist(10, 10, out_dir=tmp_path)
    np.savez(path, x_train=np.zeros((10, 28, 28), np.uint8), y_train=np.zeros(9, np.uint8),
             x_test=np.zeros((10, 28, 28), np.uint8), y_test=np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="x_train has 10 images but y_train has 9 labels"):
        load_mnist(10, 10, out_dir=tmp_path)
    write_npz(path)
    with open(path, "rb") as f:
        payload = f.read()
    with open(path, "wb") as f:
        f.write(payload[:1000])
    with pytest.raises(ValueError, match="mnist.npz is not a valid mnist.npz"):
        load_mnist(out_dir=tmp_path)


def test_offline_error_message(tmp_path, monkeypatch):
    def offline(url, destination, hash_check):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(data, "_download", offline)
    env_dir = tmp_path / "env"
    monkeypatch.setenv("FLOWJIT_DATA_DIR", str(env_dir))
    out_dir = tmp_path / "out"
    with pytest.raises(data.DatasetNotFoundError) as info:
        load_mnist(out_dir=out_dir)
    assert isinstance(info.value, OSError)
    message = str(info.value)
    assert "Temporary failure in name resolution" in message
    assert "mnist.npz" in message
    for name in IDX_NAMES:
        assert name + "[.gz]" in message
    for directory in (out_dir, env_dir, env_dir / "mnist"):
        assert str(directory) in message
    assert os.path.join(str(tmp_path), "home", ".cache", "flowjit", "datasets", "mnist") in message
    assert data.MNIST_URL in message
    assert "load_fashion_mnist" in message and "apt-get install dataset-fashion-mnist" in message


def test_download_disabled(tmp_path):
    with pytest.raises(data.DatasetNotFoundError, match="downloading is disabled"):
        load_mnist(url=None, out_dir=tmp_path)


def test_unreachable_url_is_offline_error(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_download", REAL_DOWNLOAD)
    missing = (tmp_path / "nowhere" / "mnist.npz").as_uri()
    with pytest.raises(data.DatasetNotFoundError, match="downloading .* failed"):
        load_mnist(url=missing, hash_check=None, out_dir=tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("algorithm", ["md5", "sha256"])
def test_download_checksum(tmp_path, monkeypatch, algorithm):
    monkeypatch.setattr(data, "_download", REAL_DOWNLOAD)
    source = tmp_path / "server" / "mnist.npz"
    source.parent.mkdir()
    train, test = write_npz(source)
    digest = hashlib.new(algorithm, source.read_bytes()).hexdigest()
    wrong = ("0" if digest[0] != "0" else "1") + digest[1:]
    out_dir = tmp_path / "out"

    expected = "%s checksum mismatch.*expected %s, got %s" % (algorithm, wrong, digest)
    with pytest.raises(data.ChecksumError, match=expected):
        load_mnist(url=source.as_uri(), hash_check=wrong, out_dir=out_dir)
    assert os.listdir(out_dir) == []

    (tr, te) = load_mnist(url=source.as_uri(), hash_check=digest.upper(), out_dir=out_dir)
    assert os.listdir(out_dir) == ["mnist.npz"]
    check_split(tr, train, 100)
    check_split(te, test, 100)

    monkeypatch.setattr(data, "_download", no_download)
    (tr, _) = load_mnist(out_dir=out_dir)
    check_split(tr, train, 100)


def test_invalid_hash_check(tmp_path):
    with pytest.raises(ValueError, match="hash_check must be a hex md5"):
        load_mnist(hash_check="not-a-hash", out_dir=tmp_path)


def test_oneflow_defaults():
    import inspect

    params = inspect.signature(load_mnist).parameters
    assert params["train_batch_size"].default == 100 and params["test_batch_size"].default == 100
    assert params["data_format"].default == "NCHW" and params["out_dir"].default == "."
    url = "https://oneflow-public.oss-cn-beijing.aliyuncs.com/datasets/mnist.npz"
    sha256 = "63d4344077849053dc3036b247fa012b2b381de53fd055a66b539dffd76cf08e"
    assert params["url"].default == url and params["hash_check"].default == sha256


@pytest.mark.parametrize("gz", [True, False], ids=["gzipped", "plain"])
def test_fashion_data_dir(tmp_path, gz):
    train, test = write_idx_set(tmp_path / "fm", gz=gz)
    (tr, te) = load_fashion_mnist(50, 65, data_format="NHWC", data_dir=tmp_path / "fm")
    check_split(tr, train, 50, "NHWC")
    check_split(te, test, 65, "NHWC")


def test_fashion_env_dir_before_debian(tmp_path, monkeypatch):
    write_idx_set(tmp_path / "env" / "fashion-mnist", label=5)
    write_idx_set(tmp_path / "debian", label=6)
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "debian"))
    assert load_fashion_mnist()[0][1].min() == 6
    monkeypatch.setenv("FLOWJIT_DATA_DIR", str(tmp_path / "env"))
    assert load_fashion_mnist()[0][1].min() == 5


def test_fashion_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "debian"))
    monkeypatch.setenv("FLOWJIT_DATA_DIR", str(tmp_path / "env"))
    os.makedirs(tmp_path / "env" / "fashion-mnist")
    with pytest.raises(data.DatasetNotFoundError) as info:
        load_fashion_mnist()
    message = str(info.value)
    assert str(tmp_path / "debian") + " " in message and "directory does not exist" in message
    assert str(tmp_path / "env" / "fashion-mnist") in message
    assert "missing train-images-idx3-ubyte[.gz]" in message
    assert "apt-get install dataset-fashion-mnist" in message

    with pytest.raises(data.DatasetNotFoundError, match="data_dir"):
        load_fashion_mnist(data_dir=tmp_path / "nope")


FASHION_DIR = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(
    not os.path.isdir(FASHION_DIR),
    reason="Debian's Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)",
)
def test_debian_fashion_mnist():
    start = time.perf_counter()
    (train_images, train_labels), (test_images, test_labels) = load_fashion_mnist()
    elapsed = time.perf_counter() - start
    assert train_images.shape == (600, 100, 1, 28, 28) and train_labels.shape == (600, 100)
    assert test_images.shape == (100, 100, 1, 28, 28) and test_labels.shape == (100, 100)
    assert train_images.dtype == np.float32 and train_labels.dtype == np.int32
    assert 0.0 == train_images.min() and train_images.max() == 1.0
    np.testing.assert_array_equal(np.bincount(train_labels.ravel(), minlength=10), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(test_labels.ravel(), minlength=10), [1000] * 10)
    assert elapsed < 10.0, "loading Fashion-MNIST took %.2f s" % elapsed
