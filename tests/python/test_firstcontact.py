"""The rough edges a new user meets first ([firstcontact], issue #28): log
lines printed once under the application's logging.basicConfig, tracing errors
without the core's chained exception, numpy scalars for 0-d placeholders, the
CPU assembly of a compiled job, what FLOWJIT_DUMP_DIR writes, and the
examples' own output and docstrings."""
import ast
import importlib.util
import os
import re
import subprocess
import sys
import traceback

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLES = os.path.join(ROOT, "examples")


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLOWJIT_DEBUG", "FLOWJIT_DUMP_DIR", "FLOWJIT_CPU", "FLOWJIT_KEEP_TEXT")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ---------------------------------------------------------------- logging

LOGGING_APP = r'''
import logging, sys
import numpy as np
when = sys.argv[1]
if when == "before":
    logging.basicConfig(level=logging.INFO)
import flowjit as flow, flowjit.typing as tp
if when == "after":
    logging.basicConfig(level=logging.INFO)
if when == "file":
    logging.basicConfig(level=logging.INFO, filename=sys.argv[2])
if when == "stdout":
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)

@flow.global_function()
def twice(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
    return x * 2
twice(np.ones(4, np.float32))
'''


@pytest.mark.parametrize("when", ["before", "after", "stdout", "none", "file"])
def test_debug_lines_print_once_with_the_applications_basicconfig(tmp_path, when):
    script = tmp_path / "app.py"
    script.write_text(LOGGING_APP)
    logfile = tmp_path / "app.log"
    p = subprocess.run([sys.executable, str(script), when, str(logfile)], capture_output=True, text=True,
                       timeout=300, env=_env(FLOWJIT_DEBUG=1, FLOWJIT_DISABLE_CACHE=1,
                                             FLOWJIT_CACHE_DIR=tmp_path / "cache"))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in (p.stderr + p.stdout).splitlines() if "twice: fusion+memory" in ln]
    if when in ("before", "after", "stdout"):
        # Printed by the application's handler alone, in its format.
        assert len(lines) == 1 and lines[0].startswith("INFO:flowjit:twice: fusion+memory"), p.stderr[-3000:]
    else:
        # No handler of the application's on stderr: flowjit's own prints it.
        assert len(lines) == 1 and lines[0].startswith("[flowjit] twice: fusion+memory"), p.stderr[-3000:]
    if when == "file":
        assert logfile.read_text().count("twice: fusion+memory") == 1


# ---------------------------------------------------------------- errors while tracing

def test_a_tracing_error_does_not_chain_the_cores_exception():
    @flow.global_function()
    def bad(a: tp.Numpy.Placeholder((3, 4)), b: tp.Numpy.Placeholder((5, 4))) -> tp.Numpy:
        return flow.matmul(a, b)

    with pytest.raises(ValueError) as info:
        bad(np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32))
    e = info.value
    assert re.match(r"job 'bad', test_firstcontact\.py:\d+: matmul: inner dimensions differ: "
                    r"a is f32\[3,4\] with k=4 but b is f32\[5,4\] with k=5$", str(e)), str(e)
    assert e.__cause__ is None and e.__suppress_context__
    shown = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    assert "During handling of the above exception" not in shown
    assert shown.count("inner dimensions differ") == 1


# ---------------------------------------------------------------- placeholders

def test_a_numpy_scalar_is_a_0d_argument():
    @flow.global_function()
    def scale(x: tp.Numpy.Placeholder((3,)), s: tp.Numpy.Placeholder(())) -> tp.Numpy:
        return x * s

    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(scale(x, np.float32(2.5)), x * 2.5)
    np.testing.assert_array_equal(scale(x, np.float32(-1)), -x)  # again, on the fast path
    np.testing.assert_array_equal(scale(x, np.array(3, np.float32)), x * 3)
    # Its dtype is checked as an array's.
    with pytest.raises(TypeError, match=r"parameter 's' is declared float32 but the array is float64"):
        scale(x, np.float64(2.5))
    # A Python number has no dtype to check: the message says what to pass.
    with pytest.raises(TypeError, match=r"a scalar must be passed as a 0-d array, e\.g\. "
                                        r"np\.array\(2\.5, dtype=np\.float32\)"):
        scale(x, 2.5)


def test_a_numpy_scalar_is_refused_for_a_placeholder_with_dimensions():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        return x + 1

    with pytest.raises(TypeError, match=r"parameter 'x' expects a numpy array .* but got float32; a scalar "
                                        r"must be passed as a 0-d array"):
        f(np.float32(1))


# ---------------------------------------------------------------- looking inside

def test_cpu_assembly_of_a_compiled_job_without_flowjit_debug(monkeypatch):
    monkeypatch.delenv("FLOWJIT_DEBUG", raising=False)

    @flow.global_function()
    def expo(x: tp.Numpy.Placeholder((64,))) -> tp.Numpy:
        return flow.math.exp(x) * 2

    compiled = expo.compile()
    asm = compiled.as_text("assembly")
    assert "\t.text" in asm and ".globl" in asm, asm[:500]
    assert compiled.as_text("assembly") is asm  # made once


