"""The enum values of OneFlow's ``op_conf.proto`` that its model programs
import (``import oneflow.core.operator.op_conf_pb2 as op_conf_util``):
``ActivationType`` (``kNone``, ``kTanH``, ``kSigmoid``, ``kRelu``), with
OneFlow's numbers. The messages themselves (operator configurations) have
no counterpart: flowjit builds its graph from the op functions."""

kNone = 0
kTanH = 1
kSigmoid = 2
kRelu = 3

#: OneFlow's ActivationType enum: name -> number.
ActivationType = {"kNone": kNone, "kTanH": kTanH, "kSigmoid": kSigmoid, "kRelu": kRelu}
