"""OneFlow's generated protobuf modules (``oneflow.core.*``), the parts its
model programs import: enum values they pass to ops."""
