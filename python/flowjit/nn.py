"""flow.nn: activations, softmax and losses."""
from typing import Optional

from . import _ops, _trace
from ._blob import Blob
from ._ops import (log_softmax, relu, sigmoid, softmax, softmax_cross_entropy_with_logits,  # noqa: F401
                   sparse_softmax_cross_entropy_with_logits, tanh)


def bias_add(value: Blob, bias: Blob, data_format: Optional[str] = None, name: Optional[str] = None) -> Blob:
    """value + bias along the channel axis (axis 1 for NCHW, else the last)."""
    if len(bias.shape) != 1:
        _trace.fail(ValueError, f"bias_add: bias must be 1-D, got shape {bias.shape}")
    if data_format is not None and data_format.startswith("NC") and len(value.shape) > 2:
        c = value.shape[1]
        if bias.shape[0] != c:
            _trace.fail(ValueError, f"bias_add: value has {c} channels but bias has {bias.shape[0]}")
        shape = [1] * len(value.shape)
        shape[1] = c
        return _ops.add(value, _ops.reshape(bias, shape), name=name)
    if value.shape[-1] != bias.shape[0]:
        _trace.fail(ValueError, f"bias_add: value has {value.shape[-1]} channels (last axis) but bias "
                    f"has {bias.shape[0]}")
    return _ops.add(value, bias, name=name)


def sigmoid_cross_entropy_with_logits(labels: Blob, logits: Blob, name: Optional[str] = None) -> Blob:
    """Elementwise logistic loss: max(x, 0) - x * z + log(1 + exp(-|x|))."""
    x, z = logits, labels
    return _ops.add(_ops.subtract(_ops.maximum(x, 0.0), _ops.multiply(x, z)),
                    _ops.log(_ops.add(_ops.exp(_ops.negative(_ops.abs(x))), 1.0)), name=name)


logsoftmax = log_softmax  # the name the OneFlow docs use

# Activations and losses composed of primitive ops (issue #12); the capitalized
# names are the ones OneFlow's lazy API exports the losses under.
from ._activations import (elu, gelu, hardsigmoid, hardswish, hardtanh, leaky_relu, mish,  # noqa: E402,F401
                           relu6, silu, softsign, swish)
from ._composite import moments, tril  # noqa: E402,F401
from ._losses import (bce_loss, bce_with_logits_loss, kldiv_loss, l1_loss, mse_loss,  # noqa: E402,F401
                      smooth_l1_loss, sparse_cross_entropy)
BCELoss, BCEWithLogitsLoss, KLDivLoss, L1Loss, MSELoss = (
    bce_loss, bce_with_logits_loss, kldiv_loss, l1_loss, mse_loss)

# Convolutions, pooling and dropout (issue #11).
from ._conv import (avg_pool1d, avg_pool2d, avg_pool3d, conv1d, conv2d, conv3d, dropout,  # noqa: E402,F401
                    max_pool1d, max_pool2d, max_pool3d)
