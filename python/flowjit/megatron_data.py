"""Writing and reading Megatron-LM's memory-mapped token data sets, for
``flow.data.megatron_gpt_mmap_data_loader``.

A data set is ``<prefix>.bin`` (the tokens of every document, one after the
other) and ``<prefix>.idx`` (its index: Megatron's ``MMIDIDX`` format,
version 1; see ``flowjit._ops.megatron`` for the layout). From the command line::

    python -m flowjit.megatron_data write PREFIX docs.txt [--dtype uint16]
        # one document per line of docs.txt, its token ids separated by spaces
    python -m flowjit.megatron_data write PREFIX docs.npz
        # one document per 1-D integer array of docs.npz
    python -m flowjit.megatron_data info PREFIX
        # documents, tokens and token type of a data set
"""
import argparse
import os
import secrets
import sys
from typing import Iterable, List, Optional, Sequence

import numpy as np

from ._ops.megatron import CODE_OF_DTYPE, MAGIC, VERSION, MegatronIndex

__all__ = ["write", "read_documents"]


def _token_dtype(dtype, largest, smallest):
    if dtype is None:
        # Megatron's best_fitting_dtype: uint16 for a vocabulary under 65500 tokens.
        return np.dtype(np.uint16) if smallest >= 0 and largest < 65500 else np.dtype(np.int32)
    dt = np.dtype(dtype)
    if dt not in CODE_OF_DTYPE:
        raise TypeError(f"megatron_data.write: dtype {dt} is not a token type ("
                        + ", ".join(sorted(str(d) for d in CODE_OF_DTYPE)) + ")")
    info = np.iinfo(dt)
    if smallest < info.min or largest > info.max:
        raise ValueError(f"megatron_data.write: token ids from {smallest} to {largest} do not fit {dt}")
    return dt


def _atomic_write(path, chunks):
    directory = os.path.dirname(os.path.abspath(path))
    # O_EXCL on a fresh name (never through a planted link), mode 0666 less
    # the umask as any data file (mkstemp's would be 0600)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(6)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write(prefix: str, documents: Iterable[Sequence[int]], dtype: Optional[object] = None) -> None:
    """Writes the documents (each a sequence of token ids) as the Megatron
    data set ``prefix.bin`` / ``prefix.idx`` (each through a temporary file
    renamed into place). ``dtype`` is the tokens' type on disk (numpy
    uint8, int8, int16, uint16, int32 or int64); by default uint16 when
    every id is below 65500, else int32, as Megatron chooses.

    Example:
        >>> import os, tempfile
        >>> import flowjit.megatron_data as md
        >>> prefix = os.path.join(tempfile.mkdtemp(), "corpus")
        >>> md.write(prefix, [[1, 2, 3], [4, 5]])
        >>> [d.tolist() for d in md.read_documents(prefix)]
        [[1, 2, 3], [4, 5]]
    """
    docs = []
    for i, d in enumerate(documents):
        a = np.asarray(d)
        if a.ndim != 1 or not (a.size == 0 or a.dtype.kind in "iu"):
            raise TypeError(f"megatron_data.write: document {i} must be a 1-D sequence of integer token ids, "
                            f"got {a.dtype} of shape {a.shape}")
        if a.size and a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.max() > np.iinfo(np.int64).max:
            raise ValueError(f"megatron_data.write: document {i} has token ids past int64")
        docs.append(a.astype(np.int64))
        if len(a) > np.iinfo(np.int32).max:
            raise ValueError(f"megatron_data.write: document {i} has {len(a)} tokens, the index holds int32 sizes")
    largest = max((int(d.max()) for d in docs if d.size), default=0)
    smallest = min((int(d.min()) for d in docs if d.size), default=0)
    dt = _token_dtype(dtype, largest, smallest).newbyteorder("<")
    sizes = np.array([len(d) for d in docs], "<i4")
    pointers = np.zeros(len(docs), "<i8")
    if len(docs) > 1:
        pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64)) * dt.itemsize
    doc_idx = np.arange(len(docs) + 1, dtype="<i8")
    prefix = os.fspath(prefix)
    _atomic_write(prefix + ".bin", (d.astype(dt).tobytes() for d in docs))
    header = (MAGIC + VERSION.to_bytes(8, "little") + bytes([CODE_OF_DTYPE[np.dtype(dt.newbyteorder("="))]])
              + len(docs).to_bytes(8, "little") + len(doc_idx).to_bytes(8, "little"))
    _atomic_write(prefix + ".idx", (header, sizes.tobytes(), pointers.tobytes(), doc_idx.tobytes()))


def read_documents(prefix: str) -> List[np.ndarray]:
    """The documents (sequences, as Megatron's index lists them) of the
    data set ``prefix.idx`` / ``prefix.bin``, each a numpy array of the
    file's token type; the files are checked as the loader checks them.

    Example:
        >>> import os, tempfile
        >>> import flowjit.megatron_data as md
        >>> prefix = os.path.join(tempfile.mkdtemp(), "corpus")
        >>> md.write(prefix, [[7, 8], [9]], dtype=np.int32)
        >>> [d.tolist() for d in md.read_documents(prefix)]
        [[7, 8], [9]]
    """
    index = MegatronIndex(prefix, "megatron_data.read_documents")
    data = np.memmap(index.bin_path, np.uint8, mode="r") if index.bin_size else np.zeros(0, np.uint8)
    return [np.frombuffer(data, index.dtype, int(n), int(p)).astype(index.dtype.newbyteorder("="))
            for n, p in zip(index.sizes, index.pointers)]


def _read_source(path):
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            return [z[k] for k in z.files]
    with open(path) as f:
        return [np.array([int(t) for t in line.split()], np.int64) for line in f if line.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: ``write PREFIX SOURCE [--dtype T]`` and ``info PREFIX``."""
    p = argparse.ArgumentParser(prog="python -m flowjit.megatron_data",
                                description="Megatron mmap token data sets for flow.data.megatron_gpt_mmap_data_loader")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write PREFIX.bin/.idx from a text file (a document of token ids per line) "
                                     "or an .npz of 1-D integer arrays")
    w.add_argument("prefix")
    w.add_argument("source")
    w.add_argument("--dtype", default=None, help="token type on disk (default uint16, or int32 for ids >= 65500)")
    i = sub.add_parser("info", help="documents, tokens and token type of PREFIX.bin/.idx")
    i.add_argument("prefix")
    args = p.parse_args(argv)
    try:
        if args.command == "write":
            docs = _read_source(args.source)
            write(args.prefix, docs, args.dtype)
            print(f"wrote {args.prefix}.bin and {args.prefix}.idx: {len(docs)} documents, "
                  f"{sum(len(d) for d in docs)} tokens")
        else:
            index = MegatronIndex(args.prefix, "megatron_data info")
            print(f"{args.prefix}: {len(index)} documents, {int(index.sizes.sum())} tokens of "
                  f"{index.dtype.newbyteorder('=').name}, {len(index.doc_idx)} doc_idx entries")
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
