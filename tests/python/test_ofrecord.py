"""OFRecord data sets ([zoo]): the writer (flowjit.ofrecord, python -m
flowjit.ofrecord), and flow.data.ofrecord_reader + OFRecordRawDecoder inside
jobs, read and decoded by the native reader a few batches ahead."""
import os
import subprocess
import sys
from typing import Tuple

import numpy as np
import pytest

import flowjit as flow
import flowjit.ofrecord as ofr
import flowjit.typing as tp


def _records(n):
    return [{"x": np.arange(4, dtype=np.float32) + i, "y": np.int32(i), "big": np.int64(2 ** 60 + i),
             "ids": np.arange(i % 4, dtype=np.int64), "raw": bytes([i, 255 - i])} for i in range(n)]


def _reader_job(d, batch, parts=1, shuffle=False, **kw):
    flow.clear_default_session()

    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        r = flow.data.ofrecord_reader(d, batch_size=batch, data_part_num=parts, random_shuffle=shuffle, **kw)
        x = flow.data.OFRecordRawDecoder(r, "x", shape=(4,), dtype=flow.float)
        y = flow.data.OFRecordRawDecoder(r, "y", shape=(), dtype=flow.int32)
        big = flow.data.OFRecordRawDecoder(r, "big", shape=(1,), dtype=flow.int64)
        ids = flow.data.ofrecord_raw_decoder(r, "ids", shape=(3,), dtype=flow.int32, truncate=True)
        raw = flow.data.OFRecordRawDecoder(r, "raw", shape=(2,), dtype=flow.int32)
        return x + 1, y, big, ids, raw

    return job


def test_records_round_trip_in_order_and_loop_over_epochs(tmp_path):
    ofr.write(tmp_path, _records(6))
    job = _reader_job(str(tmp_path), 4)
    seen = []
    for _ in range(3):
        x, y, big, ids, raw = job()
        seen += y.tolist()
        for row, i in enumerate(y.tolist()):
            np.testing.assert_array_equal(x[row], np.arange(4) + i + 1)  # decoded, then computed on
            assert big[row, 0] == 2 ** 60 + i  # int64 exactly (not through a double)
            np.testing.assert_array_equal(ids[row], list(range(i % 4))[:3] + [0] * (3 - min(i % 4, 3)))
            np.testing.assert_array_equal(raw[row], np.array([i, 255 - i], np.uint8).view(np.int8))
    assert seen == [0, 1, 2, 3, 4, 5] * 2  # in order, then the next epoch
    assert x.dtype == np.float32 and y.dtype == np.int32 and big.dtype == np.int64


def test_the_mirrored_view_gives_each_device_its_rows(tmp_path):
    """Over 2 devices in the mirrored view each device gets its rows of the
    reader's batch (tests/python/test_multiprocess.py: across processes);
    a batch that does not divide among the devices is refused."""
    ofr.write(tmp_path, _records(8))
    flow.clear_default_session()
    flow.config.cpu_device_num(2)
    try:
        cfg = flow.function_config()
        cfg.default_logical_view(flow.scope.mirrored_view())

        @flow.global_function(function_config=cfg)
        def job() -> tp.ListNumpy:
            r = flow.data.ofrecord_reader(str(tmp_path), batch_size=4)
            return flow.data.OFRecordRawDecoder(r, "y", shape=(), dtype=flow.int32) * 10

        assert [a.tolist() for a in job()] == [[0, 10], [20, 30]]
        assert [a.tolist() for a in job()] == [[40, 50], [60, 70]]

        @flow.global_function(function_config=cfg)
        def odd() -> tp.ListNumpy:
            r = flow.data.ofrecord_reader(str(tmp_path), batch_size=3)
            return flow.data.OFRecordRawDecoder(r, "y", shape=(), dtype=flow.int32)

        with pytest.raises(ValueError, match="batch_size must be a multiple of 2; got 3"):
            odd()
    finally:
        flow.clear_default_session()
        flow.config.cpu_device_num(1)


def test_part_files_and_padded_suffixes(tmp_path):
    files = ofr.write(tmp_path, _records(6), parts=3, part_name_suffix_length=5)
    assert [os.path.basename(f) for f in files] == ["part-00000", "part-00001", "part-00002"]
    job = _reader_job(str(tmp_path), 6, parts=3, part_name_suffix_length=5)
    assert job()[1].tolist() == [0, 3, 1, 4, 2, 5]  # part 0 (records 0 and 3), part 1, part 2


def test_shuffling_is_reproducible_from_the_seed(tmp_path):
    ofr.write(tmp_path, _records(32))

    def order():
        flow.manual_seed(5)
        job = _reader_job(str(tmp_path), 8, shuffle=True, shuffle_buffer_size=8)
        return sum((job()[1].tolist() for _ in range(4)), [])

    a, b = order(), order()
    assert a == b and a != sorted(a)
    # The buffer (8 records) spans the epochs: the first 32 - 7 records
    # drawn are all from the first pass, so all distinct.
    assert len(set(a[:25])) == 25


def test_a_train_job_learns_from_ofrecords(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) > 0).astype(np.int32)
    np.savez(tmp_path / "d.npz", features=x, label=y)
    out = tmp_path / "ofr"
    p = subprocess.run([sys.executable, "-m", "flowjit.ofrecord", "npz", str(tmp_path / "d.npz"), str(out),
                        "--parts", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "wrote 2 part file(s)" in p.stdout
    flow.clear_default_session()

    @flow.global_function(type="train")
    def train() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(out), batch_size=32, data_part_num=2, random_shuffle=True)
        feats = flow.data.OFRecordRawDecoder(r, "features", shape=(8,), dtype=flow.float)
        label = flow.data.OFRecordRawDecoder(r, "label", shape=(), dtype=flow.int32)
        logits = flow.layers.dense(feats, 2, name="lr")
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(label, logits))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
        return loss

    losses = [float(train().item()) for _ in range(60)]
    assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:4])


