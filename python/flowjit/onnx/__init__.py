"""Export a job function to ONNX: its traced graph, before any pass or
fusion, as an ONNX model that ONNX Runtime, TensorRT or any other ONNX
consumer runs without flowjit.

The model takes the job's placeholders as inputs (named after the job's
parameters, with their shapes and dtypes), holds the job's variables as
initializers with their current values in the session, and gives the job's
results as outputs (named after the result blobs). It needs the ``onnx``
package (``pip install onnx``); ``onnxruntime`` runs it."""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Union

from .. import _C
from . import ops as _onnx_ops, trace as _onnx_trace
from .._core.job import JobFunction

try:
    import onnx
except ImportError:  # export() says how to install it
    onnx = None

__all__ = ["DEFAULT_OPSET", "export", "supported_ops"]

# Variables over this many bytes are written beside the model (external data).
_EXTERNAL_BYTES = 1 << 30

#: The ONNX opset (of the standard ``ai.onnx`` domain) a model is written for
#: unless export() is asked for another one (17 or newer).
DEFAULT_OPSET = 17


def supported_ops() -> List[str]:
    """The names of the flowjit IR ops that export() maps to ONNX, sorted
    (the names ``job.compile().as_text("traced")`` prints). An op outside
    this list makes export() raise NotImplementedError naming it."""
    return sorted([_C.OpKind.parameter.name, _C.OpKind.variable.name]
                  + [k.name for k in _onnx_ops.RULES])


def _import_onnx() -> Any:
    if onnx is None:
        raise ImportError("flowjit.onnx.export needs the onnx package: pip install onnx "
                          "(onnxruntime to run the model)")
    return onnx


def _ir_version(opset: int) -> int:
    """The oldest ONNX IR version that has `opset`: what older runtimes read."""
    for _release, ir, ai_onnx, *_ in onnx.helper.VERSION_TABLE:
        if ai_onnx >= opset:
            return ir
    return onnx.IR_VERSION


def export(job: JobFunction, path: Optional[Union[str, "os.PathLike[str]"]] = None, *, opset: int = DEFAULT_OPSET,
           training: bool = False, output_names: Optional[Sequence[str]] = None,
           check: bool = True) -> "onnx.ModelProto":
    """Writes `job`'s graph as an ONNX model to `path` and returns the model.

    Args:
        job: a function decorated with ``@flow.global_function``. Of a train
            job the forward part is exported: the graph from the
            placeholders to the returned blobs, without the gradients and
            the optimizer.
        path: the ``.onnx`` file to write; None writes nothing (the returned
            ``onnx.ModelProto`` can be saved with ``onnx.save``). Over 1 GiB
            of variables go to ``<path>.data`` beside it (ONNX's external
            data), since a protobuf message holds at most 2 GiB.
        opset: the ONNX opset of the standard domain, 17 (the default) or
            newer, up to what the installed onnx package knows.
        training: False (the default) traces the job as a predict job, as a
            model is served: ``flow.nn.dropout`` is the identity and batch
            normalization uses its moving statistics. True traces it as its
            own type; a train job's dropout then draws from ONNX's
            RandomUniform, with the same distribution as flowjit's masks but
            not the same numbers.
        output_names: names for the model's outputs, one per result blob;
            by default each output is named after its blob.
        check: run ``onnx.checker.check_model`` on the model (the default).

    The job is traced for its declared shapes (a ``tp.ListNumpy``
    placeholder at its declared bound) once more, without compiling it.
    Variables the session does not have yet are created and initialized as
    a call of the job would; every variable's current value is written into
    the model, so export after training. Run-time checks (index ranges,
    ``check_numerics``) are not part of the model; gathers clamp an index
    into range as flowjit's kernels do.

    Raises:
        NotImplementedError: the graph has an op without an ONNX mapping
            (the message names it; supported_ops() lists those with one).
        ImportError: the onnx package is not installed.

    Example:
        >>> import flowjit.onnx
        >>> @flow.global_function()
        ... def scores(x: tp.Numpy.Placeholder((4, 8))) -> tp.Numpy:
        ...     return flow.nn.softmax(flow.layers.dense(x, 3, name="dense"), name="probs")
        >>> model = flowjit.onnx.export(scores, None)  # or a path to write
        >>> [i.name for i in model.graph.input], [o.name for o in model.graph.output]
        (['x'], ['probs'])
        >>> sorted(t.name for t in model.graph.initializer)
        ['dense-bias', 'dense-weight']
    """
    if not isinstance(job, JobFunction):
        raise TypeError("flowjit.onnx.export: job must be a function decorated with "
                        f"@flow.global_function, got {type(job).__name__}")
    _import_onnx()
    newest = onnx.defs.onnx_opset_version()
    if not isinstance(opset, int) or isinstance(opset, bool) or not 17 <= opset <= newest:
        raise ValueError(f"flowjit.onnx.export: opset must be an int from 17 to {newest} (the newest "
                         f"the installed onnx {onnx.__version__} knows), got {opset!r}")
    g = _onnx_trace.trace(job, bool(training))
    if output_names is not None:
        output_names = list(output_names)
        if len(output_names) != len(g.results) or not all(isinstance(n, str) and n for n in output_names):
            raise ValueError(f"flowjit.onnx.export: job '{g.job_name}' has {len(g.results)} result(s), "
                             f"so output_names needs as many non-empty strings, got {output_names!r}")
        if len(set(output_names)) != len(output_names):
            raise ValueError(f"flowjit.onnx.export: output_names must differ, got {output_names!r}")
    model = _build(g, opset, output_names)
    # A protobuf message holds at most 2 GiB: larger weights go to a file
    # beside the model (ONNX's external data), and the checker reads the file.
    external = sum(len(t.raw_data) for t in model.graph.initializer) > _EXTERNAL_BYTES
    if external and path is None:
        raise ValueError(f"flowjit.onnx.export: job '{g.job_name}' has over {_EXTERNAL_BYTES >> 20} MiB "
                         "of variables, which an ONNX model keeps in a file beside it: give a path")
    if check and not external:
        onnx.checker.check_model(model, full_check=True)
    if path is not None:
        path = os.fspath(path)
        if external:
            onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                      location=os.path.basename(path) + ".data")
            if check:
                onnx.checker.check_model(path, full_check=True)
        else:
            onnx.save(model, path)
    return model


