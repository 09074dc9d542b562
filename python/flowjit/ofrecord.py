"""Writing OneFlow's OFRecord data sets, for the readers inside jobs
(``flow.data.ofrecord_reader``).

A data set is a folder of part files, ``part-0``, ``part-1``, ...; each
record is an int64 byte count followed by an OFRecord protobuf (a map from a
feature name to a list of bytes, floats, doubles, int32s or int64s). The
encoding is flowjit's native one (``_C.ofrecord_encode``), the same code the
reader parses with.

From the command line::

    python -m flowjit.ofrecord npz data.npz out_dir [--parts 4]
        # one record per row of the arrays in data.npz, a feature per array
    python -m flowjit.ofrecord images image_dir out_dir [--parts 4] [--suffix-length 5]
        # image_dir/<class>/<file.jpg>: features "encoded" (the file's bytes),
        # "class/label" (int32, the class folders in sorted order) and
        # "filename" (bytes)
"""
import argparse
import os
from typing import Any, Iterable, List, Mapping, Optional

import numpy as np

from . import _C

__all__ = ["encode", "write", "write_npz", "write_image_folder"]

_KIND = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.int32): "int32",
         np.dtype(np.int64): "int64"}


def _feature(name, value):
    if isinstance(value, (bytes, bytearray)):
        return (name, "bytes", [bytes(value)])
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (bytes, bytearray)) for v in value):
        return (name, "bytes", [bytes(v) for v in value])
    arr = np.asarray(value)
    if arr.dtype.kind == "b" or arr.dtype in (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16),
                                               np.dtype(np.uint16)):
        arr = arr.astype(np.int32)
    elif arr.dtype == np.dtype(np.float16):
        arr = arr.astype(np.float32)
    elif arr.dtype == np.dtype(np.uint32):
        arr = arr.astype(np.int64)
    kind = _KIND.get(arr.dtype)
    if kind is None:
        raise TypeError(f"ofrecord: feature '{name}': cannot store values of dtype {arr.dtype} "
                        "(bytes, bool, integers up to int64 and floats are stored)")
    flat = arr.reshape(-1)
    return (name, kind, [float(v) for v in flat] if kind in ("float", "double") else [int(v) for v in flat])


def encode(record: Mapping[str, Any]) -> bytes:
    """One framed record (the int64 byte count, then the protobuf) from
    {feature name: value}: bytes (or a list of bytes) become a bytes list,
    arrays and numbers a float (float32), double (float64), int32 (bool and
    8/16/32-bit integers) or int64 list, flattened."""
    if not isinstance(record, Mapping):
        raise TypeError(f"ofrecord.encode: expected a mapping of feature name -> value, got "
                        f"{type(record).__name__}")
    return _C.ofrecord_encode([_feature(str(k), v) for k, v in record.items()])


def write(out_dir: str, records: Iterable[Mapping[str, Any]], parts: int = 1, part_name_prefix: str = "part-",
          part_name_suffix_length: int = -1) -> List[str]:
    """Writes the records into ``parts`` part files in ``out_dir`` (made if
    missing), record i into part i % parts; returns the files' paths. Part
    files that exist are replaced."""
    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"ofrecord.write: parts must be an int >= 1, got {parts!r}")
    os.makedirs(out_dir, exist_ok=True)
    names = [os.path.join(out_dir, part_name_prefix + (str(i) if part_name_suffix_length <= 0
                                                       else str(i).zfill(part_name_suffix_length)))
             for i in range(parts)]
    files = [open(n + ".tmp", "wb") for n in names]
    try:
        for i, rec in enumerate(records):
            files[i % parts].write(encode(rec))
    except BaseException:
        for f in files:
            f.close()
            os.unlink(f.name)
        raise
    for f, n in zip(files, names):
        f.close()
        os.replace(f.name, n)
    return names


def write_npz(npz_path: str, out_dir: str, parts: int = 1, part_name_suffix_length: int = -1) -> List[str]:
    """One record per row of the arrays of an .npz file (a feature per
    array; they must share their first extent)."""
    with np.load(npz_path) as z:
        arrays = {k: z[k] for k in z.files}
    if not arrays:
        raise ValueError(f"ofrecord.write_npz: '{npz_path}' holds no arrays")
    n = {k: (a.shape[0] if a.ndim else None) for k, a in arrays.items()}
    if None in n.values() or len(set(n.values())) != 1:
        raise ValueError(f"ofrecord.write_npz: the arrays must share their first extent, got "
                         f"{ {k: a.shape for k, a in arrays.items()} }")
    rows = next(iter(n.values()))
    return write(out_dir, ({k: a[i] for k, a in arrays.items()} for i in range(rows)), parts,
                 part_name_suffix_length=part_name_suffix_length)


def write_image_folder(image_dir: str, out_dir: str, parts: int = 1,
                       extensions: Optional[Iterable[str]] = (".jpg", ".jpeg", ".png"),
                       part_name_suffix_length: int = -1) -> List[str]:
    """image_dir/<class>/<image>: a record per image with its file's bytes
    ("encoded"), its class's index among the sorted class folders
    ("class/label", int32) and its file name ("filename")."""
    classes = sorted(d for d in os.listdir(image_dir) if os.path.isdir(os.path.join(image_dir, d)))
    if not classes:
        raise ValueError(f"ofrecord.write_image_folder: '{image_dir}' has no class folders")
    exts = tuple(e.lower() for e in extensions) if extensions else None

    def records():
        for label, c in enumerate(classes):
            for f in sorted(os.listdir(os.path.join(image_dir, c))):
                if exts and not f.lower().endswith(exts):
                    continue
                with open(os.path.join(image_dir, c, f), "rb") as fh:
                    yield {"encoded": fh.read(), "class/label": np.int32(label), "filename": f.encode()}

    return write(out_dir, records(), parts, part_name_suffix_length=part_name_suffix_length)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m flowjit.ofrecord", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("npz", help="one record per row of the arrays of an .npz file")
    a.add_argument("npz")
    b = sub.add_parser("images", help="a folder of class folders of images")
    b.add_argument("image_dir")
    for p in (a, b):
        p.add_argument("out_dir")
        p.add_argument("--parts", type=int, default=1)
        p.add_argument("--suffix-length", type=int, default=-1,
                       help="zero-pad the part numbers to this many digits (OneFlow's part_name_suffix_length)")
    args = ap.parse_args(argv)
    if args.what == "npz":
        files = write_npz(args.npz, args.out_dir, args.parts, args.suffix_length)
    else:
        files = write_image_folder(args.image_dir, args.out_dir, args.parts,
                                   part_name_suffix_length=args.suffix_length)
    total = sum(os.path.getsize(f) for f in files)
    print(f"wrote {len(files)} part file(s), {total:,} bytes, in {args.out_dir}")


if __name__ == "__main__":
    main()
