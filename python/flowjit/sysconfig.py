"""flow.sysconfig: how this flowjit was built (OneFlow's build queries, answered for flowjit).

flowjit has no C++ extension API (every kernel is generated from its own op
list, and flow.config.load_library raises), so it installs no headers:
get_include and get_compile_flags raise NotImplementedError.
"""
import os
from typing import List

from . import _C

__all__ = ["get_include", "get_lib", "get_compile_flags", "get_link_flags", "with_cuda", "with_xla",
           "has_rpc_backend_grpc", "has_rpc_backend_local", "cmake_build_type"]

_NO_HEADERS = ("flowjit installs no C++ headers: it has no extension API for custom ops (every kernel is "
               "generated from its own op list)")


def get_include() -> str:
    """Raises NotImplementedError: flowjit installs no C++ headers."""
    raise NotImplementedError(f"sysconfig.get_include: {_NO_HEADERS}")


def get_compile_flags() -> List[str]:
    """Raises NotImplementedError: there is nothing to compile against."""
    raise NotImplementedError(f"sysconfig.get_compile_flags: {_NO_HEADERS}")


def get_lib() -> str:
    """The directory of flowjit's compiled core (flowjit/_C*.so)."""
    return os.path.dirname(os.path.abspath(_C.__file__))


def get_link_flags() -> List[str]:
    """Linker flags naming flowjit's compiled core: ["-L<dir>", "-l:_C....so"]."""
    return [f"-L{get_lib()}", f"-l:{os.path.basename(_C.__file__)}"]


def with_cuda() -> bool:
    """True: every flowjit build carries its CUDA back end (PTX from LLVM's
    NVPTX target, the driver loaded when a job placed on a GPU first runs).
    Whether a GPU can be used here is another question: flowjit._C.gpu_status()."""
    return True


def with_xla() -> bool:
    """False: flowjit compiles jobs itself, without XLA."""
    return False


def has_rpc_backend_grpc() -> bool:
    """False: flowjit uses no gRPC (its processes meet at a TCP rendezvous of its own, see flow.env)."""
    return False


def has_rpc_backend_local() -> bool:
    """True: a job runs in one process without any RPC (several processes
    use flowjit's own TCP rendezvous, see flow.env)."""
    return True


def cmake_build_type() -> str:
    """The CMake build type of flowjit's core, where the build recorded it
    (flowjit._C.build_info()); NotImplementedError where it did not."""
    kind = _C.build_info().get("build_type")
    if not kind:
        raise NotImplementedError("sysconfig.cmake_build_type: this flowjit build does not record its CMake "
                                  "build type (flowjit._C.build_info() has no 'build_type')")
    return kind
