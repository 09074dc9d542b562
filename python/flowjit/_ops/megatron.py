"""Megatron-LM's memory-mapped token data sets, read inside a job
(OneFlow's ``flow.data.megatron_gpt_mmap_data_loader``).

A data set is two files: ``<prefix>.idx``, the index, and ``<prefix>.bin``,
the tokens of every document one after the other. The index (Megatron's
``MMapIndexedDataset`` format, version 1, little-endian)::

    magic    9 bytes   b"MMIDIDX\\x00\\x00"
    version  uint64    1
    dtype    uint8     the tokens' type: 1 uint8, 2 int8, 3 int16, 4 int32,
                       5 int64, 8 uint16 (6 and 7 are floating point)
    count    uint64    number of sequences (documents for OneFlow)
    ndocs    uint64    number of entries of doc_idx
    sizes    int32[count]   tokens of each sequence
    pointers int64[count]   byte offset of each sequence in the .bin file
    doc_idx  int64[ndocs]   first sequence of each document (unused here,
                            as in OneFlow, which reads every sequence as a document)

The sampling is OneFlow's (``oneflow/user/data/gpt_dataset.cpp``): the
documents of the split are laid end to end, epoch after epoch, as many epochs
as ``num_samples`` samples of ``seq_length`` tokens need; sample ``k`` is the
``seq_length + 1`` tokens that start at token ``k * seq_length`` of that
stream (its last token is the next sample's first). With ``shuffle`` the
documents of the complete epochs are shuffled together, a last epoch that
gives under 80% of an epoch's samples apart, and the sample order likewise,
with ``std::mt19937(random_seed)`` and ``std::shuffle`` as libstdc++ (GCC 11
and later) does them, so a seed gives OneFlow's order on such a build.

Data loading is I/O and bookkeeping: the tokens are read from a
``numpy.memmap`` of the ``.bin`` file, no model math happens here.
"""
import numbers
import os
import stat
from typing import Any, Optional, Sequence

import numpy as np

from .._core.blob import Blob
from .._core.dtypes import DTypeLike

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = len(MAGIC) + 8 + 1 + 8 + 8

# Megatron's dtype codes; 6 and 7 are floating point, which holds no token ids
# (and Megatron reads 6 as float64 where OneFlow reads float32).
DTYPE_OF_CODE = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
CODE_OF_DTYPE = {np.dtype(t): c for c, t in DTYPE_OF_CODE.items()}

_M32 = 0xFFFFFFFF


