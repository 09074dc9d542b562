"""Export jobs as a self-contained shared library with a C header, for
serving without Python.

``flowjit.export.export(job, "libmodel.so")`` traces the job (a train job as
its forward, like a predict job: dropout is the identity and batch norm uses
its moving statistics), compiles its kernels ahead of time for an x86-64 CPU
(the host's, or one named as LLVM names it: ``"x86-64-v3"``, ``"znver4"``),
and links them with a small C runtime (the plan that runs them and a thread
pool) and the variables' current values into one library. It needs libc and
libpthread only: no Python, no LLVM, no TBB. The header beside it declares,
per job, a context type, ``<name>_create(num_threads)``, ``<name>_run(ctx,
inputs..., outputs...)``, ``<name>_destroy(ctx)`` and ``<name>_last_error()``,
with every input's and output's dtype and shape as macros. Calls are
thread-safe: concurrent calls on one context each take a workspace of their
own. Linking needs a C compiler (``cc``, or ``$CC``).
"""
from __future__ import annotations

import keyword
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _C
from ._core import dtypes as _dtypes, job as _job
from .onnx import trace as _onnx_trace

__all__ = ["export", "ExportedLibrary"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_RUNTIME_C = os.path.join(_HERE, "_export_runtime.c")
_RUNTIME_H = os.path.join(_HERE, "_export_runtime.h")

# C types of the dtypes, as the header's entry points take them (half types
# travel as their bits).
_C_TYPES = {"bool": "uint8_t", "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t",
            "int64": "int64_t", "float32": "float", "float64": "double", "float16": "uint16_t",
            "bfloat16": "uint16_t"}

# abi::BufferKind
_INPUT, _OUTPUT, _VARIABLE, _ARENA = 0, 1, 2, 3


@dataclass
class ExportedJob:
    """One job's entry points in an exported library."""
    job: str
    prefix: str  # the C names' prefix: <prefix>_create, <prefix>_run, ...
    inputs: List[Tuple[str, str, Tuple[int, ...]]]  # (C name, dtype, shape)
    outputs: List[Tuple[str, str, Tuple[int, ...]]]
    kernels: int  # launches per call
    arena_bytes: int


@dataclass
class ExportedLibrary:
    """What :func:`export` wrote."""
    library: str  # the shared library
    header: str  # its C header
    cpu: str  # the x86-64 CPU the kernels are for ("" : the exporting host)
    target: str  # flowjit's target string of the code (triple;cpu;features;...)
    size_bytes: int  # of the library
    variables_bytes: int  # of the variables' values in it
    jobs: List[ExportedJob] = field(default_factory=list)


def _c_name(text: str, what: str) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", text)
    if not name or name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name) or name in ("int", "char", "float", "double", "void", "long", "short",
                                           "const", "static", "return", "if", "for", "while", "do",
                                           "switch", "case", "struct", "union", "enum", "sizeof"):
        name += "_"
    return name


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", prefix):
        raise ValueError(f"flowjit.export: name must be a C identifier (letters, digits and '_', not "
                         f"starting with a digit), got {prefix!r}")
    return prefix


