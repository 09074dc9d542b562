"""flow.unittest: OneFlow's helpers for op tests, on flowjit.

OneFlow's op tests subclass :class:`TestCase` and mark the device layouts
they need with ``@flow.unittest.skip_unless_1n1d()`` and the like. The
layout comes from the environment, as in OneFlow:

- ``ONEFLOW_TEST_DEVICE_NUM``: devices per node (default 1);
- ``ONEFLOW_TEST_NODE_LIST``: comma-separated hosts (default: this one only);
- ``ONEFLOW_TEST_WORLD_SIZE``: processes in all;
- ``ONEFLOW_TEST_ENABLE_EAGER`` / ``ONEFLOW_TEST_ENABLE_TYPING_CHECK``: "1" asks
  for eager mode (which flowjit does not have: such a test fails) / typing
  checks (flowjit always checks a job's annotations);
- ``ONEFLOW_TEST_MASTER_PORT``, ``ONEFLOW_TEST_LOG_DIR``: see TestCase.setUp.

flowjit starts no worker processes for a test: a multi-node test runs when
the same test script is started on every node (with its rank in
FLOWJIT_RANK, or through a launcher, see flow.env).
"""
import importlib.util
import os
import sys
import types
import unittest as _std
from typing import Any, Callable, Dict, List

__all__ = ["TestCase", "env", "num_nodes_required", "register_test_cases", "skip_unless_1n1d",
           "skip_unless_1n2d", "skip_unless_1n4d", "skip_unless_2n1d", "skip_unless_2n2d", "skip_unless_2n4d"]


# ---------------------------------------------------------------- the test environment

def _eager_execution_enabled() -> bool:
    """ONEFLOW_TEST_ENABLE_EAGER=1: the tests are asked to run eagerly."""
    return os.getenv("ONEFLOW_TEST_ENABLE_EAGER") == "1"


def _typing_check_enabled() -> bool:
    """ONEFLOW_TEST_ENABLE_TYPING_CHECK=1."""
    return os.getenv("ONEFLOW_TEST_ENABLE_TYPING_CHECK") == "1"


def _has_node_list() -> bool:
    """Whether ONEFLOW_TEST_NODE_LIST names the nodes."""
    return bool(os.getenv("ONEFLOW_TEST_NODE_LIST"))


def _node_list() -> List[str]:
    """The hosts of ONEFLOW_TEST_NODE_LIST (ValueError when it is not set)."""
    text = os.getenv("ONEFLOW_TEST_NODE_LIST")
    if not text:
        raise ValueError("flow.unittest.env.node_list: ONEFLOW_TEST_NODE_LIST is not set")
    return text.split(",")


def _node_size() -> int:
    """The number of nodes: len(node_list()), else 1."""
    return len(_node_list()) if _has_node_list() else 1


def _has_world_size() -> bool:
    """Whether ONEFLOW_TEST_WORLD_SIZE is set (ValueError when it is not a number)."""
    text = os.getenv("ONEFLOW_TEST_WORLD_SIZE")
    if not text:
        return False
    if not text.isdigit():
        raise ValueError(f"ONEFLOW_TEST_WORLD_SIZE must be a number, got {text!r}")
    return True


def _world_size() -> int:
    """ONEFLOW_TEST_WORLD_SIZE as an int (ValueError when it is not set)."""
    if not _has_world_size():
        raise ValueError("flow.unittest.env.world_size: ONEFLOW_TEST_WORLD_SIZE is not set")
    return int(os.environ["ONEFLOW_TEST_WORLD_SIZE"])


def _device_num() -> int:
    """Devices per node: ONEFLOW_TEST_DEVICE_NUM, else 1."""
    text = os.getenv("ONEFLOW_TEST_DEVICE_NUM")
    if not text:
        return 1
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"ONEFLOW_TEST_DEVICE_NUM must be a number, got {text!r}") from None


env = types.ModuleType("flowjit.unittest.env", "The test layout from the ONEFLOW_TEST_* variables.")
for _f in (_eager_execution_enabled, _typing_check_enabled, _has_node_list, _node_list, _node_size,
           _has_world_size, _world_size, _device_num):
    _f.__name__ = _f.__qualname__ = _f.__name__[1:]
    setattr(env, _f.__name__, _f)
env.__all__ = sorted(n for n in vars(env) if not n.startswith("_"))
sys.modules[env.__name__] = env


# ---------------------------------------------------------------- TestCase

_env_checked = False


