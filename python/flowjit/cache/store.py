"""The cache directory as flowjit's C++ writes it (jit/cache.h), read with json and os.

An entry is <dir>/<key[:2]>/<key>/ with meta.json (job, signature, times,
hits, sizes and {bytes, sha256} per file) and the files it lists. Removal
renames the entry into <dir>/tmp/ first, as the compiler does, so that a
process reading the cache never sees half an entry.

Like the compiler, the tool opens files without following links and only if
they are regular files (a FIFO or device is reported, never waited on), and
`verify` checks each entry's MAC under <dir>/hmac.key and who owns and can
write it: what the compiler would refuse is reported as bad.
"""
import hmac
import stat
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
GPU_FILES = ("kernels.ptx",)


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


def read_regular(path):
    """The bytes of `path`, which must be a regular file and not a link (OSError otherwise).

    Opened non-blocking, so a FIFO or a device fails at once instead of hanging."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{os.path.basename(path)} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{os.path.basename(path)} is not a regular file")
        chunks = []
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def untrusted(st, name):
    """Why the compiler would refuse a file or directory with this stat (None when it would not)."""
    if st.st_uid != os.geteuid():
        return f"{name} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        return f"{name} is writable by {who} (mode {st.st_mode & 0o777:03o})"
    return None


def mac_message(key, files):
    """What an entry's MAC covers (jit/cache.cpp mac_message)."""
    m = f"flowjit-cache-mac 1\n{key}\n"
    for name, info in files.items():
        info = info if isinstance(info, dict) else {}
        size = info.get("bytes", -1)
        size = int(size) if isinstance(size, (int, float)) else -1
        sha = info.get("sha256")
        m += f"{name} {size} {sha if isinstance(sha, str) else '-'}\n"
    return m.encode("utf-8", "surrogateescape")


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text):
    """Untrusted text made safe to print: control characters (terminal escape
    sequences included) shown as \\xNN; newlines and tabs kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


# meta.json's fields as jit/cache.cpp writes them: name -> the JSON types allowed.
# A field of another type makes the entry damaged (named in its error), so no
# command meets a list where it reads a string.
_NUMBER = (int, float)
_META_TYPES = {
    "key": (str,), "format": (int,), "mac": (str,), "job": (str,), "source": (str,),
    "signature": (str,), "target": (str,), "flowjit_version": (str,), "build_id": (str,),
    "llvm_version": (str,), "num_kernels": (int,), "arena_bytes": (int,), "total_bytes": (int,),
    "hits": (int,), "compile_seconds": _NUMBER, "codegen_seconds": _NUMBER, "created": _NUMBER,
    "last_used": _NUMBER, "inputs": (list,), "outputs": (list,), "files": (dict,),
}
_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object",
               bool: "true/false", type(None): "null"}


def meta_problem(meta):
    """Why a parsed meta.json cannot be used (None when every known field has its type)."""
    if not isinstance(meta, dict):
        return f"meta.json is {_JSON_NAMES.get(type(meta), type(meta).__name__)}, not an object"
    for name, types in _META_TYPES.items():
        if name not in meta:
            continue
        v = meta[name]
        if isinstance(v, bool) or not isinstance(v, types):
            want = " or ".join(_JSON_NAMES[t] for t in types)
            return f"meta.json field '{name}' is {_JSON_NAMES.get(type(v), type(v).__name__)}, expected {want}"
        if isinstance(v, (int, float)) and not (0 <= v < 2**63):
            return f"meta.json field '{name}' is {v!r}, out of range"
    for name in ("inputs", "outputs"):
        if any(not isinstance(x, str) for x in meta.get(name, [])):
            return f"meta.json field '{name}' holds a non-string"
    for fname, info in meta.get("files", {}).items():
        if not isinstance(info, dict) or isinstance(info.get("bytes"), bool) \
                or not isinstance(info.get("bytes"), int) or not isinstance(info.get("sha256"), str):
            return f"meta.json lists file {clean(fname)!r} without an integer 'bytes' and a string 'sha256'"
    return None


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
    """One cache entry; `meta` is None and `error` says why when meta.json is unusable.

    meta.json is not authenticated until `problems()` checks its MAC, so it is
    treated as hostile: its fields are type-checked, its strings are shown with
    control characters escaped (`clean`), and nothing in it names a path."""

    def __init__(self, path, key, cache=None):
        self.path = path
        self.key = key
        self.cache = cache
        self.meta = None
        self.error = None
        self.meta_bytes = 0
        try:
            raw = read_regular(os.path.join(path, "meta.json"))
            self.meta_bytes = len(raw)
            meta = json.loads(raw)
            why = meta_problem(meta)
            if why:
                self.error = why
            elif not isinstance(meta.get("files"), dict):
                self.error = "meta.json lists no files"
            elif meta.get("key") != key:
                self.error = "meta.json names another key"
            else:
                self.meta = _clean_meta(meta)
        except FileNotFoundError:
            self.error = "meta.json is missing"
        except RecursionError:
            self.error = "meta.json does not parse (nested too deeply)"
        except (OSError, ValueError) as e:
            self.error = clean(f"meta.json does not parse ({e})")

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
        """The bytes of one listed file; ValueError when it fails its checksum."""
        data = read_regular(os.path.join(self.path, name))
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
        """A listed file as text, control characters escaped (see `clean`)."""
        return clean(self.read(name, verify).decode("utf-8", errors="backslashreplace"))

    def authenticated(self):
        """Whether this cache's key authenticates the entry (its MAC), as the compiler requires."""
        secret = self.cache.secret() if self.cache else None
        mac = self.meta.get("mac") if self.meta else None
        return secret is not None and isinstance(mac, str) and hmac.compare_digest(
            mac.encode("ascii", "replace"),
            hmac.new(secret, mac_message(self.key, self.meta["files"]), "sha256").hexdigest().encode())

    def problems(self):
        """Everything wrong with the entry (empty when it is good)."""
        if self.error:
            return [self.error]
        out = []
        for name in ("",) + tuple(self.meta["files"]) + ("meta.json",):
            try:
                why = untrusted(os.lstat(os.path.join(self.path, name)), name or "the entry directory")
            except OSError:
                continue
            if why:
                out.append(why)
        secret = self.cache.secret() if self.cache else None
        if secret is None:
            out.append("the cache has no usable key (hmac.key) to authenticate it")
        elif not self.authenticated():
            out.append("it is not authenticated by this cache's key (copied from another cache, planted, "
                       "or written by an older flowjit)")
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
            except OSError as e:
                out.append(e.strerror if e.filename is None else str(e))
            except ValueError as e:
                out.append(str(e))
        if out:
            return out
        obj = self.read("object.o", verify=False)
        if self.is_gpu:
            if obj and obj[:4] != b"\x7fELF":
                out.append("object.o (the cubin) is not an ELF image")
            why = gpu_plan_problem(self.text("plan.txt", verify=False))
            if why:
                out.append(f"plan.txt: {why}")
            if ".entry " not in self.text("kernels.ptx", verify=False):
                out.append("kernels.ptx has no kernel (.entry)")
        else:
            why = cpu_object_problem(obj)
            if why:
                out.append(f"object.o: {why}")
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


