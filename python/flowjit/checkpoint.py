"""flow.checkpoint: save and read session variables in OneFlow's on-disk layout.

    flow.checkpoint.save("model")                        # every session variable
    flow.load_variables(flow.checkpoint.get("model"))    # restore them

A checkpoint is a directory that OneFlow (``flow.checkpoint.save``,
``flow.train.CheckPoint().save``) writes and reads the same way::

    model/
      snapshot_done            empty; written last: the checkpoint is complete
      hidden-weight/
        out                    the value's raw bytes, C order, little-endian
        meta                   shape and dtype, protobuf text (VariableMetaInfo)
      hidden-weight-momentum/
        ...
      System-Train-TrainStep-train_job/
        ...

``meta`` is OneFlow's ``VariableMetaInfo`` message
(oneflow/core/framework/variable_meta_info.proto: ``ShapeProto shape = 2;
DataType data_type = 3;``) as protobuf's text format writes it::

    shape {
      dim: 512
      dim: 784
    }
    data_type: kFloat

A scalar has an empty ``shape {\\n}``. The dtype names are OneFlow's
``DataType`` enum (oneflow/core/common/data_type.proto): kFloat, kDouble,
kInt8, kInt32, kInt64, kUInt8, kBool (kChar reads as int8; kFloat16, kInt16,
kUInt16/32/64 and kComplex64/128 read as the numpy dtypes of those names).

Optimizer state (``-momentum``, ``-m``, ``-v``...) and train steps
(``System-Train-TrainStep-<job>``) are ordinary variables, so a checkpoint
resumes training exactly.

Variable names are directory names, verbatim, as in OneFlow (whose names can
never hold a '/', the separator of its blob names). Names OneFlow cannot
produce are escaped reversibly, percent-style: '%' -> '%25', '/' -> '%2F',
control characters -> '%XX', and the whole names '.', '..' and
'snapshot_done' -> '%2E', '%2E%2E', 'snapshot%5Fdone'. Reading decodes every
'%XX' of an ASCII character (a directory named 'a%2Fb' reads as variable
'a/b').

Saving is atomic: everything is written into a temporary sibling directory
(``.<name>.<random>.saving``), fsynced, ``snapshot_done`` last, and the
directory is renamed into place. An interrupted or failed save leaves no
directory at ``path`` (at most a temporary sibling, which no reader takes for
a checkpoint). Like OneFlow, saving refuses a path that is a file or a
non-empty directory: checkpoints are never overwritten; an empty directory is
replaced.
"""
import errno
import os
import re
import secrets
import shutil
import stat
import time

import numpy as np

from . import _C

__all__ = ["save", "get", "CheckpointError", "SNAPSHOT_DONE_FILENAME", "META_INFO_FILENAME",
           "DATA_FILENAME"]

SNAPSHOT_DONE_FILENAME = "snapshot_done"
META_INFO_FILENAME = "meta"
DATA_FILENAME = "out"


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read (incomplete, corrupt or
    holding something flowjit cannot represent)."""


# ---------------------------------------------------------------- dtypes

# OneFlow's DataType enum: name -> number.
_ONEFLOW_ENUM = {
    "kInvalidDataType": 0, "kChar": 1, "kFloat": 2, "kDouble": 3, "kInt8": 4, "kInt32": 5,
    "kInt64": 6, "kUInt8": 7, "kOFRecord": 8, "kFloat16": 9, "kTensorBuffer": 10, "kBFloat16": 11,
    "kBool": 12, "kUInt16": 13, "kUInt32": 14, "kUInt64": 15, "kUInt128": 16, "kInt16": 17,
    "kInt128": 18, "kComplex32": 19, "kComplex64": 20, "kComplex128": 21,
}
_ENUM_NAME = {v: k for k, v in _ONEFLOW_ENUM.items()}

# OneFlow dtype -> numpy dtype, for those numpy can hold.
_TO_NUMPY = {
    "kChar": np.int8, "kFloat": np.float32, "kDouble": np.float64, "kInt8": np.int8,
    "kInt32": np.int32, "kInt64": np.int64, "kUInt8": np.uint8, "kFloat16": np.float16,
    "kBool": np.bool_, "kUInt16": np.uint16, "kUInt32": np.uint32, "kUInt64": np.uint64,
    "kInt16": np.int16, "kComplex64": np.complex64, "kComplex128": np.complex128,
}
try:  # numpy has no bfloat16; ml_dtypes' is the one flowjit hands out
    import ml_dtypes as _ml_dtypes
    _TO_NUMPY["kBFloat16"] = _ml_dtypes.bfloat16
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    pass
# numpy dtype -> the name written (int8 is kInt8, never kChar).
_FROM_NUMPY = {np.dtype(v): k for k, v in _TO_NUMPY.items() if k != "kChar"}


def oneflow_dtype_name(np_dtype):
    """OneFlow's DataType name of a numpy dtype (np.float32 -> 'kFloat')."""
    name = _FROM_NUMPY.get(np.dtype(np_dtype).newbyteorder("="))
    if name is None:
        raise TypeError(f"numpy dtype {np.dtype(np_dtype)} has no OneFlow DataType")
    return name