def _value_info(name: str, node: Any) -> Any:
    return onnx.helper.make_tensor_value_info(name, _onnx_ops.ONNX_DTYPES[node.dtype], list(node.shape))


def _build(g: _onnx_trace.Traced, opset: int, output_names: Optional[List[str]]) -> Any:
    _onnx_ops._init_dtypes(onnx)
    ctx = _onnx_ops.Context(onnx, opset, g.job_name)
    values: List[Optional[str]] = [None] * len(g.nodes)
    inputs = []
    for pname, at, node in g.params:
        name = ctx.name(pname)
        inputs.append(_value_info(name, node))
        if at >= 0:
            values[at] = name
    # Output names are taken before the graph's own values can take them.
    wanted = output_names or [blob for blob, _ in g.results]
    outs = [ctx.name(n) for n in wanted]
    K = _C.OpKind
    for i, node in enumerate(g.nodes):
        if values[i] is not None:
            continue
        if node.op == K.parameter:
            raise AssertionError(f"placeholder {node.attr('name')} is not a parameter of the job")
        if node.op == K.variable:
            vname = node.attr("name")
            values[i] = ctx.initializer(vname, _C.variable_value(vname))
            continue
        rule = _onnx_ops.RULES.get(node.op)
        if rule is None:
            why = _onnx_ops.WHY_NOT.get(node.op, "has no ONNX mapping")
            raise ctx.unsupported(node, f"{why}; flowjit.onnx.supported_ops() lists the ops it exports")
        xs = [values[j] for j in g.operands[i]]
        if node.op in _onnx_ops.SHAPED:
            values[i] = rule(ctx, node, xs, shapes=[g.nodes[j].shape for j in g.operands[i]])
        else:
            values[i] = rule(ctx, node, xs)
    outputs = []
    for name, (_, r) in zip(outs, g.results):
        ctx.nodes.append(onnx.helper.make_node("Identity", [values[r]], [name], name=name))
        outputs.append(_value_info(name, g.nodes[r]))
    graph = onnx.helper.make_graph(ctx.nodes, g.job_name, inputs, outputs, ctx.initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   producer_name="flowjit", producer_version=_version())
    model.ir_version = _ir_version(opset)
    model.doc_string = f"flowjit job '{g.job_name}' ({g.source}), traced before fusion"
    return model


def _version() -> str:
    from .._version import __version__
    return __version__
