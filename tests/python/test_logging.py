"""The C++ core's diagnostics (compile stage lines, the matmul choice, the
FLOWJIT_DEBUG>=2 prints) arrive as LogRecords of logger "flowjit", and with
no logging configured still reach stderr as "[flowjit] ..." lines."""
import json
import os
import subprocess
import sys

WORKER = r'''
import json, logging, os, sys
import numpy as np
import flowjit as flow, flowjit.typing as tp

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append([record.name, record.levelname, record.getMessage(), record.threadName])
if "NO_HANDLER" not in os.environ:
    logging.getLogger("flowjit").addHandler(Keep())

def mm(a: tp.Numpy.Placeholder((64, 96)), b: tp.Numpy.Placeholder((96, 80))) -> tp.Numpy:
    return flow.nn.relu(flow.matmul(a, b))
flow.global_function(type="predict")(mm)(np.ones((64, 96), np.float32), np.ones((96, 80), np.float32))
print(json.dumps(records))
'''


def _run(tmp_path, debug, **extra):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("FLOWJIT_DUMP_DIR", "FLOWJIT_CPU")}
    env.update(FLOWJIT_DEBUG=debug, FLOWJIT_DISABLE_CACHE="1", FLOWJIT_CACHE_DIR=str(tmp_path), **extra)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_stage_lines_of_a_compile_are_log_records(tmp_path):
    records, err = _run(tmp_path, "1")
    core = [r for r in records if ": pass simplify" in r[2]]
    assert core, records
    assert all(r[0] == "flowjit" and r[1] == "INFO" for r in core), core
    assert core[0][2].startswith("mm: pass simplify ") and " ms" in core[0][2], core[0]
    for stage in ("fusion+memory", "llvm compile"):
        assert any(r[2].startswith(f"mm: {stage} ") for r in records), (stage, records)
    # The matmul choice is said by the kernel's compile (on the pool).
    assert any(": matmul " in r[2] and r[1] == "INFO" for r in records), records
    # Nothing deeper than FLOWJIT_DEBUG=1 asked for.
    assert not any(r[1] == "DEBUG" for r in records), [r for r in records if r[1] == "DEBUG"]
    # The package's own stderr handler still writes the same lines.
    assert any(ln.startswith("[flowjit] mm: pass simplify ") for ln in err.splitlines()), err[-2000:]
    assert any(ln.startswith("[flowjit] mm: fusion+memory ") for ln in err.splitlines()), err[-2000:]


def test_debug_2_prints_are_debug_records(tmp_path):
    records, err = _run(tmp_path, "2")
    debug = [r[2] for r in records if r[1] == "DEBUG"]
    assert any(m.startswith("mm fusion plan:\n") for m in debug), debug
    assert any(m.startswith("mm traced:\n") for m in debug), debug
    assert "[flowjit] mm fusion plan:" in err
    # Level-1 lines stay INFO at level 2.
    assert any(r[1] == "INFO" and r[2].startswith("mm: pass simplify ") for r in records)


def test_without_flowjit_debug_the_core_says_nothing(tmp_path):
    records, err = _run(tmp_path, "0")
    assert records == [], records
    assert "[flowjit]" not in err, err[-2000:]


def test_core_warnings_are_warning_records_and_reach_stderr_unconfigured(tmp_path):
    records, err = _run(tmp_path, "0", FLOWJIT_CPU="no-such-cpu")
    said = [r for r in records if r[2].startswith("FLOWJIT_CPU=no-such-cpu ")]
    assert said and all(r[:2] == ["flowjit", "WARNING"] and r[2].endswith("; using the host")
                        for r in said), records
    # No handler configured: logging's last-resort handler writes it to stderr.
    records, err = _run(tmp_path, "0", FLOWJIT_CPU="no-such-cpu", NO_HANDLER="1")
    assert records == [] and said[0][2] in err, err[-2000:]