# ---------------------------------------------------------------- names

_RESERVED = {".": "%2E", "..": "%2E%2E", SNAPSHOT_DONE_FILENAME: "snapshot%5Fdone"}
_UNSAFE = re.compile(r"[%/\x00-\x1f\x7f]")
_ESCAPE = re.compile(r"%([0-7][0-9A-Fa-f])")
_NAME_MAX = 255  # bytes of one path component on Linux file systems


def escape_name(name):
    """The directory name of variable `name` (the name itself unless it holds
    characters unsafe in a directory name; see the module documentation)."""
    if name in _RESERVED:
        return _RESERVED[name]
    return _UNSAFE.sub(lambda m: "%{:02X}".format(ord(m.group(0))), name)


def unescape_name(dirname):
    """The variable name of directory `dirname` (inverse of escape_name)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), dirname)


# ---------------------------------------------------------------- meta text

def format_meta(shape, np_dtype):
    """The `meta` text of a variable, byte for byte as OneFlow writes it
    (protobuf text_format.MessageToString of a VariableMetaInfo)."""
    lines = ["shape {"]
    lines += [f"  dim: {int(d)}" for d in shape]
    lines += ["}", f"data_type: {oneflow_dtype_name(np_dtype)}"]
    return "\n".join(lines) + "\n"


_TOKEN = re.compile(r"\s+|#[^\n]*|([A-Za-z_][A-Za-z0-9_]*|[-+]?(?:0[xX][0-9a-fA-F]+|[0-9]+)|[{}<>:;,])")


def _tokens(text):
    pos, out = 0, []
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"unexpected character {text[pos]!r} at offset {pos}")
        if m.group(1) is not None:
            out.append(m.group(1))
        pos = m.end()
    return out


def _int(tok, what):
    try:
        return int(tok, 0)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an integer, got {tok!r}") from None


def parse_meta(text):
    """(shape tuple, OneFlow DataType name) from a `meta` file's text.

    Accepts the protobuf text format of VariableMetaInfo: `shape { dim: N ... }`
    (also `shape: {...}` and `<...>`), `data_type: kName` or its enum number;
    raises ValueError for anything else."""
    toks = _tokens(text)
    i, shape, dtype = 0, None, None

    def expect(t):
        nonlocal i
        if i >= len(toks) or toks[i] != t:
            got = toks[i] if i < len(toks) else "end of text"
            raise ValueError(f"expected {t!r}, got {got!r}")
        i += 1

    while i < len(toks):
        field = toks[i]
        i += 1
        if field == "shape":
            if shape is not None:
                raise ValueError("more than one 'shape' field")
            if i < len(toks) and toks[i] == ":":
                i += 1
            if i >= len(toks) or toks[i] not in ("{", "<"):
                raise ValueError("'shape' must be followed by '{'")
            close = "}" if toks[i] == "{" else ">"
            i += 1
            dims = []
            while i < len(toks) and toks[i] != close:
                if toks[i] != "dim":
                    raise ValueError(f"unknown field {toks[i]!r} in 'shape' (only 'dim' is allowed)")
                i += 1
                expect(":")
                if i >= len(toks):
                    raise ValueError("'dim:' without a value")
                d = _int(toks[i], "dim")
                if d < 0:
                    raise ValueError(f"dim must be non-negative, got {d}")
                dims.append(d)
                i += 1
                if i < len(toks) and toks[i] in (";", ","):
                    i += 1
            expect(close)
            shape = tuple(dims)
        elif field == "data_type":
            if dtype is not None:
                raise ValueError("more than one 'data_type' field")
            expect(":")
            if i >= len(toks):
                raise ValueError("'data_type:' without a value")
            tok = toks[i]
            i += 1
            if tok[0].isalpha():
                dtype = tok
            else:
                n = _int(tok, "data_type")
                dtype = _ENUM_NAME.get(n, f"<DataType {n}>")
        elif field in (";", ","):
            continue
        else:
            raise ValueError(f"unknown field {field!r} (VariableMetaInfo has 'shape' and 'data_type')")
    if dtype is None:
        raise ValueError("no 'data_type' field")
    return (shape if shape is not None else ()), dtype


def _numpy_dtype(of_name, name, where):
    np_dt = _TO_NUMPY.get(of_name)
    if np_dt is None:
        if of_name in _ONEFLOW_ENUM:
            raise CheckpointError(f"checkpoint variable '{name}' ({where}) has OneFlow dtype {of_name}, "
                                  "which flowjit cannot represent")
        raise CheckpointError(f"checkpoint variable '{name}' ({where}) has unknown dtype {of_name!r}; "
                              f"known OneFlow dtypes: {', '.join(sorted(_TO_NUMPY))}")
    return np.dtype(np_dt)


# ---------------------------------------------------------------- reading

class _Entry:
    """One variable directory of a checkpoint, validated but not yet read."""

    __slots__ = ("name", "dir", "shape", "dtype")

    def __init__(self, name, var_dir, shape, dtype):
        self.name, self.dir, self.shape, self.dtype = name, var_dir, shape, dtype

    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _open_regular(path, name):
    """A read-only descriptor of `path`, which must be a regular file reached
    without following a symbolic link at its last component (a checkpoint may
    come from someone else: a link in it must not make us read, and later
    save, one of the reader's own files); a FIFO or device fails at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if os.path.islink(path):
            raise CheckpointError(f"checkpoint variable '{name}': '{path}' is a symbolic link; a "
                                  "checkpoint's files are read only when they are regular files") from None
        raise CheckpointError(f"checkpoint variable '{name}': cannot open '{path}': {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"checkpoint variable '{name}': '{path}' is not a regular file")
    return fd


def _scan_variable(var_dir, name, fallback=None):
    """Validates one variable directory; `fallback(name)` gives (shape, dtype)
    for a directory without `meta` (OneFlow accepts those when loading into a
    session that has the variable)."""
    data_path = os.path.join(var_dir, DATA_FILENAME)
    meta_path = os.path.join(var_dir, META_INFO_FILENAME)
    if not os.path.lexists(data_path):
        raise CheckpointError(f"checkpoint variable '{name}' has no data file '{data_path}'")
    os.close(_open_regular(data_path, name))
    if os.path.lexists(meta_path):
        try:
            with os.fdopen(_open_regular(meta_path, name), "r", encoding="utf-8") as f:
                text = f.read(1 << 20)
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"checkpoint variable '{name}': cannot read '{meta_path}': {e}") from None
        try:
            shape, of_name = parse_meta(text)
        except ValueError as e:
            raise CheckpointError(f"checkpoint variable '{name}': cannot parse '{meta_path}': {e}") from None
        dtype = _numpy_dtype(of_name, name, meta_path)
    else:
        known = fallback(name) if fallback is not None else None
        if known is None:
            raise CheckpointError(f"checkpoint variable '{name}' has no meta file '{meta_path}', so its "
                                  "shape and dtype are unknown")
        shape, dtype = tuple(known[0]), np.dtype(known[1])
    entry = _Entry(name, var_dir, tuple(shape), dtype)
    if int(np.prod([int(d) for d in entry.shape], dtype=object)) * dtype.itemsize >= 1 << 62:
        raise CheckpointError(f"checkpoint variable '{name}': shape {entry.shape} in '{meta_path}' is too "
                              "large to be a variable")
    size = os.lstat(data_path).st_size
    if size != entry.nbytes():
        raise CheckpointError(f"checkpoint variable '{name}': '{data_path}' holds {size} bytes but its "
                              f"shape {entry.shape} and dtype {_FROM_NUMPY.get(dtype, dtype)} need "
                              f"{entry.nbytes()} (truncated or corrupt)")
    return entry


def _scan(path, fallback=None):
    """{name: _Entry} of a checkpoint directory, every entry validated."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint '{path}' does not exist")
    if not os.path.isdir(path):
        raise NotADirectoryError(f"checkpoint '{path}' is not a directory")
    if not os.path.isfile(os.path.join(path, SNAPSHOT_DONE_FILENAME)):
        raise CheckpointError(f"checkpoint '{path}' is incomplete: it has no '{SNAPSHOT_DONE_FILENAME}' "
                              "file (an interrupted save, or not a checkpoint directory)")
    entries = {}
    for d in sorted(os.listdir(path)):
        var_dir = os.path.join(path, d)
        if os.path.islink(var_dir):
            raise CheckpointError(f"checkpoint '{path}': '{d}' is a symbolic link; a checkpoint's "
                                  "variable directories are read only when they are real directories")
        if not os.path.isdir(var_dir):
            continue  # snapshot_done and any stray file
        name = unescape_name(d)
        if name in entries:
            raise CheckpointError(f"checkpoint '{path}' holds variable '{name}' twice "
                                  f"('{entries[name].dir}' and '{var_dir}')")
        entries[name] = _scan_variable(var_dir, name, fallback)
    return entries


def _read(entry):
    from ._core.variables import VariableValue
    arr = np.empty(entry.shape, entry.dtype.newbyteorder("<"))
    with os.fdopen(_open_regular(os.path.join(entry.dir, DATA_FILENAME), entry.name), "rb") as f:
        n = f.readinto(arr.reshape(-1).view(np.uint8)) if arr.size else 0
        if n != arr.nbytes or f.read(1):
            raise CheckpointError(f"checkpoint variable '{entry.name}': its data file changed size "
                                  "while being read")
    return arr.astype(entry.dtype, copy=False).view(VariableValue)


def _read_all(entries):
    return {name: _read(e) for name, e in entries.items()}


def get(path):
    """{name: numpy array} of the checkpoint at `path`; the session is not
    touched. `flow.load_variables(flow.checkpoint.get(path))` restores it.

    If `path` is one variable's directory (it holds an `out` file), that
    variable's array is returned, as in OneFlow. Everything is validated
    before anything is read; errors name the variable and what is wrong.

    Example:
        >>> import os, tempfile
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2,), initializer=flow.constant_initializer(2.0))
        >>> _ = job()
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
        >>> flow.checkpoint.save(path)
        >>> flow.checkpoint.get(path)["w"].tolist()
        [2.0, 2.0]
    """
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, DATA_FILENAME)):
        name = unescape_name(os.path.basename(os.path.normpath(path)))
        return _read(_scan_variable(path, name))
    return _read_all(_scan(path))


# ---------------------------------------------------------------- writing

def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # file systems that cannot sync a directory
            raise
    finally:
        os.close(fd)


def _write_file(path, data):
    """Writes bytes to a new file and fsyncs it."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _as_array(name, value):
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"checkpoint.save: the value of '{name}' must be a numpy array, got "
                        f"{type(value).__name__}")
    arr = np.asarray(value)
    try:
        oneflow_dtype_name(arr.dtype)
    except TypeError:
        raise TypeError(f"checkpoint.save: variable '{name}' has dtype {arr.dtype}, which has no "
                        "OneFlow DataType") from None
    # (not ascontiguousarray: it turns a scalar into shape (1,))
    return np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C")


