"""flow.linalg: linear algebra under OneFlow's flow.linalg names.

The docstrings' examples assume ``import numpy as np``, ``import flowjit as flow``
and ``import flowjit.typing as tp``; each starts from a fresh session.
"""
from ._ops.builders import matmul

__all__ = ["matmul"]

