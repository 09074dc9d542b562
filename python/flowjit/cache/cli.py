"""flowjit-cache: inspect, check and trim flowjit's disk kernel cache.

    flowjit-cache list [--job NAME] [--target TEXT] [--json]
    flowjit-cache show KEY [--ir-before] [--ir] [--fusion] [--kernels] [--plan] [--llvm] [--ptx]
                       [--launches] [--asm] [--all]
    flowjit-cache stats [--json]
    flowjit-cache verify [--remove]
    flowjit-cache gc [--max-bytes N] [--dry-run]
    flowjit-cache clear [--yes]
    flowjit-cache diff KEY1 KEY2 [--full]
    flowjit-cache show KEY --dot [FILE]     the fused kernel graph as Graphviz DOT (and SVG)

Every command takes --json. Also `python -m flowjit.cache`.

KEY may be any unique prefix of a key. The cache directory is --dir, else
$FLOWJIT_CACHE_DIR, else ~/.cache/flowjit.
"""
import argparse
import difflib
import fnmatch
import json
import os
import re
import stat
import sys
import time

from . import fmt
from .store import DEFAULT_MAX_BYTES, Cache, CacheError, default_dir, short_target

# show's sections: flag, file, title
_SECTIONS = (
    ("ir_before", "ir_traced.txt", "IR before optimization"),
    ("ir", "ir_optimized.txt", "IR after optimization"),
    ("fusion", "fusion.txt", "fusion plan (kernel: values computed -> values stored)"),
    ("kernels", "kernels.txt", "kernels"),
    ("plan", "plan.txt", "launch plan"),
    ("llvm", "llvm.ll", "LLVM IR (optimized)"),
    ("ptx", "kernels.ptx", "PTX (GPU entries)"),
    ("launches", "plan.txt", "launches (symbol, CPU range grain scratch or GPU grid block shared, buffers)"),
)
_GPU_ONLY = ("ptx",)


def _launch_lines(plan_text):
    """The launch records of a plan.txt: one line each, with its CPU range or GPU grid."""
    return "".join(ln[len("launch "):] + "\n" for ln in plan_text.splitlines() if ln.startswith("launch "))


# Sections that show part of their file.
_FILTERS = {"launches": _launch_lines}


def _section_text(e, flag, name):
    text = e.text(name)
    return _FILTERS[flag](text) if flag in _FILTERS else text
_DEFAULT_SECTIONS = ("ir_before", "ir", "fusion", "kernels")


