"""``oneflow.core.operator``: see :mod:`flowjit.core.operator.op_conf_pb2`."""