def _set_up_session() -> None:
    """What every TestCase.setUp does (OneFlow's order): the multi-node
    settings from the environment, flow.env.init() once, then a clean
    session in lazy mode."""
    global _env_checked
    import flowjit as flow
    if _has_node_list() and not _env_checked:
        if _node_size() < 2:
            raise ValueError("ONEFLOW_TEST_NODE_LIST names one node; leave it unset for single-node tests")
        port = os.getenv("ONEFLOW_TEST_MASTER_PORT")
        if not port:
            raise ValueError("ONEFLOW_TEST_NODE_LIST is set but ONEFLOW_TEST_MASTER_PORT is not")
        flow.env.machine(_node_list())
        flow.env.ctrl_port(int(port))
    elif _device_num() > 1 and os.getenv("ONEFLOW_TEST_MULTI_PROCESS") == "1":
        raise NotImplementedError("ONEFLOW_TEST_MULTI_PROCESS=1: flowjit.unittest starts no worker processes; "
                                  "run the devices in this process (flow.config.cpu_device_num) or start one "
                                  "process per device with python -m flowjit.launch")
    log_dir = os.getenv("ONEFLOW_TEST_LOG_DIR")
    if log_dir:
        flow.env.log_dir(log_dir)
    if not _env_checked:
        flow.env.init()
        _env_checked = True
    flow.clear_default_session()
    flow.enable_eager_execution(_eager_execution_enabled())


class TestCase(_std.TestCase):
    """unittest.TestCase whose setUp starts every test with a clean default
    session (flow.clear_default_session()) in lazy mode; on a multi-node
    layout (ONEFLOW_TEST_NODE_LIST) it first sets flow.env.machine to the
    nodes and flow.env.ctrl_port to ONEFLOW_TEST_MASTER_PORT.
    ONEFLOW_TEST_ENABLE_EAGER=1 makes setUp raise NotImplementedError (no
    eager mode). A test may clear the session again itself."""

    def setUp(self) -> None:
        """Prepares the session (see the class)."""
        _set_up_session()


class _ClearSession:
    """The mixin register_test_cases gives its classes: TestCase's setUp."""

    def setUp(self) -> None:
        _set_up_session()


# ---------------------------------------------------------------- decorators

def num_nodes_required(num_nodes: int) -> Callable[[Callable], Callable]:
    """Marks a test function with the number of nodes it needs (read by
    register_test_cases's `filter_by_num_nodes`)."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes_required: expected a positive int, got {num_nodes!r}")

    def mark(f):
        f.__oneflow_test_case_num_nodes_required__ = num_nodes
        return f
    return mark


def _num_nodes(f) -> int:
    return getattr(f, "__oneflow_test_case_num_nodes_required__", 1)


def register_test_cases(scope: Dict[str, Any], directory: str, filter_by_num_nodes: Callable[[int], bool],
                        base_class: type = _std.TestCase, test_case_mixin: type = _ClearSession) -> None:
    """Loads every test*.py file of `directory` and adds to `scope` (a
    module's globals()) one TestCase class per file, named after it, whose
    methods are the file's test* functions that `filter_by_num_nodes`
    accepts (given the number of nodes each needs, see num_nodes_required)."""
    if not os.path.isdir(directory):
        raise ValueError(f"register_test_cases: {directory!r} is not a directory")
    for fname in sorted(os.listdir(directory)):
        path = os.path.join(directory, fname)
        if not (fname.startswith("test") and fname.endswith(".py") and os.path.isfile(path)):
            continue
        name = fname[:-3]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        tests = {k: getattr(module, k) for k in dir(module)
                 if k.startswith("test") and callable(getattr(module, k))
                 and filter_by_num_nodes(_num_nodes(getattr(module, k)))}
        scope[name] = type(name, (test_case_mixin, base_class), tests)


def _skip_unless(nodes: int, devices: int) -> Callable[[Any], Any]:
    if _node_size() == nodes and _device_num() == devices:
        return lambda f: f
    return _std.skip(f"only runs when node_size is {nodes} and device_num is {devices}")


def skip_unless_1n1d() -> Callable[[Any], Any]:
    """Skips the decorated test or class unless the layout is 1 node with 1 device."""
    return _skip_unless(1, 1)


def skip_unless_1n2d() -> Callable[[Any], Any]:
    """Skips the decorated test or class unless the layout is 1 node with 2 devices."""
    return _skip_unless(1, 2)


def skip_unless_1n4d() -> Callable[[Any], Any]:
    """Skips the decorated test or class unless the layout is 1 node with 4 devices."""
    return _skip_unless(1, 4)


def skip_unless_2n1d() -> Callable[[Any], Any]:
    """Skips the decorated test or class unless the layout is 2 nodes with 1 device each."""
    return _skip_unless(2, 1)


def skip_unless_2n2d() -> Callable[[Any], Any]:
    """Skips the decorated test or class unless the layout is 2 nodes with 2 devices each."""
    return _skip_unless(2, 2)


def skip_unless_2n4d() -> Callable[[Any], Any]:
    """Skips the decorated test or class unless the layout is 2 nodes with 4 devices each."""
    return _skip_unless(2, 4)
