"""The ``>>>`` examples of the API reference's docstrings run and print what
they say, as `sphinx -b doctest` (tools/dev.sh docs) runs them: each
docstring from docs/conf.py's doctest_global_setup (np, flow and tp
imported, a fresh session), with the builder's option flags. Here a failure
names the op and runs without Sphinx; the docs build runs the same examples
from the rendered pages. Every public function of the op modules has one."""
import doctest
import importlib
import importlib.util
import inspect
import sys
import types
from pathlib import Path

import pytest

import flowjit as flow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import flowjit_names  # noqa: E402 - the docs' own list of public names


def _load_conf():
    spec = importlib.util.spec_from_file_location("flowjit_docs_conf", ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


CONF = _load_conf()
# sphinx.ext.doctest's default doctest_default_flags, unless conf.py sets them.
FLAGS = getattr(CONF, "doctest_default_flags",
                doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.DONT_ACCEPT_TRUE_FOR_1)
MODULES = ["flowjit"] + [f"flowjit.{m}" for m in flow._PUBLIC_MODULES] + ["flowjit.cache"]
# The modules whose functions are ops: each should show one in use.
OP_MODULES = ["flowjit", "flowjit.math", "flowjit.nn", "flowjit.layers", "flowjit.random", "flowjit.linalg",
              "flowjit.experimental", "flowjit.advanced"]


def _public(modname):
    m = importlib.import_module(modname)
    for name in flowjit_names.public_names(m):
        v = getattr(m, name)
        if not isinstance(v, types.ModuleType) and (inspect.isclass(v) or callable(v)):
            yield f"{modname}.{name}", v


def _documented():
    """Every documented function and class and its methods (inherited ones
    too: Optimizer.minimize is SGD's), once each: an op under two names has
    one docstring."""
    seen = {}
    for mod in MODULES:
        for full, v in _public(mod):
            seen.setdefault(id(v), (full, v))
            if inspect.isclass(v):
                for attr in dir(v):
                    m = inspect.getattr_static(v, attr)
                    if (not attr.startswith("_") or attr == "__call__") and inspect.isfunction(m) and \
                            m.__module__.startswith("flowjit") and inspect.getdoc(m):
                        seen.setdefault(id(m), (f"{full}.{attr}", m))
    return sorted(seen.values(), key=lambda p: p[0])


def _has_example(v):
    return ">>>" in (inspect.getdoc(v) or "")


WITH_EXAMPLES = [(full, v) for full, v in _documented() if _has_example(v)]


def run_examples(name, docstring):
    """Runs one docstring's examples as the docs build does; returns the
    number of failed examples and doctest's report of them."""
    test = doctest.DocTestParser().get_doctest(docstring, {}, name, None, 0)
    seed = flow.default_generator().initial_seed()
    report = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    try:
        exec(CONF.doctest_global_setup, test.globs)
        runner.run(test, out=report.append)
    finally:
        flow.manual_seed(seed)  # the tests after this one keep theirs
    return runner.failures, "".join(report)


@pytest.mark.parametrize("name,obj", WITH_EXAMPLES, ids=[n for n, _ in WITH_EXAMPLES])
def test_docstring_example(name, obj):
    failures, report = run_examples(name, inspect.getdoc(obj))
    assert failures == 0, report


def test_a_wrong_output_fails():
    failures, report = run_examples("wrong", ">>> flow.math.add\n<function add ...>\n>>> 1 + 1\n3\n")
    assert failures == 1 and "Expected:\n    3\nGot:\n    2" in report


def test_the_docs_build_runs_each_docstring_in_its_own_doctest_group():
    # napoleon has turned "Example:" into a rubric and unindented lines.
    lines = ["Elementwise x + y.", "", ".. rubric:: Example", "",
             ">>> @flow.global_function()", "... def job(): ...", "", ">>> 1 + 1", "2", "", "Done."]
    CONF.doctest_groups(None, "function", "flowjit.math.add", flow.math.add, {}, lines)
    assert [x for x in lines if x] == ["Elementwise x + y.", ".. rubric:: Example",
                                       ".. doctest:: flowjit.math.add",
                                       "   >>> @flow.global_function()", "   ... def job(): ...",
                                       ".. doctest:: flowjit.math.add", "   >>> 1 + 1", "   2", "Done."]
    assert lines[lines.index("   2") + 1] == ""  # the directive ends before the text


def test_every_public_op_has_an_example():
    missing = sorted(full for mod in OP_MODULES for full, v in _public(mod)
                     if inspect.isfunction(v) and not _has_example(v))
    assert missing == []