def _printable(text):
    """Paths and entry texts need not be UTF-8 (os gives such bytes as surrogates): show them as \\xNN."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _out(text=""):
    sys.stdout.write(_printable(text) + "\n")


_print = _out


def _quiet(text=""):
    pass


def _json(obj):
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _err(style, text):
    sys.stderr.write(style("flowjit-cache: ", "bold") + _printable(text) + "\n")


# ---------------------------------------------------------------- list

def _entry_json(e):
    d = {"key": e.key, "path": e.path, "bytes": e.bytes}
    if e.meta is None:
        d["error"] = e.error
        return d
    for k, v in e.meta.items():
        if k != "files":
            d[k] = v
    d["files"] = e.meta.get("files", {})
    for t in ("created", "last_used"):
        if e.meta.get(t):
            d[t + "_iso"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(e.meta[t]))
    return d


def _filtered(cache, args):
    out = []
    for e in cache.entries():
        if args.job and not fnmatch.fnmatchcase(e.job, args.job):
            continue
        if args.target and args.target not in e.get("target", "") and args.target not in e.target_short:
            continue
        out.append(e)
    return out


def _clip(text, width):
    return text if len(text) <= width else text[: width - 3] + "..."


def cmd_list(cache, args, style):
    entries = _filtered(cache, args)
    key = {"last_used": lambda e: -e.get("last_used", 0), "created": lambda e: -e.get("created", 0),
           "size": lambda e: -e.bytes, "hits": lambda e: -e.get("hits", 0),
           "job": lambda e: (e.job, -e.get("last_used", 0))}[args.sort]
    entries.sort(key=key)
    if args.json:
        json.dump([_entry_json(e) for e in entries], sys.stdout, indent=2)
        _out()
        return 0
    if not entries:
        what = " matching the filters" if (args.job or args.target) else ""
        _out(f"no cache entries{what} in {cache.path}")
        return 0
    now = time.time()
    rows = []
    for e in entries:
        if e.meta is None:
            rows.append([style(e.key[:12], "yellow"), style("(damaged)", "red"), e.error, "", fmt.human_bytes(e.bytes),
                         "", "", "", ""])
            continue
        job, sig = (e.job, e.signature) if args.wide else (_clip(e.job, 32), _clip(e.signature, 44))
        rows.append([style(e.key[:12], "yellow"), job, sig, e.target_short, fmt.human_bytes(e.bytes),
                     str(e.get("hits", 0)), fmt.human_age(e.get("created"), now),
                     fmt.human_age(e.get("last_used"), now), fmt.human_seconds(e.get("compile_seconds"))])
    headers = ["KEY", "JOB", "SIGNATURE", "TARGET", "SIZE", "HITS", "CREATED", "LAST USED", "COMPILE"]
    _out(fmt.table(headers, rows, style, right=("SIZE", "HITS", "COMPILE")))
    total = sum(e.bytes for e in entries)
    _out(style(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {fmt.human_bytes(total)} in "
               f"{cache.path}", "dim"))
    return 0


# ---------------------------------------------------------------- show

def _header(e, style):
    m = e.meta
    files = m.get("files", {})
    rows = [
        ("key", e.key),
        ("job", m.get("job", "?")),
        ("source", m.get("source") or "-"),
        ("signature", m.get("signature") or "-"),
        ("inputs", ", ".join(m.get("inputs", [])) or "()"),
        ("outputs", ", ".join(m.get("outputs", [])) or "()"),
        ("target", _target_summary(m.get("target", "?"))),
        ("build", f"flowjit {m.get('flowjit_version', '?')} build {m.get('build_id', '?')}, "
                  f"LLVM {m.get('llvm_version', '?')}"),
        ("kernels", str(m.get("num_kernels", "?"))),
        ("arena", f"{fmt.human_bytes(m.get('arena_bytes', 0))} ({m.get('arena_bytes', 0)} bytes)"),
        ("cubin" if e.is_gpu else "object", fmt.human_bytes(files.get("object.o", {}).get("bytes", 0))),
        ("size", fmt.human_bytes(e.bytes)),
        ("compile", f"{fmt.human_seconds(m.get('compile_seconds'))} "
                    f"(LLVM {fmt.human_seconds(m.get('codegen_seconds'))})"),
        ("created", f"{fmt.local_time(m.get('created'))} ({fmt.human_age(m.get('created'))})"),
        ("last used", f"{fmt.local_time(m.get('last_used'))} ({fmt.human_age(m.get('last_used'))})"),
        ("hits", str(m.get("hits", 0))),
        ("path", e.path),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{style(k.ljust(w), 'bold')}  {v}" for k, v in rows)


def _section(title, body, style):
    rule = style(f"---- {title}", "cyan", "bold")
    return f"\n{rule}\n{body.rstrip()}"


def _target_summary(target):
    parts = target.split(";")
    if target.startswith("nvptx") and len(parts) >= 2:
        # nvptx64-nvidia-cuda;sm_90;ptx78;tf32=0;math=libdevice;cubin=yes
        rest = [f"PTX {p[3:-1]}.{p[-1]}" if p.startswith("ptx") and p[3:].isdigit() else p for p in parts[2:]]
        return ", ".join([parts[0], parts[1]] + rest)
    if len(parts) < 3:
        return target
    enabled = [f for f in parts[2].split(",") if f.startswith("+")]
    # After the features: the settings the matmul's blocking reads (l1d=, l2=, threads=).
    settings = "".join(f", {p}" for p in parts[3:])
    return f"{parts[0]}, cpu {parts[1]}, {len(enabled)} features enabled (--all lists them){settings}"


def _file_stem(job):
    """A job name as part of a file name in the current directory: no separators,
    no leading dot, no control characters."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", job).lstrip(".")[:80]
    return stem or "job"


