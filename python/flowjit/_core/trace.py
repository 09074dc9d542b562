"""The tracing context: the job being traced, user source locations, errors."""
import os
import sys
import threading

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # flowjit/
_local = threading.local()


def current():
    """The JobBuilder tracing on this thread, or None."""
    return getattr(_local, "builder", None)


def push(builder):
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(current())
    _local.builder = builder


def pop():
    _local.builder = _local.stack.pop()


def user_location():
    """(file, line) of the innermost frame outside the flowjit package."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PACKAGE_DIR):
            return fn, f.f_lineno
        f = f.f_back
    return "", 0


def where(file, line):
    return f"{os.path.basename(file)}:{line}" if line else "<unknown>"


def require_builder(api):
    b = current()
    if b is None:
        # NotImplementedError (a RuntimeError) as OneFlow's lazy API raises it:
        # outside a job is eager mode, which flowjit does not have.
        raise NotImplementedError(f"{api} can only be used inside a function decorated with "
                                  "@flow.global_function, while it is being traced (flowjit has "
                                  "no eager mode)")
    return b


def unique_name(name, api, module, key, title):
    """`name` (checked), or for an unnamed one `<title>_<n>`: the n-th unnamed
    `key` of the job being traced (OneFlow gives every unnamed layer its own
    name; the convolution, dense and normalization layers share this)."""
    if name is not None:
        if not isinstance(name, str) or not name:
            fail(TypeError, f"{api}: name must be a non-empty string, got {name!r}", user_location())
        return name
    b = require_builder(f"flow.{module}.{api}")
    n = b._counts.get(key, 0)
    b._counts[key] = n + 1
    return f"{title}_{n}"


def fail(exc_type, msg, loc=None):
    """Raises exc_type with the job and the user's source line in front of msg.

    The error is the user's, said in full by msg: when it is raised while
    handling the core's exception (a factory's check, ``_C.make_node``), that
    exception is not chained to it (``from None``), so the traceback shows one
    error at the user's line, not "During handling of the above exception"."""
    b = current()
    file, line = loc if loc else user_location()
    prefix = f"job '{b.job_name}', " if b is not None else ""
    raise exc_type(f"{prefix}{where(file, line)}: {msg}") from None
