"""flow.env: the processes of a job spread over several machines.

The same script runs in every process, as in OneFlow. Set the processes
either with flow.env.machine([...]) and flow.env.ctrl_port(port) plus the
process's rank in FLOWJIT_RANK, or with environment variables only:

    FLOWJIT_WORLD_SIZE=2 FLOWJIT_RANK=0 FLOWJIT_MASTER_ADDR=127.0.0.1 FLOWJIT_MASTER_PORT=29500

Process 0 hosts the rendezvous at the master address and control port. Every
process also needs the job's token in FLOWJIT_STORE_TOKEN (STORE_TOKEN_ENV),
the same secret everywhere: the rendezvous serves no one who does not present
it. A launcher makes one with new_store_token() and puts it in the
environment of every process it starts; by hand:

    export FLOWJIT_STORE_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))')

The master address is the one process 0 listens on: 127.0.0.1 (the default)
when every process is on one machine; otherwise process 0's address on the
network the machines share (never 0.0.0.0 or a public address: the token
keeps strangers out, but it travels unencrypted).
"""
import os
import secrets

__all__ = ["machine", "ctrl_port", "timeout", "STORE_TOKEN_ENV", "new_store_token"]

# The environment variable that carries the rendezvous token (read by the
# C++ runtime, runtime/tcp_store.h: kStoreTokenEnv; 16 to 1024 characters).
STORE_TOKEN_ENV = "FLOWJIT_STORE_TOKEN"


def new_store_token():
    """A fresh job token for STORE_TOKEN_ENV: 64 random hex digits."""
    return secrets.token_hex(32)

_state = {"machines": None, "ctrl_port": None, "timeout": None}


def machine(nodes):
    """The machines of the job: a list of {"addr": "host"} (OneFlow's form)
    or of host strings; the first hosts the rendezvous."""
    if not isinstance(nodes, (list, tuple)) or not nodes:
        raise ValueError(f"env.machine: expected a non-empty list of {{'addr': host}}, got {nodes!r}")
    addrs = []
    for n in nodes:
        addr = n.get("addr") if isinstance(n, dict) else n
        if not isinstance(addr, str) or not addr:
            raise ValueError(f"env.machine: every machine needs an address, got {n!r}")
        addrs.append(addr)
    _state["machines"] = addrs


def ctrl_port(port):
    """The TCP port of the rendezvous on the first machine."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"env.ctrl_port: expected a port number in 1..65535, got {port!r}")
    _state["ctrl_port"] = port


def timeout(seconds):
    """How long to wait for the other processes (rendezvous and every
    collective) before failing; 60 s by default."""
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"env.timeout: expected a positive number of seconds, got {seconds!r}")
    _state["timeout"] = float(seconds)


def _int_env(name):
    v = os.environ.get(name)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer") from None


def _process_count():
    if _state["machines"] is not None:
        return len(_state["machines"])
    n = _int_env("FLOWJIT_WORLD_SIZE")
    if n is not None and n < 1:
        raise ValueError(f"FLOWJIT_WORLD_SIZE must be >= 1, got {n}")
    return n or 1


def _process_rank():
    n = _process_count()
    r = _int_env("FLOWJIT_RANK")
    if n == 1:
        return 0
    if r is None:
        raise ValueError(f"this job runs over {n} processes, but FLOWJIT_RANK (this process's index, "
                         f"0..{n - 1}) is not set")
    if not 0 <= r < n:
        raise ValueError(f"FLOWJIT_RANK={r} is outside 0..{n - 1} for {n} processes")
    return r


def _master():
    addr = _state["machines"][0] if _state["machines"] else os.environ.get("FLOWJIT_MASTER_ADDR", "127.0.0.1")
    port = _state["ctrl_port"] or _int_env("FLOWJIT_MASTER_PORT")
    if port is None:
        raise ValueError("several processes need a rendezvous port: call flow.env.ctrl_port(port) or set "
                         "FLOWJIT_MASTER_PORT")
    return addr, port


def _configure_processes(local):
    from . import _C
    info = _C.device_info()
    n = _process_count()
    if info["several_processes"] and info["ranks"] == n * local:
        return
    addr, port = _master()
    t = _state["timeout"] or float(os.environ.get("FLOWJIT_TIMEOUT", "60"))
    _C.configure_processes(local, _process_rank(), n, addr, port, t)
