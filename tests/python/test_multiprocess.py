"""Several processes over Gloo on 127.0.0.1: the seed MLP trained by 2
processes (1 or 2 devices each, second layer split) gives the variables of
one process on one device; a process that dies or disagrees on the world
size makes the others fail with a clear error within the timeout."""
import hashlib
import hmac
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mp_worker.py")
STEPS = 3
TOKEN = "test-multiprocess-" + "0123456789abcdef"


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
                   FLOWJIT_TIMEOUT=str(timeout), FLOWJIT_STORE_TOKEN=TOKEN)
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


def test_a_bad_label_in_one_process_stops_both_and_changes_nothing(tmp_path, one_process):
    # Step 1 is first called with label 10 at row 96 (the second process's
    # rows): both processes raise the same error, no variable changes, and
    # the good call of step 1 and step 2 then match one process.
    results = launch(tmp_path, 2, extra_env={"MP_WORKER_BAD_STEP": "1"})
    for rc, text, out in results:
        assert rc == 0, text
        assert "BAD STEP: job 'train_job', mp_worker.py:" in text, text
        assert ("sparse_softmax_cross_entropy_with_logits: labels holds 10 at [96], "
                "outside the valid range [0, 10)") in text, text
        assert "VARIABLES UNCHANGED" in text, text
    check_same(results, one_process)


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


def test_the_loss_gather_runs_beside_the_backward_pass(tmp_path, one_process):
    # A data-parallel job's loss output is gathered over the processes; the
    # backward pass does not need it, so the gather runs on the communication
    # thread (complete before the output's copy only) while backward kernels
    # run, here with a 50 ms delay per message so that it is long in flight.
    import json
    env = {"FLOWJIT_PROFILE": "1", "MP_WORKER_DUMP": "1", "FLOWJIT_TEST_COMM_DELAY_MS": "50"}
    results = launch(tmp_path, 2, split=False, extra_env=env, timeout=60)
    check_same(results, one_process)
    info = json.load(open(results[0][2] + ".json"))
    plan, events = info["plan"], info["events"]
    # (Not the status all_gather before the updates: the runtime reads it at once.)
    gathers = [line for line in plan if ".all_gather." in line.split()[1] and "@status" not in line]
    assert gathers and all("complete_before=" in line for line in gathers), plan
    gather = next(e for e in events if ".all_gather." in e[1] and "@status" not in e[1])
    kernels = [e for e in events if not e[1].startswith("@")]
    assert gather[4] not in {e[4] for e in kernels}, events
    after = {line.split()[1] for line in plan[plan.index(gathers[0]) + 1:]}
    end = gather[2] + gather[3]
    assert any(e[1] in after and "matmul" in e[1] and e[2] < end for e in kernels), events


def test_mirrored_view_over_two_processes(tmp_path, one_process):
    check_same(launch(tmp_path, 2, mode="mirrored"), one_process, losses=False)


@pytest.fixture(scope="module")
def ofrecords(tmp_path_factory):
    """300 MNIST-shaped records in 2 OFRecord part files."""
    import flowjit.ofrecord as ofr
    d = str(tmp_path_factory.mktemp("ofrecord"))
    rng = np.random.default_rng(3)
    ofr.write(d, ({"images": rng.random((1, 28, 28), dtype=np.float32), "labels": np.int32(rng.integers(0, 10))}
                  for _ in range(300)), parts=2)
    return d


@pytest.fixture(scope="module")
def one_reader(tmp_path_factory, ofrecords):
    d = tmp_path_factory.mktemp("one_reader")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWJIT_WORLD")}
    env["MP_WORKER_OFRECORD"] = ofrecords
    out = str(d / "ref.npz")
    subprocess.run([sys.executable, WORKER, out, "1", "reader", str(STEPS), "-1"], env=env, check=True)
    return dict(np.load(out))


def test_a_reader_over_two_processes_trains_as_one_process(tmp_path, ofrecords, one_reader):
    """flow.data.ofrecord_reader (shuffled) in a job over 2 processes: in the
    consistent view every process reads the same whole batch and the runtime
    keeps its rows; in the mirrored view (2 devices a process) each device
    gets its rows of it. Both train as one process reading alone."""
    extra = {"MP_WORKER_OFRECORD": ofrecords}
    check_same(launch(tmp_path, 2, mode="reader", extra_env=extra), one_reader)
    check_same(launch(tmp_path, 2, local=2, mode="reader_mirrored", extra_env=extra, tag="m"), one_reader,
               losses=False)


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