def check_data_file(api, path, what):
    """`path` is a regular file this process may read as data: it exists, is
    not a folder or device, and is not a symbolic link planted in a folder
    another user owns (the hostile-input rule of the OFRecord part files)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{api}: the {what} '{path}' does not exist") from None
    except OSError as exc:
        raise OSError(f"{api}: cannot read the {what} '{path}': {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{api}: the {what} '{path}' is not a regular file")
    if os.path.islink(path) and os.stat(os.path.dirname(os.path.abspath(path))).st_uid != os.geteuid():
        # A link planted in another user's folder must not make this process
        # read (and train on) its own files.
        raise PermissionError(f"{api}: the {what} '{path}' is a symbolic link in a folder owned by another "
                              "user; copy the data set or link the folder itself")
    return st.st_size


class MegatronIndex:
    """The parsed ``.idx`` file: ``dtype`` (numpy), ``sizes`` (int64 array),
    ``pointers`` (int64 array) and ``doc_idx`` (int64 array), checked against
    the ``.bin`` file's size."""

    def __init__(self, prefix, api="megatron index"):
        prefix = os.fspath(prefix)
        self.idx_path, self.bin_path = prefix + ".idx", prefix + ".bin"
        idx_size = check_data_file(api, self.idx_path, "index file")
        self.bin_size = check_data_file(api, self.bin_path, "data file")
        with open(self.idx_path, "rb") as f:
            raw = f.read()
        if len(raw) != idx_size:
            raise ValueError(f"{api}: index file '{self.idx_path}' changed size while being read")
        self._parse(api, raw)

    def _parse(self, api, raw):
        where = f"{api}: index file '{self.idx_path}'"
        if len(raw) < HEADER_SIZE:
            if not MAGIC.startswith(raw[:len(MAGIC)]):
                raise ValueError(f"{where}: bad magic {raw[:len(MAGIC)]!r} (expected {MAGIC!r}); "
                                 "not a Megatron mmap index")
            raise ValueError(f"{where}: truncated header: {len(raw)} bytes, the header has {HEADER_SIZE}")
        if raw[:len(MAGIC)] != MAGIC:
            raise ValueError(f"{where}: bad magic {raw[:len(MAGIC)]!r} (expected {MAGIC!r}); "
                             "not a Megatron mmap index")
        pos = len(MAGIC)
        version = int.from_bytes(raw[pos:pos + 8], "little")
        pos += 8
        if version != VERSION:
            raise ValueError(f"{where}: field 'version' is {version}, only version {VERSION} is known")
        code = raw[pos]
        pos += 1
        if code not in DTYPE_OF_CODE:
            kind = "a floating-point type, which holds no token ids" if code in (6, 7) else "unknown"
            raise ValueError(f"{where}: field 'dtype' is code {code}, {kind} (token codes: "
                             + ", ".join(f"{c} {np.dtype(t).name}" for c, t in sorted(DTYPE_OF_CODE.items()))
                             + ")")
        self.dtype = np.dtype(DTYPE_OF_CODE[code]).newbyteorder("<")
        count = int.from_bytes(raw[pos:pos + 8], "little")
        ndocs = int.from_bytes(raw[pos + 8:pos + 16], "little")
        pos += 16
        need = HEADER_SIZE + 4 * count + 8 * count + 8 * ndocs
        if count >= 1 << 40 or ndocs >= 1 << 40 or need > len(raw):
            raise ValueError(f"{where}: truncated: fields 'count' ({count}) and 'doc_count' ({ndocs}) need "
                             f"{need} bytes, the file has {len(raw)}")
        if need < len(raw):
            raise ValueError(f"{where}: {len(raw) - need} bytes after the last field 'doc_idx' "
                             f"(count {count}, doc_count {ndocs} take {need} bytes)")
        self.sizes = np.frombuffer(raw, "<i4", count, pos).astype(np.int64)
        pos += 4 * count
        self.pointers = np.frombuffer(raw, "<i8", count, pos).astype(np.int64)
        pos += 8 * count
        self.doc_idx = np.frombuffer(raw, "<i8", ndocs, pos).astype(np.int64)
        bad = np.flatnonzero(self.sizes < 0)
        if bad.size:
            raise ValueError(f"{where}: field 'sizes'[{bad[0]}] is negative ({self.sizes[bad[0]]})")
        bad = np.flatnonzero(self.pointers < 0)
        if bad.size:
            raise ValueError(f"{where}: field 'pointers'[{bad[0]}] is negative ({self.pointers[bad[0]]})")
        ends = self.pointers + self.sizes * self.dtype.itemsize  # no overflow: pointers < 2^63, sizes < 2^31
        bad = np.flatnonzero((ends > self.bin_size) | (ends < self.pointers))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{where}: field 'pointers'[{i}] = {self.pointers[i]} with 'sizes'[{i}] = "
                             f"{self.sizes[i]} {self.dtype.name} tokens ends at byte {self.pointers[i] + self.sizes[i] * self.dtype.itemsize}, "
                             f"past the end of the data file '{self.bin_path}' ({self.bin_size} bytes)")

    def __len__(self):
        return len(self.sizes)


def _split_docs(split_sizes, split_index, num_docs):
    """OneFlow's GetSplitDocIndices: the documents of part `split_index`,
    each part round(num_docs * size / total) documents (in float32, ties to
    even), cut at num_docs."""
    total = np.float32(sum(split_sizes))
    n = np.float32(num_docs)
    offset = 0
    for s in split_sizes[:split_index]:
        offset += int(np.rint(np.float32(np.float32(s) / total) * n))
    size = int(np.rint(np.float32(np.float32(split_sizes[split_index]) / total) * n))
    return np.arange(min(offset, num_docs), min(offset + size, num_docs), dtype=np.int64)


