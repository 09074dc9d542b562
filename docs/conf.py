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
# blocks, each page in its own namespace and a fresh session, and any
# ``>>>`` example in a docstring.
doctest_global_setup = "import flowjit as _flow\n_flow.clear_default_session()"
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
