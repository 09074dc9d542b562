"""flowjit's diagnostics through the logging module (logger "flowjit").

FLOWJIT_DEBUG sets the logger's level when the package is imported: unset or
0 WARNING, 1 INFO (compile stages and times, why a job recompiled, ignored
hints), 2 and more DEBUG. When FLOWJIT_DEBUG is set and nothing configured a
handler for "flowjit", records go to stderr as "[flowjit] message", unless
they propagate to an application's handler that prints them on stderr or
stdout too (logging.basicConfig): then that one prints them, once. The C++
core's lines (compile stages, the matmul choice, the IR, fusion plan, LLVM IR
and assembly of levels 2-4, dump-dir and FLOWJIT_CPU warnings) come through
the same logger: its level-1 lines as INFO, deeper ones as DEBUG, warnings
as WARNING (install_core_sink)."""
import logging
import os
import sys

logger = logging.getLogger("flowjit")


def debug_level() -> int:
    try:
        return int(os.environ.get("FLOWJIT_DEBUG", "0") or 0)
    except ValueError:
        return 0


def level_for(debug: int) -> int:
    return logging.WARNING if debug <= 0 else logging.INFO if debug == 1 else logging.DEBUG


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of the record, unless the
    record propagates to a handler of the application's that prints it on
    stderr or stdout too (logging.basicConfig's): then that handler alone
    prints it, in the application's format, whether basicConfig ran before
    importing flowjit or after. Handlers elsewhere (a file, pytest's capture)
    do not silence it: they are not a second copy on the terminal."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass

    def handle(self, record):
        if _printed_above(logger, record):
            return False
        return super().handle(record)


def _printed_above(lg, record) -> bool:
    """Whether record, propagating up from lg, reaches a handler above lg
    that writes it to stderr or stdout."""
    terminal = (sys.stderr, sys.__stderr__, sys.stdout, sys.__stdout__)
    while lg.propagate and lg.parent is not None:
        lg = lg.parent
        for h in lg.handlers:
            if isinstance(h, logging.StreamHandler) and not isinstance(h, _StderrHandler) and \
                    getattr(h, "stream", None) in terminal and record.levelno >= h.level:
                return True
    return False


_handler = None
_seen = None


def configure() -> None:
    """Applies FLOWJIT_DEBUG (read again whenever it changed, so setting it
    in a running process, or flow.config.enable_debug_mode, takes effect)."""
    global _handler, _seen
    raw = os.environ.get("FLOWJIT_DEBUG")
    if raw == _seen:
        return
    _seen = raw
    debug = debug_level()
    if debug <= 0:
        if _handler is not None:
            logger.setLevel(logging.NOTSET)
        return
    logger.setLevel(level_for(debug))
    if _handler is None and not logger.handlers:
        _handler = _StderrHandler()
        _handler.setFormatter(logging.Formatter("[flowjit] %(message)s"))
        logger.addHandler(_handler)


def _from_core(debug: int, msg: str) -> None:
    """The C++ core's diagnostic sink (ir/diag.h): msg said at FLOWJIT_DEBUG
    level debug (0: a warning), called with the GIL from any thread."""
    configure()  # FLOWJIT_DEBUG may have been set since the last compile
    logger.log(level_for(debug), "%s", msg)


def install_core_sink(core) -> None:
    """Routes the C++ core's diagnostics (core: flowjit._C) through logger."""
    core.set_log_sink(_from_core)


def info(msg: str, *args) -> None:
    configure()
    logger.info(msg, *args)


configure()
