"""flow.distributed: this process's place among the processes of a job
(OneFlow's ``flow.distributed.get_rank()`` and friends), the same values as
:mod:`flowjit.env`'s."""
from . import env as _env

__all__ = ["get_local_rank", "get_rank", "get_world_size", "is_multi_client"]


def get_rank() -> int:
    """This process's index among the job's processes (0 when it runs alone).

    Example:
        >>> flow.distributed.get_rank()
        0
    """
    return _env.get_rank()


def get_world_size() -> int:
    """The number of processes of the job (1 when it runs alone).

    Example:
        >>> flow.distributed.get_world_size()
        1
    """
    return _env.get_world_size()


def get_local_rank() -> int:
    """This process's index among the job's processes on its machine.

    Example:
        >>> flow.distributed.get_local_rank()
        0
    """
    return _env.get_local_rank()


def is_multi_client() -> bool:
    """True when this process is one of several that each run the program
    (``python -m flowjit.launch`` or FLOWJIT_WORLD_SIZE > 1), OneFlow's
    multi-client mode; False for a process that runs alone.

    Example:
        >>> flow.distributed.is_multi_client()
        False
    """
    return _env.get_world_size() > 1
