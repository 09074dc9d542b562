"""Megatron's memory-mapped GPT data sets ([zoo] #26): the writer
(flowjit.megatron_data, python -m flowjit.megatron_data) and
flow.data.megatron_gpt_mmap_data_loader inside jobs, against a reference
written here from OneFlow's description of the sampling (documents laid end
to end over epochs, the last epoch shuffled apart when it is short, samples
of seq_length + 1 tokens that overlap by one), and a small GPT-like model
training on it."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import flowjit as flow
import flowjit.megatron_data as md
import flowjit.typing as tp
from flowjit._ops import megatron as _megatron

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------- the reference

def ref_batches(docs, seq_length, num_samples, batch_size, n_batches, shuffle=False, seed=0,
                split_sizes=(1,), split_index=0, shuffle_fn=None):
    """The first n_batches batches, computed the slow, literal way: a list of
    (document, offset) sample starts walked token by token."""
    num_docs = len(docs)
    total = sum(split_sizes)
    # split: round(ratio * num_docs) documents per part, in float32 as OneFlow
    offset = sum(int(np.rint(np.float32(np.float32(s) / np.float32(total)) * np.float32(num_docs)))
                 for s in split_sizes[:split_index])
    size = int(np.rint(np.float32(np.float32(split_sizes[split_index]) / np.float32(total)) * np.float32(num_docs)))
    epoch_docs = list(range(offset, min(offset + size, num_docs)))
    tokens = sum(len(docs[d]) for d in epoch_docs)
    epochs = math.ceil((num_samples * seq_length + 1) / tokens)
    complete = epochs
    if epochs > 1:
        per_epoch = (tokens - 1) // seq_length
        last = num_samples - ((epochs - 1) * tokens - 1) // seq_length
        if last < int(np.float32(0.8) * np.float32(per_epoch)):
            complete = epochs - 1
    g = _megatron.MT19937(seed) if shuffle else None
    doc_order = epoch_docs * complete
    if shuffle:
        doc_order = shuffle_fn(doc_order, g)
    if complete != epochs:
        extra = list(epoch_docs)
        doc_order += shuffle_fn(extra, g) if shuffle else extra
    n_samples = (epochs * tokens - 1) // seq_length
    starts = []
    d, off = 0, 0
    for _ in range(n_samples):
        starts.append((d, off))
        remaining = seq_length
        while remaining > 0:
            left = len(docs[doc_order[d]]) - off
            if remaining < left:
                off += remaining
            else:
                d, off = d + 1, 0
            remaining -= left
    order = list(range(n_samples))
    if shuffle:
        c = (complete * tokens - 1) // seq_length
        order = shuffle_fn(order[:c], g) + (shuffle_fn(order[c:], g) if complete != epochs else order[c:])
    out = []
    for b in range(n_batches):
        rows = []
        for i in range(batch_size):
            d, off = starts[order[b * batch_size + i]]
            row = []
            while len(row) < seq_length + 1:
                row += list(docs[doc_order[d]][off:off + seq_length + 1 - len(row)])
                d, off = d + 1, 0
            rows.append(row)
        out.append(rows)
    return out


def _np_shuffle(items, g):
    a = np.array(items, np.int64)
    _megatron.std_shuffle(a, g)
    return a.tolist()


def _docs(lengths, start=1):
    docs, t = [], start
    for n in lengths:
        docs.append(list(range(t, t + n)))
        t += n
    return docs


def _loader_job(prefix, seq_length, num_samples, batch_size, **kw):
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.data.megatron_gpt_mmap_data_loader(prefix, seq_length=seq_length, num_samples=num_samples,
                                                       batch_size=batch_size, **kw)

    return job


# ---------------------------------------------------------------- shuffle as libstdc++

# std::mt19937 g(1234); std::iota + std::shuffle(v.begin(), v.end(), g) for
# each n in turn, with GCC 12's libstdc++: n, FNV-1a of the result, its first
# elements. Sizes on both sides of 65536 take both of its algorithms.
LIBSTDCXX_SHUFFLES = """\
0 1469598103934665603
1 4953163356653287321 0
2 11125488673309971922 1 0
3 11572782435010236528 1 0 2
10 10983498926273324932 9 5 7 1 6 3 2 8 4 0
11 15950816972293208690 4 9 7 3 0 10 2 1 6 8 5
7 16359775167966981768 3 2 0 4 5 6 1
100000 6195732562740450025 42349 12810 55866 68536 88738 30431 35097 65014 55794 83690 63652 72998
65535 5249158806281082008 57039 124 50864 21910 11346 1346 1212 60203 46644 25074 12610 60162
65536 15783081130166897845 54714 9194 32204 56530 47982 28753 26748 56023 62936 31856 32669 30279
70000 6617813661801284947 18661 23782 26430 53692 63680 41425 10194 29499 19912 50954 9433 27873
5 16550700852770786327 0 1 2 4 3
"""


def test_shuffle_is_std_shuffle_with_mt19937():
    g = _megatron.MT19937(1234)
    for line in LIBSTDCXX_SHUFFLES.splitlines():
        n, h, *first = (int(v) for v in line.split())
        a = np.arange(n, dtype=np.int64)
        _megatron.std_shuffle(a, g)
        fnv = 1469598103934665603
        for x in a.tolist():
            fnv = ((fnv ^ x) * 1099511628211) & (2 ** 64 - 1)
        assert (fnv, a[:12].tolist()) == (h, first), n
    # std::mt19937's 10000th number from its default seed (the C++ standard's check)
    g = _megatron.MT19937(5489)
    assert [g() for _ in range(10000)][-1] == 4123659995


def test_vectorized_swap_positions_redraw_as_the_scalar_distribution():
    n = 300_000  # about n^2 / 2^33 = 10 rejected draws
    a, b = _megatron.MT19937(42), _megatron.MT19937(42)
    fast = a.swap_positions(n)
    assert fast.tolist() == [b.uniform(0, i) for i in range(1, n)]
    assert a() == b()  # and the same numbers consumed


# ---------------------------------------------------------------- the loader's batches

def test_writer_round_trip_and_dtype_choice(tmp_path):
    docs = [[1, 2, 3], [], [65499, 0]]
    md.write(tmp_path / "a", docs)
    assert [d.tolist() for d in md.read_documents(tmp_path / "a")] == docs
    assert md.read_documents(tmp_path / "a")[0].dtype == np.uint16
    md.write(tmp_path / "b", [[70000, 1]])
    assert md.read_documents(tmp_path / "b")[0].dtype == np.int32
    md.write(tmp_path / "c", [[-3, 4]], dtype=np.int64)
    assert md.read_documents(tmp_path / "c")[0].tolist() == [-3, 4]
    with pytest.raises(ValueError, match="do not fit uint8"):
        md.write(tmp_path / "d", [[256]], dtype=np.uint8)
    with pytest.raises(TypeError, match="document 0 must be a 1-D sequence of integer"):
        md.write(tmp_path / "d", [[0.5]])
    # the index layout, byte by byte
    raw = (tmp_path / "a.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00" and int.from_bytes(raw[9:17], "little") == 1 and raw[17] == 8
    assert int.from_bytes(raw[18:26], "little") == 3 and int.from_bytes(raw[26:34], "little") == 4
    assert np.frombuffer(raw, "<i4", 3, 34).tolist() == [3, 0, 2]
    assert np.frombuffer(raw, "<i8", 3, 46).tolist() == [0, 6, 6]
    assert np.frombuffer(raw, "<i8", 4, 70).tolist() == [0, 1, 2, 3] and len(raw) == 102
    assert (tmp_path / "a.bin").read_bytes() == np.uint16([1, 2, 3, 65499, 0]).tobytes()


def test_in_order_batches_by_hand(tmp_path):
    md.write(tmp_path / "c", [[1, 2, 3, 4, 5], [6, 7, 8]])
    job = _loader_job(str(tmp_path / "c"), 3, 4, 2, shuffle=False)
    # 8 tokens an epoch, 4 samples of 3 (+1) need 2 epochs: 1..8 1..8
    assert job().tolist() == [[1, 2, 3, 4], [4, 5, 6, 7]]
    assert job().tolist() == [[7, 8, 1, 2], [2, 3, 4, 5]]
    # two epochs hold 5 samples (the 5th [5, 6, 7, 8]); a third batch would need 6
    with pytest.raises(RuntimeError, match=r"batch 2 needs samples 4\.\.5.*num_samples=4 has 5"):
        job()
    assert _megatron.MegatronGPTDataset(str(tmp_path / "c"), 3, 4, shuffle=False).sample(4).tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize("lengths,seq,num_samples,batch", [
    ([5, 3, 9, 1, 4], 4, 6, 2),        # one epoch
    ([5, 3, 9, 1, 4], 4, 40, 4),       # many epochs, the last one apart (short)
    ([5, 3, 9, 1, 4], 7, 9, 3),        # last epoch long enough to shuffle with the others
    ([2, 0, 6, 1, 0, 3], 3, 12, 3),    # empty documents
    ([11], 5, 7, 1),                   # one document
    ([3] * 40, 8, 50, 5),              # many documents
])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_match_the_reference(tmp_path, lengths, seq, num_samples, batch, shuffle):
    docs = _docs(lengths)
    md.write(tmp_path / "c", docs)
    job = _loader_job(str(tmp_path / "c"), seq, num_samples, batch, shuffle=shuffle, random_seed=77)
    n = num_samples // batch
    want = ref_batches(docs, seq, num_samples, batch, n, shuffle=shuffle, seed=77, shuffle_fn=_np_shuffle)
    got = [job().tolist() for _ in range(n)]
    assert got == want
    if shuffle:
        assert want != ref_batches(docs, seq, num_samples, batch, n)  # it did shuffle


def test_the_last_epoch_is_shuffled_apart_when_short(tmp_path):
    docs = _docs([4] * 10)  # 40 tokens an epoch
    md.write(tmp_path / "c", docs)
    ds = _megatron.MegatronGPTDataset(str(tmp_path / "c"), 4, 12, shuffle=True, seed=3)
    assert (ds.num_epochs, ds.num_complete_epochs) == (2, 1)  # 2 of 9 samples in the 2nd epoch
    assert sorted(ds.doc_indices[:10].tolist()) == list(range(10)) == sorted(ds.doc_indices[10:].tolist())
    assert sorted(ds.order[:9].tolist()) == list(range(9))  # the first epoch's samples come first
    ds = _megatron.MegatronGPTDataset(str(tmp_path / "c"), 4, 17, shuffle=True, seed=3)
    assert (ds.num_epochs, ds.num_complete_epochs) == (2, 2)  # 8 of 9: shuffled with the first


def test_split_selects_documents(tmp_path):
    docs = _docs([3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    md.write(tmp_path / "c", docs)
    for index, part in [(0, range(0, 7)), (1, range(7, 9)), (2, range(9, 10))]:
        job = _loader_job(str(tmp_path / "c"), 4, 5, 5, shuffle=False, split_sizes=[7, 2, 1], split_index=index)
        stream = [t for d in part for t in docs[d]]
        assert job().tolist() == [(stream * 3)[4 * k:4 * k + 5] for k in range(5)]
        want = ref_batches(docs, 4, 5, 5, 1, shuffle=True, seed=9, split_sizes=(7, 2, 1), split_index=index,
                           shuffle_fn=_np_shuffle)
        assert _loader_job(str(tmp_path / "c"), 4, 5, 5, random_seed=9, split_sizes="7,2,1",
                           split_index=index)().tolist() == want[0]


@pytest.mark.parametrize("dtype,np_dtype", [(flow.int64, np.int64), (flow.int32, np.int32)])
@pytest.mark.parametrize("disk", [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64])
def test_dtypes(tmp_path, dtype, np_dtype, disk):
    info = np.iinfo(disk)
    docs = [[int(max(info.min, -2 ** 31)), 1, 2, int(min(info.max, 2 ** 31 - 1))], [3, 4, 5]]
    md.write(tmp_path / "c", docs, dtype=disk)
    out = _loader_job(str(tmp_path / "c"), 3, 2, 2, dtype=dtype, shuffle=False)()
    assert out.dtype == np_dtype and out.shape == (2, 4)
    assert out.tolist() == [docs[0], docs[0][3:] + docs[1]]


def test_same_seed_same_batches_and_manual_seed(tmp_path):
    md.write(tmp_path / "c", _docs([7, 5, 9, 3, 8]))
    a = _loader_job(str(tmp_path / "c"), 4, 20, 4, random_seed=5)
    first = [a().tolist() for _ in range(3)]
    b = _loader_job(str(tmp_path / "c"), 4, 20, 4, random_seed=5)
    assert [b().tolist() for _ in range(3)] == first
    c = _loader_job(str(tmp_path / "c"), 4, 20, 4, random_seed=6)
    assert [c().tolist() for _ in range(3)] != first
    flow.manual_seed(11)
    d1 = _loader_job(str(tmp_path / "c"), 4, 20, 4)().tolist()
    flow.manual_seed(11)
    assert _loader_job(str(tmp_path / "c"), 4, 20, 4)().tolist() == d1


def test_start_from_saved_progress_resumes_from_a_checkpoint(tmp_path):
    md.write(tmp_path / "c", _docs([7, 5, 9, 3, 8]))
    job = _loader_job(str(tmp_path / "c"), 4, 20, 2, random_seed=5, start_from_saved_progress=True)
    b0, b1 = job().tolist(), job().tolist()
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    b2 = job().tolist()
    names = [n for n in flow.get_all_variables() if n.startswith("gpt_data_loader-iteration")]
    assert names == ["gpt_data_loader-iteration-sq4-sa20-bs2-sd5-sp1-spi0-"]
    assert flow.get_all_variables()[names[0]].tolist() == [3]
    job = _loader_job(str(tmp_path / "c"), 4, 20, 2, random_seed=5, start_from_saved_progress=True)
    assert job().tolist() == b0
    flow.load_variables({names[0]: np.array([2], np.int64)})
    assert job().tolist() == b2
    assert b1 != b2


def test_a_job_with_placeholders_and_the_loader(tmp_path):
    md.write(tmp_path / "c", [[1, 2, 3, 4, 5], [6, 7, 8]])
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 4), dtype=flow.int64)) -> tp.Numpy:
        t = flow.data.megatron_gpt_mmap_data_loader(str(tmp_path / "c"), 3, 4, 2, shuffle=False)
        return t * 10 + x

    assert job(np.ones((2, 4), np.int64)).tolist() == [[11, 21, 31, 41], [41, 51, 61, 71]]


def test_cli_write_and_info(tmp_path):
    (tmp_path / "docs.txt").write_text("1 2 3\n\n4 5\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-m", "flowjit.megatron_data", "write", str(tmp_path / "c"),
                        str(tmp_path / "docs.txt")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert [d.tolist() for d in md.read_documents(tmp_path / "c")] == [[1, 2, 3], [4, 5]]
    r = subprocess.run([sys.executable, "-m", "flowjit.megatron_data", "info", str(tmp_path / "c")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "2 documents, 5 tokens of uint16" in r.stdout
    r = subprocess.run([sys.executable, "-m", "flowjit.megatron_data", "info", str(tmp_path / "nope")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "nope.idx' does not exist" in r.stderr


# ---------------------------------------------------------------- hostile and wrong input

def _idx(tmp_path, edit):
    md.write(tmp_path / "c", [[1, 2, 3], [4, 5, 6, 7]], dtype=np.int32)
    raw = bytearray((tmp_path / "c.idx").read_bytes())
    raw = edit(raw)
    (tmp_path / "c.idx").write_bytes(bytes(raw))
    return str(tmp_path / "c")


def _put(raw, at, value, size):
    raw[at:at + size] = int(value).to_bytes(size, "little", signed=True)
    return raw


@pytest.mark.parametrize("edit,exc,message", [
    (lambda r: b"MMIDIDY\x00\x00" + r[9:], ValueError, r"c\.idx': bad magic b'MMIDIDY"),
    (lambda r: r[:20], ValueError, r"c\.idx': truncated header: 20 bytes"),
    (lambda r: b"", ValueError, r"c\.idx': truncated header: 0 bytes"),
    (lambda r: r[:-1], ValueError, r"c\.idx': truncated: fields 'count' \(2\) and 'doc_count' \(3\) need 82"),
    (lambda r: r + b"\0", ValueError, r"c\.idx': 1 bytes after the last field 'doc_idx'"),
    (lambda r: _put(r, 9, 2, 8), ValueError, r"field 'version' is 2"),
    (lambda r: _put(r, 17, 6, 1), ValueError, r"field 'dtype' is code 6, a floating-point type"),
    (lambda r: _put(r, 17, 9, 1), ValueError, r"field 'dtype' is code 9, unknown"),
    (lambda r: _put(r, 18, 2 ** 62, 8), ValueError, r"truncated: fields 'count' \(4611686018427387904\)"),
    (lambda r: _put(r, 34 + 4, 5, 4), ValueError,
     r"'pointers'\[1\] = 12 with 'sizes'\[1\] = 5 int32 tokens ends at byte 32, past the end of the data "
     r"file '.*c\.bin' \(28 bytes\)"),
    (lambda r: _put(r, 42 + 8, 2 ** 62, 8), ValueError, r"field 'pointers'\[1\] = 4611686018427387904"),
    (lambda r: _put(r, 42 + 8, -4, 8), ValueError, r"field 'pointers'\[1\] is negative \(-4\)"),
    (lambda r: _put(r, 34, -1, 4), ValueError, r"field 'sizes'\[0\] is negative \(-1\)"),
])
def test_hostile_index_files_are_clear_errors(tmp_path, edit, exc, message):
    prefix = _idx(tmp_path, edit)
    with pytest.raises(exc, match=message):
        _loader_job(prefix, 2, 2, 1)()
    with pytest.raises(exc, match=message):
        md.read_documents(prefix)


def test_missing_and_odd_files_and_arguments(tmp_path):
    md.write(tmp_path / "c", [[1, 2, 3], [4, 5]])
    with pytest.raises(FileNotFoundError, match=r"the index file '.*nope\.idx' does not exist"):
        _loader_job(str(tmp_path / "nope"), 2, 2, 1)()
    os.unlink(tmp_path / "c.bin")
    with pytest.raises(FileNotFoundError, match=r"the data file '.*c\.bin' does not exist"):
        _loader_job(str(tmp_path / "c"), 2, 2, 1)()
    os.mkdir(tmp_path / "c.bin")
    with pytest.raises(ValueError, match=r"the data file '.*c\.bin' is not a regular file"):
        _loader_job(str(tmp_path / "c"), 2, 2, 1)()
    md.write(tmp_path / "e", [[], []])
    with pytest.raises(ValueError, match=r"holds 2 document\(s\) with 0 token\(s\)"):
        _loader_job(str(tmp_path / "e"), 2, 2, 1)()
    md.write(tmp_path / "d", [[1, 2, 3], [4, 5]])
    p = str(tmp_path / "d")
    for kw, exc, msg in [({"seq_length": 0}, ValueError, "seq_length must be an int >= 1"),
                         ({"batch_size": 1.5}, ValueError, "batch_size must be an int >= 1"),
                         ({"dtype": flow.float32}, TypeError, "dtype must be flow.int64 or flow.int32"),
                         ({"split_sizes": [1, 1], "split_index": 2}, ValueError, "split index 2 is out of range"),
                         ({"split_sizes": [0, 0]}, ValueError, "positive sum"),
                         ({"split_sizes": ["a"]}, TypeError, "split_sizes must be a list of ints")]:
        args = dict(seq_length=2, num_samples=2, batch_size=1)
        args.update(kw)
        with pytest.raises(exc, match=msg):
            _loader_job(p, **args)()
    with pytest.raises(NotImplementedError, match="inside a function decorated"):
        flow.data.megatron_gpt_mmap_data_loader(p, 2, 2, 1)


def test_a_link_planted_in_another_users_folder_is_refused(tmp_path):
    """The hostile-input rule of the OFRecord part files: an index or data
    file that is a symbolic link in a folder someone else owns is not read."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder owned by another user")
    md.write(tmp_path / "c", [[1, 2, 3], [4, 5]])
    other = tmp_path / "other"
    other.mkdir()
    for ext in (".idx", ".bin"):
        os.symlink(tmp_path / ("c" + ext), other / ("c" + ext))
    os.chown(other, 12345, 12345)
    with pytest.raises(PermissionError, match=r"the index file '.*other/c\.idx' is a symbolic link in a folder "
                                              r"owned by another user"):
        _loader_job(str(other / "c"), 2, 2, 1)()
    os.chown(other, os.geteuid(), os.getegid())  # a link in one's own folder is followed
    assert _loader_job(str(other / "c"), 2, 2, 1, shuffle=False)().tolist() == [[1, 2, 3]]