def _compile_for_export(job: Any, cpu: str) -> Tuple[Dict[str, Any], List[Any]]:
    """Traces `job` as a predict job and compiles it for `cpu`, keeping its
    code: the compiled job's export parts and the result blobs."""
    what = "flowjit.export"
    builder, outs = _onnx_trace.trace_forward(job, False, what)
    if builder.data_sources:
        raise NotImplementedError(f"{what}: job '{job.job_name}' reads flow.data readers (OFRecord); an "
                                  "exported library takes its inputs from the caller: export a job "
                                  "with placeholders for the data")
    if builder.effects:
        raise NotImplementedError(f"{what}: job '{job.job_name}' assigns variables; an exported library "
                                  "holds its variables read-only (export a predict job)")
    nodes, _, _ = _onnx_trace.topological([o._node for o in outs])
    _onnx_trace.create_read_variables(builder, nodes)
    settings: Dict[str, Any] = {"keep_object": True, "cpu": cpu}
    params = list(job._params)
    from ._dist import devices as _devices
    target = _devices.job_target(job.job_name, job._config, builder, params)
    if target.get("device", "cpu") != "cpu":
        raise NotImplementedError(f"{what}: job '{job.job_name}' is placed on a GPU; exporting GPU code "
                                  "(PTX and a driver-API loader) is not supported yet: place the job on "
                                  "the CPU to export it")
    if job._config.get("enable_auto_mixed_precision", False):
        half = job._config.get("mixed_precision_dtype") or _dtypes.bfloat16
        settings["mixed_precision"] = half.name
    req = _C.CompileRequest()
    req.name, req.train, req.source = job.job_name, False, job._source
    req.signature = "export:" + ";".join(f"{ph.dtype.name}{tuple(ph.shape)}" for _, ph in params)
    req.params, req.outputs, req.effects = builder.params, [o._node for o in outs], []
    req.losses, req.lr, req.step, req.trainable, req.optimizer = [], None, None, [], None
    req.watched_grads = []
    req.settings, req.distribution = settings, None
    compiled = _C.compile_job(req)
    return compiled.export_parts(), outs


def _unique(names: List[str]) -> List[str]:
    seen: Dict[str, int] = {}
    out = []
    for n in names:
        k = n
        while k in seen:
            seen[n] += 1
            k = f"{n}_{seen[n]}"
        seen.setdefault(k, 0)
        out.append(k)
    return out


def _c_string(s: str) -> str:
    """A C string literal of `s` (UTF-8; anything not printable ASCII escaped)."""
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        if c in "\\\"":
            out.append("\\" + c)
        elif 32 <= b < 127 and c != "?":
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _i64_list(values: Sequence[int]) -> str:
    return ", ".join(f"{int(v)}LL" for v in values) if values else "0"