def _write_new_or_own(path, text):
    """Writes `path` without following a symbolic link at it (a link or a
    non-regular file there is an error naming it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise CacheError(f"cannot write {path}: {exc.strerror}"
                         + (" (it is a symbolic link)" if os.path.islink(path) else "")) from None
    with os.fdopen(fd, "w") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheError(f"cannot write {path}: not a regular file")
        f.truncate(0)
        f.write(text)


def cmd_show(cache, args, style):
    e = cache.find(args.key)
    if e.meta is None:
        raise CacheError(f"entry {e.key[:12]} is damaged: {e.error} (run `flowjit-cache verify --remove`)")
    if args.dot is not None:
        from .graph import kernel_graph_dot
        dot = kernel_graph_dot(e.text("plan.txt"), e.text("kernels.txt"), e.job)
        # The default name comes from meta.json's job, which nothing authenticates
        # yet: only its letters, digits, '_', '-' and '.' are used, never a path.
        path = args.dot or f"{_file_stem(e.job)}-{e.key[:12]}.dot"
        if path == "-":
            sys.stdout.write(dot)
            return 0
        _write_new_or_own(path, dot)
        made = [path]
        import shutil
        import subprocess
        if shutil.which("dot"):
            svg = os.path.splitext(path)[0] + ".svg"
            if subprocess.run(["dot", "-Tsvg", path, "-o", svg]).returncode == 0:
                made.append(svg)
        if args.json:
            _json({"key": e.key, "written": made})
        else:
            _out("wrote " + " and ".join(made))
        return 0
    chosen = [flag for flag, _, _ in _SECTIONS if getattr(args, flag)]
    if args.all:
        chosen = [flag for flag, _, _ in _SECTIONS if e.is_gpu or flag not in _GPU_ONLY]
    elif not chosen and not args.asm:
        chosen = list(_DEFAULT_SECTIONS)
    parts = [] if args.no_header else [_header(e, style)]
    status = 0
    for flag, name, title in _SECTIONS:
        if flag not in chosen:
            continue
        try:
            parts.append(_section(title, _section_text(e, flag, name), style))
        except (OSError, ValueError) as exc:
            parts.append(_section(title, style(f"(unavailable: {exc})", "red"), style))
            status = 1
    if args.all and not e.is_gpu:
        fields = e.get("target", "?").split(";")
        features = fields[2] if len(fields) > 2 else "?"
        parts.append(_section("target features", features.replace(",", " "), style))
    if (args.asm or args.all) and e.is_gpu:
        if "ptx" not in chosen:  # a GPU entry's assembly is its PTX
            try:
                parts.append(_section("PTX", e.text("kernels.ptx"), style))
            except (OSError, ValueError) as exc:
                parts.append(_section("PTX", style(f"(unavailable: {exc})", "red"), style))
                status = 1
    elif (args.asm or args.all) and not e.authenticated():
        # Assembly means handing the entry's LLVM IR to LLVM: only IR this
        # cache's key authenticates, as the compiler would load it.
        parts.append(_section("assembly", style("(not made: the entry is not authenticated by this cache's "
                                                "key; `flowjit-cache verify` says why)", "red"), style))
        status = 1
    elif args.asm or args.all:
        try:
            from flowjit import _C  # the only use of the compiler: LLVM IR -> assembly
            asm = _C.assembly_from_ir(e.text("llvm.ll"))
            parts.append(_section("assembly (for this host)", asm, style))
        except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
            parts.append(_section("assembly", style(f"(unavailable: {exc})", "red"), style))
            status = 1
    if args.json:
        d = _entry_json(e)
        d["sections"] = {}
        for flag, name, title in _SECTIONS:
            if flag in chosen:
                try:
                    d["sections"][flag if flag in _FILTERS else name] = _section_text(e, flag, name)
                except (OSError, ValueError) as exc:
                    d["sections"][name] = None
                    d.setdefault("errors", {})[name] = str(exc)
        _json(d)
        return status
    _out("\n".join(parts).lstrip("\n"))
    return status


# ---------------------------------------------------------------- export

def cmd_export(cache, args, style):
    """A CPU entry as a shared library with a C header (flowjit.export), its
    variables' values from a checkpoint."""
    e = cache.find(args.key)
    if e.meta is None:
        raise CacheError(f"entry {e.key[:12]} is damaged: {e.error} (run `flowjit-cache verify --remove`)")
    if e.is_gpu:
        raise CacheError(f"entry {e.key[:12]} holds GPU code; exporting GPU code is not supported yet "
                         "(export a CPU entry)")
    if not e.authenticated():
        # Linking its object means running its code: only code this cache's key
        # authenticates, as the compiler would load it.
        raise CacheError(f"entry {e.key[:12]} is not authenticated by this cache's key, so its code is not "
                         "exported (`flowjit-cache verify` says why)")
    from flowjit import checkpoint, export
    try:
        plan = e.read("plan.txt").decode("utf-8")
        obj = e.read("object.o")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CacheError(f"entry {e.key[:12]}: {exc}") from None
    values = checkpoint.get(args.checkpoint) if args.checkpoint else {}
    lib = export.export_cached(plan, obj, args.output, target=e.get("target", ""), variables=values,
                               name=args.name, header=args.header)
    job = lib.jobs[0]
    if args.json:
        _json({"key": e.key, "library": lib.library, "header": lib.header, "bytes": lib.size_bytes,
               "prefix": job.prefix, "inputs": job.inputs, "outputs": job.outputs})
    else:
        _out(f"wrote {lib.library} ({lib.size_bytes} bytes, {job.kernels} kernel launches, variables "
             f"{lib.variables_bytes} bytes) and {lib.header}: {job.prefix}_create/_run/_destroy for job "
             f"'{job.job}' on {short_target(e.get('target', ''))}")
    return 0