# ---------------------------------------------------------------- a GPT-like model trains on it

def test_a_small_gpt_trains_on_the_loader(tmp_path):
    vocab, seq, hidden, batch = 16, 8, 32, 8
    rng = np.random.default_rng(0)
    # documents of a learnable language: each token is the previous one + 1 (mod vocab)
    docs = [(rng.integers(0, vocab) + np.arange(rng.integers(5, 30))) % vocab for _ in range(60)]
    md.write(tmp_path / "c", docs)
    flow.clear_default_session()
    flow.manual_seed(1)

    @flow.global_function(type="train")
    def train() -> tp.Numpy:
        tokens = flow.data.megatron_gpt_mmap_data_loader(str(tmp_path / "c"), seq_length=seq, num_samples=400,
                                                         batch_size=batch, random_seed=1234)
        data = flow.slice(tokens, begin=(None, 0), size=(None, seq))
        labels = flow.slice(tokens, begin=(None, 1), size=(None, seq))
        table = flow.get_variable("wte", shape=(vocab, hidden),
                                  initializer=flow.random_normal_initializer(stddev=0.1))
        h = flow.gather(table, data)                                    # (batch, seq, hidden)
        h = flow.reshape(h, (batch * seq, hidden))
        h = flow.layers.dense(h, hidden, activation=flow.math.gelu, name="mlp")
        logits = flow.matmul(h, table, transpose_b=True)                # tied output embedding
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(flow.reshape(labels, (batch * seq,)), logits)
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.02])).minimize(loss)
        return loss

    losses = [float(train().mean()) for _ in range(40)]
    assert losses[0] > 2.0  # about log(16) = 2.77 at the start
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses


