"""flow.env: the processes of a job spread over several machines.

The same script runs in every process, as in OneFlow. A process learns its
place in the job from, in this order (the first that applies wins):

1. ``flow.env.machine([...])`` and ``flow.env.ctrl_port(port)`` in the script:
   one process per listed machine, the first hosting the rendezvous at the
   control port; the rank comes from the environment as below.
2. flowjit's own variables: ``FLOWJIT_WORLD_SIZE``, ``FLOWJIT_RANK``,
   ``FLOWJIT_LOCAL_RANK``, ``FLOWJIT_MASTER_ADDR``, ``FLOWJIT_MASTER_PORT``.
3. torchrun's (and ``python -m flowjit.launch``'s): ``WORLD_SIZE``, ``RANK``,
   ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``.
4. Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_RANK``,
   ``OMPI_COMM_WORLD_LOCAL_RANK``.
5. Slurm's ``srun``: ``SLURM_NTASKS`` (``SLURM_STEP_NUM_TASKS`` when set),
   ``SLURM_PROCID``, ``SLURM_LOCALID``; the rendezvous host is the first
   host of ``SLURM_JOB_NODELIST`` (``node[01-04,07]`` -> ``node01``).

The world size and the rank are taken from the same source (the first whose
world-size variable is set). The rendezvous address is ``FLOWJIT_MASTER_ADDR``,
else ``MASTER_ADDR``, else the source's own (Slurm's first node; 127.0.0.1
for mpirun on one node), else 127.0.0.1; the port is ``ctrl_port``, else
``FLOWJIT_MASTER_PORT``, else ``MASTER_PORT``, else, under mpirun or Slurm,
one derived from the job id (the same in every process of the job).

Example, by hand:

    FLOWJIT_WORLD_SIZE=2 FLOWJIT_RANK=0 FLOWJIT_MASTER_ADDR=127.0.0.1 FLOWJIT_MASTER_PORT=29500

or ``python -m flowjit.launch --nproc-per-node 2 script.py`` (which makes the token).

Process 0 hosts the rendezvous at the master address and control port. Every
process also needs the job's token in FLOWJIT_STORE_TOKEN (STORE_TOKEN_ENV),
the same secret everywhere: the rendezvous serves no one who cannot prove
it knows it (an HMAC over nonces of both sides; the token itself is never
sent). A launcher makes one with new_store_token() and puts it in the
environment of every process it starts; by hand:

    export FLOWJIT_STORE_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))')

The master address is the one process 0 listens on: 127.0.0.1 (the default)
when every process is on one machine; otherwise process 0's address on the
network the machines share (never 0.0.0.0 or a public address: the token
keeps strangers out, but the keys and values after the handshake travel
unencrypted and unauthenticated).
"""
import dataclasses
import os
import re
import secrets
import zlib
from typing import List, Union

from . import config, scope

__all__ = ["machine", "ctrl_port", "timeout", "get_rank", "get_world_size", "get_local_rank",
           "STORE_TOKEN_ENV", "new_store_token", "init", "current_resource", "all_device_placement",
           "data_port", "log_dir", "logtostderr", "logbuflevel", "grpc_use_no_signal", "init_bootstrap_confs",
           "BootstrapConf"]

_state = {"machines": None, "ctrl_port": None, "timeout": None}

# The variable that carries the rendezvous store's shared secret to every
# process (flowjit.launch makes one with new_store_token()); the one place
# on the Python side that names it (the C++ store: runtime/comm/tcp_store.h).
STORE_TOKEN_ENV = "FLOWJIT_STORE_TOKEN"


def new_store_token() -> str:
    """A fresh job token for STORE_TOKEN_ENV: 64 random hex digits."""
    return secrets.token_hex(32)

