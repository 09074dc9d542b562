"""Starts the processes of a job, as torchrun does:

    python -m flowjit.launch --nproc-per-node N [--nnodes M --node-rank R
        --master-addr A --master-port P] script.py [args...]
    python -m flowjit.launch --nproc-per-node N -m package.module [args...]

Each of the N processes runs the script with the environment torchrun sets
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,
MASTER_ADDR, MASTER_PORT), which flow.env reads. Several machines: run the
launcher once on each, with the same --nnodes, --master-addr (node 0's
host) and --master-port, and each its own --node-rank.

The launcher forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to its processes.
When one exits with an error, the others are stopped (SIGTERM, then SIGKILL
after --stop-timeout seconds) and the launcher exits with that process's
status (128 + the signal number when a signal ended it).

The rendezvous store's token (flow.env.STORE_TOKEN_ENV) is generated here
for a one-machine job when the environment does not already hold one; for
several machines, set the same value on every machine yourself.
"""
import argparse
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from .env import STORE_TOKEN_ENV, new_store_token

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m flowjit.launch",
        description="Start the processes of a flowjit job (torchrun's options and environment).")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, dest="nproc_per_node",
                   help="processes on this machine (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="machines of the job (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, dest="node_rank",
                   help="this machine's index, 0..nnodes-1 (default 0)")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1", dest="master_addr",
                   help="host of node 0, where process 0 serves the rendezvous (default 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", type=int, default=None, dest="master_port",
                   help="rendezvous port (default: a free port with one machine, 29500 with several)")
    p.add_argument("--stop-timeout", type=float, default=10.0, dest="stop_timeout",
                   help="seconds stopped processes get between SIGTERM and SIGKILL (default 10)")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the target as a module (python -m), not as a script")
    p.add_argument("--no-python", action="store_true", dest="no_python",
                   help="run the target as a program, not with this Python")
    p.add_argument("script", help="the script (or module, with -m) every process runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _free_port(host):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host if host not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def check_args(a):
    """Raises ValueError naming the option that is out of range."""
    if a.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {a.nproc_per_node}")
    if a.nnodes < 1:
        raise ValueError(f"--nnodes must be at least 1, got {a.nnodes}")
    if not 0 <= a.node_rank < a.nnodes:
        raise ValueError(f"--node-rank must be in 0..{a.nnodes - 1} for --nnodes {a.nnodes}, got {a.node_rank}")
    if a.master_port is not None and not 0 < a.master_port < 65536:
        raise ValueError(f"--master-port must be in 1..65535, got {a.master_port}")
    if a.stop_timeout < 0:
        raise ValueError(f"--stop-timeout must not be negative, got {a.stop_timeout}")


def process_environments(a, base=None):
    """The environment of each local process, in local-rank order."""
    base = dict(os.environ if base is None else base)
    port = a.master_port
    if port is None:
        try:
            port = _free_port(a.master_addr) if a.nnodes == 1 else 29500
        except OSError:
            port = 29500
    if STORE_TOKEN_ENV not in base and a.nnodes == 1:
        base[STORE_TOKEN_ENV] = new_store_token()
    world = a.nnodes * a.nproc_per_node
    # The launcher's own variables decide; stale flowjit ones would outrank them.
    for k in ("FLOWJIT_WORLD_SIZE", "FLOWJIT_RANK", "FLOWJIT_LOCAL_RANK", "FLOWJIT_MASTER_ADDR",
              "FLOWJIT_MASTER_PORT"):
        base.pop(k, None)
    envs = []
    for local in range(a.nproc_per_node):
        e = dict(base)
        e.update(RANK=str(a.node_rank * a.nproc_per_node + local), WORLD_SIZE=str(world),
                 LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(a.nproc_per_node),
                 GROUP_RANK=str(a.node_rank), NODE_RANK=str(a.node_rank),
                 MASTER_ADDR=a.master_addr, MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        envs.append(e)
    return envs


def _set_parent_death_signal():
    # A process whose launcher dies (SIGKILL cannot be forwarded) gets SIGTERM.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _status(code):
    return 128 - code if code < 0 else code


def _describe(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def run(a):
    """Starts the processes and waits; returns the launcher's exit status."""
    check_args(a)
    if a.no_python:
        cmd = [a.script]
    else:
        cmd = [sys.executable, "-u"] + (["-m", a.script] if a.module else [a.script])
    cmd += a.args
    envs = process_environments(a)
    first = a.node_rank * a.nproc_per_node
    received = []
    first_signal_at = []  # monotonic time of the first forwarded signal

    def forward(signum, _frame):
        received.append(signum)
        if not first_signal_at:
            first_signal_at.append(time.monotonic())
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    procs = []
    old = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        for e in envs:
            # Own process group: a terminal's Ctrl-C reaches them once, through us.
            procs.append(subprocess.Popen(cmd, env=e, start_new_session=True,
                                          preexec_fn=_set_parent_death_signal))
        # One waiter thread per process records exits in the order they
        # happen: a rank that fails makes its peers fail too (a lost
        # connection) within milliseconds, and the launcher must report the
        # first, not the lowest-numbered of those that died between two polls.
        exits = queue.Queue()

        def watch(i, p):
            exits.put((i, p.wait()))

        for i, p in enumerate(procs):
            threading.Thread(target=watch, args=(i, p), daemon=True).start()
        failed = None
        remaining = len(procs)
        while remaining:
            try:
                i, c = exits.get(timeout=0.1)  # a timeout: signals are handled between waits
            except queue.Empty:
                # Processes that ignore a forwarded signal get --stop-timeout
                # seconds, then SIGKILL: the launcher itself always ends.
                if first_signal_at and time.monotonic() - first_signal_at[0] > a.stop_timeout:
                    late = [first + j for j, p in enumerate(procs) if p.poll() is None]
                    if late:
                        print(f"flowjit.launch: process(es) {late} still running {a.stop_timeout:g} s "
                              f"after {signal.Signals(received[0]).name}; killing them",
                              file=sys.stderr, flush=True)
                        for p in procs:
                            if p.poll() is None:
                                p.kill()
                    first_signal_at.clear()
                    first_signal_at.append(float("inf"))  # killed once
                continue
            remaining -= 1
            if c != 0 and failed is None and not received:
                failed = (i, c)
                print(f"flowjit.launch: process {first + i} (local rank {i}) {_describe(c)}; "
                      f"stopping the other {len(procs) - 1}", file=sys.stderr, flush=True)
                _stop(procs, a.stop_timeout)
                break
        for p in procs:
            p.wait()
        if failed is not None:
            return _status(failed[1])
        if received:
            _stop(procs, a.stop_timeout)
            return 128 + received[0]
        return 0
    finally:
        _stop(procs, a.stop_timeout)
        for s, h in old.items():
            signal.signal(s, h)


def _stop(procs, grace):
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        try:
            p.terminate()
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv=None):
    p = _parser()
    a = p.parse_args(argv)
    if a.args and a.args[0] == "--":
        a.args = a.args[1:]
    try:
        check_args(a)
    except ValueError as e:
        p.error(str(e))
    sys.exit(run(a))


if __name__ == "__main__":
    main()