# ---------------------------------------------------------------- stats

def cmd_stats(cache, args, style):
    entries = cache.entries()
    good = [e for e in entries if e.meta]
    total = sum(e.bytes for e in entries)
    hits = sum(e.get("hits", 0) for e in good)
    saved = sum(e.get("hits", 0) * e.get("compile_seconds", 0) for e in good)
    limit = _max_bytes_from_env()
    by_job = {}
    for e in good:
        j = by_job.setdefault(e.job, {"entries": 0, "bytes": 0, "hits": 0, "compile_seconds": 0.0})
        j["entries"] += 1
        j["bytes"] += e.bytes
        j["hits"] += e.get("hits", 0)
        j["compile_seconds"] += e.get("compile_seconds", 0)
    targets = sorted({e.target_short for e in good})
    if args.json:
        json.dump({"dir": cache.path, "entries": len(entries), "damaged": len(entries) - len(good),
                   "bytes": total, "max_bytes": limit, "hits": hits, "compile_seconds_saved": saved,
                   "targets": targets, "jobs": by_job}, sys.stdout, indent=2)
        _out()
        return 0
    rows = [("directory", cache.path),
            ("entries", f"{len(entries)}" + (f" ({len(entries) - len(good)} damaged)" if len(good) < len(entries) else "")),
            ("total size", f"{fmt.human_bytes(total)} of {fmt.human_bytes(limit)}"
                           + (f" ({100.0 * total / limit:.1f}% of FLOWJIT_CACHE_MAX_BYTES)" if limit else "")),
            ("hits", str(hits)),
            ("compile time saved", fmt.human_seconds(saved) if saved else "0 s"),
            ("targets", ", ".join(targets) or "-")]
    oldest = min((e.get("last_used", 0) for e in good), default=None)
    if oldest:
        rows.append(("least recently used", fmt.human_age(oldest)))
    w = max(len(k) for k, _ in rows)
    _out("\n".join(f"{style(k.ljust(w), 'bold')}  {v}" for k, v in rows))
    if by_job:
        _out()
        table_rows = [[j, str(d["entries"]), fmt.human_bytes(d["bytes"]), str(d["hits"]),
                       fmt.human_seconds(d["compile_seconds"])]
                      for j, d in sorted(by_job.items(), key=lambda kv: -kv[1]["bytes"])]
        _out(fmt.table(["JOB", "ENTRIES", "SIZE", "HITS", "COMPILE"], table_rows, style,
                       right=("ENTRIES", "SIZE", "HITS", "COMPILE")))
    return 0


