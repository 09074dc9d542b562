"""Standard launchers: python -m flowjit.launch, and the environments that
torchrun, Open MPI's mpirun and Slurm's srun set. Jobs started each way
give the variables of one process; the launcher forwards signals and stops
the other processes when one fails."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from flowjit import env as fenv
from flowjit import launch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mp_worker.py")
STEPS = 3
LAUNCH_VARS = ("FLOWJIT_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_", "OMPI_",
               "SLURM_", "PMIX_", "GROUP_RANK", "NODE_RANK")


def clean_env(**extra):
    """os.environ without any launcher's variables, plus `extra`."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARS)}
    e.update(FLOWJIT_TIMEOUT="30")  # FLOWJIT_TIMEOUT is not a launcher variable; keep failures quick
    e.update({k: str(v) for k, v in extra.items()})
    return e


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("one") / "ref.npz")
    subprocess.run([sys.executable, WORKER, out, "1", "split", str(STEPS), "-1"], env=clean_env(), check=True)
    return dict(np.load(out))


def check_same(outs, want, texts=()):
    for out in outs:
        assert os.path.exists(out), "\n".join(texts)
        got = np.load(out)
        assert sorted(got.files) == sorted(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)


def worker_args(out_pattern, mode="split", exit_after=-1):
    # mp_worker writes to argv[1]; every process gets the same arguments, so
    # the output name holds {rank}, filled in by a tiny wrapper below.
    return ["-c", WRAPPER, out_pattern, "1", mode, str(STEPS), str(exit_after)]


# Runs mp_worker with {rank} in the output path replaced by this process's
# rank as flow.env sees it (whichever launcher set the environment).
WRAPPER = (
    "import runpy, sys; import flowjit as flow; "
    f"sys.argv = [{WORKER!r}] + [a.replace('{{rank}}', str(flow.env.get_rank())) for a in sys.argv[1:]]; "
    f"runpy.run_path({WORKER!r}, run_name='__main__')"
)


