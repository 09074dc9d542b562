"""The fused kernel graph of a cache entry as Graphviz DOT: inputs, variables
and outputs as boxes, kernels as ellipses, an edge wherever a kernel reads a
buffer another kernel (or the caller) wrote."""
import re

_ARG_MODE = re.compile(r"^\s+arg(\d+): (\S+) ?(.*)$")


def _kernel_modes(kernels_text):
    """kernel symbol -> [(type text, reads, writes)] per argument."""
    modes, current = {}, None
    for line in kernels_text.splitlines():
        if line.startswith("kernel "):
            current = modes.setdefault(line.split()[1], [])
            continue
        m = _ARG_MODE.match(line)
        if m and current is not None:
            flags = m.group(3).split()
            current.append((m.group(2), "r" in flags, "w" in flags))
    return modes


def _quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def kernel_graph_dot(plan_text, kernels_text, name="flowjit"):
    """DOT text of the launches in `plan_text` (a serialized runtime::Plan)
    with argument directions from `kernels_text` (the kernel descriptions)."""
    modes = _kernel_modes(kernels_text)
    inputs, outputs, variables, launches = [], [], [], []
    for line in plan_text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "input":
            inputs.append(parts[1])
        elif parts[0] == "output":
            outputs.append(parts[1])
        elif parts[0] == "variable":
            variables.append((parts[2] if len(parts) > 2 else "?", parts[1]))
        elif parts[0] == "launch":
            launches.append({"symbol": parts[1], "args": [a for a in parts[5:]], "summary": ""})
        elif parts[0] == "summary" and launches:
            launches[-1]["summary"] = line[len("summary "):]
    out = [f"digraph {_quote(name)} {{", "  rankdir=TB;", '  node [fontname="monospace", fontsize=10];']
    writer = {}
    for i, t in enumerate(inputs):
        out.append(f'  I{i} [shape=box, style=filled, fillcolor="#dbe9f6", label={_quote(f"input {i}: {t}")}];')
        writer[f"I{i}"] = f"I{i}"
    for i, (vname, t) in enumerate(variables):
        out.append(f'  V{i} [shape=box, style=filled, fillcolor="#fdf1d6", label={_quote(f"{vname}: {t}")}];')
        writer[f"V{i}"] = f"V{i}"
    for i, t in enumerate(outputs):
        out.append(f'  O{i} [shape=box, style=filled, fillcolor="#dff3e0", label={_quote(f"output {i}: {t}")}];')
    for li, launch in enumerate(launches):
        node = f"k{li}"
        label = launch["symbol"] + (f"\\n{launch['summary']}" if launch["summary"] else "")
        collective = launch["symbol"].startswith("@")
        out.append(f"  {node} [shape={'diamond' if collective else 'ellipse'}, label={_quote(label)}];")
        args = modes.get(launch["symbol"], [])
        for ai, ref in enumerate(launch["args"]):
            buf = ref.split("+")[0] if not ref.startswith("A") else ref
            reads, writes = (args[ai][1], args[ai][2]) if ai < len(args) else (True, False)
            if reads and buf in writer and writer[buf] != node:
                out.append(f"  {writer[buf]} -> {node};")
            if writes:
                writer[buf] = node
                if buf.startswith("O"):
                    out.append(f"  {node} -> {buf};")
                elif buf.startswith("V"):
                    out.append(f'  {node} -> {buf} [style=dashed, label="update"];')
    out.append("}")
    return "\n".join(out) + "\n"
