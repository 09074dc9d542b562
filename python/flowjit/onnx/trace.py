"""The graph flowjit.onnx exports: a job function traced once more, before any
pass or fusion, as its nodes in topological order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from .. import _C
from .._core import job as _job, trace as _trace


@dataclass
class Traced:
    """One trace of a job, as flowjit.onnx reads it.

    nodes: every node the results depend on, operands before their users;
    operands[i]: the indices in `nodes` of nodes[i]'s inputs;
    params: (name, index in nodes or -1 when no result reads it, node);
    results: (blob name, index in nodes)."""
    job_name: str
    source: str
    nodes: List[Any]
    operands: List[List[int]]
    params: List[Tuple[str, int, Any]]
    results: List[Tuple[str, int]]


class _NodeIds:
    """Node identities for _C.Node handles. A handle is made anew on every
    access (node.inputs gives new ones), so identity is Node.same, looked up
    among the nodes that share op, dtype and shape."""

    def __init__(self) -> None:
        self.nodes: List[Any] = []
        self._buckets: Dict[tuple, List[int]] = {}

    @staticmethod
    def _key(node: Any) -> tuple:
        return (node.op, node.dtype, node.shape)

    def find(self, node: Any) -> int:
        for i in self._buckets.get(self._key(node), ()):
            if self.nodes[i].same(node):
                return i
        return -1

    def add(self, node: Any) -> int:
        self.nodes.append(node)
        self._buckets.setdefault(self._key(node), []).append(len(self.nodes) - 1)
        return len(self.nodes) - 1


def topological(roots: List[Any]) -> Tuple[List[Any], List[List[int]], List[int]]:
    """The nodes `roots` depend on, operands first (an iterative depth-first
    walk: a deep graph does not reach Python's recursion limit), their
    operand indices, and the index of each root."""
    ids = _NodeIds()
    order: List[int] = []
    operands: Dict[int, List[int]] = {}
    done: set = set()
    for root in roots:
        stack: List[Tuple[Any, bool]] = [(root, False)]
        while stack:
            node, post = stack.pop()
            if post:
                i = ids.find(node)
                operands[i] = [ids.find(x) for x in node.inputs]
                order.append(i)
                done.add(i)
                continue
            if ids.find(node) >= 0:
                continue
            ids.add(node)
            stack.append((node, True))
            for x in reversed(node.inputs):
                if ids.find(x) < 0:
                    stack.append((x, False))
    # Renumber in topological order.
    new = {old: k for k, old in enumerate(order)}
    nodes = [ids.nodes[i] for i in order]
    ops = [[new[j] for j in operands[i]] for i in order]
    return nodes, ops, [new[ids.find(r)] for r in roots]


def trace_forward(job: Any, training: bool, what: str) -> Tuple[Any, List[Any]]:
    """Traces `job` (a JobFunction) for its declared shapes, as a predict job
    unless `training` (then as the job's own type): its builder and its
    result blobs, in order. `what` names the caller in errors
    ("flowjit.onnx.export")."""
    job._prepare_session()
    job_type = job._type if training else "predict"
    builder = _job.JobBuilder(job.job_name, job_type, job._config)
    builder.source = job._source
    blobs: List[Any] = []
    index = 0
    for pname, ph in job._params:
        if ph.kind == "ListListNumpy":
            raise NotImplementedError(
                f"{what}: job '{job.job_name}': parameter '{pname}' is a tp.ListListNumpy "
                "placeholder, whose number of arrays is known only from a call; an export takes a "
                "fixed list of inputs (use tp.Numpy placeholders)")
        # A tp.ListNumpy placeholder is one input of its declared (largest) shape.
        blobs.append(builder.placeholder(index, pname, ph.shape, ph.dtype))
        index += 1
    if job._has_tuples:
        blobs = job._group_blobs(blobs)
    _trace.push(builder)
    try:
        result = job._fn(*blobs)
    finally:
        _trace.pop()
        builder.finished = True
    outs: List[Any] = []
    if job._legacy and result is not None:
        _job._flatten_legacy(result, job.job_name, outs)
    else:
        _job._flatten_result(result, job._ret, job.job_name, outs)
    if not outs:
        raise ValueError(f"{what}: job '{job.job_name}' returns nothing, so its export would have no "
                         "outputs")
    return builder, outs


def create_read_variables(builder: Any, nodes: List[Any]) -> None:
    """Creates and initializes, as a call would, the variables among `nodes`
    that the session does not have yet (a job never called): those the
    results read only, so that an optimizer's state is left to the train job."""
    read = {n.attr("name") for n in nodes if n.op == _C.OpKind.variable}
    builder.pending = {k: v for k, v in builder.pending.items() if k in read}
    _job._create_pending_variables(builder)


def trace(job: Any, training: bool) -> Traced:
    """Traces `job` (a JobFunction) for its declared shapes, as a predict job
    unless `training` (then as the job's own type), and creates the
    variables its results read that the session does not have yet."""
    builder, outs = trace_forward(job, training, "flowjit.onnx.export")
    nodes, operands, roots = topological([o._node for o in outs])
    # Placeholders: their place among the nodes (none when no result reads one).
    params = []
    for p in builder.params:
        at = next((i for i, n in enumerate(nodes) if n.op == _C.OpKind.parameter and n.same(p)), -1)
        params.append((p.attr("name"), at, p))
    create_read_variables(builder, nodes)
    return Traced(job.job_name, job._source, nodes, operands, params, [(o.name, r) for o, r in zip(outs, roots)])
