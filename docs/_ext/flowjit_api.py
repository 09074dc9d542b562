"""A Sphinx directive that documents every public name of a flowjit module.

``.. flowjit-module:: flowjit.math`` expands to one autodoc entry per name
the module shows in ``dir()`` (its ``__all__``, or for ``flowjit`` itself the
computed one), so a name added to the API appears in the reference without
editing the docs, and a name without a docstring fails the build (see
``missing_docstring`` below; the build runs with -W).
"""
import importlib
import inspect
import re
import types

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from flowjit_names import public_names

logger = logging.getLogger(__name__)


def _kind(value):
    if inspect.isclass(value):
        return "autoclass"
    if callable(value) and not isinstance(value, types.ModuleType):
        return "autofunction"
    return "autodata"


# Classes already documented in this build (by their defining module and
# name): a second name for one (an alias such as flow.name_scope) gets a
# :no-index: entry, so there is one target per class.
_documented_classes = set()


class FlowjitModule(SphinxDirective):
    required_arguments = 1
    option_spec = {"exclude": lambda s: [n.strip() for n in s.split(",") if n.strip()]}

    def run(self):
        modname = self.arguments[0]
        module = importlib.import_module(modname)
        exclude = set(self.options.get("exclude", ()))
        lines = [f".. automodule:: {modname}", "   :no-members:", ""]
        for name in public_names(module):
            if name in exclude:
                continue
            value = getattr(module, name)
            if isinstance(value, types.ModuleType):
                continue  # submodules have their own pages
            kind = _kind(value)
            if kind != "autodata" and not inspect.getdoc(value):
                logger.warning(f"{modname}.{name} has no docstring", location=self.get_location())
            lines.append(f".. {kind}:: {modname}.{name}")
            if kind == "autoclass":
                lines += ["   :members:", "   :special-members: __call__"]
                key = (value.__module__, value.__qualname__)
                if key in _documented_classes:
                    lines.append("   :no-index:")
                _documented_classes.add(key)
            elif kind == "autodata":
                lines.append("   :no-value:" if not _short_repr(value) else f"   :annotation: = {_short_repr(value)}")
            lines.append("")
        node = nodes.section()
        node.document = self.state.document
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), self.content_offset, node)
        return node.children


def _short_repr(value):
    r = repr(value)
    return r if len(r) <= 60 and "\n" not in r else ""


_LITERAL = re.compile(r"(``.*?``)")


def plain_bars(app, what, name, obj, options, lines):
    """flowjit's docstrings are prose with formulas such as ``|x|``: a bar
    outside inline literals and literal blocks is text, not an RST
    substitution reference."""
    in_block = False
    block_indent = 0
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if in_block and line.strip() and indent <= block_indent:
            in_block = False
        if not in_block and "|" in line:
            parts = _LITERAL.split(line)
            lines[i] = "".join(p if p.startswith("``") else p.replace("|", "\\|") for p in parts)
        if not in_block and line.rstrip().endswith("::"):
            in_block, block_indent = True, indent


def setup(app):
    app.add_directive("flowjit-module", FlowjitModule)
    app.connect("builder-inited", lambda app: _documented_classes.clear())
    app.connect("autodoc-process-docstring", plain_bars, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
