"""The cache directory as flowjit's C++ writes it (jit/cache.h), read through
flowjit._C, so the compiler's reader is the only one: `cache_inspect` checks an
entry as the compiler would before running it (who owns and can write it, its
MAC under <dir>/hmac.key, each file's size and SHA-256, its plan and object)
without side effects, and `cache_read` reads one listed file, checked.

An entry is <dir>/<key[:2]>/<key>/ with meta.json (job, signature, times,
hits, sizes and {bytes, sha256} per file) and the files it lists. Removal
renames the entry into <dir>/tmp/ first, as the compiler does, so that a
process reading the cache never sees half an entry.
"""
import errno
import fcntl
import os
import re
import shutil
import stat
import time

from .. import _C

_KEY = re.compile(r"^[0-9a-f]{64}$")


def is_gpu_target(target):
    """GPU entries (target nvptx64-...) hold the PTX; their object.o is the cubin."""
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


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text):
    """Untrusted text made safe to print: control characters (terminal escape
    sequences included) shown as \\xNN; newlines and tabs kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _clean_meta(meta):
    """A copy of a checked meta.json whose strings are safe to print."""
    def walk(v):
        if isinstance(v, str):
            return clean(v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {clean(k): walk(x) for k, x in v.items()}
        return v
    out = walk(meta)
    out["files"] = {k: v for k, v in meta["files"].items()}  # file names are looked up, not printed raw
    return out


class Entry:
    """One cache entry as the compiler's reader sees it; `meta` is None and
    `error` says why when meta.json cannot be shown.

    meta.json is hostile until `problems()` is empty: its strings are shown
    with control characters escaped (`clean`), and nothing in it names a path."""

    def __init__(self, path, key, cache):
        self.path = path
        self.key = key
        self.cache = cache
        report = _C.cache_inspect(os.fsencode(cache.path), key)
        self.meta = _clean_meta(report["meta"]) if report["meta"] is not None else None
        self.error = report["error"] or (None if self.meta else "meta.json cannot be shown")
        self.meta_bytes = report["meta_bytes"]
        self._authenticated = report["authenticated"]
        self._problems = report["problems"]

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
                    total += os.lstat(os.path.join(self.path, name)).st_size
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
        """The bytes of one listed file (FileNotFoundError when it is missing);
        with `verify`, ValueError when it fails meta.json's size or SHA-256."""
        return _C.cache_read(os.fsencode(self.cache.path), self.key, name, bool(verify and self.meta))

    def text(self, name, verify=True):
        """A listed file as text, control characters escaped (see `clean`)."""
        return clean(self.read(name, verify).decode("utf-8", errors="backslashreplace"))

    def authenticated(self):
        """Whether this cache's key authenticates the entry (its MAC), as the compiler requires."""
        return self._authenticated

    def problems(self):
        """Everything the compiler would refuse in the entry (empty when it is good)."""
        return [self.error] if self.error else list(self._problems)

    def remove(self, cache):
        """Renames the entry into tmp/ and deletes it there. False if it was gone."""
        return cache.remove_path(self.path, self.key)


def short_target(target):
    parts = (target or "").split(";")
    if len(parts) >= 2:
        return f"{parts[0].split('-')[0]}/{parts[1]}"
    return target or "?"


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
            if len(top) != 2 or os.path.islink(tdir) or not os.path.isdir(tdir):
                continue
            for key in sorted(os.listdir(tdir)):
                edir = os.path.join(tdir, key)
                if _KEY.match(key) and key.startswith(top) and not os.path.islink(edir) and os.path.isdir(edir):
                    out.append(Entry(edir, key, self))
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
        os.makedirs(tmp, mode=0o700, exist_ok=True)
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
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                raise OSError(errno.EINVAL, "the lock is not a regular file")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None  # a read-only cache: nothing can be removed anyway
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