def test_written_files_have_the_umask_mode_and_leave_no_temporary(tmp_path):
    old = os.umask(0o022)
    try:
        md.write(tmp_path / "c", [[1, 2]])
    finally:
        os.umask(old)
    assert sorted(os.listdir(tmp_path)) == ["c.bin", "c.idx"]
    assert {os.stat(tmp_path / n).st_mode & 0o777 for n in ("c.bin", "c.idx")} == {0o644}


# ---------------------------------------------------------------- what OneFlow's GPT program spells

@pytest.mark.parametrize("kw,split", [({"parallel_distribution": []}, None), ({"parallel_distribution": ["B"]}, None),
                                      ({"nd_sbp": ["S(0)"]}, 0), ({"parallel_distribution": "S(1)"}, 1)])
def test_get_variable_takes_oneflows_parallel_distribution(kw, split):
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        w = flow.get_variable("w", shape=(2, 3), initializer=flow.ones_initializer(), **kw)
        assert job_builder().split_vars.get("w") == split
        return w

    def job_builder():
        from flowjit._core import trace as _trace
        return _trace.current()

    assert job().tolist() == [[1.0] * 3] * 2


@pytest.mark.parametrize("dist,exc,msg", [(["B", "S(0)"], NotImplementedError, "2-D device hierarchy"),
                                          (["P"], NotImplementedError, "entry 'P'"),
                                          (["Q"], ValueError, "entry 'Q'"), (3, TypeError, "list of SBP strings")])