def _max_bytes_from_env():
    v = os.environ.get("FLOWJIT_CACHE_MAX_BYTES")
    if v:
        try:
            return fmt.parse_bytes(v)
        except ValueError:
            pass
    return DEFAULT_MAX_BYTES


# ---------------------------------------------------------------- verify, gc, clear

def cmd_verify(cache, args, style):
    entries = cache.entries()
    bad = 0
    if args.json:
        rows = []
        for e in entries:
            problems = e.problems()
            removed = bool(problems) and args.remove and e.remove(cache)
            bad += bool(problems)
            rows.append({"key": e.key, "job": e.job if e.meta else None, "ok": not problems,
                         "problems": problems, "removed": bool(removed)})
        _json({"entries": rows, "checked": len(entries), "bad": bad})
        return 1 if bad and not args.remove else 0
    for e in entries:
        problems = e.problems()
        label = f"{e.key[:12]}  {e.job if e.meta else '?'}"
        if not problems:
            if args.verbose:
                _out(f"{style('ok ', 'green')}  {label}")
            continue
        bad += 1
        removed = args.remove and e.remove(cache)
        tag = style("BAD", "red", "bold")
        _out(f"{tag}  {label}: {'; '.join(problems)}" + (style("  (removed)", "yellow") if removed else ""))
    summary = f"verified {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: {len(entries) - bad} ok, {bad} bad"
    if bad and args.remove:
        summary += ", bad ones removed"
    _out(style(summary, "bold"))
    return 1 if bad and not args.remove else 0