def test_a_process_with_another_token_is_refused(tmp_path):
    port = free_port()
    procs = []
    for rank, token in enumerate([TOKEN, TOKEN + "-other"]):
        env = dict(os.environ, FLOWJIT_WORLD_SIZE="2", FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_PORT=str(port),
                   FLOWJIT_TIMEOUT="5", FLOWJIT_STORE_TOKEN=token)
        procs.append(subprocess.Popen([sys.executable, WORKER, str(tmp_path / f"t{rank}.npz"), "1", "dp", "1", "-1"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = [(p.communicate(timeout=60)[0], p.returncode) for p in procs]
    assert results[1][1] != 0
    assert "refused this process: wrong job token (FLOWJIT_STORE_TOKEN differs from process 0's)" in results[1][0]
    assert results[0][1] != 0 and "did not join" in results[0][0], results[0][0]


def test_no_token_is_a_clear_error():
    env = {k: v for k, v in os.environ.items() if k != "FLOWJIT_STORE_TOKEN"}
    env.update(FLOWJIT_WORLD_SIZE="2", FLOWJIT_RANK="0", FLOWJIT_MASTER_PORT=str(free_port()))
    r = subprocess.run([sys.executable, "-c", "from flowjit._dist import devices; devices.ensure_configured()"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "ValueError" in r.stderr and "needs the job's token in FLOWJIT_STORE_TOKEN" in r.stderr, r.stderr
    from flowjit import env as flow_env
    assert flow_env.STORE_TOKEN_ENV == "FLOWJIT_STORE_TOKEN"
    a, b = flow_env.new_store_token(), flow_env.new_store_token()
    assert a != b and len(a) == 64 and int(a, 16) >= 0


def test_strangers_on_the_port_get_nothing_and_the_job_runs(tmp_path, one_process):
    """While process 0 waits for process 1, strangers connect to its port:
    one asks for process 0's key without the token, one floods it with a
    200 MiB value, one stalls half-way through the token. They are refused
    or dropped, and the job then runs as usual."""
    port = free_port()

    def start(rank):
        env = dict(os.environ, FLOWJIT_WORLD_SIZE="2", FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_ADDR="127.0.0.1",
                   FLOWJIT_MASTER_PORT=str(port), FLOWJIT_TIMEOUT="30", FLOWJIT_STORE_TOKEN=TOKEN)
        out = str(tmp_path / f"s{rank}.npz")
        return subprocess.Popen([sys.executable, WORKER, out, "1", "split", str(STEPS), "-1"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out

    p0 = start(0)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "process 0 never listened"
            time.sleep(0.1)
    key = b"flowjit/session/0/info/0"
    get = b"G" + len(key).to_bytes(4, "little") + key

    def greeting(s):  # the store opens with 'C' and a 32-byte nonce (runtime/comm/tcp_store.cpp)
        got = b""
        while len(got) < 33:
            chunk = s.recv(33 - len(got))
            assert chunk, got
            got += chunk
        assert got[:1] == b"C", got
        return got[1:]

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        greeting(s)
        s.sendall(get)
        reply = s.recv(4096)
        assert reply[:1] == b"E" and b"present the job's token first" in reply, reply
        assert b"num_processes" not in reply
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        # A stranger that answers the nonce without the token: refused before its get.
        nonce, mine = greeting(s), b"n" * 32
        mac = hmac.new(b"not-the-job-token", b"flowjit-store-v1 client\0" + nonce + mine, hashlib.sha256)
        s.sendall(b"A" + mine + mac.digest() + get)
        reply = s.recv(4096)
        assert reply[:1] == b"E" and b"wrong job token" in reply, reply
    stalled = socket.create_connection(("127.0.0.1", port), timeout=5)
    greeting(stalled)
    stalled.sendall(b"A" + b"half")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        greeting(s)
        s.sendall(b"S" + (5).to_bytes(4, "little") + b"flood" + (200 << 20).to_bytes(8, "little"))
        try:
            s.sendall(b"x" * (1 << 20))
        except OSError:
            pass
        assert s.recv(4096)[:1] == b"E"
    p1 = start(1)
    results = []
    for p, out in (p0, p1):
        text, _ = p.communicate(timeout=120)
        results.append((p.returncode, text, out))
    stalled.close()
    check_same(results, one_process)


def test_mixed_parallel_mlp_example_over_two_processes():
    example = os.path.join(HERE, "..", "..", "examples", "mixed_parallel_mlp.py")
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, FLOWJIT_WORLD_SIZE="2", FLOWJIT_RANK=str(rank), FLOWJIT_MASTER_PORT=str(port),
                   FLOWJIT_TIMEOUT="30", FLOWJIT_STORE_TOKEN=TOKEN)
        procs.append(subprocess.Popen([sys.executable, example, "--devices", "1", "--steps", "21"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for p, text in zip(procs, outs):
        assert p.returncode == 0, text
    # Process 0 alone prints, a labelled line at steps 1 and 21.
    losses = [[float(v) for v in re.findall(r"\bloss (\S+)", text)] for text in outs]
    assert len(losses[0]) == 2 and losses[1] == [], outs
    assert losses[0][1] < losses[0][0]