class _Library:
    """The generated sources of one library: the variables' blob, the plan
    tables and entry points of each job, and the header."""

    def __init__(self, values: Any = None) -> None:
        # name -> the variable's value (default: the session's)
        self.values = values or _C.variable_value
        self.var_offsets: Dict[str, int] = {}
        self.blob = bytearray()
        self.objects: List[bytes] = []
        self.symbols: List[str] = []
        self.plan_c: List[str] = ['#include "_export_runtime.h"', '#include "export.h"', "", "extern const unsigned char fj_variables[];"]
        self.header: List[str] = []

    def variable(self, name: str, dtype: str, shape: Sequence[int]) -> int:
        if name in self.var_offsets:
            return self.var_offsets[name]
        value = np.ascontiguousarray(self.values(name))
        want = tuple(int(d) for d in shape)
        if tuple(value.shape) != want or getattr(_dtypes.of_numpy(value.dtype), 'name', None) != dtype:
            raise ValueError(f"flowjit.export: variable '{name}' holds {value.dtype}{tuple(value.shape)} "
                             f"but the job was compiled for {dtype}{want}")
        while len(self.blob) % 64:
            self.blob.append(0)
        self.var_offsets[name] = len(self.blob)
        self.blob += value.tobytes()
        return self.var_offsets[name]

    def add_objects(self, objects: List[bytes]) -> None:
        for o in objects:
            if o not in self.objects:
                self.objects.append(o)

    def add_job(self, parts: Dict[str, Any], prefix: str, in_names: List[str], out_names: List[str],
                source: str = "") -> ExportedJob:
        P = prefix
        U = prefix.upper()
        if any(l["collective"] for l in parts["launches"]):
            raise NotImplementedError(f"flowjit.export: job '{parts['job']}' has collectives (several "
                                      "devices); export a job on one device")
        self.add_objects(parts["objects"])
        var_offsets = [self.variable(n, d, s) for n, d, s in parts["variables"]]
        if len(in_names) != len(parts["inputs"]):
            raise RuntimeError(f"flowjit.export: job '{parts['job']}' compiled {len(parts['inputs'])} inputs "
                               f"for {len(in_names)} placeholders")
        inputs = [(n, d, tuple(s)) for n, (d, s) in zip(in_names, parts["inputs"])]
        outputs = [(n, d, tuple(s)) for n, (d, s) in zip(out_names, parts["outputs"])]
        c = self.plan_c
        syms = sorted({l["symbol"] for l in parts["launches"]})
        for s in syms:
            if s not in self.symbols:
                self.symbols.append(s)
                c.append(f"extern void {s}(char *const *, int64_t, int64_t, char *);")
        args, launches = [], []
        status = parts["status_offset"]
        scratch = 0
        for l in parts["launches"]:
            first = len(args)
            checks = 0
            for kind, index, offset in l["args"]:
                args.append(f"{{{kind}, {index}, {offset}LL}}")
                checks |= int(status >= 0 and kind == _ARENA and offset == status)
            scratch = max(scratch, l["scratch_bytes"])
            launches.append(f"{{{l['symbol']}, {first}, {len(l['args'])}, {l['range']}LL, {l['grain']}LL, "
                            f"{l['scratch_bytes']}LL, {checks}}}")
        checks = []
        for i, ch in enumerate(parts["checks"]):
            text = f"job '{ch['job']}'" + (f", {ch['where']}" if ch["where"] else "") + f": {ch['what']}"
            c.append(f"static const int64_t {P}_check{i}_shape[] = {{{_i64_list(ch['shape'])}}};")
            c.append(f"static const int64_t {P}_check{i}_limits[] = {{{_i64_list(ch['limits'])}}};")
            checks.append(f"{{{_c_string(text)}, {int(ch['numerics'])}, {len(ch['shape'])}, {P}_check{i}_shape, "
                          f"{ch['limit']}LL, {P}_check{i}_limits, {len(ch['limits'])}}}")
        nbytes = lambda d, s: int(np.prod(s, dtype=np.int64)) * _dtypes.from_name(d).np.itemsize  # noqa: E731
        c += [
            f"static const fj_arg {P}_args[] = {{{', '.join(args) or '{0, 0, 0}'}}};",
            f"static const fj_launch {P}_launches[] = {{{', '.join(launches)}}};",
            f"static const fj_check {P}_checks[] = {{{', '.join(checks) or '{0}'}}};",
            f"static const int64_t {P}_input_bytes[] = {{{_i64_list([nbytes(d, s) for _, d, s in inputs])}}};",
            f"static const int64_t {P}_output_bytes[] = {{{_i64_list([nbytes(d, s) for _, d, s in outputs])}}};",
            f"static const int64_t {P}_variable_offsets[] = {{{_i64_list(var_offsets)}}};",
            f"static const fj_plan {P}_plan = {{{_c_string(parts['job'])}, {len(inputs)}, {len(outputs)}, "
            f"{len(var_offsets)}, {len(launches)}, {len(checks)}, {P}_input_bytes, {P}_output_bytes, "
            f"fj_variables, {P}_variable_offsets, {P}_launches, {P}_args, {parts['arena_bytes']}LL, "
            f"{status}LL, {scratch}LL, {P}_checks}};",
            "",
            "#define FJ_API __attribute__((visibility(\"default\")))",
            f"FJ_API {P}_context *{P}_create(int num_threads) {{",
            f"  return ({P}_context *)fj_create(&{P}_plan, num_threads);",
            "}",
            f"FJ_API void {P}_destroy({P}_context *ctx) {{ fj_destroy((fj_context *)ctx); }}",
            f"FJ_API const char *{P}_last_error(void) {{ return fj_last_error(); }}",
            f"FJ_API int {P}_num_threads(const {P}_context *ctx) {{ return fj_num_threads((const fj_context *)ctx); }}",
            f"FJ_API int {P}_run_arrays({P}_context *ctx, const void *const *inputs, void *const *outputs) {{",
            "  return fj_run((fj_context *)ctx, inputs, outputs);",
            "}",
        ]
        params = [f"const {_C_TYPES[d]} *{n}" for n, d, _ in inputs] + \
                 [f"{_C_TYPES[d]} *{n}" for n, d, _ in outputs]
        run_sig = f"int {P}_run({P}_context *ctx{''.join(', ' + p for p in params)})"
        c += [f"FJ_API {run_sig} {{",
              f"  const void *in[] = {{{', '.join(n for n, _, _ in inputs) or '0'}}};",
              f"  void *out[] = {{{', '.join(n for n, _, _ in outputs) or '0'}}};",
              "  return fj_run((fj_context *)ctx, in, out);",
              "}", ""]
        h = self.header
        h += [f"/* ---- job '{parts['job']}'{' (' + source + ')' if source else ''}: "
              f"{len(launches)} kernel launches per call. */", ""]
        for kind, items in (("INPUT", inputs), ("OUTPUT", outputs)):
            h.append(f"#define {U}_NUM_{kind}S {len(items)}")
            for i, (n, d, s) in enumerate(items):
                count = int(np.prod(s, dtype=np.int64))
                h += [f"/* {kind.lower()} {i}: {n}, {d}{list(s)} */",
                      f"#define {U}_{kind}{i}_NAME {_c_string(n)}",
                      f"#define {U}_{kind}{i}_DTYPE {_c_string(d)}",
                      f"#define {U}_{kind}{i}_RANK {len(s)}",
                      f"#define {U}_{kind}{i}_SHAPE {{{', '.join(str(x) for x in s) or '1'}}}",
                      f"#define {U}_{kind}{i}_ELEMENTS {count}",
                      f"#define {U}_{kind}{i}_BYTES {nbytes(d, s)}"]
        h += ["",
              f"typedef struct {P}_context {P}_context;",
              "",
              "/* A context: the job's thread pool (num_threads in all, counting the calling",
              "   thread; 0: one per online CPU) and its workspaces. NULL on failure",
              f"   ({P}_last_error() says why). */",
              f"{P}_context *{P}_create(int num_threads);",
              f"void {P}_destroy({P}_context *ctx);",
              f"int {P}_num_threads(const {P}_context *ctx);",
              "/* Runs the job: inputs and outputs C-contiguous, of the dtypes and shapes above",
              "   (any alignment; 64-byte aligned buffers are used in place). Thread-safe.",
              "   Returns FLOWJIT_OK, or an error code with the message in _last_error(). */",
              f"{run_sig};",
              f"int {P}_run_arrays({P}_context *ctx, const void *const *inputs, void *const *outputs);",
              "/* The calling thread's last error message. */",
              f"const char *{P}_last_error(void);",
              ""]
        return ExportedJob(parts["job"], P, inputs, outputs, len(launches), parts["arena_bytes"])

    def header_text(self, guard: str, what: str) -> str:
        return "\n".join([
            f"/* Generated by flowjit.export: {what}. */",
            f"#ifndef {guard}", f"#define {guard}", "",
            "#include <stddef.h>", "#include <stdint.h>", "",
            "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
            "#ifndef FLOWJIT_OK",
            "#define FLOWJIT_OK 0",
            "#define FLOWJIT_ERROR_ARGUMENT 1 /* a null context or buffer */",
            "#define FLOWJIT_ERROR_CHECK 2    /* a check of the run failed (an index out of range, ...) */",
            "#define FLOWJIT_ERROR_MEMORY 3   /* memory for the call could not be allocated */",
            "#endif", "",
            *self.header,
            "#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""])


def _compiler(compiler: Optional[str]) -> str:
    cc = compiler or os.environ.get("CC") or "cc"
    path = shutil.which(cc)
    if path is None:
        raise RuntimeError(f"flowjit.export: linking the library needs a C compiler, and '{cc}' was not "
                           "found (install gcc or clang, or pass compiler=... or set CC)")
    return path


def export(jobs: Union[Any, Sequence[Any]], path: Union[str, "os.PathLike[str]"], *,
           name: Optional[Union[str, Sequence[str]]] = None, cpu: Optional[str] = None,
           header: Optional[Union[str, "os.PathLike[str]"]] = None,
           compiler: Optional[str] = None) -> ExportedLibrary:
    """Writes `jobs` (a job function, or several) as one shared library at
    `path` and a C header (`header`, default `path` with ``.h``).

    name: the C prefix of each job's entry points (default: the job's name).
    cpu: the x86-64 CPU to compile for, as LLVM names it (``"x86-64-v3"``,
    ``"znver4"``, ``"sapphirerapids"``); None: this host (or ``FLOWJIT_CPU``).
    The library holds every variable's current value: export after training.

    >>> import numpy as np, os, tempfile
    >>> import flowjit as flow, flowjit.typing as tp, flowjit.export
    >>> @flow.global_function(type="predict")
    ... def affine(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
    ...     return flow.layers.dense(x, 4, name="affine")
    >>> lib = flowjit.export.export(affine, os.path.join(tempfile.mkdtemp(), "libaffine.so"))
    >>> os.path.basename(lib.header), lib.jobs[0].inputs
    ('libaffine.h', [('x', 'float32', (2, 3))])
    """
    job_list = list(jobs) if isinstance(jobs, (list, tuple)) else [jobs]
    if not job_list:
        raise ValueError("flowjit.export: no job to export")
    for j in job_list:
        if not isinstance(j, _job.JobFunction):
            raise TypeError(f"flowjit.export: expected a job function (made with @flow.global_function), "
                            f"got {type(j).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"flowjit.export: path must be a file path, got {type(path).__name__}")
    path = os.fspath(path)
    header_path = os.fspath(header) if header is not None else os.path.splitext(path)[0] + ".h"
    if name is None:
        prefixes = [_c_name(j.job_name, "job") for j in job_list]
    elif isinstance(name, str):
        if len(job_list) != 1:
            raise ValueError(f"flowjit.export: {len(job_list)} jobs need a list of {len(job_list)} names, "
                             f"got one: {name!r}")
        prefixes = [name]
    else:
        prefixes = list(name)
        if len(prefixes) != len(job_list):
            raise ValueError(f"flowjit.export: {len(job_list)} jobs but {len(prefixes)} names")
    prefixes = [_check_prefix(p) for p in prefixes]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(f"flowjit.export: two jobs would share the C name prefix; names: {prefixes}")
    if cpu is not None and not isinstance(cpu, str):
        raise TypeError(f"flowjit.export: cpu must be a CPU name such as 'x86-64-v3', got {type(cpu).__name__}")
    cpu = cpu or ""
    target, _ = _C.cpu_target(cpu)  # ValueError for an unknown name
    cc = _compiler(compiler)
    lib = _Library()
    exported = []
    for j, prefix in zip(job_list, prefixes):
        parts, outs = _compile_for_export(j, cpu)
        in_names = _unique([_c_name(pname, "input") for pname, _ in j._params])
        out_names = _unique([_c_name(o.name or f"out{i}", "output") for i, o in enumerate(outs)])
        exported.append(lib.add_job(parts, prefix, in_names, out_names, j._source))
    return _link(lib, exported, path, header_path, cc, cpu, target)


def export_cached(plan_text: str, code_object: bytes, path: Union[str, "os.PathLike[str]"], *,
                  target: str, variables: Optional[Dict[str, np.ndarray]] = None, name: Optional[str] = None,
                  header: Optional[Union[str, "os.PathLike[str]"]] = None,
                  compiler: Optional[str] = None) -> ExportedLibrary:
    """A shared library from a disk-cache entry's plan and code object
    (``flowjit-cache export``): the inputs are named in0, in1, ..., the
    outputs out0, ...; `variables` ({name: array}, e.g. a checkpoint's
    ``flow.checkpoint.get(dir)``) must hold every variable the plan reads.
    `target` is the entry's target string."""
    path = os.fspath(path)
    header_path = os.fspath(header) if header is not None else os.path.splitext(path)[0] + ".h"
    parts = _C.plan_export_parts(plan_text, code_object)  # ValueError for a damaged plan
    prefix = _check_prefix(name or _c_name(parts["job"], "job"))
    variables = variables or {}
    missing = [n for n, _, _ in parts["variables"] if n not in variables]
    if missing:
        raise ValueError(f"flowjit.export: job '{parts['job']}' reads {len(parts['variables'])} variable(s) and "
                         f"the values given lack {', '.join(repr(m) for m in missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''} (give a checkpoint with them: "
                         "flow.checkpoint.save(dir) after training)")
    cc = _compiler(compiler)
    lib = _Library(lambda n: variables[n])
    in_names = [f"in{i}" for i in range(len(parts["inputs"]))]
    out_names = [f"out{i}" for i in range(len(parts["outputs"]))]
    exported = [lib.add_job(parts, prefix, in_names, out_names)]
    cpu = target.split(";")[1] if ";" in target else ""
    return _link(lib, exported, path, header_path, cc, cpu, target)


def _link(lib: _Library, exported: List[ExportedJob], path: str, header_path: str, cc: str, cpu: str,
          target: str) -> ExportedLibrary:
    """Writes the library at `path` and its header at `header_path`."""
    prefixes = [e.prefix for e in exported]
    out_dir = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"flowjit.export: the folder of {path!r} does not exist")
    with tempfile.TemporaryDirectory(prefix="flowjit-export-") as tmp:
        files = []
        for i, o in enumerate(lib.objects):
            f = os.path.join(tmp, f"kernels{i}.o")
            with open(f, "wb") as fh:
                fh.write(o)
            files.append(f)
        with open(os.path.join(tmp, "variables.bin"), "wb") as fh:
            fh.write(bytes(lib.blob))
        with open(os.path.join(tmp, "variables.S"), "w") as fh:
            fh.write('\t.section .rodata.flowjit_variables,"a",@progbits\n\t.balign 64\n'
                     '\t.globl fj_variables\n\t.hidden fj_variables\n\t.type fj_variables,@object\n'
                     'fj_variables:\n\t.incbin "variables.bin"\n\t.byte 0\n'
                     '\t.section .note.GNU-stack,"",@progbits\n')
        with open(os.path.join(tmp, "plan.c"), "w") as fh:
            fh.write("\n".join(lib.plan_c) + "\n")
        shutil.copy(_RUNTIME_H, os.path.join(tmp, "_export_runtime.h"))
        shutil.copy(_RUNTIME_C, os.path.join(tmp, "_export_runtime.c"))
        with open(os.path.join(tmp, "exports.map"), "w") as fh:
            fh.write("{\n  global:\n" + "".join(f"    {p}_*;\n" for p in prefixes) + "  local: *;\n};\n")
        head_tmp = os.path.join(tmp, "export.h")
        guard = "FLOWJIT_" + _c_name(os.path.basename(header_path), "header").upper()
        with open(head_tmp, "w") as fh:
            fh.write(lib.header_text(guard, ", ".join(f"job '{e.job}' as {e.prefix}_*" for e in exported) +
                                     f", kernels for {cpu or 'the exporting host'} ({target.split(';')[1]})"))
        out_tmp = os.path.join(tmp, "lib.so")
        cmd = [cc, "-std=gnu11", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
               "-o", out_tmp, "plan.c", "_export_runtime.c", "variables.S", *files,
               "-Wl,--version-script=exports.map", "-Wl,-z,noexecstack", "-Wl,-z,defs",
               "-Wl,--allow-multiple-definition", "-lm"]
        r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("flowjit.export: linking the library failed (a bug in flowjit, please report "
                               f"it):\n{' '.join(cmd)}\n{r.stdout}{r.stderr}")
        shutil.move(out_tmp, path + ".tmp")
        os.replace(path + ".tmp", path)
        shutil.move(head_tmp, header_path + ".tmp")
        os.replace(header_path + ".tmp", header_path)
    return ExportedLibrary(os.path.abspath(path), os.path.abspath(header_path), cpu, target,
                           os.path.getsize(path), len(lib.blob), exported)
