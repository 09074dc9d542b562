"""The cache directory as flowjit's C++ writes it (jit/cache.h), read with json and os.

An entry is <dir>/<key[:2]>/<key>/ with meta.json (job, signature, times,
hits, sizes and {bytes, sha256} per file) and the files it lists. Removal
renames the entry into <dir>/tmp/ first, as the compiler does, so that a
process reading the cache never sees half an entry.
"""
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import time

_KEY = re.compile(r"^[0-9a-f]{64}$")
FILES = ("object.o", "plan.txt", "ir_traced.txt", "ir_optimized.txt", "fusion.txt", "kernels.txt",
         "llvm.ll")
# GPU entries (target nvptx64-...) also hold the PTX and the launch list; their
# object.o is the cubin, empty when ptxas was not found.
GPU_FILES = ("kernels.ptx", "launches.txt")


def is_gpu_target(target):
    return (target or "").startswith("nvptx")
DEFAULT_MAX_BYTES = 1 << 30


def default_dir():
    """$FLOWJIT_CACHE_DIR, else $XDG_CACHE_HOME/flowjit, else ~/.cache/flowjit (as the compiler)."""
    d = os.environ.get("FLOWJIT_CACHE_DIR")
    if d:
        return d
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "flowjit")
    return os.path.join(os.path.expanduser("~"), ".cache", "flowjit")


class CacheError(Exception):
    """A user-facing problem (no such key, ambiguous prefix)."""


class Entry:
    """One cache entry; `meta` is None and `error` says why when meta.json is unusable."""

    def __init__(self, path, key):
        self.path = path
        self.key = key
        self.meta = None
        self.error = None
        self.meta_bytes = 0
        try:
            with open(os.path.join(path, "meta.json"), "rb") as f:
                raw = f.read()
            self.meta_bytes = len(raw)
            meta = json.loads(raw)
            if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
                self.error = "meta.json lists no files"
            elif meta.get("key") != key:
                self.error = "meta.json names another key"
            else:
                self.meta = meta
        except FileNotFoundError:
            self.error = "meta.json is missing"
        except (OSError, ValueError) as e:
            self.error = f"meta.json does not parse ({e})"

    # ---- metadata with defaults

    def get(self, name, default=None):
        return self.meta.get(name, default) if self.meta else default

    @property
    def job(self):
        return self.get("job", "?")

    @property
    def bytes(self):
        """As eviction counts it: the listed files plus meta.json."""
        if self.meta:
            return int(self.get("total_bytes", 0)) + self.meta_bytes
        total = 0
        try:
            for name in os.listdir(self.path):
                try:
                    total += os.path.getsize(os.path.join(self.path, name))
                except OSError:
                    pass
        except OSError:
            pass
        return total

    @property
    def signature(self):
        """Input types from the plan, e.g. 'f32[100,1,28,28], i32[100]'."""
        inputs = self.get("inputs")
        if inputs:
            return ", ".join(inputs)
        return self.get("signature") or "()"

    @property
    def is_gpu(self):
        return is_gpu_target(self.get("target", ""))

    @property
    def target_short(self):
        """'x86_64-pc-linux-gnu;sapphirerapids;+avx,...' -> 'x86_64/sapphirerapids'."""
        return short_target(self.get("target", ""))

    # ---- files

    def read(self, name, verify=True):
        """The bytes of one listed file; ValueError when it fails its checksum."""
        with open(os.path.join(self.path, name), "rb") as f:
            data = f.read()
        if verify and self.meta:
            info = self.meta["files"].get(name)
            if info is None:
                raise ValueError(f"{name} is not listed in meta.json")
            if len(data) != info.get("bytes"):
                raise ValueError(f"{name} has {len(data)} bytes, meta.json says {info.get('bytes')} "
                                 "(truncated?)")
            if hashlib.sha256(data).hexdigest() != info.get("sha256"):
                raise ValueError(f"{name} fails its SHA-256 checksum")
        return data

    def text(self, name, verify=True):
        return self.read(name, verify).decode("utf-8", errors="replace")

    def problems(self):
        """Everything wrong with the entry (empty when it is good)."""
        if self.error:
            return [self.error]
        out = []
        if self.meta.get("format") != 1:
            out.append(f"unknown format {self.meta.get('format')!r}")
        for name in FILES + (GPU_FILES if self.is_gpu else ()):
            if name not in self.meta["files"]:
                out.append(f"{name} is not listed in meta.json")
        for name in self.meta["files"]:
            try:
                self.read(name)
            except FileNotFoundError:
                out.append(f"{name} is missing")
            except (OSError, ValueError) as e:
                out.append(str(e))
        if out:
            return out
        obj = self.read("object.o", verify=False)
        if self.is_gpu:
            if obj and obj[:4] != b"\x7fELF":
                out.append("object.o (the cubin) is not an ELF image")
            why = launches_problem(self.text("launches.txt", verify=False), self.meta.get("num_kernels"))
            if why:
                out.append(f"launches.txt: {why}")
            if ".entry " not in self.text("kernels.ptx", verify=False):
                out.append("kernels.ptx has no kernel (.entry)")
        elif obj[:4] != b"\x7fELF":
            out.append("object.o is not an ELF object")
        why = plan_problem(self.text("plan.txt", verify=False), self.meta.get("num_kernels"))
        if why:
            out.append(f"plan.txt: {why}")
        return out

    def remove(self, cache):
        """Renames the entry into tmp/ and deletes it there. False if it was gone."""
        return cache.remove_path(self.path, self.key)