# Sources of (world size, rank, local rank), in precedence order.
_SOURCES = (
    ("flowjit", ("FLOWJIT_WORLD_SIZE",), "FLOWJIT_RANK", "FLOWJIT_LOCAL_RANK"),
    ("torchrun", ("WORLD_SIZE",), "RANK", "LOCAL_RANK"),
    ("mpirun", ("OMPI_COMM_WORLD_SIZE",), "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("slurm", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), "SLURM_PROCID", "SLURM_LOCALID"),
)


def machine(nodes: List[Union[str, dict]]) -> None:
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


def ctrl_port(port: int) -> None:
    """The TCP port of the rendezvous on the first machine."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"env.ctrl_port: expected a port number in 1..65535, got {port!r}")
    _state["ctrl_port"] = port


_set_ctrl_port = ctrl_port  # for init_bootstrap_confs, whose parameter has the same name


def timeout(seconds: float) -> None:
    """How long to wait for the other processes (rendezvous and every
    collective) before failing; 60 s by default."""
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"env.timeout: expected a positive number of seconds, got {seconds!r}")
    _state["timeout"] = float(seconds)


def get_rank() -> int:
    """This process's index in the job (0 when it runs alone).

    Example:
        >>> flow.env.get_rank()   # a process that runs alone
        0
    """
    return _process_rank()


def get_world_size() -> int:
    """The number of processes of the job.

    Example:
        >>> flow.env.get_world_size()   # a process that runs alone
        1
    """
    return _process_count()


def get_local_rank() -> int:
    """This process's index among the job's processes on its machine.

    Example:
        >>> flow.env.get_local_rank()   # a process that runs alone
        0
    """
    src = _source()
    if src is None or _process_count() == 1:
        return 0
    v = _int_env(src[3])
    return _process_rank() if v is None else v


def _int_env(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer") from None


def _source():
    """(name, world-size variable, rank variable, local-rank variable) of
    the first launcher whose world size is set, or None."""
    for name, sizes, rank, local in _SOURCES:
        for size in sizes:
            if os.environ.get(size, "") != "":
                return name, size, rank, local
    return None


def _process_count():
    if _state["machines"] is not None:
        return len(_state["machines"])
    src = _source()
    if src is None:
        return 1
    n = _int_env(src[1])
    if n < 1:
        raise ValueError(f"{src[1]} must be >= 1, got {n}")
    return n


def _rank_variable():
    """The variable this process's rank is read from."""
    src = _source()
    if src is not None:
        return src[2]
    if _state["machines"] is not None:  # flow.env.machine: the first rank variable that is set
        for _, _, rank, _ in _SOURCES:
            if os.environ.get(rank, "") != "":
                return rank
    return "FLOWJIT_RANK"


def _process_rank():
    n = _process_count()
    if n == 1:
        return 0
    var = _rank_variable()
    r = _int_env(var)
    if r is None:
        also = "" if var == "FLOWJIT_RANK" else " (or FLOWJIT_RANK)"
        raise ValueError(f"this job runs over {n} processes, but {var}{also} (this process's index, "
                         f"0..{n - 1}) is not set")
    if not 0 <= r < n:
        raise ValueError(f"{var}={r} is outside 0..{n - 1} for {n} processes")
    return r


def expand_nodelist(text: str) -> List[str]:
    """Slurm's compressed host list ("node[01-04,07],gpu1") as a list of
    hosts (node01 ... node04, node07, gpu1); several bracket groups in one
    name multiply out ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"SLURM_JOB_NODELIST: expected a host list such as 'node[01-04,07]', got {text!r}")
    names, depth, start = [], 0, 0
    for i, c in enumerate(text + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if depth < 0 or depth > 1:
            raise ValueError(f"SLURM_JOB_NODELIST={text!r}: unbalanced brackets")
        if c == "," and depth == 0:
            if i > start:
                names.append(text[start:i].strip())
            start = i + 1
    if depth != 0:
        raise ValueError(f"SLURM_JOB_NODELIST={text!r}: unbalanced brackets")
    hosts = []
    for name in names:
        parts = re.split(r"(\[[^\]]*\])", name)
        expanded = [""]
        for p in parts:
            if not p.startswith("["):
                expanded = [e + p for e in expanded]
                continue
            choices = []
            for item in p[1:-1].split(","):
                m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", item)
                if not m:
                    raise ValueError(f"SLURM_JOB_NODELIST={text!r}: bad range {item!r} in {p}")
                lo, hi = m.group(1), m.group(2) or m.group(1)
                if int(hi) < int(lo):
                    raise ValueError(f"SLURM_JOB_NODELIST={text!r}: range {item!r} runs backwards")
                width = len(lo)
                choices.extend(str(k).zfill(width) for k in range(int(lo), int(hi) + 1))
            expanded = [e + c for e in expanded for c in choices]
        hosts.extend(expanded)
    return hosts


def _first_slurm_host():
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") \
        or os.environ.get("SLURM_NODELIST")
    return expand_nodelist(nodes)[0] if nodes else None


def _port_from_job_id(job):
    """A port every process of one job derives alike (20000..39999)."""
    return 20000 + zlib.crc32(job.encode()) % 20000


def _master():
    src = _source()
    kind = src[0] if src else None
    if _state["machines"]:
        addr = _state["machines"][0]
    else:
        addr = os.environ.get("FLOWJIT_MASTER_ADDR") or os.environ.get("MASTER_ADDR")
        if not addr and kind == "slurm":
            addr = _first_slurm_host()
        if not addr and kind == "mpirun":
            size = _int_env("OMPI_COMM_WORLD_SIZE")
            local = _int_env("OMPI_COMM_WORLD_LOCAL_SIZE")
            if local is not None and local != size:
                raise ValueError(f"mpirun started {size} processes over several machines ({local} on this "
                                 "one), and Open MPI does not say where rank 0 runs: set MASTER_ADDR (or "
                                 "FLOWJIT_MASTER_ADDR) to rank 0's host, e.g. mpirun -x MASTER_ADDR=host0")
        addr = addr or "127.0.0.1"
    port = _state["ctrl_port"] or _int_env("FLOWJIT_MASTER_PORT") or _int_env("MASTER_PORT")
    if port is None:
        job = None
        if kind == "slurm":
            job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
            job = job and f"slurm-{job}-{os.environ.get('SLURM_STEP_ID', '')}"
        elif kind == "mpirun":
            job = os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMIX_NAMESPACE")
        if job:
            port = _port_from_job_id(job)
    if port is None:
        raise ValueError("several processes need a rendezvous port: call flow.env.ctrl_port(port) or set "
                         "FLOWJIT_MASTER_PORT (or MASTER_PORT)")
    if not 0 < port < 65536:
        raise ValueError(f"the rendezvous port must be in 1..65535, got {port}")
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


# ---------------------------------------------------------------- OneFlow's other env settings

def init() -> bool:
    """Checks the process settings now (world size, this process's rank, the
    rendezvous address and port), so a mistake shows before the first job;
    returns True. The processes connect at the first job call, as before;
    calling it again, or never, is fine."""
    if _process_count() > 1:
        _process_rank()
        _master()
    return True


def current_resource() -> config.Resource:
    """The session's resources: same as flow.config.current_resource()."""
    return config.current_resource()


def all_device_placement(device_type: str) -> scope.Placement:
    """A placement on every device of every machine: ``"cpu"`` (the
    flow.config.cpu_device_num devices) or ``"gpu"`` / ``"cuda"`` (the
    flow.config.gpu_device_num GPUs) of each of get_world_size() machines."""
    if device_type == "cuda":
        device_type = "gpu"
    if device_type not in ("cpu", "gpu"):
        raise ValueError(f"env.all_device_placement: device_type must be \"cpu\" or \"gpu\", got {device_type!r}")
    n = config._settings["cpu_device_num"] if device_type == "cpu" else config._settings["gpu_device_num"]
    if n < 1:
        raise ValueError("env.all_device_placement(\"gpu\"): no GPUs are configured; call "
                         "flow.config.gpu_device_num(n) first")
    return scope.placement(device_type, [f"{m}:0-{n - 1}" for m in range(_process_count())])


def _said_once(name, value, why):
    from ._core import log as _log
    _log.configure()
    said = _state.setdefault("said", set())
    if name not in said and _log.logger.isEnabledFor(_log.logging.INFO):
        said.add(name)
        _log.logger.info("env.%s(%r) is ignored: %s", name, value, why)


def data_port(port: int) -> None:
    """OneFlow's port for data between machines; accepted and ignored:
    flowjit's processes exchange data over the connections they make at the
    rendezvous (ctrl_port)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"env.data_port: expected a port number in 1..65535, got {port!r}")
    _said_once("data_port", port, "data travels over the rendezvous connections (ctrl_port)")


_NO_GLOG = "flowjit writes no log files; its diagnostics go to the logging logger 'flowjit' (FLOWJIT_DEBUG)"


def log_dir(path: str) -> None:
    """OneFlow's directory for its glog files; accepted and ignored: flowjit
    writes no log files. Its diagnostics go through the ``logging`` logger
    "flowjit" (add a logging.FileHandler to it to keep them in a file)."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"env.log_dir: expected a directory path, got {path!r}")
    _said_once("log_dir", path, _NO_GLOG)


def logtostderr(val: int) -> None:
    """OneFlow's glog setting; accepted and ignored (see :func:`log_dir`)."""
    if isinstance(val, bool) or not isinstance(val, int):
        raise TypeError(f"env.logtostderr: expected an int (0 or 1), got {val!r}")
    _said_once("logtostderr", val, _NO_GLOG)


def logbuflevel(val: int) -> None:
    """OneFlow's glog setting; accepted and ignored (see :func:`log_dir`)."""
    if isinstance(val, bool) or not isinstance(val, int):
        raise TypeError(f"env.logbuflevel: expected an int, got {val!r}")
    _said_once("logbuflevel", val, _NO_GLOG)


def grpc_use_no_signal(val: bool = True) -> None:
    """Deprecated in OneFlow itself and without effect there; accepted and
    ignored (flowjit uses no gRPC)."""
    if not isinstance(val, bool):
        raise TypeError(f"env.grpc_use_no_signal: expected True or False, got {val!r}")
    _said_once("grpc_use_no_signal", val, "flowjit uses no gRPC")


@dataclasses.dataclass(frozen=True)
class BootstrapConf:
    """How one process of the job finds the others (init_bootstrap_confs)."""

    rank: int
    host: str
    master_addr: str
    master_port: int
    world_size: int


def init_bootstrap_confs(node_list: Union[str, List[str]], master_port: int, world_size: int = 0,
                         ctrl_port: int = -1, node_size: int = -1) -> List[BootstrapConf]:
    """OneFlow's CI helper: one process per host of `node_list` (the first
    hosts the rendezvous at `master_port`). Sets flow.env.machine(node_list)
    and flow.env.ctrl_port(master_port) and returns each process's
    BootstrapConf. flowjit starts no processes: run the script on each host
    with its rank in FLOWJIT_RANK (or use a launcher). `world_size` must be
    0 or len(node_list) (several processes per host: use python -m
    flowjit.launch); `ctrl_port` and `node_size` are accepted and ignored."""
    if isinstance(node_list, str):
        node_list = [node_list]
    if world_size not in (0, len(node_list)):
        raise NotImplementedError(f"env.init_bootstrap_confs: world_size {world_size} over {len(node_list)} "
                                  "host(s): flowjit runs one process per listed host here; for several "
                                  "processes per host use python -m flowjit.launch")
    machine(list(node_list))
    _set_ctrl_port(master_port)
    return [BootstrapConf(rank=r, host=h, master_addr=node_list[0], master_port=master_port,
                          world_size=len(node_list)) for r, h in enumerate(node_list)]