def test_get_variable_parallel_distribution_errors(dist, exc, msg):
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.get_variable("w", shape=(2,), parallel_distribution=dist)

    with pytest.raises(exc, match=msg):
        job()


@pytest.mark.parametrize("placement", ["0:0-1", "layers"])
def test_a_job_on_several_devices_reads_the_same_batches(tmp_path, placement):
    """OneFlow's test_1n4d: the loader split S(0) over devices gives the
    batches of one device (its shards read consecutive samples); here the
    batch is a whole input of the consistent view, or of a job whose layers
    lie on different devices."""
    md.write(tmp_path / "c", _docs([7, 5, 9, 3, 8]))
    one = _loader_job(str(tmp_path / "c"), 4, 20, 4, random_seed=3)
    want = [one().tolist() for _ in range(3)]
    flow.clear_default_session()
    flow.config.cpu_device_num(2)
    try:
        @flow.global_function()
        def job() -> tp.Numpy:
            if placement == "layers":
                with flow.scope.placement("cpu", "0:0"):
                    t = flow.data.megatron_gpt_mmap_data_loader(str(tmp_path / "c"), 4, 20, 4, random_seed=3)
                    t = t * 2
                with flow.scope.placement("cpu", "0:1"):
                    return t // 2
            with flow.scope.placement("cpu", placement):
                t = flow.data.megatron_gpt_mmap_data_loader(str(tmp_path / "c"), 4, 20, 4, random_seed=3,
                                                            parallel_distribution=["S(0)"])
                return t + 0

        assert [job().tolist() for _ in range(3)] == want
    finally:
        flow.clear_default_session()
        flow.config.cpu_device_num(1)


