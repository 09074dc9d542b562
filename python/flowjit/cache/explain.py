"""Why a job missed the disk cache: which part of its key differs from the
entries the cache holds for the same job, signature and source.

A key hashes the optimized IR, the fusion plan, the kernels, the buffer plan,
the target, the LLVM version, the flowjit build and the version
(jit/cache.h CacheKeyParts). An entry's meta.json and text files hold the same
parts, so comparing them with the job just compiled names the first that
differs; FLOWJIT_DEBUG=1 logs it (flowjit._core.job), in whichever process the
entry was written.
"""
import os
from typing import Any, Dict, List, Optional, Tuple

from . import store

__all__ = ["explain_miss"]


def _entries_for(cache: store.Cache, job: str, signature: str, source: str,
                 own_key: str) -> List[store.Entry]:
    # own_key: the entry the compile just wrote for itself.
    found = [e for e in cache.entries()
             if e.meta is not None and e.key != own_key and e.get("job") == job
             and e.get("signature") == signature and e.get("source", source) == source]
    # The most recently used first: the one a user most likely expected to hit.
    found.sort(key=lambda e: -float(e.get("last_used", 0) or 0))
    return found


def _text(entry: store.Entry, name: str) -> Optional[str]:
    try:
        return entry.text(name, verify=False)
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _first_line_that_differs(a: str, b: str) -> str:
    al, bl = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(al, bl)):
        if x != y:
            return f"line {i + 1}: cached {x.strip()[:80]!r}, now {y.strip()[:80]!r}"
    return f"cached {len(al)} lines, now {len(bl)}"


def _compare(entry: store.Entry, now: Dict[str, str], texts: Dict[str, Tuple[str, str]]) -> Tuple[int, str]:
    """The first key part in which `entry` differs from the job compiled now,
    as (its position in the key's order, the reason)."""
    rank = 0
    for field, label in (("flowjit_version", "the flowjit version"), ("build_id", "the flowjit build"),
                         ("llvm_version", "the LLVM version")):
        cached = str(entry.get(field, ""))
        if field in now and cached != now[field]:
            return rank, f"{label} differs (cached {cached!r}, now {now[field]!r})"
        rank += 1
    if "target" in now:
        cached = str(entry.get("target", "")).split(" x")[0]
        if cached != now["target"]:
            return rank, (f"the target differs (cached {store.short_target(cached)!r}, "
                          f"now {store.short_target(now['target'])!r})")
    rank += 1
    for label, (fname, text) in texts.items():
        stored = _text(entry, fname)
        if stored is not None and stored != text:
            return rank, f"{label} differs ({_first_line_that_differs(stored, text)})"
        rank += 1
    return rank, "the buffer plan (buffers, arena offsets) or the device count differs"


def explain_miss(compiled: Any, job: str, signature: str, source: str,
                 cache_dir: Optional[str] = None) -> str:
    """Why `compiled` (a just compiled _C job that did not come from the disk
    cache) found no entry: none for this job and signature, or the key part
    in which the most recently used one differs."""
    d = cache_dir or store.default_dir()
    cache = store.Cache(d)
    entries = _entries_for(cache, job, signature, source, str(getattr(compiled, "cache_key", "")))
    if not entries:
        return f"no entry for this job and signature in {d}"
    from .. import _C
    info = _C.build_info()
    now = {"flowjit_version": str(info["version"]), "build_id": f"{info['build_id']}+{info['binary_id']}",
           "llvm_version": str(info["llvm_version"])}
    if not str(getattr(compiled, "device", "cpu")).startswith("gpu"):
        now["target"] = str(info["target"])
    texts = {"the optimized IR": ("ir_optimized.txt", compiled.ir_optimized),
             "the fusion plan": ("fusion.txt", compiled.fusion_plan),
             "the kernels": ("kernels.txt", compiled.kernels)}
    # The entry that agrees with the job longest (the most recently used of
    # those) explains the miss best: it is the one the user meant to hit.
    best, (_, why) = max(((e, _compare(e, now, texts)) for e in entries),
                         key=lambda pair: pair[1][0])
    more = f", the closest of {len(entries)} for this job and signature" if len(entries) > 1 else ""
    return f"the cached entry {best.key[:12]}{more}: {why}"


def cache_dir_of_job() -> Optional[str]:
    """The disk cache the compiler uses, None when FLOWJIT_DISABLE_CACHE is set."""
    if os.environ.get("FLOWJIT_DISABLE_CACHE", "").lower() not in ("", "0", "false", "no", "off"):
        return None  # the compiler's env_flag()
    return store.default_dir()
