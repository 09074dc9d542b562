"""flow.linalg: linear algebra under OneFlow's flow.linalg names."""
from ._ops import matmul

__all__ = ["matmul"]

