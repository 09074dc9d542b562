"""The public names of a flowjit module, as the API reference lists them
(shared by the Sphinx extension flowjit_api and tests/python/test_docs.py,
which runs without Sphinx)."""
import types


def public_names(module):
    """The module's __all__ (for flowjit itself the computed one), or else
    its names less private ones, the modules it imported and the type hints
    it imported from typing for its annotations (Optional, Callable, ...)."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and not isinstance(v, types.ModuleType)
                 and getattr(v, "__module__", None) != "typing"]
    return sorted(set(names), key=lambda n: (n.lower(), n))
