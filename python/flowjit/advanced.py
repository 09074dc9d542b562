"""flow.advanced: OneFlow's distribute ops (see flowjit._dist.views for what they
mean on flowjit: the values of a split, clone, sum or concatenation over the
devices of the current placement; the compiler places them)."""
from ._dist.views import distribute_add, distribute_clone, distribute_concat, distribute_map, distribute_split

__all__ = ["distribute_add", "distribute_clone", "distribute_concat", "distribute_map", "distribute_split"]