def _check_target(path, api):
    if os.path.isfile(path) or os.path.islink(path):
        raise FileExistsError(f"{api}: '{path}' already exists (a file); checkpoints are never "
                              "overwritten: remove it or choose another path")
    if os.path.isdir(path) and os.listdir(path):
        raise FileExistsError(f"{api}: non-empty directory '{path}' already exists; checkpoints are "
                              "never overwritten (as in OneFlow): remove it or choose another path")


# Staging directories: .<name>.<pid>-<12 hex>.saving (older flowjit: no pid).
_STAGING = re.compile(r"^\..*\.(?:(\d+)-)?[0-9a-f]{12}\.saving$")
_STALE_WITHOUT_PID_S = 3600  # a save whose process cannot be asked is stale after an hour


def _remove_stale_staging(parent):
    """Removes what killed saves left in `parent`: staging directories of ours
    whose process is gone (or, without a pid, older than an hour). A save in
    progress in another live process is left alone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    now = time.time()
    for name in names:
        m = _STAGING.match(name)
        if not m:
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        if m.group(1) is not None:
            pid = int(m.group(1))
            if pid == os.getpid():
                continue  # another thread of ours may be saving into it
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            except (PermissionError, OverflowError):
                alive = True
            # (A pid reused by a live process keeps the directory until the
            # hour has passed.)
            if alive and now - st.st_mtime < _STALE_WITHOUT_PID_S:
                continue
        elif now - st.st_mtime < _STALE_WITHOUT_PID_S:
            continue
        shutil.rmtree(path, ignore_errors=True)


def save(path, var_dict=None):
    """Saves every session variable (or the {name: array} `var_dict`) to the
    directory `path` in OneFlow's layout, atomically.

    `path` must not exist or be an empty directory (like OneFlow, a checkpoint
    is never overwritten); missing parent directories are created. Queued
    asynchronous jobs finish first, so the checkpoint holds the state after
    every job called so far.

    Example:
        >>> import os, tempfile
        >>> @flow.global_function()
        ... def job() -> tp.Numpy:
        ...     return flow.get_variable("w", shape=(2,), initializer=flow.zeros_initializer())
        >>> _ = job()
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
        >>> flow.checkpoint.save(path, {"w": np.float32([3, 4])})
        >>> flow.load_variables(flow.checkpoint.get(path))
        >>> job().tolist()
        [3.0, 4.0]
    """
    api = "checkpoint.save"
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{api}: path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{api}: path must not be empty")
    if var_dict is None:
        from ._core.job import trace_defined_jobs
        trace_defined_jobs()  # jobs not called yet have their initial values saved, as in OneFlow
        _C.sync_session()
        var_dict = {n: _C.variable_value(n) for n in _C.variable_names()}
    elif not isinstance(var_dict, dict):
        raise TypeError(f"{api}: var_dict must be a dict of name -> array, got {type(var_dict).__name__}")
    staged = []
    for name in sorted(var_dict):
        if not isinstance(name, str) or not name:
            raise TypeError(f"{api}: variable names must be non-empty strings, got {name!r}")
        d = escape_name(name)
        if len(d.encode("utf-8", "surrogatepass")) > _NAME_MAX:
            raise ValueError(f"{api}: variable '{name}' has a name too long for a directory "
                             f"({len(d.encode('utf-8', 'surrogatepass'))} bytes, at most {_NAME_MAX})")
        staged.append((name, d, _as_array(name, var_dict[name])))
    _check_target(path, api)

    target = os.path.abspath(path)
    parent, base = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    _remove_stale_staging(parent)
    tmp = None
    while tmp is None:
        candidate = os.path.join(parent, f".{base[:200]}.{os.getpid()}-{secrets.token_hex(6)}.saving")
        try:
            os.mkdir(candidate)
            tmp = candidate
        except FileExistsError:
            continue
    try:
        for name, d, arr in staged:
            var_dir = os.path.join(tmp, d)
            os.mkdir(var_dir)
            _write_file(os.path.join(var_dir, DATA_FILENAME), arr.reshape(-1).view(np.uint8))
            _write_file(os.path.join(var_dir, META_INFO_FILENAME),
                        format_meta(arr.shape, arr.dtype).encode("ascii"))
            _fsync_dir(var_dir)
        _write_file(os.path.join(tmp, SNAPSHOT_DONE_FILENAME), b"")
        _fsync_dir(tmp)
        try:
            os.rename(tmp, target)  # atomic; replaces an empty directory only
        except OSError as e:
            if os.path.exists(target):
                raise FileExistsError(f"{api}: '{path}' was created by someone else while saving; "
                                      "checkpoints are never overwritten") from e
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(parent)