def short_target(target):
    parts = (target or "").split(";")
    if len(parts) >= 2:
        return f"{parts[0].split('-')[0]}/{parts[1]}"
    return target or "?"


def launches_problem(text, num_kernels=None):
    """A light check of a GPU launch list (runtime/cuda serialize_launches); None when it looks whole."""
    lines = [ln for ln in text.splitlines() if ln]
    for ln in lines:
        words = ln.split(" ")
        if len(words) != 9 or words[0] != "gpulaunch" or not all(w.isdigit() for w in words[2:]):
            return f"bad line {ln!r}"
    if num_kernels is not None and len(lines) != num_kernels:
        return f"{len(lines)} launches, meta.json says {num_kernels} kernels"
    return None


def plan_problem(text, num_kernels=None):
    """A light check of a serialized runtime::Plan; None when it looks whole."""
    lines = text.splitlines()
    if not lines or lines[0] != "flowjit-plan 2":
        return "missing header"
    if "end" not in lines:
        return "truncated (no 'end' line)"
    known = {"job", "arena", "input", "output", "variable", "launch", "collective", "summary", "end"}
    launches = 0
    for ln in lines[1:lines.index("end")]:
        word = ln.split(" ", 1)[0]
        if word and word not in known:
            return f"unknown line {ln!r}"
        if word == "launch":
            launches += 1
    if num_kernels is not None and launches != num_kernels:
        return f"{launches} launches, meta.json says {num_kernels} kernels"
    return None


class Cache:
    def __init__(self, path):
        self.path = os.path.abspath(path)

    def exists(self):
        return os.path.isdir(self.path)

    def entries(self):
        out = []
        try:
            tops = sorted(os.listdir(self.path))
        except FileNotFoundError:
            return out
        for top in tops:
            tdir = os.path.join(self.path, top)
            if len(top) != 2 or not os.path.isdir(tdir):
                continue
            for key in sorted(os.listdir(tdir)):
                if _KEY.match(key) and key.startswith(top) and os.path.isdir(os.path.join(tdir, key)):
                    out.append(Entry(os.path.join(tdir, key), key))
        return out

    def find(self, prefix):
        """The entry whose key starts with `prefix` (which must pick one)."""
        prefix = prefix.strip().lower()
        if not prefix or not re.match(r"^[0-9a-f]+$", prefix):
            raise CacheError(f"'{prefix}' is not a key or key prefix (hex digits)")
        found = [e for e in self.entries() if e.key.startswith(prefix)]
        if not found:
            raise CacheError(f"no cache entry has a key starting with '{prefix}' in {self.path}")
        if len(found) > 1:
            names = ", ".join(f"{e.key[:12]} ({e.job})" for e in found[:6])
            raise CacheError(f"key prefix '{prefix}' is ambiguous: {len(found)} entries match ({names}); "
                             "give more digits")
        return found[0]

    def staging(self):
        """Leftovers in tmp/: staging directories of running or crashed writers."""
        try:
            return [os.path.join(self.path, "tmp", n) for n in os.listdir(os.path.join(self.path, "tmp"))]
        except FileNotFoundError:
            return []

    def remove_path(self, path, key):
        tmp = os.path.join(self.path, "tmp")
        os.makedirs(tmp, exist_ok=True)
        dead = os.path.join(tmp, f"dead-{key[:16]}-{os.getpid()}-{time.monotonic_ns()}")
        try:
            os.rename(path, dead)
        except FileNotFoundError:
            return False
        shutil.rmtree(dead, ignore_errors=True)
        return True

    def lock(self):
        """The eviction lock the compiler takes (an flock on <dir>/lock)."""
        return _Lock(os.path.join(self.path, "lock"))

    def gc(self, max_bytes, dry_run=False):
        """LRU eviction down to max_bytes. Returns the removed entries."""
        with self.lock():
            entries = self.entries()
            total = sum(e.bytes for e in entries)
            removed = []
            for e in sorted(entries, key=lambda e: e.get("last_used", 0)):
                if total <= max_bytes:
                    break
                if dry_run or e.remove(self):
                    total -= e.bytes
                    removed.append(e)
            if not dry_run:
                now = time.time()
                for p in self.staging():
                    name = os.path.basename(p)
                    try:
                        old = now - os.path.getmtime(p) > 3600
                    except OSError:
                        continue
                    if name.startswith("dead-") or old:
                        shutil.rmtree(p, ignore_errors=True)
            return removed

    def clear(self):
        """Removes every entry and the staging area; leaves other files alone."""
        with self.lock():
            n = 0
            for e in self.entries():
                n += bool(e.remove(self))
            shutil.rmtree(os.path.join(self.path, "tmp"), ignore_errors=True)
            for top in os.listdir(self.path):
                p = os.path.join(self.path, top)
                if len(top) == 2 and os.path.isdir(p):
                    try:
                        os.rmdir(p)
                    except OSError as e:
                        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                            raise
            return n


class _Lock:
    def __init__(self, path):
        self.path = path
        self.fd = None

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None  # a read-only cache: nothing can be removed anyway
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
