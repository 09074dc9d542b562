"""[harden] Ctrl-C during a long synchronous run: the run stops at the next
kernel launch (before any variable is written) and KeyboardInterrupt is
raised at once, instead of when the whole run is over; an interrupted train
step leaves every variable as it was, and the job runs normally afterwards.
Each case runs in a child process that the test sends SIGINT."""
import signal
import subprocess
import sys
import textwrap
import time

import pytest

CHILD = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    import flowjit as flow, flowjit.typing as tp
    # A process started in the background by a shell without job control
    # (CI's `... &`) inherits SIGINT ignored, and Python then leaves it so:
    # the user's Ctrl-C handling is what this child tests.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    N = 512
    train = sys.argv[1] == "train"

    def make(layers):
        def body(x):
            w = flow.get_variable("w", shape=(N, N), initializer=flow.constant_initializer(1.0 / N))
            for _ in range(layers):
                x = flow.math.tanh(flow.matmul(x, w))
            return flow.math.reduce_mean(x)

        if train:
            def job(x: tp.Numpy.Placeholder((N, N))) -> tp.Numpy:
                loss = body(x)
                flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
                return loss
        else:
            def job(x: tp.Numpy.Placeholder((N, N))) -> tp.Numpy:
                return body(x)
        job.__name__ = f"job{layers}"
        return flow.global_function(type="train" if train else "predict")(job)

    x = np.random.default_rng(0).random((N, N), dtype=np.float32)
    # As many layers as make a call last about 1.5 s on this host, warm.
    probe = make(8)
    probe(x)
    t = time.perf_counter()
    probe(x)
    per_layer = (time.perf_counter() - t) / 8
    job = make(max(16, min(2000, int(1.5 / per_layer) + 1)))
    job(x)  # compiles
    t = time.perf_counter()
    job(x)
    full = time.perf_counter() - t
    before = flow.get_all_variables()["w"].copy()
    print("full", full, flush=True)
    t = time.perf_counter()
    try:
        job(x)
        print("completed", time.perf_counter() - t, flush=True)
    except KeyboardInterrupt:
        print("interrupted", time.perf_counter() - t, flush=True)
    after = flow.get_all_variables()["w"]
    print("unchanged", bool(np.array_equal(before, after)), flush=True)
    job(x)  # runs to the end again: the request does not outlive its run
    print("again", bool(not np.array_equal(before, flow.get_all_variables()["w"])) if train else True,
          flush=True)
""")


def run_child(kind, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    p = subprocess.Popen([sys.executable, str(script), kind], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out = {}
    for line in p.stdout:
        word, value = line.split()
        out[word] = value
        if word == "full":
            # Into the second call, well before its end (the first took `full` s).
            time.sleep(min(0.2, float(value) / 5))
            p.send_signal(signal.SIGINT)
    p.wait(timeout=300)
    assert p.returncode == 0, p.stderr.read()
    return out


@pytest.mark.parametrize("kind", ["predict", "train"])
def test_ctrl_c_stops_a_long_run_at_the_next_launch(kind, tmp_path):
    out = run_child(kind, tmp_path)
    full = float(out["full"])
    assert full > 0.5, f"the run took {full:.2f} s: too short to interrupt in its middle"
    assert "interrupted" in out, out
    assert float(out["interrupted"]) < 0.6 * full, out  # not at the end of the run
    assert out["unchanged"] == "True"  # no half-applied step
    assert out["again"] == "True"