def _num_epochs(num_samples, seq_length, tokens_per_epoch):
    # num_epochs * tokens_per_epoch >= num_samples * seq_length + 1: every
    # sample has seq_length + 1 tokens, the last one the next sample's first.
    return -(-(num_samples * seq_length + 1) // tokens_per_epoch)


def _num_complete_epochs(num_samples, seq_length, tokens_per_epoch):
    """OneFlow's GetNumCompleteEpochs: the last epoch is shuffled apart when
    it gives under 80% of an epoch's samples."""
    num_epochs = _num_epochs(num_samples, seq_length, tokens_per_epoch)
    if num_epochs == 1:
        return 1
    per_epoch = (tokens_per_epoch - 1) // seq_length
    before_last = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
    last = num_samples - before_last
    separate = last < int(np.float32(0.8) * np.float32(per_epoch))
    return num_epochs - 1 if separate else num_epochs


class MT19937:
    """``std::mt19937(seed)``'s stream of 32-bit numbers (numpy's MT19937
    with its legacy seeding is the same generator), drawn in chunks."""

    def __init__(self, seed):
        self._bg = np.random.MT19937()
        self._bg._legacy_seeding(int(seed) & _M32)
        self._buf, self._pos = np.zeros(0, np.uint64), 0

    def raw(self, k):
        """The next `k` numbers (a uint64 array)."""
        if self._pos + k > len(self._buf):
            self._buf = np.concatenate([self._buf[self._pos:], self._bg.random_raw(max(k, 4096))])
            self._pos = 0
        out = self._buf[self._pos:self._pos + k]
        self._pos += k
        return out

    def unread(self, k):
        """Gives back the last `k` numbers `raw` returned."""
        self._pos -= k

    def __call__(self):
        return int(self.raw(1)[0])

    def uniform(self, a, b):
        """``std::uniform_int_distribution(a, b)(g)`` of libstdc++ 11+ for a
        32-bit generator: Lemire's multiply-shift with rejection."""
        r = b - a
        if r == _M32:
            return self() + a
        if r > _M32:
            raise NotImplementedError("megatron data: a shuffle of more than 2^32 elements")
        r += 1
        p = self() * r
        low = p & _M32
        if low < r:
            threshold = ((_M32 + 1) - r) % r
            while low < threshold:
                p = self() * r
                low = p & _M32
        return (p >> 32) + a

    def swap_positions(self, n):
        """``uniform(0, i)`` for i = 1 .. n - 1 in turn (the draws of a plain
        Fisher-Yates shuffle), vectorized: a block of draws at a time, cut
        at the first one the rejection step redraws."""
        out = np.empty(max(n - 1, 0), np.int64)
        i = 1
        while i < n:
            k = min(n - i, 1 << 20)
            r = self.raw(k)
            ranges = np.arange(i + 1, i + 1 + k, dtype=np.uint64)
            p = r * ranges
            low = p & np.uint64(_M32)
            threshold = (np.uint64(_M32 + 1) - ranges) % ranges
            bad = np.flatnonzero(low < threshold)
            ok = k if bad.size == 0 else int(bad[0])
            out[i - 1:i - 1 + ok] = (p[:ok] >> np.uint64(32)).astype(np.int64)
            if ok < k:
                self.unread(k - ok)  # redraw from the rejected one on
                out[i - 1 + ok] = self.uniform(0, i + ok)
                ok += 1
            i += ok
        return out


def std_shuffle(arr, g):
    """``std::shuffle(arr.begin(), arr.end(), g)`` as libstdc++ 11+ does it
    (two swap positions from one draw while n * n fits the generator's
    range); shuffles the int64 array `arr` in place."""
    n = len(arr)
    if n < 2:
        return
    a = arr.tolist()
    if _M32 // n >= n:
        uniform = g.uniform
        i = 1
        if n % 2 == 0:
            j = uniform(0, 1)
            a[i], a[j] = a[j], a[i]
            i += 1
        while i != n:
            b0 = i + 1
            b1 = b0 + 1
            x = uniform(0, b0 * b1 - 1)
            p0, p1 = divmod(x, b1)
            a[i], a[p0] = a[p0], a[i]
            i += 1
            a[i], a[p1] = a[p1], a[i]
            i += 1
    else:
        for i, j in enumerate(g.swap_positions(n).tolist(), 1):
            a[i], a[j] = a[j], a[i]
    arr[:] = a


class MegatronGPTDataset:
    """OneFlow's MegatronGPTMMapDataset: `sample(k)` is the k-th sample, as
    ``seq_length + 1`` tokens; `len()` the samples there are (at least
    ``num_samples``)."""

    def __init__(self, prefix, seq_length, num_samples, split_sizes=(1,), split_index=0, shuffle=True,
                 seed=0, api="megatron_gpt_mmap_data_loader"):
        self.api = api
        self.index = index = MegatronIndex(prefix, api)
        self.seq_length = seq_length = int(seq_length)
        self.num_samples = num_samples = int(num_samples)
        docs = _split_docs(list(split_sizes), int(split_index), len(index))
        tokens_per_epoch = int(index.sizes[docs].sum())
        if tokens_per_epoch < 2:
            raise ValueError(f"{api}: part {split_index} of split_sizes {list(split_sizes)} of '{index.idx_path}' "
                             f"holds {len(docs)} document(s) with {tokens_per_epoch} token(s) in all; a sample needs "
                             "at least 2")
        self.tokens_per_epoch = tokens_per_epoch
        self.num_epochs = _num_epochs(num_samples, seq_length, tokens_per_epoch)
        self.num_complete_epochs = _num_complete_epochs(num_samples, seq_length, tokens_per_epoch)
        g = MT19937(seed)
        doc_indices = np.tile(docs, self.num_complete_epochs)
        if shuffle:
            std_shuffle(doc_indices, g)
        if self.num_epochs != self.num_complete_epochs:
            last = docs.copy()
            if shuffle:
                std_shuffle(last, g)
            doc_indices = np.concatenate([doc_indices, last])
        self.doc_indices = doc_indices
        lengths = index.sizes[doc_indices]
        self.starts = np.concatenate([[0], np.cumsum(lengths)])  # first token of each doc in the stream
        total = (self.num_epochs * tokens_per_epoch - 1) // seq_length
        order = np.arange(total, dtype=np.int64)
        if shuffle:
            complete = (self.num_complete_epochs * tokens_per_epoch - 1) // seq_length
            head = order[:complete]
            std_shuffle(head, g)
            order[:complete] = head
            if self.num_complete_epochs != self.num_epochs:
                tail = order[complete:]
                std_shuffle(tail, g)
                order[complete:] = tail
        self.order = order
        self._data = np.memmap(index.bin_path, dtype=np.uint8, mode="r") if index.bin_size else np.zeros(0, np.uint8)

    def __len__(self):
        return len(self.order)

    def sample(self, k, out=None):
        """The ``seq_length + 1`` tokens of sample `k` (in shuffled order)."""
        if not 0 <= k < len(self.order):
            raise IndexError(f"{self.api}: sample {k} of {len(self.order)}")
        n = self.seq_length + 1
        if out is None:
            out = np.empty(n, np.int64)
        pos = int(self.order[k]) * self.seq_length
        j = int(np.searchsorted(self.starts, pos, side="right")) - 1
        offset = pos - int(self.starts[j])
        filled = 0
        index, item = self.index, self.index.dtype.itemsize
        while filled < n:
            doc = int(self.doc_indices[j])
            take = min(int(index.sizes[doc]) - offset, n - filled)
            if take > 0:
                start = int(index.pointers[doc]) + offset * item
                out[filled:filled + take] = np.frombuffer(self._data, index.dtype, take, start)
                filled += take
            j += 1
            offset = 0
        return out


# ---------------------------------------------------------------- the op inside a job

def _int_arg(api, what, v, low):
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < low:
        from .._core import trace as _trace
        _trace.fail(ValueError, f"{api}: {what} must be an int >= {low}, got {v!r}")
    return int(v)


def _split_arg(api, split_sizes, split_index):
    from .._core import trace as _trace
    if split_sizes is None:
        split_sizes = (1,)
    if isinstance(split_sizes, str):  # Megatron's --split "949,50,1"
        split_sizes = [s for s in split_sizes.replace("/", ",").split(",") if s.strip()]
    try:
        sizes = [int(s) for s in split_sizes]
        if any(isinstance(s, (bool, float)) for s in split_sizes):
            raise ValueError
    except (TypeError, ValueError):
        _trace.fail(TypeError, f"{api}: split_sizes must be a list of ints (or a string '949,50,1'), got "
                    f"{split_sizes!r}")
    if not sizes or any(s < 0 for s in sizes) or sum(sizes) <= 0:
        _trace.fail(ValueError, f"{api}: split_sizes must be ints >= 0 with a positive sum, got {split_sizes!r}")
    index = 0 if split_index is None else _int_arg(api, "split_index", split_index, 0)
    if index >= len(sizes):
        _trace.fail(ValueError, f"{api}: split index {index} is out of range, split_sizes {sizes}")
    return sizes, index


class MegatronSource:
    """A Megatron data set read by a job: its tokens blob is a parameter of
    the job (after the user's) that every call fills with the next batch."""

    def __init__(self, dataset, batch_size, dtype, name, progress):
        self.dataset, self.batch_size, self.dtype, self.name = dataset, batch_size, dtype, name
        self.progress = progress  # the name of the iteration variable (start_from_saved_progress) or None
        self.fields = [name]
        self.params = []

    def open(self, data_split=None):
        """The reader of this source: a new one per compiled job, starting at
        the first batch (or at the saved iteration). With a job's data_split
        (the mirrored view) it reads only this process's rows of each batch."""
        rows = (0, self.batch_size)
        if data_split:
            total, first, local = data_split
            per = self.batch_size // total
            rows = (first * per, (first + local) * per)
        return _MegatronReader(self, rows)

    def __repr__(self):
        return f"<Megatron GPT source {self.name}: {self.dataset.index.idx_path}, batch {self.batch_size}>"


class _MegatronReader:
    def __init__(self, src, rows):
        self.src, self.rows, self.iteration = src, rows, 0

    def next(self):
        src = self.src
        ds = src.dataset
        if src.progress is not None:
            from .. import _C
            it = int(np.asarray(_C.variable_value(src.progress)).reshape(-1)[0])
        else:
            it = self.iteration
        b = src.batch_size
        first = it * b
        if it < 0 or first + b > len(ds):
            raise RuntimeError(f"{ds.api} '{src.name}': batch {it} needs samples {first}..{first + b - 1}, and "
                               f"the data set made for num_samples={ds.num_samples} has {len(ds)} "
                               f"({ds.num_epochs} epoch(s) of '{ds.index.idx_path}'); give a larger num_samples")
        lo, hi = self.rows
        out = np.empty((hi - lo, ds.seq_length + 1), src.dtype.np)
        for i in range(lo, hi):
            ds.sample(first + i, out[i - lo])
        if src.progress is not None:
            _C.set_variable_value(src.progress, np.array([it + 1], np.int64))
        else:
            self.iteration = it + 1
        return [out]


def megatron_gpt_mmap_data_loader(data_file_prefix: str, seq_length: int, num_samples: int, batch_size: int,
                                  dtype: Optional[DTypeLike] = None, shuffle: bool = True,
                                  random_seed: Optional[int] = None,
                                  split_sizes: Optional[Sequence[int]] = None,
                                  split_index: Optional[int] = None,
                                  parallel_distribution: Optional[Sequence[Any]] = None,
                                  start_from_saved_progress: bool = False, name: Optional[str] = None,
                                  nd_sbp: Optional[Sequence[Any]] = None) -> Blob:
    """A ``(batch_size, seq_length + 1)`` blob of token ids from Megatron-LM's
    memory-mapped data set ``data_file_prefix.idx`` / ``.bin``, the next
    batch at every call of the job (OneFlow's GPT data loader; its tokens
    ``[:, :seq_length]`` are the model's input, ``[:, 1:]`` its labels).

    The documents of part ``split_index`` of ``split_sizes`` (weights, e.g.
    ``[949, 50, 1]``; default all documents) are laid end to end over as
    many epochs as ``num_samples`` samples need; sample ``k`` is the
    ``seq_length + 1`` tokens from token ``k * seq_length`` of that stream.
    With ``shuffle`` the documents and the samples are shuffled as OneFlow
    does with ``random_seed`` (by default one from ``flow.manual_seed`` and
    the job). ``dtype`` is ``flow.int64`` (default) or ``flow.int32``.
    With ``start_from_saved_progress`` the batch number lives in an int64
    variable (``<name>-iteration-...``), so a checkpoint saves it and a
    loaded one resumes there (each call reads it, so it waits for the
    job's previous calls). ``parallel_distribution`` / ``nd_sbp`` place
    OneFlow's loader on several devices; here the job reads on one device.
    Write such a data set with :mod:`flowjit.megatron_data`.

    Example:
        >>> import os, tempfile
        >>> import flowjit.megatron_data
        >>> prefix = os.path.join(tempfile.mkdtemp(), "corpus")
        >>> flowjit.megatron_data.write(prefix, [[1, 2, 3, 4, 5], [6, 7, 8]])
        >>> @flow.global_function()
        ... def batches() -> tp.Numpy:
        ...     return flow.data.megatron_gpt_mmap_data_loader(prefix, seq_length=3, num_samples=2,
        ...                                                   batch_size=2, shuffle=False)
        >>> batches().tolist()
        [[1, 2, 3, 4], [4, 5, 6, 7]]
    """
    from .._core import dtypes as _dtypes, trace as _trace
    from . import builders as _ops
    from ..random import _seed
    api = "data.megatron_gpt_mmap_data_loader"
    b = _trace.require_builder(f"flow.{api}")
    if not isinstance(data_file_prefix, (str, os.PathLike)):
        _trace.fail(TypeError, f"{api}: data_file_prefix must be a path, got {type(data_file_prefix).__name__}")
    seq_length = _int_arg(api, "seq_length", seq_length, 1)
    num_samples = _int_arg(api, "num_samples", num_samples, 1)
    batch_size = _int_arg(api, "batch_size", batch_size, 1)
    dt = _dtypes.int64 if dtype is None else _ops._dtype(dtype, api)
    if dt not in (_dtypes.int32, _dtypes.int64):
        _trace.fail(TypeError, f"{api}: dtype must be flow.int64 or flow.int32 (token ids), got {dt!r}")
    sizes, index = _split_arg(api, split_sizes, split_index)
    if name is not None and (not isinstance(name, str) or not name):
        _trace.fail(TypeError, f"{api}: name must be a non-empty string, got {name!r}")
    seed = _seed(b, random_seed, api) & _M32  # OneFlow's seed is a uint32
    try:
        dataset = MegatronGPTDataset(data_file_prefix, seq_length, num_samples, sizes, index, bool(shuffle),
                                     seed, api)
    except (OSError, ValueError) as exc:
        _trace.fail(type(exc), str(exc))
    n = len(b.data_sources)
    if name is None:
        name = "gpt_data_loader" if start_from_saved_progress else f"gpt_data_loader_{n}"
    progress = None
    if start_from_saved_progress:
        dist = parallel_distribution if parallel_distribution is not None else nd_sbp or []
        dist = ["S{}".format(str(p)[2:-1]) if str(p).startswith("S") else str(p) for p in dist]
        progress = "{}-iteration-sq{}-sa{}-bs{}-sd{}-sp{}-spi{}-{}".format(
            name, seq_length, num_samples, batch_size, seed, "_".join(str(s) for s in sizes), index,
            "_".join(dist))
        from .._core.variables import ConstantInitializer
        b.variable(progress, (1,), _dtypes.int64, ConstantInitializer(0, _dtypes.int64), False, 0,
                   _trace.user_location())
    src = MegatronSource(dataset, batch_size, dt, name, progress)
    param = len(b.params)
    blob = b.data_placeholder(param, name, [batch_size, seq_length + 1], dt, "data.megatron_gpt_mmap_data_loader")
    src.params.append(param)
    b.data_sources.append(src)
    return blob


MegatronGPTMMapDataLoader = megatron_gpt_mmap_data_loader