CONTAINER_MAGIC = b"FJKOBJS\0"
CONTAINER_VERSION = 1


def container_objects(blob):
    """The ELF objects of a CPU object container (codegen/cpu/kernel_units.h: magic,
    u32 version, u32 objects, u32 aliases, objects as u64 size + bytes, aliases as two
    u32-sized strings), and the {kernel name: symbol} table. Raises ValueError when damaged."""
    import struct
    if blob[:8] != CONTAINER_MAGIC:
        raise ValueError("not an object container")
    pos = 8

    def take(n):
        nonlocal pos
        if n > len(blob) - pos:
            raise ValueError(f"truncated at byte {pos} of {len(blob)}")
        pos += n
        return blob[pos - n:pos]

    version, n_obj, n_alias = struct.unpack("<III", take(12))
    if version != CONTAINER_VERSION:
        raise ValueError(f"container version {version}, this flowjit reads {CONTAINER_VERSION}")
    objects = [take(struct.unpack("<Q", take(8))[0]) for _ in range(n_obj)]
    aliases = {}
    for _ in range(n_alias):
        name = take(struct.unpack("<I", take(4))[0]).decode("utf-8", "replace")
        aliases[name] = take(struct.unpack("<I", take(4))[0]).decode("utf-8", "replace")
    if pos != len(blob):
        raise ValueError("trailing bytes after the container")
    return objects, aliases


def cpu_object_problem(obj):
    """None when object.o is an ELF object or a container of ELF objects."""
    if obj[:4] == b"\x7fELF":
        return None
    if obj[:8] != CONTAINER_MAGIC:
        return "not an ELF object or an object container"
    try:
        objects, _ = container_objects(obj)
    except ValueError as e:
        return str(e)
    bad = [i for i, o in enumerate(objects) if o[:4] != b"\x7fELF"]
    return f"its object {bad[0]} is not ELF" if bad else None


def gpu_plan_problem(text):
    """Whether every launch of a GPU entry's plan carries its grid (runtime::Plan's
    "launch SYMBOL grid=x,y,z block=x,y,z shared=N ..."); None when they do."""
    for ln in text.splitlines():
        words = ln.split(" ")
        if words[0] == "launch" and not (len(words) >= 5 and words[2].startswith("grid=")
                                         and words[3].startswith("block=")
                                         and words[4].startswith("shared=")):
            return f"launch without a GPU grid {ln!r} (an entry of an older flowjit)"
    return None


def plan_problem(text, num_kernels=None):
    """A light check of a serialized runtime::Plan; None when it looks whole."""
    lines = text.splitlines()
    if not lines or lines[0] != "flowjit-plan 2":
        return "missing header"
    if "end" not in lines:
        return "truncated (no 'end' line)"
    known = {"job", "arena", "input", "output", "variable", "status", "check", "launch", "collective", "summary",
             "end"}
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
            if len(top) != 2 or os.path.islink(tdir) or not os.path.isdir(tdir):
                continue
            for key in sorted(os.listdir(tdir)):
                edir = os.path.join(tdir, key)
                if _KEY.match(key) and key.startswith(top) and not os.path.islink(edir) and os.path.isdir(edir):
                    out.append(Entry(edir, key, self))
        return out

    def secret(self):
        """The key of <dir>/hmac.key as the compiler uses it (its hex text), or None."""
        if not hasattr(self, "_secret"):
            self._secret = None
            try:
                raw = read_regular(os.path.join(self.path, "hmac.key"))
                if len(raw) == 64 and re.match(rb"^[0-9a-f]{64}$", raw):
                    self._secret = raw
            except OSError:
                pass
        return self._secret

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