def run_launcher(tmp_path, nproc, *extra, exit_after=-1, timeout=120):
    out = str(tmp_path / "r{rank}.npz")
    cmd = [sys.executable, "-m", "flowjit.launch", "--nproc-per-node", str(nproc), *extra, "--no-python",
           sys.executable, *worker_args(out, exit_after=exit_after)]
    p = subprocess.run(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p, [out.format(rank=r) for r in range(nproc)]


@pytest.mark.parametrize("nproc", [2, 4])
def test_flowjit_launch_matches_one_process(tmp_path, one_process, nproc):
    p, outs = run_launcher(tmp_path, nproc)
    assert p.returncode == 0, p.stdout
    check_same(outs, one_process, [p.stdout])


TOKEN = "test-launch-token-0123456789abcdef"  # what flowjit.launch would generate


def start_by_hand(tmp_path, world, env_of_rank):
    """Starts `world` workers with the environment a launcher would set."""
    out = str(tmp_path / "r{rank}.npz")
    procs = [subprocess.Popen([sys.executable, *worker_args(out)],
                              env=clean_env(FLOWJIT_STORE_TOKEN=TOKEN, **env_of_rank(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    texts = [p.communicate(timeout=120)[0] for p in procs]
    for p, t in zip(procs, texts):
        assert p.returncode == 0, t
    return [out.format(rank=r) for r in range(world)], texts


def test_torchrun_environment(tmp_path, one_process):
    port = free_port()
    outs, texts = start_by_hand(tmp_path, 2, lambda r: dict(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r,
                                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
    check_same(outs, one_process, texts)


def test_mpirun_environment(tmp_path, one_process):
    port = free_port()  # mpirun sets no port: MASTER_PORT here, a job-id port in test_rendezvous_defaults
    outs, texts = start_by_hand(tmp_path, 2, lambda r: dict(
        OMPI_COMM_WORLD_RANK=r, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_RANK=r,
        OMPI_COMM_WORLD_LOCAL_SIZE=2, MASTER_PORT=port))
    check_same(outs, one_process, texts)


def test_slurm_environment(tmp_path, one_process):
    port = free_port()
    # The bracket form; its first host, 127.0.0.1, serves the rendezvous.
    outs, texts = start_by_hand(tmp_path, 2, lambda r: dict(
        SLURM_PROCID=r, SLURM_NTASKS=2, SLURM_LOCALID=r, SLURM_JOB_NODELIST="127.0.0.[1-4,7]",
        SLURM_JOB_ID=1234, MASTER_PORT=port))
    check_same(outs, one_process, texts)


def mpirun():
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("Open MPI's mpirun is not installed (apt-get install openmpi-bin)")
    return exe


@pytest.mark.parametrize("nproc", [2, 4])
def test_real_mpirun(tmp_path, one_process, nproc):
    exe = mpirun()
    out = str(tmp_path / "r{rank}.npz")
    e = clean_env(FLOWJIT_STORE_TOKEN=TOKEN, OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    # No MASTER_PORT: the rendezvous port comes from Open MPI's job id.
    p = subprocess.run([exe, "--oversubscribe", "--bind-to", "none", "-np", str(nproc), sys.executable,
                        *worker_args(out)], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stdout
    check_same([out.format(rank=r) for r in range(nproc)], one_process, [p.stdout])


def test_a_failing_process_stops_the_others(tmp_path):
    t0 = time.monotonic()
    # The last rank exits with status 3 at step 1; the other would wait for it
    # in a collective until FLOWJIT_TIMEOUT (30 s) if the launcher did not stop it.
    p, _ = run_launcher(tmp_path, 2, "--stop-timeout", "5", exit_after=1)
    assert p.returncode == 3, p.stdout
    assert "process 1 (local rank 1) exited with status 3; stopping the other 1" in p.stdout
    assert time.monotonic() - t0 < 25


SLEEPER = """
import os, signal, sys, time
open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(str(os.getpid()))
def bye(signum, frame):
    open(os.path.join(sys.argv[1], "got" + os.environ["RANK"]), "w").write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
time.sleep(60)
"""


def test_signals_are_forwarded(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    p = subprocess.Popen([sys.executable, "-m", "flowjit.launch", "--nproc-per-node", "2", str(script),
                          str(tmp_path)], env=clean_env())
    deadline = time.monotonic() + 30
    while not all((tmp_path / str(r)).exists() for r in range(2)):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    time.sleep(0.2)  # the handlers are installed right after the pid files are written
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    for r in range(2):
        assert (tmp_path / f"got{r}").read_text() == str(int(signal.SIGTERM))


STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(str(os.getpid()))
time.sleep(120)
"""


def test_processes_that_ignore_the_signal_are_killed_after_the_stop_timeout(tmp_path):
    # Before: the launcher forwarded SIGTERM and then waited for processes
    # that ignore it forever (no deadline).
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    p = subprocess.Popen([sys.executable, "-m", "flowjit.launch", "--nproc-per-node", "2", "--stop-timeout",
                          "1", str(script), str(tmp_path)], env=clean_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not all((tmp_path / str(r)).exists() for r in range(2)):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    time.sleep(0.2)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 15
    assert "killing them" in p.stderr.read()
    for r in range(2):
        pid = int((tmp_path / str(r)).read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launcher_environment():
    a = launch._parser().parse_args(["--nproc-per-node", "2", "--nnodes", "3", "--node-rank", "1",
                                     "--master-addr", "host0", "--master-port", "1234", "x.py", "--lr", "1"])
    assert a.args == ["--lr", "1"]
    envs = launch.process_environments(a, base={"FLOWJIT_RANK": "7", "PATH": "/bin", fenv.STORE_TOKEN_ENV: "s"})
    assert [e["RANK"] for e in envs] == ["2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    for e in envs:
        assert (e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"], e["GROUP_RANK"]) == ("6", "host0", "1234", "1")
        assert "FLOWJIT_RANK" not in e and e["PATH"] == "/bin" and e[fenv.STORE_TOKEN_ENV] == "s"
    # One machine: a token is generated, the same for every process, and a free port picked.
    a = launch._parser().parse_args(["--nproc-per-node", "2", "x.py"])
    envs = launch.process_environments(a, base={})
    assert len(envs[0][fenv.STORE_TOKEN_ENV]) >= 32
    assert envs[0][fenv.STORE_TOKEN_ENV] == envs[1][fenv.STORE_TOKEN_ENV]
    assert 0 < int(envs[0]["MASTER_PORT"]) < 65536
    for bad, msg in [(["--nproc-per-node", "0"], "nproc-per-node"), (["--nnodes", "2", "--node-rank", "2"], "node-rank"),
                     (["--master-port", "70000"], "master-port")]:
        with pytest.raises(ValueError, match=msg):
            launch.check_args(launch._parser().parse_args(bad + ["x.py"]))


def test_launcher_rejects_bad_options():
    p = subprocess.run([sys.executable, "-m", "flowjit.launch", "--nproc-per-node", "0", "x.py"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    assert p.returncode == 2 and "--nproc-per-node must be at least 1" in p.stdout


def test_slurm_nodelist():
    assert fenv.expand_nodelist("node[01-04,07]") == ["node01", "node02", "node03", "node04", "node07"]
    assert fenv.expand_nodelist("a1,b[2-3],c") == ["a1", "b2", "b3", "c"]
    assert fenv.expand_nodelist("r[1-2]n[08-09]") == ["r1n08", "r1n09", "r2n08", "r2n09"]
    assert fenv.expand_nodelist("gpu-[9-10]")[0] == "gpu-9"
    for bad in ["", "node[1-2", "node[a-b]", "node[3-1]", "n]"]:
        with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
            fenv.expand_nodelist(bad)


@pytest.fixture
def no_launcher(monkeypatch):
    for k in list(os.environ):
        if k.startswith(LAUNCH_VARS):
            monkeypatch.delenv(k)
    saved = dict(fenv._state)
    yield monkeypatch
    fenv._state.update(saved)


def where(expect_rank, expect_world, expect_local, expect_master):
    assert (fenv.get_rank(), fenv.get_world_size(), fenv.get_local_rank(), fenv._master()) == \
        (expect_rank, expect_world, expect_local, expect_master)


def test_environment_of_each_launcher(no_launcher):
    mp = no_launcher
    assert (fenv.get_rank(), fenv.get_world_size(), fenv.get_local_rank()) == (0, 1, 0)
    for k, v in dict(SLURM_PROCID=5, SLURM_NTASKS=8, SLURM_LOCALID=1, SLURM_JOB_NODELIST="cn[003-004]",
                     SLURM_JOB_ID=77).items():
        mp.setenv(k, str(v))
    where(5, 8, 1, ("cn003", fenv._port_from_job_id("slurm-77-")))
    mp.setenv("SLURM_STEP_NUM_TASKS", "6")  # srun -n 6 inside a larger allocation
    assert fenv.get_world_size() == 6
    for k, v in dict(OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_RANK=0,
                     OMPI_COMM_WORLD_LOCAL_SIZE=4, OMPI_MCA_ess_base_jobid="31").items():
        mp.setenv(k, str(v))  # mpirun inside a Slurm allocation: mpirun's own variables win
    where(2, 4, 0, ("127.0.0.1", fenv._port_from_job_id("31")))
    mp.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        fenv._master()  # several machines: mpirun does not say where rank 0 is
    for k, v in dict(RANK=1, WORLD_SIZE=3, LOCAL_RANK=1, MASTER_ADDR="h0", MASTER_PORT=2222).items():
        mp.setenv(k, str(v))
    where(1, 3, 1, ("h0", 2222))
    for k, v in dict(FLOWJIT_RANK=0, FLOWJIT_WORLD_SIZE=2, FLOWJIT_MASTER_PORT=3333).items():
        mp.setenv(k, str(v))
    where(0, 2, 0, ("h0", 3333))  # FLOWJIT_* first; the address falls back to MASTER_ADDR
    fenv.machine([{"addr": "m0"}, {"addr": "m1"}, {"addr": "m2"}])
    fenv.ctrl_port(4444)
    assert (fenv.get_world_size(), fenv._master()) == (3, ("m0", 4444))


def test_rank_errors_name_the_variable(no_launcher):
    mp = no_launcher
    mp.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK \(or FLOWJIT_RANK\)"):
        fenv.get_rank()
    mp.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2 is outside 0..1"):
        fenv.get_rank()
    mp.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x' is not an integer"):
        fenv.get_rank()
    mp.setenv("RANK", "1")
    with pytest.raises(ValueError, match="rendezvous port"):
        fenv._master()


MISMATCHED = """
import numpy as np, flowjit as flow, flowjit.typing as tp
rank = flow.env.get_rank()
n = 4 if rank == 0 else 6  # the processes disagree on a variable's shape
@flow.global_function(type="train")
def step(x: tp.Numpy.Placeholder((8, n))) -> tp.Numpy:
    w = flow.get_variable("w", shape=(n, 3), initializer=flow.constant_initializer(0.1))
    loss = flow.math.reduce_mean(flow.matmul(x, w), axis=1)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss
try:
    step(np.ones((8, n), np.float32))
except RuntimeError as e:
    import os
    os.write(1, f"rank {rank} refused: {e}\\n".encode())  # one write: the ranks share the pipe
"""


def test_processes_that_traced_different_programs_get_an_error_not_a_terminate(tmp_path):
    # Before: collectives of different sizes, and Gloo's transport thread
    # answered with gloo::EnforceNotMet -> std::terminate (SIGABRT, no Python error).
    script = tmp_path / "mismatched.py"
    script.write_text(MISMATCHED)
    p = subprocess.run([sys.executable, "-m", "flowjit.launch", "--nproc-per-node", "2", str(script)],
                       env=clean_env(FLOWJIT_DISABLE_CACHE="1"), capture_output=True, text=True, timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "terminate called" not in out
    for r in range(2):
        assert f"rank {r} refused: job 'step': the processes compiled different programs" in out, out[-3000:]