def test_a_mirrored_job_gives_each_device_its_rows(tmp_path):
    """In the mirrored view over 2 devices each device gets its rows of the
    loader's batch: concatenated, what one device reads."""
    md.write(tmp_path / "c", [[1, 2, 3, 4, 5], [6, 7, 8]])

    def run(devices):
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)
        cfg = flow.FunctionConfig()
        if devices > 1:
            cfg.default_logical_view(flow.scope.mirrored_view())

        @flow.global_function(function_config=cfg)
        def job() -> tp.ListNumpy if devices > 1 else tp.Numpy:
            with flow.scope.placement("cpu", f"0:0-{devices - 1}"):
                t = flow.data.megatron_gpt_mmap_data_loader(str(tmp_path / "c"), 3, 4, 2, shuffle=False)
                return t + 1
        return [job() for _ in range(2)]

    try:
        want = run(1)
        got = run(2)
    finally:
        flow.clear_default_session()
        flow.config.cpu_device_num(1)
    assert [[a.tolist() for a in parts] for parts in got] == [[w[:1].tolist(), w[1:].tolist()] for w in want]


def test_a_process_of_a_mirrored_job_reads_only_its_rows(tmp_path):
    """The loader opened for the second of two processes of 2 devices each
    (the job's data split (4, 2, 2)) reads rows 2..3 of every batch of 4:
    those the whole batch has there."""
    md.write(tmp_path / "c", [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12]])
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.data.megatron_gpt_mmap_data_loader(str(tmp_path / "c"), 2, 12, 4, shuffle=False)

    try:
        job()
        src = next(iter(job._cache.values())).feeds[0].src
        whole, part = src.open(), src.open((4, 2, 2))
        for _ in range(2):
            (a,), (b,) = whole.next(), part.next()
            assert b.shape == (2, 3)
            np.testing.assert_array_equal(b, a[2:4])
    finally:
        flow.clear_default_session()