def cmd_gc(cache, args, style):
    limit = fmt.parse_bytes(args.max_bytes) if args.max_bytes is not None else _max_bytes_from_env()
    before = sum(e.bytes for e in cache.entries())
    removed = cache.gc(limit, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    if args.json:
        freed = sum(e.bytes for e in removed)
        _json({"dry_run": args.dry_run, "removed": [{"key": e.key, "job": e.job, "bytes": e.bytes}
                                                     for e in removed],
               "freed_bytes": freed, "left_bytes": before - freed, "max_bytes": limit})
        return 0
    for e in removed:
        _out(f"{verb} {style(e.key[:12], 'yellow')}  {e.job}  {fmt.human_bytes(e.bytes)}  "
             f"(last used {fmt.human_age(e.get('last_used'))})")
    freed = sum(e.bytes for e in removed)
    _out(f"{verb} {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} ({fmt.human_bytes(freed)}); "
         f"{fmt.human_bytes(before - freed)} left, bound {fmt.human_bytes(limit)}")
    return 0


def cmd_clear(cache, args, style):
    entries = cache.entries()
    total = sum(e.bytes for e in entries)
    if not args.yes:
        if not sys.stdin.isatty():
            raise CacheError("clear removes every entry; pass --yes to confirm (stdin is not a terminal)")
        if args.json:
            raise CacheError("clear --json needs --yes")
        answer = input(f"remove {len(entries)} entries ({fmt.human_bytes(total)}) from {cache.path}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            _out("nothing removed")
            return 1
    n = cache.clear() if cache.exists() else 0
    if args.json:
        _json({"removed": n, "bytes": total, "dir": cache.path})
        return 0
    _out(f"removed {n} entr{'y' if n == 1 else 'ies'} ({fmt.human_bytes(total)}) from {cache.path}")
    return 0


# ---------------------------------------------------------------- diff

def _target_diff(a, b):
    pa, pb = a.split(";"), b.split(";")
    if a.startswith("nvptx") and b.startswith("nvptx"):
        # GPU targets are name=value settings after the triple and the SM.
        return [f"{x or '-'} vs {y or '-'}" for x, y in
                zip(pa + [""] * (len(pb) - len(pa)), pb + [""] * (len(pa) - len(pb))) if x != y]
    notes = []
    if pa[:1] != pb[:1]:
        notes.append(f"triple {pa[0]} vs {pb[0]}")
    if pa[1:2] != pb[1:2]:
        notes.append(f"cpu {pa[1] if len(pa) > 1 else '?'} vs {pb[1] if len(pb) > 1 else '?'}")
    fa = set(pa[2].split(",")) if len(pa) > 2 else set()
    fb = set(pb[2].split(",")) if len(pb) > 2 else set()
    if fa != fb:
        only_a = sorted(fa - fb)
        only_b = sorted(fb - fa)
        notes.append(f"features only in the first: {' '.join(only_a) or '-'}; only in the second: "
                     f"{' '.join(only_b) or '-'}")
    notes += [f"{x or '-'} vs {y or '-'}" for x, y in
              zip(pa[3:] + [""] * (len(pb) - len(pa)), pb[3:] + [""] * (len(pa) - len(pb))) if x != y]
    return notes


def _unified(a, b, name_a, name_b, style):
    lines = []
    for ln in difflib.unified_diff(a.splitlines(), b.splitlines(), name_a, name_b, lineterm="", n=2):
        if ln.startswith("+++") or ln.startswith("---"):
            lines.append(style(ln, "bold"))
        elif ln.startswith("@@"):
            lines.append(style(ln, "cyan"))
        elif ln.startswith("+"):
            lines.append(style(ln, "green"))
        elif ln.startswith("-"):
            lines.append(style(ln, "red"))
        else:
            lines.append(ln)
    return "\n".join(lines)


def cmd_diff(cache, args, style):
    a, b = cache.find(args.key1), cache.find(args.key2)
    for e in (a, b):
        if e.meta is None:
            raise CacheError(f"entry {e.key[:12]} is damaged: {e.error}")
    ka, kb = a.key[:12], b.key[:12]
    if args.json:
        style = fmt.Style("never")
        _out = _quiet  # the JSON document is the only output
    else:
        _out = _print
    _out(f"{style('first ', 'bold')} {ka}  {a.job}  {a.signature}  ({a.get('source') or '-'})")
    _out(f"{style('second', 'bold')} {kb}  {b.job}  {b.signature}  ({b.get('source') or '-'})")
    if a.key == b.key:
        if args.json:
            _json({"first": a.key, "second": b.key, "differs": [], "report": [], "why": "the same entry",
                   "diffs": []})
        else:
            _out("the same entry")
        return 0
    differs = []
    report = []

    def field(name, label):
        va, vb = a.get(name), b.get(name)
        if va != vb:
            differs.append(label)
            report.append(f"{style(label, 'bold')}: {va!r} vs {vb!r}")

    field("job", "job name")
    field("source", "source")
    if a.get("inputs") != b.get("inputs") or a.get("signature") != b.get("signature"):
        differs.append("signature")
        report.append(f"{style('signature', 'bold')}: {a.get('signature') or a.signature} vs "
                      f"{b.get('signature') or b.signature}")
        if a.get("inputs") != b.get("inputs"):
            report.append(f"  inputs: {', '.join(a.get('inputs', [])) or '()'} vs "
                          f"{', '.join(b.get('inputs', [])) or '()'}")
    if a.get("outputs") != b.get("outputs"):  # follows from the signature when that changed
        if "signature" not in differs:
            differs.append("outputs")
        report.append(f"  outputs: {', '.join(a.get('outputs', [])) or '()'} vs "
                      f"{', '.join(b.get('outputs', [])) or '()'}")
    if a.get("target") != b.get("target"):
        differs.append("target")
        report.append(f"{style('target', 'bold')}: " + "; ".join(_target_diff(a.get("target", ""), b.get("target", ""))))
    for name, label in (("flowjit_version", "flowjit version"), ("build_id", "flowjit build"),
                        ("llvm_version", "LLVM version")):
        field(name, label)
    texts = (("ir_traced.txt", "traced IR"), ("ir_optimized.txt", "optimized IR"), ("fusion.txt", "fusion plan"),
             ("kernels.txt", "kernels"))
    bodies = []
    for name, label in texts:
        try:
            ta, tb = a.text(name), b.text(name)
        except (OSError, ValueError) as exc:
            report.append(f"{style(label, 'bold')}: cannot compare ({exc})")
            continue
        if ta != tb:
            differs.append(label)
            # The optimized IR repeats a traced-IR change: shown when it is news.
            repeat = name == "ir_optimized.txt" and "traced IR" in differs
            if (name != "kernels.txt" or args.full) and (not repeat or args.full):
                bodies.append(_section(f"{label} diff", _unified(ta, tb, f"{ka}/{name}", f"{kb}/{name}", style),
                                       style))
            else:
                n = sum(1 for ln in difflib.ndiff(ta.splitlines(), tb.splitlines()) if ln[:1] in "+-")
                report.append(f"{style(label, 'bold')}: {n} lines differ (--full shows them)")
    if args.json:
        _json({"first": a.key, "second": b.key, "differs": differs, "report": report,
               "why": _explain(differs), "diffs": bodies})
        return 0
    _out()
    if differs:
        _out(f"{style('differs in', 'bold')}: {', '.join(differs)}")
    else:
        _out("no difference in the recorded inputs (same job, signature, target and build)")
    for r in report:
        _out(r)
    for body in bodies:
        _out(body)
    why = _explain(differs)
    if why:
        _out()
        _out(f"{style('why a recompile', 'bold')}: {why}")
    return 0


def _explain(differs):
    if not differs:
        return ""
    if "job name" in differs:
        return "these are different jobs"
    reasons = []
    if "signature" in differs:
        reasons.append("the placeholder shapes or dtypes changed (each concrete signature compiles once)")
    if any(d in differs for d in ("flowjit version", "flowjit build", "LLVM version")):
        reasons.append("flowjit or LLVM changed, so every key changed")
    if "target" in differs:
        reasons.append("the entries were compiled for different CPUs or GPUs")
    if not reasons and "traced IR" in differs:
        reasons.append("the job body traced to a different graph (code, config or a variable changed)")
    if not reasons and ("optimized IR" in differs or "fusion plan" in differs):
        reasons.append("the same traced graph optimized or fused differently (a compiler setting changed)")
    return "; ".join(reasons)


# ---------------------------------------------------------------- main

def _parser():
    p = argparse.ArgumentParser(prog="flowjit-cache", description="Inspect flowjit's disk kernel cache.",
                                epilog="KEY accepts any unique prefix of a key.")
    p.add_argument("--dir", help="the cache directory (default: $FLOWJIT_CACHE_DIR or ~/.cache/flowjit)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="color output (default: only on a terminal; NO_COLOR always disables it)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("list", help="one row per entry")
    s.add_argument("--job", help="only entries of this job (shell pattern, e.g. 'train_*')")
    s.add_argument("--target", help="only entries whose target contains this text (e.g. avx512f)")
    s.add_argument("--sort", choices=("last_used", "created", "size", "hits", "job"), default="last_used")
    s.add_argument("--json", action="store_true", help="full metadata as JSON")
    s.add_argument("--wide", action="store_true", help="do not shorten long job names and signatures")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("show", help="one entry: source, signature, IR, fusion plan, kernels, LLVM IR, assembly")
    s.add_argument("key")
    s.add_argument("--ir-before", dest="ir_before", action="store_true", help="IR before optimization")
    s.add_argument("--ir", action="store_true", help="IR after optimization")
    s.add_argument("--fusion", action="store_true", help="the fusion plan")
    s.add_argument("--kernels", action="store_true", help="kernel descriptions")
    s.add_argument("--plan", action="store_true", help="the launch plan")
    s.add_argument("--llvm", action="store_true", help="the optimized LLVM IR")
    s.add_argument("--ptx", action="store_true", help="the PTX (GPU entries)")
    s.add_argument("--launches", action="store_true",
                   help="the launch records (from plan.txt): CPU ranges or GPU grids")
    s.add_argument("--asm", action="store_true",
                   help="assembly for this host from the LLVM IR (GPU entries: the PTX)")
    s.add_argument("--all", action="store_true", help="every section")
    s.add_argument("--no-header", action="store_true", help="omit the summary")
    s.add_argument("--dot", nargs="?", const="", default=None, metavar="FILE",
                   help="write the fused kernel graph as Graphviz DOT (default JOB-KEY.dot, '-' for "
                        "stdout; also SVG when `dot` is installed)")
    s.set_defaults(fn=cmd_show)

    s = sub.add_parser("export", help="a CPU entry as a shared library with a C header (variables from a "
                                      "checkpoint)")
    s.add_argument("key")
    s.add_argument("output", help="the library to write, e.g. libmodel.so")
    s.add_argument("--checkpoint", help="a checkpoint directory (flow.checkpoint.save) holding the variables")
    s.add_argument("--name", help="the C prefix of the entry points (default: the job's name)")
    s.add_argument("--header", help="the header to write (default: OUTPUT with .h)")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("stats", help="entries, size, hits, by job")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_stats)

    s = sub.add_parser("verify", help="check every entry as the compiler would before running it")
    s.add_argument("--remove", action="store_true", help="delete the bad entries")
    s.add_argument("-v", "--verbose", action="store_true", help="also list the good entries")
    s.set_defaults(fn=cmd_verify)

    s = sub.add_parser("gc", help="evict least recently used entries down to a size")
    s.add_argument("--max-bytes", help="bound, e.g. 500M (default: FLOWJIT_CACHE_MAX_BYTES or 1 GiB)")
    s.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    s.set_defaults(fn=cmd_gc)

    s = sub.add_parser("clear", help="remove every entry")
    s.add_argument("--yes", "-y", action="store_true", help="do not ask")
    s.set_defaults(fn=cmd_clear)

    s = sub.add_parser("diff", help="what differs between two entries (why did this recompile?)")
    s.add_argument("key1")
    s.add_argument("key2")
    s.add_argument("--full", action="store_true",
                   help="every text diff (also the optimized IR after a traced-IR change, and the kernels)")
    s.set_defaults(fn=cmd_diff)
    for name, sp in sub.choices.items():
        if not any("--json" in a.option_strings for a in sp._actions):
            sp.add_argument("--json", action="store_true", help="the result as JSON")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    style = fmt.Style(args.color)
    err_style = fmt.Style(args.color, sys.stderr)
    cache = Cache(args.dir or default_dir())
    try:
        if os.path.exists(cache.path) and not os.path.isdir(cache.path):
            raise CacheError(f"{cache.path} is not a directory (--dir or FLOWJIT_CACHE_DIR names the cache directory)")
        return args.fn(cache, args, style)
    except CacheError as e:
        if getattr(args, "json", False):
            _json({"error": str(e)})
        else:
            _err(err_style, str(e))
        return 2
    except (ValueError, RuntimeError) as e:  # bad --max-bytes, an export without a C compiler, ...
        _err(err_style, str(e))
        return 2
    except BrokenPipeError:  # `flowjit-cache show KEY --llvm | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
