"""A Sphinx directive that documents every public name of a flowjit module.

``.. flowjit-module:: flowjit.math`` expands to one autodoc entry per name
the module shows in ``dir()`` (its ``__all__``, or for ``flowjit`` itself the
computed one), so a name added to the API appears in the reference without
editing the docs, and a name without a docstring fails the build (see
``missing_docstring`` below; the build runs with -W).
"""
import functools
import importlib
import inspect
import re
import types
from pathlib import Path

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
# The modules with an API page (a flowjit-module directive in the sources),
# found when the build starts.
_page_modules = set()


def _start(app):
    _documented_classes.clear()
    _page_modules.clear()
    for page in Path(app.srcdir).rglob("*.rst"):
        _page_modules.update(re.findall(r"^\.\. flowjit-module:: (\S+)", page.read_text(), re.M))


def _alias_of_an_entry(modname, name, cls):
    """Whether modname.name is a second name for a class that has an entry
    under its own: the name it was defined with, in its defining module,
    which has an API page (flow.optimizer.PolynomialSchduler, OneFlow's
    spelling, for PolynomialScheduler; flow.name_scope for
    flow.scope.namespace). That entry is the class's target, wherever the
    alias comes in the build."""
    home, own = cls.__module__, cls.__qualname__
    if (modname, name) == (home, own) or home not in _page_modules:
        return False
    return own in public_names(importlib.import_module(home))


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
            if _kind(value) != "autodata" and not inspect.getdoc(value):
                logger.warning(f"{modname}.{name} has no docstring", location=self.get_location())
            lines += entry_lines(modname, name, value)
        node = nodes.section()
        node.document = self.state.document
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), self.content_offset, node)
        return node.children


def entry_lines(modname, name, value):
    """The autodoc directive, with its options, of modname.name."""
    kind = _kind(value)
    lines = [f".. {kind}:: {modname}.{name}"]
    if kind == "autoclass":
        lines += ["   :members:", "   :special-members: __call__"]
        inherited = _inherited_members_option(value)
        if inherited:
            lines.append(f"   :inherited-members: {inherited}")
        key = (value.__module__, value.__qualname__)
        if key in _documented_classes or _alias_of_an_entry(modname, name, value):
            lines.append("   :no-index:")
        else:
            _documented_classes.add(key)
    elif kind == "autodata":
        lines.append("   :no-value:" if not _short_repr(value) else f"   :annotation: = {_short_repr(value)}")
    return lines + [""]


def _inherited_members_option(cls):
    """The value of autodoc's ``:inherited-members:`` for a class that
    inherits documented public methods or properties from a flowjit base
    (SGD's ``minimize`` from Optimizer, a scheduler's ``learning_rate``), so
    that its entry shows them: the bases outside flowjit, whose members stay
    out (``object``'s, ``Exception``'s). None when it inherits nothing from
    flowjit."""
    for name in dir(cls):
        if name.startswith("_") or name in vars(cls):
            continue
        owner = next((b for b in cls.__mro__ if name in vars(b)), None)
        member = vars(owner)[name] if owner is not None else None
        if owner is not None and owner.__module__.startswith("flowjit") and \
                isinstance(member, (types.FunctionType, property)) and inspect.getdoc(member):
            break
    else:
        return None
    outside = (b.__name__ for b in cls.__mro__[1:] if not b.__module__.startswith("flowjit"))
    return ", ".join(dict.fromkeys(outside))


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


# viewcode's "[docs]" link back from a highlighted source line.
_BACKLINK = re.compile(r'(<div class="viewcode-block" id="([^"]+)">\s*<a class="viewcode-back" href=")'
                       r'([^"#]*)#([^"]*)(")')


@functools.lru_cache(maxsize=None)
def _module(modname):
    try:
        return importlib.import_module(modname)
    except ImportError:
        return None


def _resolve(modname, dotted):
    """modname's attribute dotted ("Blob.shape"), or None."""
    obj = _module(modname)
    if obj is None:
        return None
    for part in dotted.split("."):
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            return None
    return obj


def viewcode_backlinks(app, pagename, templatename, context, doctree):
    """Points each "[docs]" link of a highlighted source page
    (sphinx.ext.viewcode) at an entry that exists. An object documented
    under several modules (flow.math.relu and flow.nn.relu, flow.Blob and
    flow.nn.Blob) gets from viewcode the page of the last entry but the
    module of the first one, an anchor that page does not have (found by
    tools/check_links.py): the link goes instead to an entry, preferably on
    that page, whose name leads to the same object."""
    if not pagename.startswith("_modules/") or "body" not in context:
        return
    objects = app.env.get_domain("py").objects
    by_last = {}
    for fullname in objects:
        by_last.setdefault(fullname.rsplit(".", 1)[-1], []).append(fullname)
    source_module = pagename[len("_modules/"):].replace("/", ".")

    def fix(m):
        name, page, anchor = m.group(2), m.group(3), m.group(4)
        entry = objects.get(anchor)
        if entry is not None and app.builder.get_relative_uri(pagename, entry.docname) == page:
            return m.group(0)
        obj = _resolve(source_module, name)
        if obj is None:
            return m.group(0)
        same = [f for f in by_last.get(name.rsplit(".", 1)[-1], ()) if f.endswith("." + name) and
                _resolve(f[:-len(name) - 1], name) is obj]
        if not same:
            return m.group(0)
        best = min(same, key=lambda f: (app.builder.get_relative_uri(pagename, objects[f].docname) != page,
                                        len(f), f))
        uri = app.builder.get_relative_uri(pagename, objects[best].docname)
        return f"{m.group(1)}{uri}#{objects[best].node_id}{m.group(5)}"

    context["body"] = _BACKLINK.sub(fix, context["body"])


def setup(app):
    app.add_directive("flowjit-module", FlowjitModule)
    app.connect("builder-inited", _start)
    app.connect("autodoc-process-docstring", plain_bars, priority=600)
    app.connect("html-page-context", viewcode_backlinks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