def test_dump_dir_writes_the_stages_the_docs_list(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(r'''
import numpy as np
import flowjit as flow, flowjit.typing as tp
@flow.global_function()
def dumped(x: tp.Numpy.Placeholder((8, 8))) -> tp.Numpy:
    return flow.math.reduce_sum(flow.nn.relu(flow.matmul(x, x)), axis=1)
dumped(np.ones((8, 8), np.float32))
''')
    dump = tmp_path / "dump"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env=_env(FLOWJIT_DUMP_DIR=dump, FLOWJIT_DISABLE_CACHE=1,
                                FLOWJIT_CACHE_DIR=tmp_path / "cache"))
    assert p.returncode == 0, p.stderr[-3000:]
    names = sorted(os.listdir(dump))
    stages = [re.match(r"dumped\.(\d{3})\.(\w+)\.txt$", n).group(2) for n in names]
    # Numbered in order: the traced IR first, the IR after each pass that
    # changed it, the fusion plan with its loop-level kernels, the launch
    # plan, the LLVM IR and the assembly (docs/guides/inspecting.rst says the same).
    assert stages[0] == "traced" and stages[-4:] == ["fusion", "plan", "llvm", "asm"], stages
    fusion = (dump / names[-4]).read_text()
    assert re.search(r"^kernel \w+ loop domain=", fusion, re.M), fusion
    assert re.search(r"^\s+\[0\] k\d+_\w+ range=", (dump / names[-3]).read_text(), re.M)
    assert "define " in (dump / names[-2]).read_text()
    assert re.search(r"^\s+(vmov|mov|add|vfmadd|ret)", (dump / names[-1]).read_text(), re.M)


# ---------------------------------------------------------------- examples

def _load_example(name):
    spec = importlib.util.spec_from_file_location(f"fj_example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _argparse_defaults(path, config=None):
    """--option: default of each add_argument call in the file (literal
    defaults, or `d.<field>` of the example's Config dataclass)."""
    out = {}
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            opt = node.args[0].value
            for kw in node.keywords:
                if kw.arg != "default":
                    continue
                if isinstance(kw.value, ast.Constant):
                    out[opt] = kw.value.value
                elif isinstance(kw.value, ast.Attribute) and config is not None:
                    out[opt] = getattr(config, kw.value.attr)
    return out


@pytest.mark.parametrize("name", ["train_mnist", "lenet_train", "mixed_parallel_mlp", "transformer_lm"])
def test_example_docstrings_give_the_code_defaults(name):
    path = os.path.join(EXAMPLES, f"{name}.py")
    config = _load_example(name).Config() if name == "transformer_lm" else None
    defaults = _argparse_defaults(path, config)
    doc = ast.get_docstring(ast.parse(open(path).read()))
    said = re.findall(r"\[(--[\w-]+) ([^\]\s|]+)\]", doc)
    for opt, value in said:
        if opt not in defaults or value.isupper():  # a metavariable (N, DIR, PNG)
            continue
        assert str(defaults[opt]) == value, (name, opt, value, defaults[opt])


def test_lenet_progress_is_one_line_per_epoch_in_a_log(monkeypatch, capsys):
    lenet = _load_example("lenet_train")
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the plain bar, as without tqdm
    bar = lenet.Progress(60, "epoch 1/3")
    assert not bar.tty
    for i in range(6):
        bar.update(10, 1.0 / (i + 1))
    bar.close()
    out = capsys.readouterr().out
    assert "\r" not in out
    assert out.splitlines() == [l for l in out.splitlines() if l.startswith("epoch 1/3 [")] and \
        len(out.splitlines()) == 1, out
    assert "60/60 loss 0.1667" in out


def test_mixed_parallel_mlp_labels_its_output(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "mixed_parallel_mlp.py"), "--devices", "2",
                        "--steps", "21"], capture_output=True, text=True, timeout=300,
                       env=_env(FLOWJIT_CACHE_DIR=tmp_path / "cache"))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if "MNIST not found" not in ln]
    assert lines[0] == "1 process(es) x 2 CPU device(s)", p.stdout
    assert [re.sub(r"loss \d+\.\d{4}$", "loss L", ln) for ln in lines[1:]] == \
        ["epoch 1 step    1  loss L", "epoch 1 step   21  loss L"], p.stdout


def test_train_mnist_plot_legend_covers_no_point(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="train_mnist.py --plot needs matplotlib")
    import matplotlib.figure
    train_mnist = _load_example("train_mnist")
    figures = []
    real_savefig = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figures.append(fig), real_savefig(fig, *a, **k))[1])
    steps = 600
    losses = list(0.3 + 2.0 * np.exp(-np.arange(3 * steps) / 80.0))
    train_mnist.save_plot(str(tmp_path / "curve.png"), losses, [0.82, 0.85, 0.862], steps)
    assert (tmp_path / "curve.png").stat().st_size > 0
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:  # below every axes, so over no line or point
        assert legend.y1 <= ax.get_window_extent(renderer).y0, (legend, ax.get_window_extent(renderer))
