"""flowjit's diagnostics through the logging module (logger "flowjit").

FLOWJIT_DEBUG sets the logger's level when the package is imported: unset or
0 WARNING, 1 INFO (compile stages and times, why a job recompiled, ignored
hints), 2 and more DEBUG. When FLOWJIT_DEBUG is set and nothing configured a
handler for "flowjit", records go to stderr as "[flowjit] message". The IR
and assembly dumps of levels 2-4 are written by the C++ core to stderr."""
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


def configure() -> None:
    debug = debug_level()
    if debug <= 0:
        return
    logger.setLevel(level_for(debug))
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[flowjit] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


configure()
