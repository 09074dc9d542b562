"""Several processes over Gloo on 127.0.0.1: the seed MLP trained by 2
processes (1 or 2 devices each, second layer split) gives the variables of
one process on one device; a process that dies or disagrees on the world
size makes the others fail with a clear error within the timeout."""
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mp_worker.py")
STEPS = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, world, local=1, split=True, exit_after=-1, sizes=None, timeout=20, tag="r",
           mode=None, extra_env=None):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(FLOWJIT_WORLD_SIZE=str(sizes[rank] if sizes else world), FLOWJIT_RANK=str(rank),
                   FLOWJIT_MASTER_ADDR="127.0.0.1", FLOWJIT_MASTER_PORT=str(port),
                   FLOWJIT_TIMEOUT=str(timeout))
        env.update(extra_env or {})
        out = str(tmp_path / f"{tag}{rank}.npz")
        ea = exit_after if rank == world - 1 else -1
        procs.append((subprocess.Popen([sys.executable, WORKER, out, str(local), mode or ("split" if split else "dp"),
                                        str(STEPS), str(ea)], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True), out))
    results = []
    for p, out in procs:
        text, _ = p.communicate(timeout=120)
        results.append((p.returncode, text, out))
    return results


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    d = tmp_path_factory.mktemp("one")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWJIT_WORLD")}
    out = str(d / "ref.npz")
    subprocess.run([sys.executable, WORKER, out, "1", "split", str(STEPS), "-1"], env=env, check=True)
    return dict(np.load(out))


def check_same(results, want, losses=True):
    for rc, text, out in results:
        assert rc == 0, text
        got = np.load(out)
        assert sorted(got.files) == sorted(want)
        for k in want:
            if k == "losses" and not losses:
                continue
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_two_processes_match_one(tmp_path, one_process):
    check_same(launch(tmp_path, 2), one_process)


def test_oneflow_env_machine_and_ctrl_port(tmp_path, one_process):
    check_same(launch(tmp_path, 2, extra_env={"MP_WORKER_ONEFLOW_ENV": "1"}), one_process)


def test_env_settings_are_checked(monkeypatch):
    import flowjit as flow
    with pytest.raises(ValueError, match="ctrl_port"):
        flow.env.ctrl_port(0)
    with pytest.raises(ValueError, match="env.machine"):
        flow.env.machine([])
    monkeypatch.setenv("FLOWJIT_WORLD_SIZE", "2")
    monkeypatch.delenv("FLOWJIT_RANK", raising=False)
    from flowjit import env
    with pytest.raises(ValueError, match="FLOWJIT_RANK"):
        env._process_rank()
    monkeypatch.setenv("FLOWJIT_RANK", "5")
    with pytest.raises(ValueError, match="outside 0..1"):
        env._process_rank()


def test_two_processes_of_two_devices_data_parallel(tmp_path, one_process):
    check_same(launch(tmp_path, 2, local=2, split=False), one_process)


def test_two_processes_without_overlap(tmp_path, one_process):
    # FLOWJIT_OVERLAP=0: every collective synchronous, in plan order.
    check_same(launch(tmp_path, 2, extra_env={"FLOWJIT_OVERLAP": "0"}), one_process)


def test_mirrored_view_over_two_processes(tmp_path, one_process):
    check_same(launch(tmp_path, 2, mode="mirrored"), one_process, losses=False)


def test_a_peer_that_dies_fails_the_others_within_the_timeout(tmp_path):
    t0 = time.monotonic()
    results = launch(tmp_path, 2, exit_after=1, timeout=10)
    assert results[1][0] == 3
    rc, text, _ = results[0]
    assert rc != 0
    assert "gloo:" in text and "RuntimeError" in text, text
    assert time.monotonic() - t0 < 60


def test_mismatched_world_size_is_a_clear_error(tmp_path):
    results = launch(tmp_path, 2, sizes=[2, 3], timeout=5)
    for rc, text, _ in results:
        assert rc != 0
    for _, text, _ in results:
        assert "gloo: world size mismatch" in text, text


def test_mixed_parallel_mlp_example_over_two_processes():
    example = os.path.join(HERE, "..", "..", "examples", "mixed_parallel_mlp.py")
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, FLOWJIT_WORLD_SIZE="2", FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_PORT=str(port),
                   FLOWJIT_TIMEOUT="30")
        procs.append(subprocess.Popen([sys.executable, example, "--devices", "1", "--steps", "21"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for p, text in zip(procs, outs):
        assert p.returncode == 0, text
    losses = [[float(v) for v in text.split() if v.replace(".", "", 1).isdigit()] for text in outs]
    assert len(losses[0]) == 2 and losses[0] == losses[1], outs  # steps 0 and 20, the same on both
    assert losses[0][1] < losses[0][0]
