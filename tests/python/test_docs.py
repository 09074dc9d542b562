"""What the API reference is built from: every public name has a docstring,
generated op functions carry their public names, and the public signatures
have type hints (tools/dev.sh docs builds the HTML with sphinx -W)."""
import importlib
import inspect
import pydoc
import sys
import types
import typing
from pathlib import Path

import pytest

import flowjit as flow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import flowjit_names  # noqa: E402 - the docs' own list of public names

MODULES = ["flowjit"] + [f"flowjit.{m}" for m in flow._PUBLIC_MODULES] + ["flowjit.cache", "flowjit.onnx", "flowjit.ofrecord",
                                                                             "flowjit.megatron_data"]


def _public(modname):
    m = importlib.import_module(modname)
    for name in flowjit_names.public_names(m):
        v = getattr(m, name)
        if not isinstance(v, types.ModuleType):
            yield f"{modname}.{name}", v


def test_every_public_function_and_class_has_a_docstring():
    missing = [full for mod in MODULES for full, v in _public(mod)
               if (inspect.isclass(v) or callable(v)) and not inspect.getdoc(v)]
    assert missing == []


def test_every_module_has_an_api_page():
    pages = {p.read_text().split(".. flowjit-module:: ")[1].strip()
             for p in (ROOT / "docs" / "api").glob("*.rst")}
    assert set(MODULES) <= pages


@pytest.mark.parametrize("fn,name", [(flow.math.exp, "exp"), (flow.math.add, "add"),
                                     (flow.math.logical_and, "logical_and"),
                                     (flow.math.reduce_sum, "reduce_sum"), (flow.nn.relu, "relu")])
def test_generated_op_functions_show_their_public_name(fn, name):
    assert fn.__name__ == name and fn.__qualname__ == name
    assert "<locals>" not in repr(fn)
    text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
    assert "<locals>" not in text and f"{name}(" in text
    # Each op says what it computes, not only its own name.
    assert fn.__doc__.split("\n")[0] not in (f"Elementwise {name}(x).", f"Elementwise {name}(x, y).")


def test_elementwise_docstrings_differ_per_op():
    ops = [flow.math.exp, flow.math.log, flow.math.sqrt, flow.math.sin, flow.math.add, flow.math.divide]
    assert len({f.__doc__ for f in ops}) == len(ops)


@pytest.mark.parametrize("fn", [flow.global_function, flow.math.exp, flow.math.add, flow.math.reduce_sum,
                                flow.layers.dense, flow.nn.bias_add, flow.optimizer.SGD.minimize,
                                flow.get_variable, flow.zeros_like, flow.typing.Numpy.Placeholder.__init__])
def test_public_signatures_have_type_hints(fn):
    hints = typing.get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters if p not in ("self", "args", "kwargs")]
    assert params and all(p in hints for p in params), (params, hints)


def test_the_reference_shows_what_optimizers_and_schedulers_inherit():
    # minimize is Optimizer's, learning_rate _Scheduler's: the classes' entries
    # list them (autodoc's :inherited-members:, less object's members);
    # classes that inherit only from outside flowjit (exceptions) do not.
    pytest.importorskip("sphinx")
    import flowjit_api

    for cls in (flow.optimizer.SGD, flow.optimizer.Adam, flow.optimizer.LazyAdam, flow.optimizer.LAMB,
                flow.optimizer.CosineScheduler):
        lines = flowjit_api.entry_lines("flowjit.optimizer", cls.__name__, cls)
        assert lines[0] == f".. autoclass:: flowjit.optimizer.{cls.__name__}"
        assert "   :inherited-members: object" in lines, lines
    for name in ("CacheWarning", "Size", "Blob"):
        assert not any(":inherited-members:" in line for line in
                       flowjit_api.entry_lines("flowjit", name, getattr(flow, name)))
    assert ">>>" in inspect.getdoc(flow.optimizer.SGD.minimize)
