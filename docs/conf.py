"""Sphinx configuration of flowjit's documentation (tools/dev.sh docs)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

import flowjit  # noqa: E402 - the installed (or editable) package is what gets documented

project = "flowjit"
author = "the flowjit authors"
copyright = "the flowjit authors, Apache-2.0"  # noqa: A001 - Sphinx's name
version = release = flowjit.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.doctest", "sphinx.ext.napoleon", "sphinx.ext.viewcode",
              "flowjit_api"]
# `sphinx -b doctest` (tools/dev.sh docs) runs the guides' ``testcode``
# blocks, each page in its own namespace and a fresh session, and the
# ``>>>`` examples of the API reference's docstrings, each docstring in a
# namespace and session of its own (see doctest_groups below). Every
# namespace starts from this setup (the default seed again, which an example
# of flow.manual_seed changes), which the API pages state once; the
# docstrings' examples use np, flow and tp without importing them.
doctest_global_setup = """\
import numpy as np
import flowjit as flow
import flowjit.typing as tp
flow.clear_default_session()
flow.manual_seed(0)
"""
exclude_patterns = ["_build", "DESIGN.md"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# Docstrings refer to Blob, DType and numpy types that are not all
# documented objects; an unresolved cross reference is no error.
nitpicky = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_title = f"flowjit {release}"
# Wide enough for the guides' code blocks (lines of up to about 110
# characters, as ruff allows) without a horizontal scroll bar.
html_theme_options = {"page_width": "1240px", "sidebar_width": "240px"}


def doctest_groups(app, what, name, obj, options, lines):
    """Puts each run of ``>>>`` lines of a docstring into a ``.. doctest::``
    directive whose group is the documented name: `sphinx -b doctest` then
    runs every docstring's examples from doctest_global_setup (a fresh
    session, so one example's variables never meet another's) and fails on
    an output that differs. A bare doctest block would join the page's one
    shared group instead. After napoleon (priority 500), which turns an
    ``Example:`` section into a rubric and its unindented lines."""
    out, i = [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = " " * (len(lines[i]) - len(lines[i].lstrip()))
        out += [f"{indent}.. doctest:: {name}", ""]
        while i < len(lines) and lines[i].strip():
            out.append("   " + lines[i])
            i += 1
        out.append("")
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-docstring", doctest_groups, priority=550)