def test_async_jobs_take_consecutive_batches(tmp_path):
    ofr.write(tmp_path, _records(8))
    flow.clear_default_session()
    got = []

    @flow.global_function()
    def job() -> tp.Callback[tp.Numpy]:
        r = flow.data.ofrecord_reader(str(tmp_path), batch_size=2)
        return flow.data.OFRecordRawDecoder(r, "y", shape=(), dtype=flow.int64)

    for _ in range(4):
        job()(lambda y: got.append(y.tolist()))
    flow.sync_default_session()
    assert got == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_errors_name_the_file_the_record_and_the_feature(tmp_path):
    ofr.write(tmp_path, [{"a": np.float32([1, 2])}, {"b": np.float32([1])}])
    flow.clear_default_session()

    @flow.global_function()
    def missing_part() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path), data_part_num=2)
        return flow.data.OFRecordRawDecoder(r, "a", shape=(2,), dtype=flow.float)

    with pytest.raises(FileNotFoundError, match=r"part file '.*part-1' does not exist"):
        missing_part()

    def job_for(feature, shape):
        flow.clear_default_session()

        @flow.global_function()
        def job() -> tp.Numpy:
            r = flow.data.ofrecord_reader(str(tmp_path), batch_size=1)
            return flow.data.OFRecordRawDecoder(r, feature, shape=shape, dtype=flow.float)
        return job

    job = job_for("a", (2,))
    np.testing.assert_array_equal(job(), [[1, 2]])
    with pytest.raises(ValueError, match=r"'.*part-0' record 1 has no feature 'a'"):
        job()
    with pytest.raises(ValueError, match=r"feature 'a' of '.*part-0' record 0 holds 2 values, but the "
                                         r"decoder's shape \[3\] takes 3 \(truncate=True"):
        job_for("a", (3,))()
    (tmp_path / "part-0").write_bytes((tmp_path / "part-0").read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"record 1 is cut short"):
        j = job_for("a", (2,))
        j()
        j()


def test_unsupported_decoders_say_why(tmp_path):
    ofr.write(tmp_path, _records(1))
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(tmp_path))
        return flow.data.OFRecordRawDecoder(r, "ids", shape=(3,), dtype=flow.int32, dim1_varying_length=True)

    with pytest.raises(NotImplementedError, match=r"dim1_varying_length=True makes the blob's shape depend on "
                                                  r"the data"):
        job()
    with pytest.raises(TypeError, match=r"ofrecord\.encode: expected a mapping"):
        ofr.encode([1, 2])
    with pytest.raises(TypeError, match=r"feature 'c': cannot store values of dtype complex64"):
        ofr.encode({"c": np.complex64(1)})


def test_a_link_planted_in_another_users_folder_is_refused(tmp_path):
    """The hostile-input rule: a part file that is a symbolic link in a
    folder someone else owns is not followed (it could point at this
    user's private files)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder owned by another user")
    ofr.write(tmp_path / "mine", _records(2))
    other = tmp_path / "other"
    other.mkdir()
    os.symlink(tmp_path / "mine" / "part-0", other / "part-0")
    os.chown(other, 12345, 12345)
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(other), batch_size=1)
        return flow.data.OFRecordRawDecoder(r, "y", shape=(), dtype=flow.int32)

    with pytest.raises(PermissionError, match=r"is a symbolic link in a folder owned by another user"):
        job()
    os.chown(other, os.geteuid(), os.getegid())  # a link in one's own folder is followed
    flow.clear_default_session()

    @flow.global_function()
    def job2() -> tp.Numpy:
        r = flow.data.ofrecord_reader(str(other), batch_size=1)
        return flow.data.OFRecordRawDecoder(r, "y", shape=(), dtype=flow.int32)

    assert job2().tolist() == [0]


@pytest.mark.parametrize("placement", ["0:0-1", "layers"])
def test_a_consistent_job_on_two_devices_reads_the_same_batches(tmp_path, placement):
    """The reader gives the whole batch; the devices of a consistent-view job
    (or the layers placed on each) get their parts of it, so the job sees the
    records one device would."""
    ofr.write(tmp_path, _records(6), parts=2)
    one = _reader_job(str(tmp_path), 4, parts=2)
    want = [[a.tolist() for a in one()] for _ in range(3)]
    flow.clear_default_session()
    flow.config.cpu_device_num(2)
    try:
        @flow.global_function()
        def job() -> Tuple[tp.Numpy, tp.Numpy]:
            def read():
                r = flow.data.ofrecord_reader(str(tmp_path), batch_size=4, data_part_num=2)
                x = flow.data.OFRecordRawDecoder(r, "x", shape=(4,), dtype=flow.float)
                return x, flow.data.OFRecordRawDecoder(r, "y", shape=(), dtype=flow.int32)
            if placement == "layers":
                with flow.scope.placement("cpu", "0:0"):
                    x, y = read()
                    x = x * 2
                with flow.scope.placement("cpu", "0:1"):
                    return x / 2 + 1, y + 0
            with flow.scope.placement("cpu", placement):
                x, y = read()
                return x + 1, y + 0

        got = [[a.tolist() for a in job()] for _ in range(3)]
        assert [g[0] for g in got] == [w[0] for w in want] and [g[1] for g in got] == [w[1] for w in want]
    finally:
        flow.clear_default_session()
        flow.config.cpu_device_num(1)
